"""``tfrepro demo``: the Keras MNIST CNN trained twice in fresh processes, in three arms, compared
exactly: no seeds; seeds set the usual way; ``tfrepro.patch``."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tfrepro.determinism.switches import DETERMINISM_ENV
from tfrepro.launching.checking import CheckResult, check
from tfrepro.launching.config import LaunchConfig
from tfrepro.proof.traces import bits_float, read_trace

EXAMPLE = "tfrepro.examples.mnist_cnn"
ARMS = ("no-seeds", "seeds", "patch")


@dataclass(frozen=True)
class Arm:
    """One way of running the example: a label, how it is launched, and what to expect of it."""

    name: str
    label: str
    config: LaunchConfig
    script_args: tuple[str, ...]
    expectation: str


def arm(name: str, seed: int) -> Arm:
    if name == "no-seeds":
        return Arm(name, "no seeds", LaunchConfig(patch=False), (),
                   "differs on any hardware: initial weights, dropout, shuffling and augmentation are unseeded")
    if name == "seeds":
        return Arm(name, f"seeds only (keras.utils.set_random_seed({seed}))", LaunchConfig(patch=False),
                   ("--seed", str(seed)),
                   "the augmentation's random numbers go to the images in thread order (a parallel map); on a "
                   "GPU, seeds also leave cuDNN's algorithm choice and atomic sums (bias_add, segment sums) "
                   "nondeterministic")
    if name == "patch":
        return Arm(name, f"tfrepro.patch({seed})", LaunchConfig(seed=seed), (),
                   "identical on CPU and GPU: op determinism orders the map's random numbers and selects "
                   "deterministic kernels")
    raise ValueError(f"unknown arm {name!r}; choose from {', '.join(ARMS)}")


def demo_command(*, epochs: int, limit: int, offline: bool, script_args: tuple[str, ...] = ()) -> list[str]:
    command = [sys.executable, "-m", EXAMPLE, "--epochs", str(epochs), "--limit", str(limit), *script_args]
    return command + (["--offline"] if offline else [])


# What the control arms run without, whatever the caller's environment holds: TF's determinism switches
# (TF_DETERMINISTIC_OPS=1 would make the arm "seeds only" deterministic on a CPU, and "no seeds" fail at
# its first unseeded random op) and a fixed hash seed
CONTROL_ARMS_UNSET = (*DETERMINISM_ENV, "PYTHONHASHSEED")


def run_arm(demo_arm: Arm, *, epochs: int, limit: int, offline: bool, out: Path,
            on_run: Callable[[int], None] | None = None) -> CheckResult:
    """Train the example twice in fresh interpreters as ``demo_arm`` says, and compare the runs. The
    arms without ``tfrepro.patch`` run without ``CONTROL_ARMS_UNSET`` (restored after)."""
    command = demo_command(epochs=epochs, limit=limit, offline=offline, script_args=demo_arm.script_args)
    with _unset(() if demo_arm.config.patch else CONTROL_ARMS_UNSET):
        return check(command, runs=2, config=demo_arm.config, out=out / demo_arm.name, on_run=on_run)


@contextlib.contextmanager
def _unset(names: tuple[str, ...]) -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def epoch_losses(trace_path: Path) -> list[float]:
    """The per-epoch training losses of a trace, exactly."""
    return [bits_float(r["bits"]["loss"]) for r in read_trace(trace_path, strict=False).of_type("epoch")]
