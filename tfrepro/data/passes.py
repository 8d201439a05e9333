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
from tfrepro.determinism import epochs, keys, seeding, state


def check_arguments(seed: int | None, epoch: int | None, what: str) -> int:
    """``seed`` (default: the active ``tfrepro.patch`` seed), validated; ``epoch`` checked."""
    if epoch is not None:
        epochs.check_epoch(epoch, "or None for the training epoch")
    if seed is None:
        seed = state.active_seed()
        if seed is None:
            raise ValueError(f"{what} needs a seed: pass seed=S, or call tfrepro.patch(S) first")
    return seeding.validate_seed(seed, "seed")


def keyed_pass(build: Callable[[Any], Any], seed: int, purpose: tuple[int | str, ...], epoch: Any) -> Any:
    """A dataset whose every pass is ``build(key)``, ``key`` the pass's ``[2]`` int64 key (see
    ``pass_key``). One function per pass: a new iterator instantiates every function of its
    pipeline, and that cost is paid once per epoch."""
    return pass_key(seed, purpose, epoch).flat_map(build)


def pass_key(seed: int, purpose: tuple[int | str, ...], epoch: Any) -> Any:
    """A dataset of one element, the pass's ``[2]`` int64 key, computed when it is pulled: from the
    epoch clock's ``records`` (never a variable read, which would make the whole pipeline sequential
    under op determinism), or from a fixed ``epoch`` (an int, or a scalar int64 tensor: a pass of
    ``repeats``)."""
    tf = _tf.import_tf()
    base = _base_key(tf, seed, purpose)
    if epoch is None:
        epoch = remade_epoch()
    # A fixed epoch from a range, not from_tensors: TF's make_deterministic rewrite takes TensorDataset
    # in a tf.data function for state, and would make the whole pipeline sequential under op determinism.
    epoch_now = epochs.records() if epoch is None else tf.data.Dataset.range(1).map(lambda _: tf.cast(epoch, tf.int64))
    return epoch_now.map(lambda e: keys.fold_in(base, e))


def remade_epoch() -> Any:
    """The epoch of the pass being made again (``repeats``), or None: draws keyed by the training
    epoch that are made inside it (in an ``interleave`` function of the pipeline, say) take it."""
    return _remade_epochs[-1] if _remade_epochs else None


_remade_epochs: list[Any] = []  # a stack: the passes being made again, innermost last


def element_seeds(seed: int, purpose: tuple[int | str, ...], epoch: Any, count: int | None = None,
                  block: int = 1) -> Any:
    """A dataset of ``[2]`` int64 seeds: element ``i`` of a pass gets the pass's key plus ``[0, i]``;
    with ``block > 1``, ``[block, 2]`` tensors of consecutive elements' seeds (the last one runs past
    the pass). Made vectorised: for the whole pass at once when its length ``count`` is known, else
    endlessly in runs of 1024, so that an element costs the pipeline a slice, not ops of its own."""
    tf = _tf.import_tf()

    def seeds(key: Any, start: Any, size: int) -> Any:
        index = start + tf.range(size * block, dtype=tf.int64)
        made = key + tf.stack([tf.zeros_like(index), index], axis=1)
        return made if block == 1 else tf.reshape(made, [size, block, 2])

    if count is not None:
        blocks = -(-count // block)
        return pass_key(seed, purpose, epoch).map(lambda key: seeds(key, tf.constant(0, tf.int64), blocks)).unbatch()

    def one_pass(key: Any) -> Any:
        run = _RUN * block
        return tf.data.Dataset.range(0, 2**62, run).map(lambda start: seeds(key, start, _RUN)).unbatch()

    return keyed_pass(one_pass, seed, purpose, epoch)


_RUN = 1024
# Set on the graph of ``repeats``' pass function: its argument is the number that keys the pass,
# through its epoch, not an element a sub-dataset is made from.
REMADE_PASS = "_tfrepro_remade_pass"


def with_cardinality_of(dataset: Any, result: Any) -> Any:
    """``result``, which has as many elements as ``dataset``, with its cardinality known where
    ``dataset``'s is (Keras reads it for its steps per epoch)."""
    tf = _tf.import_tf()
    cardinality = tf.get_static_value(dataset.cardinality())
    if cardinality is None or cardinality < 0:
        return result
    return result.apply(tf.data.experimental.assert_cardinality(tf.constant(int(cardinality), tf.int64)))


def sharded_by_element(result: Any, source: Any, what: str) -> Any:
    """``result``, the keyed draw ``what`` on ``source``, sharded between ``tf.distribute`` workers
    by element (``AutoShardPolicy.DATA``) where ``source`` leaves the policy to TF (``AUTO``): a
    keyed pass reads its epoch from a file of its own, which ``AUTO`` would try to shard by file
    (and fail: one file, two workers), and sharding the files under it would give each worker's
    share the draws of the pass's first elements. So every worker runs the whole pass and keeps its
    share: the element at position i draws with key i. ``OFF``, ``DATA`` and ``HINT`` set on
    ``source`` stand; ``FILE`` raises."""
    tf = _tf.import_tf()
    if getattr(tf.compat.v1.get_default_graph(), "building_function", False):
        return result  # a sub-dataset of a tf.data function: the enclosing pipeline's policy shards it
    policies = tf.data.experimental.AutoShardPolicy
    policy = source.options().experimental_distribute.auto_shard_policy
    if policy == policies.FILE:
        raise ValueError(f"{what} is built on a dataset whose auto-shard policy is FILE: a keyed draw cannot be "
                         "sharded by file (each worker's share would draw the first elements' numbers); set "
                         "AutoShardPolicy.DATA, or shard the files yourself (Dataset.shard) and set OFF")
    options = tf.data.Options()  # set on ``result`` too: a pass built from ``source``'s variant does not inherit it
    options.experimental_distribute.auto_shard_policy = policies.DATA if policy == policies.AUTO else policy
    return result.with_options(options)


def _base_key(tf: Any, seed: int, purpose: tuple[int | str, ...]) -> Any:
    base = keys.key(seed, *purpose)
    element = _enclosing_arguments(tf)
    return base if element is None else keys.fold_in(base, element)


def _enclosing_arguments(tf: Any) -> Any:
    """An int64 fingerprint of the arguments of the function being traced (an ``interleave`` or
    ``flat_map`` function: the element its sub-dataset is made from), or None outside one."""
    graph = tf.compat.v1.get_default_graph()
    if not getattr(graph, "building_function", False) or getattr(graph, REMADE_PASS, False):
        return None
    captured = {id(t) for t in getattr(graph, "internal_captures", ())}
    arguments = [t for t in graph.inputs if id(t) not in captured and t.dtype not in (tf.resource, tf.variant)]
    if not arguments:
        return None
    text = [tf.strings.reduce_join(tf.reshape(a if a.dtype == tf.string else tf.strings.as_string(a), [-1]),
                                   separator=",") for a in arguments]
    return tf.strings.to_hash_bucket_fast(tf.strings.reduce_join(text, separator=";"), 2**62)
