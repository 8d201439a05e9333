"""What TensorFlow's own kernel tests (TF 2.21, run against tfrepro: issue #20) found the replaced ops
doing differently from TF's, beyond the input/output cases of ``test_parity``: ragged inputs,
SavedModels that hold gradients of a replaced op, gradients of gradients in a TF1 graph that has
already run, TF's internal names, and float16 accuracy. Each is checked against TF's own op."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

import tfrepro
from tfrepro import _tf

pytestmark = pytest.mark.core  # on the oldest TF too

tf = _tf.import_tf()
from tfrepro import ops  # noqa: E402  (imports TensorFlow)
from tfrepro.ops import _exact_sum, exact, rebinding  # noqa: E402

RAGGED = tf.ragged.constant([[1.5, -2.0], [], [3.0, 4.0, -0.5]])
NESTED = tf.ragged.constant([[[1.0, 2.0], [3.0]], [[4.0, 5.0, 6.0]], [[], [7.0]]])


def _same(got, want):
    """Equal ragged or dense results: structure, dtype and values."""
    assert type(got) is type(want) and got.dtype == want.dtype
    if isinstance(want, tf.RaggedTensor):
        assert got.ragged_rank == want.ragged_rank and got.to_list() == want.to_list()
    else:
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


@pytest.mark.parametrize("params, indices, options", [
    (RAGGED, [2, 0, 2], {}),
    (tf.constant([[1.0, 2.0], [3.0, 4.0]]), tf.ragged.constant([[1, 0], [], [1]]), {}),
    (RAGGED, tf.ragged.constant([[2], [0, 1, 0]]), {}),
    (NESTED, tf.ragged.constant([[1, 0], [0], [1, 1]]), {"axis": 1, "batch_dims": 1}),
    (NESTED, [1, 0], {"axis": 1}),
], ids=["ragged params", "ragged indices", "both ragged", "batch_dims 1", "ragged params, axis 1"])
def test_gather_takes_ragged_params_and_indices_and_its_gradient_sums_repeats_exactly(params, indices, options):
    _same(ops.gather(params, indices, **options), tf.gather(params, indices, **options))
    values = params.flat_values if isinstance(params, tf.RaggedTensor) else params

    def gradient(gather):
        with tf.GradientTape() as tape:
            tape.watch(values)
            source = params.with_flat_values(values) if isinstance(params, tf.RaggedTensor) else values
            out = gather(source, indices, **options)
            flat = out.flat_values if isinstance(out, tf.RaggedTensor) else out
            loss = tf.reduce_sum(flat * flat)
        return tape.gradient(loss, values)

    ours, stock = gradient(ops.gather), gradient(tf.gather)
    np.testing.assert_allclose(tf.convert_to_tensor(ours).numpy(), tf.convert_to_tensor(stock).numpy(), rtol=1e-6)
    if isinstance(ours, tf.IndexedSlices):  # the repeats are summed in tfrepro's gradient, once per row
        rows = ours.indices.numpy()
        assert len(set(rows.tolist())) == len(rows)


def test_embedding_lookup_takes_ragged_ids_and_rejects_ragged_params_as_tf_does():
    table = tf.constant(np.arange(8.0, dtype=np.float32).reshape(4, 2))
    ids = tf.ragged.constant([[3, 0], [], [1, 1, 2]])
    _same(ops.embedding_lookup(table, ids), tf.nn.embedding_lookup(table, ids))
    _same(ops.embedding_lookup(table, ids, max_norm=1.0), tf.nn.embedding_lookup(table, ids, max_norm=1.0))
    errors = []
    for lookup in (tf.nn.embedding_lookup, ops.embedding_lookup):
        with pytest.raises(Exception) as raised:  # a ValueError on TF 2.21, an AttributeError on 2.12
            lookup(RAGGED, [0])
        errors.append(type(raised.value))
    assert errors[0] is errors[1]


@pytest.mark.parametrize("name", ["unsorted_segment_sum", "unsorted_segment_mean", "unsorted_segment_sqrt_n"])
@pytest.mark.parametrize("data, ids", [
    (RAGGED, [1, 0, 1]),
    (NESTED, [0, 0, 1]),
    (RAGGED, tf.ragged.constant([[0, 2], [], [1, 1, 0]])),
], ids=["ragged data", "ragged data, 2 ragged dimensions", "ragged ids"])
def test_unsorted_segment_reductions_take_ragged_data(name, data, ids):
    _same(getattr(ops, name)(data, ids, 3), getattr(tf.math, name)(data, ids, 3))


@pytest.mark.parametrize("axis", [None, 1])
def test_reduce_sum_takes_a_ragged_tensor_as_tfs_does(axis):
    """Keras's ``ops.sum`` of a ragged output (Keras's own layer tests train a ragged Embedding so)
    reaches ``tf.reduce_sum`` with a ``RaggedTensor``: TF's op dispatches it, a segment sum of its
    values, which patch rebinds; it raised a TypeError."""
    x = tf.ragged.constant([[1.0, 2.5, -0.75], [3.0], []], dtype=tf.float32)
    got, want = ops.reduce_sum(x, axis=axis), tf.compat.v1.reduce_sum(x, axis=axis)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def test_ragged_segment_sums_reach_the_order_invariant_sum():
    """Rows [1e30], [-1e30], [1, 5] summed position by position: a float sum in this order gives 1
    at position 0; the exact sum 0 (1 is below the quantum of a segment that holds 1e30)."""
    data = tf.RaggedTensor.from_row_lengths([1e30, -1e30, 1.0, 5.0], [1, 1, 2])
    assert tf.math.unsorted_segment_sum(data, [0, 0, 0], 1).to_list() == [[1.0, 5.0]]  # negative control
    assert ops.unsorted_segment_sum(data, [0, 0, 0], 1).to_list() == [[0.0, 5.0]]


class _Model(tf.Module):
    def __init__(self):
        super().__init__()
        self.table = tf.Variable(np.arange(12.0, dtype=np.float32).reshape(4, 3))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
    def gradients(self, ids):
        with tf.GradientTape() as tape:
            rows = tf.gather(self.table, ids)
            pooled = tf.math.unsorted_segment_sum(tf.nn.bias_add(rows, [1.0, 0.0, -1.0]), ids // 2, 2)
            loss = tf.reduce_sum(pooled * pooled)
        return tf.convert_to_tensor(tape.gradient(loss, self.table))


def test_a_saved_model_holding_gradients_of_replaced_ops_reloads_patched_or_not(tmp_path):
    ids = tf.constant([0, 3, 3, 1, 0])
    with tfrepro.patched(0, ops=True):
        model = _Model()
        expected = model.gradients(ids).numpy()
        tf.saved_model.save(model, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))  # stock TF reloads it: so must tfrepro's
    assert loaded.gradients(ids).numpy().tobytes() == expected.tobytes()
    with tfrepro.patched(0, ops=True):
        assert tf.saved_model.load(str(tmp_path)).gradients(ids).numpy().tobytes() == expected.tobytes()


def test_gradients_of_gradients_build_in_a_tf1_graph_after_it_has_run():
    """TF's fused batch norm test computes second-order gradients one at a time in one Session. A
    traced kernel's gradient needs the kernel's call rewritten to return more outputs, which a
    graph that a Session has run can no longer have: tfrepro's kernels are never differentiated."""
    from tensorflow.python.ops import gradient_checker

    rng = np.random.default_rng(0)
    shape = [2, 3, 2, 2]
    with tf.Graph().as_default(), tf.compat.v1.Session():
        x, upstream = (tf.constant(rng.random(shape).astype(np.float32)) for _ in range(2))
        scale, offset = (tf.constant(rng.random(2).astype(np.float32)) for _ in range(2))
        y, _, _ = ops.fused_batch_norm(x, scale, offset, rng.random(2).astype(np.float32),
                                       rng.random(2).astype(np.float32), is_training=False)
        d_x, d_scale, _ = tf.compat.v1.gradients(y, [x, scale, offset], upstream)
        errors = [gradient_checker.compute_gradient_error(upstream, shape, d_x, shape),  # runs the graph
                  gradient_checker.compute_gradient_error(upstream, shape, d_scale, [2]),
                  gradient_checker.compute_gradient_error(x, shape, d_scale, [2]),
                  gradient_checker.compute_gradient_error(scale, [2], d_x, shape)]
        assert max(errors) < 1e-3, errors
        data = tf.constant(rng.random((5, 2)).astype(np.float32))
        summed = ops.unsorted_segment_sum(data * data, [0, 1, 0, 1, 1], 2)
        (first,) = tf.compat.v1.gradients(summed, data)
        assert gradient_checker.compute_gradient_error(data, [5, 2], first, [5, 2]) < 1e-2


def test_a_huge_num_segments_raises_invalid_argument_when_the_op_runs():
    """TF raises when the op runs, also for a num_segments known when traced (InvalidArgumentError on
    TF 2.21; ResourceExhaustedError on 2.12, after a 15 s allocation, so not checked there);
    tfrepro's InvalidArgumentError says what it supports."""
    def op(sum_):
        return tf.function(lambda: sum_(tf.ones([2]), [0, 1], 2**40), autograph=False)

    stock = [(tf.math.unsorted_segment_sum, tf.errors.OpError)] if _tf.parse_version(tf.__version__) >= (2, 13) else []
    for sum_, error in (*stock,  # TF 2.12's kernel takes 15 s to fail its allocation: CI's c leg leaves it out
                        (ops.unsorted_segment_sum, tf.errors.InvalidArgumentError),
                        (ops.unsorted_segment_mean, tf.errors.InvalidArgumentError)):
        traced = op(sum_)
        traced.get_concrete_function()  # builds: the error comes when it runs
        with pytest.raises(error):
            traced()
        with pytest.raises(error):
            sum_(tf.ones([2]), [0, 1], 2**40)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_segments up to 2"):
        ops.unsorted_segment_sum(tf.ones([2]), [0, 1], 2**40)


@pytest.mark.parametrize("summation", ["exact", "tf"])
def test_sparse_dense_matmul_of_float16_accumulates_in_float32(summation):
    """Within one float16 rounding of the exact product (TF's own kernel, on a GPU too, sums in float32)."""
    rng = np.random.default_rng(3)
    dense_a = (rng.random((10, 40)) < 0.6) * rng.standard_normal((10, 40))
    b = rng.standard_normal((40, 20)).astype(np.float16)
    sparse = tf.sparse.from_dense(tf.constant(dense_a.astype(np.float16)))
    exact = dense_a.astype(np.float16).astype(np.float64) @ b.astype(np.float64)
    with _exact_sum.summing(summation):
        ours = ops.sparse_dense_matmul(sparse, b).numpy()
    assert ours.dtype == np.float16
    assert np.all(np.abs(ours.astype(np.float64) - exact) <= np.spacing(np.abs(exact).astype(np.float16)))


def _spied(monkeypatch, names):
    calls = {name: 0 for name in names}
    for name in names:
        replacement, targets = rebinding.TABLE[name]

        def spy(*args, _name=name, _replacement=replacement, **kwargs):
            calls[_name] += 1
            return _replacement(*args, **kwargs)

        monkeypatch.setitem(rebinding.TABLE, name, (spy, targets))
    return calls


def test_tf_internal_names_are_rebound_and_tf_code_calling_them_reaches_tfrepro(monkeypatch):
    from tensorflow.python.ops import array_ops, math_ops, nn_impl

    calls = _spied(monkeypatch, ["segment_sum", "segment_mean", "fused_batch_norm"])
    stock_gather = array_ops.gather
    x = tf.ones([1, 2, 2, 3])
    with tfrepro.patched(0, ops=True):
        ids = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64))
        weights = tf.SparseTensor(ids.indices, tf.ones_like(ids.values, tf.float32), ids.dense_shape)
        tf.nn.embedding_lookup_sparse(tf.ones([4, 2]), ids, weights, combiner="sum")  # math_ops.segment_sum
        math_ops.segment_mean(tf.ones([3, 2]), [0, 0, 1])
        nn_impl.fused_batch_norm(x, tf.ones([3]), tf.zeros([3]), tf.zeros([3]), tf.ones([3]), is_training=False)
        assert array_ops.gather is stock_gather  # not rebound: TF's own code gathers shapes with it (README)
    assert all(calls.values()), calls


_REBOUND = re.compile(r"tf\.(?:compat\.v[12]\.)?(?:" + "|".join(sorted({
    re.escape(re.sub(r"^tf\.(compat\.v[12]\.)?", "", target))
    for targets in [targets for _, targets in rebinding.TABLE.values()] + [targets for _, _, targets in exact._BINDINGS.values()]
    for target in targets if target.startswith("tf.")})) + ")")


def test_tfrepro_ops_call_no_public_name_that_patch_rebinds():
    """Inside tfrepro's ops, ``tf.gather`` and the like would be tfrepro's own op once patched: a
    check's message that gathered with it put a custom gradient in the check, which made a cycle of
    functions that a SavedModel cannot load. TF's ops are taken from ``_stock``, captured first."""
    found = []
    for path in [*Path(ops.__file__).parent.glob("*.py"), *Path(ops.__file__).parent.glob("exact/*.py")]:
        if path.name == "_stock.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                if _REBOUND.fullmatch(called):
                    found.append(f"{path.name}:{node.lineno}: {called}")
    assert not found, found
