"""The ``tfrepro`` command line: the argument parser and one function per command.

Exit codes are ``tfrepro.cli.exit_codes.ExitCode``; ``tfrepro run`` returns the script's own (the
script replaces the tfrepro process).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfrepro._version import __version__
from tfrepro.cli.exit_codes import ExitCode
from tfrepro.errors import LaunchError
from tfrepro.launching.command import bootstrap_command, looks_like_python
from tfrepro.launching.config import LaunchConfig

if TYPE_CHECKING:
    from tfrepro.launching.checking import CheckResult


class _Parser(argparse.ArgumentParser):
    """argparse, but every error is one line and exit code 2, never a traceback."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _fail(command: str, message: str) -> int:
    """A user error: one line on stderr in argparse's form, naming the command's --help."""
    print(f"tfrepro {command}: error: {message} (see `tfrepro {command} --help`)", file=sys.stderr)
    return ExitCode.USAGE


def _onednn(value: str) -> bool:
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError("expected on or off")
    return value == "on"


class _OpsAction(argparse.Action):
    """``--ops`` alone ("all"), or ``--ops exact``: the next word is taken only when it is
    ``exact``, so that ``tfrepro run --ops python train.py`` still means ``--ops`` and a command."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, "all")


_OPS_EXACT = "--ops exact"  # the option ``--ops exact`` becomes (one word: argparse names it in its errors)


def _exact_ops(argv: Sequence[str]) -> list[str]:
    """``--ops exact`` (before the command) as one option, which ``_OpsAction`` cannot see. Any other
    word after ``--ops`` that is not an option, ``--`` or the command (a Python interpreter or a
    script) is a mistaken value: ``LaunchError``. The scan stops where the command begins (``--``, or
    the first interpreter or script): the command's own arguments are left as they are."""
    argv = list(argv)
    for i, word in enumerate(argv):
        if word == "--" or (i > 0 and _starts_the_command(word)):
            break
        if word == "--ops=exact" or (word == "--ops" and argv[i + 1:i + 2] == ["exact"]):
            return argv[:i] + [_OPS_EXACT] + argv[i + (1 if "=" in word else 2):]
        value = word.partition("=")[2] if word.startswith("--ops=") else (
            argv[i + 1] if word == "--ops" and i + 1 < len(argv) else None)
        if value is not None and (word.startswith("--ops=") or not (value.startswith("-") or _starts_the_command(value))):
            raise LaunchError(f"--ops takes no value but exact: --ops (every op tfrepro.ops has), --ops exact (the "
                              f"exact tier) or --no-ops; got {value!r}")
    return argv


def _starts_the_command(word: str) -> bool:
    return word.endswith(".py") or looks_like_python(word)


def _add_launch_options(parser: argparse.ArgumentParser, seed: bool = True) -> None:
    if seed:
        parser.add_argument("--seed", type=int, default=0, help="the seed (default 0), also PYTHONHASHSEED")
    parser.add_argument("--threads", type=int, default=None, help="pin TF's intra/inter-op thread pools to N")
    parser.add_argument("--onednn", type=_onednn, default=None, metavar="on|off", help="set TF_ENABLE_ONEDNN_OPTS")
    ops = parser.add_mutually_exclusive_group()
    ops.add_argument("--ops", dest="ops", action=_OpsAction, default="auto", metavar="[exact]",
                     help="--ops: replace every op tfrepro.ops has with its order-invariant version "
                          "(patch(ops=True)); --ops exact: the exact tier, the same bits across thread counts, "
                          "oneDNN, XLA and replica counts (patch(ops='exact')); by default only the ops this "
                          "TensorFlow cannot run deterministically on a GPU (ops='auto')")
    ops.add_argument(_OPS_EXACT, dest="ops", action="store_const", const="exact", help=argparse.SUPPRESS)
    ops.add_argument("--no-ops", dest="ops", action="store_const", const="none",
                     help="replace no op (patch(ops=False)): the ops above then raise on a GPU")
    parser.add_argument("--on-uncovered", choices=("raise", "warn"), default="raise",
                        help="with --ops exact: what the exact tier's audit does with an op it does not cover, "
                             "named before the first step: raise (default) or warn and train "
                             "(patch(on_uncovered=...))")
    parser.add_argument("--init", choices=("order", "keyed"), default="order",
                        help="initial weights: in creation order (default), or keyed by layer and weight name "
                             "(patch(init='keyed'))")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python train.py [args...]")


def _add_results_options(parser: argparse.ArgumentParser, figure: str) -> None:
    parser.add_argument("--out", default=None, help="results folder (default: a new temporary folder, kept; its path "
                                                    "is printed)")
    parser.add_argument("--plot", metavar="PNG", help=f"also draw {figure} to this image")


def _command(args: argparse.Namespace) -> list[str]:
    command = list(args.command)
    command = command[1:] if command[:1] == ["--"] else command
    if not command:
        raise LaunchError(f"no command given; usage: tfrepro {args.cmd} [options] -- python train.py [args...]")
    return command


def cmd_run(args: argparse.Namespace) -> int:
    config = LaunchConfig(seed=args.seed, threads=args.threads, onednn=args.onednn, ops=args.ops, init=args.init, on_uncovered=args.on_uncovered)
    env = config.to_env()
    if args.checkpoint is None:
        if args.checkpoint_every is not None or args.checkpoint_keep is not None:
            raise LaunchError("--checkpoint-every and --checkpoint-keep need --checkpoint DIR")
        command = bootstrap_command(_command(args))
    else:
        from tfrepro.checkpointing.resuming import CheckpointOptions

        checkpoint = CheckpointOptions(args.checkpoint, args.checkpoint_every or "epoch",
                                       3 if args.checkpoint_keep is None else args.checkpoint_keep)
        command = bootstrap_command(_command(args), entry="tfrepro.checkpointing.resuming")
        env.update(checkpoint.to_env())
    sys.stdout.flush()
    sys.stderr.flush()
    if args.workers is not None:
        return _run_workers(command, env, args.workers)
    if os.name == "posix":
        try:
            os.execvpe(command[0], command, env)  # the script becomes this process: signals and exit code pass through
        except OSError as exc:
            return _fail("run", f"cannot start {command[0]}: {exc}")
    return _run_and_wait(command, env)


def _run_workers(command: list[str], env: dict[str, str], workers: int) -> int:
    """``tfrepro run --workers N``: the first non-zero exit code of the workers, else 0."""
    from tfrepro.launching.workers import check_worker_count, launch_workers

    check_worker_count(workers)
    try:
        outcome = launch_workers(command, [env] * workers)
    except KeyboardInterrupt:
        print("tfrepro run: interrupted; every worker was stopped", file=sys.stderr)
        return ExitCode.INTERRUPTED
    if outcome.stopped_by.startswith("worker"):
        print(f"tfrepro run: {outcome.stopped_by} exited with {outcome.returncode}; the other workers were stopped",
              file=sys.stderr)
    elif outcome.stopped_by:
        print(f"tfrepro run: {outcome.stopped_by}; every worker was stopped", file=sys.stderr)
    elif outcome.returncode:
        print(f"tfrepro run: worker {outcome.first_failed} exited with {outcome.returncode}", file=sys.stderr)
    return outcome.returncode


def _run_and_wait(command: list[str], env: dict[str, str]) -> int:
    """Non-POSIX: run as a child. Ctrl-C reaches the child through the console; wait for its exit."""
    with subprocess.Popen(command, env=env) as child:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                continue


def cmd_env(args: argparse.Namespace) -> int:
    from tfrepro.proof.environment_info import environment

    env = environment()
    if args.json:
        print(json.dumps(env, indent=2, sort_keys=True))
        return ExitCode.OK
    from tfrepro.cli import rendering

    rendering.show(rendering.environment_view(env), rendering.environment_lines(env))
    return ExitCode.OK


def cmd_status(args: argparse.Namespace) -> int:
    from tfrepro.determinism.reporting import status

    report = status()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return ExitCode.OK
    from tfrepro.cli import rendering

    rendering.show(rendering.report_table(report), str(report))
    return ExitCode.OK


def _out_dir(out: str | None, prefix: str) -> Path:
    if out is None:
        return Path(tempfile.mkdtemp(prefix=prefix))
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise LaunchError(f"--out {out} exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def cmd_compare(args: argparse.Namespace) -> int:
    from tfrepro.cli import rendering
    from tfrepro.proof.comparison import compare
    from tfrepro.proof.traces import TraceError

    if args.metric is not None and not args.plot:
        raise LaunchError("--metric chooses what --plot draws; give --plot PNG too")
    _check_plot_path(args.plot)
    try:
        comparison = compare(args.a, args.b)
    except (OSError, TraceError) as exc:
        return _fail("compare", str(exc))
    if not comparison.comparable:
        return _fail("compare", f"not comparable: {args.a} and {args.b} are traces of different models: "
                                f"{comparison.mismatch_summary}")
    rendering.show(rendering.comparison_view(comparison), str(comparison))
    if args.plot:
        from tfrepro.plotting.figures import plot_runs

        _save_figure(lambda: plot_runs([args.a, args.b], metric=args.metric or "loss", labels=["A", "B"]), args.plot)
    return ExitCode.OK if comparison.identical else ExitCode.DIVERGED


def _check_exit_code(result: CheckResult) -> ExitCode:
    if result.failure:
        return ExitCode.USAGE
    return ExitCode.OK if result.identical else ExitCode.DIVERGED


def _refuse_options_without_patch(args: argparse.Namespace) -> None:
    """``--no-patch`` runs the script as it is: an option that configures the patch would do nothing."""
    if not args.no_patch:
        return
    given = [name for name, on in (("--ops", args.ops != "auto"), ("--init", args.init != "order"),
                                   ("--on-uncovered", args.on_uncovered != "raise"),
                                   ("--threads", args.threads is not None)) if on]  # --onednn is an env var: it applies
    if given:
        raise LaunchError(f"--no-patch runs the script without tfrepro.patch, so {', '.join(given)} would do nothing; "
                          "drop them, or drop --no-patch")


def cmd_check(args: argparse.Namespace) -> int:
    from tfrepro.cli import rendering
    from tfrepro.launching.checking import GRADIENTS_WITH_WORKERS, RunInterrupted, check

    _refuse_options_without_patch(args)
    config = LaunchConfig(seed=args.seed, threads=args.threads, onednn=args.onednn, ops=args.ops, init=args.init, on_uncovered=args.on_uncovered,
                          patch=not args.no_patch, gradients=args.gradients)
    command = _command(args)
    bootstrap_command(command)  # fail fast on a bad command, before any folder is made
    if args.runs < 2:
        raise LaunchError(f"--runs must be at least 2 to compare runs; got {args.runs}")
    workers = args.workers
    if workers is not None:
        from tfrepro.launching.workers import check_worker_count

        check_worker_count(workers)
        if args.gradients:
            raise LaunchError(GRADIENTS_WITH_WORKERS)
    out = _out_dir(args.out, "tfrepro-check-")
    title = f"tfrepro check: {args.runs} runs" + (f" x {workers} worker(s)" if workers is not None else "")
    try:
        result = rendering.with_progress(title, args.runs,
                                         lambda on_run: check(command, runs=args.runs, config=config, out=out,
                                                              on_run=on_run, workers=workers))
    except RunInterrupted as interrupted:
        print(f"tfrepro check: interrupted: {interrupted}; rerun the same tfrepro check to start over",
              file=sys.stderr)
        return ExitCode.INTERRUPTED
    rendering.print_check(result, out, diagnose_with=_doctor_command(args, command))
    return _check_exit_code(result)


def _doctor_command(args: argparse.Namespace, command: list[str]) -> str:
    """The ``tfrepro doctor`` command line that diagnoses what ``tfrepro check`` ran."""
    options = [*(["--seed", str(args.seed)] if args.seed else []), *(["--threads", str(args.threads)] if args.threads
               else []), *(["--onednn", "on" if args.onednn else "off"] if args.onednn is not None else []),
               *({"all": ["--ops"], "exact": ["--ops", "exact"], "none": ["--no-ops"]}.get(args.ops, [])),
               *(["--on-uncovered", args.on_uncovered] if args.on_uncovered != "raise" else []),
               *(["--init", "keyed"] if args.init == "keyed" else []), *(["--no-patch"] if args.no_patch else [])]
    return shlex.join(["tfrepro", "doctor", *options, "--", *command])


def cmd_demo(args: argparse.Namespace) -> int:
    from tfrepro.cli import rendering
    from tfrepro.examples.demo import arm, epoch_losses, run_arm

    if args.epochs < 1 or args.limit < 64:
        raise LaunchError("--epochs must be >= 1 and --limit >= 64")
    names = ("no-seeds", "seeds") if args.no_patch else ("no-seeds", "seeds", "patch")
    arms = [arm(name, args.seed) for name in names]
    out = _out_dir(args.out, "tfrepro-demo-")
    console = rendering.console()
    console.print(f"Training the Keras MNIST CNN twice in fresh processes, in {len(arms)} arms: "
                  + "; ".join(a.label for a in arms) + ".", highlight=False)
    results = []
    for demo_arm in arms:
        result = rendering.with_progress(demo_arm.label, 2, lambda on_run: run_arm(
            demo_arm, epochs=args.epochs, limit=args.limit, offline=args.offline, out=out, on_run=on_run))
        results.append(result)
        if len(results) == 1 and result.runs and result.runs[0].returncode == 0:
            data_line = next((line for line in result.runs[0].stdout().splitlines() if line.startswith("data: ")), "")
            console.print(data_line, markup=False, highlight=False)
        losses = [epoch_losses(run.traces[0]) for run in result.runs if run.traces]
        rendering.print_demo_arm(demo_arm.label, result, losses, demo_arm.expectation)
    console.print(f"traces and logs: {out}", highlight=False)
    return _check_exit_code(results[-1])


def cmd_doctor(args: argparse.Namespace) -> int:
    from tfrepro.cli import rendering
    from tfrepro.diagnosis.doctoring import doctor

    if args.repeats != 0 and args.repeats < 2:
        raise LaunchError(f"--repeats must be 0 (static scan only) or at least 2; got {args.repeats}")
    if args.tf_version is not None:
        from tfrepro.diagnosis.scanning import check_tf_version

        try:
            check_tf_version(args.tf_version)
        except ValueError as exc:
            raise LaunchError(f"--tf-version: {exc}") from None
    _refuse_options_without_patch(args)
    config = LaunchConfig(seed=args.seed, threads=args.threads, onednn=args.onednn, ops=args.ops, init=args.init, on_uncovered=args.on_uncovered,
                          patch=not args.no_patch)
    command = _command(args)
    bootstrap_command(command)  # fail fast on a bad command, before any folder is made
    out = _out_dir(args.out, "tfrepro-doctor-")
    which = "every Model.fit" if args.every_fit else "the first Model.fit"
    result = rendering.with_progress(f"tfrepro doctor: {which}", 1, lambda on_run: doctor(
        command, config=config, out=out, repeats=args.repeats, keep_going=args.keep_going,
        tf_version=args.tf_version, every_fit=args.every_fit))
    rendering.print_doctor(result, out)
    if result.diagnosis is None or (args.every_fit and result.failure):  # --every-fit: not every fit was seen
        return ExitCode.USAGE
    return ExitCode.OK if result.clean else ExitCode.DIVERGED


def _check_plot_path(path: str | None) -> None:
    """Fail before any work on a --plot path that cannot be written: an image format matplotlib
    does not write, or a folder that does not exist."""
    if path is None:
        return
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError as exc:
        raise LaunchError("--plot needs matplotlib: pip install 'tfrepro[plot]'") from exc

    suffix = Path(path).suffix.lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        raise LaunchError(f"--plot {path}: name an image file ending in one of .{', .'.join(sorted(formats))}")
    if not Path(path).resolve().parent.is_dir():
        raise LaunchError(f"--plot {path}: the folder {Path(path).resolve().parent} does not exist")


def _save_figure(draw: Callable[[], Any], path: str) -> None:
    """Draw a figure and save it; a figure that cannot be drawn or written is a user error."""
    try:
        draw().savefig(path, dpi=120)
    except (OSError, ValueError) as exc:  # nothing to draw, an unwritable path, an unknown image format
        raise LaunchError(f"cannot plot to {path}: {exc}") from exc
    print(f"plot: {path}")


def cmd_sweep(args: argparse.Namespace) -> int:
    from tfrepro.cli import rendering
    from tfrepro.sweeps.running import parse_seeds, parse_shard, run_sweep

    command = list(args.command)
    if command[:1] == ["merge"]:  # `tfrepro sweep --metric m merge ...`: options of a run before `merge`
        raise LaunchError("`merge` must come right after `sweep`: tfrepro sweep merge DIR... [--out DIR] [--plot PNG]"
                          " (--seeds, --metric, --best, --shard and --jobs belong to a sweep run)")
    seeds = parse_seeds(args.seeds if args.seeds is not None else "0-4")
    if args.shard:
        index, count = parse_shard(args.shard)
        seeds = seeds[index::count]
    jobs = 1 if args.jobs is None else args.jobs
    if jobs < 1:
        raise LaunchError(f"--jobs must be at least 1; got {jobs}")
    if not seeds:
        raise LaunchError(f"no seeds to run: shard {args.shard} of --seeds {args.seeds or '0-4'} holds none")
    _check_plot_path(args.plot)
    command = _command(args)
    bootstrap_command(command)  # fail fast on a bad command: all checks come before any folder is made
    config = LaunchConfig(threads=args.threads, onednn=args.onednn, ops=args.ops, init=args.init, on_uncovered=args.on_uncovered)
    out = _out_dir(args.out, "tfrepro-sweep-")
    result = rendering.with_progress(f"tfrepro sweep: {len(seeds)} seeds", len(seeds), lambda on_run: run_sweep(
        command, seeds, config=config, out=out, metric=args.metric or "loss", best=args.best, jobs=jobs,
        on_run=on_run))
    return _report_sweep(result, out, args.plot)


def cmd_sweep_merge(args: argparse.Namespace) -> int:
    from tfrepro.sweeps.running import merge_sweeps

    _check_plot_path(args.plot)
    result = merge_sweeps([Path(folder) for folder in args.folders])
    out = _out_dir(args.out, "tfrepro-sweep-") if args.out else None
    if out is not None:
        result.save(out)
    return _report_sweep(result, out, args.plot)


def _report_sweep(result: Any, out: Path | None, plot: str | None) -> int:
    from tfrepro.cli import rendering

    rendering.print_sweep(result, out)
    if plot:
        from tfrepro.plotting.figures import plot_sweeps

        _save_figure(lambda: plot_sweeps(result), plot)
    return ExitCode.USAGE if result.failed else ExitCode.OK


def cmd_tune(args: argparse.Namespace) -> int:
    from tfrepro.cli import rendering
    from tfrepro.sweeps.running import MAX_SEEDS, parse_seeds
    from tfrepro.tuning.script_tuning import parse_params, rerun_command, tune_script

    configs = parse_params(args.param or [])
    if args.budget is None or args.budget < 1:
        raise LaunchError(f"--budget must be a number of fits >= 1 (e.g. {2 * len(configs) + 8} for two seeds each "
                          f"of the {len(configs)} configurations and 8 to race); got {args.budget}")
    goal = args.goal or ("min" if "loss" in args.metric else None)
    if goal is None:
        raise LaunchError(f"say which way {args.metric} is better: --goal max (accuracy) or --goal min (loss)")
    max_seeds = 10 if args.max_seeds is None else args.max_seeds
    min_seeds = 3 if args.min_seeds is None else args.min_seeds
    if not 2 <= min_seeds <= max_seeds <= MAX_SEEDS:
        raise LaunchError(f"--min-seeds must be at least 2 and at most --max-seeds, and --max-seeds at most {MAX_SEEDS}; "
                          f"got --min-seeds {min_seeds}, --max-seeds {max_seeds}")
    seeds = parse_seeds(args.seeds) if args.seeds is not None else list(range(max_seeds))
    if len(seeds) < max_seeds:
        raise LaunchError(f"--seeds must hold at least --max-seeds seeds; got {len(seeds)} seeds for --max-seeds "
                          f"{max_seeds}")
    _check_plot_path(args.plot)
    command = _command(args)
    bootstrap_command(command)
    config = LaunchConfig(threads=args.threads, onednn=args.onednn, ops=args.ops, init=args.init, on_uncovered=args.on_uncovered)
    out = _out_dir(args.out, "tfrepro-tune-")
    result = rendering.with_progress(f"tfrepro tune: {len(configs)} configurations", args.budget, lambda on_run: tune_script(
        command, configs, config=config, out=out, metric=args.metric, goal=goal, budget=args.budget, best=args.best,
        seeds=seeds, min_seeds=min_seeds, max_seeds=max_seeds, on_run=lambda candidate, seed: on_run(seed)))
    print(result)
    if result.best is not None:
        seed = next(iter(result.best.scores))
        print(f"rerun the best ({result.best.name}, seed {seed}): {rerun_command(command, result.best, seed, config)}")
    print(f"results (tuning.json) and each fit's logs and traces: {out}")
    if args.plot:
        from tfrepro.plotting.figures import plot_tuning

        _save_figure(lambda: plot_tuning(result), args.plot)
    failed = [c for c in result.candidates if c.status == "failed"]
    for candidate in failed:
        print(f"{candidate.name} failed: {candidate.detail}", file=sys.stderr)
    return ExitCode.USAGE if failed or result.best is None else ExitCode.OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tfrepro", description="Reproducible TensorFlow/Keras training.")
    parser.add_argument("--version", action="version", version=f"tfrepro {__version__}")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="run an unmodified Python training script deterministically",
                         description="Run a Python command with PYTHONHASHSEED and the TF determinism "
                                     "variables set before the interpreter starts, and tfrepro.patch() "
                                     "applied before the script's first line. Exit code: the script's.")
    run.add_argument("--checkpoint", metavar="DIR", default=None,
                     help="give every Model.fit a tfrepro.ReproCheckpoint in DIR/fit-K: run the same command again "
                          "after a crash and training resumes exactly where it stopped")
    run.add_argument("--checkpoint-every", default=None, metavar="epoch|N",
                     help="checkpoint at every epoch end (default) or every N batches")
    run.add_argument("--checkpoint-keep", type=int, default=None, metavar="N", help="keep the newest N (default 3)")
    run.add_argument("--workers", type=int, default=None, metavar="N",
                     help="start N workers of the command on this machine, a tf.distribute cluster on localhost "
                          "(TF_CONFIG generated; worker 0 is the chief); output lines get a [worker K] prefix; when "
                          "one fails, or at Ctrl-C, all are stopped; exit code: the first non-zero one")
    _add_launch_options(run)
    run.set_defaults(func=cmd_run, parser=run)

    check = sub.add_parser("check", help="run a script N times and name the first divergence",
                           description="Run an unmodified script N times in fresh interpreters (as "
                                       "`tfrepro run` does), record every Model.fit, and compare each run "
                                       "with the first (with --workers, every worker with worker 0 first). "
                                       "Exit 0 identical, 1 diverged, 2 a run failed.")
    check.add_argument("--runs", type=int, default=2, help="how many runs (default 2)")
    check.add_argument("--out", default=None, help="folder for traces and logs (default: a new temporary folder, "
                                                   "kept; its path is printed)")
    check.add_argument("--no-patch", action="store_true", help="run without tfrepro.patch (negative control)")
    check.add_argument("--gradients", action="store_true", help="also compare every applied gradient")
    check.add_argument("--workers", type=int, default=None, metavar="N",
                       help="run each run as N localhost workers (as `tfrepro run --workers N`), each recording in "
                            "run-K/worker-W; every worker is compared with worker 0 at every step, then run to run")
    _add_launch_options(check)
    check.set_defaults(func=cmd_check, parser=check)

    compare = sub.add_parser("compare", help="compare two traces exactly",
                             description="Exit 0 identical, 1 diverged, 2 unusable input or not comparable.")
    compare.add_argument("a", help="trace file (JSON Lines)")
    compare.add_argument("b", help="trace file (JSON Lines)")
    compare.add_argument("--plot", metavar="PNG", help="also draw both runs' curves, the divergence marked")
    compare.add_argument("--metric", default=None, help="the logged value --plot draws (default loss)")
    compare.set_defaults(func=cmd_compare, parser=compare)

    demo = sub.add_parser("demo", help="train the Keras MNIST CNN twice, without seeds, with seeds, with tfrepro",
                          description="Trains the Keras MNIST CNN (random augmentation in a parallel tf.data "
                                      "map) twice in fresh processes, in three arms: no seeds; seeds set the "
                                      "usual way; tfrepro.patch. Compares each arm's two runs exactly. Uses "
                                      "MNIST from the Keras cache (or a download) and else scikit-learn's "
                                      "bundled digits. Exit 0 when the tfrepro.patch runs are identical.")
    demo.add_argument("--seed", type=int, default=0, help="the seed of the seeded arms (default 0)")
    demo.add_argument("--epochs", type=int, default=2)
    demo.add_argument("--limit", type=int, default=2048, help="training images (default 2048)")
    demo.add_argument("--offline", action="store_true", help="never try to download MNIST")
    demo.add_argument("--no-patch", action="store_true",
                      help="only the arms without tfrepro (exit 0 when the seeded runs happen to match)")
    demo.add_argument("--out", default=None, help="folder for traces and logs (default: a new temporary folder, "
                                                  "kept; its path is printed)")
    demo.set_defaults(func=cmd_demo, parser=demo)

    sweep = sub.add_parser("sweep", help="run a script once per seed and report the spread of a metric",
                           description="Run an unmodified script once per seed, each in a fresh interpreter as "
                                       "`tfrepro check` runs each of its runs (patched with the seed, every "
                                       "Model.fit recorded, so TensorFlow loads), and print each seed's metric "
                                       "with the mean, std, range and a 95% confidence interval. The metric is "
                                       "what the script reported with tfrepro.report_metric(NAME, value), else "
                                       "NAME's value in the final epoch of its last Model.fit (or the best "
                                       "epoch's, with --best). Results go to --out as sweep.json and sweep.csv; "
                                       "rerun with the same --out and seeds finished with the same command are "
                                       "skipped. `tfrepro sweep merge DIR... [--out DIR]` combines the folders of "
                                       "shards. Exit 0 every seed gave a value, 2 otherwise or on bad input.")
    sweep.add_argument("--seeds", default=None, help="seeds: 0-9, 0,3,7 or a mix (default 0-4)")
    sweep.add_argument("--metric", default=None, help="the metric to read (default loss)")
    sweep.add_argument("--best", choices=["min", "max"], default=None,
                       help="take the lowest/highest epoch value instead of the final one (a metric the script "
                            "reported is taken as reported)")
    sweep.add_argument("--jobs", type=int, default=None, help="seeds run at once (default 1)")
    sweep.add_argument("--shard", default=None, metavar="K/N", help="run only every N-th seed from the K-th (0-based), "
                                                                   "for a job array; give each shard its own --out "
                                                                   "and merge them after")
    _add_results_options(sweep, "the seeds' distribution")
    _add_launch_options(sweep, seed=False)
    sweep.set_defaults(func=cmd_sweep, parser=sweep)

    # `tfrepro sweep merge ...` reaches this parser through main(), which joins the two words.
    merge = sub.add_parser("sweep merge", help="combine the results of a sweep's shards (--shard K/N) into one",
                           description="Combine the --out folders of a sweep's shards into one table, as if one "
                                       "sweep had run every seed (byte for byte the same sweep.csv). Exit 0 when "
                                       "every seed gave a value, 2 otherwise or on bad input.")
    merge.add_argument("folders", nargs="+", metavar="DIR", help="the --out folders of the shards")
    merge.add_argument("--out", default=None, help="write the merged sweep.json and sweep.csv here")
    merge.add_argument("--plot", metavar="PNG", help="also draw the seeds' distribution to this image")
    merge.set_defaults(func=cmd_sweep_merge, parser=merge)

    tune = sub.add_parser("tune", help="race a script's hyperparameters over seeds, within a budget of fits",
                          description="Race every combination of the --param values over seeds: each fit runs the "
                                      "script in a fresh interpreter as `tfrepro sweep` runs a seed, with the "
                                      "combination in TFREPRO_HYPERPARAMETERS (the script reads it with "
                                      "tfrepro.tuning.hyperparameters(**defaults)). Every combination gets three "
                                      "seeds; those still in the race get further seeds in turn, and one worse "
                                      "than the leader beyond seed noise is dropped, until one is left or "
                                      "--budget is spent. Prints "
                                      "the table, which combinations are better than which (Welch, Holm-adjusted) "
                                      "and the command that reruns the best. Results go to --out as tuning.json; "
                                      "rerun with the same --out and finished fits are read, not run again. Exit 0 "
                                      "with a best and no failed combination, 2 otherwise or on bad input.")
    tune.add_argument("--param", action="append", metavar="NAME=V1,V2,...",
                      help="a hyperparameter and its values (repeat for each; the grid is every combination)")
    tune.add_argument("--budget", type=int, default=None, help="the most fits to run (required)")
    tune.add_argument("--metric", default="loss", help="the metric to read, as tfrepro sweep reads it (default loss)")
    tune.add_argument("--goal", choices=["min", "max"], default=None,
                      help="which way the metric is better (default min for a metric named like a loss)")
    tune.add_argument("--best", choices=["min", "max"], default=None,
                      help="read the lowest/highest epoch value instead of the final one")
    tune.add_argument("--min-seeds", type=int, default=None,
                      help="seeds every combination gets before any is judged (default 3; 2 claims falsely more often)")
    tune.add_argument("--max-seeds", type=int, default=None, help="the most seeds one combination gets (default 10)")
    tune.add_argument("--seeds", default=None, help="the seeds every combination runs, in increasing order (default 0 "
                                                    "to --max-seeds - 1)")
    _add_results_options(tune, "the race")
    _add_launch_options(tune, seed=False)
    tune.set_defaults(func=cmd_tune, parser=tune)

    doctor = sub.add_parser("doctor", help="find the layer or op that makes runs differ (static scan and bisection)",
                            description="Run an unmodified script as `tfrepro run` does and, at its first Model.fit, "
                                        "diagnose the model on the first batch: a static scan of the train step "
                                        "against the table of ops without deterministic GPU kernels (for this "
                                        "TensorFlow, or --tf-version), the input pipeline and the configuration; "
                                        "then --repeats runs of the same step from the same state, compared bit for "
                                        "bit, naming the first layer that varies. The script stops there unless "
                                        "--continue. Exit 0 clean, 1 findings, 2 could not run (bad input, the "
                                        "script failed or never called Model.fit).")
    doctor.add_argument("--repeats", type=int, default=3, help="repeats of the step (default 3; 0: static scan only)")
    doctor.add_argument("--continue", dest="keep_going", action="store_true",
                        help="let the script train on after the diagnosis")
    doctor.add_argument("--every-fit", action="store_true",
                        help="diagnose every Model.fit of the script, not only the first (the script trains on; "
                             "fit K's diagnosis goes to diagnosis-K.json); exit 1 if any has findings, 2 if the script or a "
                             "diagnosis failed before the script's end")
    doctor.add_argument("--tf-version", default=None, metavar="X.Y",
                        help="scan against this TensorFlow version's facts (default: the installed one)")
    doctor.add_argument("--no-patch", action="store_true", help="run the script without tfrepro.patch, as it is")
    doctor.add_argument("--out", default=None, help="folder for diagnosis.json and the script's logs (default: a new "
                                                    "temporary folder, kept; its path is printed)")
    _add_launch_options(doctor)
    doctor.set_defaults(func=cmd_doctor, parser=doctor)

    env = sub.add_parser("env", help="print this machine's environment fingerprint")
    env.add_argument("--json", action="store_true", help="machine-readable JSON")
    env.set_defaults(func=cmd_env, parser=env)

    status = sub.add_parser("status", help="print which determinism settings are in place in a fresh process")
    status.add_argument("--json", action="store_true", help="machine-readable JSON")
    status.set_defaults(func=cmd_status, parser=status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["sweep", "merge"]:
        argv[:2] = ["sweep merge"]
    try:
        argv = _exact_ops(argv)
    except LaunchError as exc:
        commands = set(parser._subparsers._group_actions[0].choices)  # the subcommands' names
        return _fail(next((word for word in argv if word in commands), "run"), str(exc))
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported by the command's own parser, so that the hint names its --help
        (getattr(args, "parser", None) or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.cmd is None:
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    try:
        return args.func(args)
    except (LaunchError, ImportError) as exc:
        return _fail(args.cmd, str(exc))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
