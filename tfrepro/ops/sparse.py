"""``bincount`` and ``sparse_dense_matmul``: ops with no deterministic GPU kernel in TF (they raise
``UnimplementedError`` under op determinism), rebuilt on the order-invariant segment sum."""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops._exact_sum import same_summation
from tfrepro.ops._checks import after, check, first_position, gated, shape_text, text
from tfrepro.ops.segment import reduce_sum, unsorted_segment_sum


def _bincount_input(x) -> tuple[tf.Tensor, tf.Tensor | None, tf.Tensor | None]:
    """A dense, ragged or sparse input as (its values, flat; each value's row, int64; the output's
    leading shape for ``axis=-1``, int64). Rows are None where TF counts all values together (sparse
    and ragged input of rank other than 2). Implicit zeros of a SparseTensor are not values, as in TF."""
    if isinstance(x, tf.SparseTensor):
        if x.shape.rank == 2:
            return x.values, x.indices[:, 0], x.dense_shape[:1]
        return x.values, None, None
    if isinstance(x, tf.RaggedTensor):
        if x.shape.rank == 2:
            return x.values, x.value_rowids(), tf.reshape(x.nrows(), [1])
        return tf.reshape(x.flat_values, [-1]), None, None
    x = tf.convert_to_tensor(x)
    shape = tf.shape(x, out_type=tf.int64)  # rank 1 or 2 (TF's kernel checks), known or not
    row_length = tf.maximum(tf.reduce_prod(shape[-1:]), 1)
    return tf.reshape(x, [-1]), tf.range(tf.size(x, out_type=tf.int64)) // row_length, shape[:-1]


@check
def _non_negative(values: tf.Tensor):
    return tf.reduce_all(values >= 0), lambda: "Input arr must be non-negative!"


@check
def _sparse_product(a_indices: tf.Tensor, a_shape: tf.Tensor, b_shape: tf.Tensor, adjoint_a: bool, adjoint_b: bool):
    """SparseTensorDenseMatMul's checks, in its kernel's order and words: the inner dimensions agree,
    then each nonzero's inner index (k) and output row (m) are in range."""
    row_column, inner_column = (1, 0) if adjoint_a else (0, 1)
    inner, rows = a_shape[inner_column], a_shape[row_column]
    b_inner = b_shape[1] if adjoint_b else b_shape[0]
    ks, ms = a_indices[:, inner_column], a_indices[:, row_column]
    bad_k, bad_m = (ks < 0) | (ks >= inner), (ms < 0) | (ms >= rows)
    matching = tf.equal(inner, b_inner)

    def message() -> tf.Tensor:
        position = first_position(bad_k | bad_m)

        def out_of_bounds(name: str, values: tf.Tensor, column: int, bound: tf.Tensor) -> tf.Tensor:
            return tf.strings.join([f"{name} (", text(_stock.gather(values, position)), ") from index[", text(position),
                                    f",{column}] out of bounds (>=", text(bound), ")"])

        return tf.cond(matching, lambda: tf.cond(
            _stock.gather(bad_k, position), lambda: out_of_bounds("k", ks, inner_column, inner),
            lambda: out_of_bounds("m", ms, row_column, rows)), lambda: tf.strings.join([
                "Cannot multiply A and B because inner dimension does not match: ", text(inner), " vs. ", text(b_inner),
                ".  Did you forget a transpose?  Dimensions of A: [", text(a_shape[0]), ", ", text(a_shape[1]),
                ").  Dimensions of B: ", shape_text(b_shape)]))

    return matching & tf.logical_not(tf.reduce_any(bad_k | bad_m)), message


def bincount(arr: tf.Tensor | tf.RaggedTensor | tf.SparseTensor,
             weights: tf.Tensor | tf.RaggedTensor | tf.SparseTensor | None = None, minlength: int | None = None,
             maxlength: int | None = None, dtype: tf.DType = tf.int32, name: str | None = None, axis: int | None = None,
             binary_output: bool = False) -> tf.Tensor:
    """Counts the occurrences of each value in an integer array, order-invariantly.

    A drop-in for `tf.math.bincount`, which has no deterministic GPU kernel (it raises under op
    determinism from TF 2.7). Counts and weighted sums are segment sums (`unsorted_segment_sum`):
    with `weights`, each bin's sum is exact and bitwise independent of the order of the values.
    Negative values raise on every device, as on TF's CPU kernel.

    Args:
        arr: A `Tensor`, `RaggedTensor` or `SparseTensor` of non-negative values (float input is
            cast to int32, as TF does; a `SparseTensor`'s implicit zeros are not counted), of rank
            2 for `axis=-1`.
        weights: If not `None`, a tensor of `arr`'s shape (and kind): each value adds its weight to
            its bin instead of 1.
        minlength: If given, the output has at least this many bins (padded with zeros).
        maxlength: If given, the output has at most this many bins; values `>= maxlength` are
            ignored.
        dtype: The dtype of the counts when `weights` is `None` (default `tf.int32`).
        name: A name for the operation (optional).
        axis: `None` or 0 to count the flattened input, -1 to count each row of a rank-2 input
            separately.
        binary_output: Whether to output 1 for a value that occurs, 0 otherwise, instead of its
            count (not with `weights`).

    Returns:
        A `Tensor` of bins: `[max(arr) + 1]` (within `minlength` and `maxlength`), or
            `[rows, bins]` with `axis=-1`; of `weights`' dtype if given, else of `dtype`.

    Raises:
        ValueError: Both `weights` and `binary_output`, or an `axis` other than `None`, 0 and -1.
        tf.errors.InvalidArgumentError: When the op runs (eagerly: at the call), for a negative
            value.
    """
    if weights is not None and binary_output:
        raise ValueError("Arguments `binary_output` and `weights` are mutually exclusive. Please specify only one.")
    axis = 0 if axis is None else axis
    if axis not in (0, -1):
        raise ValueError(f"Unsupported value for argument axis={axis}. Only 0 and -1 are currently supported.")
    with tf.name_scope(name or "DeterministicBincount"):
        values, rows, leading = _bincount_input(arr)
        if not values.dtype.is_integer:
            values = tf.cast(values, tf.int32)
        nonempty = tf.cast(tf.size(values) > 0, values.dtype)
        values = after(_non_negative(values), values)
        size = nonempty * (tf.reduce_max(values) + 1)  # 0 for an empty input (its max is the dtype's minimum)
        if minlength is not None:
            size = tf.maximum(tf.convert_to_tensor(minlength, values.dtype), size)
        if maxlength is not None:
            size = tf.minimum(tf.convert_to_tensor(maxlength, values.dtype), size)
        ids = tf.where(values < size, tf.cast(values, tf.int64), -1)
        shape = tf.reshape(tf.cast(size, tf.int64), [1])
        if axis == -1 and rows is not None:  # one row of bins per input row
            ids = tf.where(ids >= 0, rows * shape[0] + ids, ids)
            shape = tf.concat([leading, shape], 0)
        if weights is None:
            counts = unsorted_segment_sum(tf.ones_like(values, dtype=tf.int32), ids, tf.reduce_prod(shape))
        else:
            counts = unsorted_segment_sum(_bincount_input(weights)[0], ids, tf.reduce_prod(shape))
        counts = tf.reshape(counts, shape)
        if binary_output:
            counts = tf.minimum(counts, 1)
        return counts if weights is not None else tf.cast(counts, dtype)


def _static_inner_dimensions(a_shape: tf.Tensor, b: tf.Tensor, adjoint_a: bool, adjoint_b: bool) -> None:
    """TF's shape function: inner dimensions known where a graph is built must agree (ValueError)."""
    if tf.executing_eagerly():
        return
    shape = tf.get_static_value(a_shape)
    if shape is None or len(shape) != 2 or b.shape.rank != 2:
        return
    inner, b_inner = int(shape[0 if adjoint_a else 1]), b.shape[1 if adjoint_b else 0]
    if b_inner is not None and inner != b_inner:
        raise ValueError(f"Dimensions must be equal, but are {inner} and {b_inner} for sparse_dense_matmul: "
                         f"A is {list(shape)}{' (adjoint)' if adjoint_a else ''}, B is {b.shape}"
                         f"{' (adjoint)' if adjoint_b else ''}")


def sparse_dense_matmul(sp_a: tf.SparseTensor | tf.Tensor, b: tf.Tensor | tf.SparseTensor, adjoint_a: bool = False,
                        adjoint_b: bool = False, name: str | None = None) -> tf.Tensor:
    """Multiplies a `SparseTensor` by a dense matrix, bitwise independent of the order of the nonzeros.

    A drop-in for `tf.sparse.sparse_dense_matmul`, which has no deterministic GPU kernel (it raises
    under op determinism from TF 2.6). For a sparse `sp_a` of a real dtype, each output row is an
    exact, order-invariant sum of its nonzeros' contributions (`unsorted_segment_sum`), and so are
    the gradients to the sparse values and to `b`. float16 and bfloat16 multiply and sum in
    float32, as TF's kernels accumulate. A dense `sp_a` with a sparse `b`, complex dtypes, or
    dtypes that differ (TF's error) go to TF's op.

    Args:
        sp_a: A 2-D `SparseTensor` (or a dense `Tensor` when `b` is sparse), as in
            `tf.sparse.sparse_dense_matmul`.
        b: A 2-D dense `Tensor` of `sp_a`'s dtype (a value that is not a tensor is converted to
            it), or a `SparseTensor` when `sp_a` is dense.
        adjoint_a: Use the adjoint (conjugate transpose) of `sp_a`, as in TF.
        adjoint_b: Use the adjoint (conjugate transpose) of `b`, as in TF.
        name: A name for the operation (optional).

    Returns:
        A dense `Tensor` of `b`'s dtype: `op(sp_a) @ op(b)`.

    Raises:
        ValueError: Where a graph is built, for inner dimensions that are known and differ.
        tf.errors.InvalidArgumentError: When the op runs (eagerly: at the call), for inner
            dimensions that differ or an index of `sp_a` out of its bounds (TF's messages).
    """
    if isinstance(sp_a, tf.SparseTensor) and not tf.is_tensor(b):
        b = tf.convert_to_tensor(b, sp_a.values.dtype)  # as TF's op converts it
    if not isinstance(sp_a, tf.SparseTensor) or sp_a.values.dtype.is_complex or b.dtype != sp_a.values.dtype:
        return _stock.sparse_dense_matmul(sp_a, b, adjoint_a=adjoint_a, adjoint_b=adjoint_b, name=name)  # or TF's error
    with tf.name_scope(name or "DeterministicSparseDenseMatmul"):
        b_shape = tf.shape(b, out_type=tf.int64)
        a_shape = sp_a.dense_shape
        _static_inner_dimensions(a_shape, b, adjoint_a, adjoint_b)
        if adjoint_b:
            b = tf.transpose(b)
        checks = _sparse_product(sp_a.indices, a_shape, b_shape, adjoint_a, adjoint_b)
        indices, b = gated(checks, sp_a.indices), after(checks, b)  # the sums' own checks come after these
        rows, cols = indices[:, 0], indices[:, 1]
        out_rows = a_shape[0]
        if adjoint_a:
            rows, cols, out_rows = cols, rows, a_shape[1]
        wide = tf.float32 if b.dtype in (tf.float16, tf.bfloat16) else b.dtype

        @tf.custom_gradient
        def forward(values, dense):
            values_wide, picked = tf.cast(values, wide), _stock.gather(tf.cast(dense, wide), cols)
            result = tf.cast(unsorted_segment_sum(values_wide[:, None] * picked, rows, out_rows), dense.dtype)

            @same_summation
            def grad(dy):
                spread = _stock.gather(tf.cast(dy, wide), rows)
                d_values = reduce_sum(spread * picked, axis=1)
                d_dense = unsorted_segment_sum(values_wide[:, None] * spread, cols,
                                               tf.shape(dense, out_type=cols.dtype)[0])
                return tf.cast(d_values, values.dtype), tf.cast(d_dense, dense.dtype)

            return result, grad

        return forward(sp_a.values, b)
