"""Time from process start to the first trained batch of a resume, at epoch 1 and at epoch 20 of
the same run, on CPU, in fresh processes, side by side in one run.

The input: 4,000 images of 32x32x3 under ``tfrepro.patch``, augmented per image (flip, shift of up
to 4 pixels, brightness: ``tf.image.stateless_random_*``), batches of 64, validation on 1,000 more.
  keyed     ``tfrepro.data.shuffle`` + ``tfrepro.data.map_with_seed``: addressed by epoch, so a
            resume draws and validates the checkpoint's epoch only
  dataset   the same with ``Dataset.shuffle(N)`` (the tutorials' pipeline), keyed by ``patch``
  replayed  the same with TF's own ``Dataset.shuffle`` (as without ``patch``): its passes depend on
            the passes before, so a resume replays every earlier epoch's input and validation
A 21-epoch run of each saves a checkpoint per epoch; the resume at E starts from the checkpoint at
the start of epoch E.

Mid-epoch, where the input's cost is in its maps: 4,000 JPEGs of 192x192 read from a TFRecord file
(decoded, cropped to 160, resized to 32x32, then the same augmentation), keyed, a 3-epoch run with a checkpoint every 14 of
its 63 batches an epoch. Resumed from the start of epoch 2 (``start``) and from batch 56 of it:
  skipped   the 56 batches before it skipped without computing them (``tfrepro.data.skip``)
  drawn     the same checkpoint with the skip turned off: the 56 batches decoded and dropped
Median of --rounds. Goals: keyed and dataset at epoch 20 within 10% of epoch 1, and ``skipped``
within 10% of ``start``. Not a test: nothing is asserted.

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
arm, folder, epochs, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
import tfrepro
warnings.simplefilter("ignore")
tfrepro.patch(0)
import tensorflow as tf
import tfrepro.data
keras = tf.keras
if arm == "jpeg-drawn":  # the skip turned off: the batches before the checkpoint's drawn and dropped
    from tfrepro.checkpointing import input_position
    from tfrepro.data import skipping
    input_position.skip_within_epoch = lambda iterator, batches: skipping.Skip(batches, why_not="bench")

def augment(image, label, seed):
    seeds = tf.random.experimental.stateless_split(seed, 3)
    image = tf.image.stateless_random_flip_left_right(image, seeds[0])
    image = tf.image.stateless_random_crop(tf.image.pad_to_bounding_box(image, 4, 4, 40, 40), [32, 32, 3], seeds[1])
    return tf.image.stateless_random_brightness(image, 0.1, seeds[2]), label

def jpegs(count, offset):
    """A TFRecord file of JPEGs, written once per bench run beside the checkpoints' folders."""
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(folder)), f"jpegs-{count}-{offset}.tfrecord")
    if not os.path.exists(path):
        pixels = tf.cast(tf.random.stateless_uniform([count, 192, 192, 3], [offset, 2], 0, 256, tf.int32), tf.uint8)
        with tf.io.TFRecordWriter(path + ".tmp") as writer:
            for image in pixels:
                writer.write(tf.io.encode_jpeg(image).numpy())
        os.replace(path + ".tmp", path)
    return tf.data.TFRecordDataset(path).apply(tf.data.experimental.assert_cardinality(count))

def decode(encoded, label, seed):
    image = tf.image.stateless_random_crop(tf.io.decode_jpeg(encoded, channels=3), [160, 160, 3], seed + 7)
    return augment(tf.image.resize(tf.cast(image, tf.float32) / 255.0, [32, 32]), label, seed)

def data(count, offset, key):
    labels = tf.random.stateless_uniform([count], [offset, 3], 0, 10, tf.int32)
    if arm.startswith("jpeg"):
        pairs = tfrepro.data.shuffle(tf.data.Dataset.zip((jpegs(count, offset), tf.data.Dataset.from_tensor_slices(labels))),
                                     count, key=key)
        return tfrepro.data.map_with_seed(pairs, decode, key=key).batch(64)
    images = tf.random.stateless_uniform([count, 32, 32, 3], [offset, 2])
    pairs = tf.data.Dataset.from_tensor_slices((images, labels))
    if arm == "keyed":
        pairs = tfrepro.data.shuffle(pairs, count, key=key)
    elif arm == "dataset":
        pairs = pairs.shuffle(count, seed=offset)
    else:  # TF's own reshuffle, under patch's keyed Dataset.shuffle
        import inspect
        pairs = inspect.unwrap(tf.data.Dataset.shuffle)(pairs, count, seed=offset)
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
          callbacks=[first, tfrepro.ReproCheckpoint(folder, save_freq=every if every == "epoch" else int(every), max_to_keep=100)])
print(f"first trained batch {getattr(first, 'at', float('nan')):.3f}")
'''
ARMS = ("keyed", "dataset", "replayed")
EPOCHS = 21
MID_EPOCHS, MID_EVERY = 3, 14  # 63 batches an epoch: checkpoints at the start of epoch 2 and at its batch 56


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tfrepro-resume-bench-"))
    try:
        for arm in ARMS:  # the whole run, a checkpoint per epoch
            run([sys.executable, "-c", _TRAIN, arm, str(work / arm), str(EPOCHS), "epoch"])
        run([sys.executable, "-c", _TRAIN, "jpeg", str(work / "mid"), str(MID_EPOCHS), str(MID_EVERY)])
        starts = {(arm, e): (work / arm / f"ckpt-e{e:06d}-b00000000.npz", arm, EPOCHS) for arm in ARMS for e in (1, 20)}
        starts[("start", "mid")] = (work / "mid" / "ckpt-e000002-b00000000.npz", "jpeg", MID_EPOCHS)
        for arm in ("skipped", "drawn"):
            starts[(arm, "mid")] = (work / "mid" / "ckpt-e000002-b00000056.npz",
                                    "jpeg" if arm == "skipped" else "jpeg-drawn", MID_EPOCHS)
        times: dict[tuple[str, object], list[float]] = {key: [] for key in starts}
        for _ in range(args.rounds):
            for key, found in times.items():
                checkpoint, arm, epochs = starts[key]
                folder = work / f"{key[0]}-from-{key[1]}"
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                shutil.copy(checkpoint, folder)
                out = run([sys.executable, "-c", _TRAIN, arm, str(folder), str(epochs), "epoch"])
                found.append(grab(r"first trained batch ([0-9.]+)", out))
        print(f"{EPOCHS}-epoch run, 4,000 augmented 32x32x3 images per epoch, 1,000 for validation; "
              f"median of {args.rounds} fresh processes")
        for arm in ARMS:
            one, twenty = (statistics.median(times[(arm, e)]) for e in (1, 20))
            print(f"{arm:9s} resume at epoch 1: {one:.2f}s; at epoch 20: {twenty:.2f}s ({twenty / one:.2f}x)", flush=True)
        start = statistics.median(times[("start", "mid")])
        print(f"JPEG input, resume at the start of epoch 2: {start:.2f}s")
        for arm in ("skipped", "drawn"):
            mid = statistics.median(times[(arm, "mid")])
            print(f"{arm:9s} resume at its batch 56: {mid:.2f}s ({mid / start:.2f}x the start)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
