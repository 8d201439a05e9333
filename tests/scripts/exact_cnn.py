"""Train the Keras MNIST CNN, with a softmax Dense layer before its head and an accuracy metric, for a
few steps under tfrepro.patch and print its weights' digest.

usage: exact_cnn.py [--ops exact|auto] [--threads N] [--onednn on|off] [--jit] [--no-dropout]
                    [--replicas 1|2] [--steps N] [--layer-norm]

--replicas 2 trains under MirroredStrategy over two logical CPU devices with the same global batch.
"""

import argparse
import hashlib
import json

parser = argparse.ArgumentParser()
parser.add_argument("--ops", default="exact")
parser.add_argument("--threads", type=int, default=None)
parser.add_argument("--onednn", choices=("on", "off"), default=None)
parser.add_argument("--jit", action="store_true")
parser.add_argument("--no-dropout", action="store_true")
parser.add_argument("--replicas", type=int, default=1)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--layer-norm", action="store_true", help="a LayerNormalization after the convolutions")
args = parser.parse_args()

import tfrepro  # noqa: E402

onednn = None if args.onednn is None else args.onednn == "on"
if args.replicas > 1:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
tfrepro.patch(7, threads=args.threads, onednn=onednn, ops=args.ops)

import tensorflow as tf  # noqa: E402

from tfrepro.examples.datasets import load_mnist  # noqa: E402
from tfrepro.examples.mnist_cnn import build_model, weights_digest  # noqa: E402

batch = 64
data = load_mnist(allow_download=False, limit=batch * args.steps)
strategy = (tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)]) if args.replicas > 1
            else tf.distribute.get_strategy())
with strategy.scope():
    model = build_model(tf.keras, dropout=not args.no_dropout)
    # a softmax between Dense layers (issue #33's MLP), read by the accuracy metric too
    hidden = [tf.keras.layers.Dense(16, activation="softmax", name="softmax_hidden")]
    if args.layer_norm:
        hidden.append(tf.keras.layers.LayerNormalization())
    head = tf.keras.layers.Dense(model.layers[-1].units, activation="softmax")
    model = tf.keras.Sequential([tf.keras.Input(model.input_shape[1:]), *model.layers[:-1], *hidden, head])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=args.jit)
    if args.jit and not model.jit_compile:  # Keras 3 turns XLA off under op determinism (model_supports_jit),
        model._jit_compile = True  # and its setter too: only the attribute puts fit's step under XLA
history = model.fit(data.x_train, data.y_train, batch_size=batch, epochs=1, shuffle=False, verbose=0)
print(json.dumps({"digest": weights_digest(model),
                  "weights": [hashlib.sha256(w.tobytes()).hexdigest()[:12] for w in model.get_weights()], "loss": [float(v) for v in history.history["loss"]],
                  "accuracy": [float(v) for v in history.history["accuracy"]],
                  "replicas": strategy.num_replicas_in_sync, "jit": bool(model.jit_compile)}))
