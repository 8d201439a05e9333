"""Exact, order-invariant, on-device fingerprints of tensors and variables.

A tensor is read as elements of one or two 32-bit words (its bit patterns: 32-bit types as they
are, 64-bit types as two words, narrower types sign- or zero-extended). Each element goes through a
bijection into two 32-bit lanes, keyed by its position:

- a 64-bit element's two words ``(a, b)`` pass through two Feistel rounds, which are invertible, so
  the pair of lane inputs differs whenever the element does; a narrower element feeds its word to
  both lanes;
- each lane input is XORed with a key derived from the element's index (a Weyl sequence, distinct
  for each of 2**32 positions), then mixed by a bijective multiply-xorshift, and summed in wrapping
  32-bit arithmetic.

**Guarantee.** Any change to one element (one flipped bit included) changes the fingerprint: it
changes at least one lane input, the keyed mixing is a bijection, so that lane's sum changes.
Changes to several elements go unseen only if their mixed differences cancel in both lanes; the
mixing is nonlinear and position-keyed, so structured changes (sign flips in pairs, swaps, the top
bit of several words) have no reason to cancel, but this is not proven: the tests try families of
them and thousands of random perturbations. Integer addition is associative, so the result does
not depend on reduction order: it is deterministic on any device. In the XLA-fused computation
(``fingerprints_of``) only the 8 bytes of each fingerprint leave the device.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from tfrepro import _tf

# Odd 32-bit multipliers (as int32): each multiplication is a bijection modulo 2**32.
_M1, _M2, _M3 = -1640531535, -2048144777, -1028477379  # 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_LANE_KEYS = (0x2545F491, 0x6C8E9CF5)  # separate the two lanes' position keys
_FEISTEL_KEYS = (0x7FEB352D, 0x846CA68B - 2**32)


def _shift_right(tf: Any, x: Any, bits: int) -> Any:
    """Logical right shift of int32 (TF's shift is arithmetic for signed types)."""
    return tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, bits), (1 << (32 - bits)) - 1)


def _mix(tf: Any, x: Any) -> Any:
    """A bijection of 32-bit words (multiply by odd constants, logical xorshifts)."""
    x = x * _M1
    x = tf.bitwise.bitwise_xor(x, _shift_right(tf, x, 15))
    x = x * _M2
    x = tf.bitwise.bitwise_xor(x, _shift_right(tf, x, 13))
    x = x * _M3
    return tf.bitwise.bitwise_xor(x, _shift_right(tf, x, 16))


def _elements(tf: Any, tensor: Any) -> tuple[Any, Any]:
    """Each element's two lane inputs, as flat int32 tensors; a bijection of the element's bits."""
    dtype = tensor.dtype
    if dtype in (tf.float64, tf.int64, tf.uint64):
        words = tf.reshape(tf.bitcast(tensor, tf.int32), [-1, 2])
        a, b = words[:, 0], words[:, 1]
        a = tf.bitwise.bitwise_xor(a, _mix(tf, tf.bitwise.bitwise_xor(b, _FEISTEL_KEYS[0])))
        b = tf.bitwise.bitwise_xor(b, _mix(tf, tf.bitwise.bitwise_xor(a, _FEISTEL_KEYS[1])))
        return a, b
    if dtype in (tf.float16, tf.bfloat16):
        tensor = tf.bitcast(tensor, tf.int16)
    elif dtype in (tf.float32, tf.uint32):
        tensor = tf.bitcast(tensor, tf.int32)
    elif not (dtype.is_integer or dtype == tf.bool):
        raise TypeError(f"cannot fingerprint dtype {dtype.name}")
    word = tf.reshape(tf.cast(tensor, tf.int32), [-1])
    return word, word


def _fingerprint(tf: Any, tensor: Any) -> Any:
    """The fingerprint as an int32 tensor of shape [2] (the two lane sums), in-graph."""
    lanes = _elements(tf, tensor)
    size = tf.size(lanes[0], out_type=tf.int64)
    index = tf.cast(tf.range(size, dtype=tf.int64), tf.int32)  # modulo 2**32 past 2**32 elements
    sums = []
    for lane, key in zip(lanes, _LANE_KEYS):
        position_key = index * _M1 + key  # a Weyl sequence: a distinct key for each of 2**32 positions
        sums.append(tf.reduce_sum(_mix(tf, tf.bitwise.bitwise_xor(lane, position_key))))
    return tf.stack(sums)


def _stack(tf: Any, tensors: Sequence[Any]) -> Any:
    return tf.stack([_fingerprint(tf, tf.convert_to_tensor(tensor)) for tensor in tensors])


class _Fused:
    """``_stack`` compiled once per process: XLA fuses each tensor's fingerprint into one pass where
    TensorFlow has XLA (probed on first use), plain TF ops otherwise; the integers are the same.
    One ``tf.function``, so a model fingerprinted again (the next ``fit``) reuses its compilation."""

    def __init__(self) -> None:
        self._function: Any = None

    def __call__(self, tf: Any, tensors: Sequence[Any]) -> Any:
        if not tensors:
            return tf.zeros([0, 2], tf.int32)
        if self._function is None:
            fused = tf.function(lambda tensors: _stack(tf, tensors), autograph=False, jit_compile=True)
            try:
                with tf.init_scope():
                    fused([tf.zeros([1], tf.int32)])
            except tf.errors.OpError:  # no XLA in this build or on this device
                fused = tf.function(lambda tensors: _stack(tf, tensors), autograph=False, jit_compile=False)
            self._function = fused
        return self._function(list(tensors))


fingerprints_of = _Fused()
"""``fingerprints_of(tf, tensors)``: the fingerprints of several tensors or variables as an int32
[n, 2] tensor, in one fused computation, eagerly or inside a traced function (a train step)."""


def gradient_fingerprints(tf: Any, gradients: Sequence[Any]) -> Any:
    """In-graph fingerprints of gradients, [n, 2]: of a dense tensor, of a ``tf.IndexedSlices`` (its
    values and indices both count), or zeros for None."""
    parts: list[Any] = []
    layout: list[tuple[int, ...]] = []
    for gradient in gradients:
        if gradient is None:
            layout.append(())
        elif isinstance(gradient, tf.IndexedSlices):
            layout.append((len(parts), len(parts) + 1))
            parts += [gradient.values, gradient.indices]
        else:
            layout.append((len(parts),))
            parts.append(tf.convert_to_tensor(gradient))
    prints = fingerprints_of(tf, parts)
    rows = []
    for entry in layout:
        if not entry:
            rows.append(tf.zeros([2], tf.int32))
        elif len(entry) == 1:
            rows.append(prints[entry[0]])
        else:
            rows.append(prints[entry[0]] + _mix(tf, tf.bitwise.bitwise_xor(prints[entry[1]], _LANE_KEYS[0])))
    return tf.stack(rows)


def to_hex(pair: Any) -> str:
    """The hex form of a fetched fingerprint (a pair of int32)."""
    return "".join(format(int(v) & 0xFFFFFFFF, "08x") for v in pair)


def fingerprint(tensor: Any) -> str:
    """Computes the exact 64-bit fingerprint of one tensor or variable, eagerly, on its device.

    Equal bits give equal fingerprints on any device, whatever the reduction order. Any change to a
    single element, one flipped bit included, gives a different fingerprint; changes to several
    elements go unseen only if they cancel, which is not proven impossible (see the module
    docstring for the guarantee and its limits). Only the fingerprint leaves the device.

    Args:
        tensor: A tensor, variable, or anything `tf.convert_to_tensor` takes (a NumPy array, a
            list), of a float, integer or bool dtype.

    Returns:
        The fingerprint as 16 lowercase hex digits, the form traces record per variable.

    Raises:
        TypeError: The dtype cannot be fingerprinted (a string or complex tensor).
        ImportError: TensorFlow is not installed.

    Examples:
        >>> import tensorflow as tf
        >>> fingerprint(tf.constant([1.0, 2.0])) == fingerprint(tf.constant([1.0, 2.0]))
        True
        >>> fingerprint(tf.constant([1.0, 2.0])) == fingerprint(tf.constant([2.0, 1.0]))
        False
    """
    tf = _tf.import_tf()
    return to_hex(_fingerprint(tf, tf.convert_to_tensor(tensor)).numpy())


class VariableFingerprinter:
    """Fingerprints a fixed list of variables in one fused call (see ``fingerprints_of``); returns one
    hex string each, the same strings as ``fingerprint``."""

    def __init__(self, variables: Sequence[Any]):
        self._tf = _tf.import_tf()
        # Keras 3 variables wrap a tf.Variable in `.value`; Keras 2 variables are tf.Variables.
        self._variables = [v if isinstance(v, self._tf.Variable) else getattr(v, "value", v) for v in variables]
        from tensorflow.python.ops.resource_variable_ops import ResourceVariable  # no public name

        self._plain = ResourceVariable

    def __call__(self) -> list[str]:
        # Plain variables go in as they are, to be read inside the compiled function rather than by one
        # eager op each; others (tf.distribute's) are read here, as their owner defines.
        values = [v if isinstance(v, self._plain) else self._tf.convert_to_tensor(v) for v in self._variables]
        return [to_hex(pair) for pair in fingerprints_of(self._tf, values).numpy()]


def combine(fingerprints: Sequence[str]) -> str:
    """One fingerprint for a group (a layer, a model) from its members' fingerprints, in order."""
    return hashlib.blake2b("|".join(fingerprints).encode("ascii"), digest_size=16).hexdigest()
