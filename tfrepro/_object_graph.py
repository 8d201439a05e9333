"""The variables ``tf.train.Checkpoint`` reaches from some objects: one walk of the object graph,
shared by ``tfrepro.diagnose`` (which puts every state back after its repeats) and the checkpoints
(which save and restore it). A layer's ``tf.random.Generator`` and plain ``tf.Variable`` attributes
are on that graph, though Keras does not list them in ``variables``; Keras 3 SeedGenerators are not
(a Keras 3 layer lists their states in ``variables``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tfrepro import _tf


def plain(tf: Any, variable: Any) -> Any:
    """The ``tf.Variable`` behind a variable (a Keras 3 variable holds one, as does Keras 2's
    ``AutoCastVariable`` under mixed precision), or None for anything else."""
    for name in ("_value", "value", "_variable"):
        if isinstance(variable, tf.Variable) and name != "_variable":
            continue
        inner = getattr(variable, name, None)
        if isinstance(inner, tf.Variable) and inner is not variable:
            return plain(tf, inner)
    return variable if isinstance(variable, tf.Variable) else None


@dataclass(frozen=True)
class Tracked:
    """A variable found on the object graph: the object met there (``found``: a ``tf.Variable`` or
    a Keras variable wrapping one), its ``tf.Variable``, the objects on the way to it from a root
    (outermost first) and the attribute names of that way."""

    found: Any
    variable: Any
    ancestors: tuple[Any, ...]
    names: tuple[str, ...]

    @property
    def path(self) -> str:
        return "/".join(self.names)


def _children(tf: Any, obj: Any) -> dict[str, Any]:
    view = getattr(tf.train, "TrackableView", None)
    try:
        if view is not None:
            return dict(view(obj).children(obj))
        return dict(obj._trackable_children())  # TF < 2.11: what TrackableView reads
    except (AttributeError, TypeError, ValueError):  # not trackable
        return {}


def walk(roots: Iterable[Any]) -> list[Tracked]:
    """The variables ``tf.train.Checkpoint`` would reach from ``roots``, breadth first (so each by its
    shortest way), each ``tf.Variable`` once."""
    tf = _tf.import_tf()
    found: dict[int, Tracked] = {}
    seen: set[int] = set()
    queue = deque((root, (), ()) for root in roots)
    while queue:
        obj, ancestors, names = queue.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        variable = plain(tf, obj)
        if variable is not None:
            found.setdefault(id(variable), Tracked(obj, variable, ancestors, names))
            continue
        for name, child in _children(tf, obj).items():
            queue.append((child, (*ancestors, obj), (*names, name)))
    return list(found.values())
