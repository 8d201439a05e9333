"""``tfrepro run --checkpoint DIR``: a ``ReproCheckpoint`` on every ``Model.fit`` of an unmodified
script, so that running the same command again after a crash resumes exactly.

The parent adds ``CheckpointOptions.to_env()`` to the child's environment and starts it through this
module's ``main``, which wraps the launcher's bootstrap. The K-th ``fit`` of the script checkpoints to
``DIR/fit-K`` (K = 0, 1, ...); a ``fit`` that already has a ``ReproCheckpoint`` is left alone. Keras 2
random layers are switched to ``tf.random.Generator``s first, whose state a checkpoint can hold. A
``tfrepro.LoopCheckpoint`` made without a directory checkpoints to ``DIR/loop-K``. What a resume loaded
is one line on stderr; so is a run that checkpointed nothing (no ``fit``, no ``LoopCheckpoint``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfrepro import _tf
from tfrepro.errors import CheckpointError, LaunchError
from tfrepro.launching import bootstrap
from tfrepro.proof.fit_recording import each_fit

_ENV = {"directory": "TFREPRO_CHECKPOINT_DIR", "every": "TFREPRO_CHECKPOINT_EVERY", "keep": "TFREPRO_CHECKPOINT_KEEP"}
NOTHING_CHECKPOINTED = (
    "tfrepro run --checkpoint: nothing was checkpointed: the script never called Model.fit and made no "
    "tfrepro.LoopCheckpoint, so a rerun starts from scratch; in a custom training loop, use "
    "tfrepro.LoopCheckpoint (docs/how-to/resume.md). The exit code is the script's own")


@dataclass(frozen=True)
class CheckpointOptions:
    """``--checkpoint DIR``, ``--checkpoint-every``, ``--checkpoint-keep``; passed to the child in
    its environment."""

    directory: str
    every: str | int = "epoch"
    keep: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.every, str) and self.every != "epoch":
            try:
                object.__setattr__(self, "every", int(self.every))
            except ValueError:
                pass
        if not (self.every == "epoch" or (isinstance(self.every, int) and self.every >= 1)):
            raise LaunchError(f'--checkpoint-every must be "epoch" or a positive number of batches; got {self.every!r}')
        if self.keep < 1:
            raise LaunchError(f"--checkpoint-keep must be a positive integer; got {self.keep}")
        if Path(self.directory).exists() and not Path(self.directory).is_dir():
            raise LaunchError(f"--checkpoint must name a folder; {self.directory} is a file")

    def to_env(self) -> dict[str, str]:
        return {_ENV["directory"]: str(Path(self.directory).resolve()), _ENV["every"]: str(self.every),
                _ENV["keep"]: str(self.keep)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CheckpointOptions:
        environ = os.environ if environ is None else environ
        return cls(environ[_ENV["directory"]], environ.get(_ENV["every"], "epoch"), int(environ.get(_ENV["keep"], "3")))


def run_options() -> CheckpointOptions | None:
    """The options of the ``tfrepro run --checkpoint`` this process runs under, or None."""
    return CheckpointOptions.from_env() if _ENV["directory"] in os.environ else None


def main(argv: list[str]) -> None:
    """The child's entry point (see ``tfrepro.launching.command.bootstrap_code``). A checkpoint that
    does not fit the script is a user error: one line on stderr, exit 1, no traceback."""
    options = CheckpointOptions.from_env()
    sys.excepthook = functools.partial(_one_line_for_checkpoint_errors, sys.excepthook)
    handler = logging.StreamHandler(sys.stderr)  # what a resume loaded: one line
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("tfrepro.checkpointing")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    fits: list[int] = []
    try:
        bootstrap.main(argv, around=lambda: checkpoint_fits(options, fits))
    finally:
        loops = sys.modules.get("tfrepro.checkpointing.loop")
        if not fits and not (loops is not None and loops.made()):
            logger.warning(NOTHING_CHECKPOINTED)


def _one_line_for_checkpoint_errors(default: Any, kind: type[BaseException], error: BaseException,
                                    traceback: Any) -> None:
    if isinstance(error, CheckpointError):
        logging.getLogger("tfrepro.checkpointing").error("tfrepro run --checkpoint: %s", error)
    else:
        default(kind, error, traceback)


@contextlib.contextmanager
def checkpoint_fits(options: CheckpointOptions, fits: list[int] | None = None) -> Iterator[list[Path]]:
    """While active, every ``Model.fit`` without a ``ReproCheckpoint`` gets one, in
    ``DIRECTORY/fit-K``. Yields the folders, which grow as fits run; ``fits``, if given, gets one
    entry per ``fit`` called."""
    from tfrepro.checkpointing.callback import ReproCheckpoint  # imports Keras

    keras = _tf.keras_module()
    if _tf.keras_major(keras) < 3:
        keras.backend.experimental.enable_tf_random_generator()
    folders: list[Path] = []

    def add(callbacks: list[Any]) -> Any:
        if fits is not None:
            fits.append(len(fits))
        if any(isinstance(c, ReproCheckpoint) for c in callbacks):
            return None
        folders.append(Path(options.directory) / f"fit-{len(folders)}")
        return ReproCheckpoint(folders[-1], save_freq=options.every, max_to_keep=options.keep)

    with each_fit(add):
        yield folders
