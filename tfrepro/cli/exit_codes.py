"""The exit codes of the ``tfrepro`` command (``tfrepro run`` returns the script's own)."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    """Success; compare/check/demo: the runs are identical."""
    DIVERGED = 1
    """compare/check/demo: the runs diverged (the first divergence is printed)."""
    USAGE = 2
    """A user error (bad arguments, missing script or command, unusable or incomparable trace), or a
    checked run failed or never called Model.fit, or a sweep's seed gave no value."""
    INTERRUPTED = 130
    """Ctrl-C (128 + SIGINT), as a shell reports it."""
