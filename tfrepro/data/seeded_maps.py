"""``map_with_seed``: a ``tf.data`` map whose function gets a stateless seed per element.

Stateful random ops (``tf.image.random_*``, Keras 3's random layers) in a parallel ``map`` either
hand their numbers to elements in thread order (each run augments differently) or, under op
determinism, run serially (TF #62100, #39992). A stateless op keyed by a seed that travels with the
element is both: deterministic and parallel. Element ``i`` of a pass gets the key of the pass (the
seed, the map's key, the epoch: see ``passes``) plus ``[0, i]``, made for the whole pass in one
tensor (in blocks when its length is unknown) and zipped in; any element's seed can be computed
alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfrepro import _tf
from tfrepro.data import passes


def _where_defined(fn: Callable[..., Any]) -> str:
    """A stable name for ``fn``: module, qualified name and first line (lambdas differ by line)."""
    target = getattr(fn, "func", fn)  # functools.partial: its function
    code = getattr(target, "__code__", None)
    name = getattr(target, "__qualname__", type(target).__qualname__)
    return f"{getattr(target, '__module__', '')}.{name}:{code.co_firstlineno if code else ''}"


_SEEDS_AT_ONCE = 2**22  # a pass of up to 4M elements gets its seeds in one tensor (64 MiB at most)


def map_with_seed(dataset: Any, fn: Callable[..., Any], seed: int | None = None,
                  num_parallel_calls: int | None = None, *, key: str | None = None,
                  epoch: int | None = None) -> Any:
    """``dataset.map`` calling ``fn(*element, seed)`` (``fn(element, seed)`` for an element that is
    not a tuple), ``seed`` a ``[2]`` int64 tensor for ``tf.random.stateless_*`` and
    ``tf.image.stateless_random_*``.

    The seed is fixed by ``seed`` (default: the active ``tfrepro.patch`` seed), ``key`` (default:
    where ``fn`` is defined: its module, name and first line, so moving or renaming it changes the
    draws; give distinct keys to two maps of one function, or of two lambdas on one line), the
    epoch, the element's index in the pass and, inside an ``interleave`` or ``flat_map`` function,
    that function's arguments (each file's sub-dataset draws its own). The epoch is the training
    epoch (``fit``'s; ``tfrepro.data.set_epoch`` in a custom loop) when the pass's first element is
    pulled, or a fixed ``epoch``: never a count of iterators, so peeking with ``take(1)`` changes
    nothing, and epoch E's draws can be made without the epochs before it. As for every tf.data
    random op, TF's global seed does not enter (the draws are stateless). The map runs in parallel
    (``num_parallel_calls``, default ``tf.data.AUTOTUNE``) with ``deterministic=True``; its result
    does not depend on how many calls run at once. ``fn`` must draw its randomness from ``seed``
    only (stateful random ops in it would still run in thread order, or serially under op
    determinism). ``repeat()`` after the map starts passes ahead of training: put it before.

    >>> import tensorflow as tf, tfrepro.data
    >>> flip = lambda image, seed: tf.image.stateless_random_flip_left_right(image, seed)
    >>> ds = tfrepro.data.map_with_seed(tf.data.Dataset.from_tensor_slices(tf.zeros([8, 4, 4, 1])), flip, seed=1)
    >>> [tuple(image.shape) for image in ds.take(1)]
    [(4, 4, 1)]
    """
    tf = _tf.import_tf()
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset; got {type(dataset).__name__}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, as fn(*element, seed); got {type(fn).__name__}")
    seed = passes.check_arguments(seed, epoch, "map_with_seed")
    if num_parallel_calls is not None and num_parallel_calls != tf.data.AUTOTUNE and (
            isinstance(num_parallel_calls, bool) or not isinstance(num_parallel_calls, int) or num_parallel_calls < 1):
        raise ValueError(f"num_parallel_calls must be a positive int or tf.data.AUTOTUNE; got {num_parallel_calls!r}")
    key = key if key is not None else _where_defined(fn)
    calls = tf.data.AUTOTUNE if num_parallel_calls is None else num_parallel_calls

    def call(element: Any, element_seed: Any) -> Any:
        return fn(*element, element_seed) if type(element) is tuple else fn(element, element_seed)  # as Dataset.map

    count = tf.get_static_value(dataset.cardinality())
    count = int(count) if count is not None and 0 <= count <= _SEEDS_AT_ONCE else None
    keyed = tf.data.Dataset.zip((dataset, passes.element_seeds(seed, ("map_with_seed", key), epoch, count)))
    # The cardinality asserted before the map: after a parallel map, its per-element check costs
    # more than the map's own overhead.
    return passes.with_cardinality_of(dataset, keyed).map(call, num_parallel_calls=calls, deterministic=True)
