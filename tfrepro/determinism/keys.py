"""Keys for counter-based randomness: a draw is a stateless function of a key, and a key is a
function of the seed and what the draw is for (as in JAX's PRNG and TF's stateless ops).

``key(seed, *purpose)`` is computed in Python (BLAKE2b, as ``derive_seed``), so it is the same in
every process and platform; ``fold_in`` then adds what is only known in the graph (the epoch, an
element's index) with TF's ``stateless_fold_in``. A key is a ``[2]`` int64 tensor, the seed that
``tf.random.stateless_*`` and ``tf.image.stateless_random_*`` take.
"""

from __future__ import annotations

from typing import Any

from tfrepro import _tf
from tfrepro.determinism import seeding


def key_words(seed: int, *purpose: int | str) -> tuple[int, int]:
    """The two 32-bit words of the key for ``purpose`` under ``seed``."""
    return seeding.derive_seed(seed, *purpose, "key", 0), seeding.derive_seed(seed, *purpose, "key", 1)


def key(seed: int, *purpose: int | str) -> Any:
    """The ``[2]`` int64 key for ``purpose`` under ``seed``."""
    tf = _tf.import_tf()
    return tf.constant(key_words(seed, *purpose), tf.int64)


def fold_in(key_tensor: Any, *data: Any) -> Any:
    """``key_tensor`` with each of ``data`` (int64 scalars) folded in, in order: both words of the
    result are drawn from the two (TF's ``stateless_fold_in`` keeps the datum as its second word)."""
    tf = _tf.import_tf()
    for value in data:
        folded = tf.random.experimental.stateless_fold_in(key_tensor, tf.cast(value, tf.int64))
        key_tensor = tf.random.stateless_uniform([2], folded, minval=None, maxval=None, dtype=tf.int64)
    return key_tensor


def permutation(size: Any, key_tensor: Any) -> Any:
    """A permutation of ``[0, size)`` (int64) fixed by ``key_tensor``: position by position, by TF's
    counter-based ``index_shuffle``, so any element of it can be computed alone."""
    tf = _tf.import_tf()
    size = tf.cast(size, tf.int64)
    positions = tf.range(size, dtype=tf.int64)
    return tf.cond(size > 1, lambda: tf.random.experimental.index_shuffle(positions, key_tensor, size - 1),
                   lambda: positions)
