"""The ``tfrepro`` command line.

Exit codes:
    0   success
    2   user error: bad arguments, missing script or command, unusable input
    run: the exit code of the script itself (the script replaces the tfrepro process)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence

from tfrepro import launch
from tfrepro._version import __version__

EXIT_OK = 0
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but every error is one line and exit code 2, never a traceback."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see `{self.prog} --help`)\n")


def _fail(message: str) -> int:
    print(f"tfrepro: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _onednn(value: str) -> bool:
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError("expected on or off")
    return value == "on"


def _add_launch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="the seed (default 0), also PYTHONHASHSEED")
    parser.add_argument("--threads", type=int, default=None, help="pin TF's intra/inter-op thread pools to N")
    parser.add_argument("--onednn", type=_onednn, default=None, metavar="on|off", help="set TF_ENABLE_ONEDNN_OPTS")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python train.py [args...]")


def _command(args: argparse.Namespace) -> list[str]:
    command = list(args.command)
    return command[1:] if command[:1] == ["--"] else command


def cmd_run(args: argparse.Namespace) -> int:
    config = launch.LaunchConfig(seed=args.seed, threads=args.threads, onednn=args.onednn)
    command = launch.bootstrap_command(_command(args))
    env = launch.child_env(config)
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "posix":
        try:
            os.execvpe(command[0], command, env)  # the script becomes this process: signals and exit code pass through
        except OSError as exc:
            return _fail(f"cannot start {command[0]}: {exc}")
    return _run_and_wait(command, env)


def _run_and_wait(command: list[str], env: dict[str, str]) -> int:
    """Non-POSIX: run as a child. Ctrl-C reaches the child through the console; wait for its exit."""
    with subprocess.Popen(command, env=env) as child:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                continue


def cmd_env(args: argparse.Namespace) -> int:
    from tfrepro.fingerprint import environment

    env = environment()
    if args.json:
        print(json.dumps(env, indent=2, sort_keys=True))
        return EXIT_OK
    from rich.console import Console
    from rich.pretty import Pretty

    Console().print(Pretty(env, expand_all=True))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from tfrepro.reporting import status

    report = status()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return EXIT_OK
    from rich.console import Console

    Console().print(report)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tfrepro", description="Reproducible TensorFlow/Keras training.")
    parser.add_argument("--version", action="version", version=f"tfrepro {__version__}")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="run an unmodified Python training script deterministically",
                         description="Run a Python command with PYTHONHASHSEED and the TF determinism "
                                     "variables set before the interpreter starts, and tfrepro.patch() "
                                     "applied before the script's first line. Exit code: the script's.")
    _add_launch_options(run)
    run.set_defaults(func=cmd_run)

    env = sub.add_parser("env", help="print this machine's environment fingerprint")
    env.add_argument("--json", action="store_true", help="machine-readable JSON")
    env.set_defaults(func=cmd_env)

    status = sub.add_parser("status", help="print which determinism settings are in place in a fresh process")
    status.add_argument("--json", action="store_true", help="machine-readable JSON")
    status.set_defaults(func=cmd_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except (launch.LaunchError, ImportError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
