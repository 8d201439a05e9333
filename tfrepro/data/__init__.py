"""Deterministic, parallel random augmentation for ``tf.data``: ``map_with_seed`` hands each element
a stateless seed fixed by the seed, the element's position and the epoch (``seeded_maps``), and
``augmentation`` has batch-level stateless augmentations that draw per image (flip, translate,
brightness). Importing this package is free; its functions import TensorFlow when called.

    import tfrepro
    from tfrepro.data import map_with_seed, random_flip_left_right

    tfrepro.patch(42)
    train = map_with_seed(dataset.batch(64), lambda x, y, seed: (random_flip_left_right(x, seed), y))
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "map_with_seed": "seeded_maps",
    "random_flip_left_right": "augmentation",
    "random_translate": "augmentation",
    "random_brightness": "augmentation",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
