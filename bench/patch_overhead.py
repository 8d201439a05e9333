"""Training-time cost of tfrepro.patch() on the Keras MNIST CNN, on CPU.

Runs the bundled example in fresh processes, alternating plain and `tfrepro run` (patched), and
prints the ratio of the median fit times, for both of its inputs: the arrays given to fit (the
model's own cost; goal <= 1.05x), and the tf.data pipeline with random augmentation in a parallel
map, which TF runs serially under op determinism. Not a test: the figures are printed only.

    python bench/patch_overhead.py [--reps 3] [--limit 2048] [--epochs 2]
"""

from __future__ import annotations

import argparse

from _common import PYTHON, grab, median, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--limit", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    for source in ("arrays", "augmented"):
        example = ["-m", "tfrepro.examples.mnist_cnn", "--offline", "--limit", str(args.limit), "--epochs",
                   str(args.epochs), "--input", source]
        plain, patched = [], []
        for rep in range(args.reps):
            plain.append(grab(r"fit time: ([\d.]+) s", run([PYTHON, *example])))
            patched.append(grab(r"fit time: ([\d.]+) s",
                                run([PYTHON, "-m", "tfrepro", "run", "--seed", "1", "--", PYTHON, *example])))
            print(f"{source} rep {rep}: plain {plain[-1]:.2f} s, patched {patched[-1]:.2f} s", flush=True)
        ratio = median(patched) / median(plain)
        print(f"MNIST CNN fit, CPU, input {source}, {args.limit} images x {args.epochs} epochs, median of "
              f"{args.reps}: plain {median(plain):.2f} s, patched {median(patched):.2f} s, ratio {ratio:.3f}x",
              flush=True)


if __name__ == "__main__":
    main()
