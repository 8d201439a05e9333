"""The state of Keras's built-in callbacks that decides how training goes on.

Saved and restored (same attributes in Keras 2 and 3):

- ``ReduceLROnPlateau``: ``wait``, ``cooldown_counter``, ``best`` (the learning rate itself is an
  optimizer variable);
- ``EarlyStopping``: ``wait``, ``best``, ``best_epoch``, ``stopped_epoch``, ``best_weights``;
- ``ModelCheckpoint``: ``best`` (which later epochs count as better with ``save_best_only``).

Nothing of their own to restore: ``LearningRateScheduler`` (the rate it sets is an optimizer
variable, restored around the epoch-begin hook it gets again at a resume), ``TerminateOnNaN``, a
``LearningRateSchedule`` (its position is ``optimizer.iterations``). Not
restored, as they only record: ``History`` (a resumed ``fit`` returns the epochs it ran),
``ProgbarLogger``, ``CSVLogger`` (give it ``append=True``), ``TensorBoard``; ``BackupAndRestore``
keeps its own files. User callbacks are not restored.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

ATTRIBUTES = {
    "ReduceLROnPlateau": ("wait", "cooldown_counter", "best"),
    "EarlyStopping": ("wait", "best", "best_epoch", "stopped_epoch"),
    "ModelCheckpoint": ("best",),
}
_WEIGHT_LISTS = {"EarlyStopping": ("best_weights",)}


def _kind(callback: Any) -> str | None:
    for cls in type(callback).__mro__:
        if cls.__name__ in ATTRIBUTES:
            return cls.__name__
    return None


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int)):
        return value
    number = float(np.asarray(value))
    return number if math.isfinite(number) else repr(number)  # "inf"/"-inf": JSON has no infinities


def _from_scalar(value: Any) -> Any:
    return float(value) if isinstance(value, str) else value


def save(callbacks: list[Any]) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """The state of each stateful built-in callback: JSON entries, and the bytes of its arrays
    (whose dtype and shape the entries give)."""
    entries: list[dict[str, Any]] = []
    members: dict[str, bytes] = {}
    for index, callback in enumerate(callbacks):
        kind = _kind(callback)
        if kind is None:
            continue
        entry: dict[str, Any] = {"index": index, "class": kind,
                                 "state": {name: _scalar(getattr(callback, name, None)) for name in ATTRIBUTES[kind]},
                                 "arrays": {}}
        for name in _WEIGHT_LISTS.get(kind, ()):
            weights = getattr(callback, name, None)
            if weights is None:
                continue
            described = []
            for position, array in enumerate(weights):
                array = np.ascontiguousarray(np.asarray(array))
                key = f"callback/{index}/{name}/{position}"
                members[key] = array.tobytes()
                described.append({"member": key, "dtype": array.dtype.str, "shape": list(array.shape)})
            entry["arrays"][name] = described
        entries.append(entry)
    return entries, members


def restore(callbacks: list[Any], entries: list[dict[str, Any]], members: dict[str, bytes]) -> list[str]:
    """Restore what ``save`` wrote into the same callbacks of this ``fit`` (matched by class and
    position); returns what could not be matched."""
    unmatched = []
    for entry in entries:
        index = entry["index"]
        callback = callbacks[index] if index < len(callbacks) else None
        if callback is None or _kind(callback) != entry["class"]:
            unmatched.append(f"{entry['class']} (callback {index})")
            continue
        for name, value in entry["state"].items():
            setattr(callback, name, _from_scalar(value))
        for name, described in entry["arrays"].items():
            setattr(callback, name, [np.frombuffer(members[d["member"]], dtype=np.dtype(d["dtype"])).reshape(d["shape"])
                                     for d in described])
    return unmatched
