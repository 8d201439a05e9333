"""Helpers shared by the benchmarks: fresh-process runs and robust summaries."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time


def run(args: list[str], env: dict[str, str] | None = None) -> str:
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    proc = subprocess.run(args, env=full_env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark run failed: {' '.join(args)}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def timed_run(args: list[str], env: dict[str, str] | None = None) -> float:
    """Wall-clock seconds of one ``run``."""
    start = time.perf_counter()
    run(args, env)
    return time.perf_counter() - start


def grab(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    if match is None:
        raise SystemExit(f"pattern {pattern!r} not found in:\n{text[-2000:]}")
    return float(match.group(1))


def median(values: list[float]) -> float:
    return statistics.median(values)


PYTHON = sys.executable


def patched_mnist(limit: int):
    """``tfrepro.patch(0)`` (its warnings silenced), then TensorFlow and the example's digits
    (offline: the Keras MNIST cache or scikit-learn's digits), ``limit`` training images."""
    import warnings

    import tfrepro

    warnings.simplefilter("ignore", tfrepro.ReproducibilityWarning)
    tfrepro.patch(0)
    import tensorflow as tf

    from tfrepro.examples.datasets import load_mnist

    return tfrepro, tf, load_mnist(allow_download=False, limit=limit)
