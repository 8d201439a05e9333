"""Cost of ``patch()``'s default ``ops="auto"`` on CPU, in one run: per op, and on whole models.

``ops="auto"`` runs tfrepro's version only where a GPU is visible (TF's op raises there under op
determinism) and TF's own op on a CPU, where every TF kernel is deterministic. Both are timed here:
the GPU version by running it on this CPU.

Per op (forward + backward where the replacement is in the backward pass; tf.functions over
tf.Variables, best and median of --reps alternating runs after a warm-up): the ``ops="auto"`` GPU
version (TF's own sums, deterministic under op determinism) and the order-invariant one
(``ops=True``) against TensorFlow's op; goal for auto <= 1.5x. On a GPU TF's op raises, so there
the alternative is an exception, not TF's time.

Per model (Keras, fit time of 2 epochs after a warm-up epoch, fresh model each, round-robin,
median of --rounds): a CNN with UpSampling2D, one with batch norm fine-tuning, and the MNIST CNN
(which reaches none of the replaced ops), each under plain TF (no patch), ``patch(ops=False)``,
``patch()`` (on this CPU: TF's ops), ``patch()`` with the GPU versions forced, and
``patch(ops=True)``; goal for ``patch()`` vs plain: <= 1.3x, and <= 1.05x on the MNIST CNN. Not a
test: nothing is asserted.

    python bench/auto_ops.py [--reps 9] [--rounds 3] [--images 4096] [--skip-ops]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np


def op_cases(tf, ops, rng):
    """The ops ``ops="auto"`` replaces: four as ``bench/ops_overhead.py`` times them, and two more."""
    import ops_overhead  # the sibling benchmark (bench/ is on sys.path); imports TensorFlow

    shared = ("resize nearest", "crop_and_resize", "bincount", "sparse_dense_matmul")
    yield from (case for case in ops_overhead.cases(rng) if case[0].startswith(shared))
    images = ops_overhead.variable(rng.standard_normal((32, 64, 64, 16)))
    scale, offset = ops_overhead.variable(rng.uniform(0.5, 1.5, 16)), ops_overhead.variable(rng.standard_normal(16))
    mean, variance = tf.constant(rng.standard_normal(16), tf.float32), tf.constant(rng.uniform(0.5, 2, 16), tf.float32)
    yield ("fused batch norm fine-tuning fwd+bwd 32x64x64x16",
           ops_overhead.backward(lambda im, s, o: ops.fused_batch_norm(im, s, o, mean, variance, is_training=False)[0],
                                 images, scale, offset),
           ops_overhead.backward(lambda im, s, o: tf.compat.v1.nn.fused_batch_norm(im, s, o, mean, variance,
                                                                                   is_training=False)[0],
                                 images, scale, offset))
    yield ("adjust_contrast 32x64x64x16", lambda: ops.adjust_contrast(images, 1.5),
           lambda: tf.image.adjust_contrast(images, 1.5))


def timed(tf, functions, reps):
    times = [[] for _ in functions]
    for _ in range(reps):
        for fn, record in zip(functions, times):
            start = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fn())
            record.append(time.perf_counter() - start)
    return times


def models(keras, tf):
    class FineTuned(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.bn = keras.layers.BatchNormalization()

        def call(self, inputs):
            return self.bn(inputs, training=False)

    from tfrepro.examples.mnist_cnn import build_model

    def cnn(*middle):
        return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"), *middle,
                                 keras.layers.Conv2D(16, 3, strides=2, activation="relu"), keras.layers.Flatten(),
                                 keras.layers.Dense(10)])

    return {"CNN with UpSampling2D": lambda: cnn(keras.layers.UpSampling2D()),
            "CNN with batch norm fine-tuning": lambda: cnn(FineTuned()),
            "MNIST CNN (no replaced op)": lambda: build_model(keras)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=4096, help="training images per fit (default 4096)")
    parser.add_argument("--skip-ops", action="store_true", help="time the models only")
    args = parser.parse_args()
    import tfrepro

    warnings.simplefilter("ignore", tfrepro.ReproducibilityWarning)
    tfrepro.patch(0, ops=False)  # op determinism on, nothing replaced: TF's ops are the reference
    import tensorflow as tf

    from tfrepro import _tf, ops
    from tfrepro.ops._exact_sum import summing

    print(f"TensorFlow {tf.__version__}, Keras {_tf.keras_module().__version__}, CPU; per op: {args.reps} alternating "
          "runs, best (median) vs TF's op")
    print(f"{'op':52s} {'TF':>8s} {'auto (GPU)':>15s} {'order-invariant':>17s}")
    for name, ours, stock in [] if args.skip_ops else op_cases(tf, ops, np.random.default_rng(0)):
        def under(mode, fn=ours):
            compiled = tf.function(fn, autograph=False)
            with summing(mode):
                compiled()  # traced under the mode
            return compiled

        functions = [tf.function(stock, autograph=False), under("tf"), under("exact")]
        functions[0]()
        stock_t, auto_t, exact_t = timed(tf, functions, args.reps)
        ratio = lambda t: f"{min(t) / min(stock_t):.2f}x ({np.median(t) / np.median(stock_t):.2f}x)"  # noqa: E731
        print(f"{name:52s} {min(stock_t) * 1000:6.1f}ms {ratio(auto_t):>15s} {ratio(exact_t):>17s}", flush=True)

    keras = _tf.keras_module()
    data = np.random.default_rng(1).random((args.images, 28, 28, 1)).astype("float32")
    labels = np.random.default_rng(2).integers(0, 10, args.images)
    from tfrepro.ops import _exact_sum

    configs = {"plain TF": None, "patch(ops=False)": False, "patch()": "auto", "patch() GPU versions": "gpu",
               "patch(ops=True)": True}
    cpu_only = _exact_sum._gpus_visible
    print(f"\nfit, 2 epochs of {len(data)} images, batch 64, median of {args.rounds} rounds (ratio to plain TF)")
    for model_name, build in models(keras, tf).items():
        times = {name: [] for name in configs}
        for round_index in range(args.rounds):
            order = list(configs)[round_index % len(configs):] + list(configs)[:round_index % len(configs)]
            for config in order:
                _exact_sum._gpus_visible = (lambda: True) if configs[config] == "gpu" else cpu_only
                if configs[config] is None:
                    tfrepro.unpatch()
                else:
                    tfrepro.patch(0, ops="auto" if configs[config] == "gpu" else configs[config])
                model = build()
                model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
                model.fit(data, labels, batch_size=64, epochs=1, verbose=0)
                start = time.perf_counter()
                model.fit(data, labels, batch_size=64, epochs=2, verbose=0)
                times[config].append(time.perf_counter() - start)
        plain = statistics.median(times["plain TF"])
        print(f"{model_name:34s} " + "  ".join(f"{name} {statistics.median(t):.2f}s ({statistics.median(t) / plain:.2f}x)"
                                              for name, t in times.items()), flush=True)
    _exact_sum._gpus_visible = cpu_only


if __name__ == "__main__":
    main()
