"""Deterministic op replacements, bitwise independent of accumulation order on any hardware.

Each keeps the signature and semantics of the TensorFlow op it replaces. Sums go through an exact
int64 fixed-point accumulation (see ``tfrepro.ops._exact_sum`` for the method and its accuracy
bound), so permuting the inputs or changing the device, thread count or schedule cannot change a
bit. ``tfrepro.patch(ops=True)`` rebinds TensorFlow's names, and the internal call sites that Keras
and TF's gradient code use, to these ops.

Importing this module imports TensorFlow.
"""

from tfrepro.ops.gather import embedding_lookup, gather
from tfrepro.ops.image import crop_and_resize, resize_nearest_neighbor
from tfrepro.ops.nn import bias_add, softmax_cross_entropy_with_logits, sparse_softmax_cross_entropy_with_logits
from tfrepro.ops.segment import (
    reduce_sum,
    segment_mean,
    segment_sum,
    unsorted_segment_mean,
    unsorted_segment_sqrt_n,
    unsorted_segment_sum,
)
from tfrepro.ops.sparse import bincount, sparse_dense_matmul

__all__ = [
    "bias_add",
    "crop_and_resize",
    "bincount",
    "embedding_lookup",
    "gather",
    "reduce_sum",
    "resize_nearest_neighbor",
    "segment_mean",
    "segment_sum",
    "softmax_cross_entropy_with_logits",
    "sparse_dense_matmul",
    "sparse_softmax_cross_entropy_with_logits",
    "unsorted_segment_mean",
    "unsorted_segment_sqrt_n",
    "unsorted_segment_sum",
]
