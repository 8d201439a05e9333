"""The child side of ``tfrepro run``/``check``: apply ``tfrepro.patch``, then run the user's script,
module or code string as ``__main__``.

Usage: ``python -m tfrepro.launching.bootstrap (SCRIPT | --module NAME | --code CODE) [ARGS...]``,
configured by the environment that ``LaunchConfig.to_env`` wrote. With a trace folder set (``tfrepro
check``) every ``Model.fit`` writes a trace there.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys

from tfrepro.launching.config import LaunchConfig


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m tfrepro.launching.bootstrap (SCRIPT | --module NAME | --code CODE) [ARGS...]")
    config = LaunchConfig.from_env()
    if config.patch:
        from tfrepro.determinism.patching import patch

        patch(config.seed, threads=config.threads, onednn=config.onednn, ops=config.ops)
    if config.trace_dir:
        from tfrepro.proof.fit_recording import record_fits

        recording = record_fits(config.trace_dir, gradients=config.gradients)
    else:
        recording = contextlib.nullcontext()
    with recording:
        _run(argv)


def _run(argv: list[str]) -> None:
    if argv[0] == "--module":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "--code":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    else:
        script = argv[0]
        sys.argv = [script, *argv[1:]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
