"""Exceptions and warning categories raised by tfrepro, and ``warn``, which names the user's line."""

from __future__ import annotations

import sys
import warnings


class ReproducibilityWarning(UserWarning):
    """Something may make runs differ: a setting came too late, conflicts, or cannot be applied.

    tfrepro never leaves a setting unapplied silently: `tfrepro.patch` and the callbacks name what
    they could not do in this warning, attributed to the user's line (not to tfrepro's). Filter it
    like any warning, e.g. `warnings.simplefilter("error", tfrepro.ReproducibilityWarning)` to make
    a test fail on it.
    """


class DivergenceError(RuntimeError):
    """A run diverged from its reference trace.

    Raised by `ReproducibilityCallback(reference=..., on_divergence="raise")` at the first record
    that differs from the reference, which ends `Model.fit`. The trace written so far is closed
    first, so it holds every record up to and including the divergent one.

    Args:
        divergence: The first divergence, a `tfrepro.Divergence`; its `str` is part of the message.

    Attributes:
        divergence: The `tfrepro.Divergence` passed in: where the runs parted, and what differed.
    """

    def __init__(self, divergence: object):
        self.divergence = divergence
        super().__init__(f"run diverged from the reference at {divergence}")


class NotComparableError(ValueError):
    """Two traces (or a run and its reference) come from different models.

    Raised by `ReproducibilityCallback(reference=...)` when training starts with a model whose
    variables differ from the reference's. Variables are matched by their place in the model, shape
    and dtype, not by Keras's automatic names. (`tfrepro.compare` does not raise it: it returns a
    `Comparison` with `comparable=False`.)

    Args:
        mismatch: How the models differ, one line each (the message joins them).

    Attributes:
        mismatch: The list passed in.
    """

    def __init__(self, mismatch: list[str]):
        self.mismatch = mismatch
        super().__init__("not comparable: the models differ: " + "; ".join(mismatch))


class UncoveredOpError(NotImplementedError):
    """A traced step holds ops that the exact tier does not cover, so its bits could differ.

    Raised by `patch(ops="exact")` (the default `on_uncovered="raise"`) when a function that will
    train is traced, before its first step runs. The message names each op, its layer and the axes
    (threads, oneDNN, XLA, replicas) across which it can change bits.

    Args:
        message: The message.
        uncovered: The ops named, `tfrepro.ops.exact.coverage.Uncovered` each.

    Attributes:
        uncovered: The list passed in.
    """

    def __init__(self, message: str, uncovered: list):
        self.uncovered = uncovered
        super().__init__(message)


class LaunchError(ValueError):
    """A command cannot be launched as given (`tfrepro run`, `check`, `sweep`).

    A user error, not a failure of the run: the CLI reports it in one line and exits with code 2.
    """


class CheckpointError(ValueError):
    """A checkpoint cannot resume this run.

    Raised by `tfrepro.ReproCheckpoint` and `tfrepro.LoopCheckpoint` when the checkpoint comes from
    a different model, optimizer or configuration, or when the model's random layers keep state
    that no checkpoint can hold, so that a resumed run could not continue bit for bit.

    Args:
        message: What cannot be resumed, in one sentence.
        mismatch: How the checkpoint differs from this run, one line each, appended to the message
            as a list. Defaults to none.

    Attributes:
        mismatch: The lines of `mismatch`, a list (empty when none were given).
    """

    def __init__(self, message: str, mismatch: list[str] | None = None):
        self.mismatch = list(mismatch or [])
        super().__init__(message + "".join(f"\n  - {line}" for line in self.mismatch))


# Frames of these packages are skipped when a warning names its line: the user's call site is the
# first frame outside them (a `with tfrepro.patched():`, a `model.fit(...)`, a `tfrepro.verify(...)`).
_LIBRARY_PREFIXES = ("tfrepro", "contextlib", "keras", "tf_keras", "tensorflow", "runpy")


def warn(message: str, category: type[Warning] = ReproducibilityWarning) -> None:
    """Issues a warning attributed to the user's line, not to tfrepro's.

    `warnings.warn` with the stack level of the first frame outside tfrepro and the libraries it
    is called through (Keras, TensorFlow, `contextlib`, `runpy`); the outermost frame when all are
    library frames.

    Args:
        message: The warning's text.
        category: The warning class. Defaults to `ReproducibilityWarning`.
    """
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in _LIBRARY_PREFIXES:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1)
