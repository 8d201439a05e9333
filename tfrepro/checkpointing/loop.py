"""``LoopCheckpoint``: exact resume for a custom training loop (a ``GradientTape`` step, no
``Model.fit``). Importing this module does not import TensorFlow; using the class does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfrepro._version import __version__
from tfrepro.checkpointing import arguments, input_position, kernel_random, model_state, resuming, storage
from tfrepro.determinism import epochs as epochs_clock
from tfrepro.determinism import seeding
from tfrepro.errors import CheckpointError

log = logging.getLogger("tfrepro.checkpointing")
_made = 0


def made() -> int:
    """How many ``LoopCheckpoint``s this process made (``tfrepro run --checkpoint`` asks)."""
    return _made


@dataclass(frozen=True)
class LoopPosition:
    """Where a loop is: ``batch`` batches of ``epoch`` are done, ``trained`` batches in all."""

    epoch: int = 0
    batch: int = 0
    trained: int = 0


class LoopCheckpoint:
    """Checkpoints a custom training loop so that a run killed and started again ends bit for bit
    where the uninterrupted run ends.

    The counterpart of `tfrepro.ReproCheckpoint` for a `GradientTape` loop without `Model.fit`,
    with the same argument names (Keras's `BackupAndRestore` names; `save_freq` and `max_to_keep`
    keyword-only here, after the objects' names; their names before 0.1.0,
    `directory=`, `every=` and `keep=`, still work for this release and warn with a
    `DeprecationWarning`).

    Give it what the loop changes, by name: the model, the optimizer, and anything else trackable
    (a metric, a `tf.random.Generator`, a `tf.Variable`, a `tf.Module`). Every variable reachable
    from them is saved (through the object graph, as `tf.train.Checkpoint` walks it, plus Keras 3
    SeedGenerator states), with `tfrepro.rng_state()` and the loop's position. Then let it drive
    the loop:

    ```python
    checkpoint = tfrepro.LoopCheckpoint("ckpt", model=model, optimizer=optimizer)
    for epoch, batch in checkpoint.loop(dataset, epochs=10):
        train_step(*batch)
    ```

    `loop` resumes from the newest complete checkpoint in `backup_dir`, if there is one: it
    restores every variable and reaches the checkpoint's batch. A `tf.data.Dataset` whose draws
    are keyed by the epoch (`tfrepro.data.shuffle`, `map_with_seed`: see
    `tfrepro.checkpointing.input_position`) starts at the checkpoint's epoch, and that epoch's
    batches before the checkpoint's are skipped without computing them where the pipeline allows
    (`tfrepro.data.skip`). Other input has the batches the checkpointed run had trained drawn and
    dropped (so a reshuffling `tf.data` pipeline, a `Dataset.random` stream or a seeded
    generator is exactly where it was). The log says which. Then it sets every RNG and the variables
    to the checkpoint's again, and yields the next batch to train. It saves after every `save_freq`
    batches or at each epoch's end (`"epoch"`), and at the end. Your step runs between two batches
    it yields: a checkpoint is taken only when you ask for the next batch, so it never holds half a
    step. Its first step is watched: TF's stateful random ops (`tf.random.normal`, `tf.nn.dropout`
    without a seed tensor, ...), whose state lives in TF's kernels, raise `tfrepro.CheckpointError`
    naming the layer before anything is saved.

    For a loop of your own, `restore()` restores everything at once and returns the position, and
    `save(epoch=, batch=)` saves; the input's position is then yours to restore, and so is the
    check for TF's stateful random ops: only `loop` watches a step, so a hand-written loop gets no
    refusal (draw from stateless ops, a `tf.random.Generator` or a `SeedGenerator` there).

    Args:
        backup_dir: Path of the folder where the checkpoints live, created at the first save, as
            `BackupAndRestore`'s. `None`: under `tfrepro run --checkpoint DIR`, `DIR/loop-K`
            (K = 0, 1, ... per `LoopCheckpoint` made); elsewhere an error.
        save_freq: `"epoch"` to save at the end of every epoch, or a positive int to save after
            every `save_freq` batches, as in `BackupAndRestore`. `None`: `--checkpoint-every` under
            `tfrepro run`, else `"epoch"`.
        max_to_keep: How many checkpoints to keep, a positive int, as in
            `tf.train.CheckpointManager`. `None`: `--checkpoint-keep` under `tfrepro run`, else 3.
        **objects: What to save, by name (the names must be the same when restoring), as for
            `tf.train.Checkpoint(**kwargs)`. The argument names (`backup_dir`, `save_freq`,
            `max_to_keep`) cannot name an object, and neither, for this release, can their
            deprecated names `directory`, `every` and `keep`: they still work as the arguments
            and warn (`DeprecationWarning`), so give such an object another name.

    Attributes:
        backup_dir: The folder of the checkpoints, a `pathlib.Path`.
        save_freq: `"epoch"` or the number of batches between saves (`tfrepro run`'s where `None`
            was given).
        max_to_keep: How many checkpoints are kept (`tfrepro run`'s where `None` was given).
        objects: What is saved, by name.
        restored_from: The checkpoint `loop` or `restore` resumed from (a `pathlib.Path`), or `None`.
        position: Where the loop is, a `LoopPosition` (`epoch`; `batch`, the batches of it done
            before the one being trained; `trained`, the batches trained in all).

    Raises:
        TypeError: `backup_dir` is not a path, an argument is given both by its name and by its
            deprecated one, or a deprecated name is given something other than that argument takes
            (an object to save, say).
        ValueError: No `backup_dir` outside `tfrepro run --checkpoint`, no object to save,
            `backup_dir` is a file, or `save_freq` or `max_to_keep` is out of range.

    Limits: the model must be built (its variables exist) before `loop` or `restore`. An unbuilt
    Keras optimizer is built for the trainable variables of the models given, as the first
    `apply_gradients(zip(grads, model.trainable_variables))` builds it; one that trains other
    variables (a GAN's two) must be built first (`optimizer.build(variables)`). Random ops of a step
    traced before `loop` started (a warm-up call of your `tf.function`) are not seen. The input must
    yield the same batches in a new process (seeded, as under `tfrepro.patch`).
    """

    @arguments.renamed("LoopCheckpoint", objects_too=True)
    def __init__(self, backup_dir: str | os.PathLike[str] | None = None, *, save_freq: str | int | None = None,
                 max_to_keep: int | None = None, **objects: Any):
        global _made
        run = resuming.run_options()
        if backup_dir is None:
            if run is None:
                raise ValueError("LoopCheckpoint needs a backup_dir (or runs under `tfrepro run --checkpoint DIR`, "
                                 "which gives it DIR/loop-K)")
            backup_dir = Path(run.directory) / f"loop-{_made}"
        save_freq = (run.every if run is not None else "epoch") if save_freq is None else save_freq
        max_to_keep = (run.keep if run is not None else 3) if max_to_keep is None else max_to_keep
        self.backup_dir = arguments.checked(backup_dir, save_freq, max_to_keep)
        if not objects:
            raise ValueError("LoopCheckpoint needs what to save, by name: LoopCheckpoint(backup_dir, model=model, "
                             "optimizer=optimizer)")
        self.save_freq = save_freq
        self.max_to_keep = max_to_keep
        self.objects = dict(objects)
        self.restored_from: Path | None = None
        self.position = LoopPosition()
        _made += 1

    def checkpoints(self) -> list[Path]:
        """The complete checkpoints in `backup_dir`.

        Returns:
            Their paths, oldest first (empty when there is none or the folder does not exist).
        """
        return storage.list_checkpoints(self.backup_dir)

    # the state --------------------------------------------------------------------------------
    def _slots(self) -> list[model_state.Slot]:
        seen: set[int] = set()
        found = []
        for group, obj in self.objects.items():
            for name, variable in model_state.variables_of(obj):
                if id(variable) not in seen:
                    seen.add(id(variable))
                    found.append(model_state.Slot(group, name, variable))
        return found

    def _models(self) -> list[Any]:
        return [obj for obj in self.objects.values() if hasattr(obj, "_flatten_layers")]

    def _build_optimizers(self) -> None:
        trainable = [v for model in self._models() for v in model.trainable_variables]
        optimizers = [*self.objects.values(), *(getattr(m, "optimizer", None) for m in self._models())]
        for optimizer in optimizers:
            if hasattr(optimizer, "apply_gradients"):
                model_state.build_optimizer(optimizer, trainable)

    def _environment(self) -> dict[str, Any]:
        return {**storage.environment(), "objects": {name: type(obj).__name__ for name, obj in self.objects.items()}}

    def _load(self) -> storage.Stored | None:
        """The newest checkpoint, checked against these objects and assigned to them (not the RNGs)."""
        for model in self._models():
            kernel_random.refuse_keras2_legacy_layers(model, "LoopCheckpoint")
        stored = storage.latest(self.backup_dir)
        if stored is None:
            return None
        groups = tuple(self.objects)
        problems = storage.environment_problems(stored.manifest["environment"], self._environment(),
                                                ("keras", "objects", "seed"))
        if not problems and model_state.mismatch(stored.manifest["variables"], self._slots(), groups):
            self._build_optimizers()
        problems += model_state.mismatch(stored.manifest["variables"], self._slots(), groups)
        if problems:
            unbuilt = [name for name, obj in self.objects.items() if getattr(obj, "built", True) is False]
            hint = f" (not built: {', '.join(unbuilt)}; build before restoring, e.g. by calling it on a batch)" \
                if unbuilt else ""
            raise CheckpointError(f"{stored.path} does not fit these objects{hint}", problems)
        self._assign(stored)
        position = stored.manifest["position"]
        self.position = LoopPosition(stored.epoch, stored.batch, int(position["trained"]))
        self.restored_from = stored.path
        log.info("tfrepro: resumed from %s: epoch %d, batch %d, %d batches trained", stored.path,
                 *(self.position.epoch, self.position.batch, self.position.trained))
        return stored

    def _reach(self, data: Any, steps_per_epoch: int | None, target: tuple[int, int]) -> tuple[bool, Any]:
        """Whether ``loop`` can start at the checkpoint's epoch (input addressed by epoch), and how
        the batches before the checkpoint's in that epoch are skipped (``input_position``); logged."""
        if target == (0, 0):
            return False, None
        why = input_position.why_loop_input_replayed(data, steps_per_epoch)
        if why is not None:
            log.info("tfrepro: replaying the %d batches trained before the checkpoint: %s", self.position.trained, why)
            return False, None
        within = input_position.skip_in_dataset(data, target[1]) if target[1] > 0 else None
        how = f"epoch {target[0]}'s input drawn directly, no earlier epoch replayed"
        if within is not None:
            how += f"; {within.told(f'its {target[1]} batches before')}"
        log.info("tfrepro: %s", how)
        return True, within

    def _assign(self, stored: storage.Stored) -> None:
        for index, slot in enumerate(self._slots()):
            slot.variable.assign(model_state.saved_value(stored, index))

    def restore(self) -> LoopPosition:
        """Restores every variable and RNG from the newest checkpoint in `backup_dir`, at once.

        For a loop of your own; `loop` restores by itself. The input's position is the caller's to
        restore (`tfrepro.data.skip`, say).

        Returns:
            The checkpoint's `LoopPosition` (`epoch`, `batch` batches done in it, `trained` batches
                in all), also in `position`; `LoopPosition()`, all zero, when there is no checkpoint.

        Raises:
            tfrepro.CheckpointError: The checkpoint holds other objects (other names, shapes or
                dtypes, or an unbuilt model): it lists how they differ, and nothing is restored.
        """
        stored = self._load()
        if stored is not None:
            seeding.set_rng_state(stored.manifest["rng"])
        return self.position

    def save(self, *, epoch: int, batch: int, trained: int | None = None) -> Path:
        """Saves a checkpoint now, at the position given, keeping the newest `max_to_keep`.

        For a loop of your own; `loop` saves by itself. The file is written atomically.

        Args:
            epoch: The epoch the loop is in (0-based).
            batch: How many batches of `epoch` are done.
            trained: How many batches were trained in all, across epochs; `None`: `position.trained`.

        Returns:
            The path of the checkpoint written.
        """
        if trained is None:
            trained = self.position.trained
        self.position = LoopPosition(epoch, batch, trained)
        slots = self._slots()
        members = {f"variable/{i}": storage.array_bytes(v) for i, v in enumerate(model_state.values(slots))}
        manifest = {
            "format": storage.FORMAT,
            "tfrepro": __version__,
            "environment": self._environment(),
            "position": {"epoch": epoch, "batch": batch, "trained": trained},
            "variables": [slot.describe() for slot in slots],
            "rng": seeding.rng_state(),
            "callbacks": [],
            "logs": {},
            "stopped": False,
            "members": sorted(members),
        }
        path = storage.write(self.backup_dir, manifest, members, self.max_to_keep)
        log.debug("tfrepro: checkpoint %s", path)
        return path

    # the loop ---------------------------------------------------------------------------------
    def loop(self, data: Iterable[Any], epochs: int, steps_per_epoch: int | None = None) -> Iterator[tuple[int, Any]]:
        """Drives the training loop: yields every batch still to train, resuming as the class says.

        Each epoch iterates `data` afresh to its end; with `steps_per_epoch`, one iterator runs
        through all epochs, `steps_per_epoch` batches each (an endless dataset or a generator). It
        saves after every `save_freq` batches or at each epoch's end, and at the end; a checkpoint is
        taken only when the next batch is asked for, never in the middle of a step. The epoch is set
        for `tfrepro.data`'s keyed draws (`tfrepro.data.set_epoch`), as under `fit`. A run that had
        ended yields nothing and leaves everything as it ended.

        Args:
            data: The training input: a `tf.data.Dataset`, a list, a Keras `PyDataset`, or (with
                `steps_per_epoch`) an iterator or generator.
            epochs: How many epochs to train in all, resumed ones included (a non-negative int).
            steps_per_epoch: Batches per epoch, all drawn from one iterator; `None`: each epoch runs
                through `data` to its end.

        Yields:
            `(epoch, batch)`: the epoch (0-based) and the element of `data` to train on.

        Raises:
            ValueError: `epochs` is not a non-negative int, `data` is an iterator without
                `steps_per_epoch`, or `data` runs out before an epoch's `steps_per_epoch` batches.
            tfrepro.CheckpointError: The checkpoint holds other objects, or the first step called
                TF's stateful random ops (raised after that step, before anything is saved).
        """
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ValueError(f"epochs must be a non-negative int; got {epochs!r}")
        if steps_per_epoch is None and iter(data) is data:
            raise ValueError("data is an iterator, which one epoch exhausts: give steps_per_epoch")
        stored = self._load()
        if stored is None:
            stored_rng, target, trained = None, (0, 0), 0
        else:
            stored_rng, target, trained = stored.manifest["rng"], (stored.epoch, stored.batch), self.position.trained
        if target >= (epochs, 0):  # the run had ended: as it left everything
            if stored_rng is not None:
                seeding.set_rng_state(stored_rng)
            return
        pending, watched, saved, iterator = stored is not None, False, True, None
        direct, within = self._reach(data, steps_per_epoch, target) if stored is not None else (False, None)

        def arrive(epoch: int, batch: int) -> None:
            nonlocal pending
            if pending and (epoch, batch) == target:  # undo what the replay drew: as the checkpoint was
                pending = False
                self._assign(stored)
                seeding.set_rng_state(stored_rng)

        for epoch in range(epochs):
            arrive(epoch, 0)
            epochs_clock.set_epoch(epoch)  # keyed draws (tfrepro.data) belong to this epoch, as under fit
            if direct and epoch < target[0]:  # input addressed by epoch: nothing before the checkpoint's is drawn
                continue
            batch = 0
            if steps_per_epoch is None or iterator is None:
                iterator = iter(data)
                if direct and epoch == target[0] and within is not None and within.dataset is not None:
                    iterator, batch = iter(within.dataset), target[1]  # the batches before it, skipped uncomputed
            while steps_per_epoch is None or batch < steps_per_epoch:
                arrive(epoch, batch)
                try:
                    element = next(iterator)
                except StopIteration:
                    if steps_per_epoch is not None:
                        raise ValueError(f"data ran out in epoch {epoch} after {batch} of {steps_per_epoch} "
                                         "batches") from None
                    break
                if (epoch, batch) < target:  # replayed: drawn and dropped
                    batch += 1
                    continue
                self.position = LoopPosition(epoch, batch, trained)
                if watched:
                    yield epoch, element
                else:  # the first step: does it call random ops whose state is in TF's kernels?
                    watched = True
                    with kernel_random.watching() as ops:
                        yield epoch, element
                    found = kernel_random.findings(ops, self._models(), "the training step")
                    if found:
                        raise CheckpointError(kernel_random.refusal(found, "LoopCheckpoint"),
                                              found if len(found) > 1 else None)
                batch += 1
                trained += 1
                saved = False
                if self.save_freq != "epoch" and trained % self.save_freq == 0:
                    self.save(epoch=epoch, batch=batch, trained=trained)
                    saved = True
            arrive(epoch + 1, 0)
            if self.save_freq == "epoch" and not saved:
                self.save(epoch=epoch + 1, batch=0, trained=trained)
                saved = True
        if not saved:
            self.save(epoch=epochs, batch=0, trained=trained)
        self.position = LoopPosition(epochs, 0, trained)
