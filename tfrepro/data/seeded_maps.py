"""``map_with_seed``: a ``tf.data`` map whose function gets a stateless seed per element.

Stateful random ops (``tf.image.random_*``, Keras 3's random layers) in a parallel ``map`` either
hand their numbers to elements in thread order (each run augments differently) or, under op
determinism, run serially (TF #62100, #39992). A stateless op keyed by a seed that travels with the
element is both: deterministic and parallel. Element ``i`` of a pass gets the key of the pass (the
seed, the map's key, the epoch: see ``passes``) plus ``[0, i]``, made for the whole pass in one
tensor (in runs when its length is unknown) and zipped in; any element's seed can be computed
alone. Small elements of static shape go through the map's function 8 at a time, each alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tfrepro import _tf
from tfrepro.data import passes, pipeline_checks


def _where_defined(fn: Callable[..., Any]) -> str:
    """A stable name for ``fn``: module, qualified name and first line (lambdas differ by line)."""
    target = getattr(fn, "func", fn)  # functools.partial: its function
    code = getattr(target, "__code__", None)
    name = getattr(target, "__qualname__", type(target).__qualname__)
    return f"{getattr(target, '__module__', '')}.{name}:{code.co_firstlineno if code else ''}"


_SEEDS_AT_ONCE = 2**22  # a pass of up to 4M elements gets its seeds in one tensor (64 MiB at most)
_BLOCK = 8  # elements per call of the map's function, when their shapes allow
_BLOCKED_BYTES = 2**18  # the largest element (or result) mapped in blocks unless block= says so


def map_with_seed(dataset: Any, fn: Callable[..., Any], seed: int | None = None,
                  num_parallel_calls: int | None = None, *, key: str | None = None,
                  epoch: int | None = None, block: int | None = None) -> Any:
    """Maps `fn` over `dataset` in parallel, handing each element its own stateless random seed.

    `dataset.map(fn)` with `fn(*element, seed)` called (`fn(element, seed)` for an element that is
    not a tuple), `seed` a `[2]` int64 tensor for `tf.random.stateless_*` and
    `tf.image.stateless_random_*`. The draws are deterministic and parallel at once: the map runs
    with `deterministic=True`, and its result does not depend on how many calls run at once.

    An element's seed is fixed by `seed`, `key`, the epoch, the element's index in the pass and,
    inside an `interleave` or `flat_map` function, that function's arguments (each file's
    sub-dataset draws its own). The epoch is the training epoch (`fit`'s;
    `tfrepro.data.set_epoch` in a custom loop) when the pass's first element is pulled, or a fixed
    `epoch`: never a count of iterators, so peeking with `take(1)` changes nothing, and epoch E's
    draws can be made without the epochs before it. As for every tf.data random op, TF's global
    seed does not enter (the draws are stateless). `fn` must draw its randomness from `seed` only:
    stateful random ops in it would still run in thread order, or serially under op determinism.
    `repeat()` after the map keys each pass anew, by a number drawn as the pass begins, never by
    the racing epoch clock (`tfrepro.data.repeats`); `cache()` after it, and `Dataset.zip` of two
    maps with one key, warn (`tfrepro.data.pipeline_checks`). Under a multi-worker strategy the
    result is sharded by element (`AutoShardPolicy.DATA`) unless `dataset` sets a policy: every
    worker maps (and reads) the whole pass and keeps its share, so an element draws with its own
    position's seed (sharding the files would give each worker's elements the first elements'
    seeds; `FILE` raises).

    Small elements are mapped up to `block` at a time. With a known length, blocks are of the
    largest size up to that which divides it, so that the length stays known. One call of the map's
    function runs `fn` once per element of a block, on that element alone, so the results are the
    same bits as one element per call, at a fraction of tf.data's cost per call. `fn` is traced
    once for its results' shapes and once per element of a block (9 times), so it must not depend on
    Python state at trace time; an error in one element fails its whole block (`ignore_errors()`
    after the map then drops the block).

    Args:
        dataset: The `tf.data.Dataset` to map.
        fn: The function to map, called as `Dataset.map` calls it with one more argument, the
            element's seed: `fn(*element, seed)`, or `fn(element, seed)` for an element that is
            not a tuple.
        seed: The seed of the draws, an int in [0, 2**32 - 1]; `None`: the active `tfrepro.patch`
            seed.
        num_parallel_calls: How many elements are mapped at once, a positive int or
            `tf.data.AUTOTUNE`, as in `Dataset.map`; `None`: `tf.data.AUTOTUNE`. The result does
            not depend on it.
        key: What this map draws for, a string that keys its seeds; `None`: where `fn` is defined
            (its module, name and first line, so moving or renaming it changes the draws). Give
            distinct keys to two maps of one function, or of two lambdas on one line.
        epoch: A fixed epoch for the draws, a non-negative int; `None`: the training epoch when
            each pass's first element is pulled.
        block: How many elements one call of the map's function maps, a positive int; `None`: 8
            when every element and result is a dense tensor of static shape of at most 256 KiB,
            else 1. `1` maps one element per call.

    Returns:
        The mapped `tf.data.Dataset`, with `dataset`'s cardinality where it is known.

    Raises:
        TypeError: `dataset` is not a `tf.data.Dataset`, or `fn` is not callable.
        ValueError: No `seed` is given and no `tfrepro.patch` seed is active; `seed`, `epoch`,
            `num_parallel_calls` or `block` is out of range; or the elements cannot be mapped in
            blocks of the `block` given (`block=1` always can); or `dataset`'s auto-shard policy
            is `FILE`.

    Examples:
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
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise ValueError(f"block must be a positive int (elements per call), or None to choose; got {block!r}")
    calls = tf.data.AUTOTUNE if num_parallel_calls is None else num_parallel_calls

    def call(element: Any, element_seed: Any) -> Any:
        return fn(*element, element_seed) if type(element) is tuple else fn(element, element_seed)  # as Dataset.map

    purpose = ("map_with_seed", key if key is not None else _where_defined(fn))
    draw = pipeline_checks.Draw(f"map_with_seed (key {purpose[1]!r})", seed, purpose, epoch)
    build = functools.partial(_mapped, call=call, seed=seed, purpose=purpose, calls=calls, block=block, what=draw.what)
    return pipeline_checks.mark(build(dataset, epoch), draw, dataset, build)


def _mapped(dataset: Any, epoch: Any, *, call: Callable[[Any, Any], Any], seed: int, purpose: tuple[str, str],
            calls: int, block: int | None, what: str) -> Any:
    """``call`` mapped over ``dataset`` with each element's seed, the pass's key from ``epoch``."""
    tf = _tf.import_tf()
    cardinality = tf.get_static_value(dataset.cardinality())
    count = int(cardinality) if cardinality is not None and 0 <= cardinality <= _SEEDS_AT_ONCE else None
    seeds = functools.partial(passes.element_seeds, seed, purpose, epoch, count)
    if block != 1:
        in_blocks = _in_blocks(tf, dataset, cardinality, call, seeds, block or _BLOCK, calls,
                               None if block else _BLOCKED_BYTES)
        if not isinstance(in_blocks, str):
            return passes.sharded_by_element(in_blocks, dataset, what)
        if block is not None:
            raise ValueError(f"map_with_seed cannot map in blocks of {block}: {in_blocks}; pass block=1")
    keyed = tf.data.Dataset.zip((dataset, seeds()))
    # The cardinality asserted before the map: after a parallel map, its per-element check costs
    # more than the map's own overhead.
    mapped = passes.with_cardinality_of(dataset, keyed).map(call, num_parallel_calls=calls, deterministic=True)
    return passes.sharded_by_element(mapped, dataset, what)


def _in_blocks(tf: Any, dataset: Any, length: int | None, call: Callable[[Any, Any], Any],
               seeds: Callable[..., Any], size: int, calls: int, most_bytes: int | None) -> Any:
    """``call`` mapped over ``dataset`` (of static cardinality ``length``) up to ``size`` elements
    per call (``seeds(block=size)`` their seeds), or why it cannot be."""
    why = _why_not_in_blocks(tf, "an element", dataset.element_spec, most_bytes)
    results = _probe(tf, call, dataset.element_spec) if why is None else None
    why = why or _why_not_in_blocks(tf, "a result", results, most_bytes)
    if why is not None:
        return why
    # With a known length, blocks of the largest size up to ``size`` that divides it: the length
    # stays known, and an error that drops a block (ignore_errors()) drops no more than that. With
    # an unknown (or infinite) length, a short last block repeats its last element, cut off after.
    known = length is not None and length >= 0
    if known and length:
        largest, size = size, max(d for d in range(1, size + 1) if length % d == 0)
        if size == 1:
            return f"no block size from 2 to {largest} divides its length, {length}"
    if getattr(tf.compat.v1.get_default_graph(), "building_function", False):
        # In a tf.data function (interleave's), the cardinality ops stay in the graph, and tf.data's
        # map-and-batch fusion fails on a map with a consumer besides the batch: zip first.
        blocks = passes.with_cardinality_of(dataset, tf.data.Dataset.zip((dataset, seeds()))).batch(size)
    else:
        batched = dataset.batch(size)
        blocks = passes.with_cardinality_of(batched, tf.data.Dataset.zip((batched, seeds(block=size))))
    try:
        mapped = blocks.map(_block_call(tf, call, size, not known, results), num_parallel_calls=calls,
                            deterministic=True).unbatch()
    except (ValueError, TypeError) as error:  # results tf.data packs otherwise, e.g. a list inside a tuple
        return f"its results do not stack as they are ({str(error).splitlines()[0]})"
    if mapped.element_spec != results:
        return f"its results come out of a block as {mapped.element_spec}, not {results}"
    return mapped


def _probe(tf: Any, call: Callable[[Any, Any], Any], elements: Any) -> Any:
    """The element spec of ``call`` mapped over elements of spec ``elements`` (dense tensors),
    from a dataset that shares no node with the pipeline (tf.data's graph rewrites fail on a
    dataset with a consumer left unused) and is never run."""
    def zeros(_: Any) -> Any:
        return tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), elements), tf.zeros([2], tf.int64)

    return tf.data.Dataset.range(1).map(zeros).map(call).element_spec


def _block_call(tf: Any, call: Callable[[Any, Any], Any], size: int, short: bool,
                results: Any) -> Callable[..., Any]:
    """The map function over ``size`` elements and their seeds: ``call`` on each element alone, the
    results stacked. With ``short``, a block may be short: it repeats its last element, and the
    repeats are cut off the results."""
    def call_block(elements: Any, seeds: Any) -> Any:
        flat = tf.nest.flatten(elements) + [seeds]
        length = tf.shape(flat[0])[0]
        if short:
            rows = tf.minimum(tf.range(size), length - 1)
            flat = [tf.gather(component, rows) for component in flat]
        *columns, element_seeds = [tf.unstack(component, num=size) for component in flat]
        outputs = [tf.nest.flatten(call(tf.nest.pack_sequence_as(elements, [column[i] for column in columns]),
                                        element_seeds[i])) for i in range(size)]
        stacked = [tf.stack(values)[:length] if short else tf.stack(values) for values in zip(*outputs)]
        return tf.nest.pack_sequence_as(results, stacked)

    return call_block


def _why_not_in_blocks(tf: Any, what: str, spec: Any, most_bytes: int | None) -> str | None:
    """Why ``what`` of spec ``spec`` cannot go through the map in blocks (it must be dense tensors of
    static shape, ``most_bytes`` at most), or None."""
    components = tf.nest.flatten(spec)
    for component in components:
        if type(component) is not tf.TensorSpec or not component.shape.is_fully_defined():
            return f"{what} has a component that is not a tensor of static shape ({component})"
    size = sum(c.shape.num_elements() * (8 if c.dtype == tf.string else c.dtype.size) for c in components)
    if most_bytes is not None and size > most_bytes:
        return f"{what} has {size} bytes"
    return None
