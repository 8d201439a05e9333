"""Run a script, module or code string after ``tfrepro.patch`` (internal; see ``tfrepro.launch``).

Usage: ``python -m tfrepro._bootstrap (SCRIPT | --module NAME | --code CODE) [ARGS...]``.
The configuration arrives in ``TFREPRO_*`` environment variables set by the launcher;
``TFREPRO_TRACE_DIR`` makes every ``Model.fit`` write a trace there (``tfrepro check``), with
gradient fingerprints when ``TFREPRO_GRADIENTS=1``.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys


def _configure() -> None:
    if os.environ.get("TFREPRO_PATCH", "1") != "1":
        return
    import tfrepro

    threads = os.environ.get("TFREPRO_THREADS")
    onednn = os.environ.get("TFREPRO_ONEDNN")
    tfrepro.patch(
        int(os.environ.get("TFREPRO_SEED", "0")),
        threads=int(threads) if threads else None,
        onednn=None if onednn is None else onednn == "1",
        ops=os.environ.get("TFREPRO_OPS") == "1",
    )


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m tfrepro._bootstrap (SCRIPT | --module NAME | --code CODE) [ARGS...]")
    _configure()
    trace_dir = os.environ.get("TFREPRO_TRACE_DIR")
    if trace_dir:
        from tfrepro.recording import record_fits

        recording = record_fits(trace_dir, gradients=os.environ.get("TFREPRO_GRADIENTS") == "1")
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
