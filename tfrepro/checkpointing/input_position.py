"""How a resume reaches the checkpoint's input position: directly, when the input can be addressed
by epoch, or by replaying the batches before it.

Directly (``why_replayed`` is None): ``fit``'s loop starts at the checkpoint's epoch
(``start_fit_at``: through the hook Keras's own ``BackupAndRestore`` uses), so the epochs before it
are neither drawn nor validated and no iterator is made for them; the checkpoint's epoch is drawn as
itself (its keyed draws depend on the epoch, not on the passes before). Where that hook is missing,
``fit`` goes through the earlier epochs without pulling a batch. Inside the checkpoint's epoch, the
batches before the checkpoint's are skipped without computing them where the pipeline allows
(``skip_within_epoch``: past its batches and maps, down to a keyed shuffle or the source), else drawn
and dropped. The cost of a resume is then at most one epoch's input, however far the run got, and
where the skip reaches the source, not even that.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tfrepro import _tf
from tfrepro.data import skipping
from tfrepro.data.addressing import why_not_addressable
from tfrepro.determinism import epochs, state


def fit_arguments(depth: int = 12) -> dict[str, Any] | None:
    """The arguments of the ``Model.fit`` running the caller (from its frame), or None."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        if frame.f_code.co_name == "fit" and {"x", "initial_epoch"} <= set(frame.f_locals):
            return dict(frame.f_locals)
        frame = frame.f_back
    return None


def start_fit_at(model: Any, epoch: int, arguments: dict[str, Any]) -> Callable[[], None] | None:
    """Make the ``fit`` now in ``on_train_begin`` begin its epoch loop at ``epoch``, as Keras's
    ``BackupAndRestore`` does (Keras 3: ``model._initial_epoch``; Keras 2: ``model._training_state``,
    read once, right after ``on_train_begin``). Returns what undoes it, to be called as the first
    epoch begins; None where this Keras has no such hook (or another callback holds it)."""
    if epoch <= int(arguments.get("initial_epoch") or 0):
        return None
    if _tf.keras_major(_tf.keras_module()) >= 3:
        if not hasattr(model, "_initial_epoch"):
            return None
        if model._initial_epoch is not None:  # BackupAndRestore's
            return None
        model._initial_epoch = epoch
        epochs.set_epoch(epoch)
        return lambda: setattr(model, "_initial_epoch", None)
    if getattr(model, "_training_state", False) is not None:  # missing, or BackupAndRestore's
        return None
    start = model._training_state = _StartAt(model, epoch)
    epochs.set_epoch(epoch)  # Keras 2 makes the epoch's iterator before on_epoch_begin
    return start.undo


class _StartAt:
    """What Keras 2's ``fit`` asks, after ``on_train_begin``, for the (epoch, step) to begin at; it
    asks once, and the answer undoes the question."""

    def __init__(self, model: Any, epoch: int):
        self.model, self.epoch = model, epoch

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch: Any, initial_epoch: int,
                                              mode: Any = None) -> tuple[int, int]:
        self.undo()
        return self.epoch, 0

    def maybe_load_initial_epoch_from_ckpt(self, initial_epoch: int, mode: Any = None) -> int:  # graph-mode fit
        self.undo()
        return self.epoch

    def undo(self) -> None:
        if getattr(self.model, "_training_state", None) is self:
            self.model._training_state = None


def why_replayed(model: Any, params: dict[str, Any], arguments: dict[str, Any] | None) -> str | None:
    """None if a resume can jump to the checkpoint's epoch; else why its input must be replayed."""
    if arguments is None:
        return "ReproCheckpoint cannot see the fit's arguments"
    if not params.get("steps"):
        return "fit does not know its steps per epoch"
    if arguments.get("validation_steps") is not None:
        return "validation_steps keeps one validation iterator across epochs"
    strategy = type(getattr(model, "distribute_strategy", None)).__name__
    if strategy not in ("NoneType", "_DefaultDistributionStrategy", "_DefaultDistributionStrategyV1"):
        return f"it runs under {strategy}, whose distributed input tfrepro does not position directly"
    tf = _tf.import_tf()
    x, steps = arguments.get("x"), arguments.get("steps_per_epoch")
    if steps is not None and not (isinstance(x, tf.data.Dataset) and int(x.cardinality()) == steps):
        return "steps_per_epoch makes an epoch other than one pass over the input"
    why = _why_input_replayed(tf, x, arguments.get("shuffle", True), "the training input")
    if why is None and arguments.get("validation_data") is not None:
        validation = arguments["validation_data"]
        validation = validation[0] if isinstance(validation, tuple) and not _is_array(tf, validation) else validation
        why = _why_input_replayed(tf, validation, False, "the validation input")
    return why


def _why_input_replayed(tf: Any, x: Any, shuffle: Any, what: str) -> str | None:
    if isinstance(x, tf.data.Dataset):
        try:
            why = why_not_addressable(x)
        except Exception as exc:  # a graph too large to serialise, say
            return f"{what}: its graph could not be read ({type(exc).__name__})"
        return None if why is None else f"{what}: {why}"
    if _is_array(tf, x):
        if shuffle == "batch":
            return f"{what}: fit(shuffle='batch') keeps Keras's own draws"
        if shuffle and state.active_seed() is None:
            return f"{what}: fit's shuffle of arrays is keyed by the epoch only under tfrepro.patch"
        return None
    return f"{what} is a {type(x).__name__}, which tfrepro cannot address by epoch"


def _is_array(tf: Any, x: Any) -> bool:
    """Arrays, tensors, or a list, tuple or dict of them (what Keras slices itself)."""
    if isinstance(x, (list, tuple)):
        return len(x) > 0 and all(_is_array(tf, v) for v in x)
    if isinstance(x, dict):
        return len(x) > 0 and all(_is_array(tf, v) for v in x.values())
    composite = (tf.SparseTensor, tf.RaggedTensor, tf.data.Dataset)  # Keras 2 reshuffles composites with Dataset.shuffle
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, composite)


def skip_within_epoch(iterator: Any, batches: int) -> skipping.Skip:
    """The plan (``tfrepro.data.skip``'s) to skip the first ``batches`` of the epoch that Keras's
    ``iterator`` is over without computing them: its dataset rewritten to start at batch ``batches``
    (a new iterator over it reads the epoch clock as its first element is made), or why not."""
    dataset = getattr(iterator, "_dataset", None)  # tf.data's iterators keep theirs alive
    tf = _tf.import_tf()
    if not isinstance(dataset, tf.data.Dataset):
        return skipping.Skip(batches, why_not=f"Keras's {type(iterator).__name__} does not show its dataset")
    if any(type(spec) is not tf.TensorSpec or spec.shape.rank is None for spec in tf.nest.flatten(dataset.element_spec)):
        return skipping.Skip(batches, why_not="its batches hold composite tensors (ragged or sparse) or ones of "
                                              "unknown rank")
    return skip_in_dataset(dataset, batches)


def skip_in_dataset(dataset: Any, batches: int) -> skipping.Skip:
    """``tfrepro.data.skip``'s plan for the first ``batches`` of ``dataset``, its failures said, not raised."""
    try:
        return skipping.plan(dataset, batches)
    except Exception as exc:  # a graph tfrepro cannot read or rebuild: drawing them is always exact
        return skipping.Skip(batches, why_not=f"its graph could not be rewritten ({type(exc).__name__}: "
                                              f"{str(exc).splitlines()[0] if str(exc) else ''})")


def why_loop_input_replayed(data: Any, steps_per_epoch: int | None) -> str | None:
    """None if a ``LoopCheckpoint.loop`` over ``data`` can start at the checkpoint's epoch; else why
    its batches before the checkpoint's must be replayed."""
    tf = _tf.import_tf()
    if steps_per_epoch is not None:
        return "with steps_per_epoch, one iterator runs through all epochs"
    return _why_input_replayed(tf, data, False, "the input") if isinstance(data, tf.data.Dataset) else (
        f"the input is a {type(data).__name__}, which tfrepro cannot address by epoch")
