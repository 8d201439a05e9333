"""Launching an unmodified Python command under tfrepro (``tfrepro run``, ``tfrepro check``).

The child interpreter gets ``PYTHONHASHSEED`` and the TF determinism variables in its environment
before it starts, and runs the user's script through ``tfrepro._bootstrap``, which applies
``tfrepro.patch`` before the script's first line.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tfrepro import _tf, seeding, switches

BOOTSTRAP = "tfrepro._bootstrap"
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?(\.exe)?$")
# Interpreter options that take a separate value (`-W error`, `-X dev`).
_OPTIONS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}


class LaunchError(Exception):
    """The command cannot be launched as given (a user error; the CLI exits with 2)."""


@dataclass(frozen=True)
class LaunchConfig:
    """How the child runs: the seed, thread pools, oneDNN, op replacements, and whether to patch at all."""

    seed: int = 0
    threads: int | None = None
    onednn: bool | None = None
    ops: bool = False
    patch: bool = True

    def __post_init__(self) -> None:
        try:
            seeding.validate_seed(self.seed, "--seed")
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        if self.threads is not None and self.threads < 1:
            raise LaunchError(f"--threads must be a positive integer; got {self.threads}")


def child_env(config: LaunchConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ``base`` (default ``os.environ``) plus what must precede interpreter start."""
    env = dict(os.environ if base is None else base)
    env["TFREPRO_PATCH"] = "1" if config.patch else "0"
    env["TFREPRO_SEED"] = str(config.seed)
    env["TFREPRO_OPS"] = "1" if config.ops else "0"
    env.pop("TFREPRO_THREADS", None)
    env.pop("TFREPRO_ONEDNN", None)
    if config.threads is not None:
        env["TFREPRO_THREADS"] = str(config.threads)
    if config.onednn is not None:
        env["TFREPRO_ONEDNN"] = "1" if config.onednn else "0"
        env["TF_ENABLE_ONEDNN_OPTS"] = env["TFREPRO_ONEDNN"]
    if config.patch:
        env["PYTHONHASHSEED"] = str(config.seed)
        env.update(switches.plan_for(_tf.installed_tf_version()).env)
    return env


def bootstrap_command(command: list[str]) -> list[str]:
    """Rewrite ``python [opts] script.py args`` / ``python -m mod args`` / ``python -c code`` /
    ``script.py args`` so that it runs through the bootstrap. Raises LaunchError for anything else."""
    if not command:
        raise LaunchError("no command given; usage: tfrepro run [options] -- python train.py [args...]")
    head = command[0]
    if head.endswith(".py"):
        return [sys.executable, "-m", BOOTSTRAP, _existing_script(head), *command[1:]]
    if not _PYTHON_NAME.match(Path(head).name):
        raise LaunchError(
            f"{head!r} is not a Python interpreter or a .py script; tfrepro runs Python commands: "
            "`python train.py ...`, `python -m package.module ...` or `train.py ...`"
        )
    if shutil.which(head) is None:
        raise LaunchError(f"Python interpreter not found: {head}")
    options: list[str] = []
    index = 1
    while index < len(command):
        arg = command[index]
        if arg in ("-m", "-c"):
            if index + 1 >= len(command):
                raise LaunchError(f"`{head} {arg}` needs an argument")
            flag = "--module" if arg == "-m" else "--code"
            return [head, *options, "-m", BOOTSTRAP, flag, command[index + 1], *command[index + 2:]]
        if arg == "-" or not arg.startswith("-"):
            break
        options.append(arg)
        if arg in _OPTIONS_WITH_VALUE and index + 1 < len(command):
            options.append(command[index + 1])
            index += 1
        index += 1
    if index >= len(command) or command[index] == "-":
        raise LaunchError(f"no script given to {head}; tfrepro cannot run an interactive interpreter or stdin")
    return [head, *options, "-m", BOOTSTRAP, _existing_script(command[index]), *command[index + 1:]]


def _existing_script(path: str) -> str:
    if not Path(path).is_file():
        raise LaunchError(f"script not found: {path}")
    return path
