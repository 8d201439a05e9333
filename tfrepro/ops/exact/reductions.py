"""The exact tier's sums: ``reduce_sum`` and ``reduce_mean`` (order-invariant fixed-point sums,
``tfrepro.ops.segment``), and ``bias_add``, whose bias gradient is a replica-global exact sum."""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock, nn
from tfrepro.ops.exact import _fixed
from tfrepro.ops.exact.linalg import EXACT_DTYPES, is_weight, weight_gradient_replicas
from tfrepro.ops.segment import reduce_sum


def reduce_mean(input_tensor, axis=None, keepdims=False, name=None):
    """``tf.reduce_mean`` as the order-invariant sum over the element count, divided in float64 and
    rounded once (XLA turns a division by a compile-time count into a multiplication by its
    reciprocal; in float64 both round to the same float32); its gradient, the upstream gradient
    over the count, the same way. Integers and float64 run TF's op (the audit checks it)."""
    with tf.name_scope(name or "ExactReduceMean"):
        x = tf.convert_to_tensor(input_tensor)
        if x.dtype not in EXACT_DTYPES:
            with _fixed.unmarked():
                return _stock.reduce_mean(x, axis=axis, keepdims=keepdims)

        @_fixed.custom_gradient
        def mean(v):
            total = reduce_sum(tf.cast(v, tf.float32), axis=axis, keepdims=keepdims)
            count = tf.size(v, out_type=tf.int64) // tf.maximum(tf.size(total, out_type=tf.int64), 1)
            count = tf.cast(count, tf.float64)

            def gradient(dy):
                rank = tf.rank(v)
                axes = tf.range(rank) if axis is None else (tf.reshape(tf.cast(axis, tf.int32), [-1]) + rank) % rank
                kept = tf.tensor_scatter_nd_update(tf.shape(v), axes[:, None], tf.ones_like(axes))
                share = _fixed.narrow(tf.cast(tf.convert_to_tensor(dy), tf.float64) / count, v.dtype)
                return tf.broadcast_to(tf.reshape(share, kept), tf.shape(v))

            return _fixed.narrow(tf.cast(total, tf.float64) / count, v.dtype), gradient

        return mean(x)


def bias_add(value, bias, data_format=None, name=None):
    """``tf.nn.bias_add`` whose bias gradient is an exact fixed-point sum over every axis but the
    channels', global over replicas for a weight (``_fixed.exact_batch_sum``)."""
    bias_is_weight = is_weight(bias)
    with tf.name_scope(name or "ExactBiasAdd"):
        value = tf.convert_to_tensor(value)
        bias = tf.convert_to_tensor(bias, dtype=value.dtype)
        if value.dtype not in EXACT_DTYPES or value.shape.rank is None:
            with _fixed.unmarked():  # order-invariant, not replica-global: the audit names it under replicas
                return nn.bias_add(value, bias, data_format=data_format)
        channels = 1 if data_format is not None and data_format.startswith("NC") else value.shape.rank - 1

        @_fixed.custom_gradient
        def forward(v, b):
            def grad(dy):
                axes = [a for a in range(dy.shape.rank) if a != channels]
                return dy, _fixed.first_order_only(
                    _fixed.exact_batch_sum(dy, axes, weight_gradient_replicas(bias_is_weight)), "bias_add", dy)

            return _stock.bias_add(v, b, data_format=data_format), grad

        return forward(value, bias)
