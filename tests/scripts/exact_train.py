"""Train a model for a few steps under tfrepro.patch and print its weights' digest.

--model cnn: the Keras MNIST CNN, with two Dense layers before its head (the first followed by
every activation the exact tier computes: tanh, sigmoid, gelu, swish, elu, selu, softplus; the
second a softmax) and an accuracy metric.
--model transformer: keras-io's Transformer text classifier (token and position Embedding, a block
of MultiHeadAttention, Dropout, LayerNormalization and a Dense feed-forward, global average
pooling), reading each MNIST digit as a "sentence" of 49 tokens (its 4x4 patches' ink, 16 levels).
--model autoencoder: a UNet-style convolutional autoencoder of the digits (two strided Conv2D down,
an overlapping 3x3 max pool between them, two strided Conv2DTranspose up, a skip connection
concatenated, a sigmoid output, mean squared error).
--model resnet: a small ResNet of the digits (a strided Conv2D stem, BatchNormalization, a 3x3/2
overlapping max pool, a residual block of two Conv2D and BatchNormalization joined by an Add,
global average pooling); its BatchNormalization synchronized across replicas (--sync-bn).
--model lstm: an LSTM reading each digit's 28 rows as a sequence, a GRU (with input dropout) reading its outputs.

usage: exact_train.py [--model cnn|transformer|autoencoder|resnet|lstm] [--ops exact|auto] [--threads N] [--onednn on|off]
                      [--jit] [--no-dropout] [--replicas 1|2] [--steps N] [--layer-norm]
                      [--batch-norm] [--sync-bn] [--attention] [--no-activations]
                      [--products auto|float64|float32] [--inference] [--export DIR]

--replicas 2 trains under MirroredStrategy over two logical CPU devices with the same global batch.
"""

import argparse
import hashlib
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=("cnn", "transformer", "autoencoder", "resnet", "lstm"), default="cnn")
parser.add_argument("--ops", default="exact")
parser.add_argument("--threads", type=int, default=None)
parser.add_argument("--onednn", choices=("on", "off"), default=None)
parser.add_argument("--jit", action="store_true")
parser.add_argument("--no-dropout", action="store_true")
parser.add_argument("--replicas", type=int, default=1)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--layer-norm", action="store_true", help="a LayerNormalization before the CNN's head")
parser.add_argument("--batch-norm", action="store_true", help="a BatchNormalization before the CNN's head")
parser.add_argument("--sync-bn", action="store_true", help="BatchNormalization(synchronized=True)")
parser.add_argument("--attention", action="store_true", help="self-attention over the CNN's 16 features as 4 tokens")
parser.add_argument("--no-activations", action="store_true", help="leave out the activations after the first Dense")
parser.add_argument("--inference", action="store_true",
                    help="after training, predict 64 samples in batches of 1, 7, 64 and of mixed sizes")
parser.add_argument("--export", default=None, metavar="DIR",
                    help="save the trained model as a SavedModel in DIR (with the 64 inputs and their outputs)")
parser.add_argument("--products", choices=("auto", "float64", "float32"), default=None,
                    help="TFREPRO_EXACT_PRODUCTS: the exact tier's product path (the same bits either way)")
args = parser.parse_args()
if args.products:
    os.environ["TFREPRO_EXACT_PRODUCTS"] = args.products

import tfrepro  # noqa: E402

onednn = None if args.onednn is None else args.onednn == "on"
if args.replicas > 1:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
tfrepro.patch(7, threads=args.threads, onednn=onednn, ops=args.ops)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfrepro.examples.datasets import load_mnist  # noqa: E402
from tfrepro.examples import transformer_classifier  # noqa: E402
from tfrepro.examples.mnist_cnn import build_model, weights_digest  # noqa: E402

batch = 64
ACTIVATIONS = ("tanh", "sigmoid", "gelu", "swish", "elu", "selu", "softplus")
data = load_mnist(allow_download=False, limit=batch * args.steps)
strategy = (tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)]) if args.replicas > 1
            else tf.distribute.get_strategy())


def cnn():
    model = build_model(tf.keras, dropout=not args.no_dropout)
    # a softmax between Dense layers (issue #33's MLP), read by the accuracy metric too, and the
    # activations the tier computes itself (issue #33), one after another on one Dense layer
    hidden = [tf.keras.layers.Dense(16, activation=ACTIVATIONS[0], name="activations_hidden"),
              *(tf.keras.layers.Activation(name) for name in ACTIVATIONS[1:] if not args.no_activations),
              tf.keras.layers.Dense(16, activation="softmax", name="softmax_hidden")]
    if args.attention:
        hidden += [tf.keras.layers.Reshape((4, 4)), SelfAttention(), tf.keras.layers.Flatten()]
    if args.layer_norm:
        hidden.append(tf.keras.layers.LayerNormalization())
    if args.batch_norm:
        hidden.append(tf.keras.layers.BatchNormalization(synchronized=args.sync_bn))
    head = tf.keras.layers.Dense(model.layers[-1].units, activation="softmax")
    return tf.keras.Sequential([tf.keras.Input(model.input_shape[1:]), *model.layers[:-1], *hidden, head])


class SelfAttention(tf.keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.attention = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)

    def call(self, x):
        return self.attention(x, x)


def transformer():
    return transformer_classifier.build_model(tf.keras, dropout=0.0 if args.no_dropout else 0.1)


def autoencoder():
    layers = tf.keras.layers
    images = tf.keras.Input((28, 28, 1))
    down = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(images)
    x = layers.MaxPooling2D(3, strides=1, padding="same")(down)  # overlapping windows, as a ResNet stem's
    x = layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.Concatenate()([x, down])
    return tf.keras.Model(images, layers.Conv2DTranspose(1, 3, strides=2, padding="same", activation="sigmoid")(x))


def resnet():
    layers = tf.keras.layers

    def normalised(x):
        return layers.BatchNormalization(synchronized=args.sync_bn)(x)

    images = tf.keras.Input((28, 28, 1))
    x = layers.ReLU()(normalised(layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(images)))
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    y = layers.ReLU()(normalised(layers.Conv2D(8, 3, padding="same", use_bias=False)(x)))
    y = normalised(layers.Conv2D(8, 3, padding="same", use_bias=False)(y))
    x = layers.GlobalAveragePooling2D()(layers.ReLU()(layers.Add()([x, y])))
    return tf.keras.Model(images, layers.Dense(10, activation="softmax")(x))


def lstm():
    return tf.keras.Sequential([tf.keras.Input((28, 28)), tf.keras.layers.LSTM(16, return_sequences=True),
                                tf.keras.layers.GRU(8, dropout=0.1), tf.keras.layers.Dense(10, activation="softmax")])


# requests of mixed sizes, 64 samples (after the 1, each sample has other batch-mates than in batches of 7)
MIXED = (7, 7, 1, 7, 7, 7, 7, 7, 7, 7)


def inference(model, x):
    """Predict ``x`` (64 samples) in batches of 1, 7 and 64 and in requests of mixed sizes: whether each
    sample's output has the same bits in every batching, and how many samples differ from batch 64's;
    with ``--export``, the SavedModel, the inputs and the batch-64 outputs in that folder."""
    outputs = {str(size): model.predict(x, batch_size=size, verbose=0) for size in (1, 7, 64)}
    start = np.cumsum((0,) + MIXED)
    outputs["mixed"] = np.concatenate([model.predict(x[a:b], batch_size=b - a, verbose=0)
                                       for a, b in zip(start[:-1], start[1:])])
    reference = outputs["64"]
    differing = {name: int(sum(out[i].tobytes() != reference[i].tobytes() for i in range(len(x))))
                 for name, out in outputs.items() if name != "64"}
    if args.export:
        os.makedirs(args.export, exist_ok=True)
        if hasattr(model, "export"):  # Keras 3 and tf-keras: a SavedModel with a serving endpoint
            model.export(os.path.join(args.export, "model"))
        else:
            tf.saved_model.save(model, os.path.join(args.export, "model"))
        np.save(os.path.join(args.export, "inputs.npy"), x)
        np.save(os.path.join(args.export, "outputs.npy"), reference)
    return {"differing": differing, "digest": hashlib.sha256(reference.tobytes()).hexdigest()}


x_train = {"transformer": transformer_classifier.as_tokens, "lstm": lambda x: x.reshape(-1, 28, 28)}.get(
    args.model, lambda x: x)(data.x_train)
y_train = data.x_train if args.model == "autoencoder" else data.y_train
with strategy.scope():
    model = {"cnn": cnn, "transformer": transformer, "autoencoder": autoencoder, "resnet": resnet,
             "lstm": lstm}[args.model]()
    if args.model == "autoencoder":
        model.compile(optimizer="adam", loss="mse", jit_compile=args.jit)
    else:
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      jit_compile=args.jit)
    if args.jit and not model.jit_compile:  # Keras 3 turns XLA off under op determinism (model_supports_jit),
        model._jit_compile = True  # and its setter too: only the attribute puts fit's step under XLA
history = model.fit(x_train, y_train, batch_size=batch, epochs=1, shuffle=False, verbose=0)
found = {}
if args.inference or args.export:
    found["inference"] = inference(model, x_train[:64])
print(json.dumps({**found, "digest": weights_digest(model),
                  "weights": [hashlib.sha256(w.tobytes()).hexdigest()[:12] for w in model.get_weights()], "loss": [float(v) for v in history.history["loss"]],
                  "accuracy": [float(v) for v in history.history.get("accuracy", [])],
                  "replicas": strategy.num_replicas_in_sync, "jit": bool(model.jit_compile),
                  "products": os.environ.get("TFREPRO_EXACT_PRODUCTS", "auto")}))
