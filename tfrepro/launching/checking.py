"""``tfrepro check``: run an unmodified command N times in fresh interpreters and compare the runs.

Each run is launched like ``tfrepro run`` (or without the patch, as a negative control), with a
``ReproducibilityCallback`` attached to every ``Model.fit``; the traces go through the same
"N runs against run 0" core as ``tfrepro.verify`` (``tfrepro.proof.runs``).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tfrepro.errors import LaunchError
from tfrepro.launching.command import bootstrap_command
from tfrepro.launching.config import LaunchConfig
from tfrepro.proof.runs import RunsComparison, compare_runs


# TensorFlow's own start-up logging (absl/glog format, and the instruction-set notice).
_TF_LOG_LINE = re.compile(r"[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\]|WARNING: All log messages before absl::"
                          r"|To enable the following instructions: |WARNING:tensorflow:")


_TFREPRO_FILES = ("fit-*.jsonl", "stdout.log", "stderr.log")  # what a run writes in its folder
_GRACE_S = 2.0  # how long an interrupted child may take to exit on its own Ctrl-C before it is terminated


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: ``directory`` holds what the run wrote before it."""

    def __init__(self, index: int, directory: Path):
        self.index, self.directory = index, directory
        super().__init__(f"run {index} is incomplete ({directory})")


def clear_run_folder(directory: Path) -> None:
    """Remove the files a run writes from ``directory``, and the folder if nothing else is in it."""
    for pattern in _TFREPRO_FILES:
        for stale in directory.glob(pattern):
            stale.unlink(missing_ok=True)
    if directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()


@dataclass
class RunOutcome:
    """One run: its exit code, its folder (stdout.log, stderr.log, fit-K.jsonl) and its traces."""

    index: int
    returncode: int
    directory: Path
    traces: list[Path]

    def stderr_tail(self, lines: int = 25) -> str:
        """The end of the run's stderr without TensorFlow's start-up log lines (stderr.log keeps all)."""
        text = (self.directory / "stderr.log").read_text(errors="replace")
        return "\n".join([line for line in text.rstrip().splitlines() if not _TF_LOG_LINE.match(line)][-lines:])

    def stdout(self) -> str:
        return (self.directory / "stdout.log").read_text(errors="replace")


@dataclass
class CheckResult:
    """The runs, and their comparison once every run finished and called ``Model.fit``.
    ``failure`` says why there is no comparison: a run failed or never called ``Model.fit``."""

    runs: list[RunOutcome]
    comparison: RunsComparison | None = None
    failure: str = ""

    @property
    def identical(self) -> bool:
        return self.comparison is not None and self.comparison.identical


def run_once(command: list[str], config: LaunchConfig, directory: Path, index: int, *, record: bool = True,
             extra_env: Mapping[str, str] | None = None) -> RunOutcome:
    """Run the command once in a fresh interpreter, its output (and, with ``record``, a trace of
    every ``Model.fit``) kept in ``directory``, whose files from an earlier run are removed first:
    they would be taken for this run's. ``extra_env`` adds to the child's environment."""
    clear_run_folder(directory)
    directory.mkdir(parents=True, exist_ok=True)
    env = (dataclasses.replace(config, trace_dir=str(directory)) if record else config).to_env()
    env.update(extra_env or {})
    with (directory / "stdout.log").open("wb") as out, (directory / "stderr.log").open("wb") as err:
        child = subprocess.Popen(command, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        try:
            returncode = child.wait()
        except KeyboardInterrupt:
            try:  # a Ctrl-C at the terminal reached the child too: let it finish its own handling
                child.wait(timeout=_GRACE_S)
            except subprocess.TimeoutExpired:
                child.terminate()
                child.wait()
            raise
    traces = sorted(directory.glob("fit-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))
    return RunOutcome(index, returncode, directory, traces)


def check(
    command: list[str],
    *,
    runs: int,
    config: LaunchConfig,
    out: Path,
    on_run: Callable[[int], None] | None = None,
) -> CheckResult:
    """Run ``command`` ``runs`` times (see module doc) and compare; ``on_run(i)`` after each run.
    ``config.gradients`` records gradient fingerprints too.

    The files of an earlier check's runs in ``out`` (``run-K/``, any K) are removed first; nothing
    else is. Raises ``LaunchError`` for a command that cannot be launched, ``RunInterrupted`` at Ctrl-C.
    """
    if runs < 2:
        raise LaunchError(f"--runs must be at least 2 to compare runs; got {runs}")
    argv = bootstrap_command(command)
    for earlier in out.glob("run-*"):
        if re.fullmatch(r"run-\d+", earlier.name) and earlier.is_dir():
            clear_run_folder(earlier)
    result = CheckResult([])
    for index in range(runs):
        directory = out / f"run-{index}"
        try:
            outcome = run_once(argv, config, directory, index)
        except KeyboardInterrupt:
            raise RunInterrupted(index, directory) from None
        result.runs.append(outcome)
        if on_run is not None:
            on_run(index)
        if outcome.returncode != 0:
            result.failure = f"run {index} failed with exit code {outcome.returncode}"
            return result
        if not outcome.traces:
            result.failure = (f"run {index} never called Model.fit, so there is nothing to compare "
                              "(tfrepro check records Keras Model.fit calls)")
            return result
    result.comparison = compare_runs([outcome.traces for outcome in result.runs])
    return result
