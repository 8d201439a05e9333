"""The figures: ``plot_runs``, ``plot_sweeps`` and ``plot_tuning``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tfrepro.proof.comparison import compare
from tfrepro.proof.traces import Trace, bits_float, read_trace
from tfrepro.sweeps.statistics import SweepResult, mean_interval
from tfrepro.tuning.racing import TuningResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _new_figure(width: float, height: float) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install 'tfrepro[plot]'") from exc
    return Figure(figsize=(width, height), layout="constrained")


def _series(trace: Trace, metric: str) -> tuple[list[int], list[float], str]:
    """(steps, values, record type) of ``metric``: per batch where recorded, else per epoch."""
    for kind in ("batch", "epoch"):
        records = [r for r in trace.of_type(kind) if metric in r.get("bits", {})]
        if records:
            return [r["step"] for r in records], [bits_float(r["bits"][metric]) for r in records], kind
    return [], [], ""


def plot_runs(traces: Sequence[str | os.PathLike], *, metric: str = "loss",
              labels: Sequence[str] | None = None) -> Figure:
    """Plots a metric over training steps for several runs, overlaid, marking where each diverges.

    Each trace is drawn as one line (the first solid, the others dashed), per batch where the traces
    recorded batches, per epoch otherwise. Each later run's first divergence from the first run
    (see `tfrepro.compare`) is marked by a dotted vertical line at its step, labelled. The figure is
    built without pyplot (no global state): show it in a notebook or `figure.savefig(path)`.

    Args:
        traces: The trace files to plot (paths, as `ReproducibilityCallback(trace=...)` writes
            them), a list of at least one; the first is the reference for the divergences. Traces
            whose last line was cut are read up to it.
        metric: The logged quantity to plot, e.g. `"loss"` (the default) or `"accuracy"`. Traces
            that did not log it are left out.
        labels: One legend label per trace, or None (the default) for the files' names.

    Returns:
        A `matplotlib.figure.Figure` with one axes.

    Raises:
        TypeError: `traces` is a single path, not a list of them.
        ValueError: `traces` is empty, `labels` does not match it in length, or no trace logged
            `metric`.
        ImportError: matplotlib is missing (`pip install 'tfrepro[plot]'`).
        FileNotFoundError: A trace file does not exist.
        TraceError: A file is not a tfrepro trace, or is corrupt before its last line.
    """
    if isinstance(traces, (str, os.PathLike)):
        raise TypeError("plot_runs takes a list of trace paths, e.g. plot_runs([a, b])")
    traces = list(traces)
    if not traces:
        raise ValueError("plot_runs needs at least one trace")
    labels = list(labels) if labels is not None else [os.path.basename(os.fspath(t)) for t in traces]
    if len(labels) != len(traces):
        raise ValueError(f"{len(labels)} labels for {len(traces)} traces")
    figure = _new_figure(7, 4)
    axes = figure.subplots()
    kinds = []
    for index, (path, label) in enumerate(zip(traces, labels)):
        steps, values, kind = _series(read_trace(path, strict=False), metric)
        if not steps:
            continue
        kinds.append(kind)
        line, = axes.plot(steps, values, label=label, alpha=0.85, linewidth=1.2,
                          linestyle="-" if index == 0 else "--")
        if index:
            divergence = compare(traces[0], path).divergence
            if divergence is not None and divergence.step is not None:
                axes.axvline(divergence.step, color=line.get_color(), linestyle=":", linewidth=1.5)
                axes.annotate(f"{label} diverges: step {divergence.step}", (divergence.step, np.nanmax(values)),
                              fontsize=8, color=line.get_color(), rotation=90, va="top", ha="right")
    if not kinds:
        raise ValueError(f"no trace records {metric!r}")
    axes.set_xlabel("step")
    axes.set_ylabel(metric)
    axes.set_title(f"{metric} per {' / '.join(sorted(set(kinds)))}: {len(kinds)} runs")
    axes.legend(fontsize=8)
    return figure


def plot_sweeps(*sweeps: SweepResult | Sequence[float], labels: Sequence[str] | None = None) -> Figure:
    """Plots the per-seed values of one or more sweeps side by side.

    Each sweep is a box plot (quartiles) with every seed's value drawn over it, and, for two or more
    seeds, its mean with a 95% confidence interval (Student's t). The points' horizontal jitter is
    fixed, so the figure is reproducible too. Built without pyplot (no global state): show it in a
    notebook or `figure.savefig(path)`.

    Args:
        *sweeps: The sweeps, each a `tfrepro.SweepResult` (its failed seeds are left out) or a
            sequence of per-seed values; at least one.
        labels: One label per sweep, or None (the default) for A, B, C, ...

    Returns:
        A `matplotlib.figure.Figure` with one axes, its y axis labelled with the first sweep's
        metric.

    Raises:
        ValueError: No sweep is given, a sweep has no values or a value that is not finite, or
            `labels` does not match the sweeps in length.
        TypeError: A sweep is neither a `SweepResult` nor a sequence of numbers.
        ImportError: matplotlib is missing (`pip install 'tfrepro[plot]'`), or SciPy, which the
            confidence intervals need (`pip install 'tfrepro[sweep]'`).
    """
    if not sweeps:
        raise ValueError("plot_sweeps needs at least one sweep")
    results = [s if isinstance(s, SweepResult) else SweepResult.of(_numbers(s)) for s in sweeps]
    values = [result.values for result in results]
    if any(not len(v) or not np.all(np.isfinite(v)) for v in values):
        raise ValueError("every sweep needs at least one value, all finite")
    labels = list(labels) if labels is not None else [chr(ord("A") + i) for i in range(len(sweeps))]
    if len(labels) != len(sweeps):
        raise ValueError(f"{len(labels)} labels for {len(sweeps)} sweeps")
    figure = _new_figure(max(4.5, 2.2 + 1.6 * len(sweeps)), 4)
    axes = figure.subplots()
    positions = np.arange(1, len(values) + 1)
    axes.boxplot(values, positions=positions, widths=0.5, showfliers=False)
    jitter = np.random.default_rng(0)  # a fixed spread of the points: the figure is reproducible too
    for position, group in zip(positions, values):
        axes.scatter(position + jitter.uniform(-0.12, 0.12, len(group)), group, s=14, alpha=0.7, zorder=3)
        if len(group) > 1:
            mean = float(np.mean(group))
            low, high = mean_interval(group)
            axes.errorbar(position + 0.32, mean, yerr=[[mean - low], [high - mean]], fmt="D", color="black",
                          markersize=4, capsize=3)
    axes.set_xticks(positions, labels)
    metric = next((r.metric for r in results if r.metric), "value")
    axes.set_ylabel(metric)
    axes.set_title(f"{metric} over seeds")
    axes.set_xlabel("box: quartiles; dots: seeds; diamond: mean with 95% CI", fontsize=8)
    return figure


_STANDING_COLOURS = {"best": "tab:green", "tied": "tab:blue", "worse": "tab:red", "eliminated": "tab:orange",
                     "unmeasured": "tab:gray"}


def plot_tuning(result: TuningResult) -> Figure:
    """Plots a race: each configuration's per-seed scores, its mean and interval, and its standing.

    One row per measured configuration, best first: a dot per seed, the mean with its Student's t
    interval at the result's confidence, coloured by standing (best, tied with it, worse beyond
    seed noise, eliminated, unmeasured). A dotted line marks the best mean. Built without pyplot.

    Args:
        result: A `tfrepro.tuning.TuningResult` (from `race` or `RacingSearch.search`).

    Returns:
        A `matplotlib.figure.Figure` with one axes; the configurations are its y tick labels.

    Raises:
        ValueError: No configuration has a score (all failed).
        TypeError: `result` is not a `TuningResult`.
        ImportError: matplotlib is missing (`pip install 'tfrepro[plot]'`), or SciPy
            (`pip install 'tfrepro[sweep]'`).
    """
    if not isinstance(result, TuningResult):
        raise TypeError(f"plot_tuning takes a tfrepro.tuning.TuningResult; got {type(result).__name__}")
    rows = [c for c in result.ranking if c.scores and c.status != "failed"]
    if not rows:
        raise ValueError("no configuration has a score to plot (did every one fail?)")
    figure = _new_figure(8, 1.2 + 0.45 * len(rows))
    axes = figure.subplots()
    jitter = np.random.default_rng(0)  # a fixed spread: the figure is reproducible too
    for row, candidate in enumerate(reversed(rows)):
        colour = _STANDING_COLOURS.get(candidate.status, "black")
        values = candidate.values
        axes.scatter(values, row + jitter.uniform(-0.12, 0.12, len(values)), s=12, alpha=0.6, color=colour)
        interval = candidate.interval(result.confidence)
        if interval is not None:
            axes.errorbar(candidate.mean, row, xerr=[[candidate.mean - interval[0]], [interval[1] - candidate.mean]],
                          fmt="D", color=colour, markersize=5, capsize=3)
    if result.best is not None:
        axes.axvline(result.best.mean, color="tab:green", linestyle=":", linewidth=1)
    axes.set_yticks(range(len(rows)), [f"{c.name} ({len(c.scores)} seeds) {c.status}" for c in reversed(rows)],
                    fontsize=8)
    axes.set_xlabel(f"{result.metric} ({'higher' if result.goal == 'max' else 'lower'} is better); "
                    f"dots: seeds; diamond: mean with {result.confidence:.0%} CI")
    axes.set_title(f"{len(rows)} configurations over seeds: {result.spent} fits")
    return figure


def _numbers(sweep: object) -> list[float]:
    try:
        return [float(value) for value in sweep]  # type: ignore[union-attr]
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a sweep is a SweepResult or a sequence of numbers; got {sweep!r}") from exc
