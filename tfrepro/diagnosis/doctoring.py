"""``tfrepro doctor``: ``tfrepro.diagnose`` on the first ``Model.fit`` of an unmodified script, or on
every one.

The parent (``doctor``) launches the script as ``tfrepro run`` would (patched unless told not to),
through this module's ``main``, which wraps the launcher's bootstrap: the first ``Model.fit`` is
diagnosed on its own model and first batch, the diagnosis is written atomically to
``diagnosis.json``, and the script stops there (or, with ``keep_going``, trains on). With
``every_fit`` the script trains on and each later ``fit`` K is diagnosed the same way, to
``diagnosis-K.json``. The parent reads the diagnoses back; a script that fails or never calls
``fit`` is said so.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfrepro._files import write_atomically
from tfrepro.diagnosis.findings import Diagnosis
from tfrepro.launching import bootstrap
from tfrepro.launching.checking import RunOutcome, run_once
from tfrepro.launching.command import bootstrap_command
from tfrepro.launching.config import LaunchConfig
from tfrepro.proof.fit_recording import intercept_fits

REPORT = "diagnosis.json"
_ENV = {"report": "TFREPRO_DOCTOR_REPORT", "repeats": "TFREPRO_DOCTOR_REPEATS",
        "keep_going": "TFREPRO_DOCTOR_CONTINUE", "every_fit": "TFREPRO_DOCTOR_EVERY_FIT",
        "tf_version": "TFREPRO_DOCTOR_TF_VERSION"}


def report_path(first: Path, fit: int) -> Path:
    """Where the diagnosis of the script's ``fit``-th ``Model.fit`` goes: ``first`` for the first."""
    return first if fit == 0 else first.with_name(f"{first.stem}-{fit}{first.suffix}")


@dataclass(frozen=True)
class DoctorOptions:
    """What the child does at the first ``Model.fit``; passed to it in the environment."""

    report: str
    repeats: int = 3
    keep_going: bool = False
    tf_version: str | None = None
    every_fit: bool = False

    def to_env(self) -> dict[str, str]:
        env = {_ENV["report"]: self.report, _ENV["repeats"]: str(self.repeats),
               _ENV["keep_going"]: "1" if self.keep_going else "0", _ENV["every_fit"]: "1" if self.every_fit else "0"}
        if self.tf_version:
            env[_ENV["tf_version"]] = self.tf_version
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DoctorOptions:
        environ = os.environ if environ is None else environ
        return cls(environ[_ENV["report"]], int(environ.get(_ENV["repeats"], "3")),
                   environ.get(_ENV["keep_going"]) == "1", environ.get(_ENV["tf_version"]) or None,
                   environ.get(_ENV["every_fit"]) == "1")


def main(argv: list[str]) -> None:
    """The child's entry point (see ``tfrepro.launching.command.bootstrap_code``)."""
    options = DoctorOptions.from_env()
    bootstrap.main(argv, around=lambda: _diagnose_first_fit(options))


@contextlib.contextmanager
def _diagnose_first_fit(options: DoctorOptions) -> Iterator[None]:
    from tfrepro.diagnosis.diagnosing import diagnose

    done = []

    def handle(original: Callable[..., Any], bound: inspect.BoundArguments) -> Any:
        if done and not options.every_fit:
            return original(*bound.args, **bound.kwargs)
        report = report_path(Path(options.report), len(done))
        done.append(True)
        given = bound.arguments
        x = given.get("x")
        if hasattr(x, "__next__") and not hasattr(x, "element_spec"):  # an iterator: fit gets back what we read
            first = next(x)
            given["x"] = _rejoined(first, x)
            x = iter([first])
        try:
            diagnosis = diagnose(given["self"], x, given.get("y"), options.repeats,
                                 sample_weight=given.get("sample_weight"), batch_size=given.get("batch_size"),
                                 tf_version=options.tf_version)
            payload: dict[str, Any] = {"diagnosis": diagnosis.to_dict()}
        except Exception as exc:  # reported to the parent, which exits 2 with it; the traceback goes to the log
            logging.getLogger(__name__).exception("tfrepro doctor: the diagnosis failed")
            payload = {"error": f"{type(exc).__name__}: {exc}"}
        write_atomically(report, json.dumps(payload, indent=1))
        if not (options.keep_going or options.every_fit) or "error" in payload:
            sys.stdout.flush()
            raise SystemExit(0)
        return original(*bound.args, **bound.kwargs)

    with intercept_fits(handle):
        yield


def _rejoined(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    """A generator (what Keras accepts) yielding ``first`` and then the rest of the iterator."""
    yield first
    yield from rest


@dataclass
class DoctorResult:
    """The script's run and its diagnosis (the first fit's; ``diagnoses`` holds every fit's that was
    diagnosed), or why there is none, or why the diagnoses stop short (``failure``)."""

    run: RunOutcome
    diagnosis: Diagnosis | None = None
    failure: str = ""
    report: Path | None = None
    diagnoses: list[Diagnosis] = field(default_factory=list)  # one per Model.fit diagnosed, in order

    @property
    def clean(self) -> bool:
        """Whether every fit diagnosed is clean (and there was one)."""
        return bool(self.diagnoses) and all(diagnosis.clean for diagnosis in self.diagnoses)


def doctor(command: list[str], *, config: LaunchConfig, out: Path, repeats: int = 3, keep_going: bool = False,
           tf_version: str | None = None, every_fit: bool = False) -> DoctorResult:
    """Run ``command`` (a Python command, as for ``tfrepro run``) and diagnose its first
    ``Model.fit``, or every one (``every_fit``, which lets the script train on); see the module doc.
    Raises ``LaunchError`` for a command that cannot be launched."""
    argv = bootstrap_command(command, entry=__name__)
    report = out / REPORT
    for stale in [report, *(p for p in out.glob(f"{report.stem}-*{report.suffix}")
                            if p.stem.rpartition("-")[2].isdigit())]:
        stale.unlink(missing_ok=True)
    options = DoctorOptions(str(report.resolve()), repeats, keep_going, tf_version, every_fit)
    run = run_once(argv, config, out, 0, record=False, extra_env=options.to_env())
    if not report.exists():
        if run.returncode != 0:
            return DoctorResult(run, failure=f"the script failed with exit code {run.returncode} before its first "
                                             "Model.fit")
        return DoctorResult(run, failure="the script never called Model.fit, so there is nothing to diagnose "
                                         "(tfrepro doctor diagnoses the first Keras Model.fit)")
    diagnoses = []
    while report_path(report, len(diagnoses)).exists():
        payload = json.loads(report_path(report, len(diagnoses)).read_text())
        if "error" in payload:
            where = f" of Model.fit call {len(diagnoses)}" if diagnoses else ""
            return DoctorResult(run, diagnoses[0] if diagnoses else None, report=report, diagnoses=diagnoses,
                                failure=f"the diagnosis{where} failed: {payload['error']}")
        diagnoses.append(Diagnosis.from_dict(payload["diagnosis"]))
    result = DoctorResult(run, diagnoses[0], report=report, diagnoses=diagnoses)
    if run.returncode != 0:
        result.failure = f"the script went on after the diagnosis and then failed with exit code {run.returncode}"
    return result
