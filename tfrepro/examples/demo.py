"""``tfrepro demo``: the classic Keras MNIST CNN, trained twice in fresh processes, compared exactly."""

from __future__ import annotations

import sys
from pathlib import Path

from tfrepro.launching.checking import CheckResult, check
from tfrepro.launching.config import LaunchConfig
from tfrepro.proof.traces import bits_float, read_trace

EXAMPLE = "tfrepro.examples.mnist_cnn"


def demo_command(*, epochs: int, limit: int, offline: bool) -> list[str]:
    command = [sys.executable, "-m", EXAMPLE, "--epochs", str(epochs), "--limit", str(limit)]
    return command + (["--offline"] if offline else [])


def run_demo(*, seed: int, patch: bool, epochs: int, limit: int, offline: bool, out: Path,
             on_run=None) -> CheckResult:
    """Train the example twice under ``tfrepro check`` semantics (two fresh interpreters)."""
    config = LaunchConfig(seed=seed, patch=patch)
    return check(demo_command(epochs=epochs, limit=limit, offline=offline), runs=2, config=config, out=out,
                 on_run=on_run)


def epoch_losses(trace_path: Path) -> list[float]:
    """The per-epoch training losses of a trace, exactly."""
    return [bits_float(r["bits"]["loss"]) for r in read_trace(trace_path, strict=False).of_type("epoch")]
