"""Rewrite the user's Python command so that it runs through ``tfrepro.launching.bootstrap``, which
applies ``tfrepro.patch`` before the script's first line (``tfrepro run``, ``tfrepro check``)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tfrepro.errors import LaunchError

# The child starts as `python -c BOOTSTRAP ARGS`. Python puts the working directory first on sys.path
# for -c; a folder there named tfrepro (the parent of a clone) would then shadow the installed
# package, so the bootstrap drops that entry before importing tfrepro, and sets sys.path[0] the
# way the user's own command would have (see bootstrap.main).
def bootstrap_code(entry: str = "tfrepro.launching.bootstrap") -> str:
    """The ``python -c`` code that starts the child: ``entry.main(sys.argv[1:])``, where ``entry`` is
    ``tfrepro.launching.bootstrap`` or a module that wraps its ``main`` (``tfrepro doctor``'s)."""
    if not re.fullmatch(r"tfrepro(\.\w+)+", entry):
        raise ValueError(f"not a tfrepro module: {entry!r}")
    return ("import sys; getattr(sys.flags, 'safe_path', False) or sys.path.pop(0); "
            f"from {entry} import main; main(sys.argv[1:])")


BOOTSTRAP = bootstrap_code()
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?(\.exe)?$")
# Interpreter options that would defeat the launcher: -E and -I ignore PYTHONHASHSEED and the
# determinism variables set before the interpreter starts; -S hides site-packages, where tfrepro is.
_REFUSED = {
    "E": "makes Python ignore PYTHONHASHSEED and the determinism variables that tfrepro sets before it starts, "
         "so runs could differ",
    "I": "makes Python ignore PYTHONHASHSEED and the determinism variables that tfrepro sets before it starts, "
         "so runs could differ",
    "S": "makes Python skip site-packages, where tfrepro is installed",
}


def bootstrap_command(command: list[str], entry: str = "tfrepro.launching.bootstrap") -> list[str]:
    """Rewrite ``python [opts] script.py args`` / ``python -m mod args`` / ``python -c code`` /
    ``script.py args`` so that it runs through the bootstrap (``bootstrap_code(entry)``), keeping the
    interpreter options (clusters such as ``-uB`` and attached values such as ``-Werror`` or
    ``-mpkg`` included). Raises LaunchError for anything else, and for an interpreter that cannot import
    tfrepro (a `python` on PATH other than the one tfrepro is installed in)."""
    code = bootstrap_code(entry)
    if not command:
        raise LaunchError("no command given: tfrepro runs Python commands, e.g. `python train.py [args...]`")
    head = command[0]
    if head.endswith(".py"):
        return [sys.executable, "-c", code, _existing_script(head), *command[1:]]
    if not looks_like_python(head):
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
        if arg == "--":  # what follows is the script
            index += 1
            break
        if arg == "-" or not arg.startswith("-"):
            break
        if arg.startswith("--"):
            options.append(arg)
            if arg == "--check-hash-based-pycs" and index + 1 < len(command):
                options.append(command[index + 1])
                index += 1
            index += 1
            continue
        for position, letter in enumerate(arg[1:], start=1):
            if letter in _REFUSED:
                raise LaunchError(f"`{head} {arg}`: -{letter} {_REFUSED[letter]}; drop -{letter}")
            if letter in "cm":  # the rest of the cluster, or the next argument, is the code or module
                if position > 1:
                    options.append(arg[:position])
                value, rest = arg[position + 1:], command[index + 1:]
                if not value:
                    if not rest:
                        raise LaunchError(f"`{head} -{letter}` needs an argument")
                    value, rest = rest[0], rest[1:]
                _require_tfrepro(head, tuple(options))
                return [head, *options, "-c", code, "--module" if letter == "m" else "--code", value, *rest]
            if letter in "WX":  # the rest of the cluster, or the next argument, is its value
                options.append(arg)
                if position == len(arg) - 1 and index + 1 < len(command):
                    options.append(command[index + 1])
                    index += 1
                break
        else:
            options.append(arg)
        index += 1
    if index >= len(command) or command[index] == "-":
        raise LaunchError(f"no script given to {head}; tfrepro cannot run an interactive interpreter or stdin")
    script = _existing_script(command[index])
    _require_tfrepro(head, tuple(options))
    return [head, *options, "-c", code, script, *command[index + 1:]]


# Can the interpreter import tfrepro, as the bootstrap does (without the working directory first)?
_PROBE = ("import sys; getattr(sys.flags, 'safe_path', False) or sys.path.pop(0); import importlib.util; "
          "spec = importlib.util.find_spec('tfrepro'); sys.exit(0 if spec and spec.origin not in (None, 'namespace') "
          "else 3)")


@functools.lru_cache(maxsize=None)
def _require_tfrepro(head: str, options: tuple[str, ...]) -> None:
    """Raise LaunchError, naming the interpreter tfrepro is installed in, when ``head`` (with the
    user's interpreter options) cannot import tfrepro: the child would die of ModuleNotFoundError.
    Asks the interpreter (about 20 ms) unless it is this one, unchanged by options."""
    found = shutil.which(head)
    if found is None or (not options and os.path.abspath(found) == os.path.abspath(sys.executable)):
        return
    try:
        probe = subprocess.run([found, *options, "-c", _PROBE], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return  # launching will say what is wrong with it
    if probe.returncode == 0:
        return
    hint = ""
    if sys.prefix != sys.base_prefix:
        hint = f", or activate its environment ({Path(sys.prefix) / 'bin' / 'activate'})"
    raise LaunchError(f"`{head}` is {found}, which cannot import tfrepro; use {sys.executable}, the Python tfrepro "
                      f"is installed in{hint}")


def _existing_script(path: str) -> str:
    if Path(path).is_dir() and not (Path(path) / "__main__.py").is_file():
        raise LaunchError(f"{path} is a directory without a __main__.py, not a script: give the .py file to run")
    if not Path(path).exists():
        raise LaunchError(f"script not found: {path}")
    return path


def looks_like_python(word: str) -> bool:
    """Whether ``word`` names a Python interpreter (``python``, ``python3.11``, ``/usr/bin/python3``)."""
    return bool(_PYTHON_NAME.match(Path(word).name))
