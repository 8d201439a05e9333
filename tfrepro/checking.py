"""``tfrepro check``: run an unmodified script N times and name the first divergence.

Each run is a fresh interpreter launched like ``tfrepro run`` (or without the patch, as a negative
control), with a ``ReproducibilityCallback`` attached to every ``Model.fit``. Every run's traces
are compared with the first run's.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tfrepro import launch
from tfrepro.comparison import Comparison, compare

EXIT_IDENTICAL, EXIT_DIVERGED, EXIT_FAILED = 0, 1, 2


@dataclass
class RunOutcome:
    """One run: its exit code, its folder (stdout.log, stderr.log, fit-K.jsonl) and its traces."""

    index: int
    returncode: int
    directory: Path
    traces: list[Path]

    def stderr_tail(self, lines: int = 25) -> str:
        text = (self.directory / "stderr.log").read_text(errors="replace")
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def stdout(self) -> str:
        return (self.directory / "stdout.log").read_text(errors="replace")


@dataclass
class CheckResult:
    """All runs and the comparisons of each later run's fits with the first run's."""

    runs: list[RunOutcome]
    comparisons: list[tuple[int, int, Comparison]] = field(default_factory=list)  # (run, fit, comparison)
    problem: str = ""  # why the runs could not be compared (exit 2) or compared unequal in shape

    @property
    def exit_code(self) -> int:
        if self.problem and not self.comparisons:
            return EXIT_FAILED
        if self.problem or any(not c.identical for _, _, c in self.comparisons):
            return EXIT_DIVERGED
        return EXIT_IDENTICAL

    @property
    def first_divergence(self) -> tuple[int, int, Comparison] | None:
        return next(((r, f, c) for r, f, c in self.comparisons if not c.identical), None)


def run_once(command: list[str], config: launch.LaunchConfig, directory: Path, index: int,
             gradients: bool = False) -> RunOutcome:
    """Run the command once in a fresh interpreter, its output and traces kept in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    env = launch.child_env(config)
    env["TFREPRO_TRACE_DIR"] = str(directory)
    env["TFREPRO_GRADIENTS"] = "1" if gradients else "0"
    with (directory / "stdout.log").open("wb") as out, (directory / "stderr.log").open("wb") as err:
        child = subprocess.Popen(command, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        try:
            returncode = child.wait()
        except KeyboardInterrupt:
            child.terminate()
            child.wait()
            raise
    traces = sorted(directory.glob("fit-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))
    return RunOutcome(index, returncode, directory, traces)


def check(
    command: list[str],
    *,
    runs: int,
    config: launch.LaunchConfig,
    out: Path,
    gradients: bool = False,
    on_run: Callable[[int], None] | None = None,
) -> CheckResult:
    """Run ``command`` ``runs`` times (see module doc) and compare; ``on_run(i)`` after each run.
    ``gradients=True`` records gradient fingerprints too.

    Raises ``launch.LaunchError`` for a command that cannot be launched.
    """
    if runs < 2:
        raise launch.LaunchError(f"--runs must be at least 2 to compare runs; got {runs}")
    argv = launch.bootstrap_command(command)
    result = CheckResult([])
    for index in range(runs):
        outcome = run_once(argv, config, out / f"run-{index}", index, gradients)
        result.runs.append(outcome)
        if on_run is not None:
            on_run(index)
        if outcome.returncode != 0:
            result.problem = f"run {index} failed with exit code {outcome.returncode}"
            return result
        if not outcome.traces:
            result.problem = (f"run {index} never called Model.fit, so there is nothing to compare "
                              "(tfrepro check records Keras Model.fit calls)")
            return result
    first = result.runs[0]
    for outcome in result.runs[1:]:
        if len(outcome.traces) != len(first.traces):
            result.problem = (f"run {outcome.index} called Model.fit {len(outcome.traces)} time(s), "
                              f"run 0 {len(first.traces)} time(s)")
        for fit_index, (a, b) in enumerate(zip(first.traces, outcome.traces)):
            result.comparisons.append((outcome.index, fit_index, compare(a, b)))
    return result
