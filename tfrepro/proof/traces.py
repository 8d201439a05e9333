"""Trace files: JSON Lines, one record per event, flushed as written.

Records (each a JSON object with a ``type``):

- ``header``: format name and version, environment fingerprint, seed, ``tfrepro.status()``, and
  the model summary (layers; variables with their layer, shape and dtype), in model order.
- ``batch``: ``epoch``, ``batch``, ``step``; ``logs`` (Keras's batch logs, which are running means
  over the epoch so far, as decimals for people and pandas) and ``bits`` (the same values as the
  hex of their IEEE-754 float64 bits: the exact values that comparisons use); ``weights``
  (per-variable fingerprints, when recorded at this batch).
- ``epoch``: ``epoch``, ``logs``/``bits`` (validation metrics included), ``layers`` (per-layer
  fingerprints) and ``weights``.
- ``end``: the final ``weights`` and ``layers``.

A trace is only ever parsed as JSON: never executed, never unpickled. ``pandas.read_json(path,
lines=True)`` reads it as a table.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

FORMAT = "tfrepro-trace"
VERSION = 2  # 2: fingerprints are two keyed, mixed 32-bit lanes
RECORD_TYPES = ("header", "batch", "epoch", "end")
PathLike = str | os.PathLike


class TraceError(ValueError):
    """A trace file is unusable at a given line: not JSON, not a tfrepro trace, or truncated.

    Raised by `tfrepro.read_trace` (and so by `tfrepro.compare`); its message names the file and
    the line.

    Args:
        path: The trace file, or None when the records came from elsewhere.
        line: The 1-based line number of the bad record.
        message: What is wrong with that line.

    Attributes:
        path: The `path` passed in.
        line: The `line` passed in.
        reason: The `message` passed in, without the file and line.
    """

    def __init__(self, path: PathLike | None, line: int, message: str):
        self.path, self.line, self.reason = path, line, message
        where = f"{path}, line {line}" if path is not None else f"line {line}"
        super().__init__(f"{where}: {message}")


def float_bits(value: float) -> str:
    """The exact IEEE-754 float64 bits of ``value`` as 16 hex digits (lossless, NaN payloads too)."""
    return struct.pack(">d", value).hex()


def bits_float(bits: str) -> float:
    return struct.unpack(">d", bytes.fromhex(bits))[0]


def encode_logs(logs: Mapping[str, Any] | None) -> tuple[dict[str, float | None], dict[str, str]]:
    """Keras logs as (decimal values for reading, exact float64 bits for comparing). Non-scalar
    entries are skipped; non-finite values appear as null among the decimals, exactly in the bits."""
    import numpy as np

    values: dict[str, float | None] = {}
    bits: dict[str, str] = {}
    for key, raw in sorted((logs or {}).items()):
        try:
            array = np.asarray(raw)
        except Exception:
            continue
        if array.shape != () or not np.issubdtype(array.dtype, np.number):
            continue
        value = float(array)
        values[key] = value if math.isfinite(value) else None
        bits[key] = float_bits(value)
    return values, bits


class TraceWriter:
    """Writes records to a JSON Lines file, flushing after each one, so a crash loses nothing
    written before it. Use as a context manager or call ``close()``."""

    def __init__(self, path: PathLike):
        self.path = Path(path)
        if self.path.parent != Path("") and not self.path.parent.exists():
            raise FileNotFoundError(f"trace directory does not exist: {self.path.parent}")
        self._file: IO[str] | None = self.path.open("w", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        if self._file is None:
            raise ValueError(f"trace {self.path} is closed")
        self._file.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Trace:
    """A parsed trace: its header and records, as `tfrepro.read_trace` returns it.

    `len(trace)` is the number of records after the header, and iterating over it yields them in
    order. The record types and their keys are described in `tfrepro.proof.traces`.

    Attributes:
        header: The header record: format and version, environment fingerprint, seed, status and
            the model summary (`variables`, `layers`).
        records: Every record after the header, in the order written, as dicts.
        path: The file it was read from, as a string; None for a trace made in memory.
        error: The `TraceError` of a cut last line that ended a lenient read
            (`read_trace(path, strict=False)`); None when the whole file was read.
    """

    header: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)  # everything after the header
    path: str | None = None
    error: TraceError | None = None

    @property
    def variables(self) -> list[dict[str, Any]]:
        """The model's weight variables, in model order: dicts with `name`, `layer`, `shape` and `dtype`."""
        return self.header.get("model", {}).get("variables", [])

    @property
    def layers(self) -> list[str]:
        """The names of the model's layers, in model order."""
        return self.header.get("model", {}).get("layers", [])

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        """The records of one type.

        Args:
            kind: The record type: `"batch"`, `"epoch"` or `"end"`.

        Returns:
            The records whose `type` is `kind`, in the order written (a list of dicts; empty when
            there are none).
        """
        return [r for r in self.records if r.get("type") == kind]

    @property
    def complete(self) -> bool:
        """True when the run reached train end: the last record is an end record and nothing was cut."""
        return self.error is None and bool(self.records) and self.records[-1].get("type") == "end"

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)


def read_trace(path: PathLike, *, strict: bool = True) -> Trace:
    """Reads a trace file, as `ReproducibilityCallback(trace=...)` writes it.

    A trace is only ever parsed as JSON: never executed, never unpickled. Records are written whole
    and flushed, so a crash can only cut the last line; whether that is an error is up to `strict`.

    Args:
        path: The trace file (a `str` or `os.PathLike`).
        strict: True (the default): any bad line raises. False: a cut last line (unparsable, or
            without its newline) ends the read, the records before it are returned and the error is
            kept in `Trace.error`. A bad line before the last is corruption and raises either way.

    Returns:
        The `tfrepro.Trace`: its header, its records, and `error` for a lenient read of a cut file.

    Raises:
        FileNotFoundError: `path` does not exist.
        IsADirectoryError: `path` is a folder (the message names traces inside it, if any).
        TraceError: The file is empty, not a tfrepro trace or of an unsupported trace version, or a
            line is bad (see `strict`); the message names the file and the line.
    """
    path = Path(path)
    if path.is_dir():
        inside = sorted(str(p.relative_to(path)) for p in path.rglob("*.jsonl"))[:3]
        hint = f"; the traces in it include {', '.join(inside)}" if inside else "; it holds no .jsonl traces"
        raise IsADirectoryError(f"{path} is a directory, not a trace file{hint}")
    if not path.is_file():
        raise FileNotFoundError(f"trace not found: {path}")
    with path.open(encoding="utf-8", errors="replace") as file:
        lines = [(number, line) for number, line in enumerate(file, start=1) if line.strip()]
    header: dict[str, Any] | None = None
    records: list[dict[str, Any]] = []
    error: TraceError | None = None
    for position, (number, line) in enumerate(lines):
        last = position == len(lines) - 1
        try:
            record = _parse_record(line)
        except ValueError as exc:
            cut = last and (not line.endswith("\n") or str(exc).startswith("not valid JSON"))
            error = TraceError(path, number, f"{exc}; the run may have crashed while writing it" if cut else str(exc))
            if header is None or strict or not cut:
                raise error from None
            break
        if header is None:
            if record.get("type") != "header" or record.get("format") != FORMAT:
                raise TraceError(path, number, f"not a {FORMAT} file (its first record is no tfrepro header)")
            if record.get("version") != VERSION:
                raise TraceError(path, number, f"unsupported trace version {record.get('version')!r}; "
                                               f"this tfrepro reads version {VERSION}")
            header = record
        else:
            records.append(record)
    if header is None:
        raise TraceError(path, 1, "empty file: no tfrepro header")
    return Trace(header, records, str(path), error)


def _parse_record(line: str) -> dict[str, Any]:
    """One line as a trace record; ValueError saying what is wrong with it."""
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(record, dict) or record.get("type") not in RECORD_TYPES:
        raise ValueError("not a tfrepro trace record")
    if not line.endswith("\n"):
        raise ValueError("truncated record: the line has no end")
    return record
