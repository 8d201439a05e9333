"""patch(ops=...): every rebound name and internal call site, and Keras training on tfrepro.ops."""

import sys

import numpy as np
import pytest

import tfrepro
from tfrepro import _tf

from conftest import run_tfrepro

tf = _tf.import_tf()
from tfrepro import ops  # noqa: E402
from tfrepro.ops import rebinding, selection  # noqa: E402

# Stock float sums of [1e30, -1e30, 1] in this order give 1; the exact order-invariant sum gives 0
# (1 is below the quantum of a segment that holds 1e30, see tfrepro.ops._exact_sum).
ADVERSARIAL = tf.constant([[1e30], [-1e30], [1.0]], tf.float32)


def _current(target):
    owner, attribute = rebinding._owner(target)
    if "." in attribute:
        module_global, op = attribute.split(".")
        return getattr(getattr(owner, module_global), op)
    return getattr(owner, attribute)


def test_the_table_covers_exactly_the_documented_ops():
    assert tuple(rebinding.TABLE) == selection.REPLACEABLE_OPS


def _present(target):
    try:
        _current(target)
    except (AttributeError, ImportError):
        return False  # not in this TensorFlow version (rebind skips it too)
    return True


def test_patch_rebinds_every_target_and_unpatch_restores_them():
    all_targets = [t for _, targets in rebinding.TABLE.values() for t in rebinding._with_compat_v2(targets)]
    originals = {t: _current(t) for t in all_targets if _present(t)}
    assert len(originals) >= len(all_targets) - 3  # the few call sites older TF versions lack
    tfrepro.patch(0, ops=True)
    for name, (replacement, targets) in rebinding.TABLE.items():
        for target in rebinding._with_compat_v2(targets):
            if target in originals:
                assert _current(target) is replacement, target
    assert tfrepro.status()["op replacements"].value == f"{len(rebinding.TABLE)} ops from tfrepro.ops"
    tfrepro.patch(0, ops=["gather"])  # a different selection replaces the first
    assert tf.gather is ops.gather and tf.nn.bias_add is originals["tf.nn.bias_add"]
    tfrepro.unpatch()
    for target, original in originals.items():
        assert _current(target) is original, target


@pytest.mark.parametrize("bad, error", [("gather", TypeError), (["gather", "nope"], ValueError), (3, TypeError)])
def test_bad_ops_arguments(bad, error):
    with pytest.raises(error):
        tfrepro.patch(0, ops=bad)
    assert tf.gather is not ops.gather


def test_indexed_slices_are_densified_by_the_exact_sum():
    slices = tf.IndexedSlices(ADVERSARIAL, tf.constant([0, 0, 0]), tf.constant([2, 1]))
    assert tf.convert_to_tensor(slices).numpy()[0, 0] == 1.0  # negative control: TF's ordered float sum
    with tfrepro.patched(0, ops=["unsorted_segment_sum"]):
        assert tf.convert_to_tensor(slices).numpy()[0, 0] == 0.0


def test_gather_gradient_on_another_axis_goes_through_math_ops():
    params = tf.zeros([1, 2])

    def gradient():
        with tf.GradientTape() as tape:
            tape.watch(params)
            out = tf.gather(params, [0, 0, 0], axis=1)
        return tape.gradient(out, params, output_gradients=tf.reshape(ADVERSARIAL, [1, 3]))

    assert tf.convert_to_tensor(gradient()).numpy()[0, 0] == 1.0  # TF: math_ops.unsorted_segment_sum
    with tfrepro.patched(0, ops=["unsorted_segment_sum"]):
        assert tf.convert_to_tensor(gradient()).numpy()[0, 0] == 0.0


def test_tf_image_resize_and_crop_and_resize_reach_the_replacements(monkeypatch):
    calls = []
    for name in ("resize_nearest_neighbor", "crop_and_resize"):
        replacement, targets = rebinding.TABLE[name]

        def spy(*args, _name=name, _replacement=replacement, **kwargs):
            calls.append(_name)
            return _replacement(*args, **kwargs)

        monkeypatch.setitem(rebinding.TABLE, name, (spy, targets))
    images = tf.ones([1, 4, 4, 1])
    with tfrepro.patched(0, ops=["resize_nearest_neighbor", "crop_and_resize"]):
        tf.image.resize(images, [8, 8], method="nearest")
        tf.image.crop_and_resize(images, [[0.0, 0.0, 1.0, 1.0]], [0], [2, 2])
    assert calls == ["resize_nearest_neighbor", "crop_and_resize"]


def test_keras_training_reaches_the_replaced_ops(keras, monkeypatch):
    calls = {}
    for name in ("bias_add", "sparse_softmax_cross_entropy_with_logits", "softmax_cross_entropy_with_logits"):
        replacement, targets = rebinding.TABLE[name]

        def spy(*args, _name=name, _replacement=replacement, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _replacement(*args, **kwargs)

        monkeypatch.setitem(rebinding.TABLE, name, (spy, targets))
    x = np.random.RandomState(0).rand(32, 4).astype("float32")
    y = np.arange(32) % 3
    with tfrepro.patched(0, ops=True):
        for loss, labels in ((keras.losses.SparseCategoricalCrossentropy(from_logits=True), y),
                             (keras.losses.CategoricalCrossentropy(from_logits=True), np.eye(3)[y])):
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), keras.layers.Dense(3)])
            model.compile(optimizer="sgd", loss=loss)
            model.fit(x, labels, batch_size=8, epochs=1, verbose=0)
    assert set(calls) == {"bias_add", "sparse_softmax_cross_entropy_with_logits", "softmax_cross_entropy_with_logits"}


def _bag_of_words(keras, embedding_layer):
    class SumOverPositions(keras.layers.Layer):
        """Pools token embeddings with the order-invariant sum, so that position order cannot matter."""

        def call(self, inputs):
            return ops.reduce_sum(inputs, axis=1)

        def compute_output_shape(self, input_shape):
            return (input_shape[0], input_shape[2])

    return keras.Sequential([keras.Input((40,), dtype="int32"), embedding_layer, SumOverPositions(),
                             keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])


def test_embedding_model_trains_identically_across_runs(keras):
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, 30, size=(128, 40)).astype("int32")
    labels = rng.randint(0, 4, size=128)

    def train():
        model = _bag_of_words(keras, tfrepro.layers.Embedding(30, 8))
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(tokens, labels, batch_size=32, epochs=2, verbose=0)

    tfrepro.patch(3, ops=True)
    assert tfrepro.verify(train, runs=2, seed=3).identical


def test_embedding_gradient_is_bitwise_invariant_to_the_batch_layout(keras):
    rng = np.random.RandomState(1)
    tokens = rng.randint(0, 30, size=(64, 40)).astype("int32")  # many repeated ids per batch
    upstream = (rng.standard_normal((64, 40, 8)) * np.exp2(rng.randint(-12, 12, (64, 1, 1)))).astype("float32")
    order = rng.permutation(64)  # the same examples in another batch layout

    def table_gradient(layer, rows):
        layer.build((None, 40))
        with tf.GradientTape() as tape:
            out = layer(tokens[rows])
        gradient = tape.gradient(out, layer.trainable_weights[0], output_gradients=tf.constant(upstream[rows]))
        return np.asarray(tf.convert_to_tensor(gradient)).tobytes()

    ours = tfrepro.layers.Embedding(30, 8, embeddings_initializer=keras.initializers.RandomUniform(seed=1))
    stock = keras.layers.Embedding(30, 8, embeddings_initializer=keras.initializers.RandomUniform(seed=1))
    with tfrepro.patched(5, ops=True):
        assert table_gradient(ours, np.arange(64)) == table_gradient(ours, order)
    # Negative control: TF sums the repeated ids' gradients in batch order.
    assert table_gradient(stock, np.arange(64)) != table_gradient(stock, order)


def test_upsampling_dropin_matches_keras_and_trains(keras):
    images = np.random.RandomState(0).rand(4, 3, 5, 2).astype("float32")
    for data_format, data in (("channels_last", images), ("channels_first", images.transpose(0, 3, 1, 2))):
        ours = tfrepro.layers.UpSampling2D((2, 3), data_format=data_format)
        stock = keras.layers.UpSampling2D((2, 3), data_format=data_format)
        assert np.asarray(ours(data)).tobytes() == np.asarray(stock(data)).tobytes()

    def train():
        model = keras.Sequential([keras.Input((3, 5, 2)), tfrepro.layers.UpSampling2D(2), keras.layers.Conv2D(2, 3),
                                  keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(images, np.ones((4, 1)), batch_size=2, verbose=0)

    assert tfrepro.verify(train, runs=2).identical


def test_keras_bincount_and_category_encoding_work_and_agree_under_patch(keras):
    """Keras 3's TF backend calls tf.math.bincount(..., axis=-1); tf_keras's CategoryEncoding passes
    minlength, maxlength and binary_output: all reach tfrepro's bincount, with TF's results."""
    ids = np.array([[0, 1, 1, 3], [2, 2, 0, 1]], np.int32)
    layers = {mode: keras.layers.CategoryEncoding(num_tokens=5, output_mode=mode) for mode in ("count", "multi_hot")}

    def outputs():
        results = {mode: np.asarray(layer(ids)) for mode, layer in layers.items()}
        if hasattr(keras, "ops"):  # Keras 3
            results["ops.bincount"] = np.asarray(keras.ops.bincount(ids[0]))
            results["ops.bincount weights"] = np.asarray(keras.ops.bincount(ids, weights=np.ones((2, 4), "float32"),
                                                                              minlength=5))
        return results

    expected = outputs()
    calls = []
    original = ops.bincount
    tfrepro.patch(0, ops=["bincount"])
    try:
        for module in (tf.math, tf.compat.v2.math):
            assert module.bincount is original

        def spy(*args, **kwargs):
            calls.append(kwargs.get("axis"))
            return original(*args, **kwargs)

        for module in (tf.math, tf.compat.v2.math):
            module.bincount = spy
        patched = outputs()
    finally:
        tfrepro.unpatch()
    assert calls  # Keras reached tfrepro's bincount
    assert sorted(patched) == sorted(expected)
    for name in expected:
        assert patched[name].dtype == expected[name].dtype and patched[name].tobytes() == expected[name].tobytes()


def test_tfrepro_run_ops_flag_rebinds_in_an_unmodified_script():
    code = "import tensorflow as tf; print(tf.math.unsorted_segment_sum.__module__)"
    with_ops = run_tfrepro("run", "--ops", "--", sys.executable, "-c", code)
    without = run_tfrepro("run", "--", sys.executable, "-c", code)
    assert with_ops.returncode == 0, with_ops.stderr[-2000:]
    assert with_ops.stdout.strip().splitlines()[-1] == "tfrepro.ops.segment"
    assert without.stdout.strip().splitlines()[-1] != "tfrepro.ops.segment"


@pytest.mark.slow
def test_tfrepro_run_replaces_what_the_gpu_cannot_run_by_default_and_ops_none_nothing():
    code = "import tensorflow as tf; print(tf.math.bincount.__module__, tf.math.unsorted_segment_sum.__module__)"
    default = run_tfrepro("run", "--", sys.executable, "-c", code)
    none = run_tfrepro("run", "--no-ops", "--", sys.executable, "-c", code)
    assert default.returncode == 0 and none.returncode == 0, default.stderr[-2000:] + none.stderr[-2000:]
    bincount, segment_sum = default.stdout.split()[-2:]
    assert bincount == "tfrepro.ops.sparse" and not segment_sum.startswith("tfrepro")  # auto: only what raises
    assert not none.stdout.split()[-2].startswith("tfrepro")
    bad = run_tfrepro("run", "--ops", "--no-ops", "--", sys.executable, "-c", code)
    assert bad.returncode == 2 and "not allowed with argument" in bad.stderr and "Traceback" not in bad.stderr
    old_style = run_tfrepro("run", "--ops", sys.executable, "-c", code)  # no `--`: as before --no-ops existed
    assert old_style.returncode == 0 and old_style.stdout.split()[-1].startswith("tfrepro"), old_style.stderr[-2000:]
