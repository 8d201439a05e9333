"""The conformance zoo: model patterns as users write them, each a small training run.

    python zoo.py PATTERN|all [--epochs E]

It never calls ``tfrepro.patch`` unless ``ZOO_INSCRIPT_SEED`` is set (then ``tfrepro.patch(S)`` is
its first line; ``ZOO_INSCRIPT_INIT`` its ``init=``). After training it appends one JSON line to the file ``ZOO_RESULTS`` names: the
pattern, a SHA-256 of every variable the run trained (model and optimizer), and one draw each from
Python's, NumPy's and TensorFlow's global RNGs, so two runs agree only if they computed the same.
``ZOO_PLANT=1`` inserts a layer named ``culprit`` whose kernel gradient gets noise from OS entropy
(a CPU stand-in for GPU atomics). ``ZOO_KILL_AT=N`` kills the process with SIGKILL
after the N-th optimizer step; ``ZOO_SKIP=a,b`` leaves patterns out of ``all``; ``ZOO_RESET=S`` clears
Keras's state and seeds every RNG with S (``tfrepro.seed_everything``) before each pattern but the
process's first (whose state is the launcher's seeding), so that a pattern computes the same in
``all`` as alone. Each pattern builds its model the way the keras-io examples do.
``ZOO_FIRST_IMPORT=keras`` makes Keras (tf_keras under ``TF_USE_LEGACY_KERAS=1``) the process's first
import, before TensorFlow. ``ZOO_STRATEGY=multi-worker`` builds and trains every ``fit`` pattern in the scope of a
``MultiWorkerMirroredStrategy`` over the ``TF_CONFIG`` cluster (the custom loops, which do not call
``strategy.run``, train outside it); each result line then names its worker.
"""

import os

if os.environ.get("ZOO_FIRST_IMPORT") == "keras":  # Keras first, as keras-io's scripts begin (`import keras`)
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        import tf_keras  # noqa: F401
    else:
        import keras  # noqa: F401

if os.environ.get("ZOO_INSCRIPT_SEED"):
    import tfrepro

    tfrepro.patch(int(os.environ["ZOO_INSCRIPT_SEED"]), init=os.environ.get("ZOO_INSCRIPT_INIT", "order"))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    import tf_keras as keras
else:
    import keras

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for nondeterminism.py
from nondeterminism import make_noisy_gradient_dense  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_patterns  # noqa: E402

KERAS3 = int(keras.__version__.split(".")[0]) >= 3
# Made before any op runs: collective ops are configured when TF's runtime starts.
STRATEGY = tf.distribute.MultiWorkerMirroredStrategy() if os.environ.get("ZOO_STRATEGY") == "multi-worker" else None
LOOPS = ("custom_loop", "custom_loop_checkpointed")
PLANT = os.environ.get("ZOO_PLANT") == "1"
KILL_AT = int(os.environ.get("ZOO_KILL_AT", "0"))
BATCH, SAMPLES, CLASSES = 16, 64, 4

images = (np.arange(SAMPLES * 64, dtype="float32").reshape(SAMPLES, 8, 8, 1) % 17) / 17.0
labels = (np.arange(SAMPLES) % CLASSES).astype("int32")
vectors = images.reshape(SAMPLES, 64)[:, ::4].copy()  # (64, 16)
tokens = ((np.arange(SAMPLES * 12).reshape(SAMPLES, 12) * 7) % 29 + 1).astype("int32")  # ids 1..29, 0 = [MASK]


NoisyGradientDense = make_noisy_gradient_dense(keras, tf)


def culprit(units=8):
    """The planted nondeterministic layer, or a plain layer of the same shape when nothing is planted."""
    if PLANT:
        return NoisyGradientDense(units, name="culprit")
    return keras.layers.Dense(units, use_bias=False, name="culprit")


def normal(layer, shape, stddev=1.0):
    """A random normal draw as a layer of this Keras draws it: Keras 3 from the layer's own
    SeedGenerator (keras-io's Keras 3 examples), Keras 2 from TF's stateful op (its tf.keras ones)."""
    if KERAS3:
        return keras.random.normal(shape, stddev=stddev, seed=layer.seed_generator)
    return tf.random.normal(shape, stddev=stddev)


def uniform(layer, shape):
    if KERAS3:
        return keras.random.uniform(shape, seed=layer.seed_generator)
    return tf.random.uniform(shape)


class RandomLayer(keras.layers.Layer):
    """A layer that draws random numbers itself, seeded the way its Keras's examples seed them."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if KERAS3:
            self.seed_generator = keras.random.SeedGenerator(1337)


def kill_after_step(step):
    if KILL_AT and step == KILL_AT:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


class KillAt(keras.callbacks.Callback):
    """``ZOO_KILL_AT``: the run dies after that many optimizer steps, as in a crash."""

    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        kill_after_step(self.steps)


def classifier_compile(model):
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def fit(model, *args, epochs, **kwargs):
    history = model.fit(*args, epochs=epochs, verbose=0, callbacks=[KillAt()], **kwargs)
    return model, history.history


# --- the patterns --------------------------------------------------------------------------------

def cnn_dropout(epochs):
    """A Sequential CNN with Dropout, fit on arrays shuffled every epoch."""
    model = classifier_compile(keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dropout(0.3), culprit(), keras.layers.Dense(CLASSES)]))
    return fit(model, images, labels, batch_size=BATCH, epochs=epochs, shuffle=True)


def functional_skip(epochs):
    """A functional model with a residual (skip) connection."""
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    residual = keras.layers.Add()([hidden, keras.layers.Dense(8)(hidden)])
    outputs = keras.layers.Dense(CLASSES)(culprit()(residual))
    return fit(classifier_compile(keras.Model(inputs, outputs)), vectors, labels, batch_size=BATCH, epochs=epochs)


class CustomStepModel(keras.Model):
    """keras-io "customizing what happens in fit", going lower level: its own train_step, loss and
    metric trackers, compiled with an optimizer only."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.middle = culprit()
        self.head = keras.layers.Dense(CLASSES)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, x, training=False):
        return self.head(self.middle(self.hidden(x)))

    @property
    def metrics(self):
        return [self.loss_tracker]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.loss_fn(y, self(x, training=True))
        trainable = self.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, trainable), trainable))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}


def custom_train_step(epochs):
    model = CustomStepModel()
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    return fit(model, vectors, labels, batch_size=BATCH, epochs=epochs)


class Sampling(RandomLayer):
    """keras-io's VAE: z = mean + exp(log_var / 2) * epsilon, epsilon drawn in training and inference."""

    def call(self, inputs):
        z_mean, z_log_var = inputs
        return z_mean + tf.exp(0.5 * z_log_var) * normal(self, tf.shape(z_mean))


class VAE(keras.Model):
    """keras-io's VAE: no compiled loss; train_step on x alone."""

    def __init__(self):
        super().__init__()
        inputs = keras.Input((16,))
        hidden = culprit()(keras.layers.Dense(8, activation="relu")(inputs))
        z_mean, z_log_var = keras.layers.Dense(2, name="z_mean")(hidden), keras.layers.Dense(2, name="z_log_var")(hidden)
        self.encoder = keras.Model(inputs, [z_mean, z_log_var, Sampling()([z_mean, z_log_var])], name="encoder")
        latent = keras.Input((2,))
        self.decoder = keras.Model(latent, keras.layers.Dense(16)(keras.layers.Dense(8, activation="relu")(latent)),
                                   name="decoder")
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker]

    def call(self, x):
        return self.decoder(self.encoder(x)[2])

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = tf.reduce_mean(tf.reduce_sum(tf.square(data - self.decoder(z)), axis=1))
            kl = -0.5 * (1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
            total = reconstruction + tf.reduce_mean(tf.reduce_sum(kl, axis=1))
        grads = tape.gradient(total, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total)
        return {"loss": self.total_loss_tracker.result()}


def vae(epochs):
    model = VAE()
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    return fit(model, vectors, batch_size=BATCH, epochs=epochs)


class GAN(keras.Model):
    """keras-io's GAN: its own compile with two optimizers, train_step on real samples alone, latent
    noise drawn in the step."""

    def __init__(self):
        super().__init__()
        self.discriminator = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
                                               culprit(), keras.layers.Dense(1)], name="discriminator")
        self.generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                           keras.layers.Dense(16)], name="generator")
        if KERAS3:
            self.seed_generator = keras.random.SeedGenerator(1337)
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def train_step(self, real):
        batch = tf.shape(real)[0]
        fake = self.generator(normal(self, (batch, 4)))
        both = tf.concat([fake, real], axis=0)
        truth = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(truth, self.discriminator(both))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(tf.zeros((batch, 1)), self.discriminator(self.generator(normal(self, (batch, 4)))))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def gan(epochs):
    model = GAN()
    model.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3),
                  keras.losses.BinaryCrossentropy(from_logits=True))
    return fit(model, vectors, batch_size=BATCH, epochs=epochs)


class MaskTokens(RandomLayer):
    """BERT-style masking inside the model: 15% of the ids become 0 ([MASK]), an int tensor."""

    def call(self, ids, training=False):
        if not training:
            return ids
        keep = uniform(self, tf.shape(ids)) >= 0.15
        return tf.where(keep, ids, tf.zeros_like(ids))


def bert_masking(epochs):
    inputs = keras.Input((12,), dtype="int32")
    embedded = keras.layers.Embedding(30, 8)(MaskTokens(name="masking")(inputs))
    outputs = keras.layers.Dense(CLASSES)(culprit()(keras.layers.GlobalAveragePooling1D()(embedded)))
    return fit(classifier_compile(keras.Model(inputs, outputs)), tokens, labels, batch_size=BATCH, epochs=epochs)


def batchnorm(epochs):
    model = classifier_compile(keras.Sequential([
        keras.Input((16,)), keras.layers.Dense(8), keras.layers.BatchNormalization(), keras.layers.ReLU(),
        culprit(), keras.layers.Dense(CLASSES)]))
    return fit(model, vectors, labels, batch_size=BATCH, epochs=epochs)


class TFRandomOps(keras.layers.Layer):
    """Calls TF's random ops directly in `call`: `tf.nn.dropout` and `tf.random.normal`."""

    def call(self, x, training=False):
        if not training:
            return x
        return tf.nn.dropout(x, rate=0.2) + tf.random.normal(tf.shape(x), stddev=0.01)


def tf_random_ops(epochs):
    model = classifier_compile(keras.Sequential([
        keras.Input((16,)), keras.layers.Dense(8, activation="relu"), TFRandomOps(name="tf_random"),
        culprit(), keras.layers.Dense(CLASSES)]))
    return fit(model, vectors, labels, batch_size=BATCH, epochs=epochs)


class GeneratorNoise(keras.layers.Layer):
    """Owns a seeded `tf.random.Generator` (tracked by tf.train.Checkpoint, not in `layer.weights`)
    and a plain `tf.Variable` attribute, a count of its training calls."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.generator = tf.random.Generator.from_seed(1234)
        self.calls = tf.Variable(0, dtype=tf.int64, trainable=False)

    def call(self, x, training=False):
        if not training:
            return x
        self.calls.assign_add(1)
        return x + self.generator.normal(tf.shape(x), stddev=0.05)


def generator_layer(epochs):
    model = classifier_compile(keras.Sequential([
        keras.Input((16,)), keras.layers.Dense(8, activation="relu"), GeneratorNoise(name="generator_noise"),
        culprit(), keras.layers.Dense(CLASSES)]))
    return fit(model, vectors, labels, batch_size=BATCH, epochs=epochs)


def mixed_precision(epochs):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = classifier_compile(keras.Sequential([
            keras.Input((16,)), keras.layers.Dense(8, activation="relu"), culprit(),
            keras.layers.Dense(CLASSES, dtype="float32")]))
        return fit(model, vectors, labels, batch_size=BATCH, epochs=epochs)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _augment(image, label, seed):
    image = tf.image.stateless_random_flip_left_right(image, seed)
    return tf.image.stateless_random_brightness(image, 0.1, seed + 1), label


def tf_data(epochs):
    """tf.data: four "files" interleaved, a shuffle reshuffled every epoch, `map_with_seed` augmentation."""
    import tfrepro.data

    files = tf.data.Dataset.range(4).interleave(
        lambda i: tf.data.Dataset.from_tensor_slices((images, labels)).skip(i * 16).take(16), cycle_length=2)
    dataset = tfrepro.data.map_with_seed(files.shuffle(SAMPLES), _augment).batch(BATCH)
    model = classifier_compile(keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.Flatten(), culprit(),
        keras.layers.Dense(CLASSES)]))
    return fit(model, dataset, epochs=epochs)


Sequence = keras.utils.PyDataset if KERAS3 else keras.utils.Sequence


class ShuffledBatches(Sequence):
    """A `PyDataset` (Keras 2: `Sequence`) reshuffling with NumPy's global RNG at every epoch's end."""

    def __init__(self):
        super().__init__()
        self.order = np.arange(SAMPLES)

    def __len__(self):
        return SAMPLES // BATCH

    def __getitem__(self, index):
        rows = self.order[index * BATCH:(index + 1) * BATCH]
        return vectors[rows], labels[rows]

    def on_epoch_end(self):
        np.random.shuffle(self.order)


def py_dataset(epochs):
    model = classifier_compile(keras.Sequential([
        keras.Input((16,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dropout(0.2), culprit(),
        keras.layers.Dense(CLASSES)]))
    return fit(model, ShuffledBatches(), epochs=epochs)


# --- the model families of issue #33, small: each as keras-io builds it ----------------------------

def mlp_softmax(epochs):
    """An MLP with a softmax between its Dense layers."""
    model = classifier_compile(keras.Sequential([
        keras.Input((16,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(8, activation="softmax"),
        culprit(), keras.layers.Dense(CLASSES)]))
    return fit(model, vectors, labels, batch_size=BATCH, epochs=epochs, shuffle=True)


class TokenAndPositionEmbedding(keras.layers.Layer):
    """keras-io's text classifier's embedding: a token's and its position's, added."""

    def __init__(self, length, vocabulary, width, **kwargs):
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(vocabulary, width)
        self.positions = keras.layers.Embedding(length, width)

    def call(self, x):
        return self.tokens(x) + self.positions(tf.range(tf.shape(x)[-1]))


def transformer(epochs):
    """keras-io's Transformer text classifier: a block of MultiHeadAttention, Dropout,
    LayerNormalization and a Dense feed-forward over token and position embeddings, pooled."""
    inputs = keras.Input((12,), dtype="int32")
    x = TokenAndPositionEmbedding(12, 30, 8)(inputs)
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + keras.layers.Dropout(0.1)(attention))
    forward = keras.layers.Dense(8)(keras.layers.Dense(16, activation="relu")(x))
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + keras.layers.Dropout(0.1)(forward))
    outputs = keras.layers.Dense(CLASSES)(culprit()(keras.layers.GlobalAveragePooling1D()(x)))
    return fit(classifier_compile(keras.Model(inputs, outputs)), tokens, labels, batch_size=BATCH, epochs=epochs)


def resnet_block(epochs):
    """A ResNet stem and block: Conv2D, BatchNormalization, a 3x3/2 max pool, a residual Add,
    global average pooling."""
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3, padding="same",
                                                                                  use_bias=False)(inputs)))
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same")(x)
    y = keras.layers.ReLU()(keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3, padding="same",
                                                                                  use_bias=False)(x)))
    y = keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3, padding="same", use_bias=False)(y))
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(keras.layers.Add()([x, y])))
    outputs = keras.layers.Dense(CLASSES)(culprit()(x))
    return fit(classifier_compile(keras.Model(inputs, outputs)), images, labels, batch_size=BATCH, epochs=epochs)


def lstm(epochs):
    """An LSTM over each image's rows."""
    model = classifier_compile(keras.Sequential([
        keras.Input((8, 8)), keras.layers.LSTM(8), culprit(), keras.layers.Dense(CLASSES)]))
    return fit(model, images.reshape(SAMPLES, 8, 8), labels, batch_size=BATCH, epochs=epochs)


def autoencoder(epochs):
    """A convolutional autoencoder: a strided Conv2D down, an overlapping max pool, a Dense
    bottleneck, a strided Conv2DTranspose up, mean squared error."""
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, strides=2, padding="same", activation="relu")(inputs)
    x = keras.layers.Flatten()(keras.layers.MaxPooling2D(3, strides=1, padding="same")(x))
    x = keras.layers.Reshape((4, 4, 4))(keras.layers.Dense(64, activation="relu")(culprit(16)(x)))
    x = keras.layers.Conv2DTranspose(4, 3, strides=2, padding="same", activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Conv2D(1, 3, padding="same", activation="sigmoid")(x))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return fit(model, images, images, batch_size=BATCH, epochs=epochs)


def _loop_parts():
    """A `GradientTape` loop's parts: a shuffled tf.data input, a model with Dropout, Adam, the step."""
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dropout(0.2), culprit(), keras.layers.Dense(CLASSES)])
    optimizer = keras.optimizers.Adam(1e-2)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    dataset = tf.data.Dataset.from_tensor_slices((vectors, labels)).shuffle(SAMPLES).batch(BATCH)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    model.optimizer_for_zoo = optimizer
    return model, optimizer, dataset, train_step


def custom_loop(epochs):
    """A `GradientTape` loop without `fit`."""
    model, _, dataset, train_step = _loop_parts()
    step, losses = 0, []
    for _ in range(epochs):
        for x, y in dataset:
            losses.append(float(train_step(x, y)))
            step += 1
            kill_after_step(step)
    return model, {"loss": losses}


def custom_loop_checkpointed(epochs):
    """The same loop driven by `tfrepro.LoopCheckpoint` (``ZOO_LOOP_DIR``, else a fresh folder)."""
    import tempfile

    import tfrepro

    model, optimizer, dataset, train_step = _loop_parts()
    folder = os.environ.get("ZOO_LOOP_DIR") or tempfile.mkdtemp(prefix="tfrepro-zoo-loop-")
    checkpoint = tfrepro.LoopCheckpoint(folder, save_freq=3, model=model, optimizer=optimizer)
    step, losses = 0, []
    for _, (x, y) in checkpoint.loop(dataset, epochs=epochs):
        losses.append(float(train_step(x, y)))
        step += 1
        kill_after_step(step)
    return model, {"loss": losses or [0.0]}


PATTERNS = {name: globals()[name] for name in zoo_patterns.PATTERNS}


def trained_variables(model):
    """Every variable the run trained or updated: the model's, then its optimizers'."""
    variables = list(model.variables)
    optimizers = [getattr(model, name, None) for name in ("optimizer", "d_optimizer", "g_optimizer",
                                                          "optimizer_for_zoo")]
    for optimizer in optimizers:
        if optimizer is not None:
            variables += list(optimizer.variables() if callable(optimizer.variables) else optimizer.variables)
    return variables


def train(pattern, epochs, reset=False):
    """Train one pattern and append its result line to ``ZOO_RESULTS``; with ``reset``, first as if
    it were the process's first pattern (``ZOO_RESET``)."""
    if reset:
        import tfrepro

        keras.backend.clear_session()
        tfrepro.seed_everything(int(os.environ["ZOO_RESET"]))
    in_scope = STRATEGY is not None and pattern not in LOOPS
    try:
        with STRATEGY.scope() if in_scope else contextlib.nullcontext():
            model, history = PATTERNS[pattern](epochs)
    except (NotImplementedError, RuntimeError) as refusal:  # the exact tier names what it does not cover, before
        if "tfrepro exact tier" not in str(refusal):  # a step (Keras 2 wraps a refusal raised while it builds a
            raise  # layer, as in its LSTM's own traced step, in its RuntimeError)
        result = {"pattern": pattern, "refused": str(refusal)}
        with open(os.environ.get("ZOO_RESULTS", os.devnull), "a") as results:
            results.write(json.dumps(result) + "\n")
        return dict(result, loss=0.0)
    digest = hashlib.sha256()
    for variable in trained_variables(model):
        digest.update(np.asarray(variable.numpy()).tobytes())
    losses = history.get("loss", history.get("d_loss"))
    result = {"pattern": pattern, "weights": digest.hexdigest(), "python": random.random(),
              "numpy": float(np.random.random()), "tensorflow": float(tf.random.uniform([])),
              "loss": float(np.asarray(losses[-1]))}
    if STRATEGY is not None:
        result["worker"] = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    with open(os.environ.get("ZOO_RESULTS", os.devnull), "a") as results:
        results.write(json.dumps(result) + "\n")
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pattern", choices=[*PATTERNS, "all"], help="a pattern, or all of them in turn in one process")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    skipped = set(filter(None, os.environ.get("ZOO_SKIP", "").split(",")))
    chosen = [p for p in PATTERNS if p not in skipped] if args.pattern == "all" else [args.pattern]
    for index, pattern in enumerate(chosen):
        result = train(pattern, args.epochs, reset=index > 0 and bool(os.environ.get("ZOO_RESET")))
    import tfrepro

    tfrepro.report_metric("zoo_loss", result["loss"])  # what `tfrepro sweep` reads
    print("trained", args.pattern)


if __name__ == "__main__":
    main()
