"""Keyed randomness for ``tf.data``: every draw is a stateless function of the seed, what it is for,
the epoch and the element, never of the order of draws.

``map_with_seed`` hands each element a stateless seed (``seeded_maps``); ``shuffle`` shuffles each
pass by the epoch (``shuffling``); ``skip`` skips elements without computing them where that is exact
(``skipping``); ``augmentation`` has batch-level stateless augmentations that draw
per image (flip, translate, brightness). The epoch is ``fit``'s, or ``set_epoch(e)`` in a custom
loop. Importing this package is free; its functions import TensorFlow when called.

    import tfrepro
    from tfrepro.data import map_with_seed, random_flip_left_right

    tfrepro.patch(42)
    train = map_with_seed(dataset.batch(64), lambda x, y, seed: (random_flip_left_right(x, seed), y))
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "map_with_seed": "tfrepro.data.seeded_maps",
    "shuffle": "tfrepro.data.shuffling",
    "skip": "tfrepro.data.skipping",
    "set_epoch": "tfrepro.determinism.epochs",
    "current_epoch": "tfrepro.determinism.epochs",
    "random_flip_left_right": "tfrepro.data.augmentation",
    "random_translate": "tfrepro.data.augmentation",
    "random_brightness": "tfrepro.data.augmentation",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
