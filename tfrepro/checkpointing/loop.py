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
from tfrepro.checkpointing import input_position, kernel_random, model_state, resuming, storage
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

    Give it what the loop changes, by name: the model, the optimizer, and anything else trackable
    (a metric, a ``tf.random.Generator``, a ``tf.Variable``, a ``tf.Module``). Every variable reachable
    from them is saved (through the object graph, as ``tf.train.Checkpoint`` walks it, plus Keras 3
    SeedGenerator states), with ``tfrepro.rng_state()`` and the loop's position. Then let it drive
    the loop::

        checkpoint = tfrepro.LoopCheckpoint("ckpt", model=model, optimizer=optimizer)
        for epoch, batch in checkpoint.loop(dataset, epochs=10):
            train_step(*batch)

    ``loop`` resumes from the newest complete checkpoint in ``directory``, if there is one: it
    restores every variable and reaches the checkpoint's batch. A ``tf.data.Dataset`` whose draws
    are keyed by the epoch (``tfrepro.data.shuffle``, ``map_with_seed``: see
    ``tfrepro.checkpointing.input_position``) starts at the checkpoint's epoch, and that epoch's
    batches before the checkpoint's are skipped without computing them where the pipeline allows
    (``tfrepro.data.skip``). Other input has the batches the checkpointed run had trained drawn and
    dropped (so a reshuffling ``tf.data`` pipeline, a ``Dataset.random`` stream or a seeded
    generator is exactly where it was). The log says which. Then it sets every RNG and the variables
    to the checkpoint's again, and yields the next batch to train. It saves after every ``every`` batches or at each epoch's end (``"epoch"``), and
    at the end. Your step runs between two batches it yields: a checkpoint is taken only when you ask
    for the next batch, so it never holds half a step. Its first step is watched: TF's stateful random
    ops (``tf.random.normal``, ``tf.nn.dropout`` without a seed tensor, ...), whose state lives in
    TF's kernels, raise ``CheckpointError`` naming the layer before anything is saved.

    For a loop of your own, ``restore()`` restores everything at once and returns the position, and
    ``save(epoch=, batch=)`` saves; the input's position is then yours to restore, and so is the
    check for TF's stateful random ops: only ``loop`` watches a step, so a hand-written loop gets no
    refusal (draw from stateless ops, a ``tf.random.Generator`` or a ``SeedGenerator`` there).

    Args:
        directory: where the checkpoints live. None: under ``tfrepro run --checkpoint DIR``,
            ``DIR/loop-K`` (K = 0, 1, ... per ``LoopCheckpoint`` made); elsewhere an error.
        every: "epoch", or a positive number of batches (None: ``--checkpoint-every`` under
            ``tfrepro run``, else "epoch").
        keep: how many checkpoints to keep (None: ``--checkpoint-keep``, else 3).
        **objects: what to save, by name (the names must be the same when restoring).

    Limits: the model must be built (its variables exist) before ``loop`` or ``restore``. An unbuilt
    Keras optimizer is built for the trainable variables of the models given, as the first
    ``apply_gradients(zip(grads, model.trainable_variables))`` builds it; one that trains other
    variables (a GAN's two) must be built first (``optimizer.build(variables)``). Random ops of a step traced
    before ``loop`` started (a warm-up call of your ``tf.function``) are not seen. The input must
    yield the same batches in a new process (seeded, as under ``tfrepro.patch``).
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, every: str | int | None = None,
                 keep: int | None = None, **objects: Any):
        global _made
        run = resuming.run_options()
        if directory is None:
            if run is None:
                raise ValueError("LoopCheckpoint needs a directory (or runs under `tfrepro run --checkpoint DIR`, "
                                 "which gives it DIR/loop-K)")
            directory = Path(run.directory) / f"loop-{_made}"
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path; got {type(directory).__name__}")
        every = (run.every if run is not None else "epoch") if every is None else every
        keep = (run.keep if run is not None else 3) if keep is None else keep
        storage.check_schedule(every, keep)
        if not objects:
            raise ValueError("LoopCheckpoint needs what to save, by name: LoopCheckpoint(dir, model=model, "
                             "optimizer=optimizer)")
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"directory is a file: {self.directory}")
        self.every = every
        self.keep = keep
        self.objects = dict(objects)
        self.restored_from: Path | None = None
        self.position = LoopPosition()
        _made += 1

    def checkpoints(self) -> list[Path]:
        """The complete checkpoints in ``directory``, oldest first."""
        return storage.list_checkpoints(self.directory)

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
        stored = storage.latest(self.directory)
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
        """Restore every variable and RNG from the newest checkpoint; return its position
        (``LoopPosition()``, all zero, when there is none). Raises CheckpointError for a checkpoint
        of other objects, listing how they differ."""
        stored = self._load()
        if stored is not None:
            seeding.set_rng_state(stored.manifest["rng"])
        return self.position

    def save(self, *, epoch: int, batch: int, trained: int | None = None) -> Path:
        """Save now, at ``batch`` batches done in ``epoch`` (``trained``: batches in all, by default
        ``position.trained``). Returns the file written."""
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
        path = storage.write(self.directory, manifest, members, self.keep)
        log.debug("tfrepro: checkpoint %s", path)
        return path

    # the loop ---------------------------------------------------------------------------------
    def loop(self, data: Iterable[Any], epochs: int, steps_per_epoch: int | None = None) -> Iterator[tuple[int, Any]]:
        """Yield ``(epoch, batch)`` for every batch still to train, resuming as the class says.

        Each epoch iterates ``data`` afresh (a ``tf.data.Dataset``, a list, a Keras ``PyDataset``) to
        its end; with ``steps_per_epoch``, one iterator runs through all epochs, ``steps_per_epoch``
        batches each (an endless dataset or a generator). A run that had ended yields nothing and
        leaves everything as it ended."""
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
                if self.every != "epoch" and trained % self.every == 0:
                    self.save(epoch=epoch, batch=batch, trained=trained)
                    saved = True
            arrive(epoch + 1, 0)
            if self.every == "epoch" and not saved:
                self.save(epoch=epoch + 1, batch=0, trained=trained)
                saved = True
        if not saved:
            self.save(epoch=epochs, batch=0, trained=trained)
        self.position = LoopPosition(epochs, 0, trained)
