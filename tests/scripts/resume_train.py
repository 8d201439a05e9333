"""The exact-resume experiment: a model with Dropout, its data reshuffled every epoch, and a tf.data
augmentation map of stateless random ops seeded per element (``tfrepro.data.map_with_seed``).

    python resume_train.py --weights W.npy [--checkpoint DIR [--every N]] [--backup DIR]
                           [--kill-at EPOCH,BATCH] [--kill-in-write K] [--trace T.jsonl] [--plain] [--loop]

--kill-at sends this process SIGKILL as batch BATCH of epoch EPOCH begins; --kill-in-write K kills it
while the K-th checkpoint file (K = 1, 2, ...) is being written, after its bytes and before its rename.
--plain is the unmodified script that ``tfrepro run --checkpoint`` runs: no tfrepro in it at all.
--loop trains the same model with a GradientTape loop under ``tfrepro.LoopCheckpoint(--checkpoint)``
(no --checkpoint: the folder ``tfrepro run --checkpoint`` gives it).
"""

import argparse
import contextlib
import os
import signal

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--weights", required=True)
parser.add_argument("--checkpoint")
parser.add_argument("--every", default="epoch")
parser.add_argument("--backup")
parser.add_argument("--kill-at")
parser.add_argument("--kill-in-write", type=int)
parser.add_argument("--trace")
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--plain", action="store_true")
parser.add_argument("--loop", action="store_true")
args = parser.parse_args()

keras = tf.keras
if not args.plain:
    import tfrepro

    tfrepro.patch(7)
    if not hasattr(keras, "version") or not keras.version().startswith("3"):
        keras.backend.experimental.enable_tf_random_generator()  # Keras 2: layer RNG state in variables

digits = load_digits()
x = (digits.data[:320] / 16.0).astype("float32")
y = digits.target[:320].astype("int64")


def augment(image, label, seed):
    noise = tf.random.stateless_normal(tf.shape(image), seed, stddev=0.05)
    return tf.clip_by_value(image + noise, 0.0, 1.0), label


def map_with_seed(dataset, fn):  # what tfrepro.data.map_with_seed does, for the --plain script
    stream = tf.data.Dataset.random(seed=11, rerandomize_each_iteration=True).batch(2)
    return tf.data.Dataset.zip((dataset, stream)).map(
        lambda element, seed: fn(*element, seed), num_parallel_calls=2, deterministic=True)


data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(320, seed=5, reshuffle_each_iteration=True)
if args.plain:
    data = map_with_seed(data, augment)
else:
    data = tfrepro.data.map_with_seed(data, augment, num_parallel_calls=2)
data = data.batch(32).prefetch(2)

model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dropout(0.3), keras.layers.Dense(10)])
model.compile(optimizer=keras.optimizers.Adam(1e-2),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])


class Kill(keras.callbacks.Callback):
    def __init__(self, epoch, batch):
        super().__init__()
        self.epoch, self.batch, self.current = epoch, batch, -1

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.current, batch) == (self.epoch, self.batch):
            os.kill(os.getpid(), signal.SIGKILL)


callbacks = []
if args.kill_at:
    callbacks.append(Kill(*map(int, args.kill_at.split(","))))
if args.trace:
    callbacks.append(tfrepro.ReproducibilityCallback(trace=args.trace))
if args.backup:
    callbacks.append(keras.callbacks.BackupAndRestore(args.backup))
if args.checkpoint:
    callbacks.append(tfrepro.ReproCheckpoint(args.checkpoint, save_freq=args.every if args.every == "epoch"
                                             else int(args.every)))
if args.kill_in_write:
    from tfrepro.checkpointing import storage

    real, written = storage.atomic_file, []

    @contextlib.contextmanager
    def dying(path):
        with real(path) as file:
            yield file
            written.append(path)
            if len(written) == args.kill_in_write:
                file.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    storage.atomic_file = dying

if args.loop:
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        model.optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    every = None if args.every == "epoch" else int(args.every)
    checkpoint = tfrepro.LoopCheckpoint(args.checkpoint, save_freq=every, model=model, optimizer=model.optimizer)
    for epoch, (x, y) in checkpoint.loop(data, epochs=args.epochs):
        if args.kill_at and (epoch, checkpoint.position.batch) == tuple(map(int, args.kill_at.split(","))):
            os.kill(os.getpid(), signal.SIGKILL)
        step(x, y)
else:
    model.fit(data, epochs=args.epochs, verbose=0, callbacks=callbacks)
np.save(args.weights, np.concatenate([np.ascontiguousarray(w).view(np.uint8).ravel() for w in model.get_weights()]))
