"""Order-invariant segment reductions and ``reduce_sum`` (drop-ins for the ``tf.math`` ops)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops._checks import after, check, first_position, gated, joined, shape_text, text
from tfrepro.ops._exact_sum import Plan, current_plan, reduce_sum_keepdims, segment_sum_2d, traced


def _flat(data: tf.Tensor, segment_ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``data`` as [N, K] for ``segment_ids`` of any rank r (a prefix of data's shape), ids as [N],
    and the trailing shape data.shape[r:]."""
    rank = tf.rank(segment_ids)
    inner = tf.shape(data)[rank:]
    n = tf.size(segment_ids)
    return tf.reshape(data, tf.stack([n, tf.reduce_prod(inner)])), tf.reshape(segment_ids, [-1]), inner


@traced
def _gather_kept_kernel(grad: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    """The gradient of a segment sum: each element gets its segment's gradient; dropped ids get 0."""
    kept = (segment_ids >= 0) & (segment_ids < tf.cast(num_segments, segment_ids.dtype))
    gathered = _stock.gather(grad, tf.where(kept, segment_ids, tf.zeros_like(segment_ids)))
    trailing = tf.ones([tf.rank(gathered) - tf.rank(segment_ids)], tf.int32)
    keep = tf.reshape(kept, tf.concat([tf.shape(segment_ids), trailing], 0))
    return tf.where(keep, gathered, tf.zeros_like(gathered))


def _gather_kept(dy: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    """``_gather_kept_kernel``, whose gradient (a segment sum, its adjoint) is defined outside it."""
    @tf.custom_gradient
    def backward(d):
        def grad(d_d):
            return _exact_segment_sum(d_d, segment_ids, num_segments)

        return _gather_kept_kernel(tf.stop_gradient(d), segment_ids, num_segments), grad

    return backward(dy)


@traced
def _exact_segment_sum_kernel(data: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor, plan: Plan) -> tf.Tensor:
    flat, ids, inner = _flat(data, segment_ids)
    total = segment_sum_2d(flat, ids, num_segments, plan)
    return tf.cast(tf.reshape(total, tf.concat([tf.reshape(num_segments, [1]), inner], 0)), data.dtype)


def _exact_segment_sum(data: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    plan = current_plan()
    if plan.accumulator.startswith("tf"):  # TF's sum: deterministic under op determinism, not order-invariant
        return _stock.unsorted_segment_sum(data, segment_ids, num_segments)

    # The gradient is defined here, outside the traced kernel, which is never differentiated: a
    # kernel's gradient would need its call rewritten to return more outputs, which TF cannot do in
    # a TF1 graph that a Session has run. (The same holds for every kernel with a gradient.)
    @tf.custom_gradient
    def forward(values):
        def grad(dy):
            return _gather_kept(dy, segment_ids, num_segments)

        return _exact_segment_sum_kernel(tf.stop_gradient(values), segment_ids, num_segments, plan), grad

    return forward(data)


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
                                text(_stock.gather(tf.reshape(segment_ids, [-1]), position)),
                                " is out of range [0, ", text(num_segments), ")"])

    def message() -> tf.Tensor:
        return tf.cond(prefix_ok, lambda: tf.cond(fits, out_of_range, lambda: tf.strings.join([
            "tfrepro.ops supports num_segments up to 2**31 - 2; got ", text(num_segments)])), lambda: tf.strings.join([
            "data.shape = ", shape_text(data_shape), " does not start with segment_ids.shape = ", shape_text(ids_shape)]))

    fits = num_segments <= _MAX_SEGMENTS
    return prefix_ok & fits & tf.logical_not(tf.reduce_any(too_large)), message


def _segment_sum(data, segment_ids, num_segments) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The order-invariant unsorted segment sum, with the checked ids and num_segments as int32.
    A num_segments past tfrepro's limit raises InvalidArgumentError when the op runs, as TF's does
    for one its kernel cannot take."""
    data = tf.convert_to_tensor(data)
    static_segments = tf.get_static_value(num_segments)
    requested = tf.reshape(tf.cast(num_segments, tf.int64), [])  # a scalar, also when traced unshaped
    num_segments = tf.cast(tf.minimum(requested, _MAX_SEGMENTS), tf.int32)
    segment_ids = tf.convert_to_tensor(segment_ids)
    rank = segment_ids.shape.rank
    if not tf.executing_eagerly() and rank is not None and not data.shape[:rank].is_compatible_with(segment_ids.shape):
        raise ValueError(f"data.shape = {data.shape} does not start with segment_ids.shape = {segment_ids.shape}")
    checks = _unsorted_ids(tf.shape(data, out_type=tf.int64), segment_ids, requested)
    segment_ids = after(checks, segment_ids)
    if static_segments is not None and np.max(static_segments) > _MAX_SEGMENTS:
        # The check raises when the op runs. Gated, the number is no constant that grappler would
        # fold into tables of 2**31 rows, allocated while it optimises the graph.
        num_segments = gated(checks, num_segments)
    if data.dtype.is_complex:
        real = _exact_segment_sum(tf.math.real(data), segment_ids, num_segments)
        imag = _exact_segment_sum(tf.math.imag(data), segment_ids, num_segments)
        result = tf.complex(real, imag)
    elif data.dtype.is_floating:
        result = _exact_segment_sum(data, segment_ids, num_segments)
    else:
        result = _stock.unsorted_segment_sum(data, segment_ids, num_segments)
    if data.shape.rank is not None and rank is not None:
        rows = None if static_segments is None or np.size(static_segments) != 1 else int(np.reshape(static_segments, []))
        result.set_shape([rows] + data.shape[rank:].as_list())
    return result, segment_ids, num_segments


def _is_ragged(*values) -> bool:
    return any(isinstance(value, tf.RaggedTensor) for value in values)


def _ragged_segments(reduction, data, segment_ids, num_segments):
    """``reduction`` (an unsorted segment op) of ragged ``data`` or ``segment_ids``, row by row and
    position by position, as TF's ragged dispatch computes it, with ``reduction`` on the values."""
    from tensorflow.python.ops.ragged import ragged_math_ops  # TF's ragged segment reduction (no public name)

    return ragged_math_ops._ragged_segment_aggregate(reduction, data, segment_ids, num_segments)


def _ragged_mean(data, segment_ids, num_segments, root: bool):
    """TF's ragged segment mean (``root``: sqrt_n): the ragged sums over the ragged counts."""
    total = _ragged_segments(unsorted_segment_sum, data, segment_ids, num_segments)
    ones = tf.RaggedTensor.from_nested_row_splits(tf.ones_like(data.flat_values), data.nested_row_splits,
                                                  validate=False)
    count = _ragged_segments(unsorted_segment_sum, ones, segment_ids, num_segments)
    if not isinstance(total, tf.RaggedTensor):  # ragged ids: the values summed into dense rows
        return total / (tf.sqrt(count) if root else count)
    count = tf.sqrt(count.flat_values) if root else count.flat_values
    return total.with_flat_values(total.flat_values / count)


def unsorted_segment_sum(data: tf.Tensor | tf.RaggedTensor, segment_ids: tf.Tensor | tf.RaggedTensor,
                         num_segments: int | tf.Tensor, name: str | None = None) -> tf.Tensor | tf.RaggedTensor:
    """Computes the sums along segments of a tensor, bitwise independent of the order of the elements.

    A drop-in for `tf.math.unsorted_segment_sum`: `output[i]` is the sum of the slices `data[j...]`
    whose `segment_ids[j...] == i`. The result is the same bits for every order and layout of the
    elements, on any device, thread count or schedule: floating-point data (float16, bfloat16,
    float32, float64; complex data part by part) is summed through an exact int64 fixed-point
    accumulation (`tfrepro.ops._exact_sum` gives the method and its accuracy bound, which beats a
    float32 sum's for segments of up to 2**38 elements). It is not bit-equal to TF's float sum,
    which has no single answer, and a float32 result can be one ulp from the correctly rounded sum.
    Integer data is exact already and goes to TF's kernel. The gradient is a gather, deterministic.

    Unlike TF's GPU kernel, which drops ids `>= num_segments`, this op raises for them on every
    device, with TF's CPU message; under XLA they are dropped, as by TF's own op there. Negative
    ids are dropped, as in TF. Ragged `data` (or ids) is summed as TF sums it, position by
    position within rows, with this sum on the values.

    Args:
        data: A `Tensor` or `RaggedTensor` of a real or complex numeric dtype, as in
            `tf.math.unsorted_segment_sum`.
        segment_ids: An integer `Tensor` (or `RaggedTensor`) whose shape is a prefix of `data`'s:
            the segment of each slice of `data`.
        num_segments: An integer scalar: how many segments the output has. At most `2**31 - 2`
            (TF's op takes up to the int64 range).
        name: A name for the operation (optional).

    Returns:
        A `Tensor` of `data`'s dtype and shape `[num_segments] + data.shape[segment_ids.ndim:]`;
            a segment that no id names is 0.

    Raises:
        tf.errors.InvalidArgumentError: When the op runs (eagerly: at the call), for an id
            `>= num_segments`, a `data` whose shape does not start with `segment_ids`'s shape, or a
            `num_segments` above `2**31 - 2`.
        ValueError: Where a graph is built, for static shapes of `data` and `segment_ids` that do
            not match, as TF's shape function.
    """
    if _is_ragged(data, segment_ids):
        return _ragged_segments(unsorted_segment_sum, data, segment_ids, num_segments)
    with tf.name_scope(name or "DeterministicUnsortedSegmentSum"):
        return _segment_sum(data, segment_ids, num_segments)[0]


def _segment_counts(data: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    """Entries per segment (empty segments count 1), shaped to broadcast against the sums."""
    counts = _stock.unsorted_segment_sum(tf.ones_like(segment_ids, tf.int32), segment_ids, num_segments)
    counts = tf.cast(tf.maximum(counts, 1), data.dtype)
    trailing = tf.rank(data) - tf.rank(segment_ids)
    return tf.reshape(counts, tf.concat([tf.reshape(num_segments, [1]), tf.ones([trailing], tf.int32)], 0))


def unsorted_segment_mean(data: tf.Tensor | tf.RaggedTensor, segment_ids: tf.Tensor | tf.RaggedTensor,
                          num_segments: int | tf.Tensor, name: str | None = None) -> tf.Tensor | tf.RaggedTensor:
    """Computes the means along segments of a tensor, bitwise independent of the order of the elements.

    A drop-in for `tf.math.unsorted_segment_mean`: each segment's sum, computed as by
    `unsorted_segment_sum` (order-invariant, exact accumulation), divided by its number of
    entries; a segment that no id names is 0. Ragged `data` (or ids) as in TF.

    Args:
        data: A `Tensor` or `RaggedTensor` of a real or complex numeric dtype, as in
            `tf.math.unsorted_segment_mean`.
        segment_ids: An integer `Tensor` (or `RaggedTensor`) whose shape is a prefix of `data`'s.
        num_segments: An integer scalar, at most `2**31 - 2`: how many segments the output has.
        name: A name for the operation (optional).

    Returns:
        A `Tensor` of shape `[num_segments] + data.shape[segment_ids.ndim:]`.

    Raises:
        tf.errors.InvalidArgumentError: When the op runs, as for `unsorted_segment_sum`: an id
            `>= num_segments`, shapes that do not match, or too many segments.
        ValueError: Where a graph is built, for static shapes that do not match.
    """
    if _is_ragged(data, segment_ids):
        return _ragged_mean(data, segment_ids, num_segments, root=False)
    with tf.name_scope(name or "DeterministicUnsortedSegmentMean"):
        data = tf.convert_to_tensor(data)
        total, segment_ids, num_segments = _segment_sum(data, segment_ids, num_segments)
        return total / _segment_counts(data, segment_ids, num_segments)


def unsorted_segment_sqrt_n(data: tf.Tensor | tf.RaggedTensor, segment_ids: tf.Tensor | tf.RaggedTensor,
                            num_segments: int | tf.Tensor, name: str | None = None) -> tf.Tensor | tf.RaggedTensor:
    """Computes segment sums divided by the square roots of the segment sizes, order-invariantly.

    A drop-in for `tf.math.unsorted_segment_sqrt_n`: each segment's sum, computed as by
    `unsorted_segment_sum` (bitwise independent of the order of the elements), divided by
    `sqrt(N)`, `N` its number of entries; a segment that no id names is 0. Ragged `data` (or ids)
    as in TF.

    Args:
        data: A `Tensor` or `RaggedTensor` of a floating-point or complex dtype, as in
            `tf.math.unsorted_segment_sqrt_n`.
        segment_ids: An integer `Tensor` (or `RaggedTensor`) whose shape is a prefix of `data`'s.
        num_segments: An integer scalar, at most `2**31 - 2`: how many segments the output has.
        name: A name for the operation (optional).

    Returns:
        A `Tensor` of `data`'s dtype and shape `[num_segments] + data.shape[segment_ids.ndim:]`.

    Raises:
        tf.errors.InvalidArgumentError: When the op runs, as for `unsorted_segment_sum`: an id
            `>= num_segments`, shapes that do not match, or too many segments.
        ValueError: Where a graph is built, for static shapes that do not match.
    """
    if _is_ragged(data, segment_ids):
        return _ragged_mean(data, segment_ids, num_segments, root=True)
    with tf.name_scope(name or "DeterministicUnsortedSegmentSqrtN"):
        data = tf.convert_to_tensor(data)
        total, segment_ids, num_segments = _segment_sum(data, segment_ids, num_segments)
        return total / tf.sqrt(_segment_counts(data, segment_ids, num_segments))


def _sorted_kernel(data_shape: tf.Tensor, segment_ids: tf.Tensor) -> tf.Tensor:
    """TF's SegmentSum on the ids' values (where the shapes pass; valid ids where they fail, which
    the Assert reports), on zeros: its CPU kernel raises TF's message for bad values, unescaped.
    Its arguments always have shapes it takes: grappler mis-optimises a branch whose shapes fail."""
    flat = tf.reshape(segment_ids, [-1])
    rows = tf.concat([data_shape, [-1]], 0)[0]
    shaped = (tf.size(data_shape) >= 1) & tf.equal(tf.rank(segment_ids), 1) & tf.equal(tf.size(flat, tf.int64), rows)
    return _stock.segment_sum(tf.zeros(tf.shape(flat)), tf.where(shaped, flat, tf.zeros_like(flat)))


@check(raised_by=_sorted_kernel)
def _sorted_ids(data_shape: tf.Tensor, segment_ids: tf.Tensor):
    """The sorted segment ops' checks, with the message of the first that fails in TF's kernel."""
    flat = tf.reshape(segment_ids, [-1])
    size = tf.size(flat, out_type=tf.int64)
    last = _last_id(flat)
    previous, following = flat[:-1], flat[1:]
    decreasing = following < previous
    bad = decreasing | (tf.not_equal(following, previous) & ((previous < 0) | (previous >= last + 1)))
    ranked = tf.size(data_shape) >= 1
    rows = tf.concat([data_shape, [-1]], 0)[0]
    vector = tf.equal(tf.rank(segment_ids), 1)
    sized, non_negative = tf.equal(size, rows), tf.equal(size, 0) | (last >= 0)

    def out_of_order() -> tf.Tensor:
        position = first_position(bad)
        return tf.cond(_stock.gather(decreasing, position), lambda: tf.constant("segment ids are not increasing"),
                       lambda: tf.strings.join(["Segment id ", text(_stock.gather(previous, position)), " out of range [0, ",
                                                text(last + 1), "), possibly because 'segment_ids' input is not sorted."]))

    def ids_message() -> tf.Tensor:
        return tf.cond(sized, lambda: tf.cond(non_negative, out_of_order, lambda: tf.constant(
            "segment ids must be >= 0")), lambda: tf.constant("segment_ids should be the same size as dimension 0 of input."))

    def message() -> tf.Tensor:
        return tf.cond(ranked, lambda: tf.cond(vector, ids_message, lambda: tf.constant(
            "segment_ids should be a vector.")), lambda: tf.constant("input must be at least rank 1"))

    return ranked & vector & sized & non_negative & tf.logical_not(tf.reduce_any(bad)), message


def _last_id(flat: tf.Tensor) -> tf.Tensor:
    """The last id, -1 for none."""
    return tf.concat([-tf.ones([1], flat.dtype), flat[-1:]], 0)[-1]


def _sorted_segments(data: tf.Tensor, segment_ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(data, segment_ids, num_segments)`` once the sorted segment ops' checks pass; num_segments
    is the last id + 1. Ranks known where a graph is built are checked there, as TF's shape function does."""
    if not tf.executing_eagerly():
        if data.shape.rank == 0:
            raise ValueError("Shape must be at least rank 1 but is rank 0 (data of a sorted segment op)")
        if segment_ids.shape.rank not in (None, 1):
            raise ValueError(f"Shape must be rank 1 but is rank {segment_ids.shape.rank} (segment_ids of a sorted "
                             "segment op)")
    static_size, static_rows = segment_ids.shape.num_elements(), data.shape[:1].num_elements()
    if not tf.executing_eagerly() and None not in (static_size, static_rows) and static_size != static_rows:
        data = tf.compat.v1.placeholder_with_default(data, shape=None)  # fails when run, as TF's op does
    # gated, not after: the unsorted sum's own checks must not run (and fail first) before these
    segment_ids = gated(_sorted_ids(tf.shape(data, out_type=tf.int64), segment_ids), segment_ids)
    return data, segment_ids, _last_id(tf.reshape(segment_ids, [-1])) + 1


def segment_sum(data: tf.Tensor, segment_ids: tf.Tensor, name: str | None = None) -> tf.Tensor:
    """Computes the sums along segments of a tensor with sorted ids, bitwise independent of their order.

    A drop-in for `tf.math.segment_sum`: the output has `max(segment_ids) + 1` rows, row `i` the
    sum of the rows of `data` whose id is `i` (0 for an id that does not occur), summed as by
    `unsorted_segment_sum`. The ids are checked on every device, with the messages of TF's CPU
    kernel (TF's GPU kernel does not check that they are sorted).

    Args:
        data: A `Tensor` of a real or complex numeric dtype and rank >= 1, as in
            `tf.math.segment_sum`.
        segment_ids: A 1-D integer `Tensor` of `data.shape[0]` ids, sorted and non-negative
            (repeats allowed).
        name: A name for the operation (optional).

    Returns:
        A `Tensor` of `data`'s dtype and shape `[max(segment_ids) + 1] + data.shape[1:]`.

    Raises:
        tf.errors.InvalidArgumentError: When the op runs, for ids that are not increasing, a
            negative id, or a number of ids other than `data.shape[0]` (TF's messages).
        ValueError: Where a graph is built, for a scalar `data` or `segment_ids` of rank other
            than 1.
    """
    with tf.name_scope(name or "DeterministicSegmentSum"):
        return unsorted_segment_sum(*_sorted_segments(tf.convert_to_tensor(data), tf.convert_to_tensor(segment_ids)))


def segment_mean(data: tf.Tensor, segment_ids: tf.Tensor, name: str | None = None) -> tf.Tensor:
    """Computes the means along segments of a tensor with sorted ids, bitwise independent of their order.

    A drop-in for `tf.math.segment_mean`: the output has `max(segment_ids) + 1` rows, row `i` the
    mean of the rows of `data` whose id is `i` (0 for an id that does not occur), from sums
    computed as by `unsorted_segment_sum`. The ids are checked on every device, as by TF's CPU
    kernel.

    Args:
        data: A `Tensor` of a real or complex numeric dtype and rank >= 1, as in
            `tf.math.segment_mean`.
        segment_ids: A 1-D integer `Tensor` of `data.shape[0]` ids, sorted and non-negative
            (repeats allowed).
        name: A name for the operation (optional).

    Returns:
        A `Tensor` of shape `[max(segment_ids) + 1] + data.shape[1:]`.

    Raises:
        tf.errors.InvalidArgumentError: When the op runs, for ids that are not increasing, a
            negative id, or a number of ids other than `data.shape[0]` (TF's messages).
        ValueError: Where a graph is built, for a scalar `data` or `segment_ids` of rank other
            than 1.
    """
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
    normalised = [a % max(rank, 1) for a in axes]
    repeated = next((a for i, a in enumerate(normalised) if a in normalised[:i]), None)
    if repeated is not None:  # TF's kernel refuses an axis named twice eagerly; never summed twice here
        if tf.executing_eagerly():
            raise tf.errors.InvalidArgumentError(None, None, f"Axes contains duplicate dimension: {repeated}")
        raise ValueError(f"Axes contains duplicate dimension: {repeated}")
    return sorted(set(normalised))


@check
def _reduction_axes(rank: tf.Tensor, axes: tf.Tensor):
    bad = (axes < -tf.maximum(rank, 1)) | (axes >= tf.maximum(rank, 1))
    return tf.logical_not(tf.reduce_any(bad)), lambda: tf.strings.join([
        "Invalid reduction dimension (", text(_stock.gather(axes, first_position(bad))), " for input with ", text(rank),
        " dimension(s)"])


@check
def _distinct_axes(rank: tf.Tensor, axes: tf.Tensor):
    normalised = tf.math.floormod(axes, tf.maximum(rank, 1))
    return tf.equal(tf.size(tf.unique(normalised).y), tf.size(normalised)), lambda: tf.constant(
        "Axes contains duplicate dimension")


def reduce_sum(input_tensor: tf.Tensor, axis: int | list[int] | tf.Tensor | None = None, keepdims: bool = False,
               name: str | None = None) -> tf.Tensor:
    """Computes the sum of elements across dimensions of a tensor, bitwise independent of their order.

    A drop-in for `tf.reduce_sum`: floating-point input (complex input part by part) is summed
    through the exact int64 accumulation of `unsorted_segment_sum`, so the result is the same bits
    for any layout of the input, on any device and thread count; it is not bit-equal to TF's
    float sum. Integer input goes to TF's op, exact already. The gradient broadcasts,
    as TF's.

    Args:
        input_tensor: The tensor to reduce, of a numeric dtype, as in `tf.reduce_sum`.
        axis: The dimensions to reduce: `None` (all of them), an int, or a list or 1-D tensor of
            ints in `[-rank, rank)`.
        keepdims: If true, keeps the reduced dimensions, with length 1.
        name: A name for the operation (optional).

    Returns:
        The reduced tensor, of the input's dtype.

    Raises:
        tf.errors.InvalidArgumentError: An axis out of range, eagerly (at the call) or when the op
            runs.
        ValueError: An axis that is statically out of range, where a graph is built.
    """
    if isinstance(input_tensor, tf.RaggedTensor):  # TF's op dispatches it: a segment sum of its values, rebound
        return _stock.reduce_sum(input_tensor, axis=axis, keepdims=keepdims, name=name)
    with tf.name_scope(name or "DeterministicReduceSum"):
        x = tf.convert_to_tensor(input_tensor)
        if not (x.dtype.is_floating or x.dtype.is_complex):
            return _stock.reduce_sum(x, axis=axis, keepdims=keepdims)
        if x.dtype.is_complex:
            return tf.complex(reduce_sum(tf.math.real(x), axis, keepdims), reduce_sum(tf.math.imag(x), axis, keepdims))
        if current_plan().accumulator.startswith("tf"):  # TF's sum: deterministic under op determinism
            return _stock.reduce_sum(x, axis=axis, keepdims=keepdims)
        static_axes = _static_axes(axis, x.shape.rank)
        if static_axes is not None:  # kept static: the sum picks its kernels by them
            result = _reduce_sum(x, tuple(static_axes), keepdims)
            dims = x.shape.as_list()
            result.set_shape([1 if i in static_axes else d for i, d in enumerate(dims)] if keepdims
                             else [d for i, d in enumerate(dims) if i not in static_axes])
            return result
        rank = tf.rank(x)
        axes = tf.range(rank) if axis is None else tf.reshape(tf.convert_to_tensor(axis, tf.int32), [-1])
        axes = after(_reduction_axes(rank, axes), tf.math.floormod(axes, tf.maximum(rank, 1)))
        axes = after(_distinct_axes(rank, axes), axes)
        return _reduce_sum(x, axes, keepdims)


@traced
def _reduce_sum_kernel(x: tf.Tensor, axes: tf.Tensor | tuple[int, ...], keepdims: bool, plan: Plan) -> tf.Tensor:
    if isinstance(axes, tuple):
        kept = [i for i in range(x.shape.rank) if i not in axes]
        kept_shape = _stock.gather(tf.shape(x), tf.constant(kept, tf.int32, shape=[len(kept)]))
    else:
        reduced = tf.reduce_any(tf.equal(tf.range(tf.rank(x))[:, None], axes[None, :]), axis=1)
        kept_shape = tf.boolean_mask(tf.shape(x), tf.logical_not(reduced))
    total = tf.cast(reduce_sum_keepdims(x, axes, plan), x.dtype)
    return total if keepdims else tf.reshape(total, kept_shape)


def _reduce_sum(x: tf.Tensor, axes: tf.Tensor | tuple[int, ...], keepdims: bool) -> tf.Tensor:
    """The traced sum, with its gradient defined outside the kernel (see ``_exact_segment_sum``)."""
    plan = current_plan()

    @tf.custom_gradient
    def forward(values):
        def grad(dy):
            return _sum_gradient(dy, tf.shape(values), axes, keepdims)

        return _reduce_sum_kernel(tf.stop_gradient(values), axes, keepdims, plan), grad

    return forward(x)


@traced
def _sum_gradient_kernel(dy: tf.Tensor, shape: tf.Tensor, axes: tf.Tensor | tuple[int, ...], keepdims: bool) -> tf.Tensor:
    """The gradient of a sum: ``dy`` broadcast back over the summed axes of ``shape``."""
    if not keepdims:  # back to the kept dimensions' places
        summed = tf.constant(axes, tf.int32, shape=[len(axes)]) if isinstance(axes, tuple) else axes
        summed = tf.reduce_any(tf.equal(tf.range(tf.size(shape))[:, None], summed[None, :]), axis=1)
        dy = tf.reshape(dy, tf.where(summed, 1, shape))
    return tf.broadcast_to(dy, shape)


def _sum_gradient(dy: tf.Tensor, shape: tf.Tensor, axes: tf.Tensor | tuple[int, ...], keepdims: bool) -> tf.Tensor:
    """``_sum_gradient_kernel``, whose gradient (the sum, its adjoint) is defined outside it."""
    @tf.custom_gradient
    def backward(d):
        def grad(d_d):
            return _reduce_sum(d_d, axes, keepdims)

        return _sum_gradient_kernel(tf.stop_gradient(d), shape, axes, keepdims), grad

    return backward(dy)
