"""Running a sweep: in this process (``sweep``), or one fresh interpreter per seed as ``tfrepro
sweep`` does (``run_sweep``), and combining the shards of a sweep run on several machines."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tfrepro._files import write_atomically
from tfrepro.determinism.patching import patched
from tfrepro.errors import LaunchError, ReproducibilityWarning
from tfrepro.launching.checking import run_once
from tfrepro.launching.command import bootstrap_command
from tfrepro.launching.config import LaunchConfig
from tfrepro.sweeps.metrics import REPORTED, read_metric
from tfrepro.sweeps.statistics import SeedRun, SweepResult

_DONE = "done.json"  # in a seed's folder, once its run finished and its metric was read


MAX_SEEDS = 100_000


def parse_seeds(text: str) -> list[int]:
    """``"0-9"``, ``"0,3,7"`` or a mix (``"0-4,10"``) as a sorted list of distinct seeds, each a
    valid ``tfrepro.patch`` seed (0 to 2**32 - 1), at most ``MAX_SEEDS`` of them."""
    ranges = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise LaunchError(f"--seeds: {part!r} is not a seed or a range; write e.g. 0-9 or 0,3,7")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if last < first:
            raise LaunchError(f"--seeds: the range {part.strip()} runs backwards")
        if last > 2**32 - 1:
            raise LaunchError(f"--seeds: seeds must be at most 2**32 - 1 = {2**32 - 1}; got {last}")
        ranges.append((first, last))
    if sum(last - first + 1 for first, last in ranges) > MAX_SEEDS:
        raise LaunchError(f"--seeds: more than {MAX_SEEDS} seeds; split the sweep with --shard K/N")
    return sorted({seed for first, last in ranges for seed in range(first, last + 1)})


def format_seeds(seeds: Iterable[int]) -> str:
    """The inverse of ``parse_seeds``: runs of consecutive seeds as ranges (``"0-4,10"``)."""
    ranges: list[list[int]] = []
    for seed in sorted(set(seeds)):
        if ranges and seed == ranges[-1][1] + 1:
            ranges[-1][1] = seed
        else:
            ranges.append([seed, seed])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in ranges)


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"``: this machine runs every N-th seed, starting at the K-th (0-based)."""
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if match is None or not int(match.group(1)) < int(match.group(2)):
        raise LaunchError(f"--shard must be K/N with 0 <= K < N (e.g. 0/4); got {text!r}")
    return int(match.group(1)), int(match.group(2))


def sweep(train_fn: Callable[[int], float], seeds: Iterable[int], *, metric: str = "value",
          on_seed: Callable[[SeedRun], None] | None = None, **patch_options: Any) -> SweepResult:
    """Runs the same training once per seed, in this process, and collects each seed's metric.

    Each seed runs `train_fn(seed)` under `tfrepro.patched(seed, **patch_options)`, so everything
    the patch changed is restored after it. A seed whose `train_fn` raises is recorded as failed
    (with the error) and the sweep goes on. The patch's warnings are shown for the first seed only.
    Limits: one process cannot change its hash seed, so the iteration order of sets of strings does
    not follow the seed here; `tfrepro sweep` runs each seed in a fresh process.

    Args:
        train_fn: A function of the seed that trains and returns the metric, a number.
        seeds: The seeds to run, in order, each an int in [0, 2**32 - 1] (e.g. `range(10)`).
        metric: The metric's name, for the result and its printout. Defaults to `"value"`.
        on_seed: Called with each seed's `SeedRun` as soon as it finishes (e.g. to show progress),
            or None (the default).
        **patch_options: Passed on to `tfrepro.patched`: `threads`, `onednn`, `ops`, `init`.

    Returns:
        A `tfrepro.SweepResult` of one `SeedRun` per seed, failed seeds included.

    Raises:
        TypeError: `patch_options` names an option `tfrepro.patched` does not take (before any
            seed runs).

    Examples:
        >>> import numpy as np, tfrepro
        >>> result = tfrepro.sweep(lambda seed: float(np.random.random()), seeds=range(3))
        >>> len(result.values)
        3
    """
    inspect.signature(patched).bind(0, **patch_options)  # a misspelt option fails once, here
    runs = []
    for index, seed in enumerate(seeds):
        with warnings.catch_warnings():
            if index:  # the first seed's warnings (hash seed, late seeding) hold for every seed
                warnings.simplefilter("ignore", ReproducibilityWarning)
            try:
                with patched(seed, **patch_options):
                    run = SeedRun(seed, float(train_fn(seed)))
            except Exception as exc:  # a failed seed is a result too; the others still run
                run = SeedRun(seed, None, "failed", f"{type(exc).__name__}: {exc}")
        runs.append(run)
        if on_seed is not None:
            on_seed(run)
    return SweepResult(metric, runs, "returned by train_fn")


def seed_run(argv: list[str], config: LaunchConfig, folder: Path, seed: int, metric: str,
             best: str | None, extra_env: dict[str, str] | None = None) -> tuple[SeedRun, str, bool]:
    """Run one seed in a fresh interpreter, unless its folder holds a finished run of the same
    command, configuration and ``extra_env``, and read its metric. Returns the run, where its
    metric came from, and whether the finished run was reused (not run again)."""
    done = folder / _DONE
    config = dataclasses.replace(config, seed=seed)
    what_ran = {"command": argv, "config": {**config.to_env(), **(extra_env or {})}}
    reused = done.exists() and json.loads(done.read_text()) == what_ran
    if not reused:
        for stale in (done, folder / REPORTED):
            stale.unlink(missing_ok=True)
        outcome = run_once(argv, config, folder, seed, extra_env=extra_env)
        if outcome.returncode != 0:
            tail = outcome.stderr_tail(3).replace("\n", " | ")
            return SeedRun(seed, None, "failed", f"exit code {outcome.returncode}: {tail}"), "", False
        write_atomically(done, json.dumps(what_ran, indent=1))
    try:
        value, source = read_metric(folder, metric, best)
    except LookupError as exc:
        return SeedRun(seed, None, "failed", str(exc)), "", reused
    if not math.isfinite(value):
        return SeedRun(seed, None, "failed", f"{metric} is {value}"), "", reused
    return SeedRun(seed, value), source, reused


def run_sweep(command: Sequence[str], seeds: Sequence[int], *, config: LaunchConfig, out: Path,
              metric: str = "loss", best: str | None = None, jobs: int = 1,
              on_run: Callable[[SeedRun], Any] | None = None) -> SweepResult:
    """Run ``command`` once per seed, each in a fresh interpreter launched as ``tfrepro run`` does
    (``config`` with the seed replaced), ``jobs`` at a time, in ``out/seed-S``; read ``metric``
    (see ``read_metric``: reported, or the final or ``best`` epoch value of the last fit), and
    save ``sweep.json``/``sweep.csv`` in ``out``. Seeds whose folder holds a finished run of the same
    command and configuration are not run again, so an interrupted sweep rerun with the same ``out``
    picks up where it stopped; the result's ``skipped`` lists them. A metric that is NaN or
    infinite fails its seed. Each shard of a sweep needs an ``out`` of its own (``sweep.json`` holds
    the seeds of one invocation).

    Raises ``LaunchError`` for a command that cannot be launched or bad arguments."""
    if jobs < 1:
        raise LaunchError(f"--jobs must be at least 1; got {jobs}")
    if best not in (None, "min", "max"):
        raise LaunchError(f"best must be min or max; got {best!r}")
    if not seeds:
        raise LaunchError("no seeds to run (an empty --seeds, or a shard with none)")
    argv = bootstrap_command(list(command))
    out.mkdir(parents=True, exist_ok=True)

    def one(seed: int) -> tuple[SeedRun, str, bool]:
        outcome = seed_run(argv, config, out / f"seed-{seed}", seed, metric, best)
        if on_run is not None:
            on_run(outcome[0])
        return outcome

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        outcomes = list(pool.map(one, seeds))
    sources = sorted({source for _, source, _ in outcomes if source})
    result = SweepResult(metric, [run for run, _, _ in outcomes], "; ".join(sources),
                         [run.seed for run, _, reused in outcomes if reused])
    result.save(out)
    return result


def merge_sweeps(folders: Sequence[Path]) -> SweepResult:
    """One result from the ``sweep.json`` of each shard's folder. The shards must sweep the same
    metric; a seed found in two shards must have the same outcome there."""
    if not folders:
        raise LaunchError("merge needs at least one sweep folder")
    merged: dict[int, SeedRun] = {}
    metric = source = None
    for folder in folders:
        path = Path(folder) / "sweep.json"
        if not path.is_file():
            raise LaunchError(f"{folder} holds no sweep.json: give the --out folders of `tfrepro sweep`")
        try:
            shard = SweepResult.from_dict(json.loads(path.read_text()))
        except ValueError as exc:  # JSONDecodeError too
            raise LaunchError(f"{path} is not a tfrepro sweep result: {exc}") from exc
        if metric is not None and shard.metric != metric:
            raise LaunchError(f"the shards sweep different metrics: {metric!r} and {shard.metric!r} ({folder})")
        metric, source = shard.metric, source or shard.source
        for run in shard.runs:
            if run.seed in merged and merged[run.seed] != run:
                raise LaunchError(f"seed {run.seed} has different results in two shards ({folder})")
            merged[run.seed] = run
    return SweepResult(metric or "", list(merged.values()), source or "")
