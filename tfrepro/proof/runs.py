"""N runs against run 0: the one comparison core under ``tfrepro.verify`` (one process) and
``tfrepro check`` (fresh processes).

Run k's i-th ``Model.fit`` is compared with run 0's i-th, exactly. Runs that called ``Model.fit`` a
different number of times have diverged, whatever their common fits show.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tfrepro.proof.comparison import Comparison, compare
from tfrepro.proof.traces import PathLike, Trace


@dataclass(frozen=True)
class FitComparison:
    """Run ``run``'s ``fit``-th ``Model.fit`` call compared with run 0's."""

    run: int
    fit: int
    comparison: Comparison


@dataclass
class RunsComparison:
    """Every later run compared with run 0, fit call by fit call."""

    fits_per_run: list[int]
    fits: list[FitComparison] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return len(self.fits_per_run)

    @property
    def comparisons(self) -> list[Comparison]:
        """The comparisons in order: run 1's fits, then run 2's, ..."""
        return [fit.comparison for fit in self.fits]

    @property
    def fit_count_mismatch(self) -> str:
        """Why the runs' numbers of ``Model.fit`` calls disagree; empty when they agree."""
        first = self.fits_per_run[0] if self.fits_per_run else 0
        for run, count in enumerate(self.fits_per_run):
            if count != first:
                return f"run {run} called Model.fit {count} time(s), run 0 {first} time(s)"
        return ""

    @property
    def identical(self) -> bool:
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
            return f"identical: {self.runs} runs x {self.fits_per_run[0]} fit call(s)"
        return str(self.first_failure)


def compare_runs(traces: Sequence[Sequence[Trace | PathLike]]) -> RunsComparison:
    """Compare each run's traces (one per ``Model.fit`` call, in call order) with run 0's."""
    result = RunsComparison([len(run) for run in traces])
    for run, later in enumerate(traces[1:], start=1):
        result.fits += [FitComparison(run, fit, compare(a, b)) for fit, (a, b) in enumerate(zip(traces[0], later))]
    return result
