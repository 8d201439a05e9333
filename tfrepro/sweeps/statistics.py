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
    """One seed's outcome: its metric value, or why there is none.

    Attributes:
        seed: The seed the run was patched with.
        value: The metric's value, or None when the seed failed.
        status: `"ok"` or `"failed"`.
        detail: Why the seed failed (the error, or the exit code and the end of its stderr); empty
            when it did not.
    """

    seed: int
    value: float | None
    status: str = "ok"
    detail: str = ""


@dataclass(frozen=True)
class Summary:
    """The spread of a sweep's values over the seeds that gave one: what `SweepResult.summary` returns.

    Attributes:
        n: The number of values.
        mean: Their mean.
        std: Their sample standard deviation (0.0 for one value).
        min: The lowest value.
        max: The highest value.
        ci_low: The lower end of the Student's t `confidence` interval for the mean; None below
            two values. Equal to the mean when every value is the same.
        ci_high: The upper end of that interval; None below two values.
        confidence: The interval's confidence level, e.g. 0.95.
    """

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
    """The per-seed values of one metric: what `tfrepro.sweep` and `tfrepro sweep` produce.

    `print(result)` shows a table of the seeds and the summary; `summary()` gives the mean, spread
    and a confidence interval; `tfrepro.compare_sweeps` says whether two results differ beyond seed
    noise. Make one from plain values with `SweepResult.of(values)`.

    Attributes:
        metric: The name of the metric, e.g. `"val_accuracy"`.
        runs: One `SeedRun` per seed, sorted by seed (failed seeds included).
        source: How the values were read, e.g. `"returned by train_fn"` or `"reported by the
            script"`.
        skipped: The seeds that `tfrepro sweep` did not run again, their finished runs being in its
            folder already. Not saved, and not part of equality.

    Raises:
        TypeError: An item of `runs` is not a `SeedRun` (use `SweepResult.of` for plain values).
    """

    metric: str
    runs: list[SeedRun] = field(default_factory=list)
    source: str = ""
    skipped: list[int] = field(default_factory=list, compare=False)

    def __post_init__(self) -> None:
        if any(not isinstance(run, SeedRun) for run in self.runs):
            raise TypeError("SweepResult.runs holds SeedRun(seed, value) items; for plain values use "
                            "SweepResult.of(values, metric)")
        self.runs = sorted(self.runs, key=lambda run: run.seed)

    @classmethod
    def of(cls, values: Iterable[float], metric: str = "value") -> SweepResult:
        """Makes a result from plain per-seed values.

        Args:
            values: One number per seed, for seeds 0, 1, ... in order.
            metric: The metric's name. Defaults to `"value"`.

        Returns:
            A `SweepResult` whose every run is "ok".
        """
        return cls(metric, [SeedRun(seed, float(value)) for seed, value in enumerate(values)])

    @property
    def values(self) -> np.ndarray:
        """The values of the seeds that gave one, in seed order, as a 1-D float array."""
        return np.array([run.value for run in self.runs if run.status == "ok"], dtype=float)

    @property
    def failed(self) -> list[SeedRun]:
        """The runs of the seeds that failed, in seed order."""
        return [run for run in self.runs if run.status != "ok"]

    def summary(self, confidence: float = 0.95) -> Summary:
        """Summarises the values: mean, sample standard deviation, range and a confidence interval.

        The interval is Student's t interval for the mean, over the seeds that gave a value; failed
        seeds are left out.

        Args:
            confidence: The interval's confidence level, strictly between 0 and 1. Defaults to
                0.95.

        Returns:
            A `Summary`; its interval is None when only one seed gave a value.

        Raises:
            ValueError: No seed gave a value, or `confidence` is not strictly between 0 and 1
                (checked when two or more seeds gave a value).
            ImportError: SciPy is missing (`pip install 'tfrepro[sweep]'`), needed for two or more
                values that differ.
        """
        values = self.values
        if not len(values):
            raise ValueError(f"no seed gave a value of {self.metric!r}; failed: {[run.seed for run in self.failed]}")
        low, high = mean_interval(values, confidence) if len(values) > 1 else (None, None)
        std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        return Summary(len(values), float(np.mean(values)), std, float(np.min(values)), float(np.max(values)),
                       low, high, confidence)

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-serialisable data, as `sweep.json` holds it.

        Returns:
            A dict with `"metric"`, `"source"` and `"runs"` (one dict per seed: `seed`, `value`,
            `status`, `detail`). `skipped` is not included.
        """
        return {"metric": self.metric, "source": self.source, "runs": [asdict(run) for run in self.runs]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepResult:
        """Makes a result from what `to_dict` returned (or `sweep.json` holds).

        Args:
            data: A dict as `to_dict` returns it.

        Returns:
            The `SweepResult`.

        Raises:
            ValueError: `data` is not such a dict (a key missing, a value of the wrong type).
        """
        try:
            runs = [SeedRun(int(run["seed"]), None if run["value"] is None else float(run["value"]),
                            str(run.get("status", "ok")), str(run.get("detail", ""))) for run in data["runs"]]
            return cls(str(data["metric"]), runs, str(data.get("source", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a tfrepro sweep result ({type(exc).__name__}: {exc})") from exc

    def to_csv(self) -> str:
        """The result as CSV text, as `sweep.csv` holds it.

        Returns:
            A header line (`seed`, the metric's name, `status`, `detail`), then one line per seed;
            the value is empty for a failed seed, and exact (`repr`) otherwise.
        """
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["seed", self.metric, "status", "detail"])
        for run in self.runs:
            writer.writerow([run.seed, "" if run.value is None else repr(run.value), run.status, run.detail])
        return out.getvalue()

    def save(self, folder: str | os.PathLike) -> None:
        """Writes `sweep.json` and `sweep.csv` into a folder.

        Each file is written atomically: a reader sees an old or a whole new file. The two are
        written one after the other, not together.

        Args:
            folder: The folder (a `str` or `os.PathLike`); made, with its parents, if missing.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / "sweep.json", json.dumps(self.to_dict(), indent=1, allow_nan=False))
        write_atomically(folder / "sweep.csv", self.to_csv())

    def __str__(self) -> str:
        lines = [f"{'seed':>6}  {self.metric}"]
        lines += [f"{run.seed:>6}  {run.value!r}" if run.status == "ok" else f"{run.seed:>6}  {run.status}: {run.detail}"
                  for run in self.runs]
        if len(self.values):
            lines.append(str(self.summary()))
        return "\n".join(lines)


MIN_SEEDS = 2
"""Seeds per arm below which ``compare_sweeps`` answers "too few seeds to tell": one value has no
spread, so nothing measures the seed noise the difference would be judged against."""


@dataclass(frozen=True)
class SweepComparison:
    """Whether sweep B's mean differs from sweep A's beyond seed noise: what `compare_sweeps` returns.

    The interval is Welch's t interval (unequal variances, Welch-Satterthwaite degrees of freedom),
    and the p-value the Welch t-test of the same statistic, so the interval excludes 0 exactly when
    p < 1 - confidence. `print()` it for the verdict in words.

    Attributes:
        metric: The metric compared (A's name for it; `"value"` for plain values).
        n_a: The number of values in A.
        n_b: The number of values in B.
        difference: mean(B) - mean(A).
        ci_low: The lower end of the Welch t interval of `difference`; None when seed noise could
            not be measured.
        ci_high: The upper end of that interval, or None.
        p_value: The Welch t-test's two-sided p-value, or None.
        effect_size: Hedges' g: the difference in pooled standard deviations, corrected for small
            samples; or None.
        confidence: The interval's confidence level, e.g. 0.95.
        distinguishable: True or False when seed noise could be measured; None when it could not
            (fewer than `MIN_SEEDS` seeds in an arm, or neither arm varying across its seeds).
            Two arms that gave one and the same value in every seed are identical: False.
        goal: `"min"` or `"max"` when the verdict says which direction is better, else None.
        mean_a: The mean of A.
        mean_b: The mean of B.
    """

    metric: str
    n_a: int
    n_b: int
    difference: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    effect_size: float | None
    confidence: float
    distinguishable: bool | None
    goal: str | None
    mean_a: float
    mean_b: float

    @property
    def verdict(self) -> str:
        """The comparison in one sentence: distinguishable or not, in which direction, and the numbers."""
        if min(self.n_a, self.n_b) < MIN_SEEDS:
            return (f"too few seeds to tell: A has {self.n_a}, B has {self.n_b}; at least {MIN_SEEDS} per arm "
                    f"are needed to measure seed noise (difference of means {self.difference:+.4g})")
        if self.p_value is None:
            if self.difference == 0:
                return (f"A and B are identical: every seed gave {self.mean_a:.6g} in both "
                        f"({self.n_a} vs {self.n_b} seeds)")
            return (f"neither A nor B varied across seeds (A gave {self.mean_a:.6g} in all {self.n_a} seeds, "
                    f"B {self.mean_b:.6g} in all {self.n_b}), so there is no seed noise to judge their "
                    f"difference {self.difference:+.4g} against: no interval or p-value. Does the seed reach "
                    "the training, and does the metric resolve what it changes?")
        interval = (f"difference of means {self.difference:+.4g} ({self.confidence:.0%} CI (Welch t) "
                    f"[{self.ci_low:+.4g}, {self.ci_high:+.4g}]), Welch p={self.p_value:.3g}, "
                    f"Hedges' g={self.effect_size:+.2f}, {self.n_a} vs {self.n_b} seeds")
        if not self.distinguishable:
            return f"B is not distinguishable from A beyond seed noise: {interval}"
        direction = "higher" if self.difference > 0 else "lower"
        better = "" if self.goal is None else (" (better)" if (self.goal == "max") == (self.difference > 0) else " (worse)")
        return f"B's {self.metric} is {direction} than A's{better} beyond seed noise: {interval}"

    def __str__(self) -> str:
        return self.verdict


def _values(sweep: SweepResult | Iterable[float], name: str) -> np.ndarray:
    try:
        values = sweep.values if isinstance(sweep, SweepResult) else np.asarray(list(sweep), dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a sweep is a SweepResult or a sequence of numbers; got {sweep!r}") from exc
    if values.ndim != 1:
        raise ValueError(f"a sweep is one value per seed (1-D); got shape {values.shape}")
    if not len(values):
        raise ValueError(f"sweep {name} has no values (did every seed fail?)")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"sweep {name} holds a value that is not finite: {values.tolist()}")
    return values


def compare_sweeps(a: SweepResult | Any, b: SweepResult | Any, *, confidence: float = 0.95,
                   goal: str | None = None) -> SweepComparison:
    """Tells whether configuration B differs from A beyond seed noise.

    The interval is Welch's t interval of the difference of means, whose coverage holds at the few
    seeds sweeps have: over 1,000 simulated comparisons of normal arms with unequal spreads, the
    95% interval held the true difference in 97.2%, 96.1%, 95.0% and 94.2% of them at 2, 3, 5 and
    10 seeds per arm (tests/sweeps/test_statistics.py). At 2 seeds it is honest but wide. There is
    no bootstrap: its BCa interval covered only 67-92% at those sizes, and where it becomes accurate
    (tens of seeds) it agrees with Welch's, so it would only add a second, worse answer. The result
    is deterministic (no resampling).

    Fewer than `MIN_SEEDS` values in an arm, or no spread in either arm, give a verdict that says
    so, never "distinguishable" (see `SweepComparison`). Failed seeds of a `SweepResult` are left
    out.

    Args:
        a: Sweep A, the baseline: a `SweepResult` or a sequence of per-seed values.
        b: Sweep B, the same. Two `SweepResult`s must measure the same metric.
        confidence: The interval's confidence level, strictly between 0 and 1. Defaults to 0.95.
        goal: Which direction is better, for the verdict: `"min"` (a loss), `"max"` (an accuracy),
            or None (the default) to say only higher or lower.

    Returns:
        A `SweepComparison`: the difference of means, its interval, the p-value, the effect size,
        `distinguishable`, and the verdict in words.

    Raises:
        ValueError: `goal` or `confidence` is out of range, the sweeps measure different metrics, a
            sweep has no values, is not 1-D, or holds a value that is not finite.
        TypeError: A sweep is neither a `SweepResult` nor a sequence of numbers.
        ImportError: SciPy is missing (`pip install 'tfrepro[sweep]'`), needed once both arms
            have at least `MIN_SEEDS` values and one of them varies.
    """
    if goal not in (None, "min", "max"):
        raise ValueError(f"goal must be 'min', 'max' or None; got {goal!r}")
    _check_confidence(confidence)
    if isinstance(a, SweepResult) and isinstance(b, SweepResult) and a.metric != b.metric:
        raise ValueError(f"the sweeps measure different metrics: {a.metric!r} and {b.metric!r}")
    values_a, values_b = _values(a, "A"), _values(b, "B")
    n_a, n_b = len(values_a), len(values_b)
    mean_a, mean_b = float(np.mean(values_a)), float(np.mean(values_b))
    difference = mean_b - mean_a
    metric = a.metric if isinstance(a, SweepResult) else "value"
    unmeasured = dict(ci_low=None, ci_high=None, p_value=None, effect_size=None)
    if min(n_a, n_b) < MIN_SEEDS:
        return SweepComparison(metric, n_a, n_b, difference, **unmeasured, confidence=confidence,
                               distinguishable=None, goal=goal, mean_a=mean_a, mean_b=mean_b)
    var_a, var_b = float(np.var(values_a, ddof=1)), float(np.var(values_b, ddof=1))
    share_a, share_b = var_a / n_a, var_b / n_b
    spread = share_a**2 / (n_a - 1) + share_b**2 / (n_b - 1)
    if spread == 0:  # no spread in either arm (or one too small to square in floating point)
        return SweepComparison(metric, n_a, n_b, difference, **unmeasured, confidence=confidence,
                               distinguishable=None if difference else False, goal=goal, mean_a=mean_a, mean_b=mean_b)
    stats = _scipy_stats()
    error = math.sqrt(share_a + share_b)
    freedom = (share_a + share_b) ** 2 / spread  # Welch-Satterthwaite
    half = float(stats.t.ppf(0.5 + confidence / 2, freedom)) * error
    p_value = float(2 * stats.t.sf(abs(difference) / error, freedom))
    pooled = math.sqrt(((n_a - 1) * var_a + (n_b - 1) * var_b) / (n_a + n_b - 2))
    effect = difference / pooled * (1 - 3 / (4 * (n_a + n_b) - 9))
    low, high = difference - half, difference + half
    return SweepComparison(metric, n_a, n_b, difference, low, high, p_value, effect, confidence,
                           not low <= 0 <= high, goal, mean_a, mean_b)
