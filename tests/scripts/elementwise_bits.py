"""Hash every elementwise op of the exact tier's training step at a given thread count.

usage: elementwise_bits.py THREADS

Each op runs on 1,000,003 elements (an odd count, so every vectorised kernel has a scalar tail whose
position depends on how the work is split across threads) inside a tf.function, as in a train step.
"""

import hashlib
import json
import sys

import tfrepro

threads = int(sys.argv[1])
tfrepro.patch(0, threads=threads, ops="exact", on_uncovered="warn")  # TF's sqrt, a*b+c, ... are named: measured here

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfrepro.ops.exact import _elementary, _fixed  # noqa: E402

rng = np.random.default_rng(0)
n = 1_000_003
x = tf.constant(rng.standard_normal(n).astype(np.float32) * 4)
y = tf.constant(rng.standard_normal(n).astype(np.float32))
positive = tf.abs(x) + 0.5
x64, y64 = tf.cast(x, tf.float64), tf.cast(y, tf.float64)
OPS = {
    "add": lambda: x + y, "subtract": lambda: x - y, "multiply": lambda: x * y, "divide": lambda: x / positive,
    "relu": lambda: tf.nn.relu(x), "relu_grad": lambda: tf.where(x > 0, y, tf.zeros_like(y)),
    "maximum": lambda: tf.maximum(x, y), "sqrt": lambda: tf.sqrt(positive), "square": lambda: tf.square(x),
    "exp": lambda: tf.exp(x), "log": lambda: tf.math.log(positive), "tanh": lambda: tf.tanh(x),
    "sigmoid": lambda: tf.sigmoid(x), "softmax": lambda: tf.nn.softmax(tf.reshape(x[:1_000_000], [-1, 10])),
    "cast_f64": lambda: tf.cast(x, tf.float64), "cast_f32": lambda: tf.cast(x64 * y64, tf.float32),
    "round": lambda: tf.round(x * 1000.0), "exact_exp": lambda: _elementary.exp(-tf.abs(x64)),
    "exact_log": lambda: _elementary.log(tf.abs(x64) + 1.0), "barrier": lambda: _fixed.mul(x64, y64) + y64,
    "gelu": lambda: tf.nn.gelu(x), "swish": lambda: tf.nn.silu(x), "softplus": lambda: tf.math.softplus(x),
    "rsqrt": lambda: tf.math.rsqrt(positive), "sigmoid_xent": lambda: tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.sigmoid(y), logits=x),
    "bias_add": lambda: tf.nn.bias_add(tf.reshape(x[:1_000_000], [-1, 100]), y[:100]),
}
hashes = {}
for name, op in OPS.items():
    value = tf.function(op)()
    hashes[name] = hashlib.sha256(np.ascontiguousarray(value.numpy()).tobytes()).hexdigest()
print(json.dumps({"threads": threads, "ops": hashes}))
