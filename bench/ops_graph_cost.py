"""What each tfrepro.ops op costs a graph, and TF's gradient checker, against TensorFlow's op.

For each op, on small inputs (the sizes of TF's own kernel tests), side by side in one run:

- nodes per instance: the graph and function-library nodes that a second instance of the op and
  its gradient (``tf.gradients``) adds to a ``tf.Graph`` (the first instance's one-time library,
  in brackets, is where tfrepro's loops and conditions live: stored once, called per instance);
- the gradient checker: ``tf.test.compute_gradient`` in eager mode, the first call (which traces
  tfrepro's kernels) and the median of the next --reps;
- with --session: the memory a TF1-style ``Session`` gains per new fetch of a new op instance,
  40 instances, in fresh processes.

Not a test: the figures are printed only.

    python bench/ops_graph_cost.py [--reps 5] [--session]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

SESSION_INSTANCES = 40


def cases(tf, ops):
    """(name, TF's op, tfrepro's op, float inputs to differentiate) with the other inputs bound."""
    rng = np.random.default_rng(0)
    data = rng.standard_normal((6, 4)).astype(np.float32)
    ids = np.array([0, 2, 0, 1, 2, 1], np.int32)
    sorted_ids = np.array([0, 0, 1, 1, 1, 2], np.int32)
    images = rng.standard_normal((1, 4, 5, 2)).astype(np.float32)
    logits = rng.standard_normal((3, 5)).astype(np.float32)
    labels = np.array([0, 4, 2], np.int32)

    def sparse():  # built in the graph that uses it
        return tf.SparseTensor([[0, 1], [1, 3], [2, 0]], [1.5, -2.0, 0.5], [3, 4])

    boxes = np.array([[0.1, 0.2, 0.8, 0.9], [0.0, 0.0, 1.0, 1.0]], np.float32)

    def pair(name, stock, ours, *inputs):
        return name, stock, ours, inputs

    yield pair("unsorted_segment_sum", lambda d: tf.math.unsorted_segment_sum(d, ids, 3),
               lambda d: ops.unsorted_segment_sum(d, ids, 3), data)
    yield pair("unsorted_segment_mean", lambda d: tf.math.unsorted_segment_mean(d, ids, 3),
               lambda d: ops.unsorted_segment_mean(d, ids, 3), data)
    yield pair("unsorted_segment_sqrt_n", lambda d: tf.math.unsorted_segment_sqrt_n(d, ids, 3),
               lambda d: ops.unsorted_segment_sqrt_n(d, ids, 3), data)
    yield pair("segment_sum", lambda d: tf.math.segment_sum(d, sorted_ids), lambda d: ops.segment_sum(d, sorted_ids), data)
    yield pair("segment_mean", lambda d: tf.math.segment_mean(d, sorted_ids), lambda d: ops.segment_mean(d, sorted_ids), data)
    yield pair("reduce_sum", lambda d: tf.reduce_sum(d, 0), lambda d: ops.reduce_sum(d, 0), data)
    yield pair("bias_add", lambda v: tf.nn.bias_add(v, tf.ones([2])), lambda v: ops.bias_add(v, tf.ones([2])), images)
    yield pair("softmax_cross_entropy_with_logits",
               lambda lg: tf.nn.softmax_cross_entropy_with_logits(tf.one_hot(labels, 5), lg),
               lambda lg: ops.softmax_cross_entropy_with_logits(tf.one_hot(labels, 5), lg), logits)
    yield pair("sparse_softmax_cross_entropy_with_logits",
               lambda lg: tf.nn.sparse_softmax_cross_entropy_with_logits(labels, lg),
               lambda lg: ops.sparse_softmax_cross_entropy_with_logits(labels, lg), logits)
    yield pair("bincount (weights)", lambda w: tf.math.bincount(ids, weights=w), lambda w: ops.bincount(ids, weights=w),
               rng.standard_normal(6).astype(np.float32))
    yield pair("sparse_dense_matmul", lambda b: tf.sparse.sparse_dense_matmul(sparse(), b),
               lambda b: ops.sparse_dense_matmul(sparse(), b), rng.standard_normal((4, 2)).astype(np.float32))
    yield pair("gather", lambda p: tf.gather(p, [0, 5, 5]), lambda p: ops.gather(p, [0, 5, 5]), data)
    yield pair("embedding_lookup", lambda p: tf.nn.embedding_lookup(p, [1, 1, 2]),
               lambda p: ops.embedding_lookup(p, [1, 1, 2]), data)
    yield pair("resize_nearest_neighbor", lambda im: tf.raw_ops.ResizeNearestNeighbor(images=im, size=[8, 10]),
               lambda im: ops.resize_nearest_neighbor(im, [8, 10]), images)
    yield pair("crop_and_resize", lambda im: tf.image.crop_and_resize(im, boxes, [0, 0], [3, 3]),
               lambda im: ops.crop_and_resize(im, boxes, [0, 0], [3, 3]), images)


def nodes_per_instance(tf, op, inputs, gradient: bool) -> tuple[int, int]:
    """(nodes the second instance of ``op`` (and its gradient) adds, nodes the first one added)."""
    def size(graph) -> int:
        definition = graph.as_graph_def()
        return len(definition.node) + sum(len(function.node_def) for function in definition.library.function)

    graph = tf.Graph()
    with graph.as_default():
        counts = [0]
        for _ in range(2):
            tensors = [tf.constant(x) for x in inputs]
            out = op(*tensors)
            if gradient:
                tf.gradients(out, tensors)
            counts.append(size(graph))
    return counts[2] - counts[1], counts[1]


def gradient_checker_ms(tf, op, inputs, reps: int) -> tuple[float, float]:
    """(the first ``compute_gradient`` call, the median of the next ``reps``), in ms."""
    tensors = [tf.constant(x) for x in inputs]
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        tf.test.compute_gradient(op, tensors)
        times.append((time.perf_counter() - start) * 1000)
    return times[0], statistics.median(times[1:])


def session_growth(which: str) -> None:
    """Print the memory a TF1-style Session gains over SESSION_INSTANCES new fetches (child mode)."""
    import tensorflow as tf

    from tfrepro import ops

    op = ops.unsorted_segment_sum if which == "tfrepro" else tf.math.unsorted_segment_sum
    rng = np.random.default_rng(0)

    def resident_mb() -> float:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 / 2**20

    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        start = resident_mb()
        for _ in range(SESSION_INSTANCES):
            data = tf.constant(rng.standard_normal((1000, 8)), tf.float32)
            total = op(data, tf.constant(rng.integers(0, 50, 1000), tf.int32), 50)
            session.run([total, tf.gradients(tf.reduce_sum(total * total), data)])
        print(f"growth {resident_mb() - start:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--session", action="store_true", help="also measure TF1 Session memory per new fetch")
    parser.add_argument("--session-child", choices=["tf", "tfrepro"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.session_child:
        session_growth(args.session_child)
        return

    import tensorflow as tf

    from tfrepro import ops

    print(f"TensorFlow {tf.__version__}, CPU; gradient checker: first call, then median of {args.reps}")
    print(f"{'op':42s} {'nodes per instance (first)':>30s} {'gradient checker ms':>36s}")
    print(f"{'':42s} {'tfrepro':>15s} {'stock':>14s} {'tfrepro':>15s} {'stock':>12s} {'ratio':>7s}")
    for name, stock, ours, inputs in cases(tf, ops):
        gradient = not name.startswith("bincount")  # TF defines none
        ours_nodes, ours_first = nodes_per_instance(tf, ours, inputs, gradient)
        stock_nodes, stock_first = nodes_per_instance(tf, stock, inputs, gradient)
        if not gradient:
            print(f"{name:42s} {ours_nodes:6d} ({ours_first:6d}) {stock_nodes:5d} ({stock_first:5d})"
                  f" {'(forward only: TF has no gradient)':>36s}", flush=True)
            continue
        ours_first_ms, ours_ms = gradient_checker_ms(tf, ours, inputs, args.reps)
        stock_first_ms, stock_ms = gradient_checker_ms(tf, stock, inputs, args.reps)
        print(f"{name:42s} {ours_nodes:6d} ({ours_first:6d}) {stock_nodes:5d} ({stock_first:5d}) "
              f"{ours_first_ms:6.0f} / {ours_ms:5.1f} {stock_first_ms:4.0f} / {stock_ms:5.1f} {ours_ms / stock_ms:6.1f}x",
              flush=True)
    if args.session:
        from _common import grab, run

        growth = {which: grab(r"growth (\S+)", run([sys.executable, __file__, "--session-child", which]))
                  for which in ("tf", "tfrepro")}
        print(f"TF1 Session, {SESSION_INSTANCES} new fetches of unsorted_segment_sum + gradient: memory grows "
              f"{growth['tfrepro']:.0f} MB with tfrepro ({growth['tfrepro'] / SESSION_INSTANCES:.1f} MB per fetch), "
              f"{growth['tf']:.0f} MB with TF's op ({growth['tf'] / SESSION_INSTANCES:.1f} MB per fetch)")


if __name__ == "__main__":
    main()
