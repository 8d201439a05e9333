"""What an op instance costs a graph: tfrepro's kernels (loops, conditions) are functions stored once
and called per instance, so a second instance adds a few call nodes, like TF's own op, and no new
function (before, each instance inlined about 1,150 nodes: a TF1 Session grew 50 MB per new fetch)."""

import numpy as np
import pytest

from tfrepro import _tf

pytestmark = pytest.mark.core

tf = _tf.import_tf()
from tfrepro import ops  # noqa: E402  (imports TensorFlow)
from tfrepro.ops import _exact_sum  # noqa: E402

DATA = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
IDS = np.array([0, 2, 0, 1, 2, 1], np.int32)
OPS = {
    "unsorted_segment_sum": lambda d: ops.unsorted_segment_sum(d, IDS, 3),
    "segment_mean": lambda d: ops.segment_mean(d, np.sort(IDS)),
    "bias_add": lambda d: ops.bias_add(d, tf.ones([4])),
    "sparse_softmax_cross_entropy_with_logits": lambda d: ops.sparse_softmax_cross_entropy_with_logits(IDS, d),
    "gather": lambda d: ops.gather(d, IDS),
}


def _added_by_each_instance(op, instances=3, gradient=True):
    """(nodes, library functions) that each instance of ``op`` (and its gradient) adds to a graph."""
    graph = tf.Graph()
    sizes = []
    with graph.as_default():
        for _ in range(instances):
            data = tf.constant(DATA)
            out = op(data)
            if gradient:
                tf.gradients(out, data)
            definition = graph.as_graph_def()
            sizes.append((len(definition.node) + sum(len(f.node_def) for f in definition.library.function),
                          len(definition.library.function)))
    return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(sizes, sizes[1:])]


@pytest.mark.parametrize("name", OPS)
def test_each_op_instance_adds_a_few_nodes_and_no_function(name):
    for nodes, functions in _added_by_each_instance(OPS[name]):
        assert functions == 0 and nodes <= 80, (nodes, functions)


def test_inlined_kernels_cost_hundreds_of_nodes_per_instance_negative_control():
    """The same exact sum with its kernel's body built into the graph at each call (as before)."""
    def inlined(data):
        return _exact_sum.segment_sum_2d(data, tf.constant(IDS), tf.constant(3), _exact_sum.current_plan())

    assert all(nodes > 500 and functions > 0 for nodes, functions in _added_by_each_instance(inlined, gradient=False))


def test_a_trace_is_kept_apart_per_context_and_keeps_the_device_scope():
    """A kernel traced outside XLA is not reused under XLA (TF's own cache would), and the call of a
    shared trace runs on the device its scope names."""
    images = tf.constant(np.random.default_rng(1).standard_normal((1, 4, 5, 2)), tf.float32)

    def backprop(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = ops.resize_nearest_neighbor(x, [8, 10])
        return tape.gradient(y, x)

    plain = tf.function(backprop, autograph=False)(images)
    compiled = tf.function(backprop, autograph=False, jit_compile=True)(images)  # compiles: no string ops inside
    assert np.array_equal(plain.numpy(), compiled.numpy())
    graph = tf.Graph()
    with graph.as_default(), tf.device("/cpu:0"):
        ops.unsorted_segment_sum(tf.constant(DATA), IDS, 3)
    calls = [op for op in graph.get_operations() if op.type in ("PartitionedCall", "StatefulPartitionedCall")]
    assert calls and {op.device for op in calls} == {"/device:CPU:0"}
