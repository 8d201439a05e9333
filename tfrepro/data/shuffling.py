"""``tfrepro.data.shuffle``: ``Dataset.shuffle`` whose order is keyed by the seed and the epoch."""

from __future__ import annotations

from typing import Any

from tfrepro import _tf
from tfrepro.data import passes


def shuffle(dataset: Any, buffer_size: int, seed: int | None = None, *, key: str = "shuffle",
            epoch: int | None = None) -> Any:
    """``dataset.shuffle(buffer_size)``, each pass's order fixed by ``seed`` (default: the active
    ``tfrepro.patch`` seed), ``key`` and the epoch: the training epoch (``fit``'s, or
    ``tfrepro.data.set_epoch`` in a custom loop) when the pass's first element is pulled, or a fixed
    ``epoch``. So every run gives the same order, every epoch another, and epoch E's order can be
    drawn directly, without drawing the epochs before it (an exact resume needs no replay). TF's
    global seed does not enter.

    Use it where a pass starts with an epoch: ``repeat()`` after it starts passes ahead of training
    (put ``repeat()`` before it, or pass ``epoch``).

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

    def one_pass(key: Any) -> Any:
        # Traced in the pass's function graph: its graph-level seed stands in for TF's global seed, so
        # that the order depends on the key alone (and TF's seed pairing never compares a tensor).
        graph = tf.compat.v1.get_default_graph()
        saved, graph.seed = graph.seed, _GRAPH_SEED
        try:
            return dataset.shuffle(buffer_size, seed=key[1] % (2**31 - 1), reshuffle_each_iteration=False)
        finally:
            graph.seed = saved

    return passes.with_cardinality_of(dataset, passes.keyed_pass(one_pass, seed, ("shuffle", key), epoch))


_GRAPH_SEED = 87654321
