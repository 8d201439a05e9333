"""``tfrepro check``: run an unmodified command N times in fresh interpreters and compare the runs.

Each run is launched like ``tfrepro run`` (or without the patch, as a negative control), with a
``ReproducibilityCallback`` attached to every ``Model.fit``; the traces go through the same
"N runs against run 0" core as ``tfrepro.verify`` (``tfrepro.proof.runs``). With ``workers``, each
run is a localhost cluster of that many workers (``tfrepro.launching.workers``), each recording in
``run-K/worker-W/``; the workers of a run are compared with its worker 0 first.
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
from tfrepro.launching.workers import check_worker_count, launch_workers
from tfrepro.proof.runs import RunsComparison, compare_runs, compare_workers


# TensorFlow's own start-up logging (absl/glog format, and the instruction-set notice).
_TF_LOG_LINE = re.compile(r"[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\]|WARNING: All log messages before absl::"
                          r"|To enable the following instructions: |WARNING:tensorflow:")


_TFREPRO_FILES = ("fit-*.jsonl", "stdout.log", "stderr.log")  # what a run writes in its folder
_GRACE_S = 2.0
GRADIENTS_WITH_WORKERS = ("--gradients is not supported with --workers: the gradient hook wraps apply_gradients "
                          "outside strategy.run; compare the weights (the default)")  # how long an interrupted child may take to exit on its own Ctrl-C before it is terminated


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: ``directory`` holds what the run wrote before it."""

    def __init__(self, index: int, directory: Path):
        self.index, self.directory = index, directory
        super().__init__(f"run {index} is incomplete ({directory})")


def clear_run_folder(directory: Path) -> None:
    """Remove the files a run writes from ``directory`` (its workers' folders ``worker-W`` too), and
    the folder if nothing else is in it."""
    for worker in directory.glob("worker-*"):
        if re.fullmatch(r"worker-\d+", worker.name) and worker.is_dir():
            clear_run_folder(worker)
    for pattern in _TFREPRO_FILES:
        for stale in directory.glob(pattern):
            stale.unlink(missing_ok=True)
    if directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()


@dataclass
class RunOutcome:
    """One run: its exit code, its folder (stdout.log, stderr.log, fit-K.jsonl) and its traces.
    A run of several workers keeps its workers' outcomes in ``workers`` (folders ``worker-W``); its
    own exit code and traces are then those of the worker that failed first in time, else worker 0's."""

    index: int
    returncode: int
    directory: Path
    traces: list[Path]
    workers: list[RunOutcome] = dataclasses.field(default_factory=list)
    stopped_by: str = ""

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
    return RunOutcome(index, returncode, directory, _traces_in(directory))


def _traces_in(directory: Path) -> list[Path]:
    return sorted(directory.glob("fit-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))


def run_workers_once(command: list[str], config: LaunchConfig, directory: Path, index: int,
                     workers: int) -> RunOutcome:
    """Run the command once as ``workers`` localhost workers, worker W recording in
    ``directory/worker-W`` (cleared first). The workers' lines are not echoed."""
    folders = [directory / f"worker-{worker}" for worker in range(workers)]
    for folder in folders:
        clear_run_folder(folder)
    envs = [dataclasses.replace(config, trace_dir=str(folder)).to_env() for folder in folders]
    outcome = launch_workers(command, envs, folders=folders, echo=False)
    per_worker = [RunOutcome(index, code, folder, _traces_in(folder))
                  for code, folder in zip(outcome.returncodes, folders)]
    failed = per_worker[0 if outcome.first_failed is None else outcome.first_failed]
    return RunOutcome(index, outcome.returncode, failed.directory, failed.traces, per_worker, outcome.stopped_by)


def check(
    command: list[str],
    *,
    runs: int,
    config: LaunchConfig,
    out: Path,
    on_run: Callable[[int], None] | None = None,
    workers: int | None = None,
) -> CheckResult:
    """Run ``command`` ``runs`` times (see module doc) and compare; ``on_run(i)`` after each run.
    ``config.gradients`` records gradient fingerprints too. ``workers``: each run is a cluster of that
    many localhost workers (one included: it gets a ``TF_CONFIG`` too), compared with each other and
    run to run; not with ``config.gradients``.

    The files of an earlier check's runs in ``out`` (``run-K/``, any K) are removed first; nothing
    else is. Raises ``LaunchError`` for a command that cannot be launched, ``RunInterrupted`` at Ctrl-C.
    """
    if runs < 2:
        raise LaunchError(f"--runs must be at least 2 to compare runs; got {runs}")
    if workers is not None:
        check_worker_count(workers)
        if config.gradients:
            raise LaunchError(GRADIENTS_WITH_WORKERS)
    argv = bootstrap_command(command)
    for earlier in out.glob("run-*"):
        if re.fullmatch(r"run-\d+", earlier.name) and earlier.is_dir():
            clear_run_folder(earlier)
    result = CheckResult([])
    for index in range(runs):
        directory = out / f"run-{index}"
        try:
            if workers is not None:
                outcome = run_workers_once(argv, config, directory, index, workers)
            else:
                outcome = run_once(argv, config, directory, index)
        except KeyboardInterrupt:
            raise RunInterrupted(index, directory) from None
        result.runs.append(outcome)
        if on_run is not None:
            on_run(index)
        if outcome.returncode != 0:
            first = next((w for w, run in enumerate(outcome.workers) if run.directory == outcome.directory), None)
            who = f"worker {first} of " if outcome.workers and first is not None else ""
            result.failure = f"{who}run {index} failed with exit code {outcome.returncode}"
            return result
        if not all(worker.traces for worker in outcome.workers or [outcome]):
            result.failure = (f"run {index} never called Model.fit, so there is nothing to compare "
                              "(tfrepro check records Keras Model.fit calls)")
            return result
    if workers is not None:
        result.comparison = compare_workers([[worker.traces for worker in run.workers] for run in result.runs])
    else:
        result.comparison = compare_runs([outcome.traces for outcome in result.runs])
    return result
