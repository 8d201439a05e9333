"""Exceptions and warning categories raised by tfrepro, and ``warn``, which names the user's line."""

from __future__ import annotations

import sys
import warnings


class ReproducibilityWarning(UserWarning):
    """Something may make runs differ: a setting came too late, conflicts, or cannot be applied.

    Filter it like any warning, e.g. ``warnings.simplefilter("error", tfrepro.ReproducibilityWarning)``.
    """


class DivergenceError(RuntimeError):
    """Raised by ``ReproducibilityCallback(on_divergence="raise")`` at the first divergence from the
    reference. ``.divergence`` holds the details (a ``tfrepro.Divergence``)."""

    def __init__(self, divergence: object):
        self.divergence = divergence
        super().__init__(f"run diverged from the reference at {divergence}")


class NotComparableError(ValueError):
    """Two traces (or a run and its reference) come from different models; ``.mismatch`` lists how."""

    def __init__(self, mismatch: list[str]):
        self.mismatch = mismatch
        super().__init__("not comparable: the models differ: " + "; ".join(mismatch))


class LaunchError(ValueError):
    """A command cannot be launched as given (``tfrepro run``/``check``): a user error that the CLI
    reports in one line with exit code 2."""


class CheckpointError(ValueError):
    """A ``ReproCheckpoint`` cannot resume this run: the checkpoint comes from a different model,
    optimizer or configuration (``.mismatch`` lists how), or the model's random layers keep state
    that no checkpoint can hold."""

    def __init__(self, message: str, mismatch: list[str] | None = None):
        self.mismatch = list(mismatch or [])
        super().__init__(message + "".join(f"\n  - {line}" for line in self.mismatch))


# Frames of these packages are skipped when a warning names its line: the user's call site is the
# first frame outside them (a `with tfrepro.patched():`, a `model.fit(...)`, a `tfrepro.verify(...)`).
_LIBRARY_PREFIXES = ("tfrepro", "contextlib", "keras", "tf_keras", "tensorflow", "runpy")


def warn(message: str, category: type[Warning] = ReproducibilityWarning) -> None:
    """``warnings.warn`` attributed to the user's line: the first frame outside tfrepro and the
    libraries it is called through (the outermost frame when all are library frames)."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in _LIBRARY_PREFIXES:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1)
