"""``patch()``'s default ``ops="auto"``: it replaces exactly what the TensorFlow version cannot run
deterministically on a GPU, the replacements are on the paths Keras takes, and models that reach
them train to identical weights in fresh processes."""

import json

import numpy as np
import pytest

import tfrepro
from tfrepro import _tf
from tfrepro.ops import selection

from conftest import run_python


@pytest.mark.core
def test_auto_selects_by_tensorflow_version():
    assert set(selection.auto_ops("2.21")) == {"bincount", "sparse_dense_matmul", "resize_nearest_neighbor",
                                               "crop_and_resize", "fused_batch_norm", "adjust_contrast"}
    older = selection.auto_ops("2.6")  # segment sums and sparse softmax xent raised there; bias_add never did
    assert {"unsorted_segment_sum", "sparse_softmax_cross_entropy_with_logits"} <= set(older)
    assert "fused_batch_norm" not in older and "bias_add" not in older
    assert "unsorted_segment_sum" not in selection.auto_ops("2.7")
    assert selection.select_ops("auto", "2.6") == tuple(older)
    assert selection.summation_of("auto") == "tf" and selection.summation_of(True) == "exact"
    assert all("on a GPU in TF 2.21" in why for why in selection.auto_ops("2.21").values())


def _models(keras, tf):
    """One model per auto op, each reaching it the way its Keras does (or a user layer does)."""

    class FineTuned(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.bn = keras.layers.BatchNormalization()

        def call(self, inputs):
            return self.bn(inputs, training=False)

    class Crops(keras.layers.Layer):
        def call(self, inputs):
            boxes = tf.constant([[0.1, 0.1, 0.9, 0.8]] * 2)
            return tf.image.crop_and_resize(inputs, boxes, tf.range(2), [3, 3])

    class GraphConv(keras.layers.Layer):
        def call(self, inputs):
            adjacency = tf.sparse.from_dense(tf.constant(np.eye(8, dtype="float32") + np.eye(8, k=1, dtype="float32")))
            return tf.transpose(tf.sparse.sparse_dense_matmul(adjacency, tf.transpose(inputs)))

    def image_model(*layers):
        return keras.Sequential([keras.Input((8, 8, 2)), keras.layers.Conv2D(2, 1), *layers,
                                 keras.layers.Flatten(), keras.layers.Dense(1)])

    tokens = keras.Input((5,), dtype="int32")
    counted = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.CategoryEncoding(8, output_mode="count")(tokens)))
    return {
        "resize_nearest_neighbor": image_model(keras.layers.UpSampling2D(), keras.layers.Resizing(6, 6, "nearest")),
        "crop_and_resize": image_model(Crops()),
        "fused_batch_norm": image_model(FineTuned()),
        "adjust_contrast": image_model(keras.layers.RandomContrast(0.5, seed=1)),
        "sparse_dense_matmul": keras.Sequential([keras.Input((8,)), keras.layers.Dense(8), GraphConv(),
                                                 keras.layers.Dense(1)]),
        "bincount": counted,
    }


def _inputs(name):
    rng = np.random.default_rng(0)
    if name == "bincount":
        return rng.integers(0, 8, (2, 5)).astype("int32")
    if name == "sparse_dense_matmul":
        return rng.random((8, 8)).astype("float32")
    return rng.random((2, 8, 8, 2)).astype("float32")


@pytest.mark.parametrize("gpu", [True, False], ids=["GPU plan", "CPU"])
def test_each_auto_replacement_is_on_the_path_keras_takes(keras, monkeypatch, gpu):
    """With a GPU visible (forced here: the tests run on CPU) the replacement runs tfrepro's version;
    on a CPU, TF's own op, deterministic there."""
    from tfrepro.determinism import state
    from tfrepro.ops import _exact_sum, rebinding

    tf = _tf.import_tf()
    monkeypatch.setattr(_exact_sum, "_gpus_visible", lambda: gpu)
    entered = []
    summing = rebinding.summing
    monkeypatch.setattr(rebinding, "summing", lambda mode: entered.append(mode) or summing(mode))
    reached, ours = {}, {}
    with tfrepro.patched(0):
        assert set(state.active_ops()) == set(selection.auto_ops())
        for name, model in _models(keras, tf).items():
            calls = []
            spied = []
            for target in rebinding._with_compat_v2(rebinding.TABLE[name][1]):
                try:
                    owner, attribute = rebinding._owner(target)
                except (AttributeError, ImportError):
                    continue
                if "." in attribute:
                    module_global, attribute = attribute.split(".")
                    owner = getattr(owner, module_global)
                current = getattr(owner, attribute)
                assert current.__module__.startswith("tfrepro.ops"), (name, target)

                def spy(*args, __current=current, **kwargs):
                    calls.append(1)
                    return __current(*args, **kwargs)

                setattr(owner, attribute, spy)
                spied.append((owner, attribute, current))
            before = len(entered)
            try:
                model.compile(optimizer="sgd", loss="mse")
                x = _inputs(name)
                model.fit(x, np.ones((len(x), 1), "float32"), epochs=1, batch_size=len(x), verbose=0)
            finally:
                for owner, attribute, current in reversed(spied):
                    setattr(owner, attribute, current)
            reached[name] = bool(calls)
            ours[name] = len(entered) > before
    expected = {name: True for name in reached}
    if _tf.keras_major(keras) >= 3:  # Keras 3 computes batch norm unfused and its own contrast (README)
        expected.update(fused_batch_norm=False, adjust_contrast=False)
    assert reached == expected
    # tfrepro's version (TF's sums) with a GPU; on a CPU TF's op, except adjust_contrast (TF's has no gradient)
    assert ours == {name: was and (gpu or name == "adjust_contrast") for name, was in reached.items()}
    assert set(entered) <= {"tf"}


_TRAIN = """
import hashlib, json, warnings
import numpy as np
import tfrepro
warnings.simplefilter("ignore")
from tfrepro.ops import _exact_sum, rebinding
_exact_sum._gpus_visible = lambda: True  # as on a GPU box: ops="auto" runs tfrepro's versions (the tests run on CPU)
ran = []
summing = rebinding.summing
rebinding.summing = lambda mode: ran.append(mode) or summing(mode)  # counts the calls of tfrepro's versions
tfrepro.patch(11)  # no arguments beyond the seed: ops="auto"
import tensorflow as tf
from tfrepro import _tf
from tfrepro.determinism import state
keras = _tf.keras_module()

class FineTuned(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.bn = keras.layers.BatchNormalization()

    def call(self, inputs):
        return self.bn(inputs, training=False)

x = np.random.default_rng(0).random((64, 8, 8, 3)).astype("float32")
y = np.random.default_rng(1).random((64, 1)).astype("float32")
digests = {}
for name, middle in (("upsampling", [keras.layers.UpSampling2D(), keras.layers.Resizing(12, 12, "nearest"),
                                     keras.layers.Conv2D(4, 3, strides=2)]),
                     ("batch norm fine-tuning", [FineTuned()])):
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, activation="relu"), *middle,
                              keras.layers.Flatten(), keras.layers.Dropout(0.3), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=16, epochs=2, shuffle=True, verbose=0)
    digests[name] = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()
status = tfrepro.status()["op replacements"]
print(json.dumps({"weights": digests, "ops": list(state.active_ops()), "status": status.value + status.why, "ran": len(ran)}))
"""


@pytest.mark.slow
def test_upsampling_and_batch_norm_fine_tuning_train_identically_in_fresh_processes(tmp_path, keras):
    script = tmp_path / "train.py"
    script.write_text(_TRAIN)
    runs = []
    for _ in range(2):
        proc = run_python(str(script))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0]["weights"] == runs[1]["weights"]
    assert {"resize_nearest_neighbor", "fused_batch_norm"} <= set(runs[0]["ops"])
    assert "ops='auto'" in runs[0]["status"] and "resize_nearest_neighbor: tf.image.resize" in runs[0]["status"]
    assert runs[0]["ran"] > 0  # tfrepro's versions ran (Resizing on Keras 3; UpSampling2D, batch norm on Keras 2)


def test_keras3_dense_on_a_sparse_input_never_reaches_sparse_dense_matmul(keras, monkeypatch):
    """What the README says of Keras 3: Dense multiplies a SparseTensor with embedding_lookup_sparse."""
    if _tf.keras_major(keras) < 3:
        pytest.skip("Keras 3 only")
    tf = _tf.import_tf()
    calls = []
    original = tf.sparse.sparse_dense_matmul
    monkeypatch.setattr(tf.sparse, "sparse_dense_matmul", lambda *a, **k: calls.append(1) or original(*a, **k))
    dense = keras.layers.Dense(3)
    out = dense(tf.sparse.from_dense(tf.constant(np.eye(4, 6, dtype="float32"))))
    assert out.shape == (4, 3) and not calls
    lookups = []
    lookup = tf.nn.embedding_lookup_sparse
    monkeypatch.setattr(tf.nn, "embedding_lookup_sparse", lambda *a, **k: lookups.append(1) or lookup(*a, **k))
    dense(tf.sparse.from_dense(tf.constant(np.eye(4, 6, dtype="float32"))))
    assert lookups


def test_adjust_contrast_of_large_float16_images_takes_its_mean_in_float32():
    """TF's CPU kernel takes no float16 (its GPU kernel does); a float16 mean of 65,536 pixels would
    overflow. tfrepro's matches TF's float32 result within float16's precision."""
    tf = _tf.import_tf()
    from tfrepro import ops

    images = np.linspace(-1, 1, 256 * 256, dtype=np.float32).reshape(1, 256, 256, 1) + 0.5
    ours = ops.adjust_contrast(tf.constant(images, tf.float16), 1.5).numpy()
    reference = tf.image.adjust_contrast(tf.constant(images), 1.5).numpy()
    np.testing.assert_allclose(ours.astype(np.float32), reference, rtol=2e-3, atol=2e-3)
