"""Passes over a dataset whose draws are keyed by the epoch and by what the pass is of.

A pass is one iteration over a dataset. ``keyed_pass`` builds each pass from its key: the seed and
purpose, the epoch (the epoch clock, read when the pass's first element is pulled, or a fixed
``epoch``) and, inside a tf.data function such as ``interleave``'s or ``flat_map``'s, the function's
arguments (the file a sub-dataset reads, say), so that every sub-dataset draws its own numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfrepro import _tf
from tfrepro.determinism import epochs, keys


def check_epoch(epoch: int | None) -> int | None:
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0):
        raise ValueError(f"epoch must be a non-negative int, or None for the training epoch; got {epoch!r}")
    return epoch


def pass_keys(seed: int, purpose: tuple[int | str, ...], epoch: int | None) -> Any:
    """An endless dataset of the pass's ``[2]`` int64 key, to zip with the pass: the key is
    computed once per pass, when the pass's first element is pulled."""
    tf = _tf.import_tf()
    base = _base_key(tf, seed, purpose)
    if epoch is not None:
        return tf.data.Dataset.from_tensors(keys.fold_in(base, epoch)).repeat()
    clock = epochs.clock()
    once = tf.data.Dataset.range(1).map(lambda _: keys.fold_in(base, clock.read_value()))
    return once.flat_map(lambda key: tf.data.Dataset.from_tensors(key).repeat())


def element_seeds(seed: int, purpose: tuple[int | str, ...], epoch: int | None) -> Any:
    """An endless dataset of ``[2]`` int64 seeds: element ``i`` of a pass gets the pass's key plus
    ``[0, i]``. They are made in vectorised blocks and unbatched, so an element costs the pipeline
    a slice, not ops of its own."""
    tf = _tf.import_tf()

    def blocks(key: Any) -> Any:
        def block(start: Any) -> Any:
            index = start + tf.range(_BLOCK, dtype=tf.int64)
            return key + tf.stack([tf.zeros_like(index), index], axis=1)

        return tf.data.Dataset.range(0, 2**62, _BLOCK).map(block).unbatch()

    return pass_keys(seed, purpose, epoch).take(1).flat_map(blocks)


_BLOCK = 1024


def keyed_pass(dataset: Any, build: Callable[[Any], Any], seed: int, purpose: tuple[int | str, ...],
               epoch: int | None) -> Any:
    """``build(key)`` for every pass over ``dataset``, ``key`` the pass's ``[2]`` int64 key, traced in
    a function graph whether the epoch is the clock's or given. The result keeps ``dataset``'s
    cardinality."""
    return with_cardinality_of(dataset, pass_keys(seed, purpose, epoch).take(1).flat_map(build))


def with_cardinality_of(dataset: Any, result: Any) -> Any:
    """``result``, which has as many elements as ``dataset``, with its cardinality known where
    ``dataset``'s is (Keras reads it for its steps per epoch)."""
    tf = _tf.import_tf()
    cardinality = tf.get_static_value(dataset.cardinality())
    if cardinality is None or cardinality < 0:
        return result
    return result.apply(tf.data.experimental.assert_cardinality(tf.constant(int(cardinality), tf.int64)))


def _base_key(tf: Any, seed: int, purpose: tuple[int | str, ...]) -> Any:
    base = keys.key(seed, *purpose)
    element = _enclosing_arguments(tf)
    return base if element is None else keys.fold_in(base, element)


def _enclosing_arguments(tf: Any) -> Any:
    """An int64 fingerprint of the arguments of the function being traced (an ``interleave`` or
    ``flat_map`` function: the element its sub-dataset is made from), or None outside one."""
    graph = tf.compat.v1.get_default_graph()
    if not getattr(graph, "building_function", False):
        return None
    captured = {id(t) for t in getattr(graph, "internal_captures", ())}
    arguments = [t for t in graph.inputs if id(t) not in captured and t.dtype not in (tf.resource, tf.variant)]
    if not arguments:
        return None
    text = [tf.strings.reduce_join(tf.reshape(a if a.dtype == tf.string else tf.strings.as_string(a), [-1]),
                                   separator=",") for a in arguments]
    return tf.strings.to_hash_bucket_fast(tf.strings.reduce_join(text, separator=";"), 2**62)
