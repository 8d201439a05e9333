"""The child side of ``tfrepro run``/``check``: apply ``tfrepro.patch``, then run the user's script,
module or code string as ``__main__``.

Started as ``python -c tfrepro.launching.command.BOOTSTRAP (SCRIPT | --module NAME | --code CODE)
[ARGS...]``, configured by the environment that ``LaunchConfig.to_env`` wrote. With a trace folder
set (``tfrepro check``) every ``Model.fit`` writes a trace there.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import runpy
import sys
import zipfile
from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import Any, ContextManager

from tfrepro.launching.config import LaunchConfig
from tfrepro._import_hooks import call_after_import


def main(argv: list[str], around: Callable[[], ContextManager[Any]] | None = None) -> None:
    """Patch as configured, then run the user's command; ``around()``, if given, makes a context that
    the command runs in (``tfrepro doctor`` intercepts the first ``Model.fit`` this way)."""
    if not argv:
        raise SystemExit("usage: python -c BOOTSTRAP (SCRIPT | --module NAME | --code CODE) [ARGS...]")
    config = LaunchConfig.from_env()
    if config.patch:
        _patch(config)
    if config.trace_dir:
        from tfrepro.proof.fit_recording import record_fits

        recording = record_fits(config.trace_dir, gradients=config.gradients)
    else:
        recording = contextlib.nullcontext()
    with recording, around() if around is not None else contextlib.nullcontext():
        try:
            _run(argv)
        except Exception:  # SystemExit and KeyboardInterrupt are not Exceptions: they pass through as they are
            kind, error, traceback = sys.exc_info()
            traceback = _user_frames(traceback)
            sys.excepthook(kind, error.with_traceback(traceback), traceback)
            sys.exit(1)  # what Python returns for an uncaught exception


def _patch(config: LaunchConfig) -> None:
    """``tfrepro.patch`` before the script's first line. The environment is already in place (the
    launcher set it before this interpreter started); Python's RNG is seeded now, NumPy's when NumPy
    is imported, and the TensorFlow half (switches, op replacements, TF and Keras seeds) when
    TensorFlow is: a script that never imports TensorFlow never waits for it, and TensorFlow's
    import leaves Python's RNG where it was. ``tfrepro check`` records every ``Model.fit``, which
    needs Keras, so there everything is applied at once. Both are seed S as
    ``tfrepro.determinism.seeding`` defines it."""
    from tfrepro.determinism import patching, seeding, state

    if config.trace_dir or "tensorflow" in sys.modules:
        patching.patch(config.seed, threads=config.threads, onednn=config.onednn, ops=config.patch_ops, init=config.init,
                       on_uncovered=config.on_uncovered)
        return

    def on_tensorflow(tf: ModuleType) -> None:
        if state.active() is None:  # a script that calls tfrepro.patch() itself has the last word
            # onednn=None: the launcher set TF_ENABLE_ONEDNN_OPTS before this interpreter started
            patching.apply_patch(config.seed, threads=config.threads, ops=config.patch_ops, init=config.init,
                                 on_uncovered=config.on_uncovered, host_rngs=False)

    seeding.seed_python(config.seed)
    # Keras 3 and tf_keras import modules that draw from Python's RNG before they import TensorFlow:
    # their imports keep it where it was too, so that `import keras` first computes what `import
    # tensorflow` first does.
    call_after_import({"numpy": lambda numpy: seeding.seed_numpy(config.seed), "tensorflow": on_tensorflow,
                       "keras": _nothing, "tf_keras": _nothing},
                      around={name: seeding.preserving_host_rngs for name in ("tensorflow", "keras", "tf_keras")})


def _nothing(module: ModuleType) -> None:
    """A hook that only marks its module's import (for ``around``)."""


def _user_frames(traceback: TracebackType | None) -> TracebackType | None:
    """The traceback without the frames of this bootstrap and runpy in front of the user's code."""
    while traceback is not None and traceback.tb_frame.f_globals.get("__name__") in (__name__, runpy.__name__):
        traceback = traceback.tb_next
    return traceback


def _run(argv: list[str]) -> None:
    """Run the user's command with the sys.argv and sys.path[0] that Python gives it."""
    safe_path = getattr(sys.flags, "safe_path", False)  # python -P: nothing is put first
    if argv[0] == "--module":
        sys.argv = [argv[1], *argv[2:]]
        if not safe_path:
            sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "--code":
        sys.argv = ["-c", *argv[2:]]
        if not safe_path:
            sys.path.insert(0, "")
        main_module = ModuleType("__main__")  # a real __main__, as `python -c` runs in (pickling works)
        main_module.__loader__ = importlib.machinery.BuiltinImporter
        sys.modules["__main__"] = main_module
        exec(compile(argv[1], "<string>", "exec"), main_module.__dict__)
    else:
        script = argv[0]
        sys.argv = [script, *argv[1:]]
        if not safe_path:  # the script's folder (Python follows symlinks); a directory or zipapp: itself
            real = os.path.realpath(script)
            sys.path.insert(0, real if os.path.isdir(real) or zipfile.is_zipfile(real) else os.path.dirname(real))
        runpy.run_path(os.path.abspath(script), run_name="__main__")  # __file__ absolute, as in Python
