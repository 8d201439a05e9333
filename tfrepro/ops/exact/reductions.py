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
    reciprocal; in float64 both round to the same float32)."""
    with tf.name_scope(name or "ExactReduceMean"):
        x = tf.convert_to_tensor(input_tensor)
        if not x.dtype.is_floating:
            with _fixed.unmarked():
                return _stock.reduce_mean(x, axis=axis, keepdims=keepdims)
        working = tf.float64 if x.dtype == tf.float64 else tf.float32
        total = reduce_sum(tf.cast(x, working), axis=axis, keepdims=keepdims)
        count = tf.size(x, out_type=tf.int64) // tf.maximum(tf.size(total, out_type=tf.int64), 1)
        return tf.cast(tf.cast(total, tf.float64) / tf.cast(count, tf.float64), x.dtype)


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
                    _fixed.exact_batch_sum(dy, axes, weight_gradient_replicas(bias_is_weight)), "bias_add")

            return _stock.bias_add(v, b, data_format=data_format), grad

        return forward(value, bias)
