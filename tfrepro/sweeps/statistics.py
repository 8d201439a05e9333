"""A sweep's results, their spread, and the comparison of two sweeps (SciPy: the ``sweep`` extra)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tfrepro._files import write_atomically


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1 (0.95 for 95%); got {confidence!r}")


def mean_interval(values: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Student's t interval for the mean of two or more values ([mean, mean] when they are equal)."""
    _check_confidence(confidence)
    mean, std = float(np.mean(values)), float(np.std(values, ddof=1))
    if std == 0:
        return mean, mean
    low, high = _scipy_stats().t.interval(confidence, len(values) - 1, loc=mean, scale=std / math.sqrt(len(values)))
    return float(low), float(high)


def _scipy_stats():
    try:
        from scipy import stats
    except ImportError as exc:
        raise ImportError("seed statistics need SciPy: pip install 'tfrepro[sweep]'") from exc
    return stats


@dataclass(frozen=True)
class SeedRun:
    """One seed's outcome: its metric value, or why there is none (``status`` "ok" or "failed")."""

    seed: int
    value: float | None
    status: str = "ok"
    detail: str = ""


@dataclass(frozen=True)
class Summary:
    """Mean, sample standard deviation, range and a ``confidence`` interval for the mean (Student's
    t; None below two values) of the seeds that gave a value."""

    n: int
    mean: float
    std: float
    min: float
    max: float
    ci_low: float | None
    ci_high: float | None
    confidence: float

    def __str__(self) -> str:
        interval = "n/a (one value)" if self.ci_low is None else f"[{self.ci_low:.6g}, {self.ci_high:.6g}]"
        return (f"n={self.n} mean={self.mean:.6g} std={self.std:.6g} min={self.min:.6g} max={self.max:.6g} "
                f"{self.confidence:.0%} CI of the mean {interval}")


@dataclass
class SweepResult:
    """The per-seed values of one metric (``source`` says how each was read)."""

    metric: str
    runs: list[SeedRun] = field(default_factory=list)
    source: str = ""

    def __post_init__(self) -> None:
        if any(not isinstance(run, SeedRun) for run in self.runs):
            raise TypeError("SweepResult.runs holds SeedRun(seed, value) items; for plain values use "
                            "SweepResult.of(values, metric)")
        self.runs = sorted(self.runs, key=lambda run: run.seed)

    @classmethod
    def of(cls, values: Iterable[float], metric: str = "value") -> SweepResult:
        """A result from plain per-seed values (seeds 0, 1, ...)."""
        return cls(metric, [SeedRun(seed, float(value)) for seed, value in enumerate(values)])

    @property
    def values(self) -> np.ndarray:
        return np.array([run.value for run in self.runs if run.status == "ok"], dtype=float)

    @property
    def failed(self) -> list[SeedRun]:
        return [run for run in self.runs if run.status != "ok"]

    def summary(self, confidence: float = 0.95) -> Summary:
        values = self.values
        if not len(values):
            raise ValueError(f"no seed gave a value of {self.metric!r}; failed: {[run.seed for run in self.failed]}")
        low, high = mean_interval(values, confidence) if len(values) > 1 else (None, None)
        std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        return Summary(len(values), float(np.mean(values)), std, float(np.min(values)), float(np.max(values)),
                       low, high, confidence)

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "source": self.source, "runs": [asdict(run) for run in self.runs]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepResult:
        """The inverse of ``to_dict``; ValueError for anything else."""
        try:
            runs = [SeedRun(int(run["seed"]), None if run["value"] is None else float(run["value"]),
                            str(run.get("status", "ok")), str(run.get("detail", ""))) for run in data["runs"]]
            return cls(str(data["metric"]), runs, str(data.get("source", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a tfrepro sweep result ({type(exc).__name__}: {exc})") from exc

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["seed", self.metric, "status", "detail"])
        for run in self.runs:
            writer.writerow([run.seed, "" if run.value is None else repr(run.value), run.status, run.detail])
        return out.getvalue()

    def save(self, folder: str | os.PathLike) -> None:
        """``sweep.json`` and ``sweep.csv`` in ``folder``, each written atomically (a reader sees an
        old or a whole new file; the two are written one after the other)."""
        folder = Path(folder)
        write_atomically(folder / "sweep.json", json.dumps(self.to_dict(), indent=1, allow_nan=False))
        write_atomically(folder / "sweep.csv", self.to_csv())

    def __str__(self) -> str:
        lines = [f"{'seed':>6}  {self.metric}"]
        lines += [f"{run.seed:>6}  {run.value!r}" if run.status == "ok" else f"{run.seed:>6}  {run.status}: {run.detail}"
                  for run in self.runs]
        if len(self.values):
            lines.append(str(self.summary()))
        return "\n".join(lines)


@dataclass(frozen=True)
class SweepComparison:
    """Whether sweep B's mean differs from sweep A's beyond seed noise.

    ``difference`` is mean(B) - mean(A); ``ci_low``/``ci_high`` its bootstrap interval;
    ``p_value`` Welch's t-test (unequal variances); ``effect_size`` Hedges' g (the difference in
    pooled standard deviations, corrected for small samples). ``distinguishable`` needs both the
    test (p < 1 - confidence) and the interval (excluding 0) to agree."""

    metric: str
    n_a: int
    n_b: int
    difference: float
    ci_low: float
    ci_high: float
    p_value: float
    effect_size: float
    confidence: float
    distinguishable: bool
    goal: str | None

    @property
    def verdict(self) -> str:
        interval = (f"difference of means {self.difference:+.4g} ({self.confidence:.0%} CI "
                    f"[{self.ci_low:+.4g}, {self.ci_high:+.4g}]), Welch p={self.p_value:.3g}, "
                    f"Hedges' g={self.effect_size:+.2f}, {self.n_a} vs {self.n_b} seeds")
        if not self.distinguishable:
            return f"B is not distinguishable from A beyond seed noise: {interval}"
        direction = "higher" if self.difference > 0 else "lower"
        better = "" if self.goal is None else (" (better)" if (self.goal == "max") == (self.difference > 0) else " (worse)")
        return f"B's {self.metric} is {direction} than A's{better} beyond seed noise: {interval}"

    def __str__(self) -> str:
        return self.verdict


def _values(sweep: SweepResult | Iterable[float]) -> np.ndarray:
    try:
        values = sweep.values if isinstance(sweep, SweepResult) else np.asarray(list(sweep), dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a sweep is a SweepResult or a sequence of numbers; got {sweep!r}") from exc
    if values.ndim != 1:
        raise ValueError(f"a sweep is one value per seed (1-D); got shape {values.shape}")
    if len(values) < 2 or not np.all(np.isfinite(values)):
        raise ValueError("each sweep needs at least two values to compare, all finite")
    return values


def compare_sweeps(a: SweepResult | Any, b: SweepResult | Any, *, confidence: float = 0.95,
                   goal: str | None = None, resamples: int = 9999, seed: int = 0) -> SweepComparison:
    """Is configuration B different from A beyond seed noise? ``a`` and ``b``: ``SweepResult``s or
    sequences of per-seed values. ``goal`` ("min" or "max") says which direction is better, for the
    verdict. The bootstrap (SciPy's BCa, ``resamples`` draws, seeded by ``seed``) is itself
    reproducible."""
    if goal not in (None, "min", "max"):
        raise ValueError(f"goal must be 'min', 'max' or None; got {goal!r}")
    _check_confidence(confidence)
    if isinstance(a, SweepResult) and isinstance(b, SweepResult) and a.metric != b.metric:
        raise ValueError(f"the sweeps measure different metrics: {a.metric!r} and {b.metric!r}")
    stats = _scipy_stats()
    values_a, values_b = _values(a), _values(b)
    difference = float(np.mean(values_b) - np.mean(values_a))
    if np.ptp(values_a) == 0 and np.ptp(values_b) == 0:  # no seed noise at all: any difference is real
        p_value = 1.0 if difference == 0 else 0.0
        low = high = difference
    else:
        p_value = float(stats.ttest_ind(values_b, values_a, equal_var=False).pvalue)

        def mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
            return np.mean(x, axis=axis) - np.mean(y, axis=axis)

        # BCa's jackknife holds n x n values: past a few thousand seeds, the percentile interval.
        method = "BCa" if len(values_a) + len(values_b) <= 2000 else "percentile"
        interval = stats.bootstrap((values_b, values_a), mean_difference, confidence_level=confidence,
                                   n_resamples=resamples, batch=max(1, 2_000_000 // (len(values_a) + len(values_b))),
                                   method=method, random_state=np.random.default_rng(seed)).confidence_interval
        low, high = float(interval.low), float(interval.high)
    n_a, n_b = len(values_a), len(values_b)
    pooled = math.sqrt(((n_a - 1) * np.var(values_a, ddof=1) + (n_b - 1) * np.var(values_b, ddof=1)) / (n_a + n_b - 2))
    correction = 1 - 3 / (4 * (n_a + n_b) - 9)
    effect = difference / pooled * correction if pooled > 0 else (0.0 if difference == 0 else math.copysign(math.inf, difference))
    distinguishable = p_value < 1 - confidence and math.isfinite(low) and math.isfinite(high) and not low <= 0 <= high
    metric = a.metric if isinstance(a, SweepResult) else "value"
    return SweepComparison(metric, n_a, n_b, difference, low, high, p_value, float(effect), confidence,
                           distinguishable, goal)
