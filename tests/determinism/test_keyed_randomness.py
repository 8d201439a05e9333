"""Keyed randomness: fit's shuffle of arrays, ``tfrepro.data.shuffle`` and ``map_with_seed`` draw by
(seed, epoch, element), ``patch(init="keyed")`` by (seed, layer, weight). Two fresh processes give
the same bits; every epoch differs; peeking with ``take(1)`` changes nothing; negative controls
show what Keras does without it."""

from __future__ import annotations

import json
import warnings
import sys

import numpy as np
import pytest

import tfrepro
from tfrepro import _tf

from conftest import run_python, run_tfrepro

pytestmark = pytest.mark.keras

_SCRIPT = r'''
import json, sys, warnings
import numpy as np
import tfrepro
warnings.simplefilter("ignore")
tfrepro.patch(3, init="keyed")
import tensorflow as tf
from tfrepro import _tf
import tfrepro.data
keras = _tf.keras_module()


class Probe(keras.Model):
    """Records the first column of every training batch it sees."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1, name="head")
        self.seen = []

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x = data[0] if isinstance(data, tuple) else data
        tf.py_function(lambda v: self.seen.append(np.asarray(v)[:, 0].tolist()), [x], [])
        return {"loss": tf.constant(0.0)}


def epochs_seen(x, y=None, **fit):
    model = Probe()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, epochs=3, verbose=0, **fit)
    per_epoch = len(model.seen) // 3
    return [sum(model.seen[e * per_epoch:(e + 1) * per_epoch], []) for e in range(3)]


x = np.arange(24, dtype="float32")[:, None]
out = {"fit arrays": epochs_seen(x, x, batch_size=6, shuffle=True)}

def jitter(value, label, seed):
    return value + tf.random.stateless_uniform([1], seed), label

def keyed_pipeline():
    data = tf.data.Dataset.from_tensor_slices((x, x))
    return tfrepro.data.map_with_seed(tfrepro.data.shuffle(data, 24), jitter, key="jitter").batch(6)

pipeline = keyed_pipeline()
out["fit keyed pipeline"] = epochs_seen(pipeline)
list(pipeline.take(1))  # peeking before fit
out["after take(1)"] = epochs_seen(pipeline)
files = tf.data.Dataset.from_tensor_slices(["a.rec", "b.rec", "c.rec"])
draws = files.interleave(lambda name: tfrepro.data.map_with_seed(
    tf.data.Dataset.range(4), lambda i, seed: tf.random.stateless_uniform([], seed, 0, 10**6, tf.int64), key="per file"),
    cycle_length=1)
out["interleaved"] = [int(v) for v in draws]

def model(extra):
    layers = [keras.Input((4,)), keras.layers.Dense(8, name="enc"), keras.layers.Dense(8)]
    if extra:
        layers.append(keras.layers.Dense(8, name="inserted"))
    layers += [keras.layers.Dense(8, name="dec"), keras.layers.Dense(1, name="out")]
    return keras.Sequential(layers)

def initial(extra):
    built = model(extra)
    return {layer.name: [w.tolist() for w in layer.get_weights()] for layer in built.layers if layer.name in ("enc", "dec", "out")}

out["init"], out["init inserted"] = initial(False), initial(True)
out["status"] = str(tfrepro.status()["randomness"])
tfrepro.unpatch()
tf.random.set_seed(3)  # the negative control: TF's global seed alone
out["control fit arrays"] = epochs_seen(x, x, batch_size=6, shuffle=True)
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    script = tmp_path_factory.mktemp("keyed") / "keyed.py"
    script.write_text(_SCRIPT)
    found = []
    for _ in range(2):
        proc = run_python(str(script))
        assert proc.returncode == 0, proc.stderr[-3000:]
        found.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return found


@pytest.mark.slow
def test_two_fresh_processes_draw_the_same_everything(runs):
    first, second = ({k: v for k, v in run.items() if k != "control fit arrays"} for run in runs)
    assert first == second


@pytest.mark.slow
@pytest.mark.parametrize("what", ["fit arrays", "fit keyed pipeline"])
def test_every_epoch_has_its_own_order_of_every_element(runs, what):
    epochs = runs[0][what]
    assert len({json.dumps(e) for e in epochs}) == 3
    if what == "fit arrays":
        assert all(sorted(e) == list(range(24)) for e in epochs)  # a permutation of the samples each epoch


@pytest.mark.slow
def test_fit_shuffle_order_is_the_keyed_permutation_of_the_epoch(runs):
    """Addressable: epoch E's order is computed from (seed, E) alone, whichever Keras runs it."""
    from tfrepro.determinism import fit_shuffling, keys

    for epoch, seen in enumerate(runs[0]["fit arrays"]):
        order = keys.permutation(24, keys.fold_in(keys.key(3, fit_shuffling.PURPOSE), epoch)).numpy()
        assert seen == order.tolist()


@pytest.mark.slow
def test_negative_control_keras3_repeats_one_order_under_tfs_global_seed(runs, keras):
    epochs = runs[0]["control fit arrays"]
    if _tf.keras_major(keras) >= 3:
        assert epochs[0] == epochs[1] == epochs[2]  # what tfrepro fixes
    else:
        assert len({json.dumps(e) for e in epochs}) == 3  # Keras 2 draws them one after another


@pytest.mark.slow
def test_peeking_with_take_changes_nothing(runs):
    assert runs[0]["after take(1)"] == runs[0]["fit keyed pipeline"]


@pytest.mark.slow
def test_interleaved_files_draw_their_own_numbers(runs):
    draws = runs[0]["interleaved"]
    per_file = [tuple(draws[i:i + 4]) for i in range(0, 12, 4)]
    assert len(set(per_file)) == 3 and len(set(draws)) == 12


@pytest.mark.slow
def test_keyed_init_keeps_named_layers_when_a_layer_is_inserted(runs):
    run = runs[0]
    assert run["init"] == run["init inserted"]
    assert "init='keyed'" in run["status"]


def test_negative_control_order_init_changes_when_a_layer_is_inserted(keras):
    def build(extra):
        layers = [keras.Input((4,)), keras.layers.Dense(8, name="enc")]
        layers += [keras.layers.Dense(8, name="inserted")] if extra else []
        return keras.Sequential([*layers, keras.layers.Dense(8, name="dec")])

    with tfrepro.patched(3):
        before = build(False).get_layer("dec").get_weights()[0]
    with tfrepro.patched(3):
        after = build(True).get_layer("dec").get_weights()[0]
    assert not np.array_equal(before, after)
    with tfrepro.patched(3, init="keyed"):
        keyed = build(False).get_layer("dec").get_weights()[0]
    with tfrepro.patched(3, init="keyed"):
        assert np.array_equal(keyed, build(True).get_layer("dec").get_weights()[0])


@pytest.fixture(scope="module")
def tf():
    return _tf.import_tf()


def test_an_epoch_given_equals_the_clock_at_that_epoch(tf):
    import tfrepro.data

    data = tf.data.Dataset.range(10)
    clocked = tfrepro.data.shuffle(data, 10, seed=1)
    orders = []
    for epoch in (2, 0, 2):
        tfrepro.data.set_epoch(epoch)
        assert tfrepro.data.current_epoch() == epoch
        orders.append(list(clocked.as_numpy_iterator()))
        assert orders[-1] == list(tfrepro.data.shuffle(data, 10, seed=1, epoch=epoch).as_numpy_iterator())
    assert orders[0] == orders[2] != orders[1]
    assert clocked.cardinality() == 10
    with tfrepro.patched(0):  # TF's global seed 0 once broke TF's seed pairing; it does not enter at all
        tfrepro.data.set_epoch(2)
        assert list(clocked.as_numpy_iterator()) == orders[0]
        tf.random.set_seed(5)
        assert list(clocked.as_numpy_iterator()) == orders[0]
    tfrepro.data.set_epoch(0)


@pytest.mark.parametrize("call, message", [
    (lambda tf, d: d.shuffle(tf.data.Dataset.range(3), 0, seed=1), "buffer_size"),
    (lambda tf, d: d.shuffle(tf.data.Dataset.range(3), 3), "needs a seed"),
    (lambda tf, d: d.shuffle([1, 2], 3, seed=1), "tf.data.Dataset"),
    (lambda tf, d: d.shuffle(tf.data.Dataset.range(3), 3, seed=1, epoch=-1), "epoch must be"),
    (lambda tf, d: d.map_with_seed(tf.data.Dataset.range(3), lambda x, s: x, seed=1, epoch=1.5), "epoch must be"),
    (lambda tf, d: d.set_epoch(-2), "epoch must be"),
    (lambda tf, d: tfrepro.patch(0, init="layer"), "init must be"),
])
def test_bad_arguments_say_what_to_do(tf, call, message):
    import tfrepro.data

    with pytest.raises((ValueError, TypeError), match=message):
        call(tf, tfrepro.data)


def test_tfrepro_run_init_keyed_patches_with_keyed_initial_weights(tmp_path):
    probe = "import tfrepro, tensorflow; print(tfrepro.status()['randomness'].value)"
    proc = run_tfrepro("run", "--seed", "2", "--init", "keyed", "--", sys.executable, "-c", probe)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("(init='keyed')"), proc.stderr[-2000:]
    bad = run_tfrepro("run", "--init", "layers", "--", sys.executable, "-c", "pass")
    assert bad.returncode == 2 and "invalid choice: 'layers'" in bad.stderr and "Traceback" not in bad.stderr


def test_keyed_init_tells_same_named_cells_apart_and_takes_positional_initialisers(keras):
    """Keras 3 names every LSTM's cell `lstm_cell`: the parents' names tell them apart. An
    initialiser given by position (Keras 3's add_weight(shape, initializer)) is keyed too."""
    keras3 = _tf.keras_major(keras) >= 3

    class Custom(keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight((4, 4), "he_normal", name="w") if keras3 else self.add_weight(
                "w", (4, 4), initializer="he_normal")

    with tfrepro.patched(3, init="keyed"):
        stacked = keras.Sequential([keras.Input((3, 4)), keras.layers.LSTM(4, return_sequences=True), keras.layers.LSTM(4)])
        first, second = (layer.cell.kernel.numpy() for layer in stacked.layers)
        assert not np.array_equal(first, second)
        made = []
        for _ in range(2):
            layer = Custom(name="custom")
            layer.build((4,))
            made.append(layer.w.numpy())
    assert np.array_equal(made[0], made[1])


def test_two_towers_with_one_key_are_named_when_fit_begins_and_a_shared_layer_is_not(keras):
    """Two towers built by one function with the same layer names get one key per weight under
    init="keyed", so they start identical: fit names them before its first step."""
    from tfrepro.errors import ReproducibilityWarning

    x, y = np.ones((8, 3), "float32"), np.ones((8, 4), "float32")
    with tfrepro.patched(3, init="keyed"):
        def tower(name):
            inputs = keras.Input((3,))
            body = keras.layers.Dense(2, name="body")(inputs)
            return keras.Model(inputs, body, name=name)

        left, right = tower("left"), tower("right")
        assert np.array_equal(left.get_layer("body").kernel.numpy(), right.get_layer("body").kernel.numpy())  # symptom
        inputs = keras.Input((3,))
        model = keras.Model(inputs, keras.layers.Concatenate()([left(inputs), right(inputs)]))
        model.compile("sgd", "mse")
        with pytest.warns(ReproducibilityWarning, match=r'init="keyed": 2 weights of this model .* have one key'):
            model.fit(x, y, epochs=1, verbose=0)
        shared = keras.layers.Dense(4, name="shared")  # one layer used twice: one variable, nothing to name
        inputs = keras.Input((3,))
        reused = keras.Model(inputs, keras.layers.Add()([shared(inputs), shared(inputs)]))
        reused.compile("sgd", "mse")
        with warnings.catch_warnings():
            warnings.simplefilter("error", ReproducibilityWarning)
            reused.fit(x, y, epochs=1, verbose=0)
