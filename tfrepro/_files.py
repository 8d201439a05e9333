"""Files that are never seen half-written: the ground floor's one writer, used by sweeps, diagnoses
and anything else that must survive a crash mid-write."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

TEMPORARY_SUFFIX = ".tmp"


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one, never a
    part, even across a crash (see ``atomic_file``)."""
    with atomic_file(path) as file:
        file.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file that appears at ``path`` whole, or not at all, even across a crash: written
    under a temporary name no other process or thread uses (``.NAME.PID.THREAD.tmp``), fsynced,
    renamed over ``path``, and the folder fsynced so that the rename itself is on disk. An exception
    inside the block removes the temporary file and leaves ``path`` as it was."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}{TEMPORARY_SUFFIX}")
    try:
        with open(temporary, "wb") as file:
            yield file
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
