"""A run's metric: reported by the script (``report_metric``) or read from its ``Model.fit`` trace.
TF-free: reporting and reading need only JSON."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from tfrepro._files import write_atomically
from tfrepro.launching.config import ENV_NAMES
from tfrepro.proof.traces import bits_float, read_trace

REPORTED = "metrics.json"  # in the run's trace folder


def report_metric(name: str, value: float) -> None:
    """Reports a script's result (e.g. a final test accuracy) to `tfrepro sweep`.

    `tfrepro sweep --metric NAME` reads it, in preference to the value its trace logged. Outside a
    tfrepro launcher this does nothing, so scripts may call it unconditionally. Reporting a name
    again replaces its value. The file is rewritten atomically: a crash never leaves half of it.

    Args:
        name: The metric's name, a non-empty string, as `--metric` names it.
        value: Its value, anything `float()` takes; NaN and infinities are kept (and fail the
            seed in the sweep).

    Raises:
        ValueError: `name` is not a non-empty string, or `value` is a string that is no number.
        TypeError: `value` cannot be converted to a float.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"the metric name must be a non-empty string; got {name!r}")
    value = float(value)
    folder = os.environ.get(ENV_NAMES["trace_dir"])
    if not folder:
        return
    path = Path(folder) / REPORTED
    reported = json.loads(path.read_text()) if path.exists() else {}
    reported[name] = value if math.isfinite(value) else repr(value)
    write_atomically(path, json.dumps(reported, indent=1, sort_keys=True))


def read_metric(folder: Path, name: str, best: str | None = None) -> tuple[float, str]:
    """The run's ``name``: what the script reported, else from its last ``Model.fit`` trace, the
    final epoch's value (``best=None``) or the lowest/highest over the epochs (``best="min"|"max"``).
    Returns (value, where it came from). Raises ``LookupError`` saying what the run has."""
    reported_path = folder / REPORTED
    reported = json.loads(reported_path.read_text()) if reported_path.exists() else {}
    if name in reported:
        return float(reported[name]), "reported by the script"
    traces = sorted(folder.glob("fit-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))
    epochs = read_trace(traces[-1], strict=False).of_type("epoch") if traces else []
    series = [bits_float(record["bits"][name]) for record in epochs if name in record.get("bits", {})]
    if not series:
        logged = sorted({key for record in epochs for key in record.get("bits", {})})
        raise LookupError(f"no metric {name!r}: the script reported {sorted(reported) or 'none'}, and its last "
                          f"Model.fit logged {logged or 'no epochs'}")
    if best is None:
        return series[-1], f"final epoch ({len(series)}) of the last Model.fit"
    pick = min if best == "min" else max
    return pick(series), f"{'lowest' if best == 'min' else 'highest'} over {len(series)} epochs of the last Model.fit"
