"""``repeat()`` over draws keyed by the training epoch: each pass keyed anew, by TF's repeat.

A pass over a keyed draw (``tfrepro.data.shuffle``, ``map_with_seed``, ``Dataset.shuffle`` under
``patch``) reads the epoch clock when its first element is made. Under ``repeat()``, every pass after
the first starts ahead of training, while the last steps of the epoch before it still run, so the
epoch it would read races with ``fit``'s clock. A ``repeat()`` of such a pipeline is built instead
as TF's ``repeat()`` of one pass made again, inside ``flat_map``, with its draws keyed by a number
that the pass draws as it begins, from ``Dataset.random(seed)`` rerandomised each pass (TF's own
pass counter: a resource outside any tf.data function, so the pipeline's maps stay parallel under
op determinism). So passes are keyed in the order they begin, never by the clock: every run the
same, every pass another, whatever ``fit`` does meanwhile; TF's repeat keeps its own rules (an
empty pass ends it, its count, its cardinality). Like ``Dataset.shuffle``'s own reshuffle, pass k
of a dataset draws by the k passes of it before (across its iterators), so a resume replays it.

Making a pass again re-applies the ``tf.data.Dataset`` methods the pipeline was made with: every
method called on a keyed dataset, or on one made from it, is recorded with its arguments
(``_recording``) and called again inside the pass's function, where the functions it was given
(``map``'s) are traced once more. A pipeline made otherwise between a draw and the repeat (a dataset
class built directly, an experimental transformation not passed through ``Dataset.apply``), or
holding a step that would start its own draws afresh in every pass (TF's ``shuffle``,
``sample_from_datasets``), cannot be made again: its ``repeat()`` raises, naming it
(``why_not_repeatable``).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfrepro import _targets, _tf
from tfrepro.data import passes

# Dataset methods whose results are recorded when applied to a keyed pipeline: all that make a
# dataset from datasets, by their arguments alone.
_METHODS = ("apply", "batch", "bucket_by_sequence_length", "cache", "concatenate", "enumerate", "filter",
            "flat_map", "group_by_window", "ignore_errors", "interleave", "map", "padded_batch", "prefetch",
            "ragged_batch", "rebatch", "repeat", "scan", "shard", "shuffle", "skip", "sparse_batch", "take",
            "take_while", "unbatch", "unique", "window", "with_options")
_STATIC_METHODS = ("zip", "choose_from_datasets", "sample_from_datasets")
# Steps that draw by the passes of themselves before: made again in each pass, they would start over.
_RESTARTING = {"shuffle": "TF's own Dataset.shuffle (a new one in each pass would repeat its first order)",
               "sample_from_datasets": "Dataset.sample_from_datasets (a new one in each pass would repeat its draws)"}


@dataclass(frozen=True)
class _Made:
    """How a dataset was made: from ``inputs`` (datasets), by ``remake(remade, epoch)``, which makes it
    again from ``remade(input)`` of each input, its draws keyed by the epoch tensor ``epoch``.
    ``racing``: it is a draw that reads the epoch clock itself; ``why_not``: why it cannot be made
    again in each pass (then ``remake`` is never called)."""

    inputs: tuple[Any, ...]
    remake: Callable[[Callable[[Any], Any], Any], Any]
    racing: bool = False
    why_not: str | None = None


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
            if found[id(current)] and (made is None or made.why_not is not None):
                missing.append(made.why_not if made is not None else
                               f"it is made by {type(current).__name__}, not by a tf.data.Dataset method that "
                               f"tfrepro records ({', '.join(_METHODS + _STATIC_METHODS)})")
        return found[id(current)]

    needs(dataset)
    return missing[0] if missing else None


def keyed_passes(dataset: Any, count: int, seed: int, name: Any = None) -> Any:
    """TF's ``repeat(count)`` (``count`` < 0: endless) of ``dataset`` made again for each pass, its
    draws keyed by a number ``Dataset.random(seed)`` draws as the pass begins."""
    tf = _tf.import_tf()
    numbers = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(1)

    def one_pass(number: Any) -> Any:
        setattr(tf.compat.v1.get_default_graph(), passes.REMADE_PASS, True)
        return _remake(dataset, number)

    repeated = _original_repeat(numbers.flat_map(one_pass), count, name)
    length = tf.get_static_value(dataset.cardinality())
    if length is not None and length > 0:
        total = tf.data.INFINITE_CARDINALITY if count < 0 else int(length) * count
        repeated = repeated.apply(tf.data.experimental.assert_cardinality(tf.constant(total, tf.int64)))
    if not getattr(tf.compat.v1.get_default_graph(), "building_function", False):  # a repeat inside a pass: the
        repeated = repeated.with_options(dataset.options())  # enclosing pipeline's options hold
    _made[repeated] = _Made((dataset,), lambda remade, epoch: keyed_passes(remade(dataset), count, seed, name))
    return repeated


def remade_at(dataset: Any, epoch: int) -> Any:
    """``dataset`` made again with its draws at the fixed ``epoch`` (``why_not_repeatable`` is None)."""
    return _remake(dataset, _tf.import_tf().constant(epoch, _tf.import_tf().int64))


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


def set_original_repeat(repeat: Callable[..., Any]) -> None:
    """TF's own ``Dataset.repeat`` (``pipeline_checks`` wraps the public one)."""
    global _original_repeat
    _original_repeat = repeat


_original_repeat: Callable[..., Any] = None  # type: ignore[assignment]


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

            _made[result] = _Made(tuple(inputs), remake, why_not=_RESTARTING.get(method.__name__))
        return result

    return recorded


def _dataset_ops() -> Any:
    from tensorflow.python.data.ops import dataset_ops  # DatasetV2._inputs: no public equivalent

    return dataset_ops
