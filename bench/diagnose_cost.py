"""Cost of ``tfrepro.diagnose`` on the Keras MNIST CNN, on CPU, beside one training epoch, in one run.

Each round builds a fresh model (so every trace is a first trace, as for a user) and measures:
  scan        the static scan alone (repeats=0): trace the train step, match its ops, check the rest
  diagnose    the static scan and the dynamic bisection with K repeats (default 3)   goal < 10 s
  epoch       one fit epoch of the same model on the same data (batch 64), after a warm-up epoch
Prints the medians over the rounds and the ratio diagnose / epoch ("well under one epoch"). The
bisection runs K steps and traces K times: its cost does not grow with the dataset, an epoch's
does. Not a test: no time is asserted (only that the diagnosis is clean).

    python bench/diagnose_cost.py [--rounds 3] [--repeats 3] [--limit 4096]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _common import patched_mnist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=4096, help="training images (default 4096, the example's)")
    args = parser.parse_args()

    tfrepro, tf, data = patched_mnist(args.limit)
    from tfrepro.examples.mnist_cnn import build_model

    keras = tf.keras
    x, y = data.x_train, data.y_train

    def fresh():
        model = build_model(keras)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    times: dict[str, list[float]] = {"scan": [], "diagnose": [], "epoch": []}
    for _ in range(args.rounds):
        model = fresh()
        start = time.perf_counter()
        tfrepro.diagnose(model, x, y, repeats=0, batch_size=64)
        times["scan"].append(time.perf_counter() - start)

        model = fresh()
        start = time.perf_counter()
        diagnosis = tfrepro.diagnose(model, x, y, repeats=args.repeats, batch_size=64)
        times["diagnose"].append(time.perf_counter() - start)
        assert diagnosis.clean, str(diagnosis)

        model = fresh()
        model.fit(x, y, batch_size=64, epochs=1, verbose=0)  # warm-up: traces the train function
        start = time.perf_counter()
        model.fit(x, y, batch_size=64, epochs=1, verbose=0)
        times["epoch"].append(time.perf_counter() - start)

    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"TF {tf.__version__}, Keras {keras.__version__}, {os.cpu_count()} CPU cores; {data.description}, "
          f"{len(x)} images; {args.rounds} rounds, medians")
    print(f"static scan (repeats=0):         {median['scan']:.2f} s")
    print(f"diagnose (scan + {args.repeats} repeats):     {median['diagnose']:.2f} s   goal < 10 s")
    print(f"one epoch ({len(x)} images, batch 64): {median['epoch']:.2f} s")
    print(f"diagnose / epoch:                 {median['diagnose'] / median['epoch']:.2f}x")
    per_image = median["epoch"] / len(x)
    print(f"diagnose / a 60,000-image MNIST epoch at this speed ({60000 * per_image:.0f} s): "
          f"{median['diagnose'] / (60000 * per_image):.3f}x")


if __name__ == "__main__":
    main()
