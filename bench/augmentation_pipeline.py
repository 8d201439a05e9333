"""Random augmentation in a parallel tf.data map, with and without determinism, on CPU.

The pipeline of the tutorials on 32x32x3 images (random flip, a random shift of up to 4 pixels,
random brightness), batched by 128, --images per epoch: the fastest of 5 epochs timed after a
warm-up epoch (this 2-core machine's noise is about 0.3x on one epoch), in fresh processes (op
determinism cannot be turned off for tf.data once on), median of --rounds, the arms interleaved:
  stateful parallel    tf.image.random_* in map(num_parallel_calls=AUTOTUNE), no determinism (the
                       fast baseline; each run augments differently)
  stateful, patched    the same map under tfrepro.patch(): TensorFlow runs it serially
  stateless, one seed  the same stateless function in a plain parallel map, every image given one
                       fixed seed: what TF's stateless image ops cost, without map_with_seed
  map_with_seed        tfrepro.data.map_with_seed per image with tf.image.stateless_random_* (in
                       blocks of 8 per call, its default for small static-shaped elements)
  map_with_seed block=1
                       the same, one image per call
  map_with_seed batch  map_with_seed on batches with tfrepro.data's per-image batch augmentations
Goal: map_with_seed within 10% of the stateful parallel map. Run per core count with --cores
(taskset). Not a test: nothing is asserted.

    python bench/augmentation_pipeline.py [--images 20000] [--rounds 3] [--cores 1,2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

_ARM = r'''
import sys, time, warnings
arm, images = sys.argv[1], int(sys.argv[2])
import tfrepro
warnings.simplefilter("ignore")
if arm != "stateful parallel":
    tfrepro.patch(0)
import tensorflow as tf
from tfrepro.data import map_with_seed, random_brightness, random_flip_left_right, random_translate

x = tf.random.stateless_uniform([images, 32, 32, 3], [1, 2])
y = tf.range(images)
data = tf.data.Dataset.from_tensor_slices((x, y))
AUTOTUNE = tf.data.AUTOTUNE


def stateful(image, label):
    image = tf.image.random_flip_left_right(image)
    image = tf.image.random_crop(tf.image.pad_to_bounding_box(image, 4, 4, 40, 40), [32, 32, 3])
    return tf.image.random_brightness(image, 0.1), label


def stateless(image, label, seed):
    seeds = tf.random.experimental.stateless_split(seed, 3)
    image = tf.image.stateless_random_flip_left_right(image, seeds[0])
    image = tf.image.stateless_random_crop(tf.image.pad_to_bounding_box(image, 4, 4, 40, 40), [32, 32, 3], seeds[1])
    return tf.image.stateless_random_brightness(image, 0.1, seeds[2]), label


def batch_level(images, labels, seed):
    seeds = tf.random.experimental.stateless_split(seed, 3)
    images = random_translate(random_flip_left_right(images, seeds[0]), 4, seeds[1])
    return random_brightness(images, 0.1, seeds[2]), labels


if arm in ("stateful parallel", "stateful, patched"):
    pipeline = data.map(stateful, num_parallel_calls=AUTOTUNE).batch(128)
elif arm == "stateless, one seed":
    one = tf.constant([1, 2], tf.int64)
    pipeline = data.map(lambda image, label: stateless(image, label, one), num_parallel_calls=AUTOTUNE).batch(128)
elif arm == "map_with_seed":
    pipeline = map_with_seed(data, stateless).batch(128)
elif arm == "map_with_seed block=1":
    pipeline = map_with_seed(data, stateless, block=1).batch(128)
else:
    pipeline = map_with_seed(data.batch(128), batch_level)
pipeline = pipeline.prefetch(AUTOTUNE)
for _ in pipeline:
    pass
times = []
for _ in range(5):
    start = time.perf_counter()
    for _ in pipeline:
        pass
    times.append(time.perf_counter() - start)
print(min(times))
'''
ARMS = ("stateful parallel", "stateful, patched", "stateless, one seed", "map_with_seed", "map_with_seed block=1",
        "map_with_seed batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cores", default=",".join(str(n) for n in range(1, min(os.cpu_count() or 1, 2) + 1)))
    args = parser.parse_args()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONHASHSEED", None)
    print(f"{args.images} images of 32x32x3 per epoch, batch 128, median of {args.rounds} fresh processes per arm")
    for cores in (int(n) for n in args.cores.split(",")):
        times = {arm: [] for arm in ARMS}
        for _ in range(args.rounds):
            for arm in ARMS:
                command = ["taskset", "-c", ",".join(str(c) for c in range(cores)), sys.executable, "-c", _ARM, arm,
                           str(args.images)]
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
                times[arm].append(float(out.strip().splitlines()[-1]))
        base = statistics.median(times["stateful parallel"])
        print(f"{cores} core(s): " + "; ".join(f"{arm} {statistics.median(t):.2f}s ({statistics.median(t) / base:.2f}x)"
                                             for arm, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
