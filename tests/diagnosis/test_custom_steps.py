"""``tfrepro.diagnose`` sees what ``tfrepro check`` sees: it runs the model's own ``train_step`` (custom
steps, metrics, non-trainable updates, steps that take ``x`` alone or compile without a loss), blames
the layer that made a varying integer tensor, and leaves every tracked variable, RNG and dataset as it
found them. Real Keras (3 here, 2 on the tf-keras leg), real TensorFlow."""

import numpy as np
import pytest

import tfrepro
from nondeterminism import _random_noise, _random_order, make_layers

pytestmark = [pytest.mark.keras]

RNG = np.random.default_rng(1)
X = RNG.random((32, 6)).astype("float32")
Y = RNG.random((32, 3)).astype("float32")


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


def _functional(keras, model_class, middle):
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh", name="first")(inputs)
    return model_class(inputs, keras.layers.Dense(3, name="last")(middle(hidden)))


def _custom_model_class(keras, tf, perturb_gradients=False):
    """The keras-io "customizing what happens in fit" step: its own loss, tape, update and tracker."""

    class Custom(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.tracker = keras.metrics.Mean(name="loss")

        @property
        def metrics(self):
            return [self.tracker]

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(y - self(x, training=True)))
            gradients = tape.gradient(loss, self.trainable_variables)
            if perturb_gradients:  # the step's own code makes them vary, not any layer
                gradients = [g + tf.reshape(tf.numpy_function(_random_noise, [tf.shape(g)], tf.float32), tf.shape(g))
                             for g in gradients]
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

    return Custom


def test_a_custom_train_step_is_run_as_written_and_the_layer_is_named(keras, tf):
    dense, _ = make_layers(keras, tf)
    with tfrepro.patched(0):
        model = _functional(keras, _custom_model_class(keras, tf), dense(5, name="culprit"))
        model.compile(optimizer="adam")
        diagnosis = tfrepro.diagnose(model, X, Y)
    assert diagnosis.where("nondeterministic") == ["culprit"], str(diagnosis)
    assert diagnosis.first_nondeterministic.details["phase"] == "backward"
    assert "first" not in diagnosis.where(), str(diagnosis)  # the gradient it passes back is deterministic


def test_gradients_changed_by_the_steps_own_code_are_named_as_the_train_step(keras, tf):
    with tfrepro.patched(0):
        model = _functional(keras, _custom_model_class(keras, tf, perturb_gradients=True),
                            keras.layers.Dense(5, name="middle"))
        model.compile(optimizer="adam")
        diagnosis = tfrepro.diagnose(model, X, Y)
    assert diagnosis.where("nondeterministic") == ["train step"], str(diagnosis)
    assert "tape computed them identically" in diagnosis.first_nondeterministic.finding
    assert not {"first", "middle", "last"} & set(diagnosis.where()), str(diagnosis)


def test_a_nondeterministic_metric_is_named(keras, tf):
    class Noisy(keras.metrics.Mean):
        def update_state(self, y_true, y_pred, sample_weight=None):
            noise = tf.numpy_function(_random_noise, [tf.constant([1])], tf.float32)
            return super().update_state(tf.reduce_mean(y_pred) + tf.reduce_sum(noise))

    with tfrepro.patched(0):
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, name="dense")])
        model.compile(optimizer="adam", loss="mse", metrics=[Noisy(name="noisy")])
        diagnosis = tfrepro.diagnose(model, X, Y)
    assert diagnosis.where("nondeterministic") == ["metric: noisy"], str(diagnosis)
    assert "dense" not in diagnosis.where(), str(diagnosis)


def test_a_nondeterministic_update_of_a_non_trainable_weight_is_named(keras, tf):
    class RunningSum(keras.layers.Layer):
        """Keeps a running statistic, as BatchNormalization does, summed in an order from OS entropy."""

        def build(self, input_shape):
            self.moving = self.add_weight(name="moving", shape=(int(input_shape[-1]),), initializer="zeros",
                                          trainable=False)

        def call(self, inputs, training=None):
            if training:
                order = tf.numpy_function(_random_order, [tf.shape(inputs)[0]], tf.int32)
                shuffled = tf.gather(inputs, tf.reshape(order, tf.shape(inputs)[:1]))
                self.moving.assign(0.9 * self.moving + 0.1 * tf.scan(lambda acc, row: acc + row, shuffled)[-1])
            return inputs

    with tfrepro.patched(0):
        model = _functional(keras, keras.Model, RunningSum(name="stat"))
        model.compile(optimizer="adam", loss="mse")
        diagnosis = tfrepro.diagnose(model, X, Y)
    assert diagnosis.where("nondeterministic") == ["stat"], str(diagnosis)
    assert "moving" in diagnosis.first_nondeterministic.finding
    assert "last" not in diagnosis.where() and "loss" not in diagnosis.where(), str(diagnosis)


def test_an_integer_tensor_that_varies_blames_the_layer_that_made_it(keras, tf):
    class MaskTokens(keras.layers.Layer):
        """BERT-style masking: about 15% of the token ids become 0, chosen from OS entropy."""

        def call(self, ids):
            keep = tf.numpy_function(lambda n: np.random.default_rng().random(int(n)) > 0.15, [tf.size(ids)], tf.bool)
            return tf.where(tf.reshape(keep, tf.shape(ids)), ids, tf.zeros_like(ids))

    with tfrepro.patched(0):
        tokens = keras.Input((6,), dtype="int32")
        embedded = keras.layers.Embedding(10, 4, name="embedding")(MaskTokens(name="masking")(tokens))
        model = keras.Model(tokens, keras.layers.Dense(3, name="last")(keras.layers.Flatten(name="flat")(embedded)))
        model.compile(optimizer="adam", loss="mse")
        diagnosis = tfrepro.diagnose(model, RNG.integers(1, 10, (32, 6)).astype("int32"), Y)
    assert diagnosis.where("nondeterministic") == ["masking"], str(diagnosis)
    assert diagnosis.first_nondeterministic.details["phase"] == "forward"
    assert "embedding" in diagnosis.where("downstream"), str(diagnosis)


def test_a_seeded_generator_and_a_plain_variable_come_back_bit_for_bit(keras, tf):
    class Jitter(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.generator = tf.random.Generator.from_seed(1234)
            self.calls = tf.Variable(0, trainable=False, name="calls")

        def call(self, inputs):
            self.calls.assign_add(1)
            return inputs + 1e-3 * self.generator.normal(tf.shape(inputs))

    with tfrepro.patched(0):
        jitter = Jitter(name="jitter")
        model = _functional(keras, keras.Model, jitter)
        model.compile(optimizer="adam", loss="mse")
        before = (jitter.generator.state.numpy().tobytes(), jitter.calls.numpy().tobytes())
        rng_before = tfrepro.rng_state()
        diagnosis = tfrepro.diagnose(model, X, Y)
        after = (jitter.generator.state.numpy().tobytes(), jitter.calls.numpy().tobytes())
        assert tfrepro.rng_state() == rng_before
    assert diagnosis.clean, str(diagnosis)  # the generator restarts from its state in each repeat
    assert after == before


def test_diagnosing_a_dataset_leaves_the_training_that_follows_unchanged(keras, tf):
    def dataset():
        data = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(32, seed=1)  # reshuffles each iteration
        draws = tf.data.Dataset.random(seed=2, rerandomize_each_iteration=True)
        return tf.data.Dataset.zip((data, draws)).map(
            lambda pair, draw: (pair[0] + tf.cast(draw % 7, tf.float32), pair[1])).batch(8)

    def epochs(ds):
        return [[x.numpy().tobytes() for x, _ in ds] for _ in range(2)]

    with tfrepro.patched(0):
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        model.compile(optimizer="adam", loss="mse")
        diagnosed, untouched = dataset(), dataset()
        diagnosis = tfrepro.diagnose(model, diagnosed)
    assert diagnosis.clean, str(diagnosis)
    assert epochs(diagnosed) == epochs(untouched)


def _reconstruction_model(keras, tf, middle):
    """The keras-io VAE/GAN pattern: no call, no compiled loss, a train_step that receives x alone."""

    class Reconstruct(keras.Model):
        def __init__(self):
            super().__init__(name="reconstruct")
            self.encoder = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="encode"), middle],
                                            name="encoder")
            self.decoder = keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, name="decode")], name="decoder")
            self.tracker = keras.metrics.Mean(name="reconstruction")

        @property
        def metrics(self):
            return [self.tracker]

        def train_step(self, x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(x - self.decoder(self.encoder(x, training=True), training=True)))
            variables = self.encoder.trainable_weights + self.decoder.trainable_weights
            self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            self.tracker.update_state(loss)
            return {"reconstruction": self.tracker.result()}

    model = Reconstruct()
    model.compile(optimizer="adam")
    return model


@pytest.mark.parametrize("source", ["arrays", "dataset"])
def test_a_step_that_takes_x_alone_without_a_compiled_loss_is_diagnosed(source, keras, tf):
    dense, _ = make_layers(keras, tf)
    data = X if source == "arrays" else tf.data.Dataset.from_tensor_slices(X).batch(16)
    with tfrepro.patched(0):
        diagnosis = tfrepro.diagnose(_reconstruction_model(keras, tf, dense(5, name="culprit")), data)
        clean = tfrepro.diagnose(_reconstruction_model(keras, tf, dense(5, shuffle=False, name="twin")), data)
    assert diagnosis.where("nondeterministic") == ["encoder/culprit"], str(diagnosis)
    assert clean.clean, str(clean)


def test_a_cell_called_inside_a_loop_is_compared_through_its_layer(keras, tf):
    """An RNN calls its cell inside a while loop, out of the step's reach: the RNN's own call covers it."""
    with tfrepro.patched(0):
        model = keras.Sequential([keras.Input((4, 6)), keras.layers.SimpleRNN(5, name="rnn"),
                                  keras.layers.Dense(3, name="last")])
        model.compile(optimizer="adam", loss="mse")
        diagnosis = tfrepro.diagnose(model, RNG.random((8, 4, 6)).astype("float32"), Y[:8])
    assert diagnosis.clean, str(diagnosis)


def test_layers_out_of_reach_are_reported_as_not_examined(keras, tf):
    """A train_step that is a tf.function of its own runs its layers in a graph the repeats cannot read:
    the step's results are still compared, but the diagnosis does not say clean."""
    Custom = _custom_model_class(keras, tf)

    class Compiled(Custom):
        @tf.function
        def train_step(self, data):
            return super().train_step(data)

    with tfrepro.patched(0):
        model = _functional(keras, Compiled, keras.layers.Dense(5, name="middle"))
        model.compile(optimizer="adam")
        diagnosis = tfrepro.diagnose(model, X, Y)
    assert not diagnosis.clean and not diagnosis.problems, str(diagnosis)
    assert diagnosis.where("not examined") == ["train step"], str(diagnosis)
    assert diagnosis.summary().startswith("no problem found in what was examined")
