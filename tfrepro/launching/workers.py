"""``tfrepro run --workers N``: N worker processes of one command on this machine, as a
``tf.distribute`` cluster on localhost.

Each worker gets a generated ``TF_CONFIG``: N ``worker`` tasks on free 127.0.0.1 ports, worker 0
the chief (TensorFlow's rule when the cluster has no ``chief`` job). Their stdout and stderr lines
reach the launcher's with a ``[worker K]`` prefix (and, given folders, each worker's own files).
When one worker fails, or the launcher gets Ctrl-C or SIGTERM, every other worker is stopped:
SIGINT, then SIGTERM, then SIGKILL, each after ``grace_s``. Each worker leads its own process group,
so whatever it started is stopped with it, and on Linux a worker is also killed by the kernel if
the launcher itself dies (``PR_SET_PDEATHSIG``; not what the worker started, and not on macOS).

The exit code is the first non-zero one in time (a worker killed by signal S counts as 128 + S),
else 0. For a real cluster, run ``tfrepro run`` (without ``--workers``) inside each task under the
cluster's own launcher: the cluster's ``TF_CONFIG`` passes through unchanged.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from tfrepro.errors import LaunchError

MOST_WORKERS = 64
WORKER_ENV = "TFREPRO_WORKER"  # K, for a worker started by this launcher
_PR_SET_PDEATHSIG = 1


def check_worker_count(workers: int) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MOST_WORKERS:
        raise LaunchError(f"--workers must be an integer from 1 to {MOST_WORKERS}; got {workers!r}")


def tf_configs(workers: int) -> list[str]:
    """One ``TF_CONFIG`` per worker: a cluster of ``workers`` tasks on free localhost ports."""
    check_worker_count(workers)
    with contextlib.ExitStack() as stack:  # hold every port until all are chosen, so none repeats
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(workers)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        addresses = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    return [json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})
            for index in range(workers)]


@dataclass
class WorkersOutcome:
    """How the workers ended: each one's exit code (128 + S for signal S), and the first non-zero
    one in time (``returncode``; 0 when all succeeded) and that worker (``first_failed``).
    ``stopped_by`` names the worker whose
    failure stopped the others, or "interrupted"; empty when none was stopped."""

    returncodes: list[int]
    returncode: int
    stopped_by: str = ""
    first_failed: int | None = None  # the worker that failed first in time


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _death_with_parent() -> Callable[[], None] | None:
    """On Linux, the ``preexec_fn`` that has the kernel SIGKILL a worker when the launcher dies. It is
    prepared here, in the launcher: between fork and exec the child only calls ``prctl``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(137)

    return die_with_parent


def _pump(source: BinaryIO, prefix: bytes, sinks: Sequence[IO[bytes] | None], lock: threading.Lock) -> None:
    """Copy ``source`` line by line to the launcher's stream (prefixed; None: not) and to the
    worker's file, to the end: a worker never blocks on a full pipe."""
    terminal, *files = sinks
    for line in iter(source.readline, b""):
        for index, file in enumerate(files):
            if file is None:
                continue
            try:
                file.write(line)
                file.flush()
            except (OSError, ValueError):  # a full disk, a closed file: that copy stops, the worker is drained on
                files[index] = None
        if terminal is None:
            continue
        with lock:
            try:
                terminal.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
                terminal.flush()
            except (OSError, ValueError):  # the reader went away (`| head`), a hung-up tty: keep draining
                terminal = None
    source.close()


@contextlib.contextmanager
def _stop_signals() -> Iterator[list[str]]:
    """While active, SIGTERM (and SIGHUP) to the launcher is noted, not fatal, so the workers can be
    stopped first; Ctrl-C arrives as KeyboardInterrupt as usual."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def note(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def launch_workers(command: Sequence[str], envs: Sequence[Mapping[str, str]], *,
                   folders: Sequence[Path] | None = None, echo: bool = True, grace_s: float = 3.0) -> WorkersOutcome:
    """Run ``command`` once per environment in ``envs``, as that many workers (see the module doc),
    and wait for all of them.

    Worker K runs with ``envs[K]`` plus its ``TF_CONFIG``, ``TFREPRO_WORKER=K`` and
    ``PYTHONUNBUFFERED=1`` (so that lines arrive as they are printed). ``folders[K]``, if given,
    receives worker K's ``stdout.log`` and ``stderr.log``; ``echo=False`` keeps the lines off the
    launcher's own streams. Raises ``KeyboardInterrupt`` after stopping every worker when interrupted."""
    if os.name != "posix":
        raise LaunchError("--workers needs a POSIX system (Linux, macOS): it stops workers by process group")
    configs = tf_configs(len(envs))
    if folders is not None and len(folders) != len(envs):
        raise ValueError(f"{len(folders)} folders for {len(envs)} workers")
    terminal_out, terminal_err = sys.stdout.buffer, sys.stderr.buffer
    die_with_parent = _death_with_parent()
    lock = threading.Lock()
    children: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    with contextlib.ExitStack() as files, _stop_signals() as received:
        try:
            for index, (config, env) in enumerate(zip(configs, envs)):
                child_env = dict(env, TF_CONFIG=config, PYTHONUNBUFFERED="1", **{WORKER_ENV: str(index)})
                child = subprocess.Popen(list(command), env=child_env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                         preexec_fn=die_with_parent)
                children.append(child)
                prefix = f"[worker {index}] ".encode()
                for source, terminal, name in ((child.stdout, terminal_out, "stdout.log"),
                                               (child.stderr, terminal_err, "stderr.log")):
                    sinks: list[IO[bytes] | None] = [terminal if echo else None]
                    if folders is not None:
                        folders[index].mkdir(parents=True, exist_ok=True)
                        sinks.append(files.enter_context((folders[index] / name).open("wb")))
                    pump = threading.Thread(target=_pump, args=(source, prefix, sinks, lock), daemon=True)
                    pump.start()
                    pumps.append(pump)
            outcome = _wait(children, received, grace_s)
        except BaseException:
            _stop(children, grace_s)
            raise
        finally:
            for pump in pumps:
                pump.join(timeout=5)
    return outcome


def _wait(children: list[subprocess.Popen[bytes]], received: list[str], grace_s: float) -> WorkersOutcome:
    first_failure, stopped_by, first_failed = 0, "", None
    while True:
        codes = [child.poll() for child in children]
        failed = [index for index, code in enumerate(codes) if code not in (None, 0)]
        if failed and first_failed is None and stopped_by != "interrupted":
            first_failed = failed[0]
            first_failure = _exit_code(codes[first_failed])  # type: ignore[arg-type]
            if any(code is None for code in codes):
                stopped_by = f"worker {failed[0]}"
                _stop(children, grace_s)
                continue
        if received and not stopped_by:
            stopped_by = "interrupted"
            first_failure = first_failure or 128 + signal.Signals[received[0]].value
            _stop(children, grace_s)
            continue
        if all(code is not None for code in codes):
            return WorkersOutcome([_exit_code(code) for code in codes], first_failure,  # type: ignore[arg-type]
                                  stopped_by, first_failed)
        time.sleep(0.05)


def _stop(children: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to each running worker's process group, ``grace_s`` apart."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        running = [child for child in children if child.poll() is None]
        if not running:
            break
        for child in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(child.poll() is None for child in running):
            time.sleep(0.05)
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)  # whatever a worker started and left behind
        child.wait()
