"""Files that are never seen half-written: the ground floor's one writer, used by sweeps, diagnoses
and anything else that must survive a crash mid-write."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one, never a
    part, even across a crash: a temporary file of a name no other process or thread uses, fsynced,
    renamed over ``path``, and the folder fsynced so that the rename itself is on disk."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(temporary, "wb" if isinstance(data, bytes) else "w") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    if os.name == "posix":
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
