"""Wall-clock cost of `tfrepro check --workers 2 --runs 2` against two plain 2-worker runs of the same
script, side by side in one run, alternating (goal: <= 1.2x).

The script is the MNIST CNN under MultiWorkerMirroredStrategy (`python -m tfrepro.examples.mnist_cnn
--strategy multi-worker`). A plain 2-worker run is `tfrepro run --workers 2`: Keras 3 cannot `fit`
under MultiWorkerMirroredStrategy without the patch's repair (keras-team/keras#20585), so an
unpatched launch by hand is timed too where the installed Keras allows it (Keras 2). The check
records every batch of every worker, compares every worker with worker 0 and the runs with each
other. Not a test: the figures are printed only.

    python bench/multi_worker_check.py [--reps 3] [--limit 1024] [--epochs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import PYTHON, timed_run

TFREPRO = [PYTHON, "-m", "tfrepro"]



def _by_hand(example: list[str]) -> float | None:
    """Two workers started with a TF_CONFIG by hand, no tfrepro; None where the run fails (Keras 3)."""
    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    start = time.perf_counter()
    workers = [subprocess.Popen([PYTHON, *example], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
                                    {"cluster": cluster, "task": {"type": "worker", "index": index}})))
               for index in range(2)]
    codes = [worker.wait() for worker in workers]
    return time.perf_counter() - start if codes == [0, 0] else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--limit", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    example = ["-m", "tfrepro.examples.mnist_cnn", "--strategy", "multi-worker", "--offline", "--limit",
               str(args.limit), "--epochs", str(args.epochs)]
    runs, checks, by_hand = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            runs.append(sum(timed_run([*TFREPRO, "run", "--workers", "2", "--", PYTHON, *example]) for _ in range(2)))
            checks.append(timed_run([*TFREPRO, "check", "--workers", "2", "--runs", "2", "--out",
                                  str(Path(tmp) / f"c{rep}"), "--", PYTHON, *example]))
            hand = [_by_hand(example) for _ in range(2)]
            if None not in hand:
                by_hand.append(sum(hand))  # type: ignore[arg-type]
    base, check = statistics.median(runs), statistics.median(checks)
    print(f"MNIST CNN, {args.limit} images x {args.epochs} epoch(s) on 2 localhost workers, median of {args.reps}: "
          f"two `tfrepro run --workers 2` {base:.2f} s, `tfrepro check --workers 2 --runs 2` {check:.2f} s: "
          f"{check / base:.2f}x (goal <= 1.2x)")
    if by_hand:
        hand = statistics.median(by_hand)
        print(f"two unpatched 2-worker runs started by hand: {hand:.2f} s; check against them: {check / hand:.2f}x")
    else:
        print(f"two unpatched 2-worker runs started by hand: they fail here (Keras {_keras_version()} cannot fit "
              "under MultiWorkerMirroredStrategy without tfrepro.patch)")


def _keras_version() -> str:
    proc = subprocess.run([PYTHON, "-c", "import tensorflow as tf; print(tf.keras.version() if hasattr(tf.keras, "
                                         "'version') else tf.keras.__version__)"],
                          capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), check=False)
    return proc.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
