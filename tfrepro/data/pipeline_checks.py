"""Pipelines that would silently undo keyed draws are named, or made right, as they are built.

A keyed draw (``map_with_seed``, ``shuffle``, ``Dataset.shuffle`` under ``patch``) is a function of
its seed, its key, the epoch and the element. Four ways of building on one would break that without
an error anywhere:

- ``repeat()`` after a draw keyed by the training epoch would start every later pass ahead of
  training, reading an epoch that races with ``fit``'s clock. It is built as passes keyed by their
  ordinal instead (``repeats``); where the pipeline cannot be made again, it raises ``ValueError``.
- ``cache()`` after such a draw keeps the first pass's draws for every epoch: warned about.
- ``Dataset.zip`` of two draws with one seed and key (the same augmentation mapped twice for two
  views, two ``shuffle`` calls with the default key) gives both the same numbers, and so does a
  draw applied on top of one with the same seed and key: warned about (give each its own ``key``).
- A custom loop that never sets the epoch clock (no ``fit``, no ``tfrepro.data.set_epoch``) would
  draw epoch 0's numbers in every pass. Until the clock is set, each new iterator over a pipeline
  with such draws (``Dataset.__iter__``) moves it on by one instead: pass ``n`` of the process draws
  epoch ``n``'s numbers, in every run the same.

``mark`` registers a keyed dataset; the checks walk a dataset's inputs (``DatasetV2._inputs``, a
``_targets`` entry) to the marked ones. They are put on ``tf.data.Dataset`` the first time a keyed
dataset is made, and cost nothing for pipelines without one.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfrepro import _targets, _tf
from tfrepro.data import repeats
from tfrepro.determinism import epochs
from tfrepro.errors import warn


@dataclass(frozen=True)
class Draw:
    """What a keyed dataset draws: ``what`` in words, its ``seed`` and ``purpose`` (its key), and
    whether its epoch is fixed (None: the training epoch, read when each pass begins)."""

    what: str
    seed: int
    purpose: tuple[int | str, ...]
    epoch: int | None


_marked: weakref.WeakKeyDictionary[Any, Draw] = weakref.WeakKeyDictionary()
_installed = False
_unclocked_passes = 0  # iterators made over epoch-keyed draws while the clock was never set


def mark(dataset: Any, draw: Draw, source: Any, build: Callable[[Any, Any], Any]) -> Any:
    """``dataset``, registered as drawing ``draw`` on ``source``, made again at an epoch (an int64
    tensor) by ``build(source, epoch)`` (and the checks put in place, once). A ``source`` already
    built on a draw of the same seed and key is warned about: each element would get the same
    numbers twice (an augmentation applied twice with one key)."""
    _install()
    if any((earlier.seed, earlier.purpose) == (draw.seed, draw.purpose) for earlier in draws_in(source)):
        warn(f"{draw.what} is applied to a dataset already built on a draw with the same seed and key: each element "
             "gets the same numbers twice; give the second its own key=")
    _marked[dataset] = draw
    repeats.register_draw(dataset, source, build, racing=draw.epoch is None)
    return dataset


def draws_in(dataset: Any) -> list[Draw]:
    """The keyed draws that ``dataset`` is built on, itself included, each once."""
    walkable = _targets.find(_dataset_ops(), "tf:dataset_inputs") is not None  # each class defines its own
    found: list[Draw] = []
    seen: set[int] = set()
    stack = [dataset]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        draw = _marked.get(current)
        if draw is not None and draw not in found:
            found.append(draw)
        if walkable:
            try:
                stack.extend(current._inputs())
            except (NotImplementedError, AttributeError, TypeError):
                continue
    return found


def _dataset_ops() -> Any:
    from tensorflow.python.data.ops import dataset_ops  # DatasetV2._inputs: no public equivalent

    return dataset_ops


def _install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    dataset = _tf.import_tf().data.Dataset
    original_repeat, original_cache, original_iter = dataset.repeat, dataset.cache, dataset.__iter__
    original_zip = dataset.__dict__["zip"].__func__

    @functools.wraps(original_repeat)
    def repeat(self: Any, count: Any = None, name: Any = None) -> Any:
        passes = _tf.import_tf().get_static_value(count) if count is not None else -1
        if passes is None or passes > 1 or passes < 0:
            racing = [draw for draw in draws_in(self) if draw.epoch is None]
            why = ("its count is not known as the pipeline is built" if passes is None
                   else repeats.why_not_repeatable(self)) if racing else None
            if why is not None:
                raise ValueError(f"repeat() after {_names(racing)} keyed by the training epoch: each later pass would "
                                 "start ahead of training and read an epoch that races with fit's clock, and tfrepro "
                                 f"cannot key the passes by their ordinal instead: {why}; put repeat() before the "
                                 "draw, or give it a fixed epoch=")
            if racing:
                repeated = repeats.ordinal_passes(self, int(passes))
                _marked[repeated] = Draw(f"repeat() of {_names(racing)}", racing[0].seed, racing[0].purpose, None)
                return repeated
        return original_repeat(self, count, name=name)

    @functools.wraps(original_cache)
    def cache(self: Any, filename: str = "", name: Any = None) -> Any:
        frozen = [draw for draw in draws_in(self) if draw.epoch is None]
        if frozen:
            warn(f"cache() after {_names(frozen)}: the cache keeps the first pass's draws, so every epoch gets the "
                 "draws of the epoch that filled it; cache() before the keyed draw")
        return original_cache(self, filename, name=name)

    @functools.wraps(original_zip)
    def zip(*args: Any, **kwargs: Any) -> Any:
        tf = _tf.import_tf()
        branches = [d for d in tf.nest.flatten((args, kwargs)) if isinstance(d, tf.data.Dataset)]
        by_key: dict[tuple[int, tuple[int | str, ...]], list[Draw]] = {}
        for branch in branches:
            for draw in draws_in(branch):
                by_key.setdefault((draw.seed, draw.purpose), []).append(draw)
        shared = [draws for draws in by_key.values() if len(draws) > 1]
        if shared:
            warn(f"Dataset.zip of {len(shared[0])} datasets built on {shared[0][0].what} with one seed and key: they "
                 "draw the same numbers (the same permutation, the same augmentation); if they should differ, give "
                 "each its own key=")
        return original_zip(*args, **kwargs)

    @functools.wraps(original_iter)
    def __iter__(self: Any) -> Any:
        global _unclocked_passes
        if not epochs.was_set() and any(draw.epoch is None for draw in draws_in(self)):
            epochs.set_unclocked_pass(_unclocked_passes)
            _unclocked_passes += 1
        return original_iter(self)

    dataset.repeat, dataset.cache, dataset.zip, dataset.__iter__ = repeat, cache, staticmethod(zip), __iter__
    repeats.record_methods()


def _names(draws: list[Draw]) -> str:
    return ", ".join(draw.what for draw in draws)
