"""ReproCheckpoint captures every random state a model holds, or refuses it by name; a resume draws
nothing; it says what it loaded. In one process: the run is resumed from a middle checkpoint by a
new model of the same code, and must end on the uninterrupted run's bits."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

import tfrepro
from tfrepro.checkpointing import storage

pytestmark = pytest.mark.keras


def keras3(keras):
    return keras.__name__ == "keras" or getattr(keras, "__version__", "2").startswith("3")


def data(tf, n=64):
    x = np.linspace(0, 1, n * 4, dtype="float32").reshape(n, 4)
    y = (x.sum(axis=1) > 2).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=3, reshuffle_each_iteration=True).batch(8)


def classifier(keras, *middle):
    built = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), *middle,
                              keras.layers.Dense(2)])
    built.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return built


def resume_from_the_middle(tmp_path, make_model, fit_kwargs, state=lambda model: []):
    """Train 4 epochs with a checkpoint per epoch; train again from the end of epoch 2 with a new
    model. Returns (uninterrupted, resumed), each the bytes of its weights and of ``state(model)``."""
    import tensorflow as tf

    def run(folder):
        model = make_model()
        with tfrepro.patched(3):
            model.fit(**fit_kwargs(tf), epochs=4, verbose=0, callbacks=[tfrepro.ReproCheckpoint(folder, max_to_keep=9)])
        return [np.asarray(v.numpy()).tobytes() for v in [*model.weights, *state(model)]]

    whole = run(tmp_path / "whole")
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    for newer in storage.list_checkpoints(tmp_path / "resumed")[2:]:
        newer.unlink()
    return whole, run(tmp_path / "resumed")


def test_a_layer_owning_a_generator_and_a_plain_variable_resumes_bitwise(tmp_path, keras):
    import tensorflow as tf

    class Jitter(keras.layers.Layer):
        """Noise from its own tf.random.Generator, scaled by a plain tf.Variable it counts calls in:
        tf.train.Checkpoint tracks both; model.variables lists neither on Keras 3, nor the
        generator on Keras 2."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.generator = tf.random.Generator.from_seed(1)
            self.calls = tf.Variable(0.0, trainable=False)

        def call(self, x, training=None):
            self.calls.assign_add(1.0)
            return x + self.generator.normal(tf.shape(x)) * 0.1 / self.calls

    def make():
        return classifier(keras, Jitter(name="jitter"))

    def state(model):
        layer = model.get_layer("jitter")
        return [layer.generator.state, layer.calls]

    whole, resumed = resume_from_the_middle(tmp_path, make, lambda tf: {"x": data(tf)}, state)
    assert resumed == whole


@pytest.mark.parametrize("validation", [False, True], ids=["no validation", "validation_data"])
def test_a_vae_sampling_in_inference_too_resumes_bitwise(tmp_path, keras, validation):
    """The keras-io VAE: a custom train_step, no compiled loss, a Sampling layer that draws in every
    call (training or not), here from a Keras 3 SeedGenerator or, on Keras 2, a tf.random.Generator.
    Rebuilding the metrics on resume and replaying validation must not advance it."""
    import tensorflow as tf

    class Sampling(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            if keras3(keras):
                self.seed_generator = keras.random.SeedGenerator(1337)
            else:
                self.generator = tf.random.Generator.from_seed(1337)

        def call(self, inputs):
            z_mean, z_log_var = inputs
            if keras3(keras):
                epsilon = keras.random.normal(tf.shape(z_mean), seed=self.seed_generator)
            else:
                epsilon = self.generator.normal(tf.shape(z_mean))
            return z_mean + tf.exp(0.5 * z_log_var) * epsilon

    class VAE(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.hidden = keras.layers.Dense(8, activation="relu")
            self.mean, self.log_var = keras.layers.Dense(2), keras.layers.Dense(2)
            self.sampling = Sampling(name="sampling")
            self.decoder = keras.layers.Dense(4, activation="sigmoid")
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")

        @property
        def metrics(self):
            return [self.total_loss_tracker]

        def call(self, x, training=None):
            return self.decoder(self.sampling(self.encode(x)))

        def encode(self, x):
            h = self.hidden(x)
            return self.mean(h), self.log_var(h)

        def losses_of(self, x):
            z_mean, z_log_var = self.encode(x)
            reconstruction = self.decoder(self.sampling((z_mean, z_log_var)))
            reconstruction_loss = tf.reduce_mean(tf.reduce_sum(tf.square(x - reconstruction), axis=1))
            kl = -0.5 * (1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
            return reconstruction_loss + tf.reduce_mean(tf.reduce_sum(kl, axis=1))

        def train_step(self, x):
            with tf.GradientTape() as tape:
                total_loss = self.losses_of(x)
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.total_loss_tracker.update_state(total_loss)
            return {"loss": self.total_loss_tracker.result()}

        def test_step(self, x):
            self.total_loss_tracker.update_state(self.losses_of(x))
            return {"loss": self.total_loss_tracker.result()}

    def make():
        vae = VAE()
        # unbuilt: the train step's trace before the first batch builds it, then the resume restores it
        vae.compile(optimizer=keras.optimizers.Adam(1e-2))
        return vae

    def fit_kwargs(tf):
        x = np.linspace(0, 1, 48 * 4, dtype="float32").reshape(48, 4)
        batches = tf.data.Dataset.from_tensor_slices(x).batch(8)
        return {"x": batches, "validation_data": batches.take(2) if validation else None}

    def state(vae):
        sampling = vae.sampling
        return [sampling.seed_generator.state if keras3(keras) else sampling.generator.state]

    whole, resumed = resume_from_the_middle(tmp_path, make, fit_kwargs, state)
    assert resumed == whole


def test_compiled_metrics_rebuilt_on_resume_draw_nothing(tmp_path, keras):
    """Compiled metrics are built in the first training step, which a resume does not replay: they are
    built by calling the model in inference mode, where this layer draws too (Monte Carlo noise)."""
    import tensorflow as tf

    class Noise(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            if keras3(keras):
                self.seed_generator = keras.random.SeedGenerator(7)
            else:
                self.generator = tf.random.Generator.from_seed(7)

        def call(self, x, training=None):
            noise = keras.random.normal(tf.shape(x), seed=self.seed_generator) if keras3(keras) else \
                self.generator.normal(tf.shape(x))
            return x + 0.1 * noise

    def make():
        return classifier(keras, Noise(name="noise"))

    def state(model):
        layer = model.get_layer("noise")
        return [layer.seed_generator.state if keras3(keras) else layer.generator.state]

    whole, resumed = resume_from_the_middle(tmp_path, make, lambda tf: {"x": data(tf)}, state)
    assert resumed == whole


@pytest.mark.parametrize("draw, api", [
    ("normal", "tf.random.normal"),
    ("dropout", "tf.random.uniform"),  # tf.nn.dropout without a seed tensor: a RandomUniform kernel
    ("seeded", "tf.random.normal"),  # an op seed does not make the kernel's state checkpointable
])
def test_a_layer_calling_stateful_random_ops_is_refused_by_name(tmp_path, keras, draw, api):
    import tensorflow as tf

    class Noisy(keras.layers.Layer):
        def call(self, x, training=None):
            if draw == "dropout":
                return tf.nn.dropout(x, 0.2)
            return x + tf.random.normal(tf.shape(x), seed=4 if draw == "seeded" else None)

    model = classifier(keras, Noisy(name="noisy"))
    with pytest.raises(tfrepro.CheckpointError) as caught:
        model.fit(data(tf), epochs=2, verbose=0, callbacks=[tfrepro.ReproCheckpoint(tmp_path)])
    message = str(caught.value)
    assert "layer 'noisy'" in message and api in message and "stateless" in message
    assert int(model.optimizer.iterations.numpy()) == 0  # refused before the first step
    assert not list(tmp_path.iterdir())  # and no checkpoint that could not resume exactly


def test_a_custom_train_step_calling_stateful_random_ops_is_refused(tmp_path, keras):
    import tensorflow as tf

    class Noisy(keras.Sequential):
        def train_step(self, data):
            x, y = data
            return super().train_step((x + tf.random.uniform(tf.shape(x)), y))

    model = Noisy([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(tfrepro.CheckpointError, match="train_step calls tf.random.uniform"):
        model.fit(data(tf), epochs=1, verbose=0, callbacks=[tfrepro.ReproCheckpoint(tmp_path)])


def test_a_resume_says_what_it_loaded_and_prints_no_replayed_epoch(tmp_path, keras, caplog, capsys):
    import tensorflow as tf

    def replayed():  # a cache under the shuffle: not addressable by epoch, so the resume replays
        x = np.linspace(0, 1, 64 * 4, dtype="float32").reshape(64, 4)
        return tf.data.Dataset.from_tensor_slices((x, (x.sum(axis=1) > 2).astype("int64"))).cache().shuffle(64).batch(8)

    classifier(keras).fit(replayed(), epochs=2, verbose=0, callbacks=[tfrepro.ReproCheckpoint(tmp_path)])
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="tfrepro.checkpointing"):
        classifier(keras).fit(replayed(), epochs=3, verbose=2, callbacks=[tfrepro.ReproCheckpoint(tmp_path)])
    resumed = [r.getMessage() for r in caplog.records if "resumed" in r.getMessage()]
    assert resumed == [f"tfrepro: resumed from {tmp_path / 'ckpt-e000002-b00000000.npz'}: epoch 2, batch 0, "
                       "16 batches trained; replaying the input of the 2 epochs before: the training input: a "
                       "cache or snapshot keeps the first pass's elements, draws included"]
    printed = capsys.readouterr().out
    assert "Epoch 3/3" in printed and "Epoch 1/3" not in printed and "Epoch 2/3" not in printed
