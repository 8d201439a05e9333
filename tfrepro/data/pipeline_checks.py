"""Pipelines that would silently undo keyed draws are named as they are built.

A keyed draw (``map_with_seed``, ``shuffle``) is a function of its seed, its key, the epoch and the
element. Three ways of building on one break that without an error anywhere:

- ``repeat()`` after a draw keyed by the training epoch starts every later pass ahead of training,
  so the epoch it reads races with ``fit``'s clock: the draws can change from run to run.
  ``repeat()`` raises ``ValueError`` (put it before the draw, or give the draw a fixed ``epoch``).
- ``cache()`` after such a draw keeps the first pass's draws for every epoch: warned about.
- ``Dataset.zip`` of two draws with one seed and key (the same augmentation mapped twice for two
  views, two ``shuffle`` calls with the default key) gives both the same numbers, and so does a
  draw applied on top of one with the same seed and key: warned about (give each its own ``key``).

A fourth is only seen as it runs: a second pass over a draw keyed by the training epoch while the
epoch clock was never set (a custom loop without ``tfrepro.data.set_epoch``) draws what the first
drew; it is warned about when its iterator is made (``Dataset.__iter__``).

``mark`` registers a keyed dataset; the checks walk a dataset's inputs (``DatasetV2._inputs``, a
``_targets`` entry) to the marked ones. They are put on ``tf.data.Dataset`` the first time a keyed
dataset is made, and cost nothing for pipelines without one.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any

from tfrepro import _targets, _tf
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
_passes: dict[tuple[int, tuple[int | str, ...]], int] = {}  # passes begun per (seed, key) while the clock was never set


def mark(dataset: Any, draw: Draw, source: Any) -> Any:
    """``dataset``, registered as drawing ``draw`` on ``source`` (and the checks put in place, once).
    A ``source`` already built on a draw of the same seed and key is warned about: each element
    would get the same numbers twice (an augmentation applied twice with one key)."""
    _install()
    if any((earlier.seed, earlier.purpose) == (draw.seed, draw.purpose) for earlier in draws_in(source)):
        warn(f"{draw.what} is applied to a dataset already built on a draw with the same seed and key: each element "
             "gets the same numbers twice; give the second its own key=")
    _marked[dataset] = draw
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
        if not (isinstance(count, int) and 0 <= count <= 1):
            racing = [draw for draw in draws_in(self) if draw.epoch is None]
            if racing:
                raise ValueError(f"repeat() after {_names(racing)} keyed by the training epoch: each later pass would "
                                 "start ahead of training and read an epoch that races with fit's clock, so its draws "
                                 "could change from run to run; put repeat() before it (one endless pass keyed by the "
                                 "first epoch, each element by its index), or give it a fixed epoch=")
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
        if not epochs.was_set():
            for draw in draws_in(self):
                key = (draw.seed, draw.purpose)
                if draw.epoch is None and _passes.setdefault(key, 0) < 2:
                    _passes[key] += 1
                    if _passes[key] == 2:
                        warn(f"a second pass over {draw.what} began while the epoch clock was never set (no fit, no "
                             "tfrepro.data.set_epoch): it draws what the first pass drew; in a custom training loop "
                             "call tfrepro.data.set_epoch(epoch) before each epoch, or pass epoch= for fixed draws")
        return original_iter(self)

    dataset.repeat, dataset.cache, dataset.zip, dataset.__iter__ = repeat, cache, staticmethod(zip), __iter__


def _names(draws: list[Draw]) -> str:
    return ", ".join(draw.what for draw in draws)
