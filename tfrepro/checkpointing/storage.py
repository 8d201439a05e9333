"""Checkpoint files: one ``.npz`` per checkpoint, written atomically, read without pickles.

A checkpoint is ``DIR/ckpt-eEEEEE-bBBBBBBB.npz``: the position (epoch E, batch B within it) is in
the name, so the latest sorts last. Inside, ``manifest`` is UTF-8 JSON (format version, position,
what was saved and how to check it fits), every other member is raw bytes whose dtype and shape the
manifest gives. ``numpy.load(..., allow_pickle=False)`` reads it: loading never runs code.

A file appears only whole (``tfrepro._files.atomic_file``): a process killed mid-write leaves a
temporary file that is never read and is removed by the next save. A file that is unreadable all
the same (a damaged disk) is skipped with a warning, and the one before it is used.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfrepro import _tf
from tfrepro._files import TEMPORARY_SUFFIX, atomic_file
from tfrepro.determinism import state
from tfrepro.errors import warn

FORMAT = "tfrepro.checkpoint/1"
_NAME = re.compile(r"^ckpt-e(\d{6})-b(\d{8})\.npz$")


@dataclass(frozen=True)
class Stored:
    """One checkpoint read back: its manifest and its byte members."""

    path: Path
    manifest: dict[str, Any]
    members: dict[str, bytes]

    @property
    def epoch(self) -> int:
        return int(self.manifest["position"]["epoch"])

    @property
    def batch(self) -> int:
        return int(self.manifest["position"]["batch"])


def checkpoint_name(epoch: int, batch: int) -> str:
    return f"ckpt-e{epoch:06d}-b{batch:08d}.npz"


def list_checkpoints(directory: Path) -> list[Path]:
    """The complete checkpoints in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    found = [(tuple(map(int, m.groups())), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [path for _, path in sorted(found)]


def write(directory: Path, manifest: Mapping[str, Any], members: Mapping[str, bytes], keep: int) -> Path:
    """Write one checkpoint atomically, then drop all but the newest ``keep`` (and any temporary
    file a killed writer left). Returns the new file's path."""
    directory.mkdir(parents=True, exist_ok=True)
    position = manifest["position"]
    path = directory / checkpoint_name(position["epoch"], position["batch"])
    arrays = {"manifest": np.frombuffer(json.dumps(dict(manifest), sort_keys=True).encode("utf-8"), np.uint8)}
    arrays.update({name: np.frombuffer(data, np.uint8) for name, data in members.items()})
    with atomic_file(path) as file:
        np.savez(file, **arrays)
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    for leftover in directory.glob(f".ckpt-*{TEMPORARY_SUFFIX}"):
        if not _writer_alive(leftover):  # a writer that was killed
            leftover.unlink(missing_ok=True)
    return path


def _writer_alive(temporary: Path) -> bool:
    """Whether the process named in a temporary file's name (``.NAME.PID.THREAD.tmp``) still runs."""
    try:
        pid = int(temporary.name.split(".")[-3])
    except (IndexError, ValueError):
        return False
    if pid == os.getpid():
        return False  # our own writes are done when this runs
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read(path: Path) -> Stored:
    """One checkpoint. Raises ValueError if it is not a complete tfrepro checkpoint."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            members = {name: npz[name].tobytes() for name in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{path.name} is not readable: {exc}") from None
    if "manifest" not in members:
        raise ValueError(f"{path.name} has no manifest")
    try:
        manifest = json.loads(members.pop("manifest").decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path.name} has a damaged manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path.name} is not a {FORMAT} checkpoint")
    missing = sorted(set(manifest.get("members", [])) - set(members))
    if missing:
        raise ValueError(f"{path.name} lacks {', '.join(missing)}")
    return Stored(path, manifest, members)


def latest(directory: Path) -> Stored | None:
    """The newest readable checkpoint in ``directory``, or None when there is none. A file that
    cannot be read is skipped with a warning naming it."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return read(path)
        except ValueError as exc:
            warn(f"skipping checkpoint {path}: {exc}; using the one before it")
    return None


def environment() -> dict[str, Any]:
    """What a checkpoint records of the software it was taken under, and the ``tfrepro.patch`` seed."""
    keras = _tf.keras_module()
    return {"keras": keras.__name__, "keras_version": keras.__version__, "tensorflow": _tf.import_tf().__version__,
            "seed": state.active_seed()}


def environment_problems(saved: Mapping[str, Any], here: Mapping[str, Any], exact: tuple[str, ...]) -> list[str]:
    """How a checkpoint's ``environment`` differs from this run's in the ``exact`` keys (one line
    each: the checkpoint is unusable); another TensorFlow or Keras version only warns."""
    problems = [f"{key.replace('_', ' ')}: checkpoint {saved.get(key)!r}, this run {here[key]!r}"
                for key in exact if saved.get(key) != here[key]]
    for key, name in (("tensorflow", "TensorFlow"), ("keras_version", "Keras")):
        if saved.get(key) != here[key]:
            warn(f"the checkpoint was taken under {name} {saved.get(key)}, this is {here[key]}: kernels may differ, "
                 "and so may the bits")
    return problems


def array_bytes(value: np.ndarray) -> bytes:
    """The raw bytes of an array in C order (any dtype, bfloat16 included)."""
    return np.ascontiguousarray(value).tobytes()


def array_from(data: bytes, dtype: Any, shape: list[int]) -> np.ndarray:
    return np.frombuffer(data, dtype=dtype).reshape(shape)
