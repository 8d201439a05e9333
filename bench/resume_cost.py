"""Time from process start to the first trained batch of a resume, at epoch 1 and at epoch 20 of
the same run, on CPU, in fresh processes, side by side in one run.

The input: 4,000 images of 32x32x3 under ``tfrepro.patch``, augmented per image (flip, shift of up
to 4 pixels, brightness: ``tf.image.stateless_random_*``), batches of 64, validation on 1,000 more.
  keyed     ``tfrepro.data.shuffle`` + ``tfrepro.data.map_with_seed``: addressed by epoch, so a
            resume draws and validates the checkpoint's epoch only
  replayed  the same with ``Dataset.shuffle(reshuffle_each_iteration=True)``: its passes depend on
            the passes before, so a resume replays every earlier epoch's input and validation
A 21-epoch run of each saves a checkpoint per epoch; the resume at E starts from the checkpoint at
the start of epoch E. Median of --rounds. Goal: keyed at epoch 20 within 10% of keyed at epoch 1.
Not a test: nothing is asserted.

    python bench/resume_cost.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _common import grab, run

_TRAIN = r'''
import time
started = time.perf_counter()
import sys, warnings
arm, folder, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
import tfrepro
warnings.simplefilter("ignore")
tfrepro.patch(0)
import tensorflow as tf
import tfrepro.data
keras = tf.keras

def augment(image, label, seed):
    seeds = tf.random.experimental.stateless_split(seed, 3)
    image = tf.image.stateless_random_flip_left_right(image, seeds[0])
    image = tf.image.stateless_random_crop(tf.image.pad_to_bounding_box(image, 4, 4, 40, 40), [32, 32, 3], seeds[1])
    return tf.image.stateless_random_brightness(image, 0.1, seeds[2]), label

def data(count, offset, key):
    images = tf.random.stateless_uniform([count, 32, 32, 3], [offset, 2])
    labels = tf.random.stateless_uniform([count], [offset, 3], 0, 10, tf.int32)
    pairs = tf.data.Dataset.from_tensor_slices((images, labels))
    if arm == "keyed":
        pairs = tfrepro.data.shuffle(pairs, count, key=key)
    else:
        pairs = pairs.shuffle(count, seed=offset)
    return tfrepro.data.map_with_seed(pairs, augment, key=key).batch(64)

class FirstTrainedBatch(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if not hasattr(self, "at"):
            self.at = time.perf_counter() - started

model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(16, 3, activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
first = FirstTrainedBatch()
model.fit(data(4000, 1, "train"), validation_data=data(1000, 2, "val"), epochs=epochs, verbose=0,
          callbacks=[first, tfrepro.ReproCheckpoint(folder, keep=100)])
print(f"first trained batch {getattr(first, 'at', float('nan')):.3f}")
'''
ARMS = ("keyed", "replayed")
EPOCHS = 21


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tfrepro-resume-bench-"))
    try:
        for arm in ARMS:  # the whole run, a checkpoint per epoch
            run([sys.executable, "-c", _TRAIN, arm, str(work / arm), str(EPOCHS)])
        times: dict[tuple[str, int], list[float]] = {(arm, e): [] for arm in ARMS for e in (1, 20)}
        for _ in range(args.rounds):
            for (arm, epoch), found in times.items():
                folder = work / f"{arm}-from-{epoch}"
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                shutil.copy(work / arm / f"ckpt-e{epoch:06d}-b00000000.npz", folder)
                out = run([sys.executable, "-c", _TRAIN, arm, str(folder), str(EPOCHS)])
                found.append(grab(r"first trained batch ([0-9.]+)", out))
        print(f"{EPOCHS}-epoch run, 4,000 augmented 32x32x3 images per epoch, 1,000 for validation; "
              f"median of {args.rounds} fresh processes")
        for arm in ARMS:
            one, twenty = (statistics.median(times[(arm, e)]) for e in (1, 20))
            print(f"{arm:9s} resume at epoch 1: {one:.2f}s; at epoch 20: {twenty:.2f}s ({twenty / one:.2f}x)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
