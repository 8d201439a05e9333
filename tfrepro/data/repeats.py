"""``repeat()`` over draws keyed by the training epoch: each pass keyed by its ordinal.

A pass over a keyed draw (``tfrepro.data.shuffle``, ``map_with_seed``, ``Dataset.shuffle`` under
``patch``) reads the epoch clock when its first element is made. Under ``repeat()``, every pass after
the first starts ahead of training, while the last steps of the epoch before it still run, so the
epoch it would read races with ``fit``'s clock. A ``repeat()`` of such a pipeline is built instead as
passes keyed by their ordinal (``ordinal_passes``): the clock is read once, when the repeat's first
element is made (``e0``), and pass ``k`` is the pipeline made again with its draws at epoch
``e0 + k``, the draws that epoch gets without the repeat. Under ``fit(steps_per_epoch=)`` one pass
long, that is every epoch's own draws.

Making a pipeline again re-applies the ``tf.data.Dataset`` methods it was made with: every method
called on a keyed dataset, or on one made from it, is recorded with its arguments (``_record``), and
is called again inside the pass's function, where the functions it was given (``map``'s) are traced
once more. A pipeline made otherwise between a draw and the repeat (a dataset class built directly,
an experimental transformation not passed through ``Dataset.apply``) cannot be made again: its
``repeat()`` raises, naming it (``why_not_repeatable``).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfrepro import _targets, _tf
from tfrepro.data import passes
from tfrepro.determinism import epochs

# Dataset methods whose results are recorded when applied to a keyed pipeline: all that make a
# dataset from datasets, by their arguments alone.
_METHODS = ("apply", "batch", "bucket_by_sequence_length", "cache", "concatenate", "enumerate", "filter",
            "flat_map", "group_by_window", "ignore_errors", "interleave", "map", "padded_batch", "prefetch",
            "ragged_batch", "rebatch", "repeat", "scan", "shard", "shuffle", "skip", "sparse_batch", "take",
            "take_while", "unbatch", "unique", "window", "with_options")
_STATIC_METHODS = ("zip", "choose_from_datasets", "sample_from_datasets")
_ENDLESS = 2**62  # passes of an endless repeat: more than any run makes


@dataclass(frozen=True)
class _Made:
    """How a dataset was made: from ``inputs`` (datasets), by ``remake(remade, epoch)``, which makes it
    again from ``remade(input)`` of each input, its draws keyed by the epoch tensor ``epoch``.
    ``racing``: it is a draw that reads the epoch clock itself."""

    inputs: tuple[Any, ...]
    remake: Callable[[Callable[[Any], Any], Any], Any]
    racing: bool = False


_made: weakref.WeakKeyDictionary[Any, _Made] = weakref.WeakKeyDictionary()
_installed = False


def register_draw(dataset: Any, source: Any, build: Callable[[Any, Any], Any], racing: bool) -> None:
    """Records that ``dataset`` is a keyed draw on ``source``, made again at an epoch by
    ``build(source, epoch)``; ``racing``: it reads the epoch clock (no fixed epoch)."""
    _made[dataset] = _Made((source,), lambda remade, epoch: build(remade(source), epoch), racing)


def why_not_repeatable(dataset: Any) -> str | None:
    """None if ``dataset``'s keyed draws can be made again at each pass's epoch; else which dataset
    between a draw and ``dataset`` was not made by a recorded ``Dataset`` method."""
    found: dict[int, bool] = {}
    missing: list[Any] = []

    def needs(current: Any) -> bool:  # whether ``current`` is, or is made from, a draw that reads the clock
        if id(current) not in found:
            found[id(current)] = False  # a cycle cannot happen; this only guards the walk
            made = _made.get(current)
            inputs = made.inputs if made is not None else _inputs(current)
            from_draws = [needs(each) for each in inputs]
            found[id(current)] = (made is not None and made.racing) or any(from_draws)
            if found[id(current)] and made is None:
                missing.append(current)
        return found[id(current)]

    needs(dataset)
    if not missing:
        return None
    return (f"it is made by {type(missing[0]).__name__}, not by a tf.data.Dataset method that tfrepro records "
            f"({', '.join(_METHODS + _STATIC_METHODS)})")


def ordinal_passes(dataset: Any, count: int, first_epoch: Any = None) -> Any:
    """``dataset.repeat(count)`` (``count`` < 0: endless), pass ``k`` made again with its draws at
    epoch ``e0 + k``: ``e0`` the clock when the first element is made, or ``first_epoch``."""
    tf = _tf.import_tf()
    first = epochs.records() if first_epoch is None else tf.data.Dataset.from_tensors(tf.cast(first_epoch, tf.int64))
    ordinals = tf.data.Dataset.range(_ENDLESS if count < 0 else count)

    def passes_from(e0: Any) -> Any:
        def one_pass(k: Any) -> Any:
            setattr(tf.compat.v1.get_default_graph(), passes.ORDINAL_PASS, True)
            return _remake(dataset, e0 + k)

        return ordinals.flat_map(one_pass)

    repeated = first.flat_map(passes_from)
    length = tf.get_static_value(dataset.cardinality())
    if length is not None and length > 0:
        total = tf.data.INFINITE_CARDINALITY if count < 0 else int(length) * count
        repeated = repeated.apply(tf.data.experimental.assert_cardinality(tf.constant(total, tf.int64)))
    if not getattr(tf.compat.v1.get_default_graph(), "building_function", False):  # a repeat inside a pass: the
        repeated = repeated.with_options(dataset.options())  # enclosing pipeline's options hold
    _made[repeated] = _Made((dataset,), lambda remade, epoch: ordinal_passes(remade(dataset), count, epoch),
                            first_epoch is None)
    return repeated


def _remake(dataset: Any, epoch: Any) -> Any:
    """``dataset`` made again from its recorded steps, its draws at ``epoch``; each dataset once."""
    remade: dict[int, Any] = {}

    def remake(current: Any) -> Any:
        made = _made.get(current)
        if made is None:
            return current
        if id(current) not in remade:
            remade[id(current)] = made.remake(remake, epoch)
        return remade[id(current)]

    return remake(dataset)


def _inputs(dataset: Any) -> list[Any]:
    try:
        return list(dataset._inputs())  # ``tf:dataset_inputs``
    except (NotImplementedError, AttributeError, TypeError):
        return []


def record_methods() -> None:
    """Record, from now on, every ``Dataset`` method applied to a keyed pipeline (once per process;
    ``pipeline_checks`` calls it as the first keyed dataset is made)."""
    global _installed
    if _installed:
        return
    _installed = True
    tf = _tf.import_tf()
    dataset_class = tf.data.Dataset
    if _targets.find(_dataset_ops(), "tf:dataset_inputs") is None:
        return  # warned about by name: a keyed pipeline's repeat() then raises, as it cannot be checked
    for name in _METHODS:
        original = getattr(dataset_class, name, None)
        if original is not None:
            setattr(dataset_class, name, _recording(original, tf))
    for name in _STATIC_METHODS:
        original = dataset_class.__dict__.get(name)
        if isinstance(original, staticmethod):
            setattr(dataset_class, name, staticmethod(_recording(original.__func__, tf)))


def _recording(method: Callable[..., Any], tf: Any) -> Callable[..., Any]:
    @functools.wraps(method)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        arguments = (args, kwargs)
        inputs = [d for d in tf.nest.flatten(arguments) if isinstance(d, tf.data.Dataset)]
        if isinstance(result, tf.data.Dataset) and result not in _made and any(d in _made for d in inputs):
            def remake(remade: Callable[[Any], Any], epoch: Any) -> Any:
                again_args, again_kwargs = tf.nest.map_structure(
                    lambda d: remade(d) if isinstance(d, tf.data.Dataset) else d, arguments)
                return method(*again_args, **again_kwargs)

            _made[result] = _Made(tuple(inputs), remake)
        return result

    return recorded


def _dataset_ops() -> Any:
    from tensorflow.python.data.ops import dataset_ops  # DatasetV2._inputs: no public equivalent

    return dataset_ops
