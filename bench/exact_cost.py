"""The exact tier's cost on this CPU, measured side by side in one run: each exact op against TF's
op, then a model's epoch under ``patch(ops="exact")`` against ``patch(ops="auto")`` (the Keras
MNIST CNN; with ``--model transformer`` keras-io's Transformer text classifier reading each digit as
49 tokens, ``tfrepro.examples.transformer_classifier``; with ``--model lstm`` a bidirectional LSTM
reading each digit's 28 rows as a sequence), and the two arms' final losses over a few seeds compared with
``tfrepro.compare_sweeps`` (do the exact ops train as well?). Not a test: the figures are printed only.

    python bench/exact_cost.py [--model cnn|transformer|lstm] [--seeds 3] [--limit 2048] [--reps 5]

First the tier's steps that run as one XLA kernel (a sum over the batch, image patches, col2im, an
Adam update), each against what it replaced: the code that ran before, on TF's kernels one by one
(the batch sum's integers summed as float64 limbs there), and TF's ``extract_patches`` (the same
bits, tested).
Per op: forward + backward as a tf.function, best of --reps after a warm-up, the arms alternating:
the exact op with its products in float64 and in float32 slices (``exact.slices``: the same bits;
the path a GPU with slow float64 takes), and TF's op. Then the convolution's forward product alone:
both exact paths, TF's float64 and float32 matmul, and XLA's int8 and bfloat16 products with a wide
accumulator (where the CPU time goes, and what a faster exact path could build on).
Whole model: a fresh process per arm and seed trains 4 epochs (batch 64) and takes its fastest epoch
after the first (tracing and compilation are the first's; the fastest is the one least disturbed by
whatever else the machine ran: on this shared 2-core machine one epoch can take twice another); the
ratio is the median over the seeds of exact's epoch over auto's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PYTHON, median, run  # noqa: E402

EPOCHS = 4


def _lstm(tf):
    layers = tf.keras.layers
    return tf.keras.Sequential([tf.keras.Input((28, 28)), layers.Bidirectional(layers.LSTM(64)),
                                layers.Dense(10, activation="softmax")])


def _child(ops: str, seed: int, limit: int, model_name: str) -> None:
    import tfrepro

    tfrepro.patch(seed, ops=ops)
    import tensorflow as tf

    from tfrepro.examples import mnist_cnn, transformer_classifier
    from tfrepro.examples.datasets import load_mnist

    data = load_mnist(allow_download=False, limit=limit)
    model, x_train = {
        "cnn": lambda: (mnist_cnn.build_model(tf.keras), data.x_train),
        "transformer": lambda: (transformer_classifier.build_model(tf.keras),
                                transformer_classifier.as_tokens(data.x_train)),
        "lstm": lambda: (_lstm(tf), data.x_train.reshape(-1, 28, 28)),
    }[model_name]()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    times = []

    class Timer(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

    history = model.fit(x_train, data.y_train, batch_size=64, epochs=EPOCHS, verbose=0, callbacks=[Timer()])
    print(json.dumps({"epoch_s": min(times[1:]), "loss": history.history["loss"][-1]}))


PRODUCTS = ("float64", "float32")  # the exact tier's product paths (TFREPRO_EXACT_PRODUCTS), timed side by side


def _per_op(reps: int) -> list[tuple[str, float, float, float]]:
    import numpy as np
    import tensorflow as tf

    from tfrepro.ops import segment
    from tfrepro.ops.exact import convolutions, linalg, losses, noise, pooling, reductions, slices

    rng = np.random.default_rng(0)

    def var(*shape):
        return tf.Variable(rng.standard_normal(shape).astype(np.float32))

    def step(op, *inputs):
        @tf.function
        def run_op():
            with tf.GradientTape() as tape:
                out = op(*inputs)
            grads = tape.gradient(out, inputs, output_gradients=tf.ones_like(out))
            return out, grads

        return run_op

    x1, w1 = var(64, 28, 28, 1), var(3, 3, 1, 32)
    x2, w2 = var(64, 26, 26, 32), var(3, 3, 32, 64)
    d1, k1, b1 = var(64, 9216), var(9216, 128), var(128)
    pool_in, logits = var(64, 24, 24, 64), var(64, 10)
    labels = tf.constant(rng.integers(0, 10, 64))
    seed = tf.constant([1, 2])
    cases = {
        "Conv2D 28x28x1 -> 32 (fwd+bwd)": (lambda x, w: convolutions.convolution(x, w), tf.nn.convolution, (x1, w1)),
        "Conv2D 26x26x32 -> 64 (fwd+bwd)": (lambda x, w: convolutions.convolution(x, w), tf.nn.convolution, (x2, w2)),
        "Dense 9216 -> 128 matmul (fwd+bwd)": (linalg.matmul, tf.linalg.matmul, (d1, k1)),
        "bias_add 64x128 (fwd+bwd)": (reductions.bias_add, tf.nn.bias_add, (tf.Variable(tf.zeros([64, 128])), b1)),
        "MaxPool 2x2 (fwd+bwd)": (lambda x: pooling.max_pool(x, 2, 2, "VALID"), lambda x: tf.nn.max_pool(x, 2, 2, "VALID"), (pool_in,)),
        "Dropout 0.25 (fwd+bwd)": (lambda x: noise.stateless_dropout(x, 0.25, seed),
                                   lambda x: tf.nn.experimental.stateless_dropout(x, 0.25, seed), (pool_in,)),
        "sparse softmax xent 64x10 (fwd+bwd)": (
            lambda z: losses.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=z),
            lambda z: tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=z), (logits,)),
        "reduce_sum 64x9216 over the batch": (lambda x: segment.reduce_sum(x, axis=0), lambda x: tf.reduce_sum(x, axis=0), (d1,)),
    }
    rows = []
    for name, (exact_op, stock_op, inputs) in cases.items():
        runs, chosen = {}, os.environ.get(slices.ENV)
        for products in PRODUCTS:  # the path is read when a product is traced: each arm traces under its own
            os.environ[slices.ENV] = products
            runs[products] = step(exact_op, *inputs)
            runs[products]()
        os.environ.pop(slices.ENV)
        if chosen is not None:  # the caller's own setting, for the whole-model runs
            os.environ[slices.ENV] = chosen
        runs["stock"] = step(stock_op, *inputs)
        runs["stock"]()
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(reps):
            for arm, fn in runs.items():
                start = time.perf_counter()
                fn()
                best[arm] = min(best[arm], time.perf_counter() - start)
        rows.append((name, *(best[arm] * 1e3 for arm in (*PRODUCTS, "stock"))))
    return rows


def _best(functions: dict, reps: int) -> dict:
    """Each function's best time in ms, after a warm-up, the functions alternating."""
    import numpy as np
    import tensorflow as tf

    best = dict.fromkeys(functions, float("inf"))
    for fn in functions.values():
        fn()
    for _ in range(reps):
        for name, fn in functions.items():
            start = time.perf_counter()
            for result in tf.nest.flatten(fn()):
                np.asarray(result)
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: seconds * 1e3 for name, seconds in best.items()}


def _kernels(reps: int) -> list[tuple[str, float, float]]:
    """The tier's steps that run as one XLA kernel, against what they replaced, on TF's kernels one by
    one (the same bits: ``test_the_compiled_kernels_give_the_bits_of_tfs_kernels_one_by_one``), on
    the MNIST CNN's shapes."""
    import numpy as np
    import tensorflow as tf

    from tfrepro.ops.exact import _fixed, convolutions, optimizers

    rng = np.random.default_rng(0)
    gradient = tf.constant(rng.standard_normal((64, 24, 24, 64)).astype(np.float32))
    image = tf.constant(rng.standard_normal((64, 26, 26, 32)).astype(np.float32))
    columns = tf.constant(rng.standard_normal((64, 24, 24, 3, 3, 32)))
    g, m, v, w = (tf.constant(np.abs(rng.standard_normal((9216, 128))).astype(np.float32)) for _ in range(4))
    factors = [tf.constant(x, tf.float64) for x in (1e-3, 0.9, 0.999, 1e-7)]
    step = (g, m, v, None, w, factors[0], factors[1], factors[2], factors[3])
    geometry = ([1, 1], [1, 1], "VALID")
    cases = {
        "sum over the batch, 64x24x24x64": (lambda: [_fixed.exact_batch_sum(gradient, [0, 1, 2])],
                                            tf.function(lambda: [_fixed._batch_sum(gradient, [0, 1, 2])])),
        "image patches 3x3 of 64x26x26x32": (
            tf.function(lambda: [convolutions._patches(image, [3, 3, 32, 64], *geometry)[0]]),
            tf.function(lambda: [tf.image.extract_patches(image, [1, 3, 3, 1], [1, 1, 1, 1], [1, 1, 1, 1], "VALID")])),
        "col2im into 64x26x26x32": (
            lambda: [convolutions._compiled_col2im((3, 3), (1, 1), (1, 1), "VALID", tf.float32)(columns, tf.shape(image))],
            tf.function(lambda: [convolutions.col2im(columns, tf.shape(image), *geometry, tf.float32)])),
        "Adam update of a 9216x128 kernel": (lambda: optimizers.adam_values(*step),
                                             tf.function(lambda: optimizers._adam_values(*step))),
    }
    rows = []
    for name, (kernel, one_by_one) in cases.items():
        times = _best({"kernel": kernel, "one by one": one_by_one}, reps)
        rows.append((name, times["kernel"], times["one by one"]))
    return rows


def _products(reps: int) -> list[tuple[str, float]]:
    """The conv 26x26x32 -> 64's forward product ([36864, 288] @ [288, 64]) on this CPU: the exact
    tier's two paths, TF's float64 and float32 matmul, and the integer and bfloat16 products with a
    wide accumulator that XLA offers (``BatchMatMulV3``: int8 x int8 -> int32, bfloat16 x bfloat16 ->
    float32; exact sums of small integers in any order, the lead for a faster exact path)."""
    import numpy as np
    import tensorflow as tf

    from tfrepro.ops.exact import _fixed, slices

    rng = np.random.default_rng(0)
    a = tf.constant(rng.standard_normal((36864, 288)).astype(np.float32))
    b = tf.constant(rng.standard_normal((288, 64)).astype(np.float32))
    digits_a = tf.constant(rng.integers(-128, 128, (36864, 288)), tf.int8)
    digits_b = tf.constant(rng.integers(-128, 128, (288, 64)), tf.int8)

    def wide(x, y, out):
        return tf.function(lambda: tf.raw_ops.BatchMatMulV3(x=x, y=y, Tout=out), jit_compile=True)

    cases = {}
    for products in PRODUCTS:
        os.environ[slices.ENV] = products
        cases[f"exact product ({products} path)"] = tf.function(lambda: _fixed.exact_matmul(a, b))
        cases[f"exact product ({products} path)"]()
    os.environ.pop(slices.ENV)
    cases.update({
        "TF matmul, float64": tf.function(lambda: tf.matmul(tf.cast(a, tf.float64), tf.cast(b, tf.float64))),
        "TF matmul, float32": tf.function(lambda: tf.matmul(a, b)),
        "XLA int8 x int8 -> int32": wide(digits_a, digits_b, tf.int32),
        "XLA bfloat16 x bfloat16 -> float32": wide(tf.cast(digits_a, tf.bfloat16), tf.cast(digits_b, tf.bfloat16),
                                                   tf.float32),
    })
    return list(_best(cases, reps).items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("cnn", "transformer", "lstm"), default="cnn")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--child", nargs=2, metavar=("OPS", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.child[0], int(args.child[1]), args.limit, args.model)

    if args.model == "cnn":
        print("the tier's XLA kernels (ms, best of %d): kernel, what it replaced on TF's kernels" % args.reps)
        for name, kernel_ms, plain_ms in _kernels(args.reps):
            print(f"  {name:40s} {kernel_ms:8.2f} {plain_ms:8.2f}   {plain_ms / kernel_ms:5.1f}x faster")
        print("per op (ms, best of %d): exact with float64 products, with float32 slices, TF; ratios to TF" % args.reps)
        for name, wide_ms, sliced_ms, stock_ms in _per_op(args.reps):
            print(f"  {name:40s} {wide_ms:8.2f} {sliced_ms:8.2f} {stock_ms:7.2f}   "
                  f"{wide_ms / stock_ms:5.1f}x {sliced_ms / stock_ms:5.1f}x")
        print("the conv's forward product, [36864, 288] @ [288, 64] (ms, best of %d; GOP/s)" % args.reps)
        for name, ms in _products(args.reps):
            print(f"  {name:40s} {ms:8.2f}   {2 * 36864 * 288 * 64 / ms / 1e6:6.0f}")

    import tfrepro

    results = {"exact": [], "auto": []}
    for seed in range(args.seeds):
        for ops in ("auto", "exact"):
            out = run([PYTHON, __file__, "--model", args.model, "--limit", str(args.limit), "--child", ops, str(seed)])
            results[ops].append(json.loads(out.strip().splitlines()[-1]))
    ratios = [e["epoch_s"] / a["epoch_s"] for e, a in zip(results["exact"], results["auto"])]
    what = {"cnn": "MNIST CNN", "transformer": "Transformer classifier (49 tokens a digit)",
            "lstm": "bidirectional LSTM(64) over the digits' rows"}[args.model]
    print(f"{what} epoch ({args.limit} images, batch 64, 2 CPU cores): exact "
          f"{median([r['epoch_s'] for r in results['exact']]):.2f} s, auto "
          f"{median([r['epoch_s'] for r in results['auto']]):.2f} s: {median(ratios):.1f}x (median of {args.seeds} seeds)")
    comparison = tfrepro.compare_sweeps([r["loss"] for r in results["auto"]], [r["loss"] for r in results["exact"]])
    print(f"final loss after {EPOCHS} epochs, auto: " + ", ".join(f"{r['loss']:.4f}" for r in results["auto"]))
    print(f"final loss after {EPOCHS} epochs, exact: " + ", ".join(f"{r['loss']:.4f}" for r in results["exact"]))
    print(f"compare_sweeps(auto, exact): {comparison}")


if __name__ == "__main__":
    main()
