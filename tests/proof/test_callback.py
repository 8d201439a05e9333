"""ReproducibilityCallback, verify and assert_reproducible on real Keras (3, or 2 via tf-keras)."""

import json

import numpy as np
import pytest

import tfrepro
from tfrepro import _tf

from conftest import SCRIPTS, run_python
from nondeterminism import make_layers

pytestmark = pytest.mark.keras
tf = _tf.import_tf()
X = np.random.RandomState(0).rand(64, 6).astype("float32")
Y = X.sum(axis=1, keepdims=True)


@pytest.fixture
def callback_class(keras):
    from tfrepro.proof.callback import ReproducibilityCallback

    return ReproducibilityCallback


def small_model(keras, middle=None):
    layers = [keras.Input((6,)), keras.layers.Dense(8, activation="relu", name="first")]
    layers.append(middle if middle is not None else keras.layers.Dense(8, activation="relu", name="middle"))
    layers.append(keras.layers.Dense(1, name="last"))
    model = keras.Sequential(layers)
    # A learning rate at which a one-ulp gradient difference survives the update.
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    return model


def fit(model, callbacks, epochs=2):
    return model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks,
                     validation_data=(X[:16], Y[:16]))


@pytest.mark.parametrize("weights, batches_with_weights", [("batch", 8), ("epoch", 0), (3, 2)])
def test_records_every_batch_exactly(keras, callback_class, weights, batches_with_weights):
    record = callback_class(weights=weights)
    history = fit(small_model(keras), [record])
    kinds = [r["type"] for r in record.records]
    assert kinds == ["batch"] * 4 + ["epoch"] + ["batch"] * 4 + ["epoch", "end"]
    assert sum("weights" in r for r in record.records if r["type"] == "batch") == batches_with_weights
    epoch = record.records[4]
    assert {"loss", "mae", "val_loss", "val_mae"} <= set(epoch["bits"])
    assert set(epoch["layers"]) == {"first", "middle", "last"}
    assert tfrepro.proof.traces.bits_float(record.records[-2]["bits"]["loss"]) == float(history.history["loss"][-1])


def test_trace_file_has_header_and_is_comparable(keras, callback_class, tmp_path):
    path = tmp_path / "run.jsonl"
    fit(small_model(keras), [callback_class(trace=path)])
    trace = tfrepro.read_trace(path)
    assert trace.complete
    header = trace.header
    assert header["model"]["layers"] == ["first", "middle", "last"]
    assert [v["layer"] for v in header["model"]["variables"]] == ["first"] * 2 + ["middle"] * 2 + ["last"] * 2
    assert header["environment"]["tensorflow"]["version"] == tf.__version__
    assert "settings" in header["status"]


@pytest.mark.parametrize("kwargs, error", [
    ({"on_divergence": "explode"}, ValueError), ({"weights": 0}, ValueError), ({"weights": True}, ValueError),
    ({"weights": "step"}, ValueError), ({"trace": "/no/such/dir/t.jsonl"}, ValueError), ({"trace": 3}, TypeError),
    ({"reference": "/no/such/trace.jsonl"}, FileNotFoundError),
])
def test_bad_arguments_fail_in_init(callback_class, kwargs, error):
    with pytest.raises(error):
        callback_class(**kwargs)


def test_nondeterministic_gradient_is_located_at_the_first_update_in_its_layer_only(keras):
    grad_layer, _ = make_layers(keras, tf)

    def train():
        fit(small_model(keras, grad_layer(8, name="middle")), [], epochs=1)

    result = tfrepro.verify(train, runs=2, seed=1)
    assert not result.identical
    d = result.first_failure.divergence
    assert (d.kind, d.epoch, d.batch, d.step) == ("batch", 0, 0, 0)
    assert d.quantities == ("weights",)  # the batch-0 loss is computed before the update: identical
    assert d.layers == ("middle",) and d.variables and all("middle" in v for v in d.variables)
    assert d.loss_a == d.loss_b


def test_unseeded_forward_noise_diverges_in_the_batch0_loss(keras):
    _, noise = make_layers(keras, tf)

    def train():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, name="first"), noise(name="noise"),
                                  keras.layers.Dense(1, name="last")])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(X, Y, batch_size=16, epochs=1, verbose=0)

    d = tfrepro.verify(train, runs=2).first_failure.divergence
    assert (d.epoch, d.batch) == (0, 0) and d.quantity == "loss" and d.loss_delta > 0


@pytest.mark.slow
def test_deterministic_training_verifies_identical(keras):
    def train():
        model = small_model(keras, keras.layers.Dropout(0.5, name="middle"))
        model.fit(X, Y, batch_size=16, epochs=2, shuffle=True, verbose=0)

    result = tfrepro.verify(train, runs=3, seed=5)
    assert result.identical and len(result.comparisons) == 2
    tfrepro.testing.assert_reproducible(train)


@pytest.mark.slow
def test_warnings_name_the_users_line_and_a_second_verify_is_not_called_late(keras, monkeypatch):
    import warnings

    from tfrepro.determinism import state

    monkeypatch.setattr(state, "STARTUP_HASHSEED", None)  # so that patch() warns about PYTHONHASHSEED

    def train():
        model = small_model(keras)
        model.fit(X, Y, batch_size=32, epochs=1, verbose=0)

    caught = []
    for _ in range(2):  # the second verify follows models built by the first
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            tfrepro.verify(train, runs=2)
        caught.append([w for w in record if issubclass(w.category, tfrepro.ReproducibilityWarning)])
    assert [w.filename for w in caught[0]] == [__file__]  # the hash-seed warning, at this file's verify() line
    assert "PYTHONHASHSEED" in str(caught[0][0].message)
    assert caught[1] == []  # not "called late" about the first run's models, and the hash seed said once
    tfrepro.unpatch()
    with pytest.warns(tfrepro.ReproducibilityWarning, match="PYTHONHASHSEED") as caught:
        with tfrepro.patched(3):
            pass
    assert caught[0].filename == __file__


def test_assert_reproducible_shows_the_first_divergence(keras):
    grad_layer, _ = make_layers(keras, tf)
    with pytest.raises(AssertionError, match=r"epoch 0, batch 0 .*weights differ first in: middle"):
        tfrepro.testing.assert_reproducible(lambda: fit(small_model(keras, grad_layer(8, name="middle")), [], 1))


def _reference(keras, callback_class, tmp_path, epochs=1, middle=None):
    path = tmp_path / "reference.jsonl"
    keras.backend.clear_session()
    tfrepro.seed_everything(2)
    fit(small_model(keras, middle), [callback_class(trace=path)], epochs=epochs)
    return path


def _again(keras, callback, epochs=1, middle=None):
    keras.backend.clear_session()
    tfrepro.seed_everything(2)
    return fit(small_model(keras, middle), [callback], epochs=epochs)


@pytest.mark.slow
def test_live_comparison_raises_warns_or_stops(keras, callback_class, tmp_path):
    grad_layer, _ = make_layers(keras, tf)
    reference = _reference(keras, callback_class, tmp_path, middle=grad_layer(8, shuffle=False, name="middle"))
    same = callback_class(reference=reference)
    _again(keras, same, middle=grad_layer(8, shuffle=False, name="middle"))
    assert same.divergence is None and same.notes == []

    with pytest.raises(tfrepro.DivergenceError, match="epoch 0, batch 0") as info:
        _again(keras, callback_class(reference=reference), middle=grad_layer(8, name="middle"))
    assert info.value.divergence.layers == ("middle",)

    warner = callback_class(reference=reference, on_divergence="warn")
    with pytest.warns(tfrepro.ReproducibilityWarning, match="diverged"):
        _again(keras, warner, middle=grad_layer(8, name="middle"))
    assert len([r for r in warner.records if r["type"] == "batch"]) == 4  # went on training

    stopper = callback_class(reference=reference, on_divergence="stop")
    with pytest.warns(tfrepro.ReproducibilityWarning, match="stopping training"):
        _again(keras, stopper, epochs=2, middle=grad_layer(8, name="middle"))
    assert len([r for r in stopper.records if r["type"] == "batch"]) < 8


def test_a_divergence_raised_out_of_fit_restores_the_optimizer(keras, callback_class, tmp_path):
    grad_layer, _ = make_layers(keras, tf)
    reference = _reference(keras, callback_class, tmp_path, middle=grad_layer(8, shuffle=False, name="middle"))
    keras.backend.clear_session()
    tfrepro.seed_everything(2)
    model = small_model(keras, grad_layer(8, name="middle"))
    callback = callback_class(reference=reference, gradients=True)
    with pytest.raises(tfrepro.DivergenceError):
        fit(model, [callback], 1)
    assert "apply_gradients" not in vars(model.optimizer)  # the class's own method again
    recorder = callback_class(gradients=True)
    fit(model, [recorder], 1)  # a later fit on the same model hooks once and records cleanly
    assert all(r.get("gradients") for r in recorder.records if r["type"] == "batch")
    assert "apply_gradients" not in vars(model.optimizer)


def test_reference_shorter_or_longer_is_reported_not_a_crash(keras, callback_class, tmp_path):
    reference = _reference(keras, callback_class, tmp_path, epochs=1)
    longer_run = callback_class(reference=reference)
    with pytest.warns(tfrepro.ReproducibilityWarning, match="the reference ended first, after 5 identical"):
        _again(keras, longer_run, epochs=2)
    assert longer_run.divergence is None
    reference2 = _reference(keras, callback_class, tmp_path, epochs=2)
    shorter_run = callback_class(reference=reference2)
    with pytest.warns(tfrepro.ReproducibilityWarning, match="the run ended first, after 5 identical"):
        _again(keras, shorter_run, epochs=1)
    assert shorter_run.divergence is None


def test_reference_from_another_model_is_not_comparable(keras, callback_class, tmp_path):
    reference = _reference(keras, callback_class, tmp_path)
    wider = keras.layers.Dense(5, activation="relu", name="middle")
    with pytest.raises(tfrepro.NotComparableError, match="shape"):
        _again(keras, callback_class(reference=reference), middle=wider)


@pytest.mark.slow
def test_mirrored_strategy_over_two_logical_cpus_records_and_compares():
    proc = run_python(str(SCRIPTS / "mirrored.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # 64 rows in batches of 16 for 2 epochs: 8 batch records, 2 epoch records and the end record
    assert result == {"replicas": 2, "identical": True, "records": 11}


def test_gradient_fingerprints_see_what_the_update_absorbs(keras):
    grad_layer, _ = make_layers(keras, tf)

    def train():
        model = small_model(keras, grad_layer(8, name="middle"))
        model.compile(optimizer=keras.optimizers.SGD(1e-9), loss="mse")  # updates vanish in rounding
        model.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0)

    without = tfrepro.verify(train, runs=2)
    assert without.identical  # negative control: the weights never show it
    d = tfrepro.verify(train, runs=2, gradients=True).first_failure.divergence
    assert (d.epoch, d.batch, d.quantities, d.gradient_layers) == (0, 0, ("gradients",), ("middle",))
    assert "gradients differ first in: middle" in str(d)
