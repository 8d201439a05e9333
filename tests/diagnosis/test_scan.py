"""The static scan: each layer that reaches an op without a deterministic GPU kernel is named with its
fix, for the TensorFlow version given; pipeline and configuration risks are reported; ops tfrepro
replaced are reported as handled. Real Keras (3 here, 2 on the tf-keras leg)."""

import numpy as np
import pytest

import tfrepro
from tfrepro import _tf

pytestmark = [pytest.mark.keras]


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


def _risky_model(keras, tf):
    """UpSampling2D (nearest) and Resizing (nearest), batch norm fine-tuning, CategoryEncoding (bincount),
    a graph convolution (sparse_dense_matmul); two inputs."""

    class FineTuned(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv = keras.layers.Conv2D(4, 3, padding="same", name="conv")
            self.bn = keras.layers.BatchNormalization(name="bn")

        def call(self, inputs):
            return self.bn(self.conv(inputs), training=False)  # the transfer-learning recipe, left trainable

    class GraphConv(keras.layers.Layer):
        def build(self, input_shape):
            self.adjacency = tf.sparse.from_dense(np.eye(4, k=1, dtype="float32") + np.eye(4, dtype="float32"))
            self.w = self.add_weight(name="w", shape=(int(input_shape[-1]), 4))

        def call(self, inputs):
            return tf.transpose(tf.sparse.sparse_dense_matmul(self.adjacency, tf.transpose(tf.matmul(inputs, self.w))))

    image = keras.Input((8, 8, 3), name="image")
    tokens = keras.Input((5,), dtype="int32", name="tokens")
    hidden = keras.layers.Conv2D(3, 3, padding="same", name="stem")(image)
    hidden = keras.layers.UpSampling2D(name="upsample")(hidden)
    hidden = keras.layers.Resizing(8, 8, interpolation="nearest", name="resize")(hidden)
    hidden = keras.layers.GlobalAveragePooling2D(name="pool")(FineTuned(name="finetuned")(hidden))
    counts = keras.layers.CategoryEncoding(num_tokens=10, output_mode="count", name="counts")(tokens)
    hidden = keras.layers.Dense(4, name="dense")(keras.layers.Concatenate(name="concat")([hidden, counts]))
    model = keras.Model({"image": image, "tokens": tokens}, GraphConv(name="graph_conv")(hidden))
    model.compile(optimizer="adam", loss="mse")
    return model


def _data(tf, parallel=2):
    rng = np.random.default_rng(0)
    x = {"image": rng.random((16, 8, 8, 3)).astype("float32"), "tokens": rng.integers(0, 10, (16, 5)).astype("int32")}
    y = rng.random((16, 4)).astype("float32")

    def augment(inputs, target):
        return {"image": tf.image.random_flip_left_right(inputs["image"]), "tokens": inputs["tokens"]}, target

    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(16).map(augment, num_parallel_calls=parallel).batch(8)


def _by_where(diagnosis):
    return {f.where: f for f in diagnosis.findings}


def test_each_risky_layer_is_named_with_its_fix(keras, tf):
    keras3 = _tf.keras_major(keras) >= 3
    with tfrepro.patched(0, ops=False):  # patch()'s default ops="auto" would replace them (next test)
        diagnosis = tfrepro.diagnose(_risky_model(keras, tf), _data(tf), repeats=0, tf_version="2.21")
    found = _by_where(diagnosis)
    raising = diagnosis.where("raises on GPU")
    assert found["counts"].details["op"] in ("DenseBincount", "Bincount") and "ops=['bincount']" in found["counts"].fix
    assert found["graph_conv"].details["op"] == "SparseTensorDenseMatMul" and "sparse_dense_matmul" in found["graph_conv"].fix
    assert found["resize"].details["op"] == "ResizeNearestNeighborGrad" and "resize_nearest_neighbor" in found["resize"].fix
    assert "stem" not in found and "dense" not in found and "pool" not in found
    if keras3:  # Keras 3 computes these without the raising kernels, and says so (README: "Keras 3 and the table")
        assert found["upsample"].severity == "note" and "repeats pixels" in found["upsample"].finding
        assert found["finetuned/bn"].severity == "note" and "unfused" in found["finetuned/bn"].finding
        assert raising == ["resize", "counts", "graph_conv"]
    else:
        assert found["upsample"].details["op"] == "ResizeNearestNeighborGrad"
        assert found["finetuned/bn"].details["op"] == "FusedBatchNormGradV3"
        assert "trainable = False" in found["finetuned/bn"].fix
        assert raising == ["upsample", "resize", "finetuned/bn", "counts", "graph_conv"]  # model order
    pipeline = found["input pipeline: map(augment)"]
    assert pipeline.severity == "note" and "serially" in pipeline.finding and "stateless_random" in pipeline.fix
    assert "RandomUniform" in pipeline.details["ops"]


def test_the_version_given_decides_depthwise_conv_raises_in_2_9_not_2_10(keras, tf):
    model = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.DepthwiseConv2D(3, name="depthwise"),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((4, 6, 6, 2), "float32"), np.ones((4, 1), "float32")
    with tfrepro.patched(0):
        old = tfrepro.diagnose(model, x, y, repeats=0, tf_version="2.9")
        new = tfrepro.diagnose(model, x, y, repeats=0, tf_version="2.10")
        older = tfrepro.diagnose(model, x, y, repeats=0, tf_version="2.6.2")
    assert old.where("raises on GPU") == ["depthwise"] and "2.10" in _by_where(old)["depthwise"].fix
    assert _by_where(old)["depthwise"].details["op"] == "DepthwiseConv2dNativeBackpropFilter"
    assert new.clean and "depthwise" not in new.where()
    assert older.where("nondeterministic on GPU") == ["depthwise"]
    assert old.tf_version == "2.9"


@pytest.mark.parametrize("ops", ["auto", ["bincount", "sparse_dense_matmul", "resize_nearest_neighbor",
                                          "fused_batch_norm"]])
def test_ops_that_tfrepro_replaced_are_reported_as_handled(keras, tf, ops):
    with tfrepro.patched(0, ops=ops):  # "auto": patch()'s default
        diagnosis = tfrepro.diagnose(_risky_model(keras, tf), _data(tf), repeats=0)
    handled = {f.where: f for f in diagnosis.findings if f.severity == "handled"}
    assert {"counts", "graph_conv", "resize"} <= set(handled), str(diagnosis)
    assert "tfrepro.ops.bincount" in handled["counts"].finding and "raises on a GPU" in handled["counts"].finding
    assert not diagnosis.where("raises on GPU"), str(diagnosis)
    keras2 = _tf.keras_major(keras) < 3
    assert ("upsample" in handled) == keras2 and ("finetuned/bn" in handled) == keras2


def test_pipeline_risks_without_determinism(keras, tf):
    if _tf.op_determinism_enabled():
        pytest.skip("op determinism was left on in this process")
    from tfrepro.diagnosis.pipelines import pipeline_findings

    tf.random.set_seed(None)  # an earlier patch left TF's global seed set (TF cannot hand back "unset")
    unseeded = tf.data.Dataset.range(8).shuffle(8)
    racing = tf.data.Dataset.range(8).map(lambda v: v + tf.random.uniform([], 0, 3, tf.int64),
                                          num_parallel_calls=2, deterministic=False)
    options = tf.data.Options()
    options.deterministic = False
    relaxed = tf.data.Dataset.range(8).with_options(options)
    assert [f.finding.split(":")[0] for f in pipeline_findings(unseeded)] == ["unseeded shuffle"]
    racing_findings = {f.finding.split(" (")[0].split(":")[0] for f in pipeline_findings(racing)}
    assert racing_findings == {"runs in parallel with stateful random ops", "deterministic=False", "unseeded random ops"}
    assert all(f.severity == "risk" for f in pipeline_findings(racing))
    assert [f.where for f in pipeline_findings(relaxed)] == ["input pipeline: options"]
    seeded = tf.data.Dataset.range(8).shuffle(8, seed=1).map(lambda v: v + 1, num_parallel_calls=2)
    assert pipeline_findings(seeded) == []  # negative control


def test_the_scan_reaches_into_nested_functions_and_names_the_function(keras, tf):
    @tf.function
    def histogram(values):
        return tf.cast(tf.math.bincount(tf.cast(values * 4, tf.int32), minlength=5, maxlength=5, axis=-1), tf.float32)

    class Histogram(keras.layers.Layer):
        def call(self, inputs):
            counts = tf.cond(tf.reduce_sum(inputs) > -1.0, lambda: histogram(inputs), lambda: histogram(inputs + 0.0))
            return tf.reshape(counts, [-1, 5]) * inputs[:, :1]

    model = keras.Sequential([keras.Input((4,)), Histogram(name="histogram"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with tfrepro.patched(0, ops=False):
        diagnosis = tfrepro.diagnose(model, np.full((4, 4), 0.5, "float32"), np.ones((4, 1), "float32"), repeats=0)
    assert diagnosis.where("raises on GPU") == ["histogram"], str(diagnosis)


def test_xla_max_pool_backprop_is_named_for_a_jit_compiled_model(keras, tf):
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="conv"),
                              keras.layers.MaxPooling2D(2, name="pool"), keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    x, y = np.ones((4, 8, 8, 1), "float32"), np.ones((4, 1), "float32")
    with tfrepro.patched(0):
        xla = tfrepro.diagnose(model, x, y, repeats=2, tf_version="2.16")
        older = tfrepro.diagnose(model, x, y, repeats=0, tf_version="2.15")
    assert xla.where("raises on GPU") == ["pool"], str(xla)
    static = next(f for f in xla.findings if f.severity == "raises on GPU")
    assert static.details["op"].startswith("MaxPoolGrad") and "jit_compile=False" in static.fix
    if _tf.parse_version(tf.__version__) >= (2, 16):  # and it raises when it runs, on this CPU too
        ran = next(f for f in xla.findings if f.severity == "raises")
        assert ran.where == "pool" and "deterministic XLA implementation" in ran.finding, str(xla)
        assert ran.details["op"] == "MaxPoolGrad" and "jit_compile=False" in ran.fix
    assert "jit_compile" in _by_where(xla)["configuration"].finding
    assert not older.where("raises on GPU")
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)  # negative control: the same ops, no XLA
    with tfrepro.patched(0):
        plain = tfrepro.diagnose(model, x, y, repeats=0, tf_version="2.16")
    assert not plain.where("raises on GPU")


def test_configuration_risks_and_notes(keras, tf, monkeypatch):
    from tfrepro.diagnosis.scanning import config_findings

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    monkeypatch.setenv("TF_CUDNN_USE_AUTOTUNE", "0")
    with tfrepro.patched(0):
        found = config_findings(model)
    assert [f.finding.split(":")[0] for f in found if f.severity == "risk"] == ["TF_CUDNN_USE_AUTOTUNE=0"]
    monkeypatch.delenv("TF_CUDNN_USE_AUTOTUNE")
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        mixed = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    finally:
        keras.mixed_precision.set_global_policy(policy)
    with tfrepro.patched(0):
        found = config_findings(mixed)
    assert any(f.finding.startswith("mixed precision (mixed_float16)") and f.severity == "note" for f in found)
    assert not [f for f in found if f.severity == "risk"]


def test_unseeded_sample_from_datasets_is_a_risk_also_under_a_strategy(tf):
    from tfrepro.diagnosis.pipelines import pipeline_findings

    if _tf.op_determinism_enabled():
        pytest.skip("op determinism was left on in this process")
    tf.random.set_seed(None)
    sources = [tf.data.Dataset.range(4), tf.data.Dataset.range(4)]
    unseeded = tf.data.Dataset.sample_from_datasets(sources)
    found = pipeline_findings(unseeded, distributed=True)
    assert [f.where for f in found] == ["input pipeline: Dataset.random"]
    assert "sample_from_datasets" in found[0].finding and "every worker" in found[0].finding
    assert pipeline_findings(tf.data.Dataset.sample_from_datasets(sources, seed=1), distributed=True) == []


def test_keras_random_layers_and_nested_datasets_in_a_parallel_map_are_found(keras, tf):
    from tfrepro.diagnosis.pipelines import pipeline_findings

    flip = keras.layers.RandomFlip(seed=1)
    images = tf.data.Dataset.from_tensor_slices(tf.zeros([4, 8, 8, 3]))
    flipped = images.map(lambda image: flip(image), num_parallel_calls=2)
    found = pipeline_findings(flipped)
    assert [f.where for f in found] == ["input pipeline: map(lambda)"] and found[0].details["ops"], found

    def inner(_):
        return images.map(lambda image: tf.image.random_flip_left_right(image, seed=3), num_parallel_calls=2)

    nested = tf.data.Dataset.range(2).interleave(inner, cycle_length=1)
    assert [f.where for f in pipeline_findings(nested)] == ["input pipeline: map(lambda)"]  # the inner map, once


@pytest.mark.parametrize("wrap", ["numpy_function", "py_function"])
def test_python_in_the_step_is_a_risk_by_its_layer(wrap, keras, tf):
    """Op determinism does not reach arbitrary Python: the scan names it, even when it happens to be
    deterministic, since nothing but the Python itself decides that."""

    class Python(keras.layers.Layer):
        def call(self, inputs):
            shift = getattr(tf, wrap)(lambda: np.float32(0.0), [], tf.float32)
            return inputs + tf.reshape(shift, [])

    model = keras.Sequential([keras.Input((4,)), Python(name="python"), keras.layers.Dense(1, name="dense")])
    model.compile(optimizer="sgd", loss="mse")
    with tfrepro.patched(0):
        diagnosis = tfrepro.diagnose(model, np.ones((4, 4), "float32"), np.ones((4, 1), "float32"), repeats=0)
    assert diagnosis.where("risk") == ["python"], str(diagnosis)
    assert "op determinism does not cover" in _by_where(diagnosis)["python"].finding
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="dense")])  # negative control
    plain.compile(optimizer="sgd", loss="mse")
    with tfrepro.patched(0):
        assert tfrepro.diagnose(plain, np.ones((4, 4), "float32"), np.ones((4, 1), "float32"), repeats=0).clean


@pytest.mark.parametrize("version", ["9.9", "1.15", "3.0"])
def test_a_version_outside_the_table_is_refused_with_the_range(version, keras, tf):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match=r"outside the versions the kernel table covers \(TF 2\.0-2\.\d+\)"):
        tfrepro.diagnose(model, np.ones((4, 4), "float32"), np.ones((4, 1), "float32"), repeats=0,
                         tf_version=version)
