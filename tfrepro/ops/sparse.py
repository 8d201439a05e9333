"""``bincount`` and ``sparse_dense_matmul``: ops with no deterministic GPU kernel in TF (they raise
``UnimplementedError`` under op determinism), rebuilt on the order-invariant segment sum."""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops.segment import reduce_sum, unsorted_segment_sum


def bincount(arr, weights=None, minlength=None, maxlength=None, dtype=tf.int32, name=None, axis=None,
             binary_output=False):
    """``tf.math.bincount`` over the flattened input (``axis=None``, TF's default).

    Negative values raise InvalidArgumentError, as TF's CPU kernel; values >= ``maxlength`` are
    ignored. With ``weights`` the output has their dtype and sums them order-invariantly.
    """
    if axis not in (None, 0):
        raise NotImplementedError("tfrepro.ops.bincount supports axis=None (the flattened input) only")
    with tf.name_scope(name or "DeterministicBincount"):
        flat = tf.reshape(tf.convert_to_tensor(arr), [-1])
        if not flat.dtype.is_integer:
            raise TypeError(f"arr must be an integer tensor; got {flat.dtype.name}")
        with tf.control_dependencies([tf.debugging.assert_non_negative(flat, message="Input arr must be non-negative!")]):
            size = tf.cond(tf.size(flat) > 0, lambda: tf.reduce_max(flat) + 1, lambda: tf.zeros([], flat.dtype))
        if minlength is not None:
            size = tf.maximum(size, tf.cast(minlength, flat.dtype))
        if maxlength is not None:
            size = tf.minimum(size, tf.cast(maxlength, flat.dtype))
        ids = tf.where(flat < size, flat, -tf.ones_like(flat))
        if weights is not None and not binary_output:
            return unsorted_segment_sum(tf.reshape(tf.convert_to_tensor(weights), [-1]), ids, size)
        counts = unsorted_segment_sum(tf.ones_like(flat, dtype=tf.int32), ids, size)
        if binary_output:
            counts = tf.minimum(counts, 1)
        return tf.cast(counts, dtype)


def sparse_dense_matmul(sp_a, b, adjoint_a=False, adjoint_b=False, name=None):
    """``tf.sparse.sparse_dense_matmul`` for a sparse ``sp_a`` and real dtypes: each output row is an
    order-invariant sum of its nonzeros' contributions; gradients for the sparse values and ``b``
    likewise. A dense ``sp_a`` with a sparse ``b``, or complex dtypes, go to TF's op."""
    if not isinstance(sp_a, tf.SparseTensor) or sp_a.values.dtype.is_complex:
        return _stock.sparse_dense_matmul(sp_a, b, adjoint_a=adjoint_a, adjoint_b=adjoint_b, name=name)
    with tf.name_scope(name or "DeterministicSparseDenseMatmul"):
        b = tf.convert_to_tensor(b)
        if adjoint_b:
            b = tf.transpose(b)
        rows, cols = sp_a.indices[:, 0], sp_a.indices[:, 1]
        out_rows = sp_a.dense_shape[0]
        if adjoint_a:
            rows, cols, out_rows = cols, rows, sp_a.dense_shape[1]

        @tf.custom_gradient
        def forward(values, dense):
            picked = _stock.gather(dense, cols)
            result = unsorted_segment_sum(values[:, None] * picked, rows, out_rows)

            def grad(dy):
                spread = _stock.gather(dy, rows)
                d_values = reduce_sum(spread * picked, axis=1)
                d_dense = unsorted_segment_sum(values[:, None] * spread, cols, tf.shape(dense, out_type=cols.dtype)[0])
                return d_values, d_dense

            return result, grad

        return forward(sp_a.values, b)
