"""``ReproducibilityCallback``: record exact per-batch losses and weight fingerprints, and compare live.

Importing this module imports TensorFlow and the Keras that ``tf.keras`` resolves to (Keras 3, or
tf_keras with ``TF_USE_LEGACY_KERAS=1``); the callback subclasses that Keras's ``Callback``.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

from tfrepro import _tf, digest, patching, reporting
from tfrepro.comparison import Divergence, find_difference, model_mismatch
from tfrepro.environment_info import environment
from tfrepro.errors import DivergenceError, NotComparableError, ReproducibilityWarning
from tfrepro.traces import FORMAT, VERSION, PathLike, Trace, TraceWriter, encode_logs, read_trace

log = logging.getLogger("tfrepro")
keras = _tf.keras_module()
ON_DIVERGENCE = ("raise", "warn", "stop")


def _variable_name(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name


def model_summary(model: Any) -> dict[str, Any]:
    """Layer names and, for every weight variable in model order, its name, layer, shape and dtype."""
    owner: dict[int, str] = {}
    for layer in model.layers:
        for weight in layer.weights:
            owner.setdefault(id(weight), layer.name)
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


class ReproducibilityCallback(keras.callbacks.Callback):
    """Records every training batch exactly and compares against a reference run as it trains.

    Per batch it records the epoch, batch index, and Keras's batch logs (running means over the
    epoch so far) as exact float64 bits, plus a fingerprint of every weight variable, computed
    on the device (only 16 bytes per variable reach the host). Any single-bit change in any
    weight changes its fingerprint. At epoch end it records the epoch logs (validation metrics
    included) and per-layer fingerprints; at train end the final per-variable fingerprints.

    Args:
        trace: path of a JSON Lines trace file to write (flushed per record), or None to keep the
            records in memory as ``callback.records``. One trace per ``fit``: a second ``fit``
            with the same callback rewrites it.
        reference: an earlier trace (path or ``tfrepro.Trace``) to compare against live.
        on_divergence: at the first record that differs from the reference, "raise"
            ``tfrepro.DivergenceError``, "warn" and go on, or "stop" training (with a warning).
        weights: fingerprint the weights every "batch", every "epoch" only, or every N batches.
        gradients: also fingerprint every gradient the optimizer applies, each batch. This sees
            a nondeterministic gradient even when the update it causes is too small to change the
            weights' bits. It wraps ``model.optimizer.apply_gradients`` during ``fit`` (the train
            function is rebuilt once); not supported under ``tf.distribute`` strategies.

    The first divergence is kept in ``callback.divergence``. Overriding ``on_train_batch_end``
    makes Keras >= 3.6 run batch hooks synchronously; ``bench/callback_overhead.py`` measures it.

    Example:
    >>> import numpy as np, tensorflow as tf, tfrepro
    >>> from tfrepro.callback import ReproducibilityCallback
    >>> model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> record = ReproducibilityCallback()
    >>> _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=4, epochs=1, verbose=0, callbacks=[record])
    >>> [r["type"] for r in record.records]
    ['batch', 'batch', 'epoch', 'end']
    """

    def __init__(
        self,
        trace: PathLike | None = None,
        reference: PathLike | Trace | None = None,
        on_divergence: str = "raise",
        weights: str | int = "batch",
        gradients: bool = False,
    ):
        super().__init__()
        if trace is not None:
            if not isinstance(trace, (str, os.PathLike)):
                raise TypeError(f"trace must be a path or None; got {type(trace).__name__}")
            parent = Path(trace).parent
            if not parent.is_dir():
                raise ValueError(f"trace directory does not exist: {parent}")
        if on_divergence not in ON_DIVERGENCE:
            raise ValueError(f"on_divergence must be one of {ON_DIVERGENCE}; got {on_divergence!r}")
        if not (weights in ("batch", "epoch") or (isinstance(weights, int) and not isinstance(weights, bool)
                                                   and weights >= 1)):
            raise ValueError(f'weights must be "batch", "epoch" or a positive int; got {weights!r}')
        if not isinstance(gradients, bool):
            raise TypeError(f"gradients must be True or False; got {gradients!r}")
        if reference is not None and not isinstance(reference, Trace):
            reference = read_trace(reference, strict=False)
        self.trace_path = None if trace is None else Path(trace)
        self.reference: Trace | None = reference
        self.on_divergence = on_divergence
        self.weights = weights
        self.gradients = gradients
        self.records: list[dict[str, Any]] = []
        self.divergence: Divergence | None = None
        self.notes: list[str] = []
        self._writer: TraceWriter | None = None
        self._fingerprinter: digest.VariableFingerprinter | None = None
        self._summary: dict[str, Any] = {}
        self._epoch = 0
        self._step = 0
        self._reference_index = 0
        self._gradient_prints: Any = None  # tf.Variable [n_variables, 2] int32, written by the train step
        self._unhook_gradients: Any = None

    # Keras hooks ---------------------------------------------------------------------------------

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        if self.gradients and self._unhook_gradients is None:
            self._hook_gradients()

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.records, self.divergence, self.notes = [], None, []
        self._epoch = self._step = self._reference_index = 0
        self._fingerprinter = None
        if self.model.weights:  # a subclassed model may build on its first batch
            self._start()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._fingerprinter is None:
            self._start()
        values, bits = encode_logs(logs)
        record: dict[str, Any] = {"type": "batch", "epoch": self._epoch, "batch": batch, "step": self._step,
                                  "logs": values, "bits": bits}
        if self.weights == "batch" or (isinstance(self.weights, int) and (self._step + 1) % self.weights == 0):
            record["weights"] = self._fingerprinter()
        if self._gradient_prints is not None:
            trainable = {id(w) for w in self.model.trainable_weights}
            prints = iter(digest.to_hex(pair) for pair in self._gradient_prints.numpy())
            record["gradients"] = [next(prints) if id(w) in trainable else None for w in self.model.weights]
        self._step += 1
        self._emit(record)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._fingerprinter is None:
            return
        values, bits = encode_logs(logs)
        weights = self._fingerprinter()
        self._emit({"type": "epoch", "epoch": epoch, "step": self._step, "logs": values, "bits": bits,
                    "layers": self._layer_fingerprints(weights), "weights": weights})

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._fingerprinter is None:
            self._close()
            return
        weights = self._fingerprinter()
        self._emit({"type": "end", "step": self._step, "layers": self._layer_fingerprints(weights),
                    "weights": weights})
        self._close()
        if self._unhook_gradients is not None:
            self._unhook_gradients()

    def _hook_gradients(self) -> None:
        """Wrap the optimizer's ``apply_gradients`` (Keras 3 and tf_keras both call it from the
        train step) so that the traced train step also writes the gradients' fingerprints."""
        tf = _tf.import_tf()
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            raise ValueError("gradients=True needs a compiled model (model.optimizer is None)")
        original = optimizer.apply_gradients

        def apply_gradients(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            pairs = list(grads_and_vars)
            if tf.distribute.has_strategy():
                raise ValueError("ReproducibilityCallback(gradients=True) does not support tf.distribute "
                                 "strategies; use gradients=False")
            position = {id(w): i for i, w in enumerate(self.model.trainable_weights)}
            ordered = sorted(pairs, key=lambda pair: position.get(id(pair[1]), len(position)))
            prints = tf.stack([digest.gradient_fingerprint(tf, g) for g, _ in ordered])
            with tf.init_scope():  # a plain eager variable, outside the traced function
                if self._gradient_prints is None or self._gradient_prints.shape[0] != len(ordered):
                    self._gradient_prints = tf.Variable(tf.zeros([len(ordered), 2], tf.int32), trainable=False)
            self._gradient_prints.assign(prints)
            return original(pairs, *args, **kwargs)

        optimizer.apply_gradients = apply_gradients
        self.model.train_function = None  # retrace so that the train step calls the wrapper

        def unhook() -> None:
            del optimizer.apply_gradients  # the instance attribute; the class method shows again
            self.model.train_function = None
            self._unhook_gradients = None

        self._unhook_gradients = unhook

    # internals -----------------------------------------------------------------------------------

    def _start(self) -> None:
        self._summary = model_summary(self.model)
        if self.reference is not None:
            mismatch = model_mismatch(self.reference.variables, self._summary["variables"])
            if mismatch:
                raise NotComparableError(mismatch)
        self._fingerprinter = digest.VariableFingerprinter(self.model.weights)
        header = {
            "type": "header", "format": FORMAT, "version": VERSION,
            "seed": patching.active_seed(),
            "weights_every": self.weights,
            "batch_logs": "running means over the epoch so far (Keras batch logs)",
            "keras": getattr(keras, "__version__", None),
            "environment": environment(),
            "status": reporting.status().to_dict(),
            "model": self._summary,
        }
        if self.trace_path is not None:
            self._writer = TraceWriter(self.trace_path)
            self._writer.write(header)

    def _layer_fingerprints(self, weights: list[str]) -> dict[str, str]:
        grouped: dict[str, list[str]] = {}
        for meta, value in zip(self._summary["variables"], weights):
            grouped.setdefault(meta["layer"], []).append(value)
        return {layer: digest.combine(values) for layer, values in grouped.items()}

    def _emit(self, record: dict[str, Any]) -> None:
        if self._writer is not None:
            self._writer.write(record)
        else:
            self.records.append(record)
        if self.reference is None or self.divergence is not None:
            return
        if self._reference_index >= len(self.reference):
            if self._reference_index == len(self.reference):
                self._note(f"the reference ends after {len(self.reference)} records; the rest of this run "
                           "is not compared")
                self._reference_index += 1
            return
        expected = self.reference.records[self._reference_index]
        self._reference_index += 1
        divergence = find_difference(self._summary["variables"], record, expected)
        if divergence is not None and divergence.kind == "length":
            first = "run" if record["type"] == "end" else "reference"
            self._note(f"the {first} ended first, after {self._reference_index - 1} identical records; the "
                       "rest was not compared")
            self._reference_index = len(self.reference) + 1  # stop comparing
        elif divergence is not None:
            self._diverged(divergence)

    def _diverged(self, divergence: Divergence) -> None:
        self.divergence = divergence
        if self.on_divergence == "raise":
            self._close()
            raise DivergenceError(divergence)
        message = f"run diverged from the reference at {divergence}"
        if self.on_divergence == "stop":
            self.model.stop_training = True
            message += "; stopping training"
        warnings.warn(message, ReproducibilityWarning, stacklevel=2)

    def _note(self, message: str) -> None:
        self.notes.append(message)
        warnings.warn(message, ReproducibilityWarning, stacklevel=3)

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
