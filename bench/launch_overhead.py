"""Wall-clock cost of the launcher, side by side in one run, alternating:

  run     `tfrepro run -- python script.py` vs `python script.py`, on a script that imports neither
          NumPy nor TensorFlow (goal: <= 0.3 s more per run);
  check   `tfrepro check --runs N` vs N plain runs of the MNIST example (goal: <= 1.0x + 3 s per run;
          check records every batch and compares the runs).

Not a test: the figures are printed only.

    python bench/launch_overhead.py [--reps 5] [--runs 2] [--limit 1024] [--epochs 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _common import PYTHON, timed_run

TFREPRO = [PYTHON, "-m", "tfrepro"]



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--limit", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "plain.py"
        script.write_text("import random\nprint(sum(random.random() for _ in range(1000)))\n")
        plain, launched = [], []
        for _ in range(args.reps):
            plain.append(timed_run([PYTHON, str(script)]))
            launched.append(timed_run([*TFREPRO, "run", "--", PYTHON, str(script)]))
        extra = statistics.median(launched) - statistics.median(plain)
        print(f"run, script without NumPy/TF, median of {args.reps}: plain {statistics.median(plain):.3f} s, "
              f"tfrepro run {statistics.median(launched):.3f} s: +{extra:.3f} s per run (goal <= 0.3 s)", flush=True)

        example = ["-m", "tfrepro.examples.mnist_cnn", "--offline", "--limit", str(args.limit),
                   "--epochs", str(args.epochs)]
        plain_runs, checks = [], []
        for rep in range(max(1, args.reps // 2)):
            plain_runs.append(sum(timed_run([PYTHON, *example]) for _ in range(args.runs)))
            checks.append(timed_run([*TFREPRO, "check", "--runs", str(args.runs), "--out", str(Path(tmp) / f"c{rep}"),
                                  "--", PYTHON, *example]))
        base, check = statistics.median(plain_runs), statistics.median(checks)
        per_run = (check - base) / args.runs
        print(f"check, MNIST CNN {args.limit} images x {args.epochs} epoch(s), {args.runs} runs, median of "
              f"{len(checks)}: {args.runs} plain runs {base:.2f} s, tfrepro check {check:.2f} s: {check / base:.2f}x, "
              f"+{per_run:.2f} s per run (goal <= 1.0x + 3 s per run)")


if __name__ == "__main__":
    main()
