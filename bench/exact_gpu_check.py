"""Train the Keras MNIST CNN under the exact tier on whatever devices this machine has and print a
hash of the final weights, to compare across machines, GPU models, replica counts and the CPU.

    python bench/exact_gpu_check.py                 # every visible GPU (MirroredStrategy if > 1), else the CPU
    python bench/exact_gpu_check.py --devices 1     # one device only
    python bench/exact_gpu_check.py --cpu           # hide the GPUs: the CPU's hash

The data are scikit-learn's bundled digits (offline, the same everywhere), 1,024 images, 2 epochs,
batch 64, no Dropout by default (``--dropout`` adds it: the mask is keyed by the seed alone on one
device). Under ``patch(ops="exact")`` the printed hash is the same on every machine with the same
TF build, and on GPUs across architectures for the ops the README lists; a different hash names
an op outside the tier (the script prints the TF version and devices beside it).
"""

from __future__ import annotations

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--devices", type=int, default=None, help="use this many devices (default: all GPUs)")
parser.add_argument("--cpu", action="store_true", help="hide the GPUs")
parser.add_argument("--dropout", action="store_true", help="keep the CNN's Dropout layers")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
if args.cpu:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import tfrepro  # noqa: E402

tfrepro.patch(args.seed, ops="exact")

import tensorflow as tf  # noqa: E402

from tfrepro.examples.datasets import load_mnist  # noqa: E402
from tfrepro.examples.mnist_cnn import build_model, weights_digest  # noqa: E402

gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
devices = (gpus or [d.name for d in tf.config.list_logical_devices("CPU")])[:args.devices or None]
strategy = tf.distribute.MirroredStrategy(devices) if len(devices) > 1 else tf.distribute.OneDeviceStrategy(devices[0])
data = load_mnist(allow_download=False, limit=1024)
with strategy.scope():
    model = build_model(tf.keras, dropout=args.dropout)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.fit(data.x_train, data.y_train, batch_size=64, epochs=2, shuffle=False, verbose=0)
print(f"TF {tf.__version__}, devices: {', '.join(devices)}")
print(f"exact-tier weights sha256: {weights_digest(model)}")
