"""Training-time cost of ReproducibilityCallback on the Keras MNIST CNN, on CPU, in one process.

Configurations, measured round-robin (the order rotating each round) on fresh models after a
warm-up epoch each:
  none        no callback
  sync        a no-op callback that overrides on_train_batch_end (Keras >= 3.6 then runs batch
              hooks synchronously: the price of any per-batch callback)
  epoch       ReproducibilityCallback(weights="epoch")   goal <= 1.01x
  batch       ReproducibilityCallback(weights="batch")   goal <= 1.05x
  gradients   ReproducibilityCallback(weights="batch", gradients=True)
Prints median fit times and ratios to "none" and to "sync" (what the callback costs beyond the
dispatch mode any per-batch callback gets), then the cost of one fingerprint of all weights beside
one train step, measured directly (less noisy). Not a test: nothing is asserted.

    python bench/callback_overhead.py [--rounds 3] [--epochs 2] [--limit 2048]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--limit", type=int, default=2048)
    args = parser.parse_args()

    import warnings

    import tfrepro

    warnings.simplefilter("ignore", tfrepro.ReproducibilityWarning)
    tfrepro.patch(0)
    import tensorflow as tf

    from tfrepro import ReproducibilityCallback
    from tfrepro.examples.datasets import load_mnist
    from tfrepro.examples.mnist_cnn import build_model

    keras = tf.keras
    data = load_mnist(allow_download=False, limit=args.limit)

    class NoOp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    tmp = Path(tempfile.mkdtemp(prefix="tfrepro-bench-"))
    factories = {
        "none": lambda: [],
        "sync": lambda: [NoOp()],
        "epoch": lambda: [ReproducibilityCallback(trace=tmp / "epoch.jsonl", weights="epoch")],
        "batch": lambda: [ReproducibilityCallback(trace=tmp / "batch.jsonl", weights="batch")],
        "gradients": lambda: [ReproducibilityCallback(trace=tmp / "grads.jsonl", gradients=True)],
    }
    times: dict[str, list[float]] = {name: [] for name in factories}
    names = list(factories)
    for round_index in range(args.rounds):
        for name in names[round_index % len(names):] + names[:round_index % len(names)]:
            make_callbacks = factories[name]
            keras.backend.clear_session()
            tfrepro.seed_everything(round_index)
            model = build_model(keras)
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
            model.fit(data.x_train, data.y_train, batch_size=64, epochs=1, verbose=0, callbacks=make_callbacks())
            start = time.perf_counter()
            model.fit(data.x_train, data.y_train, batch_size=64, epochs=args.epochs, verbose=0,
                      callbacks=make_callbacks())
            times[name].append(time.perf_counter() - start)
        print(f"round {round_index}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in names), flush=True)
    base, sync = statistics.median(times["none"]), statistics.median(times["sync"])
    steps = args.epochs * -(-len(data.x_train) // 64)
    print(f"MNIST CNN, CPU, {len(data.x_train)} images x {args.epochs} epochs ({steps} steps), "
          f"median of {args.rounds}, data: {data.source}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:9s} {median:7.2f} s  vs none {median / base:.3f}x  vs sync {median / sync:.3f}x")

    from tfrepro.proof.fingerprints import VariableFingerprinter

    fingerprinter = VariableFingerprinter(model.weights)
    batch_x, batch_y = data.x_train[:64], data.y_train[:64]
    fingerprinter(), model.train_on_batch(batch_x, batch_y)  # warm up
    # Measured apart: right after a train step, a fingerprint would also wait for the step's last ops.
    fingerprint_s = min(_timed(fingerprinter) for _ in range(60))
    step_s = min(_timed(lambda: model.train_on_batch(batch_x, batch_y)) for _ in range(60))
    print(f"  one fingerprint of all {sum(int(w.numpy().size) for w in model.weights)} weights: "
          f"{fingerprint_s * 1000:.2f} ms; one train step (batch 64): {step_s * 1000:.1f} ms; "
          f"ratio {fingerprint_s / step_s:.3f}")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
