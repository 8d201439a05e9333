"""What ``tfrepro.diagnose`` reports: findings by layer, each with a severity, what was found and the
fix, and the ``Diagnosis`` that holds them (printable, rich-renderable, ``to_dict``/``from_dict``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# Severity, most serious first. The first five are problems; they and "not examined" make a diagnosis unclean.
SEVERITIES = {
    "nondeterministic": "varied between repeats of the same step (measured)",
    "raises": "raised UnimplementedError under op determinism when the step ran here",
    "raises on GPU": "has no deterministic GPU kernel in this TensorFlow: UnimplementedError under op determinism",
    "nondeterministic on GPU": "runs an order-dependent GPU kernel in this TensorFlow, even under op determinism",
    "risk": "a setting, input pipeline or code that makes runs differ, or that op determinism does not cover",
    "not examined": "a part the diagnosis could not compare, so it cannot vouch for it",
    "downstream": "varied, but only because what it received varied",
    "handled": "would be a problem; tfrepro already replaced it",
    "note": "worth knowing; not a reproducibility problem",
}
PROBLEMS = ("nondeterministic", "raises", "raises on GPU", "nondeterministic on GPU", "risk")


@dataclass(frozen=True)
class Finding:
    """One finding of `tfrepro.diagnose`: where, what, and the fix.

    Frozen; `Diagnosis.from_dict` rebuilds findings from `asdict`'s dicts.

    Attributes:
        severity: How serious it is, one of `SEVERITIES` (most serious first): "nondeterministic",
            "raises", "raises on GPU", "nondeterministic on GPU" and "risk" are problems; "not
            examined" leaves a diagnosis unclean; "downstream", "handled" and "note" are not
            problems.
        where: A layer path (`model/block/dense`), or one of "optimizer", "loss", "train step",
            "input pipeline", "configuration", `"metric: NAME"`.
        finding: What was found, in a sentence.
        fix: What to do about it (empty when nothing is to be done).
        check: Which part found it: "dynamic" (repeats of a step), "ops" (the traced step's ops
            against the kernel table), "layers", "pipeline", "configuration".
        details: Machine-readable details (the op type, the kernel fact, how many repeats
            differed, ...), JSON-serialisable.

    Raises:
        ValueError: `severity` is not one of `SEVERITIES`.
    """

    severity: str
    where: str
    finding: str
    fix: str = ""
    check: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}; one of {', '.join(SEVERITIES)}")

    @property
    def problem(self) -> bool:
        """Whether the finding is a problem: its severity makes runs differ, or may (`PROBLEMS`)."""
        return self.severity in PROBLEMS


@dataclass
class Diagnosis:
    """What `tfrepro.diagnose` found in a model: its findings, most serious first.

    Within a severity the findings are in execution or model order. `clean` is true when none is a
    problem and every part was examined (only notes, handled ops, or nothing). `str()` gives a
    plain-text report, rich renders a table, and `to_dict`/`from_dict` round-trip it through JSON.

    Attributes:
        findings: The `Finding`s, most serious first.
        model: The model's class and name (`Sequential 'sequential'`).
        tf_version: The TensorFlow version the ops were scanned against.
        keras_version: The Keras version that ran the step.
        repeats: How many times the step ran for the dynamic bisection (0: the static scan only).
        seconds: How long each part took, by name ("scan", "bisection").
    """

    findings: list[Finding]
    model: str = ""
    tf_version: str = ""
    keras_version: str = ""
    repeats: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """Whether nothing was found that makes runs differ, and every part was examined."""
        return not self.problems and not self.where("not examined")

    @property
    def problems(self) -> list[Finding]:
        """The findings that are problems (`Finding.problem`), most serious first."""
        return [f for f in self.findings if f.problem]

    @property
    def first_nondeterministic(self) -> Finding | None:
        """The first layer (or the optimizer, or the loss) in execution order that varied by itself."""
        return next((f for f in self.findings if f.severity == "nondeterministic"), None)

    def where(self, severity: str | None = None) -> list[str]:
        """Lists where the findings are, in report order.

        Args:
            severity: Only the findings of this severity (one of `SEVERITIES`); `None`: all.

        Returns:
            The `where` of each finding (a layer path, "optimizer", ...), in report order.
        """
        return [f.where for f in self.findings if severity is None or f.severity == severity]

    def to_dict(self) -> dict[str, Any]:
        """Returns the diagnosis as JSON-serialisable data, as `tfrepro doctor` writes it to `diagnosis.json`.

        Returns:
            A dict of `clean`, the other fields, and `findings` as a list of dicts.
        """
        return {"clean": self.clean, "model": self.model, "tf_version": self.tf_version,
                "keras_version": self.keras_version, "repeats": self.repeats, "seconds": dict(self.seconds),
                "findings": [asdict(f) for f in self.findings]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Diagnosis:
        """Rebuilds a diagnosis from what `to_dict` returned (or its JSON round trip).

        Args:
            data: A dict as `to_dict` makes it; only `findings` is required.

        Returns:
            The `Diagnosis`.

        Raises:
            ValueError: `data` is not a tfrepro diagnosis: no `findings`, or a finding with missing
                or unknown fields or an unknown severity.
        """
        try:
            findings = [Finding(**entry) for entry in data["findings"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a tfrepro diagnosis: {exc}") from exc
        return cls(findings, data.get("model", ""), data.get("tf_version", ""), data.get("keras_version", ""),
                   int(data.get("repeats", 0)), dict(data.get("seconds", {})))

    def summary(self) -> str:
        """Summarises the diagnosis in one line: clean or not, the findings by severity, the model
        and versions.

        Returns:
            The line, e.g. `clean: nothing found that makes runs differ (no findings); Sequential
                'sequential', TF 2.16.1, Keras 3.3.3, 3 repeats of one step`.
        """
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f.severity] = counts.get(f.severity, 0) + 1
        unexamined = len(self.where("not examined"))
        head = "clean: nothing found that makes runs differ" if self.clean else \
            f"{len(self.problems)} problem(s) found" if self.problems else \
            f"no problem found in what was examined, but {unexamined} part(s) were not examined"
        parts = [f"{n} {severity}" for severity, n in counts.items()]
        checked = f"{self.model}, TF {self.tf_version}, Keras {self.keras_version}"
        repeats = f", {self.repeats} repeats of one step" if self.repeats else ", static scan only"
        return f"{head} ({', '.join(parts) or 'no findings'}); {checked}{repeats}"

    def __str__(self) -> str:
        lines = [self.summary()]
        for f in self.findings:
            lines.append(f"[{f.severity}] {f.where}: {f.finding}")
            if f.fix:
                lines.append(f"    fix: {f.fix}")
        return "\n".join(lines)

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        styles = {"nondeterministic": "bold red", "raises": "bold red", "raises on GPU": "red",
                  "nondeterministic on GPU": "red",
                  "risk": "yellow", "not examined": "yellow", "downstream": "dim", "handled": "green", "note": "dim"}
        table = Table(show_lines=False)
        for column in ("severity", "where", "finding", "fix"):
            table.add_column(column, overflow="fold")
        for f in self.findings:
            table.add_row(Text(f.severity, style=styles[f.severity]), f.where, f.finding, f.fix)
        head = Text(self.summary(), style="bold green" if self.clean else "bold red")
        return Group(head, table) if self.findings else head


def ordered(findings: Sequence[Finding]) -> list[Finding]:
    """Most serious first; within a severity, as found (execution or model order)."""
    rank = {severity: i for i, severity in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: rank[f.severity])
