"""``ReproducibilityCallback``: record exact per-batch losses and weight fingerprints, and compare live.

Importing this module imports TensorFlow and the Keras that ``tf.keras`` resolves to (Keras 3, or
tf_keras with ``TF_USE_LEGACY_KERAS=1``); the callback subclasses that Keras's ``Callback``. It is
the Keras face of three pieces: ``Recorder`` (the trace), ``LiveComparator`` (the reference) and
``GradientHook`` (gradient fingerprints).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tfrepro import _tf
from tfrepro.errors import DivergenceError, warn
from tfrepro.proof.comparison import Divergence
from tfrepro.proof.gradient_hook import GradientHook
from tfrepro.proof.live_comparison import LiveComparator
from tfrepro.proof.recorder import Recorder
from tfrepro.proof.traces import PathLike, Trace, read_trace

keras = _tf.keras_module()
ON_DIVERGENCE = ("raise", "warn", "stop")


class ReproducibilityCallback(keras.callbacks.Callback):
    """Records every training batch exactly and compares against a reference run as it trains.

    Per batch it records the epoch, batch index, and Keras's batch logs (running means over the
    epoch so far) as exact float64 bits, plus a fingerprint of every weight variable, computed
    on the device (8 bytes per variable reach the host). Any change to a single element of a
    weight changes its fingerprint (see `tfrepro.fingerprint`). At epoch end it records the epoch
    logs (validation metrics included) and per-layer fingerprints; at train end the final
    per-variable fingerprints.

    The first divergence from the reference is kept in `callback.divergence`. Overriding
    `on_train_batch_end` makes Keras >= 3.6 run batch hooks synchronously;
    `bench/callback_overhead.py` measures the cost.

    Args:
        trace: Path of a JSON Lines trace file to write (flushed per record), or None (the default)
            to keep the records in memory as `callback.records`. One trace per `fit`: a second
            `fit` with the same callback rewrites it.
        reference: An earlier trace (path or `tfrepro.Trace`) to compare against live, or None
            (the default) to only record. A path is read when the callback is made.
        on_divergence: What to do at the first record that differs from the reference: `"raise"`
            (the default) `tfrepro.DivergenceError`, `"warn"` and go on, or `"stop"` training
            (with a warning).
        weights: When to fingerprint the weights: every `"batch"` (the default), at each
            `"epoch"` end only, or every N batches (a positive int).
        gradients: Also fingerprint every gradient the optimizer applies, each batch. This sees
            a nondeterministic gradient even when the update it causes is too small to change the
            weights' bits. It wraps `model.optimizer.apply_gradients` during `fit` (the train
            function is rebuilt once); not supported under `tf.distribute` strategies. Defaults to
            False.

    Raises:
        TypeError: `trace` is neither a path nor None, or `gradients` is not a bool.
        ValueError: The folder of `trace` does not exist, or `on_divergence` or `weights` is not
            one of the values above.
        FileNotFoundError: `reference` is a path that does not exist.
        TraceError: `reference` is not a tfrepro trace.
        DivergenceError: During `fit`, with `on_divergence="raise"`, at the first divergence from
            the reference (the trace written so far is closed first).
        NotComparableError: During `fit`, when the model's variables differ from the reference's.

    Examples:
        >>> import numpy as np, tensorflow as tf, tfrepro
        >>> from tfrepro import ReproducibilityCallback
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
        self.divergence: Divergence | None = None
        self._recorder = Recorder(self.trace_path, weights)
        self._comparator: LiveComparator | None = None
        self._gradient_hook: GradientHook | None = None
        self._epoch = 0
        self._step = 0

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records of the last ``fit`` when no trace file is written."""
        return self._recorder.records

    @property
    def notes(self) -> list[str]:
        """What the live comparison could not compare (a run or reference that ended first)."""
        return [] if self._comparator is None else self._comparator.notes

    # Keras hooks ---------------------------------------------------------------------------------

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        if self.gradients and self._gradient_hook is None:
            self._gradient_hook = GradientHook(model)

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.divergence, self._comparator = None, None
        self._epoch = self._step = 0
        self._recorder = Recorder(self.trace_path, self.weights)
        if self.model.weights:  # a subclassed model may build on its first batch
            self._start()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self._recorder.started:
            self._start()
        gradients = None if self._gradient_hook is None else self._gradient_hook.fingerprints()
        record = self._recorder.batch(self._epoch, batch, self._step, logs, gradients)
        self._step += 1
        self._compare(record)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._recorder.started:
            self._compare(self._recorder.epoch(epoch, self._step, logs))

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._recorder.started:
            self._compare(self._recorder.end(self._step))
        self._finish()

    # internals -----------------------------------------------------------------------------------

    def _finish(self) -> None:
        """Close the trace and restore the optimizer: at train end, and before raising out of ``fit``."""
        self._recorder.close()
        if self._gradient_hook is not None:
            self._gradient_hook.remove()
            self._gradient_hook = None

    def _start(self) -> None:
        self._recorder.start(self.model)
        if self.reference is not None:
            self._comparator = LiveComparator(self.reference, self._recorder.summary["variables"])

    def _compare(self, record: dict[str, Any]) -> None:
        if self._comparator is None or self.divergence is not None:
            return
        divergence = self._comparator.check(record)
        if divergence is None:
            return
        self.divergence = divergence
        if self.on_divergence == "raise":
            self._finish()  # Keras skips on_train_end when a callback raises
            raise DivergenceError(divergence)
        message = f"run diverged from the reference at {divergence}"
        if self.on_divergence == "stop":
            self.model.stop_training = True
            message += "; stopping training"
        warn(message)
