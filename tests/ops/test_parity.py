"""Every op in tfrepro.ops against TensorFlow's own, on the same inputs, good and bad: the same
shapes, dtypes and values (within TF's own test tolerances), the same error classes, and for
run-time errors the same message, raised where TF raises it (at the call, at trace time, or when
the op runs). Each case runs eagerly, in a ``tf.function``, in a ``tf.function`` whose arguments
have unknown static shapes, and in a TF1 ``tf.Graph`` run by a ``Session``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from tfrepro import _tf

pytestmark = pytest.mark.core  # on the oldest TF too

tf = _tf.import_tf()
from tfrepro import ops  # noqa: E402  (imports TensorFlow)
from tfrepro.ops.selection import REPLACEABLE_OPS  # noqa: E402


def _bias_grads(bias_add):
    def run(value, bias, data_format=None):
        with tf.GradientTape() as tape:
            tape.watch([value, bias])
            out = bias_add(value, bias, data_format=data_format)
            loss = tf.reduce_sum(out * out)
        return out, tape.gradient(loss, [value, bias])
    return run


def _gather_grads(gather):
    def run(params, indices, **kwargs):
        with tf.GradientTape() as tape:
            tape.watch(params)
            out = gather(params, indices, **kwargs)
            loss = tf.reduce_sum(out * out)
        return out, tf.convert_to_tensor(tape.gradient(loss, params))
    return run


def _image_grads(op):
    def run(*inputs, **kwargs):
        floats = [t for t in inputs if tf.is_tensor(t) and t.dtype.is_floating]
        with tf.GradientTape() as tape:
            tape.watch(floats)
            out = op(*inputs, **kwargs)
            loss = tf.reduce_sum(out * out)
        return out, tape.gradient(loss, floats)
    return run


def _xent_grads(op):
    def run(labels, logits):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            out = op(labels=labels, logits=logits)
        return out, tape.gradient(out, logits)
    return run


def _sparse_matmul(op):
    def run(indices, values, *shape_and_b, dense_shape=None, **kwargs):
        """``dense_shape`` as an option is a constant where the op is built (its shape function sees it)."""
        *given, b = shape_and_b
        return op(tf.SparseTensor(indices, values, given[0] if given else dense_shape), b, **kwargs)
    return run


def _batch_norm_grads(op):
    def run(x, scale, offset, mean, variance, **kwargs):
        tensors = [t for t in (x, scale, offset, mean, variance) if tf.is_tensor(t)]  # not the NumPy ones
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            outputs = op(x, scale, offset, mean, variance, **kwargs)
            loss = tf.reduce_sum(tf.cast(outputs[0], tf.float32) ** 2)
        gradients = tape.gradient(loss, tensors)
        return outputs, [tf.constant("none") if g is None else g for g in gradients]  # which ones are None counts too
    return run


def _resize(images, size, **kwargs):
    return tf.raw_ops.ResizeNearestNeighbor(images=images, size=size, **kwargs)


# op name -> (TensorFlow's, tfrepro's), each taking tensors first, then keyword options.
PAIRS: dict[str, tuple[Callable, Callable]] = {
    "unsorted_segment_sum": (tf.math.unsorted_segment_sum, ops.unsorted_segment_sum),
    "unsorted_segment_mean": (tf.math.unsorted_segment_mean, ops.unsorted_segment_mean),
    "unsorted_segment_sqrt_n": (tf.math.unsorted_segment_sqrt_n, ops.unsorted_segment_sqrt_n),
    "segment_sum": (tf.math.segment_sum, ops.segment_sum),
    "segment_mean": (tf.math.segment_mean, ops.segment_mean),
    "reduce_sum": (tf.reduce_sum, ops.reduce_sum),
    "bias_add": (_bias_grads(tf.nn.bias_add), _bias_grads(ops.bias_add)),
    "softmax_cross_entropy_with_logits": (_xent_grads(tf.nn.softmax_cross_entropy_with_logits),
                                          _xent_grads(ops.softmax_cross_entropy_with_logits)),
    "sparse_softmax_cross_entropy_with_logits": (_xent_grads(tf.nn.sparse_softmax_cross_entropy_with_logits),
                                                 _xent_grads(ops.sparse_softmax_cross_entropy_with_logits)),
    "bincount": (tf.math.bincount, ops.bincount),
    "sparse_dense_matmul": (_sparse_matmul(tf.sparse.sparse_dense_matmul), _sparse_matmul(ops.sparse_dense_matmul)),
    "gather": (_gather_grads(tf.gather), _gather_grads(ops.gather)),
    "embedding_lookup": (_gather_grads(tf.nn.embedding_lookup), _gather_grads(ops.embedding_lookup)),
    "resize_nearest_neighbor": (_image_grads(_resize), _image_grads(ops.resize_nearest_neighbor)),
    "crop_and_resize": (_image_grads(tf.image.crop_and_resize), _image_grads(ops.crop_and_resize)),
    "fused_batch_norm": (_batch_norm_grads(tf.compat.v1.nn.fused_batch_norm), _batch_norm_grads(ops.fused_batch_norm)),
    "adjust_contrast": (tf.image.adjust_contrast, ops.adjust_contrast),
}


@dataclass(frozen=True)
class Case:
    op: str
    what: str
    inputs: tuple
    options: tuple = ()  # keyword options, as (name, value) pairs
    raw: tuple = ()  # positions of inputs passed as they are (NumPy, Python lists), not as tensors

    def __str__(self) -> str:
        return f"{self.op}: {self.what}"


_rng = np.random.default_rng(0)
F = _rng.standard_normal((6, 3)).astype(np.float32)
IMAGES = _rng.standard_normal((2, 5, 6, 3)).astype(np.float32)
BOXES = np.array([[0.1, 0.2, 0.8, 0.9], [0.5, 0.0, 1.0, 0.4], [-0.2, 0.3, 1.2, 0.7]], np.float32)
LOGITS = _rng.standard_normal((4, 5)).astype(np.float32)
STATS = tuple(np.array(v, np.float32) for v in ([1.5, 0.5, -1.0], [0.1, 0.0, -0.2], [0.3, -0.1, 0.2], [1.0, 2.0, 0.5]))
SPARSE = (np.array([[0, 1], [0, 4], [2, 0], [2, 2]], np.int64), np.array([1.5, -2.0, 0.25, 3.0], np.float32))

CASES = [
    Case("unsorted_segment_sum", "float32, negative ids dropped", (F, np.array([0, 2, -1, 1, 2, 0], np.int32), np.int32(4))),
    Case("unsorted_segment_sum", "2-D ids, float64", (F.astype(np.float64).reshape(2, 3, 3), np.array([[0, 1, 1], [2, 0, 1]]), np.int32(3))),
    Case("unsorted_segment_sum", "int64 ids and num_segments", (F, np.array([0, 2, 0, 1, 2, 1], np.int64), np.int64(3))),
    Case("unsorted_segment_sum", "int32 data", (np.arange(12, dtype=np.int32).reshape(6, 2), np.array([1, 0, 1, 1, 0, 0], np.int32), np.int32(2))),
    Case("unsorted_segment_sum", "empty data", (np.zeros((0, 3), np.float32), np.zeros([0], np.int32), np.int32(2))),
    Case("unsorted_segment_sum", "an id >= num_segments", (F, np.array([0, 1, 5, 1, 7, 0], np.int32), np.int32(3))),
    Case("unsorted_segment_sum", "2-D ids, an id >= num_segments", (F.reshape(2, 3, 3), np.array([[0, 1, 1], [2, 9, 1]]), np.int32(3))),
    Case("unsorted_segment_sum", "ids not a prefix of data's shape", (F, np.array([0, 1, 1], np.int32), np.int32(2))),
    Case("unsorted_segment_mean", "int64 num_segments", (F, np.array([0, 2, 0, 1, 2, 1], np.int32), np.int64(4))),
    Case("unsorted_segment_mean", "an id >= num_segments", (F, np.array([0, 2, 0, 3, 2, 1], np.int32), np.int32(3))),
    Case("unsorted_segment_sqrt_n", "float64", (F.astype(np.float64), np.array([0, 2, 0, -1, 2, 1], np.int32), np.int32(3))),
    Case("segment_sum", "sorted ids with a gap", (F, np.array([0, 0, 2, 2, 3, 3], np.int32))),
    Case("segment_sum", "int64 ids", (F, np.array([0, 0, 1, 1, 1, 4], np.int64))),
    Case("segment_sum", "ids not increasing", (F, np.array([0, 2, 1, 2, 2, 3], np.int32))),
    Case("segment_sum", "a negative last id", (F, np.array([0, 0, 0, 0, 0, -1], np.int32))),
    Case("segment_sum", "a negative first id", (F, np.array([-1, 0, 0, 1, 1, 1], np.int32))),
    Case("segment_sum", "an id too large, then a smaller one", (F, np.array([0, 5, 1, 1, 1, 1], np.int32))),
    Case("segment_sum", "too few ids", (F, np.array([0, 0, 1], np.int32))),
    Case("segment_mean", "sorted ids", (F, np.array([0, 1, 1, 1, 3, 3], np.int32))),
    Case("segment_mean", "ids not increasing", (F, np.array([1, 0, 1, 1, 2, 3], np.int32))),
    Case("reduce_sum", "all axes", (F,)),
    Case("reduce_sum", "axis 0, keepdims", (F,), (("axis", 0), ("keepdims", True))),
    Case("reduce_sum", "negative axis, float16", (F.astype(np.float16),), (("axis", -1),)),
    Case("reduce_sum", "axis out of range", (F,), (("axis", 2),)),
    Case("bias_add", "NHWC", (IMAGES, np.array([0.5, -1.0, 2.0], np.float32))),
    Case("bias_add", "NCHW", (IMAGES.transpose(0, 3, 1, 2), np.array([0.5, -1.0, 2.0], np.float32)), (("data_format", "NCHW"),)),
    Case("bias_add", "bias of the wrong size", (F, np.ones([4], np.float32))),
    Case("bias_add", "bias not 1-D", (F, np.ones([1, 3], np.float32))),
    Case("softmax_cross_entropy_with_logits", "soft labels", (np.abs(LOGITS) / np.abs(LOGITS).sum(1, keepdims=True), LOGITS)),
    Case("softmax_cross_entropy_with_logits", "labels of another shape", (np.ones((4, 4), np.float32), LOGITS)),
    Case("sparse_softmax_cross_entropy_with_logits", "int32 labels", (np.array([0, 4, 2, 2], np.int32), LOGITS)),
    Case("sparse_softmax_cross_entropy_with_logits", "int64 labels, 3-D logits", (np.array([[0, 4], [1, 3]], np.int64), LOGITS.reshape(2, 2, 5))),
    Case("sparse_softmax_cross_entropy_with_logits", "a label >= classes", (np.array([0, 5, 2, 7], np.int32), LOGITS)),
    Case("sparse_softmax_cross_entropy_with_logits", "a negative label", (np.array([0, 1, -1, 2], np.int32), LOGITS)),
    Case("sparse_softmax_cross_entropy_with_logits", "labels of another length", (np.array([0, 1, 2], np.int32), LOGITS)),
    Case("sparse_softmax_cross_entropy_with_logits", "2-D labels for 2-D logits", (np.array([[0], [1], [2], [3]], np.int32), LOGITS)),
    Case("bincount", "1-D", (np.array([1, 1, 4, 0, 2], np.int32),)),
    Case("bincount", "weights and minlength", (np.array([1, 1, 4, 0, 2], np.int32), np.arange(5, dtype=np.float32)), (("minlength", 7),)),
    Case("bincount", "2-D per row, binary", (np.array([[1, 1, 3], [0, 2, 2]], np.int32),), (("axis", -1), ("binary_output", True))),
    Case("bincount", "maxlength", (np.array([1, 1, 4, 0, 2], np.int32),), (("maxlength", 3),)),
    Case("bincount", "a negative value", (np.array([1, -2, 3], np.int32),)),
    Case("sparse_dense_matmul", "A x B", (*SPARSE, np.array([3, 5], np.int64), _rng.standard_normal((5, 2)).astype(np.float32))),
    Case("sparse_dense_matmul", "A' x B'", (*SPARSE, np.array([3, 5], np.int64), _rng.standard_normal((2, 3)).astype(np.float32)),
         (("adjoint_a", True), ("adjoint_b", True))),
    Case("sparse_dense_matmul", "inner dimensions differ", (*SPARSE, np.array([3, 5], np.int64), np.ones((4, 2), np.float32))),
    Case("sparse_dense_matmul", "a row index out of range", (np.array([[0, 1], [3, 0]], np.int64), SPARSE[1][:2],
                                                              np.array([3, 5], np.int64), np.ones((5, 2), np.float32))),
    Case("sparse_dense_matmul", "A': a negative inner index", (np.array([[0, 1], [-1, 0]], np.int64), SPARSE[1][:2],
                                                              np.array([3, 5], np.int64), np.ones((3, 2), np.float32)),
         (("adjoint_a", True),)),
    Case("reduce_sum", "no axes", (F,), (("axis", []),)),
    Case("gather", "repeated indices", (F, np.array([[0, 5], [5, 1]], np.int32))),
    Case("gather", "axis 1", (F, np.array([2, 0, 2], np.int64)), (("axis", 1),)),
    Case("gather", "an index out of range", (F, np.array([0, 9], np.int32))),
    Case("embedding_lookup", "repeated ids", (F, np.array([3, 3, 0, 1], np.int32))),
    Case("resize_nearest_neighbor", "x2, half-pixel centres", (IMAGES, np.array([10, 12], np.int32)), (("half_pixel_centers", True),)),
    Case("resize_nearest_neighbor", "down, aligned corners", (IMAGES, np.array([3, 4], np.int32)), (("align_corners", True),)),
    Case("resize_nearest_neighbor", "not 4-D", (IMAGES[0], np.array([3, 4], np.int32))),
    Case("crop_and_resize", "bilinear, boxes beyond the image", (IMAGES, BOXES, np.array([0, 1, 1], np.int32), np.array([4, 3], np.int32))),
    Case("crop_and_resize", "nearest, a 1x1 crop", (IMAGES, BOXES, np.array([1, 0, 1], np.int32), np.array([1, 1], np.int32)),
         (("method", "nearest"),)),
    Case("crop_and_resize", "a box index out of range", (IMAGES, BOXES, np.array([0, 2, 1], np.int32), np.array([2, 2], np.int32))),
    Case("fused_batch_norm", "fine-tuning (is_training=False)", (IMAGES, *STATS), (("is_training", False),)),
    Case("fused_batch_norm", "fine-tuning, float16 input", (IMAGES.astype(np.float16), *STATS), (("is_training", False),)),
    Case("fused_batch_norm", "fine-tuning, epsilon", (IMAGES, *STATS), (("is_training", False), ("epsilon", 0.1))),
    Case("fused_batch_norm", "training: TF's op as it is", (IMAGES, *STATS[:2]), (("is_training", True),)),
    Case("fused_batch_norm", "a scale of the wrong size", (IMAGES, np.ones([4], np.float32), *STATS[1:]),
         (("is_training", False),)),
    Case("adjust_contrast", "float images", (IMAGES, np.float32(1.7))),
    Case("adjust_contrast", "one uint8 image", ((np.abs(IMAGES[0]) * 60).astype(np.uint8), np.float32(0.4))),
    Case("adjust_contrast", "not 3-D", (F, np.float32(2.0))),
    Case("fused_batch_norm", "fine-tuning, NCHW", (IMAGES.transpose(0, 3, 1, 2), *STATS),
         (("is_training", False), ("data_format", "NCHW"))),
    Case("fused_batch_norm", "fine-tuning, 5-D NDHWC", (IMAGES[:, None], *STATS),
         (("is_training", False), ("data_format", "NDHWC"))),
    # From TF's own kernel tests (issue #20): what TF takes, and the errors it raises where it raises them.
    Case("gather", "an axis beyond the rank", (np.array([1.0, 2.0], np.float32), np.array([0], np.int32)), (("axis", 2),)),
    Case("gather", "axis -2 of a 2-D tensor", (F, np.array([1, 1, 4], np.int32)), (("axis", -2),)),
    Case("gather", "axis 1, batch_dims None, Python indices", (F, [2, 0, 2]), (("axis", 1), ("batch_dims", None)), raw=(1,)),
    Case("adjust_contrast", "a factor that is not a scalar", (IMAGES, np.array([1.5, 2.0], np.float32))),
    Case("sparse_dense_matmul", "inner dimensions differ, the shape known where built",
         (*SPARSE, np.ones((4, 2), np.float32)), (("dense_shape", (3, 5)),)),
    Case("sparse_dense_matmul", "float16", (*SPARSE[:1], SPARSE[1].astype(np.float16), np.array([3, 5], np.int64),
                                            _rng.standard_normal((5, 2)).astype(np.float16))),
    Case("crop_and_resize", "a box beyond float32's range, given as a list", (np.zeros((2, 1, 1, 1), np.float32),
         [[1.0e40, 0.0, 0.0, 0.0]], np.array([1], np.int32), np.array([1, 1], np.int32)), raw=(1,)),
    Case("crop_and_resize", "float64 boxes", (IMAGES, BOXES.astype(np.float64), np.array([0, 1, 1], np.int32),
                                              np.array([2, 2], np.int32))),
    Case("sparse_softmax_cross_entropy_with_logits", "scalar logits", (np.int32(0), np.float32(1.0))),
    Case("segment_mean", "rank-0 data", (np.float32(1.0), np.array([0], np.int32))),
    Case("segment_sum", "2-D ids", (F, np.array([[0, 0, 1], [1, 2, 2]], np.int32))),
    Case("segment_sum", "no ids, no rows", (np.zeros((0, 3), np.float32), np.zeros([0], np.int32))),
    Case("fused_batch_norm", "fine-tuning, float64 NumPy statistics", (IMAGES, *STATS[:2], STATS[2].astype(np.float64),
         STATS[3].astype(np.float64)), (("is_training", False),), raw=(3, 4)),
]

MODES = ("eager", "function", "unknown_shapes")
# In a TF1 graph run by a Session (``tf1_session``): the first case of each op, and these, which reach
# each run-time check (tensors compare by identity with ``==`` there, so checks must use tf.equal).
TF1_CASES = {"unsorted_segment_sum: an id >= num_segments", "segment_sum: a negative first id",
             "segment_sum: an id too large, then a smaller one", "segment_sum: no ids, no rows",
             "reduce_sum: axis out of range", "softmax_cross_entropy_with_logits: labels of another shape",
             "sparse_softmax_cross_entropy_with_logits: a label >= classes", "bincount: a negative value",
             "sparse_dense_matmul: a row index out of range", "adjust_contrast: not 3-D"}
def _run(fn: Callable, case: Case, mode: str):
    """``fn(*inputs, **options)`` in ``mode``: its result as NumPy arrays, or the exception it raised."""
    options = dict(case.options)
    raw = {i: x for i, x in enumerate(case.inputs) if i in case.raw}

    def call(*tensors):
        given = iter(tensors)
        return fn(*(raw[i] if i in raw else next(given) for i in range(len(case.inputs))), **options)

    try:
        if mode == "tf1_session":
            with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
                result = call(*[tf.constant(x) for i, x in enumerate(case.inputs) if i not in raw])
                return tf.nest.map_structure(np.asarray, session.run(result))
        tensors = [tf.constant(x) for i, x in enumerate(case.inputs) if i not in raw]
        if mode == "eager":
            result = call(*tensors)
        else:
            signature = [tf.TensorSpec(None if mode == "unknown_shapes" else t.shape, t.dtype) for t in tensors]
            result = tf.function(call, input_signature=signature, autograph=False)(*tensors)
        return tf.nest.map_structure(lambda t: np.asarray(t), result)
    except (tf.errors.OpError, ValueError, TypeError) as error:
        return error


def _core(message: str) -> str:
    """A run-time error's message without what frames it: TF's function-node prefix, op suffix,
    graph node trace, a Session's report around it, and the ``assertion failed: [...]`` of an
    Assert op. An Assert escapes quotes; tfrepro's messages must reach the user unescaped."""
    lines = message.strip().splitlines()
    framed = [i for i, line in enumerate(lines) if line.startswith("\t [[")]
    line = lines[framed[0] - 1] if lines[0].startswith("Graph execution error") and framed else lines[0]
    asserted = re.search(r"assertion failed: \[(.*)\]", line)
    if asserted:
        return asserted.group(1)
    line = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line)
    return re.sub(r"\s*\[Op:\w+\]( name:.*)?$", "", line)


# TF's Python-level asserts name the graph tensors they compared; such messages cannot be matched.
_NAMES_GRAPH_TENSORS = re.compile(r"\(\S+:\d+\) = ")


def _tolerance(dtype: np.dtype) -> dict:
    return {np.float16: dict(rtol=1e-3, atol=1e-3), np.float64: dict(rtol=1e-12, atol=1e-12)}.get(
        dtype.type, dict(rtol=1e-5, atol=1e-6))


# With shapes unknown, TF's run-time shape check and a StridedSlice of its own race to fail on these
# cases, so TF itself (2.12 and 2.21 alike) raises either message from one run to the next.
_TF_RACING_MESSAGES = {
    "gather: an axis beyond the rank": {"Shape must be at least rank 3 but is rank 1",
                                        "slice index 2 of dimension 0 out of bounds."},
    "sparse_softmax_cross_entropy_with_logits: scalar logits": {"Shape must be at least rank 1 but is rank 0",
                                                                "slice index -1 of dimension 0 out of bounds."},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_tfrepro_op_matches_tensorflow(case: Case, mode: str):
    reference, ours = PAIRS[case.op]
    expected, got = _run(reference, case, mode), _run(ours, case, mode)
    if isinstance(expected, Exception):
        assert type(got) is type(expected), f"TF raised {type(expected).__name__}: {expected}; tfrepro gave {got!r}"
        if isinstance(expected, tf.errors.OpError) and not _NAMES_GRAPH_TENSORS.search(str(expected)):
            messages = {_core(str(got)), _core(str(expected))}
            assert len(messages) == 1 or messages <= _TF_RACING_MESSAGES.get(str(case), set()), messages
        return
    assert not isinstance(got, Exception), f"TF gave a result; tfrepro raised {got!r}"
    for want, have in zip(tf.nest.flatten(expected), tf.nest.flatten(got), strict=True):
        assert have.dtype == want.dtype and have.shape == want.shape, (have.dtype, have.shape, want.dtype, want.shape)
        if want.dtype.kind in "SUO":  # a marker, such as which gradients are None
            assert np.array_equal(have, want), (have, want)
        else:
            np.testing.assert_allclose(have, want, **_tolerance(want.dtype))


@pytest.mark.parametrize("case", [case for i, case in enumerate(CASES) if str(case) in TF1_CASES
                                  or case.op not in {c.op for c in CASES[:i]}], ids=str)
def test_in_a_tf1_graph_run_by_a_session(case: Case):
    test_tfrepro_op_matches_tensorflow(case, "tf1_session")


AUTO_OPS = ("bincount", "sparse_dense_matmul", "resize_nearest_neighbor", "crop_and_resize", "fused_batch_norm",
            "adjust_contrast")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", [case for case in CASES if case.op in AUTO_OPS], ids=str)
def test_with_tf_sums_as_patch_ops_auto_replaces_them(case: Case, mode: str):
    """``patch(ops="auto")``'s versions (TF's own sums, deterministic under op determinism) keep the parity."""
    from tfrepro.ops._exact_sum import summing

    with summing("tf"):
        test_tfrepro_op_matches_tensorflow(case, mode)


def test_every_op_has_parity_cases_good_and_bad():
    assert {case.op for case in CASES} == set(PAIRS) == set(REPLACEABLE_OPS) | {"reduce_sum"}
    rejected = {case.op for case in CASES if isinstance(_run(PAIRS[case.op][0], case, "eager"), Exception)}
    assert rejected == set(PAIRS) - {"unsorted_segment_sqrt_n", "embedding_lookup"}
    from tfrepro.ops.selection import auto_ops

    assert set(auto_ops()) <= set(AUTO_OPS)


@pytest.mark.parametrize("ids, expected", [
    ([0, 0, 0, -1], "segment ids must be >= 0"),
    ([0, 2, 1, -1], "segment ids must be >= 0"),
    ([0, 2, 1, 3], "segment ids are not increasing"),
])
def test_a_bad_sorted_id_gives_one_stable_message(ids, expected):
    messages = set()
    for _ in range(5):
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            tf.function(ops.segment_sum, autograph=False)(tf.ones([4, 2]), tf.constant(ids))
        messages.add(_core(str(raised.value)))
    assert messages == {expected}
