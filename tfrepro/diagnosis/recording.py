"""What the model's own ``train_step`` does, recorded while it is traced: the losses it differentiates
and the gradients every ``tf.GradientTape`` computes for each variable, the gradients it hands each
optimizer, what each metric's ``update_state`` receives, besides the layer calls (``layer_calls``).

The spies sit on ``tf.GradientTape.gradient`` (the class: a step makes its own tapes), on each
optimizer's ``apply`` (Keras 3, which ``apply_gradients`` calls) or ``apply_gradients`` (Keras 2),
and on each metric's ``update_state``; they only record, and are removed when the block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfrepro import _tf
from tfrepro.diagnosis.layer_calls import fingerprintable
from tfrepro.diagnosis.restoring import plain


@dataclass
class StepRecord:
    """The tensors one traced step made, by what they are. Variables are keyed by ``id`` of their
    ``tf.Variable``; metrics by their position in the list given to ``recording``."""

    targets: list[Any] = field(default_factory=list)  # what each tape.gradient differentiated (the losses)
    gradients: list[tuple[int, Any]] = field(default_factory=list)  # (variable, gradient) from the tapes
    applied: list[tuple[int, Any]] = field(default_factory=list)  # (variable, gradient) given to an optimizer
    metric_inputs: list[tuple[int, Any]] = field(default_factory=list)  # (metric, tensor) given to update_state


@contextlib.contextmanager
def _replaced(obj: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """``obj.name`` replaced by ``make(original)`` for the block (an instance or a class attribute)."""
    own = obj.__dict__.get(name) if not isinstance(obj, type) else None
    original = getattr(obj, name)
    raw = obj.__dict__[name] if isinstance(obj, type) else None
    setattr(obj, name, make(original))
    try:
        yield
    finally:
        if isinstance(obj, type):
            setattr(obj, name, raw)
        elif own is None:
            delattr(obj, name)
        else:
            setattr(obj, name, own)


@contextlib.contextmanager
def recording(optimizers: Sequence[Any], metrics: Sequence[Any]) -> Iterator[StepRecord]:
    """Record what the step traced inside the block does (see the module doc)."""
    tf = _tf.import_tf()
    record = StepRecord()

    def pairs(sink: list[tuple[int, Any]], variables: Sequence[Any], gradients: Sequence[Any]) -> None:
        for variable, gradient in zip(variables, gradients):
            variable = plain(tf, variable)
            if variable is not None and gradient is not None:
                sink.append((id(variable), gradient))

    def tape_gradient(original: Any) -> Any:
        def gradient(tape: Any, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(tape, target, sources, *args, **kwargs)
            record.targets += fingerprintable(tf, target)
            flat_sources, flat_result = tf.nest.flatten(sources), tf.nest.flatten(result)
            if len(flat_sources) == len(flat_result):
                pairs(record.gradients, flat_sources, flat_result)
            return result

        return gradient

    def apply(original: Any, optimizer: Any) -> Any:  # Keras 3: apply(grads, trainable_variables=None)
        def spied(grads: Any, trainable_variables: Any = None, *args: Any, **kwargs: Any) -> Any:
            grads = list(grads)
            variables = trainable_variables if trainable_variables is not None else \
                getattr(optimizer, "_trainable_variables", [])
            pairs(record.applied, list(variables), grads)
            return original(grads, trainable_variables, *args, **kwargs)

        return spied

    def apply_gradients(original: Any) -> Any:  # Keras 2: apply_gradients(grads_and_vars, ...)
        def spied(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            grads_and_vars = list(grads_and_vars)  # often a zip: read once, handed on as a list
            pairs(record.applied, [v for _, v in grads_and_vars], [g for g, _ in grads_and_vars])
            return original(grads_and_vars, *args, **kwargs)

        return spied

    def update_state(original: Any, number: int) -> Any:
        def spied(*args: Any, **kwargs: Any) -> Any:
            record.metric_inputs += [(number, t) for t in fingerprintable(tf, (args, kwargs))]
            return original(*args, **kwargs)

        return spied

    with contextlib.ExitStack() as stack:
        stack.enter_context(_replaced(tf.GradientTape, "gradient", tape_gradient))
        for optimizer in optimizers:
            if callable(getattr(type(optimizer), "apply", None)):
                stack.enter_context(_replaced(optimizer, "apply", lambda o, opt=optimizer: apply(o, opt)))
            else:
                stack.enter_context(_replaced(optimizer, "apply_gradients", apply_gradients))
        for number, metric in enumerate(metrics):
            stack.enter_context(_replaced(metric, "update_state", lambda o, n=number: update_state(o, n)))
        yield record
