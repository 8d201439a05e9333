"""The recording piece of ``ReproducibilityCallback``: builds the trace records of one ``fit``
(header, batch, epoch, end) and writes each one as it comes (or keeps them in memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfrepro import _tf
from tfrepro.determinism import reporting, state
from tfrepro.proof import fingerprints
from tfrepro.proof.environment_info import environment
from tfrepro.proof.traces import FORMAT, VERSION, TraceWriter, encode_logs


def _variable_name(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name


def model_summary(model: Any) -> dict[str, Any]:
    """Layer names and, for every weight variable in model order, its name, layer, shape and dtype."""
    owner: dict[int, str] = {}
    _own_weights(model.layers, "", owner)
    variables = [
        {
            "name": _variable_name(w),
            "layer": owner.get(id(w), model.name),
            "shape": [None if d is None else int(d) for d in w.shape],
            "dtype": getattr(w.dtype, "name", str(w.dtype)),
        }
        for w in model.weights
    ]
    return {"name": model.name, "class": type(model).__name__, "layers": [layer.name for layer in model.layers],
            "variables": variables}


def _own_weights(layers: Any, prefix: str, owner: dict[int, str]) -> None:
    """Each weight's innermost layer, as a path through nested models (``encoder/dense``)."""
    for layer in layers:
        path = f"{prefix}{layer.name}"
        inner = getattr(layer, "layers", None)
        if inner:  # a nested model: its own layers first, so the deepest owner wins
            _own_weights(inner, f"{path}/", owner)
        for weight in layer.weights:
            owner.setdefault(id(weight), path)


class Recorder:
    """Records one ``fit`` of one model: to ``trace_path`` (flushed per record) or, when it is None,
    to ``records``. ``weights`` says when batch records carry weight fingerprints: "batch",
    "epoch" (never at batches) or every N batches."""

    def __init__(self, trace_path: Path | None, weights: str | int):
        self.trace_path = trace_path
        self.weights = weights
        self.records: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}
        self._writer: TraceWriter | None = None
        self._fingerprinter: fingerprints.VariableFingerprinter | None = None

    @property
    def started(self) -> bool:
        return self._fingerprinter is not None

    def start(self, model: Any) -> None:
        """Fingerprint ``model``'s weights from now on and write the header."""
        self.records = []
        self.summary = model_summary(model)
        self._fingerprinter = fingerprints.VariableFingerprinter(model.weights)
        header = {
            "type": "header", "format": FORMAT, "version": VERSION,
            "seed": state.active_seed(),
            "weights_every": self.weights,
            "batch_logs": "running means over the epoch so far (Keras batch logs)",
            "keras": getattr(_tf.keras_module(), "__version__", None),
            "environment": environment(),
            "status": reporting.status().to_dict(),
            "model": self.summary,
        }
        if self.trace_path is not None:
            self._writer = TraceWriter(self.trace_path)
            self._writer.write(header)

    def batch(self, epoch: int, batch: int, step: int, logs: dict | None,
              gradients: list[str | None] | None) -> dict[str, Any]:
        values, bits = encode_logs(logs)
        record: dict[str, Any] = {"type": "batch", "epoch": epoch, "batch": batch, "step": step,
                                  "logs": values, "bits": bits}
        if self.weights == "batch" or (isinstance(self.weights, int) and (step + 1) % self.weights == 0):
            record["weights"] = self._fingerprinter()
        if gradients is not None:
            record["gradients"] = gradients
        return self._write(record)

    def epoch(self, epoch: int, step: int, logs: dict | None) -> dict[str, Any]:
        values, bits = encode_logs(logs)
        weights = self._fingerprinter()
        return self._write({"type": "epoch", "epoch": epoch, "step": step, "logs": values, "bits": bits,
                            "layers": self._layer_fingerprints(weights), "weights": weights})

    def end(self, step: int) -> dict[str, Any]:
        weights = self._fingerprinter()
        return self._write({"type": "end", "step": step, "layers": self._layer_fingerprints(weights),
                            "weights": weights})

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _layer_fingerprints(self, weights: list[str]) -> dict[str, str]:
        grouped: dict[str, list[str]] = {}
        for meta, value in zip(self.summary["variables"], weights):
            grouped.setdefault(meta["layer"], []).append(value)
        return {layer: fingerprints.combine(values) for layer, values in grouped.items()}

    def _write(self, record: dict[str, Any]) -> dict[str, Any]:
        if self._writer is not None:
            self._writer.write(record)
        else:
            self.records.append(record)
        return record
