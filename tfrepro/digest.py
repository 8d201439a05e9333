"""Exact, on-device fingerprints of tensors and variables.

A fingerprint is two 64-bit sums over the tensor's bit patterns ``x_i`` (sign-extended to int64):
``sum_i x_i * (2i + 1)`` and ``sum_i x_i * w_i`` with pseudo-random odd ``w_i``, in wrapping int64
arithmetic. Any change to a single element (a single flipped bit included) changes both sums: the
change is ``d * w`` with ``0 < |d| < 2**32`` and ``w`` odd, which is never 0 modulo ``2**64``.
Integer addition is associative, so the result does not depend on reduction order: it is
deterministic on any device. Only the 16-byte fingerprint leaves the device.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from tfrepro import _tf

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64: Weyl-sequence step


def _bit_patterns(tf: Any, tensor: Any) -> Any:
    """The tensor's bit patterns as a flat int64 tensor (floats by bitcast, integers by value)."""
    dtype = tensor.dtype
    if dtype in (tf.float16, tf.bfloat16):
        tensor = tf.bitcast(tensor, tf.int16)
    elif dtype == tf.float32:
        tensor = tf.bitcast(tensor, tf.int32)
    elif dtype == tf.float64:
        tensor = tf.bitcast(tensor, tf.int32)  # adds a trailing dimension of 2 words
    elif dtype == tf.uint64:
        tensor = tf.bitcast(tensor, tf.int64)
    elif not (dtype.is_integer or dtype == tf.bool):
        raise TypeError(f"cannot fingerprint dtype {dtype.name}")
    return tf.reshape(tf.cast(tensor, tf.int64), [-1])


def _fingerprint(tf: Any, tensor: Any) -> Any:
    bits = _bit_patterns(tf, tensor)
    index = tf.range(tf.size(bits, out_type=tf.int64), dtype=tf.int64)
    odd = 2 * index + 1
    weyl = index * _GOLDEN + _GOLDEN
    weyl = tf.bitwise.bitwise_or(weyl, tf.constant(1, tf.int64))
    return tf.stack([tf.reduce_sum(bits * odd), tf.reduce_sum(bits * weyl)])


def _hex(pair: Any) -> str:
    return "".join(format(int(v) & 0xFFFFFFFFFFFFFFFF, "016x") for v in pair)


def fingerprint(tensor: Any) -> str:
    """The 32-hex-digit fingerprint of one tensor or variable (eager)."""
    tf = _tf.import_tf()
    return _hex(_fingerprint(tf, tf.convert_to_tensor(tensor)).numpy())


class VariableFingerprinter:
    """Fingerprints a fixed list of variables in one compiled call; returns one hex string each."""

    def __init__(self, variables: Sequence[Any]):
        tf = _tf.import_tf()
        # Keras 3 variables wrap a tf.Variable in `.value`; Keras 2 variables are tf.Variables.
        self._variables = [v if isinstance(v, tf.Variable) else getattr(v, "value", v) for v in variables]

        @tf.function(autograph=False, jit_compile=False)
        def compute():
            if not self._variables:
                return tf.zeros([0, 2], tf.int64)
            return tf.stack([_fingerprint(tf, tf.convert_to_tensor(v)) for v in self._variables])

        self._compute = compute

    def __call__(self) -> list[str]:
        return [_hex(pair) for pair in self._compute().numpy()]


def combine(fingerprints: Sequence[str]) -> str:
    """One fingerprint for a group (a layer, a model) from its members' fingerprints, in order."""
    return hashlib.blake2b("|".join(fingerprints).encode("ascii"), digest_size=16).hexdigest()
