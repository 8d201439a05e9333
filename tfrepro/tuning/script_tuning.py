"""``tfrepro tune``: race a script's hyperparameters over seeds, each fit a fresh interpreter.

The script reads its hyperparameters with ``tfrepro.tuning.hyperparameters(**defaults)``; ``tfrepro
tune`` runs it once per (configuration, seed) as ``tfrepro sweep`` runs a seed (``tfrepro.patch(S)``
before its first line, every ``Model.fit`` recorded), the configuration in the environment, and
reads the metric as ``sweep`` does. The race decides which fits to run (``tfrepro.tuning.race``).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tfrepro.errors import LaunchError
from tfrepro.launching.command import bootstrap_command
from tfrepro.launching.config import LaunchConfig
from tfrepro.proof.fingerprints import combine
from tfrepro.proof.traces import read_trace
from tfrepro.sweeps.running import seed_run
from tfrepro.tuning.racing import Candidate, TuningResult, race

HYPERPARAMETERS_ENV = "TFREPRO_HYPERPARAMETERS"
MAX_CONFIGS = 10_000


def hyperparameters(**defaults: Any) -> dict[str, Any]:
    """The hyperparameters this run was given by `tfrepro tune`, over the script's defaults.

    A script tuned from the command line calls it once, before building its model; run without
    `tfrepro tune` (plain `python`, `tfrepro run`) it returns the defaults.

    Args:
        **defaults: Every hyperparameter the script takes, with its default value. When given, a
            name from `tfrepro tune` that is not among them is an error, not ignored: a misspelt
            `--param` would otherwise tune nothing.

    Returns:
        A dict: the defaults, updated by the values `tfrepro tune` passed (in the
        `TFREPRO_HYPERPARAMETERS` environment variable, as JSON).

    Raises:
        ValueError: The variable is not a JSON object, or names a hyperparameter the defaults do
            not have (the message names both lists).

    Examples:
        >>> import tfrepro
        >>> tfrepro.tuning.hyperparameters(units=32, learning_rate=1e-3)
        {'units': 32, 'learning_rate': 0.001}
    """
    text = os.environ.get(HYPERPARAMETERS_ENV)
    if not text:
        return dict(defaults)
    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{HYPERPARAMETERS_ENV} is not JSON ({exc}): {text[:80]!r}") from exc
    if not isinstance(given, dict):
        raise ValueError(f"{HYPERPARAMETERS_ENV} must be a JSON object of names and values; got {text[:80]!r}")
    unknown = sorted(set(given) - set(defaults))
    if defaults and unknown:
        raise ValueError(f"tfrepro tune passed {', '.join(unknown)}, which this script does not take: it takes "
                         f"{', '.join(sorted(defaults))} (check the --param names)")
    return {**defaults, **given}


def _value(name: str, text: str) -> Any:
    """A `--param` value: a JSON number, boolean or null as such, anything else as a string."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    if isinstance(value, float) and not math.isfinite(value):
        raise LaunchError(f"--param {name}: {text} is not a finite number")
    return value if isinstance(value, (int, float, bool)) or value is None else text


def parse_params(texts: Sequence[str]) -> list[dict[str, Any]]:
    """Every combination of `--param NAME=V1,V2,...` values (a grid), in the order given.

    Args:
        texts: The `--param` arguments, each `NAME=V1,V2,...`.

    Returns:
        One dict per combination. A value that reads as JSON (a number, `true`, `null`) is that
        value, anything else a string; values equal as values (`0.1` and `0.10`) count once.

    Raises:
        LaunchError: A parameter is malformed, repeated or empty, a number is not finite, or the
            grid holds more than `MAX_CONFIGS` configurations.
    """
    if not texts:
        raise LaunchError("tfrepro tune needs at least one --param NAME=V1,V2,... (e.g. --param units=16,64)")
    names, choices = [], []
    for text in texts:
        match = re.fullmatch(r"\s*([A-Za-z_][\w.-]*)\s*=(.*)", text)
        if match is None:
            raise LaunchError(f"--param {text!r}: write NAME=V1,V2,... (e.g. --param learning_rate=0.001,0.003)")
        name, values = match.group(1), [v.strip() for v in match.group(2).split(",")]
        if not all(values):
            raise LaunchError(f"--param {text!r}: a value is empty; write NAME=V1,V2,...")
        if name in names:
            raise LaunchError(f"--param {name} is given twice: list all its values in one --param")
        names.append(name)
        parsed = [_value(name, value) for value in values]
        choices.append([value for i, value in enumerate(parsed) if not any(_same(value, v) for v in parsed[:i])])
    count = 1
    for values in choices:
        count *= len(values)
    if count > MAX_CONFIGS:
        raise LaunchError(f"the --param grid holds {count} configurations, more than {MAX_CONFIGS}")
    return [dict(zip(names, combination)) for combination in itertools.product(*choices)]


def _same(a: Any, b: Any) -> bool:
    """Equal values of one type (so `1` and `true`, or `1` and `1.0`, stay apart: a script may tell them apart)."""
    return type(a) is type(b) and a == b


def _fingerprint(folder: Path) -> str | None:
    """The final weights of the run's last `Model.fit`, from its trace, as one fingerprint."""
    traces = sorted(folder.glob("fit-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))
    ends = read_trace(traces[-1], strict=False).of_type("end") if traces else []
    return combine(ends[-1]["weights"]) if ends and ends[-1].get("weights") else None


def tune_script(command: Sequence[str], configs: Sequence[dict[str, Any]], *, config: LaunchConfig, out: Path,
                metric: str, goal: str, budget: int, best: str | None = None, seeds: Sequence[int] | None = None,
                min_seeds: int = 3, max_seeds: int = 10, confidence: float = 0.95,
                on_run: Callable[[Candidate, int], None] | None = None) -> TuningResult:
    """Races configurations of a script, each fit a fresh interpreter, as `tfrepro tune` does.

    Each fit is launched as `tfrepro sweep` launches a seed, in `out/<candidate>/seed-S`, with the
    configuration in `TFREPRO_HYPERPARAMETERS`. A fit whose folder holds a finished run of the same
    command, configuration and seed is read, not run again, so an interrupted tune rerun with the
    same `out` replays its decisions and goes on.

    Args:
        command: The command (`python train.py ...`).
        configs: The configurations, dicts of JSON values (`parse_params`).
        config: How each fit is launched (the seed is replaced per fit).
        out: The results folder; `tuning.json` is saved there.
        metric: The metric to read, as `tfrepro sweep` reads it.
        goal: `"max"` or `"min"`.
        budget: The most fits to run.
        best: Read the lowest (`"min"`) or highest (`"max"`) epoch value, not the final one.
        seeds: The seeds in the order every configuration runs them; default `range(max_seeds)`.
        min_seeds: As `tfrepro.tuning.race` takes it; default 3.
        max_seeds: The most seeds a configuration gets; default 10.
        confidence: The confidence level; default 0.95.
        on_run: Called with the candidate and the seed after each fit.

    Returns:
        The race's `TuningResult`.

    Raises:
        LaunchError: The command cannot be launched.
        ValueError: A race argument is out of range (see `tfrepro.tuning.race`).
    """
    argv = bootstrap_command(list(command))
    out.mkdir(parents=True, exist_ok=True)
    names = {json.dumps(c, sort_keys=True): f"c{i}" for i, c in enumerate(configs)}

    def score(hp: dict[str, Any], seed: int) -> tuple[float, str] | float:
        folder = out / names[json.dumps(hp, sort_keys=True)] / f"seed-{seed}"
        run, _, _ = seed_run(argv, config, folder, seed, metric, best,
                             extra_env={HYPERPARAMETERS_ENV: json.dumps(hp)})
        if run.status != "ok":
            raise RuntimeError(run.detail)
        print_ = _fingerprint(folder)
        return run.value if print_ is None else (run.value, print_)

    result = race(score, list(configs), budget=budget, goal=goal, seeds=seeds, min_seeds=min_seeds,
                  max_seeds=max_seeds, confidence=confidence, metric=metric, on_run=on_run)
    result.save(out)
    return result


def rerun_command(command: Sequence[str], candidate: Candidate, seed: int, config: LaunchConfig) -> str:
    """The shell command that reruns one fit of a tune as `tfrepro run` (the same bits).

    Args:
        command: The tuned command.
        candidate: The configuration's candidate.
        seed: The seed of the fit.
        config: How the tune launched its fits.

    Returns:
        `TFREPRO_HYPERPARAMETERS='...' tfrepro run --seed S [options] -- command`, shell-quoted.
    """
    launch = shlex.join(["tfrepro", "run", "--seed", str(seed), *config.cli_options(), "--", *command])
    return f"{HYPERPARAMETERS_ENV}={shlex.quote(json.dumps(candidate.config))} {launch}"
