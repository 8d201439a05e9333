"""Order-invariant segment reductions and ``reduce_sum`` (drop-ins for the ``tf.math`` ops)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops._checks import after, check, first_position, joined, shape_text, text
from tfrepro.ops._exact_sum import Plan, current_plan, reduce_sum_keepdims, segment_sum_2d, traced


def _flat(data: tf.Tensor, segment_ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``data`` as [N, K] for ``segment_ids`` of any rank r (a prefix of data's shape), ids as [N],
    and the trailing shape data.shape[r:]."""
    rank = tf.rank(segment_ids)
    inner = tf.shape(data)[rank:]
    n = tf.size(segment_ids)
    return tf.reshape(data, tf.stack([n, tf.reduce_prod(inner)])), tf.reshape(segment_ids, [-1]), inner


def _gather_kept(grad: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    """The gradient of a segment sum: each element gets its segment's gradient; dropped ids get 0."""
    kept = (segment_ids >= 0) & (segment_ids < tf.cast(num_segments, segment_ids.dtype))
    gathered = _stock.gather(grad, tf.where(kept, segment_ids, tf.zeros_like(segment_ids)))
    trailing = tf.ones([tf.rank(gathered) - tf.rank(segment_ids)], tf.int32)
    keep = tf.reshape(kept, tf.concat([tf.shape(segment_ids), trailing], 0))
    return tf.where(keep, gathered, tf.zeros_like(gathered))


@traced
def _exact_segment_sum_kernel(data: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor, plan: Plan) -> tf.Tensor:
    @tf.custom_gradient
    def forward(values):
        flat, ids, inner = _flat(values, segment_ids)
        total = segment_sum_2d(flat, ids, num_segments, plan)
        out_shape = tf.concat([tf.reshape(num_segments, [1]), inner], 0)
        result = tf.cast(tf.reshape(total, out_shape), values.dtype)

        def grad(dy):
            return _gather_kept(dy, segment_ids, num_segments)

        return result, grad

    return forward(data)


def _exact_segment_sum(data: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    plan = current_plan()
    if plan.accumulator.startswith("tf"):  # TF's sum: deterministic under op determinism, not order-invariant
        return _stock.unsorted_segment_sum(data, segment_ids, num_segments)
    result = _exact_segment_sum_kernel(data, segment_ids, num_segments, plan)
    if data.shape.rank is not None and segment_ids.shape.rank is not None:
        static_segments = tf.get_static_value(num_segments)
        result.set_shape([static_segments if static_segments is not None else None]
                         + data.shape[segment_ids.shape.rank:].as_list())
    return result


_MAX_SEGMENTS = 2**31 - 2  # num_segments + 1 slots (one for dropped ids) stay in int32


@check
def _unsorted_ids(data_shape: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor):
    """UnsortedSegmentSum's checks: data's shape starts with the ids', and no id is >= num_segments
    (TF's GPU kernels drop such ids; this check raises on every device); and num_segments (int64)
    within what tfrepro's int32 slots hold."""
    ids_shape = tf.shape(segment_ids, out_type=tf.int64)
    rank = tf.size(ids_shape)
    prefix = tf.concat([data_shape, tf.fill([rank], tf.constant(-1, tf.int64))], 0)[:rank]
    prefix_ok = tf.reduce_all(tf.equal(prefix, ids_shape))
    too_large = segment_ids >= tf.cast(num_segments, segment_ids.dtype)

    def out_of_range() -> tf.Tensor:
        position = first_position(too_large)
        return tf.strings.join(["segment_ids[", joined(tf.unravel_index(position, ids_shape), ","), "] = ",
                                text(tf.gather(tf.reshape(segment_ids, [-1]), position)),
                                " is out of range [0, ", text(num_segments), ")"])

    def message() -> tf.Tensor:
        return tf.cond(prefix_ok, lambda: tf.cond(fits, out_of_range, lambda: tf.strings.join([
            "tfrepro.ops supports num_segments up to 2**31 - 2; got ", text(num_segments)])), lambda: tf.strings.join([
            "data.shape = ", shape_text(data_shape), " does not start with segment_ids.shape = ", shape_text(ids_shape)]))

    fits = num_segments <= _MAX_SEGMENTS
    return prefix_ok & fits & tf.logical_not(tf.reduce_any(too_large)), message


def _segment_sum(data, segment_ids, num_segments) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The order-invariant unsorted segment sum, with the checked ids and num_segments as int32."""
    data = tf.convert_to_tensor(data)
    static_segments = tf.get_static_value(num_segments)
    if static_segments is not None and np.max(static_segments) > _MAX_SEGMENTS:
        raise ValueError(f"tfrepro.ops supports num_segments up to 2**31 - 2; got {static_segments} (an output "
                         "of 2**31 rows or more): split the ids into ranges and sum each")
    requested = tf.reshape(tf.cast(num_segments, tf.int64), [])  # a scalar, also when traced unshaped
    num_segments = tf.cast(tf.minimum(requested, _MAX_SEGMENTS), tf.int32)
    segment_ids = tf.convert_to_tensor(segment_ids)
    rank = segment_ids.shape.rank
    if not tf.executing_eagerly() and rank is not None and not data.shape[:rank].is_compatible_with(segment_ids.shape):
        raise ValueError(f"data.shape = {data.shape} does not start with segment_ids.shape = {segment_ids.shape}")
    segment_ids = after(_unsorted_ids(tf.shape(data, out_type=tf.int64), segment_ids, requested), segment_ids)
    if data.dtype.is_complex:
        real = _exact_segment_sum(tf.math.real(data), segment_ids, num_segments)
        imag = _exact_segment_sum(tf.math.imag(data), segment_ids, num_segments)
        return tf.complex(real, imag), segment_ids, num_segments
    if not data.dtype.is_floating:
        return _stock.unsorted_segment_sum(data, segment_ids, num_segments), segment_ids, num_segments
    return _exact_segment_sum(data, segment_ids, num_segments), segment_ids, num_segments


def unsorted_segment_sum(data, segment_ids, num_segments, name=None):
    """``tf.math.unsorted_segment_sum``, bitwise independent of element order (see ``_exact_sum``).

    Floating dtypes (float16, bfloat16, float32, float64) go through the exact int64 accumulation;
    integer dtypes are exact already and use TF's kernel. Gradients are deterministic (a gather).
    Ids >= num_segments raise InvalidArgumentError on every device, with TF's CPU message; under
    XLA they are dropped, as by TF's own op there.
    """
    with tf.name_scope(name or "DeterministicUnsortedSegmentSum"):
        return _segment_sum(data, segment_ids, num_segments)[0]


def _segment_counts(data: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    """Entries per segment (empty segments count 1), shaped to broadcast against the sums."""
    counts = _stock.unsorted_segment_sum(tf.ones_like(segment_ids, tf.int32), segment_ids, num_segments)
    counts = tf.cast(tf.maximum(counts, 1), data.dtype)
    trailing = tf.rank(data) - tf.rank(segment_ids)
    return tf.reshape(counts, tf.concat([tf.reshape(num_segments, [1]), tf.ones([trailing], tf.int32)], 0))


def unsorted_segment_mean(data, segment_ids, num_segments, name=None):
    """``tf.math.unsorted_segment_mean`` (empty segments give 0), order-invariant."""
    with tf.name_scope(name or "DeterministicUnsortedSegmentMean"):
        data = tf.convert_to_tensor(data)
        total, segment_ids, num_segments = _segment_sum(data, segment_ids, num_segments)
        return total / _segment_counts(data, segment_ids, num_segments)


def unsorted_segment_sqrt_n(data, segment_ids, num_segments, name=None):
    """``tf.math.unsorted_segment_sqrt_n``: the sum divided by sqrt(count), order-invariant."""
    with tf.name_scope(name or "DeterministicUnsortedSegmentSqrtN"):
        data = tf.convert_to_tensor(data)
        total, segment_ids, num_segments = _segment_sum(data, segment_ids, num_segments)
        return total / tf.sqrt(_segment_counts(data, segment_ids, num_segments))


@check
def _sorted_ids(rows: tf.Tensor, segment_ids: tf.Tensor):
    """The sorted segment ops' checks, with the message of the first that fails in TF's kernel."""
    flat = tf.reshape(segment_ids, [-1])
    size = tf.size(flat, out_type=tf.int64)
    last = _last_id(flat)
    previous, following = flat[:-1], flat[1:]
    decreasing = following < previous
    bad = decreasing | (tf.not_equal(following, previous) & ((previous < 0) | (previous >= last + 1)))
    sized, non_negative = tf.equal(size, rows), (size == 0) | (last >= 0)

    def out_of_order() -> tf.Tensor:
        position = first_position(bad)
        return tf.cond(tf.gather(decreasing, position), lambda: tf.constant("segment ids are not increasing"),
                       lambda: tf.strings.join(["Segment id ", text(tf.gather(previous, position)), " out of range [0, ",
                                                text(last + 1), "), possibly because 'segment_ids' input is not sorted."]))

    def message() -> tf.Tensor:
        return tf.cond(sized, lambda: tf.cond(non_negative, out_of_order, lambda: tf.constant("segment ids must be >= 0")),
                       lambda: tf.constant("segment_ids should be the same size as dimension 0 of input."))

    return sized & non_negative & tf.logical_not(tf.reduce_any(bad)), message


def _last_id(flat: tf.Tensor) -> tf.Tensor:
    """The last id, -1 for none."""
    return tf.concat([-tf.ones([1], flat.dtype), flat[-1:]], 0)[-1]


def _sorted_segments(data: tf.Tensor, segment_ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(data, segment_ids, num_segments)`` once the sorted segment ops' checks pass; num_segments
    is the last id + 1."""
    static_size, static_rows = segment_ids.shape.num_elements(), data.shape[:1].num_elements()
    if not tf.executing_eagerly() and None not in (static_size, static_rows) and static_size != static_rows:
        data = tf.compat.v1.placeholder_with_default(data, shape=None)  # fails when run, as TF's op does
    checks = _sorted_ids(tf.shape(data, out_type=tf.int64)[0], segment_ids)
    segment_ids = after(checks, segment_ids)
    return data, segment_ids, _last_id(tf.reshape(segment_ids, [-1])) + 1


def segment_sum(data, segment_ids, name=None):
    """``tf.math.segment_sum`` (sorted ids; output has ``max(id) + 1`` rows), order-invariant."""
    with tf.name_scope(name or "DeterministicSegmentSum"):
        return unsorted_segment_sum(*_sorted_segments(tf.convert_to_tensor(data), tf.convert_to_tensor(segment_ids)))


def segment_mean(data, segment_ids, name=None):
    """``tf.math.segment_mean`` (sorted ids), order-invariant."""
    with tf.name_scope(name or "DeterministicSegmentMean"):
        return unsorted_segment_mean(*_sorted_segments(tf.convert_to_tensor(data), tf.convert_to_tensor(segment_ids)))


def _static_axes(axis, rank: int | None) -> list[int] | None:
    """The reduced axes as sorted non-negative ints, where the rank and ``axis`` are static. An axis
    out of range raises as TF does: ValueError when a graph is built, InvalidArgumentError eagerly."""
    value = None if rank is None else list(range(rank)) if axis is None else tf.get_static_value(axis)
    if value is None:
        return None
    axes = [int(a) for a in np.reshape(value, [-1])]
    for a in axes:
        if not -max(rank, 1) <= a < max(rank, 1):
            if tf.executing_eagerly():
                raise tf.errors.InvalidArgumentError(None, None, f"Invalid reduction dimension ({a} for input with {rank} dimension(s)")
            raise ValueError(f"Invalid reduction dimension {a} for input with {rank} dimensions.")
    return sorted({a % max(rank, 1) for a in axes})


@check
def _reduction_axes(rank: tf.Tensor, axes: tf.Tensor):
    bad = (axes < -tf.maximum(rank, 1)) | (axes >= tf.maximum(rank, 1))
    return tf.logical_not(tf.reduce_any(bad)), lambda: tf.strings.join([
        "Invalid reduction dimension (", text(tf.gather(axes, first_position(bad))), " for input with ", text(rank),
        " dimension(s)"])


def reduce_sum(input_tensor, axis=None, keepdims=False, name=None):
    """``tf.reduce_sum`` with a result independent of the order of the reduced elements."""
    with tf.name_scope(name or "DeterministicReduceSum"):
        x = tf.convert_to_tensor(input_tensor)
        if not (x.dtype.is_floating or x.dtype.is_complex):
            return tf.reduce_sum(x, axis=axis, keepdims=keepdims)
        if x.dtype.is_complex:
            return tf.complex(reduce_sum(tf.math.real(x), axis, keepdims), reduce_sum(tf.math.imag(x), axis, keepdims))
        if current_plan().accumulator.startswith("tf"):  # TF's sum: deterministic under op determinism
            return _stock.reduce_sum(x, axis=axis, keepdims=keepdims)
        static_axes = _static_axes(axis, x.shape.rank)
        if static_axes is not None:  # kept static: the sum picks its kernels by them
            result = _reduce_sum_kernel(x, tuple(static_axes), keepdims, current_plan())
            dims = x.shape.as_list()
            result.set_shape([1 if i in static_axes else d for i, d in enumerate(dims)] if keepdims
                             else [d for i, d in enumerate(dims) if i not in static_axes])
            return result
        rank = tf.rank(x)
        axes = tf.range(rank) if axis is None else tf.reshape(tf.convert_to_tensor(axis, tf.int32), [-1])
        axes = after(_reduction_axes(rank, axes), tf.math.floormod(axes, tf.maximum(rank, 1)))
        return _reduce_sum_kernel(x, axes, keepdims, current_plan())


@traced
def _reduce_sum_kernel(x: tf.Tensor, axes: tf.Tensor | tuple[int, ...], keepdims: bool, plan: Plan) -> tf.Tensor:
    if isinstance(axes, tuple):
        kept = [i for i in range(x.shape.rank) if i not in axes]
        kept_shape = tf.gather(tf.shape(x), tf.constant(kept, tf.int32, shape=[len(kept)]))
    else:
        reduced = tf.reduce_any(tf.equal(tf.range(tf.rank(x))[:, None], axes[None, :]), axis=1)
        kept_shape = tf.boolean_mask(tf.shape(x), tf.logical_not(reduced))

    @tf.custom_gradient
    def forward(values):
        total = tf.cast(reduce_sum_keepdims(values, axes, plan), values.dtype)

        def grad(dy):
            if not keepdims:
                dy = tf.reshape(dy, tf.shape(total))
            return tf.broadcast_to(dy, tf.shape(values))

        return (total if keepdims else tf.reshape(total, kept_shape)), grad

    return forward(x)
