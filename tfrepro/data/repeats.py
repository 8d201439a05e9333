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


def _restarting(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why a recorded step, made again in each pass, would start its own draws over (TF's reshuffling
    ``shuffle``, a rerandomised ``sample_from_datasets``), or None."""
    if name == "shuffle":
        reshuffle = kwargs.get("reshuffle_each_iteration", args[3] if len(args) > 3 else None)
        if reshuffle is None or reshuffle:
            return "TF's own reshuffling Dataset.shuffle (a new one in each pass would repeat its first order)"
    if name == "sample_from_datasets" and kwargs.get("rerandomize_each_iteration", args[4] if len(args) > 4 else None):
        return "a rerandomised Dataset.sample_from_datasets (a new one in each pass would repeat its draws)"
    return None


def clock_draws_in_functions(dataset: Any) -> list[Any]:
    """The draws keyed by the training epoch that ``dataset``'s own functions make (an
    ``interleave``'s sub-datasets): each pass of a sub-dataset reads the clock as it starts."""
    try:
        wrappers = dataset._functions()  # DatasetV2._functions: no public equivalent
    except (AttributeError, NotImplementedError, TypeError):
        return []
    return [draw for wrapper in wrappers for draw in getattr(getattr(wrapper.function, "graph", None), DRAWS, ())]


DRAWS = "_tfrepro_clock_draws"  # on a tf.data function's graph: the draws keyed by the training epoch made in it


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
                               f"it is made by {type(current).__name__}, not by a tf.data.Dataset method (tfrepro "
                               "records those, and Dataset.apply's)")
        return found[id(current)]

    needs(dataset)
    return missing[0] if missing else None


def keyed_passes(dataset: Any, count: int, seed: int, name: Any = None) -> Any:
    """TF's ``repeat(count)`` (``count`` < 0: endless) of ``dataset`` made again for each pass, its
    draws keyed by a 64-bit number ``Dataset.random(seed)`` draws as the pass begins."""
    tf = _tf.import_tf()
    if tf.get_static_value(dataset.cardinality()) == 0:
        return _original_repeat(dataset, count, name)
    halves = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2).take(1)
    numbers = halves.map(lambda pair: pair[0] * 2**32 + pair[1])

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
    return repeated  # keyed by its own numbers, not the clock: a pass made again takes it as it is


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

    passes._remade_epochs.append(epoch)  # draws made inside the pass's functions take its epoch
    try:
        return remake(dataset)
    finally:
        passes._remade_epochs.pop()


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
        inside = isinstance(result, tf.data.Dataset) and bool(clock_draws_in_functions(result))
        if isinstance(result, tf.data.Dataset) and result not in _made and (inside or any(d in _made for d in inputs)):
            def remake(remade: Callable[[Any], Any], epoch: Any) -> Any:
                again_args, again_kwargs = tf.nest.map_structure(
                    lambda d: remade(d) if isinstance(d, tf.data.Dataset) else d, arguments)
                return method(*again_args, **again_kwargs)

            _made[result] = _Made(tuple(inputs), remake, racing=inside,
                                  why_not=_restarting(method.__name__, args, kwargs))
        return result

    return recorded


def _dataset_ops() -> Any:
    from tensorflow.python.data.ops import dataset_ops  # DatasetV2._inputs: no public equivalent

    return dataset_ops
