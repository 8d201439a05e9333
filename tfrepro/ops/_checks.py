"""Run-time argument checks that fail as TensorFlow's kernels do: TF's error class and one stable
message (the kernel's wording, naming the first bad element), raised when the op runs.

Eagerly the error is raised at the call with exactly TF's message. In a graph the check is an
``Assert`` inside a ``tf.cond``, so the message is built only on failure and reads
``assertion failed: [<TF's message>]``; an ``Assert`` can only raise InvalidArgumentError, and it
escapes quotes. So a check whose message has quotes names TF's own op (``raised_by``), which the
failing branch runs on the CPU, where TF's kernels check: it raises TF's error in TF's words. Under
XLA, which compiles ``Assert`` as a no-op and no string ops, there are no run-time checks (as in
TF's own XLA kernels, which drop out-of-range ids).
"""

from __future__ import annotations

import functools
from typing import Callable

import tensorflow as tf

from tfrepro.ops._exact_sum import in_xla_context, traced


def check(rule: Callable[..., tuple[tf.Tensor, Callable[[], tf.Tensor | str]]] | None = None, *,
          raised_by: Callable[..., tf.Tensor] | None = None):
    """``rule(*args) -> (ok, message)`` (``ok`` a scalar bool tensor, ``message()`` the error text)
    as a function ``(*args) -> control inputs`` that raise InvalidArgumentError unless ``ok``.

    Eagerly it raises at the call with ``message()`` and returns ``[]``. In a graph it is one call
    of a function traced once per signature (a ``tf.cond`` whose failing branch builds the message
    and asserts), so a check costs one node per op instance; eagerly, one dispatch while it holds.
    ``raised_by(*args)``, where given (``@check(raised_by=...)``), is TF's op on the same arguments:
    the failing branch runs it first, on the CPU, so that in a graph TF's kernel raises its own
    message, unescaped (the Assert after it remains, should the kernel not raise)."""
    if rule is None:
        return functools.partial(check, raised_by=raised_by)

    @traced
    def holds(*args) -> tf.Tensor:
        return rule(*args)[0]

    @traced
    def in_graph(*args) -> tf.Tensor:
        ok, message = rule(*args)

        def fail() -> tf.Tensor:
            false = tf.constant(False)
            if raised_by is not None:  # a False computed from TF's op, so that it runs (and raises) first
                with tf.device("/device:CPU:0"):
                    false = tf.equal(tf.size(raised_by(*args), out_type=tf.int64), -1)
            with tf.control_dependencies([tf.raw_ops.Assert(condition=false, data=[message()])]):
                return tf.constant(False)

        return tf.cond(ok, lambda: tf.constant(True), fail)

    @functools.wraps(rule)
    def run(*args) -> list:
        if tf.executing_eagerly():
            if not bool(holds(*args)):
                text = rule(*args)[1]()  # eagerly: the message, as TF's kernel words it
                raise tf.errors.InvalidArgumentError(None, None, text if isinstance(text, str) else text.numpy().decode())
            return []
        return [] if in_xla_context() else [in_graph(*args)]

    return run


def after(checks: list, tensor):
    """``tensor``, computed only once ``checks`` have passed."""
    if not checks:
        return tensor
    with tf.control_dependencies(checks):
        return tf.identity(tensor)


def gated(checks: list, value: tf.Tensor) -> tf.Tensor:
    """``value``, computed from the checks' results: for small tensors that later checks take. A
    control dependency (``after``) is lost where grappler inlines a traced kernel that takes
    ``value`` (its body does not wait for its inputs): a later check would run, and fail, first.
    (A gated value is unknown to shape inference: never gate what sizes an output.)"""
    for passed in checks:  # a check's result is True (or it raised)
        value = value * tf.cast(passed, value.dtype)
    return value


def first_position(bad: tf.Tensor) -> tf.Tensor:
    """The smallest flat index where ``bad`` holds (its size if nowhere): stable, unlike an argmax."""
    flat = tf.reshape(bad, [-1])
    size = tf.size(flat, out_type=tf.int64)
    return tf.reduce_min(tf.where(flat, tf.range(size), size))


def joined(values: tf.Tensor, separator: str) -> tf.Tensor:
    """The values of ``values`` in text, flattened and joined with ``separator``."""
    return tf.strings.reduce_join(tf.strings.as_string(tf.reshape(values, [-1])), separator=separator)


def shape_text(shape: tf.Tensor) -> tf.Tensor:
    """A shape as TF's kernels print it: ``[6,3]``."""
    return tf.strings.join(["[", joined(shape, ","), "]"])


def text(value: tf.Tensor) -> tf.Tensor:
    return tf.strings.as_string(value)
