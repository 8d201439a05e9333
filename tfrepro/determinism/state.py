"""What the active ``patch`` changed, kept in one place: ``patching`` writes it, ``reporting``
(``status()``) and the trace headers read it. One per process, like TensorFlow's own switches."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field



def _startup_hashseed() -> str | None:
    """The hash seed this interpreter runs with: ``PYTHONHASHSEED`` as Python read it at start-up, or
    None when hashing is randomised (unset, "random", or ignored under ``python -E``/``-I``).
    Python reads it once, before any code runs; tfrepro is imported long before anything could
    change ``os.environ`` for the same purpose."""
    value = os.environ.get("PYTHONHASHSEED")
    if value is None or value == "random" or sys.flags.ignore_environment:
        return None
    if (value.strip() == "0") != (sys.flags.hash_randomization == 0):
        return None  # changed in os.environ after start-up: what the interpreter used is not known
    return value


STARTUP_HASHSEED = _startup_hashseed()
HASHSEED_IGNORED = sys.flags.ignore_environment and "PYTHONHASHSEED" in os.environ


@dataclass
class PatchState:
    """What the active patch changed, so that ``unpatch`` can undo it."""

    seed: int
    env: dict[str, str] = field(default_factory=dict)  # what patch() wrote (cumulative over calls)
    saved_env: dict[str, str | None] = field(default_factory=dict)  # their values before the first patch()
    ops: tuple[str, ...] = ()
    summation: str = "exact"  # how the replaced ops sum: "tf" for ops="auto", "exact_tier" for ops="exact", "exact" else
    undo_ops: Callable[[], None] | None = None
    enabled_op_determinism: bool = False  # it was off before patch(), so unpatch() turns it off
    undo_keras_jit: Callable[[], None] | None = None
    init: str = "order"  # how initial weights are drawn: "order" (creation order) or "keyed"
    on_uncovered: str = "raise"  # under ops="exact", what an op the tier does not cover does: "raise" or "warn"


_active: PatchState | None = None


def active() -> PatchState | None:
    """The active patch's state, or None when not patched."""
    return _active


def set_active(state: PatchState | None) -> None:
    global _active
    _active = state


def active_seed() -> int | None:
    """The seed of the active ``patch``, or None when not patched."""
    return None if _active is None else _active.seed


def active_init() -> str | None:
    """The initialisation scheme of the active ``patch`` ("order" or "keyed"), or None when not patched."""
    return None if _active is None else _active.init


def active_ops() -> tuple[str, ...]:
    """The ops the active ``patch`` replaced with ``tfrepro.ops``."""
    return () if _active is None else _active.ops


def active_summation() -> str:
    """How the replaced ops sum: "tf" (``ops="auto"``), "exact_tier" (``ops="exact"``) or "exact"
    (order-invariant)."""
    return "exact" if _active is None else _active.summation
