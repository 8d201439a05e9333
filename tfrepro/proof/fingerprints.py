"""Exact, on-device fingerprints of tensors and variables.

A tensor is viewed as 32-bit words ``x_i`` (its bit patterns: 32-bit types as they are, 64-bit
types split in two words, narrower types sign- or zero-extended). Its fingerprint is two sums in
wrapping 32-bit arithmetic: ``sum_i x_i * (2i + 1)`` and ``sum_i x_i * w_i`` with pseudo-random odd
``w_i``. Any change to a single element (a single flipped bit included) changes both sums: it
changes one or two words by ``d`` with ``0 < |d| < 2**32``, and ``d * w`` for odd ``w`` is never 0
modulo ``2**32``. Integer addition is associative, so the result does not depend on reduction
order: it is deterministic on any device. Only the 8-byte fingerprint leaves the device.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from tfrepro import _tf

_GOLDEN = -1640531527  # 0x9E3779B9 as int32: the Weyl-sequence step


def _words(tf: Any, tensor: Any) -> Any:
    """The tensor's bit patterns as a flat int32 tensor."""
    dtype = tensor.dtype
    if dtype in (tf.float16, tf.bfloat16):
        tensor = tf.bitcast(tensor, tf.int16)
    elif dtype in (tf.float32, tf.float64, tf.int64, tf.uint32, tf.uint64):
        tensor = tf.bitcast(tensor, tf.int32)  # 64-bit types gain a trailing dimension of 2 words
    elif not (dtype.is_integer or dtype == tf.bool):
        raise TypeError(f"cannot fingerprint dtype {dtype.name}")
    return tf.reshape(tf.cast(tensor, tf.int32), [-1])


def _fingerprint(tf: Any, tensor: Any) -> Any:
    words = _words(tf, tensor)
    index = tf.range(tf.size(words), dtype=tf.int32)
    weyl = tf.bitwise.bitwise_or(index * _GOLDEN + _GOLDEN, tf.constant(1, tf.int32))
    return tf.stack([tf.reduce_sum(words * (2 * index + 1)), tf.reduce_sum(words * weyl)])


def gradient_fingerprint(tf: Any, gradient: Any) -> Any:
    """In-graph fingerprint of a gradient: a dense tensor, ``tf.IndexedSlices`` (values and indices
    both count) or None (zeros)."""
    if gradient is None:
        return tf.zeros([2], tf.int32)
    if isinstance(gradient, tf.IndexedSlices):
        return _fingerprint(tf, gradient.values) + 3 * _fingerprint(tf, gradient.indices)
    return _fingerprint(tf, tf.convert_to_tensor(gradient))


def to_hex(pair: Any) -> str:
    """The hex form of a fetched fingerprint (a pair of int32)."""
    return "".join(format(int(v) & 0xFFFFFFFF, "08x") for v in pair)


def fingerprint(tensor: Any) -> str:
    """The 16-hex-digit fingerprint of one tensor or variable (eager)."""
    tf = _tf.import_tf()
    return to_hex(_fingerprint(tf, tf.convert_to_tensor(tensor)).numpy())


class VariableFingerprinter:
    """Fingerprints a fixed list of variables in one compiled call; returns one hex string each."""

    def __init__(self, variables: Sequence[Any]):
        tf = _tf.import_tf()
        # Keras 3 variables wrap a tf.Variable in `.value`; Keras 2 variables are tf.Variables.
        self._variables = [v if isinstance(v, tf.Variable) else getattr(v, "value", v) for v in variables]

        @tf.function(autograph=False, jit_compile=False)
        def compute():
            if not self._variables:
                return tf.zeros([0, 2], tf.int32)
            return tf.stack([_fingerprint(tf, tf.convert_to_tensor(v)) for v in self._variables])

        self._compute = compute

    def __call__(self) -> list[str]:
        return [to_hex(pair) for pair in self._compute().numpy()]


def combine(fingerprints: Sequence[str]) -> str:
    """One fingerprint for a group (a layer, a model) from its members' fingerprints, in order."""
    return hashlib.blake2b("|".join(fingerprints).encode("ascii"), digest_size=16).hexdigest()
