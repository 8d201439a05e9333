"""Time of each tfrepro.ops op against TensorFlow's op on the same inputs, on CPU, in one run.

Every pair runs as a tf.function (forward, or forward + backward where the replacement is in the
backward pass) over tf.Variable inputs (so that nothing is constant-folded), best of --reps after
a warm-up, alternating the two. The reference case is
unsorted_segment_sum on 200k x 64 float32 with 100 segments (goal <= 1.5x, hard bar <= 2x); the
float64-upcast approach (still order-dependent: TF PR 47749) is timed on the same inputs for
comparison. Not a test: the figures are printed only.

    python bench/ops_overhead.py [--reps 9]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tensorflow as tf

from tfrepro import ops
from tfrepro.ops import _exact_sum, segment


def backward(op, *inputs):
    """A function computing ``op``'s gradients with respect to ``inputs`` for a random upstream
    gradient (a variable, so that nothing folds to a constant)."""
    upstream = tf.Variable(tf.random.stateless_normal(tf.shape(op(*inputs)), seed=[1, 2]))

    def run():
        with tf.GradientTape() as tape:
            out = op(*inputs)
        return tape.gradient(out, list(inputs), output_gradients=upstream)

    return run


def variable(array, dtype=tf.float32) -> tf.Variable:
    return tf.Variable(tf.constant(array, dtype))


def cases(rng: np.random.Generator):
    data = variable(rng.standard_normal((200_000, 64)))
    ids = tf.constant(rng.integers(0, 100, 200_000), tf.int32)
    def stock_sum():
        return tf.math.unsorted_segment_sum(data, ids, 100)

    def upcast_sum():
        return tf.cast(tf.math.unsorted_segment_sum(tf.cast(data, tf.float64), ids, 100), tf.float32)

    yield ("unsorted_segment_sum 200k x 64 f32, 100 segments (reference)",
           lambda: ops.unsorted_segment_sum(data, ids, 100), stock_sum)
    yield ("  same inputs: float64 upcast (order-dependent) vs stock", upcast_sum, stock_sum)
    wide = variable(rng.standard_normal((200_000, 64)) * np.exp2(rng.integers(-40, 40, (200_000, 64))))
    yield ("  magnitudes spanning 2**80 in a segment (canonical path)",
           lambda: ops.unsorted_segment_sum(wide, ids, 100), lambda: tf.math.unsorted_segment_sum(wide, ids, 100))

    def traced_with(accumulate):  # the op, traced (by its first call) with one int64 accumulator forced
        saved = _exact_sum.current_plan
        forced = lambda: _exact_sum.Plan(accumulate, _exact_sum.CHUNK_ELEMENTS)  # noqa: E731
        for module in (_exact_sum, segment):  # where the plan is looked up: the trace key and the op
            module.current_plan = forced
        try:
            op = tf.function(lambda: ops.unsorted_segment_sum(data, ids, 100))
            op()
            return op
        finally:
            for module in (_exact_sum, segment):
                module.current_plan = saved

    yield ("  same op: int64 sums by DenseBincount vs by the segment kernel",
           traced_with("bincount"), traced_with("segment"))
    value = variable(rng.standard_normal((64, 32, 32, 32)))
    bias = variable(rng.standard_normal(32))
    yield ("bias_add fwd+bwd 64x32x32x32", backward(ops.bias_add, value, bias), backward(tf.nn.bias_add, value, bias))
    logits = variable(rng.standard_normal((4096, 1000)))
    labels = tf.constant(rng.integers(0, 1000, 4096), tf.int32)
    dense_labels = tf.one_hot(labels, 1000)
    yield ("softmax_cross_entropy fwd+bwd 4096x1000",
           backward(lambda lg: ops.softmax_cross_entropy_with_logits(dense_labels, lg), logits),
           backward(lambda lg: tf.nn.softmax_cross_entropy_with_logits(dense_labels, lg), logits))
    yield ("sparse_softmax_cross_entropy fwd+bwd 4096x1000",
           backward(lambda lg: ops.sparse_softmax_cross_entropy_with_logits(labels, lg), logits),
           backward(lambda lg: tf.nn.sparse_softmax_cross_entropy_with_logits(labels, lg), logits))
    table = variable(rng.standard_normal((50_000, 64)))
    tokens = tf.constant(rng.integers(0, 5_000, 16_384), tf.int32)
    ours_gather, stock_gather = backward(lambda t: ops.gather(t, tokens), table), backward(lambda t: tf.gather(t, tokens), table)
    yield ("gather (embedding) fwd+bwd, dense grad 50k x 64, 16k ids",
           lambda: tf.convert_to_tensor(ours_gather()[0]), lambda: tf.convert_to_tensor(stock_gather()[0]))
    values = tf.constant(rng.integers(0, 1000, 1_000_000), tf.int32)
    weights = variable(rng.standard_normal(1_000_000))
    yield ("bincount 1M values, weighted", lambda: ops.bincount(values, weights=weights),
           lambda: tf.math.bincount(values, weights=weights))
    sparse = tf.sparse.reorder(tf.SparseTensor(
        tf.constant(np.stack([rng.integers(0, 2000, 100_000), rng.integers(0, 2000, 100_000)], 1), tf.int64),
        tf.constant(rng.standard_normal(100_000), tf.float32), [2000, 2000]))
    dense = variable(rng.standard_normal((2000, 64)))
    yield ("sparse_dense_matmul 2000x2000 (100k nnz) x 64", lambda: ops.sparse_dense_matmul(sparse, dense),
           lambda: tf.sparse.sparse_dense_matmul(sparse, dense))
    images = variable(rng.standard_normal((32, 64, 64, 16)))
    yield ("resize nearest x2 fwd+bwd 32x64x64x16",
           backward(lambda im: ops.resize_nearest_neighbor(im, [128, 128], half_pixel_centers=True), images),
           backward(lambda im: tf.image.resize(im, [128, 128], method="nearest"), images))
    boxes = variable(rng.uniform(0, 1, (256, 4)))
    box_indices = tf.constant(rng.integers(0, 32, 256), tf.int32)
    yield ("crop_and_resize fwd+bwd 256 boxes -> 14x14",
           backward(lambda im, bx: ops.crop_and_resize(im, bx, box_indices, [14, 14]), images, boxes),
           backward(lambda im, bx: tf.image.crop_and_resize(im, bx, box_indices, [14, 14]), images, boxes))


def timings(first, second, reps: int) -> tuple[list[float], list[float]]:
    """Wall times of ``first`` and ``second``, run alternately so that both see the same machine."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for fn, record in zip((first, second), times):
            start = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fn())
            record.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    print(f"TensorFlow {tf.__version__}, CPU, {args.reps} alternating runs each: best and median")
    print(f"{'op':62s} {'tfrepro':>9s} {'stock':>9s} {'best':>6s} {'median':>7s}")
    for name, ours, stock in cases(np.random.default_rng(0)):
        ours_fn, stock_fn = tf.function(ours, autograph=False), tf.function(stock, autograph=False)
        ours_fn(), stock_fn()  # trace and warm up
        ours_t, stock_t = timings(ours_fn, stock_fn, args.reps)
        print(f"{name:62s} {min(ours_t) * 1000:7.1f}ms {min(stock_t) * 1000:7.1f}ms {min(ours_t) / min(stock_t):5.2f}x "
              f"{np.median(ours_t) / np.median(stock_t):6.2f}x", flush=True)


if __name__ == "__main__":
    main()
