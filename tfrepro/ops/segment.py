"""Order-invariant segment reductions and ``reduce_sum`` (drop-ins for the ``tf.math`` ops)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops._exact_sum import reduce_sum_keepdims, segment_sum_2d


def _flat(data: tf.Tensor, segment_ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``data`` as [N, K] for ``segment_ids`` of any rank r (a prefix of data's shape), ids as [N],
    and the trailing shape data.shape[r:]."""
    rank = tf.rank(segment_ids)
    inner = tf.shape(data)[rank:]
    n = tf.size(segment_ids)
    return tf.reshape(data, tf.stack([n, tf.reduce_prod(inner)])), tf.reshape(segment_ids, [-1]), inner


def _gather_drop_negatives(grad: tf.Tensor, segment_ids: tf.Tensor) -> tf.Tensor:
    """The gradient of a segment sum: each element gets its segment's gradient; dropped ids get 0."""
    gathered = _stock.gather(grad, tf.maximum(segment_ids, 0))
    trailing = tf.ones([tf.rank(gathered) - tf.rank(segment_ids)], tf.int32)
    keep = tf.reshape(segment_ids >= 0, tf.concat([tf.shape(segment_ids), trailing], 0))
    return tf.where(keep, gathered, tf.zeros_like(gathered))


def _exact_segment_sum(data: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    @tf.custom_gradient
    def forward(values):
        flat, ids, inner = _flat(values, segment_ids)
        total = segment_sum_2d(flat, ids, num_segments)
        out_shape = tf.concat([tf.reshape(num_segments, [1]), inner], 0)
        result = tf.cast(tf.reshape(total, out_shape), values.dtype)

        def grad(dy):
            return _gather_drop_negatives(dy, segment_ids)

        return result, grad

    result = forward(data)
    if data.shape.rank is not None and segment_ids.shape.rank is not None:
        static_segments = tf.get_static_value(num_segments)
        result.set_shape([static_segments if static_segments is not None else None]
                         + data.shape[segment_ids.shape.rank:].as_list())
    return result


def unsorted_segment_sum(data, segment_ids, num_segments, name=None):
    """``tf.math.unsorted_segment_sum``, bitwise independent of element order (see ``_exact_sum``).

    Floating dtypes (float16, bfloat16, float32, float64) go through the exact int64 accumulation;
    integer dtypes are exact already and use TF's kernel. Gradients are deterministic (a gather).
    """
    with tf.name_scope(name or "DeterministicUnsortedSegmentSum"):
        data = tf.convert_to_tensor(data)
        segment_ids = tf.convert_to_tensor(segment_ids)
        num_segments = tf.reshape(tf.cast(num_segments, tf.int32), [])  # a scalar, also when traced unshaped
        if data.dtype.is_complex:
            real = _exact_segment_sum(tf.math.real(data), segment_ids, num_segments)
            imag = _exact_segment_sum(tf.math.imag(data), segment_ids, num_segments)
            return tf.complex(real, imag)
        if not data.dtype.is_floating:
            return _stock.unsorted_segment_sum(data, segment_ids, num_segments)
        return _exact_segment_sum(data, segment_ids, num_segments)


def _segment_counts(data: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    """Entries per segment (empty segments count 1), shaped to broadcast against the sums."""
    counts = _stock.unsorted_segment_sum(tf.ones_like(segment_ids, tf.int32), segment_ids, num_segments)
    counts = tf.cast(tf.maximum(counts, 1), data.dtype)
    trailing = tf.rank(data) - tf.rank(segment_ids)
    segments = tf.reshape(tf.cast(num_segments, tf.int32), [1])  # int64 num_segments or ids too
    return tf.reshape(counts, tf.concat([segments, tf.ones([trailing], tf.int32)], 0))


def unsorted_segment_mean(data, segment_ids, num_segments, name=None):
    """``tf.math.unsorted_segment_mean`` (empty segments give 0), order-invariant."""
    with tf.name_scope(name or "DeterministicUnsortedSegmentMean"):
        data = tf.convert_to_tensor(data)
        segment_ids = tf.convert_to_tensor(segment_ids)
        total = unsorted_segment_sum(data, segment_ids, num_segments)
        return total / _segment_counts(data, segment_ids, num_segments)


def unsorted_segment_sqrt_n(data, segment_ids, num_segments, name=None):
    """``tf.math.unsorted_segment_sqrt_n``: the sum divided by sqrt(count), order-invariant."""
    with tf.name_scope(name or "DeterministicUnsortedSegmentSqrtN"):
        data = tf.convert_to_tensor(data)
        segment_ids = tf.convert_to_tensor(segment_ids)
        total = unsorted_segment_sum(data, segment_ids, num_segments)
        return total / tf.sqrt(_segment_counts(data, segment_ids, num_segments))


def _sorted_num_segments(segment_ids: tf.Tensor) -> tf.Tensor:
    """Validate sorted, non-negative ids as TF's sorted segment ops do; return max id + 1."""
    flat = tf.reshape(segment_ids, [-1])
    checks = [
        tf.debugging.assert_non_negative(flat, message="segment ids must be >= 0"),
        tf.debugging.assert_greater_equal(flat[1:], flat[:-1], message="segment ids are not increasing"),
    ]
    with tf.control_dependencies(checks):
        return tf.cond(tf.size(flat) > 0, lambda: flat[-1] + 1, lambda: tf.zeros([], flat.dtype))


def segment_sum(data, segment_ids, name=None):
    """``tf.math.segment_sum`` (sorted ids; output has ``max(id) + 1`` rows), order-invariant."""
    with tf.name_scope(name or "DeterministicSegmentSum"):
        segment_ids = tf.convert_to_tensor(segment_ids)
        return unsorted_segment_sum(data, segment_ids, _sorted_num_segments(segment_ids))


def segment_mean(data, segment_ids, name=None):
    """``tf.math.segment_mean`` (sorted ids), order-invariant."""
    with tf.name_scope(name or "DeterministicSegmentMean"):
        segment_ids = tf.convert_to_tensor(segment_ids)
        return unsorted_segment_mean(data, segment_ids, _sorted_num_segments(segment_ids))


def _static_axes(axis, rank: int | None) -> list[int] | None:
    """The reduced axes as sorted non-negative ints, where the rank and ``axis`` are static."""
    value = None if rank is None else list(range(rank)) if axis is None else tf.get_static_value(axis)
    if value is None:
        return None
    return sorted({int(a) % max(rank, 1) for a in np.reshape(value, [-1])})


def reduce_sum(input_tensor, axis=None, keepdims=False, name=None):
    """``tf.reduce_sum`` with a result independent of the order of the reduced elements."""
    with tf.name_scope(name or "DeterministicReduceSum"):
        x = tf.convert_to_tensor(input_tensor)
        if not (x.dtype.is_floating or x.dtype.is_complex):
            return tf.reduce_sum(x, axis=axis, keepdims=keepdims)
        if x.dtype.is_complex:
            return tf.complex(reduce_sum(tf.math.real(x), axis, keepdims), reduce_sum(tf.math.imag(x), axis, keepdims))
        rank = tf.rank(x)
        static_axes = _static_axes(axis, x.shape.rank)
        if static_axes is not None:  # kept static: the sum picks its kernels by them
            axes = tf.constant(static_axes, tf.int32, shape=[len(static_axes)])
        else:
            axes = tf.range(rank) if axis is None else tf.reshape(tf.convert_to_tensor(axis, tf.int32), [-1])
            axes = tf.math.floormod(axes, tf.maximum(rank, 1))
        reduced_dims = tf.reduce_any(tf.equal(tf.range(rank)[:, None], axes[None, :]), axis=1)
        kept_shape = tf.boolean_mask(tf.shape(x), tf.logical_not(reduced_dims))

        @tf.custom_gradient
        def forward(values):
            total = tf.cast(reduce_sum_keepdims(values, axes), values.dtype)

            def grad(dy):
                if not keepdims:
                    dy = tf.reshape(dy, tf.shape(total))
                return tf.broadcast_to(dy, tf.shape(values))

            return (total if keepdims else tf.reshape(total, kept_shape)), grad

        result = forward(x)
        if static_axes is not None:
            dims = x.shape.as_list()
            result.set_shape([1 if i in static_axes else d for i, d in enumerate(dims)] if keepdims
                             else [d for i, d in enumerate(dims) if i not in static_axes])
        return result
