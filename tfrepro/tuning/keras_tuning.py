"""``RacingSearch``: any KerasTuner tuner, with reproducible trials and a ranking that sees through
seed noise.

KerasTuner ranks trials by one fit, or by the mean of ``executions_per_trial`` fits, with no
interval: a ranking inside the seed noise picks its winner by luck. ``RacingSearch`` runs the
tuner's own search (its oracle proposes, as usual) with every execution under
``tfrepro.patched(seed)`` on recorded seeds, then races the configurations it found with
``tfrepro.tuning.race``: more seeds where the ranking is in doubt, none where it is not, within a
budget of fits.

KerasTuner is the ``tuner`` extra (``pip install 'tfrepro[tuner]'``); it is imported when a
``RacingSearch`` is made, never at ``import tfrepro``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from tfrepro import _tf
from tfrepro.determinism.patching import patched
from tfrepro.errors import DivergenceError, ReproducibilityWarning
from tfrepro.proof.fingerprints import combine, fingerprint
from tfrepro.tuning.racing import Candidate, TuningResult, check_race_arguments, race

logger = logging.getLogger(__name__)

# What RacingSearch runs inside KerasTuner: the one execution of a trial (it seeds around it), the
# build a fresh fit starts from (clear_session, the build, the tuner's compile overrides), and the
# copy of the callbacks each fit gets; all private to keras_tuner.Tuner, with
# keras_tuner.src.engine.tuner_utils.convert_to_metrics_dict (how an execution is scored). A
# release without them is refused by name, not run.
TUNER_TARGETS = ("_build_and_fit_model", "_try_build", "_deepcopy_callbacks")
TESTED_KERAS_TUNER = "1.4"
# The hyperparameters Hyperband adds to a trial: which earlier trial it continues, and from which
# epoch. A configuration is the rest; "tuner/epochs" stays in it (it says how long it trains).
_CONTINUATION = ("tuner/trial_id", "tuner/initial_epoch", "tuner/bracket", "tuner/round")
_MISSING = object()


def _keras_tuner() -> Any:
    try:
        import keras_tuner
    except ImportError as exc:
        raise ImportError("tfrepro.tuning.RacingSearch runs KerasTuner: pip install 'tfrepro[tuner]'") from exc
    tuned, user = _tuned_keras(), _tf.keras_info().module
    if tuned != user:
        raise ImportError(f"KerasTuner {keras_tuner.__version__} builds and fits {tuned} models (it imports `keras`), but "
                          f"tf.keras is {user} here (TF_USE_LEGACY_KERAS=1), whose models it rejects: race tf-keras "
                          "models with tfrepro.tuning.race and a score function of your own (the tuning guide shows one)")
    missing = [f"Tuner.{name}" for name in TUNER_TARGETS if not callable(getattr(keras_tuner.Tuner, name, None))]
    try:
        from keras_tuner.src.engine.tuner_utils import convert_to_metrics_dict  # noqa: F401
    except ImportError:
        missing.append("src.engine.tuner_utils.convert_to_metrics_dict")
    if missing:
        raise ImportError(f"keras-tuner {keras_tuner.__version__} has no {missing[0]}, which RacingSearch runs "
                          f"each fit through (tested on keras-tuner {TESTED_KERAS_TUNER}); install "
                          f"keras-tuner~={TESTED_KERAS_TUNER}.0")
    return keras_tuner


def _tuned_keras() -> str:
    """The Keras whose models KerasTuner takes: `keras` when that is Keras 3, else `tf.keras` (as
    `keras_tuner.src.backend.config` decides)."""
    import keras

    return "keras" if str(getattr(keras, "version", lambda: "")()).startswith("3.") else _tf.keras_info().module


def _config(values: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in values.items() if name not in _CONTINUATION}


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=repr)


def weights_fingerprint(model: Any) -> str:
    """One fingerprint of a model's weights, in model order.

    Args:
        model: A Keras model (either Keras).

    Returns:
        `tfrepro.fingerprint` of each weight, combined in order into 32 hex digits.
    """
    return combine([fingerprint(weight) for weight in model.weights])


class RacingSearch:
    """Runs a KerasTuner tuner with reproducible trials, then races its configurations over seeds.

    Two phases, one budget of fits:

    1. **Search.** The tuner searches as it would alone (its oracle proposes: random, Bayesian,
       Hyperband, grid), except that each trial runs `seeds_per_trial` executions, the k-th under
       `tfrepro.patched(seeds[k])`. The oracle sees the mean, as with `executions_per_trial`.
    2. **Race.** Each distinct configuration it tried is raced by `tfrepro.tuning.race` with the
       rest of the budget: every configuration gets `min_seeds` seeds, then those still in the race
       get further seeds in turn, and one worse than the leader beyond seed noise is dropped, until
       one is left, the budget is spent, or they have `max_seeds` seeds.

    Every fit is a function of its configuration and seed: `rerun` trains any of them again and
    checks the weights' fingerprint bit for bit. A race fit trains from scratch. For Hyperband, the
    race takes the configurations that reached the final rung (the most epochs), each trained from
    scratch for those epochs: the lower rungs are partial trainings, and the search's continued
    trials (warm-started from an earlier rung) are not the fit a seed reruns, so are not reused.

    `tuner.get_best_models()` and its kin still report the search phase only: use the result.

    Args:
        tuner: A KerasTuner tuner (`keras_tuner.RandomSearch`, `BayesianOptimization`,
            `Hyperband`, `GridSearch` or another `keras_tuner.Tuner`), made with
            `executions_per_trial=1` (the default) or `seeds_per_trial`.
        budget: The fits the whole search may spend, search phase included (e.g.
            `max_trials * seeds_per_trial` plus the fits to race). A tuner without `max_trials`
            (Hyperband, a grid) searches until the budget is spent, and the race gets what is left.
        seeds_per_trial: Executions per trial in the search phase; default 2.
        min_seeds: Seeds every configuration gets (the search's count) before the race judges
            any; at least 2, default 3 (see `tfrepro.tuning.race`).
        max_seeds: The most seeds any configuration gets; default 10.
        seeds: The seeds, in the order every configuration runs them; default `range(max_seeds)`.
        confidence: The confidence level of the intervals, eliminations and claims; default 0.95.
        **patch_options: Passed on to `tfrepro.patched`: `threads`, `onednn`, `ops`, `init`.

    Raises:
        ImportError: KerasTuner is missing (`pip install 'tfrepro[tuner]'`), or lacks a
            `Tuner` method this class runs (named).
        TypeError: `tuner` is not a `keras_tuner.Tuner`, its class trains in a `run_trial` of its
            own (which no seed can reach fit by fit), or `patch_options` names an option
            `tfrepro.patched` does not take.
        ValueError: An argument is out of range (as `tfrepro.tuning.race` checks them, here
            before any fit), the tuner's `executions_per_trial` is neither 1 nor
            `seeds_per_trial`, or the budget is smaller than the search phase
            (`max_trials * seeds_per_trial`).

    Examples:
        A sketch (the docs' tuning guide runs it in full):

        ```python
        import keras_tuner as kt
        tuner = kt.RandomSearch(build_model, objective="val_accuracy", max_trials=6,
                                directory="tuning", project_name="cnn")
        search = tfrepro.tuning.RacingSearch(tuner, budget=30)
        result = search.search(x, y, epochs=5, validation_data=(x_val, y_val))
        print(result)                       # the table, the claims, the ties
        model = search.rerun(result.best.name, seed=0)   # the same bits as in the search
        ```
    """

    def __init__(self, tuner: Any, *, budget: int, seeds_per_trial: int = 2, min_seeds: int = 3,
                 max_seeds: int = 10, seeds: Sequence[int] | None = None, confidence: float = 0.95,
                 **patch_options: Any):
        kt = _keras_tuner()
        if not isinstance(tuner, kt.Tuner):
            raise TypeError(f"RacingSearch takes a KerasTuner tuner (keras_tuner.RandomSearch, BayesianOptimization, "
                            f"Hyperband, GridSearch or a keras_tuner.Tuner); got {type(tuner).__name__}")
        inspect.signature(patched).bind(0, **patch_options)
        own = next((cls for cls in type(tuner).__mro__ if "run_trial" in vars(cls)), kt.Tuner)
        if own not in (kt.Tuner, kt.Hyperband):  # its trials may train without _build_and_fit_model
            raise TypeError(f"{type(tuner).__name__} trains in a run_trial of its own ({own.__name__}.run_trial), "
                            "which RacingSearch cannot seed fit by fit: race it with tfrepro.tuning.race and a "
                            "score function, or build the tuner on keras_tuner.Tuner's run_trial")
        seeds = list(range(max_seeds)) if seeds is None else [int(seed) for seed in seeds]
        check_race_arguments(budget, min_seeds, max_seeds, seeds, "max", confidence)  # before any fit, not after the search
        if not isinstance(seeds_per_trial, int) or seeds_per_trial < 1:
            raise ValueError(f"seeds_per_trial must be an int >= 1; got {seeds_per_trial!r}")
        if seeds_per_trial > max_seeds:
            raise ValueError(f"seeds_per_trial ({seeds_per_trial}) is above max_seeds ({max_seeds})")
        if tuner.executions_per_trial not in (1, seeds_per_trial):
            raise ValueError(f"the tuner runs executions_per_trial={tuner.executions_per_trial}: make it with 1 and give "
                             "RacingSearch seeds_per_trial instead (each execution then has a seed of its own)")
        max_trials = getattr(tuner.oracle, "max_trials", None)
        if max_trials is not None and budget < max_trials * seeds_per_trial:
            raise ValueError(f"budget={budget} is below the search phase's {max_trials} trials x {seeds_per_trial} "
                             "seeds: raise the budget or lower max_trials or seeds_per_trial")
        self.tuner = tuner
        self.budget = budget
        self.seeds_per_trial = seeds_per_trial
        self.min_seeds = min_seeds
        self.max_seeds = max_seeds
        self.seeds = seeds
        self.confidence = confidence
        self.patch_options = patch_options
        self.result: TuningResult | None = None
        self._objective = tuner.oracle.objective
        self._fit_args: tuple[Any, ...] = ()
        self._fit_kwargs: dict[str, Any] = {}
        self._warned = False
        self._templates: dict[str, Any] = {}  # a configuration's key -> HyperParameters to build it from

    @contextlib.contextmanager
    def _patched(self, seed: int) -> Iterator[None]:
        """`tfrepro.patched(seed)`, its warnings shown for the first fit only (they hold for every
        fit, as in `tfrepro.sweep`), and never the late-patch one: every fit builds its model under
        the patch; what was built before is KerasTuner's (its search-space probe) or earlier fits'."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "tfrepro.patch\\(\\) was called late", ReproducibilityWarning)
            if self._warned:
                warnings.simplefilter("ignore", ReproducibilityWarning)
            self._warned = True
            with patched(seed, **self.patch_options):
                yield

    @property
    def goal(self) -> str:
        """`"max"` or `"min"`: the direction of the tuner's objective."""
        return "max" if self._objective.direction == "max" else "min"

    def search(self, *fit_args: Any, **fit_kwargs: Any) -> TuningResult:
        """Runs the tuner's search with seeded executions, then races the configurations it tried.

        Args:
            *fit_args: Passed on to `tuner.search` and every fit (e.g. `x, y`).
            **fit_kwargs: The same (e.g. `epochs=5, validation_data=(x_val, y_val)`).

        Returns:
            The race's `TuningResult`, its metric named after the tuner's objective; also kept as
            `self.result`. Each candidate's config is its hyperparameter values.

        Raises:
            RuntimeError: The tuner completed no trial (its project folder holds a finished search,
                or every trial failed).
        """
        self._fit_args, self._fit_kwargs = fit_args, dict(fit_kwargs)
        explored = self._search_phase(fit_args, fit_kwargs)
        spent = sum(len(runs) for runs in explored.values())
        configs, known, fingerprints = self._candidates(explored)
        if not configs:
            raise RuntimeError(f"the tuner completed no trial in this search ({len(explored)} started): its project "
                               "folder may hold a finished search (make the tuner with overwrite=True or a new "
                               "project_name), or every trial failed (KerasTuner logs why)")
        result = race(self._fit_score, configs, budget=max(self.budget - spent, 0), goal=self.goal,
                      seeds=self.seeds, min_seeds=self.min_seeds, max_seeds=self.max_seeds, confidence=self.confidence,
                      metric=self._objective.name, known=known)
        for candidate, prints in zip(result.candidates, fingerprints):
            candidate.fingerprints = {**prints, **candidate.fingerprints}
        result.budget, result.spent = self.budget, result.spent + spent
        self.result = result
        return result

    def _search_phase(self, fit_args: tuple[Any, ...], fit_kwargs: dict[str, Any]) -> dict[str, list[tuple]]:
        """The tuner's own search, each execution seeded, stopped when the budget is spent; returns
        trial id -> [(seed, score, fingerprint)] of its executions."""
        kt = _keras_tuner()
        tuner, hypermodel = self.tuner, self.tuner.hypermodel
        explored: dict[str, list[tuple]] = {}
        build_and_fit, fit, trial_begins = tuner._build_and_fit_model, hypermodel.fit, tuner.on_trial_begin
        trained: list[Any] = []

        class BudgetSpent(kt.errors.FatalError):
            """Raised before a fit the budget has no room for: it ends KerasTuner's search."""

        def seeded_build_and_fit(trial: Any, *args: Any, **kwargs: Any) -> Any:
            if sum(len(runs) for runs in explored.values()) >= self.budget:
                raise BudgetSpent(f"the budget of {self.budget} fits is spent")
            runs = explored.setdefault(trial.trial_id, [])
            seed = self.seeds[len(runs)]
            with self._patched(seed):
                results = build_and_fit(trial, *args, **kwargs)
            runs.append((seed, self._score(results), weights_fingerprint(trained.pop())))
            return results

        def capturing_fit(hp: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
            trained.append(model)
            return fit(hp, model, *args, **kwargs)

        def trial_begins_afresh(trial: Any) -> None:  # a retried trial starts again from its first seed
            explored[trial.trial_id] = []
            trial_begins(trial)

        executions = tuner.executions_per_trial
        patches = {(tuner, "_build_and_fit_model"): seeded_build_and_fit, (hypermodel, "fit"): capturing_fit,
                   (tuner, "on_trial_begin"): trial_begins_afresh}
        saved = {(owner, name): vars(owner).get(name, _MISSING) for owner, name in patches}
        for (owner, name), value in patches.items():
            setattr(owner, name, value)
        tuner.executions_per_trial = self.seeds_per_trial
        try:
            tuner.search(*fit_args, **fit_kwargs)
        except BudgetSpent:
            logger.warning("the search phase spent the whole budget of %d fits: KerasTuner's search was stopped "
                           "there, and the race has no fit left", self.budget)
        finally:
            for (owner, name), value in saved.items():  # the tuner as it was given
                if value is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, value)
            tuner.executions_per_trial = executions
        return explored

    def _candidates(self, explored: dict[str, list[tuple]]) -> tuple[list[dict], dict, list[dict]]:
        """The distinct configurations the search completed, best search score first; the scores
        and fingerprints of their from-scratch executions, to reuse."""
        groups: dict[str, dict[str, Any]] = {}
        for trial_id, runs in explored.items():
            trial = self.tuner.oracle.trials.get(trial_id)
            if trial is None or trial.status != "COMPLETED":
                continue
            values = trial.hyperparameters.values
            config = _config(values)
            group = groups.setdefault(_key(config), {"config": config, "runs": {}})
            self._templates.setdefault(_key(config), trial.hyperparameters)
            if "tuner/trial_id" not in values:  # trained from scratch: the same fit a race runs
                group["runs"].update({seed: (score, print_) for seed, score, print_ in runs})
        final = max((g["config"].get("tuner/epochs", 0) for g in groups.values()), default=0)
        if final:  # Hyperband: its lower rungs are partial trainings; the race compares full ones
            groups = {key: g for key, g in groups.items() if g["config"].get("tuner/epochs") == final}
        sign = -1 if self.goal == "max" else 1
        ordered = sorted(groups.values(), key=lambda g: (not g["runs"], sign * _mean([s for s, _ in g["runs"].values()])))
        configs = [group["config"] for group in ordered]
        known = {i: {seed: score for seed, (score, _) in g["runs"].items()} for i, g in enumerate(ordered)}
        prints = [{seed: print_ for seed, (_, print_) in g["runs"].items()} for g in ordered]
        return configs, known, prints

    def _score(self, results: Any) -> float:
        """What KerasTuner reports for one execution: the objective's value in the best epoch of a
        History, or in the dict or number that `HyperModel.fit` returned."""
        from keras_tuner.src.engine import tuner_utils

        metrics = tuner_utils.convert_to_metrics_dict(results, self._objective)
        try:
            return float(self._objective.get_value(metrics))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"the fit recorded no {self._objective.name!r} (it has {sorted(metrics or {})}): "
                             "does fit get validation data?") from exc

    def _fit(self, config: dict[str, Any], seed: int) -> tuple[Any, Any]:
        """Trains one configuration from scratch under `patched(seed)`, as a search execution does."""
        key = _key(config)
        if key not in self._templates:
            raise KeyError(f"no configuration {config} in this search")
        hp = self._templates[key].copy()
        for name in _CONTINUATION:
            hp.values.pop(name, None)
        kwargs = dict(self._fit_kwargs)
        kwargs["callbacks"] = self.tuner._deepcopy_callbacks(kwargs.get("callbacks", []))
        if "tuner/epochs" in hp.values:  # Hyperband: the configuration's epochs, from scratch
            kwargs["epochs"], kwargs["initial_epoch"] = hp.values["tuner/epochs"], 0
        with self._patched(seed):
            model = self.tuner._try_build(hp)
            history = self.tuner.hypermodel.fit(hp, model, *self._fit_args, **kwargs)
        return model, history

    def _fit_score(self, config: dict[str, Any], seed: int) -> tuple[float, str]:
        model, history = self._fit(config, seed)
        return self._score(history), weights_fingerprint(model)

    def rerun(self, candidate: str | Candidate, seed: int | None = None) -> Any:
        """Trains one configuration on one seed again, and checks it matches the search bit for bit.

        Args:
            candidate: The candidate or its name (e.g. `result.best`, or `"c3"`).
            seed: One of the seeds it ran in the search; default its first.

        Returns:
            The trained Keras model, its weights bitwise equal to that fit's in the search.

        Raises:
            RuntimeError: `search` has not run yet.
            KeyError: No candidate has that name.
            ValueError: The candidate never ran `seed`.
            tfrepro.DivergenceError: The weights' fingerprint differs from the one recorded in the
                search: this environment does not reproduce it (the message names both).
        """
        if self.result is None:
            raise RuntimeError("rerun needs a finished search: call search() first")
        if not isinstance(candidate, Candidate):
            candidate = self.result.candidate(candidate)
        seed = next(iter(candidate.fingerprints), None) if seed is None else seed
        if seed not in candidate.fingerprints:
            raise ValueError(f"{candidate.name} ran seeds {sorted(candidate.fingerprints)}; got seed {seed}")
        model, _ = self._fit(candidate.config, seed)
        again = weights_fingerprint(model)
        if again != candidate.fingerprints[seed]:
            raise DivergenceError(f"{candidate.name}'s seed {seed}: its weights' fingerprint is {again}, the search's "
                                  f"{candidate.fingerprints[seed]} (compare the environments: tfrepro.environment_diff)")
        return model


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
