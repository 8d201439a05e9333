"""``tfrepro.compare``: are two runs identical, and if not, where did they part?

Comparison is exact: logged values by their float64 bits, weights by their fingerprints.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tfrepro.proof.environment_info import EnvDifference, environment_diff
from tfrepro.proof.traces import PathLike, Trace, bits_float, read_trace


@dataclass(frozen=True)
class Divergence:
    """The first point where two runs differ: where, what, and in which layers.

    Found by `tfrepro.compare` (in `Comparison.divergence`) and by `ReproducibilityCallback` against
    a reference (in `callback.divergence`, and in `DivergenceError.divergence`). `str(divergence)`
    says it in one line.

    Attributes:
        kind: The record type where the runs differ (`"batch"`, `"epoch"`, `"end"`); `"schedule"`
            when the runs visited different (epoch, batch) points; `"length"` when one run stopped
            earlier (identical up to there).
        epoch: The epoch of the record, or None when the record has none.
        batch: The batch index within the epoch, or None (an epoch or end record).
        step: The training step (batches since the start of `fit`), or None.
        quantities: What differs there: logged names (`"loss"` first), then `"gradients"`, then
            `"weights"`; `("schedule",)` or `("length",)` for those kinds.
        layers: The layers whose weights differ, in model order.
        variables: The names of the variables whose weights (then gradients) differ.
        loss_a: Run A's logged loss at that record (the exact float64), or None when not logged.
        loss_b: Run B's logged loss at that record, or None.
        detail: For `"schedule"` and `"length"`, what happened, in words; empty otherwise.
        gradient_layers: The layers whose gradients differ, in model order (only when gradients
            were recorded).
    """

    kind: str
    epoch: int | None
    batch: int | None
    step: int | None
    quantities: tuple[str, ...]
    layers: tuple[str, ...] = ()
    variables: tuple[str, ...] = ()
    loss_a: float | None = None
    loss_b: float | None = None
    detail: str = ""
    gradient_layers: tuple[str, ...] = ()

    @property
    def quantity(self) -> str:
        """The first quantity that differs (usually `"loss"`), or `kind` when none is named."""
        return self.quantities[0] if self.quantities else self.kind

    @property
    def loss_delta(self) -> float | None:
        """`|loss_a - loss_b|`, or None when either run logged no loss there."""
        if self.loss_a is None or self.loss_b is None:
            return None
        return abs(self.loss_a - self.loss_b)

    @property
    def where(self) -> str:
        """Where the runs differ, in words: `"epoch 0, batch 3 (step 3)"`, `"end of epoch 1"`, ..."""
        if self.kind == "batch":
            return f"epoch {self.epoch}, batch {self.batch} (step {self.step})"
        if self.kind == "epoch":
            return f"end of epoch {self.epoch}"
        if self.kind == "end":
            return "end of training"
        return f"step {self.step}" if self.step is not None else "record"

    def __str__(self) -> str:
        if self.kind == "length":
            return self.detail
        if self.kind == "schedule":
            return f"{self.where}: {self.detail}"
        parts = [f"{self.where}: {', '.join(self.quantities)} differ"]
        if self.loss_delta is not None and "loss" in self.quantities:
            parts.append(f"loss {self.loss_a!r} vs {self.loss_b!r} (|diff| {self.loss_delta:.3g})")
        elif self.loss_a is not None:
            parts.append("loss identical")
        if self.gradient_layers:
            parts.append("gradients differ first in: " + ", ".join(self.gradient_layers))
        if self.layers:
            parts.append("weights differ first in: " + ", ".join(self.layers))
        return "; ".join(parts)


def model_mismatch(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> list[str]:
    """How two traces' variable lists differ; empty when comparable. The count first, then each
    variable that differs in its place (which of the model's weighted layers holds it, and its name
    there, ``kernel``), shape or dtype. The model's and layers' own names are not compared: Keras
    numbers automatic names per process, so the same model built again is ``sequential_1/dense_1``."""
    mismatches = []
    if len(a) != len(b):
        mismatches.append(f"A has {len(a)} variable{'' if len(a) == 1 else 's'}, B has {len(b)}")
    places_a, places_b = _places(a), _places(b)
    for index, (va, vb) in enumerate(zip(a, b)):
        if places_a[index] != places_b[index]:
            mismatches.append(f"variable {index}: {_short(va)!r} vs {_short(vb)!r}")
        for key in ("shape", "dtype"):
            if va.get(key) != vb.get(key):
                mismatches.append(f"variable {index} ({_short(va)}): {key} {va.get(key)} vs {vb.get(key)}")
    if len(mismatches) == 1 and len(a) != len(b):
        longer, label = (a, "A") if len(a) > len(b) else (b, "B")
        index = min(len(a), len(b))
        mismatches.append(f"variable {index} ({_short(longer[index])}) is only in {label}")
    return mismatches


def _short(variable: dict[str, Any]) -> str:
    """A variable's name from its layer on, without Keras 2's ``:0``: ``dense/kernel``."""
    parts = re.sub(r":\d+$", "", str(variable.get("name", "?"))).split("/")
    layer = variable.get("layer")
    return "/".join(parts[parts.index(layer):] if layer in parts else parts)


def _places(variables: Sequence[dict[str, Any]]) -> list[tuple[int, str]]:
    """Each variable's place in its model, free of automatic names: the position of its layer among
    the layers that hold variables, and its own name (the last part of its path)."""
    order: dict[Any, int] = {}
    return [(order.setdefault(v.get("layer"), len(order)), _short(v).rsplit("/", 1)[-1]) for v in variables]


def _ordered(keys: set[str]) -> list[str]:
    return sorted(keys, key=lambda k: (k != "loss", k.startswith("val_"), k))


def find_difference(variables: Sequence[dict[str, Any]], a: dict[str, Any], b: dict[str, Any]) -> Divergence | None:
    """The difference between two corresponding records of comparable traces, or None."""
    epoch, batch, step = a.get("epoch"), a.get("batch"), a.get("step")
    if (a.get("type") == "end") != (b.get("type") == "end"):
        ended = "A" if a.get("type") == "end" else "B"
        detail = f"run {ended} ended here, the other run went on training: identical up to this point"
        return Divergence("length", epoch, batch, step, ("length",), detail=detail)
    if (a.get("type"), epoch, batch) != (b.get("type"), b.get("epoch"), b.get("batch")):
        detail = (f"run A is at {a.get('type')} epoch {epoch} batch {batch}, run B at {b.get('type')} "
                  f"epoch {b.get('epoch')} batch {b.get('batch')} (different number of batches or epochs)")
        return Divergence("schedule", epoch, batch, step, ("schedule",), detail=detail)
    bits_a, bits_b = a.get("bits", {}), b.get("bits", {})
    quantities = _ordered({k for k in set(bits_a) | set(bits_b) if bits_a.get(k) != bits_b.get(k)})
    gradient_names, gradient_layers = _differing(variables, a.get("gradients"), b.get("gradients"))
    names, layers = _differing(variables, a.get("weights"), b.get("weights"))
    if not names and a.get("layers") is not None and b.get("layers") is not None:
        # by position: the layers' names may differ by Keras's automatic numbering (see model_mismatch)
        layers = [name for (name, x), y in zip(a["layers"].items(), b["layers"].values()) if x != y]
    if gradient_layers:
        quantities.append("gradients")
    if layers:
        quantities.append("weights")
    if not quantities:
        return None
    loss_a = bits_float(bits_a["loss"]) if "loss" in bits_a else None
    loss_b = bits_float(bits_b["loss"]) if "loss" in bits_b else None
    return Divergence(a.get("type", "?"), epoch, batch, step, tuple(quantities), tuple(layers),
                      tuple(names + gradient_names), loss_a, loss_b, gradient_layers=tuple(gradient_layers))


def _differing(variables: Sequence[dict[str, Any]], a: list | None, b: list | None) -> tuple[list[str], list[str]]:
    """Names of the variables whose fingerprints differ between two per-variable lists, and their
    layers in model order (empty when either list is missing)."""
    if a is None or b is None:
        return [], []
    names: list[str] = []
    layers: list[str] = []
    for index, (x, y) in enumerate(zip(a, b)):
        if x == y:
            continue
        meta = variables[index] if index < len(variables) else {"name": f"#{index}", "layer": "?"}
        names.append(meta.get("name", f"#{index}"))
        if meta.get("layer") not in layers:
            layers.append(meta.get("layer"))
    return names, layers


@dataclass
class Comparison:
    """The verdict on two traces: what `tfrepro.compare` returns.

    `print(comparison)` gives the verdict, the first divergence, the notes and, when a difference
    was to be expected, the environment differences that explain it.

    Attributes:
        a: Where trace A came from (its path), or None for a `Trace` made in memory.
        b: Where trace B came from, or None.
        comparable: False when the traces come from different models (see `mismatch`); then no
            record was compared.
        identical: True only for complete, comparable runs whose every record is equal, bit for bit.
        divergence: The first point where the runs differ, a `Divergence`; None when they do not
            (or are not comparable).
        records_compared: How many records were compared, the divergent one included.
        mismatch: How the models differ, one line each; empty when comparable.
        environment: How the runs' environments differ, as `EnvDifference`s (see
            `tfrepro.environment_diff`).
        notes: What could not be compared: a trace cut by a crash, or one without its end record.
        seeds: Each run's `tfrepro.patch` seed, read from its header (None for a run that tfrepro
            did not seed).
    """

    a: str | None
    b: str | None
    comparable: bool
    identical: bool
    divergence: Divergence | None = None
    records_compared: int = 0
    mismatch: list[str] = field(default_factory=list)
    environment: list[EnvDifference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seeds: tuple[int | None, int | None] = (None, None)  # each run's tfrepro.patch seed, from its header

    @property
    def different_seeds(self) -> str:
        """"A ran with seed 42, B with 43" when the runs were patched with different seeds; else empty."""
        a, b = self.seeds
        if a == b:
            return ""
        def name(seed: int | None) -> str:
            return "no tfrepro seed" if seed is None else f"seed {seed}"

        return f"A ran with {name(a)}, B with {name(b)}"

    @property
    def expected(self) -> bool:
        """True when a difference was to be expected: the runs had different seeds, or their
        environments differ in a way known to break bitwise reproducibility."""
        return bool(self.different_seeds) or any(d.breaks_bitwise for d in self.environment)

    @property
    def mismatch_summary(self) -> str:
        """How the models differ, in one line: the first two entries of ``mismatch`` (the variable
        count, when it differs, and the first variable that differs); empty when comparable."""
        if len(self.mismatch) > 1 and self.mismatch[0].startswith("A has "):
            return f"{self.mismatch[0]}; first difference: {self.mismatch[1]}"
        return "; ".join(self.mismatch[:1])

    @property
    def verdict(self) -> str:
        """`"identical"`, `"diverged"` or `"not comparable"`."""
        if not self.comparable:
            return "not comparable"
        return "identical" if self.identical else "diverged"

    def __str__(self) -> str:
        records = f"{self.records_compared} record{'' if self.records_compared == 1 else 's'} compared"
        lines = [f"{self.verdict}: {self.a} vs {self.b} ({records})"]
        if self.different_seeds:
            lines.append(f"  different seeds: {self.different_seeds}; runs with different seeds are expected to differ")
        lines += [f"  model mismatch: {m}" for m in self.mismatch]
        if self.divergence is not None:
            lines.append(f"  first divergence: {self.divergence}")
        lines += [f"  note: {n}" for n in self.notes]
        breaking = [d for d in self.environment if d.breaks_bitwise]
        if breaking:
            lines.append("  a difference was to be expected; the environments differ:")
            lines += [f"    {d}" for d in breaking]
        return "\n".join(lines)


def _load(trace: Trace | PathLike) -> Trace:
    return trace if isinstance(trace, Trace) else read_trace(trace, strict=False)


def compare(a: Trace | PathLike, b: Trace | PathLike) -> Comparison:
    """Compares two traces record by record, exactly.

    Logged values are compared by their float64 bits and weights (and gradients, when recorded) by
    their fingerprints, so any difference counts, however small. Reports the first divergence
    (where, what, which layers, the loss difference), the environment differences and whether they
    explain it. A trace whose last line was cut (a crash while writing) is compared up to it, and the
    cut is named in `notes`. Variables are matched by their place in the model, shape and dtype, not
    by Keras's automatic names, so the same model built again in another process compares.

    Args:
        a: Trace A, the reference: a path to a trace file (as `ReproducibilityCallback(trace=...)`
            writes) or a `tfrepro.Trace`.
        b: Trace B, the same.

    Returns:
        A `Comparison`: `identical`, `comparable`, the first `divergence`, and the environment
        differences.

    Raises:
        FileNotFoundError: A path does not exist.
        IsADirectoryError: A path is a folder.
        TraceError: A file is not a tfrepro trace, or is corrupt before its last line.
    """
    ta, tb = _load(a), _load(b)
    result = Comparison(ta.path, tb.path, comparable=True, identical=False,
                        seeds=(ta.header.get("seed"), tb.header.get("seed")))
    result.environment = environment_diff(ta.header.get("environment") or {}, tb.header.get("environment") or {})
    result.mismatch = model_mismatch(ta.variables, tb.variables)
    if result.mismatch:
        result.comparable = False
        return result
    for trace, label in ((ta, "A"), (tb, "B")):
        if trace.error is not None:
            result.notes.append(f"trace {label} is unreadable from {trace.error}; compared the records before it")
        elif not trace.complete:
            result.notes.append(f"trace {label} has no end record (the run stopped or crashed before train end)")
    for ra, rb in zip(ta.records, tb.records):
        divergence = find_difference(ta.variables, ra, rb)
        result.records_compared += 1
        if divergence is not None:
            result.divergence = divergence
            return result
    if len(ta.records) != len(tb.records):
        # A complete run that stopped earlier shows as a length divergence above, at its end record; so
        # the shorter trace here has none: its run crashed, or its file was cut.
        shorter, short = ("A", ta) if len(ta.records) < len(tb.records) else ("B", tb)
        last = short.records[-1] if short.records else {}
        where = f"after step {last['step']}" if "step" in last else "before its first record"
        detail = f"trace {shorter} ends {where} (the run crashed or the file was cut); identical up to there"
        result.divergence = Divergence("length", last.get("epoch"), last.get("batch"), last.get("step"), ("length",),
                                       detail=detail)
        return result
    result.identical = ta.error is None and tb.error is None and ta.complete and tb.complete
    return result
