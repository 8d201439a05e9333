"""``tfrepro.data.shuffle``: ``Dataset.shuffle`` whose order is keyed by the seed and the epoch."""

from __future__ import annotations

import functools
from typing import Any

from tfrepro import _tf
from tfrepro.data import passes, pipeline_checks


def shuffle(dataset: Any, buffer_size: int, seed: int | None = None, *, key: str = "shuffle",
            epoch: int | None = None) -> Any:
    """Randomly shuffles the elements of `dataset`, in an order keyed by the seed and the epoch.

    `dataset.shuffle(buffer_size)`, each pass's order fixed by `seed`, `key` and the epoch: the
    training epoch (`fit`'s, or `tfrepro.data.set_epoch` in a custom loop) when the pass's first
    element is pulled, or a fixed `epoch`. So every run gives the same order, every epoch another,
    and epoch E's order can be drawn directly, without drawing the epochs before it (an exact
    resume needs no replay), where TF's own reshuffle depends on how many passes came before.
    TF's global seed does not enter. (Under `tfrepro.patch`, `Dataset.shuffle` itself is this,
    keyed by its call: `tfrepro.data.dataset_shuffling`.)

    `repeat()` after it keys each pass anew, by a number drawn as the pass begins, never by the
    racing epoch clock (`tfrepro.data.repeats`); `cache()` after it,
    and `Dataset.zip` of two shuffles with one seed and key (one permutation), warn. Under a
    multi-worker strategy it is sharded by element (`AutoShardPolicy.DATA`) unless `dataset` sets
    a policy: every worker draws the whole pass's order and keeps its share (`FILE` raises).

    Args:
        dataset: The `tf.data.Dataset` to shuffle.
        buffer_size: How many elements the shuffle buffer holds, a positive int, as in
            `Dataset.shuffle` (the dataset's length for a uniform shuffle).
        seed: The seed of the order, an int in [0, 2**32 - 1]; `None`: the active `tfrepro.patch`
            seed.
        key: What this shuffle is for, keyed into its order: give two shuffles of one seed
            distinct keys for unrelated orders.
        epoch: A fixed epoch for the order, a non-negative int; `None`: the training epoch when
            each pass's first element is pulled.

    Returns:
        The shuffled `tf.data.Dataset`, with `dataset`'s cardinality where it is known.

    Raises:
        TypeError: `dataset` is not a `tf.data.Dataset`.
        ValueError: `buffer_size` is not a positive int, `seed` or `epoch` is out of range, no
            `seed` is given and no `tfrepro.patch` seed is active, or `dataset`'s auto-shard policy
            is `FILE`.

    Examples:
        >>> import tensorflow as tf, tfrepro.data
        >>> ds = tf.data.Dataset.range(6)
        >>> first = list(tfrepro.data.shuffle(ds, 6, seed=1, epoch=0).as_numpy_iterator())
        >>> first == list(tfrepro.data.shuffle(ds, 6, seed=1, epoch=0).as_numpy_iterator())
        True
        >>> sorted(first) == list(range(6))
        True
    """
    tf = _tf.import_tf()
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset; got {type(dataset).__name__}")
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"buffer_size must be a positive int; got {buffer_size!r}")
    seed = passes.check_arguments(seed, epoch, "shuffle")
    return keyed_shuffle(dataset, buffer_size, seed, ("shuffle", key), epoch, f"tfrepro.data.shuffle (key {key!r})")


def keyed_shuffle(dataset: Any, buffer_size: int, seed: int, purpose: tuple[str, ...], epoch: int | None,
                  what: str) -> Any:
    """``dataset`` shuffled, each pass's order keyed by ``seed``, ``purpose`` and the epoch (the
    training epoch for None), marked as the keyed draw ``what``; the arguments already checked."""
    build = functools.partial(_shuffled, buffer_size=buffer_size, seed=seed, purpose=purpose, what=what)
    return pipeline_checks.mark(build(dataset, epoch), pipeline_checks.Draw(what, seed, purpose, epoch), dataset, build)


def _shuffled(dataset: Any, epoch: Any, *, buffer_size: int, seed: int, purpose: tuple[str, ...], what: str) -> Any:
    tf = _tf.import_tf()

    def one_pass(key: Any) -> Any:
        # TF's first shuffle op: seeded by two tensors, with no seed-generator resource. The
        # resource of ``Dataset.shuffle``'s later ops is state in a tf.data function, for which TF's
        # make_deterministic rewrite makes every parallel map and prefetch of the pipeline sequential
        # under op determinism. Seeds (0, 0) would mean "random": never both zero.
        seed = tf.where(tf.reduce_all(key == 0), tf.constant(1, tf.int64), key[0])
        variant = tf.raw_ops.ShuffleDataset(
            input_dataset=dataset._variant_tensor, buffer_size=tf.constant(buffer_size, tf.int64), seed=seed,
            seed2=key[1], reshuffle_each_iteration=False, **dataset._flat_structure)
        return tf.data.experimental.from_variant(variant, dataset.element_spec)

    shuffled = passes.with_cardinality_of(dataset, passes.keyed_pass(one_pass, seed, purpose, epoch))
    return passes.sharded_by_element(shuffled, dataset, what)
