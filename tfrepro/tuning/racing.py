"""Racing configurations over seeds: spend each training where the ranking is still in doubt.

Every configuration is scored on the same seeds, in the same order (common random numbers: seed 3
means the same data order and draws for every configuration that shares the model's shape). After
``min_seeds`` each, the race repeats two steps until the budget is spent (a race in the sense of
Maron and Moore's Hoeffding races and Birattari's F-race, with Welch's t-test):

1. **Eliminate.** The leader is the configuration with the best mean. Any other is dropped while
   Welch's t-test says it is worse than the leader beyond seed noise, at the race's confidence
   divided among the comparisons of that look (Bonferroni); it races again if the leader sinks
   back to it.
2. **Sample.** The configurations still in the race get the next seed in turn; a dropped one gets
   none.

The result's claims ("A is better than B") are Welch t-tests over every pair of configurations
with two or more seeds, Holm-adjusted for the number of pairs, so a table of ten configurations
does not find differences by multiplicity. Seed noise with no spread (a seed that does not reach
the training) is never taken for certainty: such pairs are not claimed.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tfrepro._files import write_atomically
from tfrepro.sweeps.statistics import MIN_SEEDS, compare_sweeps, mean_interval

logger = logging.getLogger(__name__)

Score = float | tuple[float, str]
"""What a scorer returns: the score, or the score and a fingerprint of the trained weights."""


@dataclass
class Candidate:
    """One configuration in a race, and what each of its seeds scored.

    Attributes:
        name: `"c0"`, `"c1"`, ... in the order the configurations were given to `race`.
        config: The configuration, as given (e.g. a dict of hyperparameter values).
        scores: Seed -> score, in the order the seeds ran (known scores first).
        fingerprints: Seed -> a fingerprint of the trained weights, for the seeds whose scorer
            returned one (`RacingSearch` does), so that a rerun can be checked bit for bit.
        status: `"best"` (the best mean among the measured); `"worse"` (worse than the best beyond
            seed noise: a claim); `"eliminated"` (the race stopped giving it seeds while it
            trailed the leader beyond noise, but the final tests over every pair do not separate
            it from the best); `"tied"` (not distinguishable from the best); `"unmeasured"`
            (fewer than two scores: the budget ran out first); or `"failed"` (an error or a
            non-finite score on some seed: failing is part of a configuration's score).
        eliminated_after: The number of seeds it had when the race last stopped giving it seeds
            for trailing the leader; None when it was in the race at the end.
        detail: Why it failed (the seed, the scorer's error or the non-finite score, and the mean
            of its earlier seeds); empty otherwise.
    """

    name: str
    config: Any
    scores: dict[int, float] = field(default_factory=dict)
    fingerprints: dict[int, str] = field(default_factory=dict)
    status: str = "racing"
    eliminated_after: int | None = None
    detail: str = ""

    @property
    def values(self) -> np.ndarray:
        """The scores as a float array, in the order the seeds ran."""
        return np.array(list(self.scores.values()), dtype=float)

    @property
    def mean(self) -> float:
        """The mean score (NaN without scores)."""
        return float(np.mean(self.values)) if self.scores else math.nan

    def interval(self, confidence: float = 0.95) -> tuple[float, float] | None:
        """Student's t interval for the mean score.

        Args:
            confidence: The interval's confidence level, strictly between 0 and 1.

        Returns:
            `(low, high)`, or None with fewer than two scores.
        """
        return mean_interval(self.values, confidence) if len(self.scores) >= MIN_SEEDS else None


@dataclass(frozen=True)
class Claim:
    """"`better` is better than `worse` beyond seed noise": one of `TuningResult.claims`.

    Attributes:
        better: The better candidate's name.
        worse: The worse candidate's name.
        difference: mean(better) - mean(worse): positive when higher is better, negative when lower.
        ci_low: The lower end of the Welch t interval of `difference` at the result's confidence
            (not adjusted for the number of pairs; `p_holm` is).
        ci_high: The upper end of that interval.
        p_value: The Welch t-test's two-sided p-value.
        p_holm: The p-value adjusted by Holm's method for every pair compared: the claim is made
            when it is below 1 - confidence.
    """

    better: str
    worse: str
    difference: float
    ci_low: float
    ci_high: float
    p_value: float
    p_holm: float

    def __str__(self) -> str:
        return (f"{self.better} > {self.worse}: difference {self.difference:+.4g} "
                f"[{self.ci_low:+.4g}, {self.ci_high:+.4g}], Holm p={self.p_holm:.3g}")


@dataclass
class TuningResult:
    """A race's outcome: every configuration's scores, the best, and what seed noise lets one say.

    `print(result)` shows a table (seeds, mean, interval, standing against the best), the claims,
    and the configurations tied with the best. `tfrepro.plot_tuning(result)` draws it.

    Attributes:
        metric: The score's name, e.g. `"val_accuracy"`.
        goal: `"max"` when higher scores are better, `"min"` when lower are.
        confidence: The confidence level of the intervals, the eliminations and the claims.
        candidates: One `Candidate` per configuration, in the order given.
        seeds: The seeds in the order each configuration runs them.
        budget: The fits the race could spend (known scores not counted); in a
            `RacingSearch`'s result, the whole search's budget, its search phase included.
        spent: The fits it spent (in a `RacingSearch`'s result, the search phase's too).
        stopped: Why the race ended: `"decided"` (one configuration left), `"budget"`,
            `"max_seeds"` (every configuration in doubt had all its seeds) or `"no candidates"`.
    """

    metric: str
    goal: str
    confidence: float
    candidates: list[Candidate]
    seeds: list[int]
    budget: int
    spent: int
    stopped: str

    @property
    def best(self) -> Candidate | None:
        """The candidate that won: the best mean among the measured ones (two or more seeds, none
        failed), so no claim puts another ahead of it; None when none was measured."""
        return next((c for c in self.candidates if c.status == "best"), None)

    @property
    def tied(self) -> list[Candidate]:
        """The candidates not distinguishable from the best beyond seed noise, best first."""
        return _by_mean([c for c in self.candidates if c.status == "tied"], self.goal)

    @property
    def ranking(self) -> list[Candidate]:
        """Every candidate: the measured ones by mean, best first; then the unmeasured; then the
        failed."""
        measured = _measured(self.candidates)
        return (_by_mean(measured, self.goal) + [c for c in self.candidates if c.status == "unmeasured"]
                + [c for c in self.candidates if c.status == "failed"])

    @property
    def claims(self) -> list[Claim]:
        """Every "A is better than B beyond seed noise" the scores support (Holm over all pairs)."""
        return _claims(_by_mean(_measured(self.candidates), self.goal), self.goal, self.confidence)

    def candidate(self, name: str) -> Candidate:
        """Looks a candidate up by name.

        Args:
            name: Its name, e.g. `"c3"`.

        Returns:
            The `Candidate`.

        Raises:
            KeyError: No candidate has that name.
        """
        for candidate in self.candidates:
            if candidate.name == name:
                return candidate
        raise KeyError(f"no candidate named {name!r}; the candidates are {[c.name for c in self.candidates]}")

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-serialisable data, as `save` writes it.

        Returns:
            A dict of the attributes, each candidate's scores as `[seed, score]` pairs in run
            order, and the claims. Configurations must be JSON-serialisable (dicts of numbers and
            strings are).
        """
        return {
            "metric": self.metric, "goal": self.goal, "confidence": self.confidence, "seeds": self.seeds,
            "budget": self.budget, "spent": self.spent, "stopped": self.stopped,
            "candidates": [{"name": c.name, "config": c.config, "scores": [[s, v] for s, v in c.scores.items()],
                            "fingerprints": c.fingerprints, "status": c.status,
                            "eliminated_after": c.eliminated_after, "detail": c.detail} for c in self.candidates],
            "claims": [vars(claim) for claim in self.claims],
        }

    def save(self, folder: str | os.PathLike) -> Path:
        """Writes the result to `tuning.json` in a folder, atomically.

        Args:
            folder: The folder; made, with its parents, if missing.

        Returns:
            The path written.
        """
        path = Path(folder) / "tuning.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(self.to_dict(), indent=1, allow_nan=False))
        return path

    def __str__(self) -> str:
        direction = "higher" if self.goal == "max" else "lower"
        claims = self.claims
        against_best = {c.worse: c for c in claims if self.best is not None and c.better == self.best.name}
        lines = [f"{self.metric} ({direction} is better) over {len(self.candidates)} configurations: "
                 f"{self.spent} of {self.budget} fits spent, stopped: {self.stopped}; "
                 f"{self.confidence:.0%} intervals",
                 f"{'':2}{'name':<6}{'seeds':>5}  {'mean':>10}  {'interval':<23} {'standing':<30} config"]
        for c in self.ranking:
            interval = c.interval(self.confidence)
            span = f"[{interval[0]:.5g}, {interval[1]:.5g}]" if interval else "n/a"
            standing = {"best": "best", "tied": "tied with the best", "unmeasured": "unmeasured (< 2 seeds)",
                        "eliminated": f"eliminated after {c.eliminated_after} seeds",
                        "failed": f"failed: {c.detail}"[:60]}.get(c.status, "")
            if c.status == "worse" and c.name in against_best:
                claim = against_best[c.name]
                standing = f"worse by {abs(claim.difference):.3g} (Holm p={claim.p_holm:.2g})"
            mean = f"{c.mean:.6g}" if c.scores else "-"
            lines.append(f"{'*' if c.status == 'best' else '':2}{c.name:<6}{len(c.scores):>5}  {mean:>10}  "
                         f"{span:<23} {standing:<30} {c.config}")
        lines.append("better beyond seed noise: " + ("; ".join(map(str, claims)) if claims else "no pair"))
        if self.best is not None:
            tied = ", ".join(c.name for c in self.tied) or "none"
            lines.append(f"not distinguishable from the best ({self.best.name}): {tied}")
        return "\n".join(lines)


def _by_mean(candidates: list[Candidate], goal: str) -> list[Candidate]:
    sign = -1 if goal == "max" else 1
    return sorted(candidates, key=lambda c: (sign * c.mean, int(c.name[1:])))


def _measured(candidates: Sequence[Candidate]) -> list[Candidate]:
    return [c for c in candidates if c.status != "failed" and len(c.scores) >= MIN_SEEDS]


def _better(goal: str, a: float, b: float) -> bool:
    return a > b if goal == "max" else a < b


def _claims(ranked: list[Candidate], goal: str, confidence: float) -> list[Claim]:
    """Welch t-tests over every pair (best first), Holm-adjusted; the pairs whose adjusted p-value
    is below 1 - confidence, as claims."""
    tests = []
    for i, better in enumerate(ranked):
        for worse in ranked[i + 1:]:
            comparison = compare_sweeps(worse.values, better.values, confidence=confidence)
            if comparison.p_value is not None and comparison.difference != 0:
                tests.append((comparison.p_value, better, worse, comparison))
    tests.sort(key=lambda test: test[0])
    claims, running = [], 0.0
    for rank, (p_value, better, worse, comparison) in enumerate(tests):
        running = max(running, min(1.0, (len(tests) - rank) * p_value))
        if running >= 1 - confidence:
            break  # Holm's step-down: no later (larger) p-value is rejected either
        claims.append(Claim(better.name, worse.name, comparison.difference, comparison.ci_low,
                            comparison.ci_high, p_value, running))
    return claims


def check_race_arguments(budget: int, min_seeds: int, max_seeds: int, seeds: list[int], goal: str, confidence: float) -> None:
    if not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget is a number of fits, an int >= 0; got {budget!r}")
    if min_seeds < MIN_SEEDS:
        raise ValueError(f"min_seeds must be at least {MIN_SEEDS} (one seed has no spread to judge by); got {min_seeds}")
    if max_seeds < min_seeds:
        raise ValueError(f"max_seeds ({max_seeds}) is below min_seeds ({min_seeds})")
    if len(seeds) < max_seeds:
        raise ValueError(f"{len(seeds)} seeds given for max_seeds={max_seeds}: give at least max_seeds seeds")
    if len(set(seeds)) != len(seeds):
        raise ValueError("the seeds must be distinct")
    if goal not in ("min", "max"):
        raise ValueError(f"goal must be 'min' or 'max'; got {goal!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1 (0.95 for 95%); got {confidence!r}")


def race(score: Callable[[Any, int], Score], configs: Sequence[Any], *, budget: int, goal: str = "max",
         seeds: Sequence[int] | None = None, min_seeds: int = 3, max_seeds: int = 10, confidence: float = 0.95,
         metric: str = "score", known: Mapping[int, Mapping[int, float]] | None = None,
         on_run: Callable[[Candidate, int], None] | None = None) -> TuningResult:
    """Races configurations over seeds within a budget of fits, and says which differ beyond noise.

    Each configuration first gets `min_seeds` seeds (round robin, so a short budget spreads
    evenly); after that the configurations still in the race get further seeds in turn, and one
    worse than the leader beyond seed noise gets no more (see the module docstring for the rule).
    Every configuration runs the same seeds in the same order. The race is deterministic: the
    same scores give the same decisions.

    The rule: a configuration is reported `"worse"` only when a Welch t-test, Holm-adjusted over
    every pair, puts the best ahead of it at `confidence`; the winner is the best mean among the
    measured configurations. That is a rule, not a guarantee of its nominal error rate: the tests
    assume each configuration's scores are independent draws over seeds (true of deterministic
    training on distinct seeds) and are approximate for skewed scores at few seeds, and the race
    looks at the data after every fit, which raises the chance of a false claim above the nominal
    level, the more so the more fits it looks at (on equal configurations, 4.7% of races at 24
    fits and 8.0% at 80 claimed a difference, against 5%; `bench/tuning_search.py` measures that
    and the claims on real configurations).

    Args:
        score: A function of (configuration, seed) that trains and returns the score, or the score
            and a fingerprint of the trained weights. Called once per fit; an exception or a
            non-finite score fails the configuration (recorded, and the race goes on).
        configs: The configurations, at least one; any objects `score` takes (dicts of
            hyperparameters, typically). Candidates are named `c0`, `c1`, ... in this order.
        budget: The number of fits the race may spend (`known` scores are free).
        goal: `"max"` (the default: accuracy) or `"min"` (loss).
        seeds: The seeds, in the order each configuration runs them; default `range(max_seeds)`.
        min_seeds: Seeds every configuration gets before any is judged, at least 2; default 3
            (at 2, a configuration's spread is one difference, and false claims are more frequent:
            `tests/tuning/test_racing.py`).
        max_seeds: The most seeds a configuration gets; default 10.
        confidence: The confidence level, strictly between 0 and 1; default 0.95.
        metric: The score's name, for the result; default `"score"`.
        known: Scores already measured, `{config index: {seed: score}}` (a search's first
            executions); they count as that configuration's seeds.
        on_run: Called with the candidate and the seed after each fit (e.g. for progress).

    Returns:
        A `TuningResult`.

    Raises:
        ValueError: No configuration, or an argument out of range (a negative budget, `min_seeds`
            below 2, `max_seeds` below `min_seeds` or above the seeds given, repeated seeds, a
            `goal` other than "min"/"max", a confidence outside (0, 1)), or a `known` index out of
            range.

    Examples:
        >>> import numpy as np
        >>> means = {"a": 0.90, "b": 0.95, "c": 0.951}
        >>> noise = lambda config, seed: np.random.default_rng([seed, ord(config)]).normal(0, 0.005)
        >>> result = race(lambda config, seed: means[config] + noise(config, seed), ["a", "b", "c"],
        ...               budget=24, metric="accuracy")
        >>> result.candidate("c0").status, sorted(c.config for c in [result.best, *result.tied])
        ('worse', ['b', 'c'])
    """
    seeds = list(range(max_seeds)) if seeds is None else [int(s) for s in seeds]
    check_race_arguments(budget, min_seeds, max_seeds, seeds, goal, confidence)
    if not configs:
        raise ValueError("race needs at least one configuration")
    candidates = [Candidate(f"c{i}", config) for i, config in enumerate(configs)]
    for index, scores in (known or {}).items():
        if not 0 <= index < len(candidates):
            raise ValueError(f"known scores for configuration {index}, but there are {len(candidates)}")
        candidates[index].scores.update({int(s): float(v) for s, v in scores.items() if math.isfinite(float(v))})
        for seed, value in scores.items():
            if not math.isfinite(float(value)):
                _fail(candidates[index], f"seed {seed}: {metric} is {value}")
    spent = 0

    def run(candidate: Candidate) -> None:
        nonlocal spent
        seed = next(s for s in seeds if s not in candidate.scores)
        spent += 1
        try:
            outcome = score(candidate.config, seed)
            value, fingerprint = outcome if isinstance(outcome, tuple) else (outcome, None)
            value = float(value)
        except Exception as exc:  # a failed configuration is a result too; the race goes on
            _fail(candidate, f"seed {seed}: {type(exc).__name__}: {exc}")
            return
        if not math.isfinite(value):
            _fail(candidate, f"seed {seed}: {metric} is {value}")
            return
        candidate.scores[seed] = value
        if fingerprint is not None:
            candidate.fingerprints[seed] = fingerprint
        logger.info("%s seed %d: %s = %r", candidate.name, seed, metric, value)
        if on_run is not None:
            on_run(candidate, seed)

    def racing() -> list[Candidate]:
        return [c for c in candidates if c.status == "racing"]

    for round_ in range(1, min_seeds + 1):  # everyone to min_seeds, evenly
        for candidate in racing():
            if len(candidate.scores) < round_ and spent < budget:
                run(candidate)
    stopped = "budget"
    while True:
        judged = [c for c in candidates if c.status in ("racing", _DROPPED) and len(c.scores) >= min_seeds]
        if not judged:
            stopped = "budget" if racing() else "no candidates"
            break
        leader = _leader(judged, goal)
        level = 1 - (1 - confidence) / max(len(judged) - 1, 1)  # Bonferroni over this look's comparisons
        for other in judged:
            behind = other is not leader and _worse_beyond_noise(other, leader, goal, level)
            if behind and other.status == "racing":
                other.status, other.eliminated_after = _DROPPED, len(other.scores)
            elif not behind and other.status == _DROPPED:  # the leader sank back to it: it races again
                other.status, other.eliminated_after = "racing", None
        alive = [c for c in judged if c.status == "racing"]
        if len(alive) == 1 and len(racing()) == 1:
            stopped = "decided"
            break
        if spent >= budget:
            break
        growable = [c for c in alive if len(c.scores) < max_seeds]
        if not growable:
            stopped = "max_seeds"
            break
        run(min(growable, key=lambda c: len(c.scores)))  # in turn: the fewest seeds, then the order given
    return _finish(candidates, metric, goal, confidence, seeds, budget, spent, stopped)


_DROPPED = "dropped"  # while racing: behind the leader beyond noise, given no seeds until the leader sinks to it


def _fail(candidate: Candidate, why: str) -> None:
    """A configuration that fails on any seed is out of the race: failing is part of its score."""
    if candidate.status == "failed":
        return
    earlier = f"; its {len(candidate.scores)} earlier seeds averaged {candidate.mean:.6g}" if candidate.scores else ""
    candidate.status, candidate.detail = "failed", why + earlier
    logger.warning("configuration %s failed: %s", candidate.name, candidate.detail)


def _leader(alive: list[Candidate], goal: str) -> Candidate:
    sign = -1 if goal == "max" else 1
    return min(alive, key=lambda c: (sign * c.mean, -len(c.scores), c.name))


def _worse_beyond_noise(other: Candidate, leader: Candidate, goal: str, level: float) -> bool:
    comparison = compare_sweeps(other.values, leader.values, confidence=level)
    return bool(comparison.distinguishable) and comparison.p_value is not None and _better(goal, leader.mean, other.mean)


def _finish(candidates: list[Candidate], metric: str, goal: str, confidence: float, seeds: list[int],
            budget: int, spent: int, stopped: str) -> TuningResult:
    """Settle each candidate's standing: the best mean among those measured (so no claim can put
    another ahead of it), and every other measured one worse (a claim against the best),
    eliminated (dropped by the race, not claimed) or tied."""
    result = TuningResult(metric, goal, confidence, candidates, seeds, budget, spent, stopped)
    for c in candidates:
        if c.status != "failed" and len(c.scores) < MIN_SEEDS:
            c.status, c.eliminated_after = "unmeasured", None
    measured = _measured(candidates)
    if not measured:
        return result
    best = _leader(measured, goal)
    best.status, best.eliminated_after = "best", None
    beaten = {claim.worse for claim in result.claims if claim.better == best.name}
    for c in measured:
        if c is not best:
            c.status = "worse" if c.name in beaten else "eliminated" if c.status == _DROPPED else "tied"
    return result
