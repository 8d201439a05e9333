"""``ReproCheckpoint``: checkpoints from which training resumes exactly as if never interrupted.

Importing this module imports TensorFlow and the Keras that ``tf.keras`` resolves to.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from tfrepro import _tf
from tfrepro._version import __version__
from tfrepro.checkpointing import callback_states, model_state, storage
from tfrepro.determinism import seeding, state
from tfrepro.errors import CheckpointError, warn

keras = _tf.keras_module()
log = logging.getLogger("tfrepro")
_KERAS3 = _tf.keras_major(keras) >= 3


class ReproCheckpoint(keras.callbacks.Callback):
    """Checkpoints training so that a run that is killed and started again ends bit for bit where
    the uninterrupted run ends.

    When ``fit`` starts it resumes from the newest complete checkpoint in ``directory``, if there is
    one, and otherwise starts afresh. It saves:

    - every variable of the model (Keras 3 SeedGenerator states included), the optimizer (slots,
      ``iterations``, learning rate) and the metrics' running totals;
    - each Keras 2 random layer's ``tf.random.Generator``;
    - ``tfrepro.rng_state()``: Python, NumPy, TF's global Generator, Keras's global generators;
    - the epoch and batch, and the state of ``ReduceLROnPlateau``, ``EarlyStopping`` and
      ``ModelCheckpoint`` (``tfrepro.checkpointing.callback_states`` says what is not restored).

    It saves at the end of every epoch (``every="epoch"``) or after every ``every`` batches, and
    when ``fit`` ends. Files are written atomically and hold no pickles; the newest ``keep`` stay.
    A checkpoint from a different model, optimizer, steps per epoch or ``tfrepro.patch`` seed raises
    ``tfrepro.CheckpointError`` listing the difference.

    **The input position is restored by replay.** On resume, ``fit`` starts from its first batch as
    usual, and every batch before the checkpoint's is drawn from the input and dropped, untrained,
    with the other callbacks set aside; they rejoin at the checkpoint's batch. So the input goes on
    exactly where it was, whatever it is: ``tf.data`` with per-epoch shuffles and
    ``Dataset.random`` streams (whose epoch counters TF's own iterator checkpoints do not carry
    reliably), NumPy arrays shuffled by ``fit``, generators. It costs the input pipeline's time for
    the batches replayed, and the validation of the epochs replayed; the training steps are not run.

    Args:
        directory: where the checkpoints live (created if needed). One folder per ``fit``.
        every: "epoch", or a positive number of batches.
        keep: how many checkpoints to keep (>= 1).

    Limits: Keras 2 random layers must draw from ``tf.random.Generator``s (call
    ``tf.keras.backend.experimental.enable_tf_random_generator()`` before building the model;
    ``tfrepro run --checkpoint`` does); TF's default ones keep their state in kernels no checkpoint
    can read. The input must yield the same batches in a new process (seeded: ``tfrepro.patch``).
    Keras 2 builds compiled metrics on the first batch, so after a mid-epoch resume their running
    means restart (the weights are unaffected). A run that ended (or that a callback stopped) is not
    extended: resuming it trains nothing. Not tested under ``tf.distribute`` strategies.

    Args:
        directory: where the checkpoints live (created if needed). One folder per training run.
        every: "epoch", or a positive number of batches.
        keep: how many checkpoints to keep (>= 1).

    Limits: Keras 2 random layers must draw from ``tf.random.Generator``s (call
    ``tf.keras.backend.experimental.enable_tf_random_generator()`` before building the model;
    ``tfrepro run --checkpoint`` does); TF's default ones keep their state in kernels no checkpoint
    can read. Not under ``tf.distribute`` strategies. Keras 2 builds compiled metrics on the first
    batch, so after a mid-epoch resume their running means restart (the weights are unaffected).
    A run that ended is not extended: resuming it trains nothing.

    Example:

    >>> import tempfile, numpy as np, tensorflow as tf, tfrepro
    >>> model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> folder = tempfile.mkdtemp()
    >>> data = tf.data.Dataset.from_tensor_slices((np.ones((8, 2)), np.ones((8, 1)))).batch(4)
    >>> _ = model.fit(data, epochs=2, verbose=0, callbacks=[tfrepro.ReproCheckpoint(folder)])
    >>> [p.name for p in tfrepro.ReproCheckpoint(folder).checkpoints()]
    ['ckpt-e000001-b00000000.npz', 'ckpt-e000002-b00000000.npz']
    """

    def __init__(self, directory: str | os.PathLike[str], every: str | int = "epoch", keep: int = 3):
        super().__init__()
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path; got {type(directory).__name__}")
        if not (every == "epoch" or (isinstance(every, int) and not isinstance(every, bool) and every >= 1)):
            raise ValueError(f'every must be "epoch" or a positive number of batches; got {every!r}')
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be a positive int; got {keep!r}")
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"directory is a file: {self.directory}")
        self.every = every
        self.keep = keep
        self.restored_from: Path | None = None
        self._run: _Run | None = None

    def checkpoints(self) -> list[Path]:
        """The complete checkpoints in ``directory``, oldest first."""
        return storage.list_checkpoints(self.directory)

    # Keras hooks ---------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        self.restored_from = None
        self._run = _Run(self, _fit_callbacks(self))
        self._run.begin()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._run is not None:
            self._run.epoch_begin(epoch)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self._run is not None:
            self._run.batch_begin(batch)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._run is not None:
            self._run.batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._run is not None:
            self._run.epoch_end(epoch)

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._run is not None:
            self._run.end()
            self._run = None


def _fit_callbacks(callback: Any) -> list[Any]:
    """The list of callbacks of the ``fit`` that calls ``callback``: the ``CallbackList`` calling its
    hook holds it (Keras gives a callback no other way to see the others). Empty if not found."""
    frame = sys._getframe(1)
    for _ in range(6):
        if frame is None:
            break
        listed = getattr(frame.f_locals.get("self"), "callbacks", None)
        if isinstance(listed, list) and any(c is callback for c in listed):
            return listed
        frame = frame.f_back
    return []


class _Run:
    """One ``fit`` under a ``ReproCheckpoint``: replays to the checkpoint, then counts and saves."""

    def __init__(self, owner: ReproCheckpoint, fit_callbacks: list[Any]):
        self.owner = owner
        self.model = owner.model
        self.fit_callbacks = fit_callbacks  # Keras's own list: others leave it during a replay
        self.others = [c for c in fit_callbacks if c is not owner]
        self.stored: storage.Stored | None = None
        self.epoch = self.batch = self.trained = 0
        self.target: tuple[int, int] = (0, 0)  # the first batch to train; the ones before are replayed
        self.first_call: tuple[int, int] | None = None
        self.finished = False
        self.trained_here = False
        self.metrics_built = False
        self.rng_pending = self.rest_pending = False
        self.last_logs: dict[str, float] = {}
        self.saved_since_last_batch = True
        self.original_train_function: Any = None

    # fit begins ----------------------------------------------------------------------------------
    def begin(self) -> None:
        legacy = model_state.keras2_legacy_random_layers(self.model)
        if legacy:
            raise CheckpointError(
                "ReproCheckpoint cannot save the random state of these Keras 2 layers: TF keeps it inside "
                "its kernels. Call tf.keras.backend.experimental.enable_tf_random_generator() before "
                "building the model (`tfrepro run --checkpoint` does)", [", ".join(legacy)])
        self.stored = storage.latest(self.owner.directory)
        if self.stored is not None:
            self._resume(self.stored)
        self.original_train_function = self.model.train_function
        self.model.train_function = self._train_function

    def _resume(self, stored: storage.Stored) -> None:
        manifest = stored.manifest
        model_state.build_optimizer(self.model)
        slots = model_state.slots(self.model)
        problems = _environment_mismatch(manifest, self.model, self.owner.params)
        problems += model_state.mismatch(manifest["variables"], slots, ("model", "generators", "optimizer"))
        if problems:
            raise CheckpointError(f"{stored.path} does not fit this training run", problems)
        for index, slot in enumerate(slots):
            if slot.group != "metrics":
                slot.variable.assign(_saved_value(stored, index))
        self.target = (stored.epoch, stored.batch)
        self.trained = int(manifest["position"]["trained"])
        self.last_logs = dict(manifest["logs"])
        self.finished = manifest["stopped"] or (manifest["finished"] and stored.epoch >= self.owner.params["epochs"])
        self.rng_pending = self.rest_pending = not self.finished
        self.owner.restored_from = stored.path
        log.info("tfrepro: resuming from %s (epoch %d, batch %d)", stored.path, *self.target)

    # during fit ----------------------------------------------------------------------------------
    def epoch_begin(self, epoch: int) -> None:
        self.epoch, self.batch = epoch, 0

    def batch_begin(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, batch: int, logs: dict | None) -> None:
        if self.replaying:
            if (self.epoch, batch + 1) == self.target:
                self._restore_rngs()  # where the checkpoint took them
            return
        done = batch + 1 - self.batch
        self.batch = batch + 1
        self.trained += done
        self.trained_here = True
        self.last_logs = {k: float(v) for k, v in (logs or {}).items() if _is_number(v)}
        self.saved_since_last_batch = False
        every = self.owner.every
        if every != "epoch" and self.trained // every != (self.trained - done) // every:
            self._save()

    def epoch_end(self, epoch: int) -> None:
        if self.replaying:
            if (epoch + 1, 0) == self.target:
                self._restore_rngs()
            return
        self.epoch, self.batch = epoch + 1, 0
        if self.owner.every == "epoch" and not self.saved_since_last_batch:
            self._save()

    @property
    def replaying(self) -> bool:
        return (self.epoch, self.batch) < self.target

    def _train_function(self, iterator: Any) -> Any:
        if self.owner._run is not self:  # a fit that ended without on_train_end left this wrapper
            return self.original_train_function(iterator)
        if self.finished:  # the checkpointed run had ended: train nothing
            self.model.stop_training = True
            if not self.metrics_built:  # Keras reads them at the epoch's end
                self._build_metrics(next(iterator))
            return dict(self.last_logs)
        if self.first_call is None:
            self.first_call = (self.epoch, self.batch)
            if self.replaying and self.others:
                self.fit_callbacks[:] = [self.owner]  # the others see no replayed batch (see _rejoin)
        if self.replaying:  # draw the batches the checkpointed run drew, and train none
            for _ in range(_steps_per_execution(self.model)):
                batch = next(iterator)
                if not self.metrics_built:
                    self._build_metrics(batch)
            return dict(self.last_logs)
        if self.rest_pending:
            self._rejoin()
        return self.original_train_function(iterator)

    def _build_metrics(self, batch: Any) -> None:
        """Build the compiled metrics (Keras builds them in the first training step, which a replay
        does not run) on one batch in inference mode, which draws no random number, then reset them."""
        self.metrics_built = True
        x, y, sample_weight = (*batch, None, None)[:3] if isinstance(batch, tuple) else (batch, None, None)
        y_pred = self.model(x, training=False)
        self.model.compute_loss(x, y, y_pred, sample_weight)  # Keras 2 builds its loss tracker here
        self.model.compute_metrics(x, y, y_pred, sample_weight)
        self.model.reset_metrics()

    def _restore_rngs(self) -> None:
        self.rng_pending = False
        seeding.set_rng_state(self.stored.manifest["rng"])

    def _rejoin(self) -> None:
        """At the checkpoint's batch: the metrics' running totals, the other callbacks and their state."""
        self.rest_pending = False
        if self.rng_pending:  # a checkpoint at (0, 0) has nothing to replay
            self._restore_rngs()
        stored = self.stored
        slots = model_state.slots(self.model)
        if self.batch > 0:  # mid-epoch: the epoch's running totals (at batch 0 Keras has just reset them)
            if model_state.mismatch(stored.manifest["variables"], slots, ("metrics",)):
                warn("the metrics differ from the checkpoint's: their running means restart at the resumed "
                     "batch; the weights are unaffected")
            else:
                for index, slot in enumerate(slots):
                    if slot.group == "metrics":
                        slot.variable.assign(_saved_value(stored, index))
        unmatched = callback_states.restore(self.others, stored.manifest["callbacks"], stored.members)
        if unmatched:
            warn(f"not restored, as this fit has no such callback at that place: {', '.join(unmatched)}")
        if self.fit_callbacks == [self.owner] and self.others:
            self.fit_callbacks[:] = [*self.others, self.owner]
            for callback in self.others:  # the hooks they missed, as the first batch they saw was replayed
                if self.epoch != self.first_call[0]:
                    callback.on_epoch_begin(self.epoch)
                if (self.epoch, self.batch) != self.first_call:
                    callback.on_train_batch_begin(self.batch)

    # saving ---------------------------------------------------------------------------------------
    def _save(self, finished: bool = False) -> None:
        slots = model_state.slots(self.model)
        entries, members = callback_states.save(self.others)
        members.update({f"variable/{i}": storage.array_bytes(v) for i, v in enumerate(model_state.values(slots))})
        manifest = {
            "format": storage.FORMAT,
            "tfrepro": __version__,
            "environment": _environment(self.model, self.owner.params),
            "position": {"epoch": self.epoch, "batch": self.batch, "trained": self.trained},
            "variables": [slot.describe() for slot in slots],
            "rng": seeding.rng_state(),
            "callbacks": entries,
            "logs": self.last_logs,
            "finished": finished,
            "stopped": bool(finished and self.model.stop_training),
            "members": sorted(members),
        }
        path = storage.write(self.owner.directory, manifest, members, self.owner.keep)
        self.saved_since_last_batch = True
        log.info("tfrepro: checkpoint %s", path)

    def end(self) -> None:
        if self.model.train_function == self._train_function:
            self.model.train_function = self.original_train_function
        if self.fit_callbacks == [self.owner] and self.others:
            self.fit_callbacks[:] = [*self.others, self.owner]  # a fit that ended inside the replay
        if self.trained_here:
            self._save(finished=True)


# helpers ------------------------------------------------------------------------------------------
def _saved_value(stored: storage.Stored, index: int) -> Any:
    entry = stored.manifest["variables"][index]
    tf = _tf.import_tf()
    dtype = tf.as_dtype(entry["dtype"]).as_numpy_dtype
    return storage.array_from(stored.members[f"variable/{index}"], dtype, entry["shape"])


def _steps_per_execution(model: Any) -> int:
    value = getattr(model, "steps_per_execution", None) if _KERAS3 else getattr(model, "_steps_per_execution", None)
    return 1 if value is None else int(value.numpy() if hasattr(value, "numpy") else value)


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _environment(model: Any, params: dict[str, Any]) -> dict[str, Any]:
    tf = _tf.import_tf()
    return {"keras": f"{keras.__name__} {keras.__version__}", "tensorflow": tf.__version__,
            "model": type(model).__name__, "optimizer": type(model.optimizer).__name__,
            "steps_per_epoch": params.get("steps"), "seed": state.active_seed()}


def _environment_mismatch(manifest: dict[str, Any], model: Any, params: dict[str, Any]) -> list[str]:
    saved, here = manifest["environment"], _environment(model, params)
    problems = []
    for key in ("keras", "model", "optimizer", "steps_per_epoch", "seed"):
        if saved.get(key) != here[key] and not (key == "steps_per_epoch" and None in (saved.get(key), here[key])):
            problems.append(f"{key.replace('_', ' ')}: checkpoint {saved.get(key)!r}, this run {here[key]!r}")
    if saved.get("tensorflow") != here["tensorflow"]:
        warn(f"the checkpoint was taken under TensorFlow {saved.get('tensorflow')}, this is {here['tensorflow']}: "
             "kernels may differ, and so may the bits")
    return problems
