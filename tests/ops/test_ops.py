"""tfrepro.ops: bitwise order invariance (property-based), accuracy, TF semantics, gradients."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrepro import _tf

pytestmark = pytest.mark.core  # the numerics must hold on the oldest TF too

tf = _tf.import_tf()
from tfrepro import ops  # noqa: E402  (imports TensorFlow)

FLOATS = ["float16", "bfloat16", "float32", "float64"]


def bits(tensor):
    return np.asarray(tf.convert_to_tensor(tensor)).tobytes()


def mixed_magnitudes(rng, shape, dtype):
    """Values spanning many binades, with exact cancellations and zeros mixed in."""
    span = {"float16": 6, "bfloat16": 30, "float32": 30, "float64": 200}[dtype]
    values = rng.standard_normal(shape) * np.exp2(rng.integers(-span, span, size=shape))
    values[rng.random(shape) < 0.05] = 0.0
    return tf.cast(tf.constant(values), dtype)


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(FLOATS), n=st.integers(0, 120), k=st.integers(1, 5), segments=st.integers(1, 12),
       seed=st.integers(0, 2**32 - 1))
def test_segment_sum_is_bitwise_invariant_to_element_order_and_id_layout(dtype, n, k, segments, seed):
    rng = np.random.default_rng(seed)
    data = mixed_magnitudes(rng, (n, k), dtype)
    ids = rng.integers(-1, segments, size=n)  # -1 rows are dropped, as by TF
    result = ops.unsorted_segment_sum(data, ids, segments)
    order = rng.permutation(n)
    assert bits(ops.unsorted_segment_sum(tf.gather(data, order), ids[order], segments)) == bits(result)
    relabel = rng.permutation(segments)  # a different but equivalent segment-id layout
    moved = ops.unsorted_segment_sum(data, np.where(ids >= 0, relabel[np.maximum(ids, 0)], -1), segments)
    assert bits(tf.gather(moved, relabel)) == bits(result)


def test_stock_float_sums_are_order_dependent_negative_control():
    data = tf.constant([1e30, 1.0, -1e30, 3.0, -2.5e-8, 7.0], tf.float32)
    ids = tf.zeros([6], tf.int32)
    stock = {bits(tf.math.unsorted_segment_sum(tf.gather(data, p), ids, 1))
             for p in ([0, 1, 2, 3, 4, 5], [0, 2, 1, 3, 4, 5], [1, 3, 5, 0, 2, 4])}
    ours = {bits(ops.unsorted_segment_sum(tf.gather(data, p), ids, 1))
            for p in ([0, 1, 2, 3, 4, 5], [0, 2, 1, 3, 4, 5], [1, 3, 5, 0, 2, 4])}
    assert len(stock) > 1 and len(ours) == 1


def _bound(values: np.ndarray, precision_dtype) -> float:
    """The documented error bound for one segment: n * m * 2**-P, plus the output rounding."""
    n = len(values)
    if n == 0:
        return 0.0
    m = float(np.max(np.abs(values)))
    precision = 62 - math.ceil(math.log2(n)) if n > 1 else 62
    exact = math.fsum(values)
    return n * m * 2.0 ** -precision + abs(exact) * float(np.finfo(precision_dtype).eps) + float(np.finfo(precision_dtype).tiny)


@pytest.mark.parametrize("case", ["adversarial", "mixed", "subnormal", "near_overflow", "uniform"])
def test_accuracy_within_the_bound_and_no_worse_than_stock_float32(case):
    rng = np.random.default_rng(7)
    if case == "adversarial":
        data = np.array([1e30, 1.0, -1e30, 1e-30, -1.0, 3.0, -3.0, 2.0**-20], np.float32)
    elif case == "mixed":
        data = (rng.standard_normal(4000) * np.exp2(rng.integers(-40, 40, 4000))).astype(np.float32)
    elif case == "subnormal":
        data = (rng.standard_normal(500) * 1e-40).astype(np.float32)
    elif case == "near_overflow":
        data = np.array([3.0e38, 3.0e38, -3.0e38, 1e30, -2.9e38], np.float32)
    else:
        data = rng.uniform(-1, 1, 100000).astype(np.float32)
    exact = math.fsum(data.astype(np.float64))
    ours = float(ops.unsorted_segment_sum(data, np.zeros(len(data), np.int32), 1)[0])
    assert abs(ours - exact) <= _bound(data.astype(np.float64), np.float32)
    worst_stock = max(abs(float(tf.math.unsorted_segment_sum(data[p], np.zeros(len(data), np.int32), 1)[0]) - exact)
                      for p in [np.arange(len(data))] + [rng.permutation(len(data)) for _ in range(8)])
    assert abs(ours - exact) <= worst_stock


def test_semantics_match_tf():
    data = tf.constant(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    ids = tf.constant([[0, 2, 2], [-1, 0, 3]])  # ids of rank 2: a prefix of data's shape
    np.testing.assert_allclose(ops.unsorted_segment_sum(data, ids, 5), tf.math.unsorted_segment_sum(data, ids, 5))
    assert ops.unsorted_segment_sum(tf.zeros([0, 3]), tf.zeros([0], tf.int32), 4).shape == (4, 3)
    with pytest.raises(tf.errors.InvalidArgumentError):
        ops.unsorted_segment_sum(tf.ones([2]), [0, 5], 3)
    with pytest.raises(tf.errors.InvalidArgumentError):
        ops.segment_sum(tf.ones([3]), [0, 2, 1])
    nonfinite = ops.unsorted_segment_sum(tf.constant([np.inf, 1.0, np.nan, np.inf, -np.inf, -np.inf]), [0, 0, 1, 2, 2, 3], 5)
    assert np.array_equal(nonfinite.numpy(), [np.inf, np.nan, np.nan, -np.inf, 0.0], equal_nan=True)
    np.testing.assert_allclose(ops.unsorted_segment_mean(data, ids, 5), tf.math.unsorted_segment_mean(data, ids, 5))
    np.testing.assert_allclose(ops.unsorted_segment_sqrt_n(data, ids, 5), tf.math.unsorted_segment_sqrt_n(data, ids, 5))
    sorted_ids = tf.constant([0, 0, 2])
    np.testing.assert_allclose(ops.segment_sum(data[0], sorted_ids), tf.math.segment_sum(data[0], sorted_ids))
    np.testing.assert_allclose(ops.segment_mean(data[0], sorted_ids), tf.math.segment_mean(data[0], sorted_ids))
    for axis, keepdims in ((None, False), (1, True), ([0, 2], False), (-1, False)):
        np.testing.assert_allclose(ops.reduce_sum(data, axis=axis, keepdims=keepdims),
                                   tf.reduce_sum(data, axis=axis, keepdims=keepdims))
    ints = tf.constant([1, 2, 3])
    assert ops.unsorted_segment_sum(ints, [0, 0, 1], 2).numpy().tolist() == [3, 3]


def test_other_ops_match_tf_forward():
    rng = np.random.default_rng(3)
    value = tf.constant(rng.standard_normal((2, 3, 4, 5)), tf.float32)
    bias = tf.constant(rng.standard_normal(5), tf.float32)
    assert bits(ops.bias_add(value, bias)) == bits(tf.nn.bias_add(value, bias))
    assert bits(ops.bias_add(value, bias[:3], data_format="NCHW")) == bits(tf.nn.bias_add(value, bias[:3], data_format="NCHW"))
    logits = tf.constant(rng.standard_normal((6, 4)), tf.float32)
    labels = tf.nn.softmax(tf.constant(rng.standard_normal((6, 4)), tf.float32))
    np.testing.assert_allclose(ops.softmax_cross_entropy_with_logits(labels, logits),
                               tf.nn.softmax_cross_entropy_with_logits(labels, logits), rtol=1e-6)
    sparse = tf.constant([0, 3, 1, 2, 2, 0])
    np.testing.assert_allclose(ops.sparse_softmax_cross_entropy_with_logits(sparse, logits),
                               tf.nn.sparse_softmax_cross_entropy_with_logits(sparse, logits), rtol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="valid range"):
        ops.sparse_softmax_cross_entropy_with_logits(tf.constant([4]), logits[:1])
    assert ops.bincount([1, 1, 4], minlength=6).numpy().tolist() == tf.math.bincount([1, 1, 4], minlength=6).numpy().tolist()
    assert ops.bincount([1, 1, 4], maxlength=3).numpy().tolist() == tf.math.bincount([1, 1, 4], maxlength=3).numpy().tolist()
    np.testing.assert_allclose(ops.bincount([0, 2, 2], weights=[0.5, 0.25, 1.0]), tf.math.bincount([0, 2, 2], weights=[0.5, 0.25, 1.0]))
    with pytest.raises(tf.errors.InvalidArgumentError):
        ops.bincount([1, -1])
    sp = tf.sparse.from_dense(tf.constant([[1.0, 0, 2], [0, 0, 3]]))
    dense = tf.constant(rng.standard_normal((3, 4)), tf.float32)
    np.testing.assert_allclose(ops.sparse_dense_matmul(sp, dense), tf.sparse.sparse_dense_matmul(sp, dense), rtol=1e-6)
    np.testing.assert_allclose(ops.sparse_dense_matmul(sp, tf.transpose(dense), adjoint_b=True),
                               tf.sparse.sparse_dense_matmul(sp, dense), rtol=1e-6)
    params = tf.constant(rng.standard_normal((10, 3)), tf.float32)
    assert bits(ops.gather(params, [[1, 2], [9, 1]])) == bits(tf.gather(params, [[1, 2], [9, 1]]))
    assert bits(ops.gather(params, [2, 0], axis=1)) == bits(tf.gather(params, [2, 0], axis=1))
    images = tf.constant(rng.standard_normal((2, 3, 5, 2)), tf.float32)
    assert bits(ops.resize_nearest_neighbor(images, [6, 10], half_pixel_centers=True)) == \
        bits(tf.image.resize(images, [6, 10], method="nearest"))
    boxes = tf.constant([[0.1, 0.2, 0.8, 0.9], [-0.2, 0.0, 0.5, 1.3]])
    for method in ("bilinear", "nearest"):
        assert bits(ops.crop_and_resize(images, boxes, [0, 1], [4, 3], method=method)) == \
            bits(tf.image.crop_and_resize(images, boxes, [0, 1], [4, 3], method=method))


def _grad_check(fn, *args):
    theoretical, numerical = tf.test.compute_gradient(fn, [tf.constant(a, tf.float64) for a in args])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-5, atol=1e-6)


def test_gradients_agree_with_compute_gradient():
    rng = np.random.default_rng(4)
    ids = tf.constant([0, 2, 2, -1, 1])
    _grad_check(lambda d: ops.unsorted_segment_sum(d, ids, 4), rng.standard_normal((5, 3)))
    _grad_check(lambda d: ops.unsorted_segment_mean(d, ids, 4), rng.standard_normal((5, 3)))
    _grad_check(lambda d: ops.unsorted_segment_sqrt_n(d, ids, 4), rng.standard_normal((5, 3)))
    _grad_check(lambda d: ops.segment_sum(d, [0, 0, 1, 3, 3]), rng.standard_normal((5, 2)))
    _grad_check(lambda d: ops.reduce_sum(d, axis=[0, 2]), rng.standard_normal((2, 3, 4)))
    _grad_check(lambda v, b: ops.bias_add(v, b), rng.standard_normal((3, 4)), rng.standard_normal(4))
    labels = tf.nn.softmax(tf.constant(rng.standard_normal((3, 4))))
    _grad_check(lambda lg: ops.softmax_cross_entropy_with_logits(labels, lg), rng.standard_normal((3, 4)))
    _grad_check(lambda lg: ops.sparse_softmax_cross_entropy_with_logits(tf.constant([1, 0, 3]), lg), rng.standard_normal((3, 4)))
    _grad_check(lambda p: ops.gather(p, [1, 1, 3]), rng.standard_normal((4, 2)))
    sp_indices = tf.constant([[0, 0], [0, 2], [1, 1], [1, 2]], tf.int64)
    _grad_check(lambda v, d: ops.sparse_dense_matmul(tf.SparseTensor(sp_indices, v, [2, 3]), d),
                rng.standard_normal(4), rng.standard_normal((3, 2)))
    _grad_check(lambda im: ops.resize_nearest_neighbor(im, [5, 6], half_pixel_centers=True), rng.standard_normal((1, 3, 4, 2)))
    # crop_and_resize computes in float32 (as TF's kernel): compare with TF's own gradients instead.
    image = tf.constant(rng.standard_normal((1, 5, 5, 2)), tf.float32)
    boxes = tf.constant([[0.13, 0.21, 0.77, 0.86], [0.5, -0.1, 0.2, 0.9]], tf.float32)
    for method in ("bilinear", "nearest"):
        ours = tf.test.compute_gradient(lambda im, bx: ops.crop_and_resize(im, bx, [0, 0], [3, 4], method=method), [image, boxes])[0]
        stock = tf.test.compute_gradient(lambda im, bx: tf.image.crop_and_resize(im, bx, [0, 0], [3, 4], method=method), [image, boxes])[0]
        for a, b in zip(ours, stock):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_gradients_are_bitwise_order_invariant():
    rng = np.random.default_rng(5)
    value = tf.constant(rng.standard_normal((64, 3)) * np.exp2(rng.integers(-20, 20, (64, 1))), tf.float32)
    upstream = tf.constant(rng.standard_normal((64, 3)) * np.exp2(rng.integers(-20, 20, (64, 1))), tf.float32)
    order = rng.permutation(64)

    def bias_grad(rows):
        bias = tf.zeros([3])
        with tf.GradientTape() as tape:
            tape.watch(bias)
            out = ops.bias_add(tf.gather(value, rows), bias)
        return tape.gradient(out, bias, output_gradients=tf.gather(upstream, rows))

    assert bits(bias_grad(np.arange(64))) == bits(bias_grad(order))
    params = tf.Variable(tf.zeros([8, 3]))
    indices = rng.integers(0, 8, 64)

    def table_grad(rows):
        with tf.GradientTape() as tape:
            out = ops.gather(params, indices[rows])
        return tf.convert_to_tensor(tape.gradient(out, params, output_gradients=tf.gather(upstream, rows)))

    assert bits(table_grad(np.arange(64))) == bits(table_grad(order))


def test_ops_work_in_tf_function():
    @tf.function(jit_compile=False)
    def graph(data, ids, logits, labels):
        return (ops.unsorted_segment_sum(data, ids, 3), ops.sparse_softmax_cross_entropy_with_logits(labels, logits),
                ops.reduce_sum(data), ops.bincount(ids))

    data = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    ids = tf.constant([0, 2, 0])
    segment, xent, total, counts = graph(data, ids, tf.zeros([2, 3]), tf.constant([0, 2]))
    assert segment.numpy().tolist() == [[6.0, 8.0], [0.0, 0.0], [3.0, 4.0]]
    assert total.numpy() == 21.0 and counts.numpy().tolist() == [2, 0, 1]
    np.testing.assert_allclose(xent, [math.log(3)] * 2, rtol=1e-6)


def test_sums_over_leading_axes_in_row_blocks_match_the_plain_reduction():
    rng = np.random.default_rng(9)
    for shape, axes in (((1000, 3), [0]), ((5, 100, 7, 2), [0, 1, 2]), ((300, 4), [0])):
        x = tf.constant(rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape)), tf.float32)
        moved = tf.transpose(x, list(range(1, len(shape))) + [0])  # the same sums over trailing axes: no blocks
        plain = ops.reduce_sum(moved, axis=[a - 1 if a else len(shape) - 1 for a in axes])
        assert bits(ops.reduce_sum(x, axis=axes)) == bits(plain)
        np.testing.assert_allclose(ops.reduce_sum(x, axis=axes), np.sum(x.numpy().astype(np.float64), axis=tuple(axes)),
                                   rtol=1e-6)


_ROWS = np.array([[1, 2, 3, 0], [0, 0, 1, 2]], np.int32)
BINCOUNT_CASES = {
    "flat": dict(arr=[1, 1, 2, 3, 2, 4, 4, 5]),
    "int weights": dict(arr=[1, 1, 2, 3, 2, 4, 4, 5], weights=[1, 5, 0, 1, 0, 5, 4, 5]),
    "float weights": dict(arr=[0, 2, 2], weights=[0.5, 0.25, 1.0]),
    "float input is cast to int32": dict(arr=[1.7, 2.2, 0.0]),
    "empty": dict(arr=np.zeros([0], np.int32)),
    "empty with minlength": dict(arr=np.zeros([0], np.int64), minlength=3),
    "rows (axis=-1)": dict(arr=_ROWS, axis=-1),
    "rows, binary": dict(arr=_ROWS, axis=-1, binary_output=True),
    "rows, min and max length (tf_keras CategoryEncoding)": dict(arr=_ROWS, axis=-1, minlength=6, maxlength=6),
    "rows, int64, float weights": dict(arr=_ROWS.astype(np.int64), axis=-1, weights=np.full((2, 4), 0.5, np.float32)),
    "2-D flattened": dict(arr=_ROWS),
    "output dtype": dict(arr=[1, 2, 3], dtype=tf.float32),
    "values past maxlength are ignored": dict(arr=[1, 9, 3], maxlength=4),
    "1-D with axis=-1": dict(arr=[1, 2], axis=-1),
}


def _ragged_and_sparse_cases():
    ragged = tf.ragged.constant([[1, 1], [], [3, 0, 0]])
    sparse = tf.sparse.from_dense(tf.constant([[0, 1, 0], [2, 2, 0]]))  # implicit zeros are not counted
    return {"ragged rows": dict(arr=ragged, axis=-1), "ragged flat": dict(arr=ragged),
            "sparse rows": dict(arr=sparse, axis=-1), "sparse flat": dict(arr=sparse)}


@pytest.mark.parametrize("case", sorted(BINCOUNT_CASES) + ["ragged rows", "ragged flat", "sparse rows", "sparse flat"])
def test_bincount_accepts_what_tf_accepts_with_the_same_result(case):
    kwargs = BINCOUNT_CASES.get(case) or _ragged_and_sparse_cases()[case]
    try:
        expected = tf.math.bincount(**kwargs)
    except (TypeError, ValueError):  # TF 2.12 takes no float lists and no flat ragged or sparse input
        pytest.skip(f"TF {tf.__version__} rejects this input; tfrepro takes it as later TF versions do")
    for result in (ops.bincount(**kwargs), tf.function(lambda: ops.bincount(**kwargs))()):
        assert (result.dtype, result.shape.as_list()) == (expected.dtype, expected.shape.as_list())
        assert result.numpy().tobytes() == expected.numpy().tobytes()


def test_bincount_with_unknown_static_shapes_and_rejects_what_tf_rejects():
    traced = tf.function(lambda x: ops.bincount(x, axis=-1, minlength=5),
                         input_signature=[tf.TensorSpec([None, None], tf.int32)])
    assert traced(_ROWS).numpy().tobytes() == tf.math.bincount(_ROWS, axis=-1, minlength=5).numpy().tobytes()
    for kwargs, error in ((dict(arr=[1, 2], weights=[1.0, 1.0], binary_output=True), ValueError),
                          (dict(arr=[1, 2], axis=1), ValueError),
                          (dict(arr=[1, -1]), tf.errors.InvalidArgumentError)):
        with pytest.raises(error):
            tf.math.bincount(**kwargs)
        with pytest.raises(error):
            ops.bincount(**kwargs)


def test_int64_num_segments_and_ids_work_as_in_tf():
    data, ids = tf.ones([3, 2]), tf.constant([0, 2, 0], tf.int64)
    for op in ("unsorted_segment_mean", "unsorted_segment_sqrt_n", "unsorted_segment_sum"):
        expected = getattr(tf.math, op)(data, ids, np.int64(3))
        assert getattr(ops, op)(data, ids, np.int64(3)).numpy().tobytes() == expected.numpy().tobytes(), op
    sorted_ids = tf.constant([0, 0, 1], tf.int64)
    assert ops.segment_mean(data, sorted_ids).numpy().tobytes() == tf.math.segment_mean(data, sorted_ids).numpy().tobytes()


def test_num_segments_of_unknown_static_shape_traces():
    traced = tf.function(lambda data, ids, n: ops.unsorted_segment_sum(data, ids, n),
                         input_signature=[tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.int32),
                                          tf.TensorSpec(None, tf.int32)])
    data, ids = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), tf.constant([1, 0, 1])
    assert traced(data, ids, tf.constant(2)).numpy().tolist() == [[3.0, 4.0], [6.0, 8.0]]


def test_sparse_dense_matmul_checks_the_inner_dimensions_as_tf_does():
    sp = tf.sparse.from_dense(tf.ones([3, 15]))
    for op in (tf.sparse.sparse_dense_matmul, ops.sparse_dense_matmul):
        with pytest.raises(tf.errors.InvalidArgumentError, match="Cannot multiply A and B"):
            op(sp, tf.ones([10, 4]))


def test_sparse_xent_validates_label_shapes_as_tf_does():
    logits = tf.zeros([2, 3])
    for op in (tf.nn.sparse_softmax_cross_entropy_with_logits, ops.sparse_softmax_cross_entropy_with_logits):
        with pytest.raises(ValueError, match="rank"):  # at the call, from the static shapes
            op(tf.constant([[0], [1]]), logits)
        with pytest.raises(ValueError, match="except for the last dimension"):
            op(tf.constant([0, 1, 2]), logits)
        traced = tf.function(lambda labels, op=op: op(labels, logits), input_signature=[tf.TensorSpec(None, tf.int32)])
        with pytest.raises(tf.errors.InvalidArgumentError):  # when it runs: a scalar label for 2-D logits
            traced(tf.constant(0))
        assert traced(tf.constant([0, 2])).shape == [2]


def test_the_documented_limits_hold_two_roundings_and_ids_dropped_under_xla():
    small = tf.constant([1.0, 2.0**-24, 2.0**-59], tf.float32)
    assert ops.unsorted_segment_sum(small, tf.zeros([3], tf.int32), 1).numpy().tolist() == [1.0]  # not 1.0000001
    assert float(np.float32(1.0) + np.float32(2.0**-24)) == 1.0  # ... where a float32 running sum ends too
    data, ids = tf.constant([1.0, 2.0]), tf.constant([0, 5])
    with pytest.raises(tf.errors.InvalidArgumentError):
        ops.unsorted_segment_sum(data, ids, 2)
    under_xla = tf.function(lambda: ops.unsorted_segment_sum(data, ids, 2), jit_compile=True)()
    stock_under_xla = tf.function(lambda: tf.math.unsorted_segment_sum(data, ids, 2), jit_compile=True)()
    assert under_xla.numpy().tolist() == stock_under_xla.numpy().tolist() == [1.0, 0.0]


def test_sizes_past_int32_products_work_as_in_tf():
    # 8,388,608 segments: a presence table of segments x 256 exponents would hold 2**31 entries.
    segments = 8_388_608
    data = tf.constant(np.arange(1, 11, dtype=np.float32)[:, None])
    ids = tf.constant([segments - 1, 0, 5, segments - 1, 3, 3, 0, 9, segments - 2, 1], tf.int32)
    ours, stock = ops.unsorted_segment_sum(data, ids, segments), tf.math.unsorted_segment_sum(data, ids, segments)
    assert ours.shape == stock.shape == [segments, 1] and bits(ours) == bits(stock)
    counts = ops.bincount(ids)
    assert counts.shape == [segments] and bits(counts) == bits(tf.math.bincount(ids))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"num_segments up to 2\*\*31 - 2"):  # not wrapped around
        ops.unsorted_segment_sum(data, ids, np.int64(2**31 - 1))
    traced = tf.function(lambda n: ops.unsorted_segment_sum(data, ids, n), input_signature=[tf.TensorSpec([], tf.int64)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"up to 2\*\*31 - 2; got 4294967299"):
        traced(tf.constant(2**32 + 3, tf.int64))  # known only when it runs
