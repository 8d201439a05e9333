"""What the active ``patch`` changed, kept in one place: ``patching`` writes it, ``reporting``
(``status()``) and the trace headers read it. One per process, like TensorFlow's own switches."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

# PYTHONHASHSEED is read once, when the interpreter starts; this is the value it started with
# (tfrepro is imported long before anything could change os.environ for the same purpose).
STARTUP_HASHSEED = os.environ.get("PYTHONHASHSEED")


@dataclass
class PatchState:
    """What the active patch changed, so that ``unpatch`` can undo it."""

    seed: int
    saved_env: dict[str, str | None] = field(default_factory=dict)
    ops: tuple[str, ...] = ()
    undo_ops: Callable[[], None] | None = None
    enabled_op_determinism: bool = False  # it was off before patch(), so unpatch() turns it off
    undo_keras_jit: Callable[[], None] | None = None


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


def active_ops() -> tuple[str, ...]:
    """The ops the active ``patch`` replaced with ``tfrepro.ops``."""
    return () if _active is None else _active.ops
