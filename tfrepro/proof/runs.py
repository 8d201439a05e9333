"""N runs against run 0: the one comparison core under ``tfrepro.verify`` (one process) and
``tfrepro check`` (fresh processes), and, for ``tfrepro check --workers``, N workers against worker 0.

Run k's i-th ``Model.fit`` is compared with run 0's i-th, exactly. Runs that called ``Model.fit`` a
different number of times have diverged, whatever their common fits show. With workers, each run's
worker w is first compared with the same run's worker 0 (mirrored variables must agree on every
worker at every step), then each worker's runs with its run 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tfrepro.proof.comparison import Comparison, compare
from tfrepro.proof.traces import PathLike, Trace, read_trace


@dataclass(frozen=True)
class FitComparison:
    """Run ``run``'s ``fit``-th ``Model.fit`` call compared with run 0's (of worker ``worker``, when
    set); with ``across="workers"``, worker ``worker``'s compared with worker 0's in run ``run``."""

    run: int
    fit: int
    comparison: Comparison
    worker: int | None = None
    across: str = "runs"

    @property
    def label(self) -> str:
        """What was compared: "run 1 vs run 0", "worker 1 vs worker 0 in run 0", ..."""
        if self.across == "workers":
            return f"worker {self.worker} vs worker 0 in run {self.run}, Model.fit call {self.fit}"
        of = "" if self.worker is None else f" of worker {self.worker}"
        return f"run {self.run} vs run 0{of}, Model.fit call {self.fit}"

    @property
    def headline(self) -> str:
        """One line naming who differs from whom, where first, and in which layer."""
        divergence = self.comparison.divergence
        if self.across == "workers":
            who = f"worker {self.worker} differs from worker 0 (run {self.run}, Model.fit call {self.fit})"
        else:
            of = "" if self.worker is None else f" of worker {self.worker}"
            who = f"run {self.run}{of} differs from run 0 (Model.fit call {self.fit})"
        if divergence is None:
            return who
        where = f"{who} at {divergence.where}"
        layers = divergence.layers or divergence.gradient_layers
        return f"{where} in layer {layers[0]}" if layers else where


@dataclass
class RunsComparison:
    """Every later run compared with run 0, fit call by fit call."""

    fits_per_run: list[int]
    fits: list[FitComparison] = field(default_factory=list)
    workers: int = 1
    count_mismatch: str = ""  # between the workers of a run
    communicated: bool = True  # False: the workers built no MultiWorkerMirroredStrategy (each trained alone)

    @property
    def runs(self) -> int:
        """The number of runs compared, run 0 included."""
        return len(self.fits_per_run)

    @property
    def comparisons(self) -> list[Comparison]:
        """The comparisons in order: run 1's fits, then run 2's, ..."""
        return [fit.comparison for fit in self.fits]

    @property
    def fit_count_mismatch(self) -> str:
        """Why the runs' (or workers') numbers of ``Model.fit`` calls disagree; empty when they agree."""
        if self.count_mismatch:
            return self.count_mismatch
        first = self.fits_per_run[0] if self.fits_per_run else 0
        for run, count in enumerate(self.fits_per_run):
            if count != first:
                return f"run {run} called Model.fit {count} time(s), run 0 {first} time(s)"
        return ""

    @property
    def identical(self) -> bool:
        """True when every run called `Model.fit` as often as run 0 and every fit is identical to run 0's."""
        return not self.fit_count_mismatch and all(c.identical for c in self.comparisons)

    @property
    def first_divergence(self) -> FitComparison | None:
        """The first fit call, in run order, that differs from run 0's."""
        return next((fit for fit in self.fits if not fit.comparison.identical), None)

    @property
    def first_failure(self) -> Comparison | None:
        """The comparison of ``first_divergence``."""
        first = self.first_divergence
        return None if first is None else first.comparison

    def __str__(self) -> str:
        if self.fit_count_mismatch:
            return f"diverged: {self.fit_count_mismatch}"
        if self.identical:
            workers = f" x {self.workers} workers" if self.workers > 1 else ""
            return f"identical: {self.runs} runs{workers} x {self.fits_per_run[0]} fit call(s)" + (
                "" if self.communicated else f"\n{ALONE}")
        return f"{self.first_divergence.headline}\n{self.first_failure}"


ALONE = ("note: no worker built a MultiWorkerMirroredStrategy, so the workers never communicated: each trained "
         "alone, and agreeing shows only that each is reproducible; build and compile the model in the strategy's "
         "scope to train them together")


def compare_runs(traces: Sequence[Sequence[Trace | PathLike]]) -> RunsComparison:
    """Compare each run's traces (one per ``Model.fit`` call, in call order) with run 0's."""
    result = RunsComparison([len(run) for run in traces])
    for run, later in enumerate(traces[1:], start=1):
        result.fits += [FitComparison(run, fit, compare(a, b)) for fit, (a, b) in enumerate(zip(traces[0], later))]
    return result


def compare_workers(traces: Sequence[Sequence[Sequence[Trace | PathLike]]]) -> RunsComparison:
    """``traces[run][worker]``: that worker's traces, one per ``Model.fit`` call. Within each run,
    every worker is compared with worker 0; then each worker's runs with its run 0. The comparisons
    between workers come first, so ``first_divergence`` names a disagreement between workers before
    one between runs."""
    workers = {len(run) for run in traces}
    if len(workers) != 1:
        raise ValueError(f"every run needs the same number of workers; got {sorted(workers)}")
    result = RunsComparison([len(run[0]) for run in traces], workers=workers.pop())
    for run, per_worker in enumerate(traces):
        for worker, fits in enumerate(per_worker[1:], start=1):
            if len(fits) != len(per_worker[0]) and not result.count_mismatch:
                result.count_mismatch = (f"worker {worker} called Model.fit {len(fits)} time(s) in run {run}, "
                                         f"worker 0 {len(per_worker[0])} time(s)")
            result.fits += [FitComparison(run, fit, compare(a, b), worker, "workers")
                            for fit, (a, b) in enumerate(zip(per_worker[0], fits))]
    for worker in range(result.workers):
        later_runs = compare_runs([run[worker] for run in traces])
        result.fits += [FitComparison(fit.run, fit.fit, fit.comparison, worker) for fit in later_runs.fits]
    if result.workers > 1:
        result.communicated = any(_built_a_strategy(trace) for worker in traces[0] for trace in worker)
    return result


def _built_a_strategy(trace: Trace | PathLike) -> bool:
    """Whether a MultiWorkerMirroredStrategy existed when the trace's ``fit`` began: the header names
    the collectives of every one built under ``patch`` (without a patch nothing records them, and
    this answers True: unknown)."""
    header = (trace if isinstance(trace, Trace) else read_trace(trace, strict=False)).header
    if header.get("seed") is None:
        return True
    return bool(header.get("environment", {}).get("distribution", {}).get("collectives"))
