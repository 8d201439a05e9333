"""The exact tier's divisions: ``divide`` and ``divide_no_nan`` (a loss's mean over the batch, a
metric's total over its count), with the same bits whether XLA compiles them or not; and ``add``
of a weight broadcast over the batch (Keras 3's biases of more than one axis, as in
``MultiHeadAttention``'s projections), whose gradient is an exact sum, global over replicas.

XLA turns a division by a value it knows when it compiles (a constant, or a count computed from
static shapes, as Keras's mean over the batch is) into a multiplication by its reciprocal, which
rounds twice. Here float32, float16 and bfloat16 quotients are formed in float64 and rounded once
to the inputs' dtype. That makes the rewrite harmless: for x and y of at most 24 significant bits,
x / y is either a midpoint between two float32 values exactly (then y is a power of two and its
reciprocal is exact) or at least 2**-49 of its size away from every midpoint, and the float64
rewrite is within 2**-52 of it; so both round to the same float32. The gradient with respect to
``x`` is such a quotient too; the gradient with respect to ``y`` is TF's (the audit names it when
a step uses it: a loss's count has none).
"""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops.exact import _fixed
from tfrepro.ops.exact.linalg import EXACT_DTYPES, is_weight
from tfrepro.ops.exact.reductions import reduce_sum


def _quotient(x: tf.Tensor, y: tf.Tensor, no_nan: bool) -> tf.Tensor:
    divide = _stock.divide_no_nan if no_nan else _stock.divide
    return _fixed.narrow(divide(tf.cast(x, tf.float64), tf.cast(y, tf.float64)), x.dtype)


def _unbroadcast(gradient: tf.Tensor, like: tf.Tensor, other: tf.Tensor) -> tf.Tensor:
    """``gradient`` (of ``like`` broadcast against ``other``) summed back to ``like``'s shape, exactly."""
    if other.shape.rank == 0 or (like.shape.is_fully_defined() and gradient.shape == like.shape):
        return gradient  # ``like`` was not broadcast
    axes, _ = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(like), s1=tf.shape(other))
    return tf.reshape(reduce_sum(gradient, axis=axes), tf.shape(like))


def _divided(x, y, name: str, no_nan: bool) -> tf.Tensor:
    with tf.name_scope(name):
        # As TF's binary ops: a Python number takes the dtype of the tensor it meets.
        if not tf.is_tensor(x) and tf.is_tensor(y):
            y = tf.convert_to_tensor(y)
            x = tf.convert_to_tensor(x, dtype=y.dtype)
        else:
            x = tf.convert_to_tensor(x)
            y = tf.convert_to_tensor(y, dtype_hint=x.dtype)
        if x.dtype not in EXACT_DTYPES or y.dtype != x.dtype:
            with _fixed.unmarked():  # float64 and integers: TF's division, which the audit checks itself
                return _stock.divide_no_nan(x, y) if no_nan else _stock.divide(x, y)

        @tf.custom_gradient
        def quotient(x, y):
            def gradient(dq):
                with _fixed.marking():
                    dx = _unbroadcast(_quotient(dq, y, no_nan), x, y)
                with _fixed.unmarked():  # TF's: dq * (-x / y / y), named by the audit if a step needs it
                    div = _stock.divide_no_nan if no_nan else _stock.divide
                    dy = dq * div(div(-x, y), y)
                    dy = tf.reshape(_stock.reduce_sum(dy, tf.raw_ops.BroadcastGradientArgs(
                        s0=tf.shape(y), s1=tf.shape(x))[0]), tf.shape(y))
                return dx, dy

            return _quotient(x, y, no_nan), gradient

        return quotient(x, y)


def divide(x, y, name=None):
    """``tf.divide`` (``tf.math.divide``) whose float32, float16 and bfloat16 quotients XLA cannot
    round otherwise (module doc). Other dtypes run TF's op."""
    return _divided(x, y, name or "ExactDivide", no_nan=False)


def divide_no_nan(x, y, name=None):
    """``tf.math.divide_no_nan``: 0 where ``y`` is 0, else ``divide`` (module doc)."""
    return _divided(x, y, name or "ExactDivideNoNan", no_nan=True)


def _weight_gradient(gradient: tf.Tensor, weight: tf.Tensor) -> tf.Tensor:
    """A broadcast weight's gradient summed back to its shape: exactly, and globally over replicas
    (whole on the first, zero on the others, which the strategy's all-reduce adds exactly)."""
    rank = gradient.shape.rank
    shape = [1] * (rank - weight.shape.rank) + weight.shape.as_list()
    axes = [axis for axis in range(rank) if shape[axis] == 1 and gradient.shape[axis] != 1]
    if axes:
        gradient = _fixed.first_order_only(_fixed.exact_batch_sum(gradient, axes, _fixed.Replicas()), "add", gradient)
    return tf.reshape(gradient, weight.shape)


def add(x, y, name=None):
    """``tf.add`` (``tf.math.add``): where one operand is a weight broadcast against the other (a
    bias), TF's add with the weight's gradient an exact sum over the axes it was broadcast along,
    global over replicas (module doc); every other add is TF's own, which the audit checks."""
    weights = (is_weight(x), is_weight(y))
    dense = all(isinstance(v, tf.Tensor) or (hasattr(v, "assign") and hasattr(v, "dtype")) for v in (x, y))
    if not any(weights) or not dense:  # activations, Python numbers, ragged tensors, strings: TF's add
        with _fixed.unmarked():
            return _stock.add(x, y, name=name)
    with tf.name_scope(name or "ExactAdd"):
        x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        if x.dtype not in EXACT_DTYPES or y.dtype != x.dtype or x.shape.rank is None or y.shape.rank is None \
                or not all(v.shape.is_fully_defined() for v, weight in zip((x, y), weights) if weight):
            with _fixed.unmarked():
                return _stock.add(x, y)

        @_fixed.custom_gradient
        def total(a, b):
            def gradient(dz):
                return tuple(_weight_gradient(dz, v) if weight else _unbroadcast(dz, v, other)
                             for v, other, weight in ((a, b, weights[0]), (b, a, weights[1])))

            return _stock.add(a, b), gradient

        return total(x, y)
