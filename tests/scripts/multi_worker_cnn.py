"""The Keras MNIST CNN (with Dropout) under MultiWorkerMirroredStrategy, knowing nothing of tfrepro.

    python multi_worker_cnn.py --weights W.npz [--epochs E] [--limit N]
                               [--plant worker|run] [--kill-at EPOCH,BATCH --marker FILE] [--keyed-shuffle]

Run it as ``tfrepro run --workers 2 -- python multi_worker_cnn.py ...`` (TF_CONFIG names the
cluster). Each worker saves its final weights to W.npz with ".worker-K" before the suffix.
--plant worker adds noise to layer "dense" on worker 1 only, after step 0: the workers disagree.
--plant run adds the same noise on every worker to layer "dense_1" after step 1, of a size set by
the run's index in `tfrepro check`'s trace folder (run-K): the runs disagree, the workers do not.
--kill-at makes worker 1 send itself SIGKILL as that batch begins, unless FILE exists (it is made
then: the resumed run goes on).
--keyed-shuffle shuffles with ``tfrepro.data.shuffle`` (its auto-shard policy left as TF's default).
"""

import argparse
import json
import os
import re
import signal
from pathlib import Path

import numpy as np
import tensorflow as tf

from tfrepro.examples.datasets import load_sklearn_digits
from tfrepro.examples.mnist_cnn import build_model

parser = argparse.ArgumentParser()
parser.add_argument("--weights", required=True)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--limit", type=int, default=256)
parser.add_argument("--plant", choices=("worker", "run"))
parser.add_argument("--kill-at")
parser.add_argument("--marker")
parser.add_argument("--keyed-shuffle", action="store_true")
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
config = json.loads(os.environ["TF_CONFIG"])
worker = config["task"]["index"]
keras = tf.keras
if not (hasattr(keras, "version") and keras.version().startswith("3")):
    keras.backend.experimental.enable_tf_random_generator()  # Keras 2: Dropout's state in variables

digits = load_sklearn_digits()
x, y = digits.x_train[:args.limit], digits.y_train[:args.limit]
with strategy.scope():
    model = build_model(keras)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])


class Plant(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.step = 0

    def on_train_batch_end(self, batch, logs=None):
        run = int(re.search(r"run-(\d+)", os.environ.get("TFREPRO_TRACE_DIR", "run-0")).group(1))
        if args.plant == "worker" and self.step == 0 and worker == 1:
            self._add("dense", 1e-3)
        elif args.plant == "run" and self.step == 1:
            self._add("dense_1", 1e-3 * (1 + run))
        self.step += 1

    def _add(self, layer, size):
        kernel = self.model.get_layer(layer).weights[0]
        kernel.assign(kernel + size)


class Kill(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if worker == 1 and f"{self.epoch},{batch}" == args.kill_at and not Path(args.marker).exists():
            Path(args.marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)


data = tf.data.Dataset.from_tensor_slices((x, y))
if args.keyed_shuffle:
    import tfrepro.data

    data = tfrepro.data.shuffle(data, len(x)).batch(64)
else:
    data = data.shuffle(len(x), seed=3, reshuffle_each_iteration=False).batch(64)
callbacks = ([Plant()] if args.plant else []) + ([Kill()] if args.kill_at else [])
model.fit(data, epochs=args.epochs, verbose=0, callbacks=callbacks)
stem, suffix = os.path.splitext(args.weights)
np.savez(f"{stem}.worker-{worker}{suffix}", *model.get_weights())
