"""Everything the ``tfrepro`` command prints: status reports, comparisons, check, demo and sweep
results, progress. On a terminal: rich tables and a progress bar. In a pipe or a log file: plain text, never
cut or wrapped (the library objects' own ``str()``), and no progress display."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console, Group
from rich.pretty import Pretty
from rich.table import Table
from rich.text import Text

from tfrepro.determinism.reporting import Report
from tfrepro.diagnosis.doctoring import DoctorResult
from tfrepro.launching.checking import CheckResult
from tfrepro.proof.comparison import Comparison
from tfrepro.sweeps.statistics import SweepResult

T = TypeVar("T")
_REPORT_STYLE = {True: "green", False: "bold red", None: "dim"}
_VERDICT_STYLE = {"identical": "bold green", "diverged": "bold red", "not comparable": "bold yellow",
                  "failed": "bold red"}


def console() -> Console:
    """A terminal gets rich output; a pipe or file gets plain text, also where FORCE_COLOR or a
    notebook kernel's environment would make rich draw escape codes and progress bars into it."""
    interactive = sys.stdout.isatty()
    out = Console(force_terminal=None if interactive else False, force_jupyter=False)
    out.soft_wrap = not interactive  # in a pipe, lines stay whole
    return out


def show(terminal: Any, plain: str) -> None:
    """Print ``terminal`` (a rich renderable) on a terminal, else the plain text."""
    out = console()
    if out.is_terminal:
        out.print(terminal)
    else:
        out.print(plain, markup=False, highlight=False)


def report_table(report: Report) -> Table:
    table = Table(title="tfrepro status", show_lines=False)
    table.add_column("setting", no_wrap=True)
    table.add_column("state")
    table.add_column("why", ratio=1)
    for s in report.settings:
        table.add_row(s.name, Text(s.value, style=_REPORT_STYLE[s.ok]), s.why)
    return table


def comparison_view(comparison: Comparison) -> Group:
    table = Table(show_header=False, box=None)
    table.add_row("verdict", Text(comparison.verdict, style=_VERDICT_STYLE[comparison.verdict]))
    table.add_row("runs", f"A = {comparison.a}\nB = {comparison.b}")
    table.add_row("records compared", str(comparison.records_compared))
    if comparison.different_seeds:
        table.add_row("different seeds", Text(f"{comparison.different_seeds}: a difference is expected",
                                              style="yellow"))
    for m in comparison.mismatch:
        table.add_row("model mismatch", m)
    if comparison.divergence is not None:
        d = comparison.divergence
        table.add_row("first divergence", d.where)
        if d.kind in ("length", "schedule"):
            table.add_row("what happened", d.detail)
        else:
            table.add_row("differs", ", ".join(d.quantities))
        if d.layers:
            table.add_row("layers (model order)", ", ".join(d.layers))
        if d.loss_a is not None:
            delta = "identical" if d.loss_delta == 0 else f"{d.loss_delta:.3g}"
            table.add_row("loss A / B", f"{d.loss_a!r} / {d.loss_b!r} (|diff| {delta})")
    for n in comparison.notes:
        table.add_row("note", n)
    parts: list[Any] = [table]
    if comparison.environment:
        env = Table(title="environment differences")
        for column in ("key", "A", "B", "breaks bitwise?"):
            env.add_column(column)
        for d in comparison.environment:
            env.add_row(d.key, repr(d.a), repr(d.b), Text(d.why or "no", style="red" if d.breaks_bitwise else "dim"))
        parts.append(env)
        if comparison.expected and not comparison.identical:
            parts.append(Text("A difference was to be expected: the environments differ in ways that "
                              "break bitwise reproducibility.", style="yellow"))
    return Group(*parts)


def environment_view(env: dict[str, Any]) -> Pretty:
    return Pretty(env, expand_all=True)


def environment_lines(env: dict[str, Any], prefix: str = "") -> str:
    """The fingerprint as ``key: value`` lines, nested keys dotted (``tensorflow.version: 2.21.0``):
    for a log; ``--json`` gives the same as JSON."""
    lines = []
    for key, value in sorted(env.items()):
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            lines.append(environment_lines(value, f"{name}."))
        else:
            lines.append(f"{name}: {value if isinstance(value, str) else json.dumps(value)}")
    return "\n".join(lines)


def with_progress(label: str, runs: int, work: Callable[[Callable[[Any], None]], T]) -> T:
    """Run ``work(on_run)`` under a progress bar that advances once per finished run (on a terminal)."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if not console().is_terminal:
        return work(lambda index: None)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
    with Progress(*columns, console=console(), transient=True) as progress:
        task = progress.add_task(label, total=runs)
        return work(lambda index: progress.advance(task))


def _print_failure(result: CheckResult) -> None:
    """Why a checked run failed, and the end of its stderr (its log file keeps all of it)."""
    out = console()
    out.print(Text(result.failure, style="bold red"))
    failed = result.runs[-1]
    tail = failed.stderr_tail()
    if tail:
        out.print(f"last lines of run {failed.index}'s stderr ({failed.directory / 'stderr.log'}):")
        out.print(tail, markup=False, highlight=False)


def print_check(result: CheckResult, out: Path, diagnose_with: str | None = None) -> None:
    """The outcome of ``tfrepro check``/``demo``: the failed run's stderr, the first divergence
    (and ``diagnose_with``, the command that finds its cause), or the identical verdict; then where
    the traces and logs are."""
    out_console = console()
    if result.failure:
        _print_failure(result)
        return
    comparison = result.comparison
    if comparison.fit_count_mismatch:
        out_console.print(Text.assemble(("diverged:", "bold red"), f" {comparison.fit_count_mismatch}"))
    first = comparison.first_divergence
    if first is not None:
        out_console.print(Text.assemble(("diverged:", "bold red"), f" {first.headline}"))
        show(comparison_view(first.comparison), str(first.comparison))
    if first is not None and first.across == "workers":
        out_console.print("the workers disagree, and a mirrored variable must be the same bits on every worker: look "
                          "in that layer for code that runs on some workers only (a task-index branch), a variable "
                          "updated without aggregation, or a value drawn per worker and assigned to it",
                          markup=False, highlight=False)
    elif not comparison.identical and diagnose_with:
        out_console.print(f"to find the layer or op at fault: {diagnose_with}", markup=False, highlight=False)
    if comparison.identical:
        records = comparison.comparisons[0].records_compared if comparison.comparisons else 0
        workers = f"{comparison.workers} workers (each against worker 0 at every record) x " \
            if comparison.workers > 1 else ""
        out_console.print(Text.assemble(("identical:", "bold green"),
                                        f" {comparison.runs} runs x {workers}{comparison.fits_per_run[0]} Model.fit "
                                        f"call(s), {records} records each compared bit for bit"))
        if not comparison.communicated:
            from tfrepro.proof.runs import ALONE

            out_console.print(Text(ALONE, style="yellow"))
    out_console.print(f"traces and logs: {out}")


def print_doctor(result: DoctorResult, out: Path) -> None:
    """The outcome of ``tfrepro doctor``: the diagnosis, or why there is none (with the script's stderr)."""
    out_console = console()
    for fit, diagnosis in enumerate(result.diagnoses):
        if len(result.diagnoses) > 1:
            out_console.print(Text(f"Model.fit call {fit}:", style="bold"))
        show(diagnosis, str(diagnosis))
    if result.failure:
        out_console.print(Text(result.failure, style="bold red"))
        tail = result.run.stderr_tail()
        if tail and result.diagnosis is None:
            out_console.print(f"last lines of the script's stderr ({result.run.directory / 'stderr.log'}):")
            out_console.print(tail, markup=False, highlight=False)
    out_console.print(f"diagnosis and logs: {out}", markup=False, highlight=False)


def print_demo_arm(label: str, result: CheckResult, losses: list[list[float]], expectation: str) -> None:
    """One demo arm: its runs' per-epoch losses side by side, the verdict, and what to expect of it."""
    out = console()
    verdict = "failed" if result.failure else ("identical" if result.identical else "diverged")
    out.print(Text.assemble((f"{label}: ", "bold"), (verdict, _VERDICT_STYLE[verdict])))
    if len(losses) == 2:
        table = Table(title=None, box=None)
        for column in ("epoch", "run 0 loss", "run 1 loss", "same bits"):
            table.add_column(column)
        plain = []
        for epoch, (a, b) in enumerate(zip(*losses)):
            same = a.hex() == b.hex()
            table.add_row(str(epoch), repr(a), repr(b), Text("yes", style="green") if same else Text("no", style="red"))
            plain.append(f"  epoch {epoch}: run 0 loss {a!r}, run 1 loss {b!r}, same bits: {'yes' if same else 'no'}")
        show(table, "\n".join(plain))
    if result.failure:
        _print_failure(result)
    elif not result.identical and result.comparison.first_divergence is not None:
        first = result.comparison.first_divergence.comparison.divergence
        out.print(f"  first divergence: {first}", markup=False, highlight=False)
    out.print(f"  expected: {expectation}", markup=False, highlight=False, style="dim")


def sweep_table(result: SweepResult) -> Table:
    table = Table(title=f"{result.metric} over {len(result.runs)} seeds", show_lines=False)
    table.add_column("seed", justify="right")
    table.add_column(result.metric, justify="right")
    table.add_column("note")
    for run in result.runs:
        if run.status == "ok":
            table.add_row(str(run.seed), repr(run.value), "")
        else:
            table.add_row(str(run.seed), Text(run.status, style="bold red"), run.detail)
    return table


def print_sweep(result: SweepResult, out: Path | None) -> None:
    """The per-seed table, then the summary (mean, std, range, CI) and where the results are."""
    show(sweep_table(result), str(result).rsplit("\n", 1)[0] if len(result.values) else str(result))
    out_console = console()
    if len(result.values):
        out_console.print(str(result.summary()), markup=False, highlight=False)
    if result.source:
        out_console.print(f"metric: {result.source}", markup=False, highlight=False)
    if result.skipped:
        from tfrepro.sweeps.running import format_seeds

        out_console.print(f"skipped seed{'s' if len(result.skipped) > 1 else ''} {format_seeds(result.skipped)}: "
                          f"finished earlier in {out} with the same command and options", markup=False, highlight=False)
    if result.failed:
        out_console.print(Text(f"{len(result.failed)} seed(s) gave no value: "
                               + ", ".join(str(run.seed) for run in result.failed), style="bold red"))
    if out is not None:
        out_console.print(f"results (sweep.json, sweep.csv) and each seed's logs and traces: {out}", markup=False,
                          highlight=False)
