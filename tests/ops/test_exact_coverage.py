"""The exact tier's audit (``tfrepro.ops.exact.coverage``): under ``patch(ops="exact")`` every traced
step is covered, or the ops that are not are named (op, layer, axes) before its first step runs.
The models covered end to end (the MNIST CNN across threads, oneDNN, XLA and replicas) are audited
clean in ``test_exact_training.py``, whose runs would raise otherwise."""

import os
import re
import warnings

import numpy as np
import pytest

import tfrepro
from tfrepro import _tf

tf = _tf.import_tf()
from tfrepro.ops.exact import _fixed, coverage  # noqa: E402

RNG = np.random.default_rng(0)
X = RNG.standard_normal((32, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 32)


def _weights(model) -> list[bytes]:
    return [np.asarray(w).tobytes() for w in model.get_weights()]


def _planted(keras, op):
    """An MLP with ``op`` in a layer named "planted" between its Dense layers."""
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    planted = keras.layers.Lambda(op, name="planted")(hidden)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(planted))


def _fit(model, **compile_args):
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), **compile_args)
    return model.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0)


def test_a_planted_op_is_named_with_its_layer_and_axes_before_the_first_step(keras):
    with tfrepro.patched(0, ops="exact"):
        model = _planted(keras, lambda h: tf.math.cumsum(h, axis=-1))
        before = _weights(model)
        with pytest.raises(tfrepro.UncoveredOpError) as raised:
            _fit(model)
        assert int(model.optimizer.iterations.numpy()) == 0 and _weights(model) == before  # no step ran
        forward, backward = sorted((u for u in raised.value.uncovered if u.op == "Cumsum"), key=lambda u: u.layer)
        assert re.fullmatch(r"\S*/planted(_\d+)?", forward.layer) and forward.layer + " (gradient)" == backward.layer
        assert forward.axes == ("threads", "XLA", "replicas")
        assert "Cumsum in " in str(raised.value) and "planted" in str(raised.value)
        assert "on_uncovered='warn'" in str(raised.value)
        assert tfrepro.status()["exact audit"].ok is False


def test_on_uncovered_warn_names_the_op_and_trains(keras):
    with tfrepro.patched(0, ops="exact", on_uncovered="warn"):
        model = _planted(keras, lambda h: tf.math.cumsum(h, axis=-1))
        with pytest.warns(tfrepro.ReproducibilityWarning, match=r"Cumsum in \S*planted"):
            _fit(model)
        assert int(model.optimizer.iterations.numpy()) == 2
        assert "Cumsum" in tfrepro.status()["exact audit"].value


def test_a_multiply_feeding_an_add_is_named_for_xla_alone(keras):
    """XLA may fuse ``h * 3 + 1`` into one FMA (one rounding, not two): named, for XLA only."""
    with tfrepro.patched(0, ops="exact"):
        with pytest.raises(tfrepro.UncoveredOpError) as raised:
            _fit(_planted(keras, lambda h: h * 3.0 + 1.0))
    [fused] = [u for u in raised.value.uncovered if re.fullmatch(r"\S*/planted(_\d+)?", u.layer)]
    assert (fused.op, fused.axes) == ("AddV2", ("XLA",)) and "FMA" in fused.why


def test_covered_steps_pass_and_integer_data_movement_and_pipeline_ops_are_not_named(keras):
    """Relu, a multiply alone, integer arithmetic and a tf.data map's own ops are exact: the step
    trains with nothing named (the pipeline's cumsum runs outside XLA and oneDNN, element by element)."""
    def exact_things(h):
        order = tf.argsort(tf.cast(tf.range(8), tf.int32) * 5 % 8)
        return tf.gather(tf.nn.relu(h) * 2.0, order, axis=-1)

    data = tf.data.Dataset.from_tensor_slices((X, Y)).map(lambda x, y: (tf.math.cumsum(x), y)).batch(16)
    with tfrepro.patched(0, ops="exact"):
        model = _planted(keras, exact_things)
        _fit(model)
        model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(data, epochs=1, verbose=0)
        audit = tfrepro.status()["exact audit"]
        assert audit.ok is True and "every op covered" in audit.value


def test_an_op_is_named_only_where_its_result_is_used(keras):
    """An op whose result reaches neither the step's outputs nor a state update changes no bit of
    what training returns or keeps: a sine computed and thrown away is not named; used, it is."""
    with tfrepro.patched(0, ops="exact"):
        model = _planted(keras, lambda h: (tf.math.sin(h), h)[1])
        _fit(model)
        assert int(model.optimizer.iterations.numpy()) == 2
        with pytest.raises(tfrepro.UncoveredOpError, match=r"Sin in \S*planted"):
            _fit(_planted(keras, tf.math.sin))


def test_a_softmax_and_the_accuracy_metric_reading_it_are_covered(keras):
    """The exact tier's softmax (``tfrepro.ops.exact.activations``): a softmax between Dense layers
    and an output softmax that an accuracy metric reads train with nothing named."""
    with tfrepro.patched(0, ops="exact"):
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(8, activation="softmax")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="probs")(hidden))
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        model.fit(X, Y, batch_size=16, epochs=1, verbose=0)
        assert tfrepro.status()["exact audit"].ok is True


def test_a_custom_tf_function_training_loop_is_audited_too():
    weights = tf.Variable(tf.ones((6, 3)))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.math.sin(tf.matmul(x, weights)))
        weights.assign_sub(0.1 * tape.gradient(loss, weights))
        return loss

    with tfrepro.patched(0, ops="exact"):
        with pytest.raises(tfrepro.UncoveredOpError, match="Sin in the step"):
            step(tf.constant(X))


def test_fit_run_eagerly_is_refused_for_it_escapes_the_audit(keras):
    with tfrepro.patched(0, ops="exact"):
        model = _planted(keras, tf.math.sin)
        model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
        with pytest.raises(tfrepro.UncoveredOpError, match="run_eagerly"):
            model.fit(X, X[:, :3], epochs=1, verbose=0)
        assert int(model.optimizer.iterations.numpy()) == 0


def test_on_uncovered_is_validated():
    with pytest.raises(ValueError, match="on_uncovered must be one of 'raise', 'warn'; got 'banana'"):
        tfrepro.patch(0, ops="exact", on_uncovered="banana")


def test_the_classification_of_ops():
    floats, ints = tf.float32.as_datatype_enum, tf.int64.as_datatype_enum
    assert coverage.classify("Reshape", floats, False) is None
    assert coverage.classify("Sum", ints, False) is None  # integer sums are exact in any order
    assert coverage.classify("Sum", floats, False)[0] == ("threads", "XLA", "replicas")
    assert coverage.classify("MatMul", floats, False)[0] == coverage.AXES
    assert coverage.classify("Tanh", floats, False)[0] == ("oneDNN", "XLA")
    assert coverage.classify("AddV2", floats, False) is None
    assert coverage.classify("AddV2", floats, True)[0] == ("XLA",)
    assert coverage.classify("SomeNewOp", floats, False)[0] == coverage.AXES  # unknown: every axis


def _named(function, *specs) -> dict[str, tuple[str, ...]]:
    """The ops the audit names in ``function`` traced for ``specs``: op -> axes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the audit of a patched trace warns (on_uncovered="warn")
        graph = tf.function(function, autograph=False).get_concrete_function(*specs).graph
    return {u.op: u.axes for u in coverage.audit_graph(graph)}


FLOATS = tf.TensorSpec((4, 3), tf.float32)


@tf.function(autograph=False)
def _tripled(x):
    return x * 3.0


@tf.function(autograph=False)
def _added(x, y):
    return x + y


FMA_ESCAPES = {  # a multiply that reaches an add past something XLA looks through
    "through a negation": lambda x: -(x * x) + 1.0,
    "through IdentityN": lambda x: tf.identity_n([x * 3.0, x])[0] + 1.0,
    "of a squared difference": lambda x: tf.math.squared_difference(x, 1.0) + 1.0,
    "out of a nested function": lambda x: _tripled(x) + 1.0,
    "into a nested function": lambda x: _added(x * 3.0, x),
    "through a transpose": lambda x: tf.transpose(x * 3.0) + 1.0,
    "through a slice": lambda x: (x * 3.0)[:, :2] + 1.0,
    "through a gather": lambda x: tf.gather(x * 3.0, [1, 0]) + 1.0,
    "through a tile": lambda x: tf.tile(x * 3.0, [2, 1]) + 1.0,
    "through a concatenation": lambda x: tf.concat([x, x * 3.0], 0) + 1.0,
    "through a select": lambda x: tf.where(x > 0, x * 3.0, x) + 1.0,
    # XLA inlines a loop it unrolls (a one-step RNN) and a condition whose predicate it knows
    "out of a loop": lambda x: tf.while_loop(lambda i, v: i < 1, lambda i, v: (i + 1, v * 3.0), [0, x])[1] + 1.0,
    "out of a condition": lambda x: tf.cond(x[0, 0] > 0.0, lambda: x * 3.0, lambda: x) + 1.0,
    "carried round a loop": lambda x: tf.while_loop(lambda i, p, s: i < 2, lambda i, p, s: (i + 1, x * 3.0, s + p),
                                                    [0, x, x])[2],
}
LOOPS_WITHOUT_A_PRODUCT = {  # the loop's results and its initial values followed, nothing made up
    "a loop that adds": lambda x: tf.while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, v + x), [0, x])[1] + 1.0,
    "a condition that adds": lambda x: tf.cond(x[0, 0] > 0.0, lambda: x + 3.0, lambda: x) + x,
}


@pytest.mark.parametrize("case", FMA_ESCAPES)
def test_a_multiply_add_is_named_whatever_lies_between_them(case):
    assert _named(FMA_ESCAPES[case], FLOATS) == {"AddV2": ("XLA",)}


@pytest.mark.parametrize("case", LOOPS_WITHOUT_A_PRODUCT)
def test_an_add_of_a_loops_or_conditions_sum_is_not_named(case):
    assert _named(LOOPS_WITHOUT_A_PRODUCT[case], FLOATS) == {}


def test_the_tiers_own_add_of_a_users_product_is_named():
    with tfrepro.patched(0, ops="exact", on_uncovered="warn"):
        assert _named(lambda x: tf.nn.bias_add(x * 3.0, tf.ones(3)), FLOATS) == {"BiasAdd": ("XLA",)}
        assert _named(lambda x: tf.nn.bias_add(x, tf.ones(3)) + 1.0, FLOATS) == {}


NOT_EXACT = {  # op -> a function whose op gives other bits on some axis, and one whose op does not
    "Reciprocal": (tf.math.reciprocal, None),
    "Max": (lambda x: tf.reduce_max(x, 0), lambda x: tf.reduce_max(tf.cast(x, tf.int32), 0)),  # -0/+0, NaNs
    "Cast": (lambda x: tf.cast(x * 2.0, tf.int32), lambda x: tf.cast(x, tf.int32)),  # NaN: input data taken as is
    "ResizeBilinear": (lambda x: tf.image.resize(tf.cast(x, tf.uint8)[None, :, :, None], (8, 6)), None),  # float out
    "RealDiv": (lambda x: x / 3.0, lambda x: x / 4.0),  # XLA: x * (1 / 3); a quarter is exact
    "AddV2": (lambda x: (x + 0.7) + 1.3, lambda x: (x + x) + 1.3),  # XLA: x + (0.7 + 1.3)
    "Mul": (lambda x: (x * 0.7) * 1.3, lambda x: (x * 0.7) * 0.5),  # times a power of two: one rounding either way
}


@pytest.mark.parametrize("op", NOT_EXACT)
def test_ops_exact_only_on_some_inputs_are_named(op):
    named, exact = NOT_EXACT[op]
    assert op in _named(named, FLOATS)
    if exact is not None:
        assert _named(exact, FLOATS) == {}


def test_a_division_is_named_where_xla_rewrites_it():
    """XLA knows a count from shapes, turns A / sqrt(B) into A * rsqrt(B) and (A / B) / C into
    A / (B * C); a divisor known only at run time (a variable, the data) it leaves alone."""
    weight = tf.Variable(2.5)
    for rewritten in (lambda x: x / tf.cast(tf.size(x), tf.float32), lambda x: x / tf.sqrt(x),
                      lambda x: (x / x[0]) / x[1]):
        assert _named(rewritten, FLOATS) == {"RealDiv": ("XLA",)}
    assert _named(lambda x: x / weight, FLOATS) == {}
    assert _named(lambda x: x / x[0], FLOATS) == {}


def test_a_sum_of_two_replicas_values_is_named_unless_each_is_replica_global():
    """A strategy that sums replicas' values with AddN (``ReductionToOneDevice``) sums values built
    on two devices: named for the replicas axis, unless every value is one of the tier's
    replica-global ones (whole on the first replica, zero elsewhere)."""
    def summed(x, replica_global):
        parts = []
        for device in ("/cpu:0", "/cpu:1"):
            with tf.device(device):
                with tf.name_scope(_fixed.REPLICA_GLOBAL if replica_global else "replica"):
                    parts.append(tf.identity(x + 1.0))
        return tf.add_n(parts)

    assert _named(lambda x: summed(x, False), FLOATS) == {"AddN": ("replicas",)}
    assert _named(lambda x: summed(x, True), FLOATS) == {}


def test_trust_comes_from_the_tiers_scope_not_a_functions_name():
    """A user's function named like tfrepro's is audited as any other; the tier's fallback to TF's
    kernel (float64, which it does not cover) is audited as TF's."""
    def tfrepro_step(x):
        return tf.math.sin(x)

    @tf.function
    def my_tfrepro_helper(x):
        return tf.math.sin(x)

    with tfrepro.patched(0, ops="exact"):
        with pytest.raises(tfrepro.UncoveredOpError, match="Sin in the step"):
            tf.function(tfrepro_step)(tf.constant(X))
        with pytest.raises(tfrepro.UncoveredOpError, match="Sin in the step"):
            tf.function(lambda x: my_tfrepro_helper(x) + 1.0)(tf.constant(X))
        with pytest.raises(tfrepro.UncoveredOpError, match="MatMul in the step"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tier warns that float64 runs TF's kernel
            tf.function(lambda x: tf.matmul(x, x, transpose_b=True))(tf.constant(X, tf.float64))


def test_tfs_automatic_gradient_of_a_tier_op_is_audited():
    """Inside a gradient, the forward op's scope is part of every name: only the ops the tier's own
    gradient functions build are trusted, not TF's gradient of an op in the tier's scope."""
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            with tf.name_scope(coverage.MARK):  # as if the tier had built a tanh
                y = tf.tanh(x)
        return tape.gradient(y, x)

    assert set(_named(step, FLOATS)) == {"TanhGrad"}


def test_a_gradient_under_a_name_scope_and_a_second_order_gradient_are_audited_at_their_own_depth():
    """``tf.gradients`` under a name scope (``train/gradients/...``) is a gradient too; in a second-order
    gradient, TF's gradient of the tier's first-order ops is audited, not trusted by their mark."""
    def scoped(x):
        with tf.name_scope(coverage.MARK):
            y = tf.tanh(x)
        with tf.name_scope("train"):
            return tf.gradients(y, x)[0]

    assert set(_named(scoped, FLOATS)) == {"TanhGrad"}

    def first_order(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = _tier_op(x)
        return tape.gradient(y, x, output_gradients=x)

    def second_order(x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            first = first_order(x)
        return outer.gradient(first, x)

    assert _named(first_order, FLOATS) == {}
    assert set(_named(second_order, FLOATS)) == {"TanhGrad"}


@_fixed.custom_gradient
def _tier_op(v):  # as if the tier had built it: its gradient function's tanh carries the tier's mark
    return tf.identity(v), tf.tanh


def test_the_tiers_mean_and_dropout_and_their_gradients_are_covered():
    with tfrepro.patched(0, ops="exact"):
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.reduce_mean(tf.nn.experimental.stateless_dropout(x, 0.5, seed=[1, 2]) + x, axis=1)
            return y, tape.gradient(y, x)

        assert _named(step, FLOATS) == {}


KERAS2 = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
NAMED = {"transformer": (), "autoencoder": (), "resnet": (),  # what the refusal names, one at least; () where covered
         "lstm": ("standard_lstm",) if KERAS2 else (), "gru": ("gru",) if KERAS2 else ()}  # tf-keras's own steps


@pytest.mark.parametrize("family", NAMED)
def test_the_common_model_families_are_covered_or_refused_by_name_before_the_first_step(keras, family):
    """What the exact tier does not cover yet in the model families of issue #33 (tf-keras's LSTM and
    GRU) is named before any step; the Transformer classifier, the ResNet (BatchNormalization, an overlapping
    max pool), Keras 3's LSTM and GRU and the convolutional autoencoder (transposed convolutions) are covered (as is the MLP with a softmax: ``test_exact_training.py`` trains them across the axes;
    docs/explanation/exact-tier.md)."""
    layers = keras.layers
    built = []

    def build_and_fit():
        if family == "transformer":
            tokens = keras.Input((8,), dtype="int32")
            x = layers.Embedding(20, 16)(tokens)
            x = layers.LayerNormalization()(x + layers.MultiHeadAttention(2, 8)(x, x))
            outputs = layers.Dense(2)(layers.GlobalAveragePooling1D()(x))
            data = (RNG.integers(0, 20, (16, 8)), RNG.integers(0, 2, 16))
        elif family == "resnet":
            tokens = keras.Input((8, 8, 3))
            x = layers.BatchNormalization()(layers.Conv2D(4, 3, padding="same")(tokens))
            x = layers.MaxPooling2D(3, strides=2, padding="same")(layers.Add()([x, layers.Conv2D(4, 1)(tokens)]))
            outputs = layers.Dense(2)(layers.GlobalAveragePooling2D()(x))
            data = (RNG.standard_normal((16, 8, 8, 3)).astype(np.float32), RNG.integers(0, 2, 16))
        elif family in ("lstm", "gru"):
            tokens = keras.Input((5, 3))
            outputs = layers.Dense(2)((layers.LSTM if family == "lstm" else layers.GRU)(4)(tokens))
            data = (RNG.standard_normal((16, 5, 3)).astype(np.float32), RNG.integers(0, 2, 16))
        else:
            tokens = keras.Input((8, 8, 1))
            x = layers.Conv2D(2, 3, strides=2, padding="same")(tokens)
            outputs = layers.Conv2DTranspose(1, 3, strides=2, padding="same")(x)
            data = (RNG.standard_normal((16, 8, 8, 1)).astype(np.float32),) * 2
        model = keras.Model(tokens, outputs)
        built.append(model)
        model.compile(optimizer="adam", loss="mse" if family == "autoencoder" else
                      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(*data, batch_size=8, epochs=1, verbose=0)

    if not NAMED[family]:
        with tfrepro.patched(0, ops="exact"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build_and_fit()
            assert "every op covered" in str(tfrepro.status())
        assert int(built[0].optimizer.iterations.numpy()) == 2
        return
    # Keras 2 calls layers as the model is built, so its refusals come then (wrapped in its RuntimeError)
    with tfrepro.patched(0, ops="exact"), pytest.raises((NotImplementedError, RuntimeError)) as raised, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_and_fit()
    assert "tfrepro exact tier" in str(raised.value)
    assert any(name in str(raised.value) for name in NAMED[family]), str(raised.value)[:2000]
    assert not built or int(built[0].optimizer.iterations.numpy()) == 0
