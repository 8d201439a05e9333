"""``tfrepro.diagnose``: the dynamic bisection names the layer that varies by itself, in every model
form; the static scan names the layers that reach ops without deterministic GPU kernels; both leave
the model as they found it. Real Keras (3 here, 2 on the tf-keras leg), real TensorFlow."""

from pathlib import Path

import numpy as np
import pytest

import tfrepro
from nondeterminism import make_layers

pytestmark = [pytest.mark.keras]

RNG = np.random.default_rng(0)
X = RNG.random((32, 6)).astype("float32")
Y = RNG.random((32, 3)).astype("float32")


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


def _culprit(keras, tf, name="culprit", **options):
    dense, _ = make_layers(keras, tf)
    return dense(5, name=name, **options)


def _model(form, keras, tf, culprit):
    """first -> culprit -> last, as Sequential, functional, subclassed, or with the culprit nested in a block."""
    if form == "sequential":
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh", name="first"), culprit,
                                  keras.layers.Dense(3, name="last")])
    elif form == "functional":
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(8, activation="tanh", name="first")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(3, name="last")(culprit(hidden)))
    elif form == "subclassed":
        class Net(keras.Model):
            def __init__(self):
                super().__init__()
                self.first = keras.layers.Dense(8, activation="tanh", name="first")
                self.middle = culprit
                self.last = keras.layers.Dense(3, name="last")

            def call(self, inputs):
                return self.last(self.middle(self.first(inputs)))

        model = Net()
    else:
        class Block(keras.layers.Layer):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.inner_first = keras.layers.Dense(8, activation="tanh", name="inner_first")
                self.inner = culprit

            def call(self, inputs):
                return self.inner(self.inner_first(inputs))

        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh", name="first"),
                                  Block(name="block"), keras.layers.Dense(3, name="last")])
    model.compile(optimizer="adam", loss="mse")
    return model


def _state(model):
    from tfrepro.diagnosis.restoring import model_variables

    return {id(v): (v.name, np.array(v.numpy(), copy=True)) for v in model_variables(model)}


@pytest.mark.core
@pytest.mark.parametrize("form", ["sequential", "functional", pytest.param("subclassed", marks=pytest.mark.slow),
                                  pytest.param("nested", marks=pytest.mark.slow)])
def test_the_layer_whose_gradient_varies_is_named_and_nothing_before_it(form, keras, tf):
    with tfrepro.patched(0):
        model = _model(form, keras, tf, _culprit(keras, tf, input_gradient=True))
        diagnosis = tfrepro.diagnose(model, X, Y, repeats=3)
    culprit = "block/culprit" if form == "nested" else "culprit"
    assert not diagnosis.clean
    assert diagnosis.first_nondeterministic.where == culprit, str(diagnosis)
    assert diagnosis.where("nondeterministic") == [culprit], str(diagnosis)
    first = diagnosis.first_nondeterministic
    assert first.details["repeats_differing"] == 2 and first.details["phase"] == "backward"
    assert 0 < first.details["max_abs_diff"] < 1e-3
    # the gradient it passes back varies, so the layers before it vary downstream; the layer after it does not
    downstream = diagnosis.where("downstream")
    assert "first" in downstream and "last" not in downstream, str(diagnosis)
    assert ("block/inner_first" in downstream) == (form == "nested")
    assert "tfrepro.ops" in first.fix


@pytest.mark.parametrize("form", ["sequential", "functional"])
def test_forward_noise_is_named_in_the_forward_pass_and_what_follows_is_downstream(form, keras, tf):
    _, noise = make_layers(keras, tf)
    with tfrepro.patched(0):
        model = _model(form, keras, tf, noise(name="culprit"))
        diagnosis = tfrepro.diagnose(model, X, Y)
    assert diagnosis.where("nondeterministic") == ["culprit"], str(diagnosis)
    assert diagnosis.first_nondeterministic.details["phase"] == "forward"
    assert "last" in diagnosis.where("downstream") and "loss" in diagnosis.where("downstream")
    assert "first" not in diagnosis.where()[:diagnosis.where().index("culprit")]


@pytest.mark.slow
def test_a_skip_connection_does_not_move_the_blame(keras, tf):
    """The tensor `first` produces is read by the culprit and by the Add: the gradient `first` receives
    varies, but what each call passes back is compared per call, so the Add is not blamed."""
    with tfrepro.patched(0):
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(5, activation="tanh", name="first")(inputs)
        branch = _culprit(keras, tf, input_gradient=True)(hidden)
        merged = keras.layers.Add(name="add")([hidden, branch])
        model = keras.Model(inputs, keras.layers.Dense(3, name="last")(merged))
        model.compile(optimizer="adam", loss="mse")
        diagnosis = tfrepro.diagnose(model, X, Y)
    assert diagnosis.where("nondeterministic") == ["culprit"], str(diagnosis)
    assert "add" not in diagnosis.where() and "first" in diagnosis.where("downstream")


@pytest.mark.slow
def test_a_shared_layer_is_not_blamed_for_what_reaches_it_through_another_call(keras, tf):
    culprit = _culprit(keras, tf, input_gradient=True)

    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.shared = keras.layers.Dense(5, activation="tanh", name="shared")
            self.middle = culprit
            self.last = keras.layers.Dense(3, name="last")

        def call(self, inputs):
            return self.last(self.shared(self.middle(self.shared(inputs[:, :5]))))  # shared is called twice

    with tfrepro.patched(0):
        model = Net()
        model.compile(optimizer="adam", loss="mse")
        diagnosis = tfrepro.diagnose(model, X, Y)
    assert diagnosis.where("nondeterministic") == ["culprit"], str(diagnosis)
    assert "shared" in diagnosis.where("downstream")


def test_noise_in_the_models_own_call_is_named_as_the_model(keras, tf):
    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.first = keras.layers.Dense(5, name="first")
            self.last = keras.layers.Dense(3, name="last")

        def call(self, inputs):
            hidden = self.first(inputs)
            jitter = tf.numpy_function(lambda: np.random.default_rng().normal(0, 1e-3, (1, 5)).astype("float32"), [],
                                       tf.float32)
            return self.last(hidden + tf.reshape(jitter, [1, 5]))

    with tfrepro.patched(0):
        model = Net()
        model.compile(optimizer="adam", loss="mse")
        diagnosis = tfrepro.diagnose(model, X, Y)
    assert diagnosis.where("nondeterministic") == ["net"], str(diagnosis)
    assert "the model's own code between its layers" in diagnosis.first_nondeterministic.finding
    assert diagnosis.where("downstream")[:2] == ["last", "loss"]  # forward, then the backward pass reaches first
    assert next(f for f in diagnosis.findings if f.where == "first").details["phase"] == "backward"


@pytest.mark.slow
def test_every_tensor_argument_counts_as_input(keras, tf):
    """MultiHeadAttention(query, value): a varying value (its second argument) makes it downstream."""
    _, noise = make_layers(keras, tf)
    with tfrepro.patched(0):
        inputs = keras.Input((4, 6))
        value = noise(name="noisy")(keras.layers.Dense(6, name="project")(inputs))
        attended = keras.layers.MultiHeadAttention(2, 3, name="mha")(inputs, value)
        model = keras.Model(inputs, keras.layers.Dense(3, name="last")(keras.layers.Flatten()(attended)))
        model.compile(optimizer="adam", loss="mse")
        diagnosis = tfrepro.diagnose(model, RNG.random((8, 4, 6)).astype("float32"), RNG.random((8, 3)).astype("float32"))
    assert diagnosis.where("nondeterministic") == ["noisy"], str(diagnosis)
    assert "mha" in diagnosis.where("downstream")


@pytest.mark.core
def test_negative_control_the_same_model_without_the_shuffle_is_clean(keras, tf):
    with tfrepro.patched(0):
        model = _model("functional", keras, tf, _culprit(keras, tf, shuffle=False))
        diagnosis = tfrepro.diagnose(model, X, Y)
    assert not [f for f in diagnosis.findings if f.check == "dynamic"], str(diagnosis)
    assert diagnosis.clean, str(diagnosis)


@pytest.mark.slow
def test_weights_optimizer_state_and_rngs_are_unchanged_afterwards(keras, tf):
    with tfrepro.patched(0):
        model = _model("sequential", keras, tf, _culprit(keras, tf, input_gradient=True))
        model.add(keras.layers.Dropout(0.5))
        model.compile(optimizer="adam", loss="mse")
        model.fit(X, Y, epochs=1, batch_size=8, verbose=0)  # the optimizer has slots and iterations > 0
        before = _state(model)
        rng_before = tfrepro.rng_state()
        diagnosis = tfrepro.diagnose(model, X, Y)
        after = _state(model)
        assert tfrepro.rng_state() == rng_before
    assert diagnosis.where("nondeterministic") == ["culprit"]
    assert before.keys() == after.keys()
    for key, (name, value) in before.items():
        assert value.tobytes() == after[key][1].tobytes(), name
    assert any("iteration" in name and int(value) > 0 for name, value in before.values())


def test_dropout_and_seeded_randomness_are_not_reported(keras, tf):
    """Dropout draws new masks each step; restored seed states make the repeats draw the same ones."""
    with tfrepro.patched(0):
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dropout(0.5), keras.layers.GaussianNoise(0.1), keras.layers.Dense(3)])
        model.compile(optimizer="adam", loss="mse")
        diagnosis = tfrepro.diagnose(model, X, Y)
    assert diagnosis.clean, str(diagnosis)


def _mnist_cnn(keras):
    from tfrepro.examples.mnist_cnn import build_model

    model = build_model(keras)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


@pytest.mark.slow
def test_the_demo_mnist_cnn_under_patch_is_clean(keras, tf):
    from tfrepro.examples.datasets import load_mnist

    data = load_mnist(allow_download=False, limit=256)
    with tfrepro.patched(0):
        model = _mnist_cnn(keras)
        diagnosis = tfrepro.diagnose(model, data.x_train, data.y_train, repeats=3, batch_size=64)
    assert diagnosis.clean, str(diagnosis)
    assert diagnosis.repeats == 3 and set(diagnosis.seconds) == {"scan", "bisection"}


def test_without_patch_the_configuration_is_a_risk(keras, tf):
    model = _model("sequential", keras, tf, _culprit(keras, tf, shuffle=False))
    from tfrepro import _tf

    if _tf.op_determinism_enabled():
        pytest.skip("op determinism was left on in this process")
    diagnosis = tfrepro.diagnose(model, X, Y, repeats=0)
    assert "configuration" in diagnosis.where("risk"), str(diagnosis)
    assert "tfrepro.patch" in next(f.fix for f in diagnosis.findings if f.where == "configuration")


@pytest.mark.parametrize("bad, error, message", [
    ({"repeats": 1}, ValueError, "repeats must be 0"),
    ({"repeats": -2}, ValueError, "repeats must be 0"),
    ({"repeats": True}, ValueError, "repeats must be 0"),
    ({"batch_size": 0}, ValueError, "batch_size must be a positive int"),
    ({"x": None}, ValueError, "x is None"),
    ({"x": np.zeros((0, 6), "float32")}, ValueError, "x is empty"),
])
def test_bad_arguments_say_what_to_do(bad, error, message, keras, tf):
    model = _model("sequential", keras, tf, _culprit(keras, tf, shuffle=False))
    arguments = {"x": X, "y": Y, **bad}
    with pytest.raises(error, match=message):
        tfrepro.diagnose(model, **arguments)


def test_a_model_that_is_not_compiled_or_not_a_model_is_refused(keras, tf):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="model.compile"):
        tfrepro.diagnose(model, X, Y)
    with pytest.raises(TypeError, match="must be a"):
        tfrepro.diagnose(lambda x: x, X, Y)
    with pytest.raises(ValueError, match="dataset is empty"):
        model.compile("sgd", "mse")
        tfrepro.diagnose(model, tf.data.Dataset.from_tensor_slices((X, Y)).take(0))


def test_the_report_prints_renders_and_round_trips(keras, tf):
    from rich.console import Console

    with tfrepro.patched(0):
        model = _model("sequential", keras, tf, _culprit(keras, tf))
        diagnosis = tfrepro.diagnose(model, X, Y)
    text = str(diagnosis)
    assert text.splitlines()[0].startswith("2 problem(s) found (1 nondeterministic, 1 risk")  # the risk: its Python
    assert "[nondeterministic] culprit:" in text and "[risk] train step: runs Python" in text
    console = Console(record=True, width=200)
    console.print(diagnosis)
    assert "culprit" in console.export_text()
    again = tfrepro.Diagnosis.from_dict(diagnosis.to_dict())
    assert again.findings == diagnosis.findings and again.clean is False
    with pytest.raises(ValueError, match="not a tfrepro diagnosis"):
        tfrepro.Diagnosis.from_dict({"findings": [{"severity": "bad", "where": "x", "finding": "y"}]})


@pytest.mark.slow
def test_under_a_mirrored_strategy_the_layer_is_named(tmp_path, keras):
    """Two logical CPU devices must be set up before TensorFlow starts: a fresh process."""
    from conftest import run_python

    from tfrepro import _tf

    script = tmp_path / "mirrored_diagnose.py"
    script.write_text(f"""
import sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
import tfrepro
from nondeterminism import make_layers
tfrepro.patch(3)
dense, _ = make_layers(tf.keras, tf)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.random.RandomState(0).rand(64, 4).astype("float32")
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu", name="a"),
                                 dense(6, input_gradient=True, name="culprit"), tf.keras.layers.Dense(1, name="b")])
    model.compile(optimizer="adam", loss="mse")
try:
    d = tfrepro.diagnose(model, x, x.sum(axis=1, keepdims=True))
    print("RESULT", strategy.num_replicas_in_sync, d.where("nondeterministic"), d.where("downstream"))
except ValueError as exc:
    print("REFUSED", exc)
""")
    proc = run_python(str(script))  # the leg's TF_USE_LEGACY_KERAS passes through
    assert proc.returncode == 0, proc.stderr[-3000:]
    if _tf.keras_major(keras) >= 3:
        assert "RESULT 2 ['culprit'] ['a']" in proc.stdout
    else:
        assert "REFUSED diagnose under a tf.distribute strategy needs Keras 3" in proc.stdout
