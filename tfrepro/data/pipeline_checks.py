"""Pipelines that would silently undo keyed draws are named, or made right, as they are built.

A keyed draw (``map_with_seed``, ``shuffle``, ``Dataset.shuffle`` under ``patch``) is a function of
its seed, its key, the epoch and the element. Four ways of building on one would break that without
an error anywhere:

- ``repeat()`` after a draw keyed by the training epoch would start every later pass ahead of
  training, reading an epoch that races with ``fit``'s clock. Its passes are keyed anew instead, in
  the order they begin (``repeats``); where the pipeline cannot be made again, it raises
  ``ValueError``.
- ``cache()`` after such a draw keeps the first pass's draws for every epoch: warned about.
- ``Dataset.zip`` of two draws with one seed and key (the same augmentation mapped twice for two
  views, two ``shuffle`` calls with the default key) gives both the same numbers, and so does a
  draw applied on top of one with the same seed and key: warned about (give each its own ``key``).
- A custom loop that never sets the epoch clock (no ``fit``, no ``tfrepro.data.set_epoch``) would
  draw epoch 0's numbers in every pass. Until the clock is set, the n-th iterator over datasets
  built on the same such draws (``Dataset.__iter__``; a ``take(1)`` to peek counts) iterates the
  pipeline made again with its draws at epoch n instead (``repeats.remade_at``): pass n draws epoch
  n's numbers, as a loop that sets the epoch would, in every run the same. Where the pipeline cannot
  be made again, the second pass is warned about: it draws what the first drew.

``mark`` registers a keyed dataset; the checks walk a dataset's inputs (``DatasetV2._inputs``, a
``_targets`` entry) to the marked ones. They are put on ``tf.data.Dataset`` the first time a keyed
dataset is made, and cost nothing for pipelines without one.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfrepro import _targets, _tf
from tfrepro.data import repeats
from tfrepro.determinism import epochs, keys
from tfrepro.errors import warn


@dataclass(frozen=True)
class Draw:
    """What a keyed dataset draws: ``what`` in words, its ``seed`` and ``purpose`` (its key), and
    whether its epoch is fixed (None: the training epoch, read when each pass begins; -1: keyed
    anew in each pass of a ``repeat()``)."""

    what: str
    seed: int
    purpose: tuple[int | str, ...]
    epoch: int | None


_marked: weakref.WeakKeyDictionary[Any, Draw] = weakref.WeakKeyDictionary()
_installed = False
_install_lock = threading.Lock()
_passes: dict[tuple[str, ...], int] = {}  # iterators made over each set of racing draws while the clock was never set


def mark(dataset: Any, draw: Draw, source: Any, build: Callable[[Any, Any], Any]) -> Any:
    """``dataset``, registered as drawing ``draw`` on ``source``, made again at an epoch (an int64
    tensor) by ``build(source, epoch)`` (and the checks put in place, once). A ``source`` already
    built on a draw of the same seed and key is warned about: each element would get the same
    numbers twice (an augmentation applied twice with one key)."""
    _install()
    if any((earlier.seed, earlier.purpose) == (draw.seed, draw.purpose) for earlier in draws_in(source)):
        warn(f"{draw.what} is applied to a dataset already built on a draw with the same seed and key: each element "
             f"gets the same numbers twice; give the second its own {_key_argument(draw)}")
    _marked[dataset] = draw
    graph = _tf.import_tf().compat.v1.get_default_graph()
    if draw.epoch is None and getattr(graph, "building_function", False):  # in an interleave's function, say
        setattr(graph, repeats.DRAWS, (*getattr(graph, repeats.DRAWS, ()), draw))
    fixed = draw.epoch
    repeats.register_draw(dataset, source, build if fixed is None else lambda again, _: build(again, fixed),
                          racing=fixed is None)
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
        for draw in [_marked.get(current), *repeats.clock_draws_in_functions(current)]:
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
    with _install_lock:
        if _installed:
            return
        _installed = True
        _put_in_place(_tf.import_tf().data.Dataset)


def _put_in_place(dataset: Any) -> None:
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
                                 f"cannot key each pass anew instead: {why}; put repeat() before the draw, apply a "
                                 "transformation function with Dataset.apply (which tfrepro records), or give a "
                                 "tfrepro.data draw a fixed epoch=")
            if racing:
                seed = keys.key_words(racing[0].seed, "repeat", *racing[0].purpose)[0] % 2**31
                repeated = repeats.keyed_passes(self, int(passes), seed, name)
                _marked[repeated] = Draw(f"repeat() of {_names(racing)}", racing[0].seed, racing[0].purpose, -1)
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
                if draw.purpose[:2] != (_SEEDED_SHUFFLE, "seed"):  # TF's rule: one seed, one order (paired data)
                    by_key.setdefault((draw.seed, draw.purpose), []).append(draw)
        shared = [draws for draws in by_key.values() if len(draws) > 1]
        if shared:
            warn(f"Dataset.zip of {len(shared[0])} datasets built on {shared[0][0].what} with one seed and key: they "
                 "draw the same numbers (the same permutation, the same augmentation); if they should differ, give "
                 f"each its own {_key_argument(shared[0][0])}")
        return original_zip(*args, **kwargs)

    @functools.wraps(original_iter)
    def __iter__(self: Any) -> Any:
        racing = [draw for draw in draws_in(self)
                  if draw.epoch is None] if not epochs.was_set() and _tf.import_tf().executing_eagerly() else []
        if racing:
            drawn = tuple(sorted(repr((draw.seed, draw.purpose)) for draw in racing))
            made = _passes.get(drawn, 0)
            _passes[drawn] = made + 1
            why = repeats.why_not_repeatable(self) if made else None
            if made and why is None:
                return original_iter(repeats.remade_at(self, made))
            if made:
                warn(f"a second pass over {_names(racing)} began while the epoch clock was never set (no fit, no "
                     f"tfrepro.data.set_epoch), and tfrepro cannot make the pipeline again at a new epoch ({why}): "
                     "it draws what the first pass drew; in a custom training loop call "
                     "tfrepro.data.set_epoch(epoch) before each epoch")
        return original_iter(self)

    dataset.repeat, dataset.cache, dataset.zip, dataset.__iter__ = repeat, cache, staticmethod(zip), __iter__
    repeats.set_original_repeat(original_repeat)
    repeats.record_methods()


_SEEDED_SHUFFLE = "Dataset.shuffle"  # ``dataset_shuffling.PURPOSE``, whose seeded draws pair as TF's do


def _key_argument(draw: Draw) -> str:
    """What keys ``draw`` apart: ``key=`` for tfrepro.data's draws, ``seed=`` for a ``Dataset.shuffle``."""
    return "seed=" if draw.purpose[0] == _SEEDED_SHUFFLE else "key="


def _names(draws: list[Draw]) -> str:
    return ", ".join(draw.what for draw in draws)
