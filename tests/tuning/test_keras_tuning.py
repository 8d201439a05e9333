"""``RacingSearch`` over real KerasTuner tuners and real Keras training on scikit-learn's digits:
every fit's seed is recorded and reruns to the same bits (checked, and the check can fail), the
race reuses the search's fits, and what cannot work is refused by name. tf-keras models are raced
with ``race`` and a score function of the user's (KerasTuner builds Keras 3 models only)."""

from __future__ import annotations

import numpy as np
import pytest

import tfrepro
from tfrepro.determinism.patching import patched
from tfrepro.tuning import race
from tfrepro.tuning.keras_tuning import weights_fingerprint

LEGACY = "KerasTuner builds Keras 3 models (`import keras`); with tf-keras the refusal test runs instead"


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    data = load_digits()
    x, y = (data.data / 16.0).astype("float32"), data.target
    return x[:400], y[:400], x[1400:1600], y[1400:1600]


def build_model(keras):
    def build(hp):
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(hp.Choice("units", [4, 32]), activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10, activation="softmax"),
        ])
        model.compile(keras.optimizers.Adam(hp.Choice("learning_rate", [1e-3, 1e-2])),
                      "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return build


def legacy(keras) -> bool:
    return keras.__name__.startswith("tf_keras")


def test_random_search_records_every_seed_and_the_best_reruns_to_the_same_bits(keras, digits, tmp_path):
    if legacy(keras):
        pytest.skip(LEGACY)
    import keras_tuner as kt

    x, y, x_val, y_val = digits
    tuner = kt.RandomSearch(build_model(keras), objective="val_accuracy", max_trials=2, seed=3,
                            directory=tmp_path, project_name="t")
    search = tfrepro.tuning.RacingSearch(tuner, budget=5)
    result = search.search(x, y, epochs=1, batch_size=64, validation_data=(x_val, y_val), verbose=0)
    assert result.spent == 5 and result.metric == "val_accuracy" and result.goal == "max"
    assert sum(len(c.scores) for c in result.candidates) == 5
    for candidate in result.candidates:  # seeds in order; a fingerprint per fit; search's scores reused
        assert list(candidate.scores) == list(range(len(candidate.scores)))
        assert set(candidate.fingerprints) == set(candidate.scores)
    race_fit = next(c for c in result.candidates if len(c.scores) == 3)  # its third seed ran in the race
    assert weights_fingerprint(search.rerun(race_fit, seed=2)) == race_fit.fingerprints[2]
    search.rerun(result.best.name, seed=1)  # a search-phase execution: KerasTuner's own path
    race_fit.fingerprints[0] = "0" * 32  # the check can fail: a record that the weights do not match
    with pytest.raises(tfrepro.DivergenceError, match="seed 0: its weights' fingerprint is"):
        search.rerun(race_fit, seed=0)
    assert search.tuner.executions_per_trial == 1  # the tuner is left as it was given
    assert "_build_and_fit_model" not in vars(search.tuner)


@pytest.mark.slow
def test_a_grid_without_max_trials_stops_at_the_budget_and_a_fit_may_return_a_dict(keras, digits, tmp_path):
    """GridSearch has no max_trials: the search stops where the budget does. Its hypermodel's fit
    returns a dict (KerasTuner takes one), scored as KerasTuner scores it."""
    if legacy(keras):
        pytest.skip(LEGACY)
    import keras_tuner as kt

    x, y, x_val, y_val = digits

    class DictFit(kt.HyperModel):
        def build(self, hp):
            return build_model(keras)(hp)

        def fit(self, hp, model, *args, **kwargs):
            history = model.fit(*args, **kwargs)
            return {"val_accuracy": max(history.history["val_accuracy"])}

    tuner = kt.GridSearch(DictFit(), objective=kt.Objective("val_accuracy", "max"), directory=tmp_path,
                          project_name="grid")
    search = tfrepro.tuning.RacingSearch(tuner, budget=5)
    result = search.search(x, y, epochs=1, batch_size=64, validation_data=(x_val, y_val), verbose=0)
    assert result.spent == 5 and len(result.candidates) == 2  # the third trial's one fit ran, uncompleted
    assert all(len(c.scores) == 2 for c in result.candidates) and result.best is not None
    search.rerun(result.best, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("tuner_name", ["Hyperband", "BayesianOptimization"])
def test_hyperband_and_bayesian_searches_race_and_rerun(keras, digits, tmp_path, tuner_name):
    if legacy(keras):
        pytest.skip(LEGACY)
    import keras_tuner as kt

    x, y, x_val, y_val = digits
    options = dict(max_epochs=2, factor=2, hyperband_iterations=1) if tuner_name == "Hyperband" else dict(max_trials=2)

    def searched(project: str) -> tuple[tfrepro.tuning.RacingSearch, tfrepro.tuning.TuningResult]:
        tuner = getattr(kt, tuner_name)(build_model(keras), objective="val_loss", seed=1, directory=tmp_path,
                                        project_name=project, **options)
        search = tfrepro.tuning.RacingSearch(tuner, budget=12 if tuner_name == "Hyperband" else 7, seeds_per_trial=1)
        return search, search.search(x, y, epochs=2, batch_size=64, validation_data=(x_val, y_val), verbose=0)

    search, result = searched("first")
    assert result.goal == "min" and result.best is not None
    if tuner_name == "Hyperband":  # only the final rung is raced, each from scratch for its epochs
        assert {c.config["tuner/epochs"] for c in result.candidates} == {2}
    else:  # the same search again (the oracle seeded): the same table, to the last bit
        assert searched("again")[1].to_dict() == result.to_dict()
    seed = list(result.best.scores)[-1]
    search.rerun(result.best, seed=seed)


def test_race_tunes_models_of_either_keras_with_a_score_function(keras, digits):
    """What a tf-keras user runs (and anyone without KerasTuner): `race` over their own fits."""
    x, y, x_val, y_val = digits

    def score(units, seed):
        with patched(seed):
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(units, activation="relu"),
                                      keras.layers.Dense(10, activation="softmax")])
            model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
            history = model.fit(x, y, epochs=1, batch_size=64, validation_data=(x_val, y_val), verbose=0)
        return max(history.history["val_accuracy"]), weights_fingerprint(model)

    result = race(score, [2, 16], budget=4)
    first = result.best.fingerprints[0]
    assert score(result.best.config, 0)[1] == first  # the same bits again
    assert np.isfinite(result.best.mean)


def test_what_cannot_work_is_refused_by_name(keras, tmp_path, monkeypatch):
    import keras_tuner as kt

    if legacy(keras):
        with pytest.raises(ImportError, match="tf.keras is tf_keras here.*tfrepro.tuning.race"):
            tfrepro.tuning.RacingSearch(object(), budget=4)
        return
    with pytest.raises(TypeError, match="takes a KerasTuner tuner"):
        tfrepro.tuning.RacingSearch(object(), budget=4)
    tuner = kt.RandomSearch(build_model(keras), objective="val_accuracy", max_trials=3, directory=tmp_path,
                            project_name="t", executions_per_trial=3)
    with pytest.raises(ValueError, match="executions_per_trial=3: make it with 1"):
        tfrepro.tuning.RacingSearch(tuner, budget=20)
    tuner.executions_per_trial = 1
    with pytest.raises(ValueError, match=r"budget=5 is below the search phase's 3 trials x 2 seeds"):
        tfrepro.tuning.RacingSearch(tuner, budget=5)
    with pytest.raises(TypeError):
        tfrepro.tuning.RacingSearch(tuner, budget=20, thread=1)  # a misspelt patch option
    with pytest.raises(ValueError, match="min_seeds must be at least 2"):  # before the search, not after it
        tfrepro.tuning.RacingSearch(tuner, budget=20, min_seeds=1)
    with pytest.raises(ValueError, match="confidence must lie strictly between 0 and 1"):
        tfrepro.tuning.RacingSearch(tuner, budget=20, confidence=95)

    class OwnLoop(kt.RandomSearch):
        def run_trial(self, trial, *args, **kwargs):
            return 0.5

    own = OwnLoop(build_model(keras), objective="val_accuracy", max_trials=1, directory=tmp_path, project_name="o")
    with pytest.raises(TypeError, match=r"trains in a run_trial of its own \(OwnLoop.run_trial\)"):
        tfrepro.tuning.RacingSearch(own, budget=4)
    with pytest.raises(RuntimeError, match="call search"):
        tfrepro.tuning.RacingSearch(tuner, budget=20).rerun("c0")
    monkeypatch.delattr(kt.Tuner, "_try_build")
    with pytest.raises(ImportError, match=r"has no Tuner._try_build.*keras-tuner~=1.4.0"):
        tfrepro.tuning.RacingSearch(tuner, budget=20)
