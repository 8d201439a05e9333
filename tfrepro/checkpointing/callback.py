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
from tfrepro.checkpointing import arguments, callback_states, input_position, kernel_random, model_state, storage
from tfrepro.determinism import seeding
from tfrepro.errors import CheckpointError, warn

keras = _tf.keras_module()
log = logging.getLogger("tfrepro.checkpointing")
_KERAS3 = _tf.keras_major(keras) >= 3


class ReproCheckpoint(keras.callbacks.Callback):
    """Checkpoints `fit` so that a run killed and started again ends bit for bit where the
    uninterrupted run ends.

    A drop-in for Keras's `BackupAndRestore`: its arguments mean what Keras's mean (their names
    before 0.1.0, `directory=`, `every=` and `keep=`, still work for this release and warn with a
    `DeprecationWarning`). Unlike `BackupAndRestore(delete_checkpoint=True)`, it keeps its
    checkpoints when training ends: running the finished script again trains nothing (empty
    `backup_dir` to start afresh). When `fit` starts it resumes from the newest complete checkpoint in
    `backup_dir`, if there is one, and otherwise starts afresh. It saves:

    - every variable of the model (Keras 3 SeedGenerator states included), the optimizer (slots,
      `iterations`, learning rate) and the metrics' running totals;
    - every other variable reachable through the model's object graph, as `tf.train.Checkpoint`
      walks it: Keras 2 random layers' `tf.random.Generator`s, a generator or a plain
      `tf.Variable` that a layer owns;
    - `tfrepro.rng_state()`: Python, NumPy, TF's global Generator, Keras's global generators;
    - the epoch and batch, and the state of `ReduceLROnPlateau`, `EarlyStopping` and
      `ModelCheckpoint` (`tfrepro.checkpointing.callback_states` says what is not restored).

    Before the first batch it traces the train step to a graph that never runs, which creates what
    the first step creates (optimizer slots, a GAN's two optimizers' included; metrics), then restores
    the variables into them. It refuses (`tfrepro.CheckpointError`, naming the layer and the
    stateless op to use, and writing nothing) a train step that calls TF's stateful random ops
    (`tf.random.normal`, `tf.nn.dropout` without a seed tensor, ...), whose state lives inside
    TF's kernels. A resume logs one line of what it loaded (logger `tfrepro.checkpointing`, INFO).

    It saves at the end of every epoch (`save_freq="epoch"`) or after every `save_freq` batches (a
    save that falls on an epoch's last batch waits for the epoch's end), after the other callbacks
    of the same hook, and when a callback stops `fit`. Files are written atomically and hold no
    pickles; the newest `max_to_keep` stay. A checkpoint from a different model, optimizer, steps
    per epoch, `steps_per_execution` or `tfrepro.patch` seed raises `tfrepro.CheckpointError`
    listing the difference; another Keras or TensorFlow version warns.

    **The input position.** Where the input can be addressed by epoch (arrays that `fit` shuffles
    under `tfrepro.patch`, `tfrepro.data.shuffle`, `map_with_seed`, a `Dataset.shuffle` that
    does not reshuffle; `tfrepro.checkpointing.input_position` says which), a resume starts
    `fit`'s loop at the checkpoint's epoch, as Keras's `BackupAndRestore` does: the epochs
    before it are not gone through, drawn or validated, and that epoch is drawn as itself; within
    it, the batches before the checkpoint's are skipped without computing them where the pipeline
    allows (`tfrepro.data.skip`), else drawn and dropped. Otherwise (a reshuffling
    `Dataset.shuffle`, generators, `PyDataset`), it replays: every batch before the checkpoint's
    is drawn from the input and dropped, untrained, and replayed epochs are validated again. Either
    way the other callbacks are set aside (from `on_train_begin` on: no progress bar of a skipped
    epoch) and rejoin at the checkpoint's batch, their state restored, and whatever was drawn
    meanwhile (building the metrics calls the model in inference mode; replayed validation runs it)
    is undone there: the model's variables and every RNG are set to the checkpoint's again. The
    resume's log line says which it did, and why it replayed. No training step runs twice; a direct
    resume costs at most one epoch of input however far the run got.

    Args:
        backup_dir: Path of the folder where the checkpoints live, created at the first save. One
            folder per `fit`, as for `BackupAndRestore`.
        save_freq: `"epoch"` to save at the end of every epoch, or a positive int to save after
            every `save_freq` batches, as in `BackupAndRestore` (which also takes `False`; this
            callback always saves).
        max_to_keep: How many checkpoints to keep, a positive int, as in
            `tf.train.CheckpointManager`; older ones are deleted.

    Attributes:
        backup_dir: The folder of the checkpoints, a `pathlib.Path`.
        save_freq: `"epoch"` or the number of batches between saves, as given.
        max_to_keep: How many checkpoints are kept, as given.
        restored_from: The checkpoint the current or last `fit` resumed from (a `pathlib.Path`, set
            at its first batch), or `None` when it started afresh.

    Raises:
        TypeError: `backup_dir` is not a path, or an argument is given both by its name and by its
            deprecated one.
        ValueError: `backup_dir` is a file, or `save_freq` or `max_to_keep` is out of range.
        tfrepro.CheckpointError: from `fit`: the checkpoint does not fit this run (a different
            model, optimizer, steps per epoch, `steps_per_execution` or seed), or the train step
            calls TF's stateful random ops.

    Limits: Keras 2 random layers must draw from `tf.random.Generator`s (call
    `tf.keras.backend.experimental.enable_tf_random_generator()` before building the model;
    `tfrepro run --checkpoint` does); TF's default ones keep their state in kernels no checkpoint
    can read. The input must yield the same batches in a new process (seeded: `tfrepro.patch`).
    A run that ended goes on only if `fit` asks for more epochs; one that a callback stopped is not
    extended. Under a `tf.distribute` strategy (`MirroredStrategy`, `MultiWorkerMirroredStrategy`)
    every worker reads the variables at a save, only the chief writes, every worker restores from the
    chief's files (on a cluster the folder must be shared storage), and a resume replays the input
    before the checkpoint's position rather than positioning the distributed dataset.

    Examples:
        >>> import tempfile, numpy as np, tensorflow as tf, tfrepro
        >>> model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> folder = tempfile.mkdtemp()
        >>> data = tf.data.Dataset.from_tensor_slices((np.ones((8, 2)), np.ones((8, 1)))).batch(4)
        >>> _ = model.fit(data, epochs=2, verbose=0, callbacks=[tfrepro.ReproCheckpoint(folder)])
        >>> [p.name for p in tfrepro.ReproCheckpoint(folder).checkpoints()]
        ['ckpt-e000001-b00000000.npz', 'ckpt-e000002-b00000000.npz']
    """

    @arguments.renamed("ReproCheckpoint")
    def __init__(self, backup_dir: str | os.PathLike[str], save_freq: str | int = "epoch", max_to_keep: int = 3):
        super().__init__()
        self.backup_dir = arguments.checked(backup_dir, save_freq, max_to_keep)
        self.save_freq = save_freq
        self.max_to_keep = max_to_keep
        self.restored_from: Path | None = None
        self._run: _Run | None = None

    def checkpoints(self) -> list[Path]:
        """The complete checkpoints in `backup_dir`.

        Returns:
            Their paths, oldest first (empty when there is none or the folder does not exist).
        """
        return storage.list_checkpoints(self.backup_dir)

    # Keras hooks ---------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        self.restored_from = None
        self._run = _Run(self, _fit_callbacks(self))
        self._run.begin(logs)

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


def _fit_callbacks(callback: Any) -> list[Any] | None:
    """The list of callbacks of the ``fit`` that calls ``callback``: the ``CallbackList`` calling its
    hook holds it (Keras gives a callback no other way to see the others). None if not found."""
    frame = sys._getframe(1)
    for _ in range(6):
        if frame is None:
            break
        listed = getattr(frame.f_locals.get("self"), "callbacks", None)
        if isinstance(listed, list) and any(c is callback for c in listed):
            return listed
        frame = frame.f_back
    return None


class _Run:
    """One ``fit`` under a ``ReproCheckpoint``: replays to the checkpoint, then counts and saves."""

    def __init__(self, owner: ReproCheckpoint, fit_callbacks: list[Any] | None):
        self.owner = owner
        self.model = owner.model
        self.history = getattr(self.model, "history", None)  # Keras gives every fit a new one
        if fit_callbacks is None:
            warn("ReproCheckpoint cannot see the other callbacks of this fit: their state is neither saved nor "
                 "restored, and they see the batches a resume replays")
            fit_callbacks = [owner]
        self.fit_callbacks = fit_callbacks  # Keras's own list: the others leave it during a replay
        self.others = [c for c in fit_callbacks if c is not owner]
        self.stored: storage.Stored | None = None
        self.epoch = self.batch = self.trained = 0
        self.target: tuple[int, int] = (0, 0)  # the first batch to train; the ones before are replayed
        self.first_call: tuple[int, int] | None = None
        self.finished = self.rng_pending = self.rest_pending = False
        self.metrics_built = self.set_aside = False
        self.save_at_epoch_end = False
        self.saved_since_last_batch = True
        self.last_logs: dict[str, float] = {}
        self.original_train_function: Any = None
        self.replayed_because: str | None = None  # None: a resume skips the epochs before the checkpoint's
        self.original_evaluate: Any = None
        self.undo_start: Any = None  # undoes start_fit_at, as the first epoch begins
        self.within: Any = None  # how the batches before the checkpoint's, in its epoch, are skipped
        self.substitute: Any = None  # the iterator that skipped them, trained on for the rest of that epoch

    # fit begins ----------------------------------------------------------------------------------
    def begin(self, logs: dict | None) -> None:
        kernel_random.refuse_keras2_legacy_layers(self.model, "ReproCheckpoint")
        self.stored = storage.latest(self.owner.backup_dir)
        if self.stored is not None:
            self._resume(self.stored)
            self._set_aside(logs)
            if not self.finished and self.target > (0, 0):
                arguments = input_position.fit_arguments()
                self.replayed_because = input_position.why_replayed(self.model, self.owner.params, arguments)
                if self.replayed_because is None and self.target[0] > 0:
                    self.undo_start = input_position.start_fit_at(self.model, self.target[0], arguments)
                    self._skip_validation_before_the_target()  # where fit goes through the earlier epochs
        train_function = self.model.train_function
        while isinstance(getattr(train_function, "__self__", None), _Run):  # left by a fit that raised
            train_function = train_function.__self__.original_train_function
        self.original_train_function = train_function
        self.model.train_function = self._train_function

    def _resume(self, stored: storage.Stored) -> None:
        """At ``on_train_begin``: the position, and whether the checkpoint is of this configuration.
        The variables follow at the first batch (``_restore_variables``), once they all exist."""
        manifest = stored.manifest
        problems = _environment_mismatch(manifest, self.model, self.owner.params)
        if problems:
            raise CheckpointError(f"{stored.path} does not fit this training run", problems)
        self.target = (stored.epoch, stored.batch)
        self.trained = int(manifest["position"]["trained"])
        self.last_logs = dict(manifest["logs"])
        self.finished = manifest["stopped"] or stored.epoch >= self.owner.params["epochs"]
        self.rng_pending = self.rest_pending = not self.finished

    def _restore_variables(self, traced: bool) -> None:
        """At the first batch, after the train step's trace created what its first run creates (the
        slots of every optimizer it steps, a GAN's two included; metrics; an unbuilt model's weights):
        the variables of the model, its object graph and its optimizer, as saved."""
        if not traced:  # the one optimizer Keras knows of, for the variables fit trains
            model_state.build_optimizer(self.model.optimizer, self.model.trainable_variables)
        stored = self.stored
        slots = model_state.slots(self.model)
        problems = model_state.mismatch(stored.manifest["variables"], slots, ("model", "generators", "optimizer"))
        if problems:
            raise CheckpointError(f"{stored.path} does not fit this training run", problems)
        self._assign(slots, ("model", "generators", "optimizer"))
        if self.finished:
            seeding.set_rng_state(stored.manifest["rng"])  # as the run left them, for what the script does next
        self.owner.restored_from = stored.path
        if self.finished:
            how = " (the run had ended: nothing to train)"
        elif self.target[0] == 0:
            how = "" if self.replayed_because is None else f"; replaying: {self.replayed_because}"
        elif self.replayed_because is None:
            how = f"; epoch {self.target[0]}'s input drawn directly, no earlier epoch replayed"
        else:
            how = f"; replaying the input of the {self.target[0]} epochs before: {self.replayed_because}"
        if self.within is not None:
            how += f"; {self.within.told(f'the {self.target[1]} batches before it')}"
        log.info("tfrepro: resumed from %s: epoch %d, batch %d, %d batches trained%s", stored.path, *self.target,
                 self.trained, how)

    def _set_aside(self, logs: dict | None) -> None:
        """From ``on_train_begin`` on, alone in Keras's list while a resume replays: the others see no
        replayed epoch (nor print one). Those after this one in the list still get this hook."""
        position = next(i for i, c in enumerate(self.fit_callbacks) if c is self.owner)
        after = self.fit_callbacks[position + 1:]
        self.fit_callbacks[:] = [self.owner]  # Keras's loop over the list, now here, ends with this callback
        self.set_aside = True
        for callback in after:
            callback.on_train_begin(logs)

    def _assign(self, slots: list[model_state.Slot], groups: tuple[str, ...],
                skip: frozenset[int] | set[int] = frozenset()) -> None:
        """Set the variables of ``groups`` (but those whose id is in ``skip``) to the checkpoint's."""
        for index, slot in enumerate(slots):  # slot i is the checkpoint's variable i (`mismatch` checked it)
            if slot.group in groups and id(slot.variable) not in skip:
                slot.variable.assign(model_state.saved_value(self.stored, index))

    # during fit ----------------------------------------------------------------------------------
    @property
    def replaying(self) -> bool:
        return (self.epoch, self.batch) < self.target

    @property
    def skipping(self) -> bool:
        """In an epoch before the checkpoint's, with input addressed by epoch: nothing is drawn."""
        return self.replayed_because is None and self.epoch < self.target[0]

    def _skip_validation_before_the_target(self) -> None:
        """``fit`` validates at the end of every epoch it goes through; before the checkpoint's epoch
        nobody sees the result (the other callbacks are set aside), so nothing is drawn or run."""
        self.original_evaluate = self.model.__dict__.get("evaluate")
        evaluate = self.model.evaluate

        def skipped_or_evaluated(*args: Any, **kwargs: Any) -> Any:
            if self.owner._run is self and self.skipping:
                return {}
            return evaluate(*args, **kwargs)

        self.model.evaluate = skipped_or_evaluated

    def epoch_begin(self, epoch: int) -> None:
        if self.undo_start is not None:
            self.undo_start()
            self.undo_start = None
        self.substitute = None
        self.epoch, self.batch = epoch, 0

    def batch_begin(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, batch: int, logs: dict | None) -> None:
        steps = self.owner.params.get("steps")
        end = batch + 1 if not steps else min(batch + 1, steps)  # Keras 3 overshoots a short last execution
        if self.replaying:
            if (self.epoch, end) == self.target:
                self._restore_random_state()  # where the checkpoint took it
            return
        done = end - self.batch
        self.batch = end
        self.trained += done
        self.last_logs = {k: float(v) for k, v in (logs or {}).items() if _is_number(v)}
        self.saved_since_last_batch = False
        every = self.owner.save_freq
        if every != "epoch" and self.trained // every != (self.trained - done) // every:
            if end == steps:
                self.save_at_epoch_end = True  # at (epoch + 1, 0), after the epoch's end hooks
            else:
                self._save()

    def epoch_end(self, epoch: int) -> None:
        if self.replaying:
            if (epoch + 1, 0) == self.target:
                self._restore_random_state()
            return
        self.epoch, self.batch = epoch + 1, 0
        if self.owner.save_freq == "epoch" or self.save_at_epoch_end:
            self.save_at_epoch_end = False
            self._save()

    def _train_function(self, iterator: Any) -> Any:
        if self.owner._run is not self or getattr(self.model, "history", None) is not self.history:
            return self.original_train_function(iterator)  # left by a fit that raised: not ours
        if self.first_call is None:
            self.first_call = (self.epoch, self.batch)
            if not self.set_aside:  # last in Keras's list, so that a save sees the others' state after the same hook
                self.fit_callbacks[:] = [*self.others, self.owner]
            traced = self._trace_train_step(iterator)
            if not traced and self.replayed_because is None and self.target > (0, 0):  # metrics unbuilt: replay builds them
                self.replayed_because = "its train step could not be traced"
            if self.target[1] > 0 and self.replayed_because is None and not self.finished:
                self.within = input_position.skip_within_epoch(iterator, self.target[1])
            if self.stored is not None:
                self._restore_variables(traced)
        if self.finished:  # the checkpointed run had ended: train nothing
            self.model.stop_training = True
            self._draw(iterator, 1)  # Keras reads the metrics at the epoch's end: build them
            self._restore_random_state()
            return dict(self.last_logs)
        if self.replaying and self.skipping:  # an earlier epoch of addressable input: draw nothing
            return dict(self.last_logs)
        if self.replaying and self.within is not None and self.within.dataset is not None:
            if self.substitute is None:  # the checkpoint's epoch: its batches from the checkpoint's on
                self.substitute = iter(self.within.dataset)
            if not self.metrics_built:  # on a batch of zeros: no batch is drawn for it
                self._build_metrics(_zeros_like(iterator.element_spec))
            return dict(self.last_logs)
        if self.replaying:  # draw the batches the checkpointed run drew, and train none
            steps = self.owner.params.get("steps")
            spe = _steps_per_execution(self.model)
            self._draw(iterator, spe if not steps else min(spe, steps - self.batch))
            return dict(self.last_logs)
        if self.rest_pending:
            self._rejoin()
        return self.original_train_function(iterator if self.substitute is None else self.substitute)

    def _draw(self, iterator: Any, count: int) -> None:
        for _ in range(count):
            batch = next(iterator)
            if not self.metrics_built:
                self._build_metrics(batch)

    def _build_metrics(self, batch: Any) -> None:
        """Build the compiled metrics (Keras builds them in the first training step, which a replay
        does not run) on one batch in inference mode, then reset them. What the call draws (a layer
        that samples in inference too) is undone by ``_restore_random_state``."""
        self.metrics_built = True
        if not _compiled_state_unbuilt(self.model):  # e.g. a train_step with its own trackers: no call needed
            return
        x, y, sample_weight = (*batch, None, None)[:3] if isinstance(batch, tuple) else (batch, None, None)

        def build(x: Any, y: Any, sample_weight: Any) -> None:
            y_pred = self.model(x, training=False)
            self.model.compute_loss(x, y, y_pred, sample_weight)  # Keras 2 builds its loss tracker here
            self.model.compute_metrics(x, y, y_pred, sample_weight)

        tf = _tf.import_tf()
        try:
            if any(isinstance(part, tf.distribute.DistributedValues) for part in tf.nest.flatten(batch)):
                self.model.distribute_strategy.run(build, args=(x, y, sample_weight))  # on each replica, as fit does
            else:
                build(x, y, sample_weight)
        except Exception as exc:  # a model whose train_step computes its own (a GAN, y=None)
            warn(f"could not build the metrics on a replayed batch ({type(exc).__name__}: {exc}); their running "
                 "means may restart at the resumed batch, the weights are unaffected")
        self.model.reset_metrics()

    def _trace_train_step(self, iterator: Any) -> bool:
        """Before the first batch (replayed or trained), trace the train step to a graph that never runs:
        one whose random ops keep their state in TF's kernels cannot resume exactly, so this run is
        refused before it writes a checkpoint. Returns whether the trace was made."""
        spec = getattr(iterator, "element_spec", None)
        try:
            if spec is None:
                raise TypeError(f"{type(iterator).__name__} has no element_spec")
            found = kernel_random.train_step_findings(self.model, spec)
        except Exception as exc:  # a step that cannot be traced alone (a distribution strategy, say)
            warn(f"ReproCheckpoint could not trace the train step to check it for TF's stateful random ops "
                 f"({type(exc).__name__}: {exc}); if it calls any (tf.random.normal, tf.nn.dropout, ...), a resume "
                 "draws other numbers")
            return False
        if found:
            raise CheckpointError(kernel_random.refusal(found, "ReproCheckpoint"),
                                  found if len(found) > 1 else None)
        return True

    def _restore_random_state(self) -> None:
        """At the checkpoint's position: every RNG, and the model's variables (generators and
        SeedGenerators among them), as saved, undoing what building the metrics and replayed
        validation drew."""
        self.rng_pending = False
        metrics = {id(v) for metric in self.model.metrics for v in metric.variables}  # in Keras 2's model.variables too
        self._assign(model_state.slots(self.model), ("model", "generators"), skip=metrics)
        seeding.set_rng_state(self.stored.manifest["rng"])

    def _rejoin(self) -> None:
        """At the checkpoint's batch: the metrics' running totals, the other callbacks and their state."""
        self.rest_pending = False
        if self.rng_pending:  # nothing was replayed
            self._restore_random_state()
        slots = model_state.slots(self.model)
        if self.batch > 0:  # mid-epoch: the epoch's running totals (at batch 0 Keras has just reset them)
            if model_state.mismatch(self.stored.manifest["variables"], slots, ("metrics",)):
                warn("the metrics differ from the checkpoint's: their running means restart at the resumed "
                     "batch; the weights are unaffected")
            else:
                self._assign(slots, ("metrics",))
        unmatched = callback_states.restore(self.others, self.stored.manifest["callbacks"], self.stored.members)
        if unmatched:
            warn(f"not restored, as this fit has no such callback at that place: {', '.join(unmatched)}")
        self.fit_callbacks[:] = [*self.others, self.owner]
        # The hooks the others missed, since the first batch they saw was replayed. At an epoch's start
        # the optimizer (its learning rate) is as saved before on_epoch_begin runs, as in the saving
        # run; mid-epoch the saved one already includes what on_epoch_begin did to it.
        if self.batch == 0:
            self._assign(slots, ("optimizer",))
        for callback in self.others:  # set aside since on_train_begin, they saw neither hook of this batch
            callback.on_epoch_begin(self.epoch)
            callback.on_train_batch_begin(self.batch)
        if self.batch > 0:
            self._assign(slots, ("optimizer",))

    # saving ---------------------------------------------------------------------------------------
    def _save(self, stopped: bool = False) -> None:
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
            "stopped": stopped,
            "members": sorted(members),
        }
        self.saved_since_last_batch = True
        if not _writes_checkpoints(self.model):  # it read every variable all the same: reads may be collective
            return
        path = storage.write(self.owner.backup_dir, manifest, members, self.owner.max_to_keep)
        log.debug("tfrepro: checkpoint %s", path)

    def end(self) -> None:
        self.substitute = None
        if self.undo_start is not None:  # no epoch began
            self.undo_start()
            self.undo_start = None
        if self.model.train_function == self._train_function:
            self.model.train_function = self.original_train_function
        if "evaluate" in self.model.__dict__:
            if self.original_evaluate is None:
                del self.model.__dict__["evaluate"]
            else:
                self.model.__dict__["evaluate"] = self.original_evaluate
        # First, so that Keras's loop over its list, now at this callback, goes on to all the others.
        self.fit_callbacks[:] = [self.owner, *self.others]
        if self.first_call is None or self.finished:
            return
        if self.model.stop_training or not self.saved_since_last_batch:
            self._save(stopped=bool(self.model.stop_training))


# helpers ------------------------------------------------------------------------------------------
def _writes_checkpoints(model: Any) -> bool:
    """Whether this process writes the checkpoint files: not under a multi-worker strategy, or its
    chief (``StrategyExtended.should_checkpoint``). Every worker restores from the chief's files."""
    extended = getattr(getattr(model, "distribute_strategy", None), "extended", None)
    return extended is None or bool(getattr(extended, "should_checkpoint", True))


def _compiled_state_unbuilt(model: Any) -> bool:
    """Whether ``compile`` left a loss or metrics that Keras builds only in the first training step."""
    if _KERAS3:
        return any(c is not None and not c.built for c in (model._compile_metrics, model._compile_loss))
    wanted = {"compiled_metrics": ("_user_metrics", "_user_weighted_metrics"), "compiled_loss": ("_user_losses",)}
    return any(container is not None and not getattr(container, "built", True)
               and any(getattr(container, name, None) for name in names)
               for container, names in ((getattr(model, key, None), names) for key, names in wanted.items()))


def _zeros_like(spec: Any) -> Any:
    """A batch of one element of zeros in the structure and dtypes of ``spec`` (dense tensors;
    Keras's input checks and metrics read shapes and dtypes only)."""
    tf = _tf.import_tf()
    return tf.nest.map_structure(lambda s: tf.zeros([1 if d is None else d for d in s.shape], s.dtype), spec)


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
    return {**storage.environment(), "model": type(model).__name__, "optimizer": type(model.optimizer).__name__,
            "steps_per_epoch": params.get("steps"), "steps_per_execution": _steps_per_execution(model)}


def _environment_mismatch(manifest: dict[str, Any], model: Any, params: dict[str, Any]) -> list[str]:
    """What makes the checkpoint unusable here (a list of lines); warns of what may change bits."""
    saved, here = dict(manifest["environment"]), _environment(model, params)
    if None in (saved.get("steps_per_epoch"), here["steps_per_epoch"]):  # unknown on one side: not compared
        saved["steps_per_epoch"] = here["steps_per_epoch"]
    return storage.environment_problems(saved, here, ("keras", "model", "optimizer", "steps_per_epoch",
                                                      "steps_per_execution", "seed"))
