"""Run the exact tier on whatever devices this machine has and print a hash per op and a hash of a
trained CNN's weights, to compare across machines, GPU models, replica counts and the CPU.

    python bench/exact_gpu_check.py                     # every visible GPU (MirroredStrategy if > 1), else the CPU
    python bench/exact_gpu_check.py --devices 1         # one device only
    python bench/exact_gpu_check.py --cpu               # hide the GPUs: the CPU's hashes
    python bench/exact_gpu_check.py --products float32  # the float32-slice products (the same bits)
    python bench/exact_gpu_check.py --ops-only          # the per-op hashes alone (seconds, not minutes)

First, one line per op: the SHA-256 (16 hex digits) of its outputs and of its inputs' gradients on
fixed data (the products across the float32 slices' chunk size, a batched product, the
convolutions and pooling, the activations, the normalisations, the cross-entropy), each computed
on the first device. Where two machines' weights differ, the first op whose line differs is the
one to look at. Then the CNN: scikit-learn's bundled digits (offline, the same everywhere), 1,024
images, 2 epochs, batch 64, no Dropout by default (``--dropout`` adds it: the mask is keyed by the
seed alone on one device), and its weights' hash. Under ``patch(ops="exact")`` every line is the
same on every machine with the same TF build, and on GPUs across architectures for the ops the
docs list; ``--json`` prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--devices", type=int, default=None, help="use this many devices (default: all GPUs)")
parser.add_argument("--cpu", action="store_true", help="hide the GPUs")
parser.add_argument("--dropout", action="store_true", help="keep the CNN's Dropout layers")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--products", choices=("auto", "float64", "float32"), default=None,
                    help="the exact tier's product path (TFREPRO_EXACT_PRODUCTS; default: auto)")
parser.add_argument("--threads", type=int, default=None, help="patch(threads=N): TF's thread pools (default: TF's)")
parser.add_argument("--ops-only", action="store_true", help="the per-op hashes alone, no training")
parser.add_argument("--json", action="store_true", help="print one JSON object")
args = parser.parse_args()
if args.cpu:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
if args.products:
    os.environ["TFREPRO_EXACT_PRODUCTS"] = args.products

import tfrepro  # noqa: E402

tfrepro.patch(args.seed, ops="exact", threads=args.threads)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfrepro.ops.exact import slices  # noqa: E402


def _digest(*tensors: tf.Tensor) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(np.ascontiguousarray(tensor.numpy()).tobytes())
    return digest.hexdigest()[:16]


def _with_gradients(function, *inputs: np.ndarray) -> str:
    """The hash of ``function(*inputs)`` and of the gradients of its outputs' weighted sum."""
    tensors = [tf.constant(x) for x in inputs]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        out = function(*tensors)
        weights = tf.constant(np.linspace(-1.0, 1.0, int(np.prod(out.shape)), dtype=np.float32).reshape(out.shape))
        loss = tf.reduce_sum(out * weights)
    return _digest(out, *tape.gradient(loss, tensors))


def op_digests() -> dict[str, str]:
    rng = np.random.default_rng(1234)

    def data(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 2.0 ** rng.integers(-4, 5, shape)).astype(np.float32)

    keras = tf.keras
    norm, batch_norm = keras.layers.LayerNormalization(), keras.layers.BatchNormalization()
    labels = tf.constant(rng.integers(0, 10, 32))
    return {
        "matmul K=100": _with_gradients(tf.matmul, data(32, 100), data(100, 24)),
        "matmul K=3000": _with_gradients(tf.matmul, data(16, 3000), data(3000, 8)),
        "batched matmul (attention)": _with_gradients(lambda q, k: tf.einsum("bqd,bkd->bqk", q, k),
                                                      data(4, 9, 16), data(4, 9, 16)),
        "conv2d 3x3 SAME": _with_gradients(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"), data(4, 12, 12, 3),
                                           data(3, 3, 3, 8)),
        "conv2d 3x3/2 VALID": _with_gradients(lambda x, w: tf.nn.conv2d(x, w, 2, "VALID"), data(4, 13, 13, 8),
                                              data(3, 3, 8, 4)),
        "conv2d_transpose 3x3/2": _with_gradients(
            lambda x, w: tf.nn.conv2d_transpose(x, w, [4, 12, 12, 3], 2, "SAME"), data(4, 6, 6, 5), data(3, 3, 3, 5)),
        "max_pool 3x3/2": _with_gradients(lambda x: tf.nn.max_pool2d(x, 3, 2, "SAME"), data(4, 12, 12, 3)),
        "avg_pool 2x2": _with_gradients(lambda x: tf.nn.avg_pool2d(x, 2, 2, "VALID"), data(4, 12, 12, 3)),
        "softmax": _with_gradients(tf.nn.softmax, data(32, 10)),
        "log_softmax": _with_gradients(tf.nn.log_softmax, data(32, 10)),
        "tanh, sigmoid, gelu": _with_gradients(lambda x: tf.nn.gelu(tf.tanh(x) + tf.sigmoid(x)), data(32, 40)),
        "exp, log1p": _with_gradients(lambda x: tf.math.log1p(tf.exp(-tf.abs(x))), data(32, 40)),
        "reduce_sum over the batch": _with_gradients(lambda x: tf.reduce_sum(x, axis=0), data(64, 40)),
        "LayerNormalization": _with_gradients(lambda x: norm(x), data(32, 40)),
        "BatchNormalization (training)": _with_gradients(lambda x: batch_norm(x, training=True), data(32, 40)),
        "sparse softmax cross-entropy": _with_gradients(
            lambda z: tf.nn.sparse_softmax_cross_entropy_with_logits(labels, z), data(32, 10)),
    }


def main() -> None:
    from tfrepro.examples.datasets import load_mnist
    from tfrepro.examples.mnist_cnn import build_model, weights_digest

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    devices = (gpus or [d.name for d in tf.config.list_logical_devices("CPU")])[:args.devices or None]
    with tf.device(devices[0]):
        ops = op_digests()
    found = {"tensorflow": tf.__version__, "devices": devices, "products": slices.path(), "ops": ops}
    if not args.ops_only:
        strategy = (tf.distribute.MirroredStrategy(devices) if len(devices) > 1
                    else tf.distribute.OneDeviceStrategy(devices[0]))
        data = load_mnist(allow_download=False, limit=1024)
        with strategy.scope():
            model = build_model(tf.keras, dropout=args.dropout)
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.fit(data.x_train, data.y_train, batch_size=64, epochs=2, shuffle=False, verbose=0)
        found["weights"] = weights_digest(model)
    if args.json:
        print(json.dumps(found))
        return
    print(f"TF {found['tensorflow']}, devices: {', '.join(devices)}, exact products in {found['products']}")
    for name, digest in ops.items():
        print(f"  {name:32s} {digest}")
    if "weights" in found:
        print(f"exact-tier weights sha256: {found['weights']}")


if __name__ == "__main__":
    main()
