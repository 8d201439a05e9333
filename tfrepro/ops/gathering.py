"""``gather`` / ``embedding_lookup`` whose gradient aggregates repeated indices exactly.

TF's gather gradient is an ``IndexedSlices`` with one row per index, repeats included; the repeats
are summed later (densified with a segment sum, or scatter-added by the optimizer), in thread order
on a GPU. Here the gradient is an ``IndexedSlices`` over the *unique* indices whose rows are
order-invariant sums, so whatever applies it adds each row once.
"""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops.segment import unsorted_segment_sum


def _gather_axis0(params: tf.Tensor, indices: tf.Tensor) -> tf.Tensor:
    @tf.custom_gradient
    def forward(p):
        def grad(dy):
            unique, position = tf.unique(tf.reshape(indices, [-1]))
            rows = tf.reshape(dy, tf.concat([[-1], tf.shape(p)[1:]], 0))
            summed = unsorted_segment_sum(rows, position, tf.size(unique))
            return tf.IndexedSlices(summed, unique, tf.shape(p, out_type=unique.dtype))

        return _stock.gather(p, indices), grad

    return forward(params)


def _first_axis(axis, rank: int | None) -> bool:
    """Whether ``axis`` is statically the first axis of params of rank ``rank``. An axis out of range
    is not (TF's gather raises for it; it is never taken modulo the rank)."""
    value = 0 if axis is None else tf.get_static_value(axis)
    if value is None:
        return False
    value = int(value)
    return value == 0 or (rank is not None and value == -rank)


def _ragged_gather(params, indices, axis, batch_dims: int):
    """``gather`` of ragged ``params`` or ``indices``, as TF's ragged gather. Where it moves whole
    rows of the values (params' ragged dimensions, or dense params' first axis), TF's ragged gather
    places the positions of those rows and tfrepro's axis-0 gather moves them, with its exact
    gradient; a gather inside the rows is TF's, whose gradient sums through the rebound
    ``math_ops.unsorted_segment_sum``."""
    if isinstance(params, tf.RaggedTensor):
        value = batch_dims if axis is None else tf.get_static_value(axis)
        rank = params.shape.rank
        inside_rows = value is None or rank is None or not -rank <= int(value) < rank or int(value) % rank > params.ragged_rank
        if inside_rows:
            return _stock.gather(params, indices, axis=axis, batch_dims=batch_dims)
        values = params.flat_values
        positions = params.with_flat_values(tf.range(tf.shape(values, out_type=params.row_splits.dtype)[0]))
    else:
        values = tf.convert_to_tensor(params)
        if batch_dims != 0 or not _first_axis(axis, values.shape.rank):
            return _stock.gather(values, indices, axis=axis, batch_dims=batch_dims)
        positions = tf.range(tf.shape(values, out_type=indices.dtype)[0])
    placed = _stock.gather(positions, indices, axis=axis, batch_dims=batch_dims)  # TF's checks and structure
    return placed.with_flat_values(_gather_axis0(values, placed.flat_values))


def gather(params: tf.Tensor | tf.RaggedTensor, indices: tf.Tensor | tf.RaggedTensor,
           validate_indices: bool | None = None, axis: int | tf.Tensor | None = None, batch_dims: int = 0,
           name: str | None = None) -> tf.Tensor | tf.RaggedTensor:
    """Gathers slices from `params`, with a gradient that sums repeated indices order-invariantly.

    A drop-in for `tf.gather`; the forward result is TF's. Along the first axis with
    `batch_dims=0` (an embedding lookup), the gradient is an `IndexedSlices` over the unique
    indices whose rows are exact, order-invariant sums (`unsorted_segment_sum`) of the gradients of
    their repeats, so whatever applies it (a dense conversion, an optimizer's scatter-add) adds each
    row once. TF's gradient has one row per index, repeats included, summed later in thread order
    on a GPU. A gather of ragged `params` or `indices` that moves whole rows gets the same gradient.
    Other axes and `batch_dims` use TF's gather, whose gradient sums through
    `math_ops.unsorted_segment_sum`, which `tfrepro.patch(ops=True)` replaces.

    Args:
        params: The `Tensor` (or `RaggedTensor`) to gather from, of rank >= `axis + 1`, as in
            `tf.gather`.
        indices: An integer `Tensor` (or `RaggedTensor`) of indices into `params`' axis `axis`.
        validate_indices: Deprecated and ignored, as in TF.
        axis: The axis of `params` to gather along (default: `batch_dims`, which is 0 by default).
        batch_dims: The number of leading batch dimensions, as in `tf.gather`.
        name: A name for the operation (optional).

    Returns:
        A `Tensor` (or `RaggedTensor`) of `params`' dtype, of shape
            `params.shape[:axis] + indices.shape[batch_dims:] + params.shape[axis + 1:]`.
    """
    del validate_indices  # deprecated in TF, ignored there too
    batch_dims = 0 if batch_dims is None else batch_dims  # TF's op takes None for 0
    with tf.name_scope(name or "DeterministicGather"):
        if isinstance(params, tf.RaggedTensor) or isinstance(indices, tf.RaggedTensor):
            return _ragged_gather(params, indices, axis, batch_dims)
        params = tf.convert_to_tensor(params)
        indices = tf.convert_to_tensor(indices)
        if batch_dims != 0 or not _first_axis(axis, params.shape.rank):
            return _stock.gather(params, indices, axis=axis, batch_dims=batch_dims)
        return _gather_axis0(params, indices)


def embedding_lookup(params: tf.Tensor | list[tf.Tensor], ids: tf.Tensor | tf.RaggedTensor,
                     max_norm: float | None = None, name: str | None = None) -> tf.Tensor | tf.RaggedTensor:
    """Looks up `ids` in an embedding table, with a gradient that sums repeated ids order-invariantly.

    A drop-in for `tf.nn.embedding_lookup`: the lookup is `gather(params, ids)`, whose gradient
    has one exact, order-invariant sum per distinct id (see `gather`). Ragged `ids` are looked up
    as by TF (the lookup of their values). Partitioned `params` (a list of several tensors) go to
    TF's own lookup, and so do ragged `params`, which TF refuses.

    Args:
        params: The embedding table: a `Tensor` (or a list holding one), as in
            `tf.nn.embedding_lookup`.
        ids: An int32 or int64 `Tensor` (or `RaggedTensor`) of ids to look up.
        max_norm: If not `None`, each embedding is clipped to this L2 norm, as in TF.
        name: A name for the operation (optional).

    Returns:
        A `Tensor` (or `RaggedTensor`) of `params`' dtype and shape `ids.shape + params.shape[1:]`.
    """
    if isinstance(params, (list, tuple)):
        if len(params) != 1:
            return _stock.embedding_lookup(params, ids, max_norm=max_norm, name=name)
        params = params[0]
    if isinstance(params, tf.RaggedTensor):
        return _stock.embedding_lookup(params, ids, max_norm=max_norm, name=name)
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(embedding_lookup(params, ids.flat_values, max_norm=max_norm, name=name))
    with tf.name_scope(name or "DeterministicEmbeddingLookup"):
        ids = tf.convert_to_tensor(ids)
        result = gather(params, ids)
        if max_norm is not None:
            result = tf.clip_by_norm(result, max_norm, axes=list(range(ids.shape.rank, result.shape.rank)))
        return result
