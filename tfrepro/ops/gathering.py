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


def gather(params, indices, validate_indices=None, axis=None, batch_dims=0, name=None):
    """``tf.gather``. For ``axis=0, batch_dims=0`` (embeddings) the gradient aggregates repeated
    indices exactly (see module doc). Other axes and ``batch_dims`` use TF's gather, whose gradient
    sums through ``math_ops.unsorted_segment_sum``, which ``patch(ops=True)`` replaces."""
    del validate_indices  # deprecated in TF, ignored there too
    with tf.name_scope(name or "DeterministicGather"):
        params = tf.convert_to_tensor(params)
        indices = tf.convert_to_tensor(indices)
        axis_value = 0 if axis is None else tf.get_static_value(axis)
        rank = params.shape.rank
        first_axis = axis_value == 0 or (axis_value is not None and rank is not None and axis_value % max(rank, 1) == 0)
        if batch_dims != 0 or not first_axis:
            return _stock.gather(params, indices, axis=axis, batch_dims=batch_dims)
        return _gather_axis0(params, indices)


def embedding_lookup(params, ids, max_norm=None, name=None):
    """``tf.nn.embedding_lookup`` with the exact gradient of ``gather``. Partitioned params (a list
    of several tensors) go to TF's own lookup."""
    if isinstance(params, (list, tuple)):
        if len(params) != 1:
            return _stock.embedding_lookup(params, ids, max_norm=max_norm, name=name)
        params = params[0]
    with tf.name_scope(name or "DeterministicEmbeddingLookup"):
        ids = tf.convert_to_tensor(ids)
        result = gather(params, ids)
        if max_norm is not None:
            result = tf.clip_by_norm(result, max_norm, axes=list(range(ids.shape.rank, result.shape.rank)))
        return result
