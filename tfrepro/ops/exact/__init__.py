"""The exact tier, ``patch(ops="exact")``: the ops of a training step whose result depends on the
order of accumulation run exact, order-invariant versions (those below; the ones it does not cover
are refused by name, ``refusals``), so training gives the same bits for any thread count, with
oneDNN on or off, with XLA on or off, and on one device or several replicas with the same global
batch (tested with 2; docs/explanation/exact-tier.md states the limits).

- ``_fixed``: the exact fixed-point product and sum (the method and its accuracy bound), replica-
  global sums, and the FMA barrier.
- ``linalg``: ``matmul`` (``Dense``, ``tensordot``) and ``einsum`` (attention).
- ``convolutions``: 1-D and 2-D convolutions as exact products of patches.
- ``pooling``: max and average pooling, overlapping windows too, XLA-compilable gradients.
- ``noise``: dropout with a mask from integer random bits.
- ``losses``: the softmax and sigmoid cross-entropies.
- ``activations``: ``softmax``, ``log_softmax``, ``tanh``, ``sigmoid``, ``silu``, ``gelu``, ``elu``,
  ``selu``, ``softplus``, in float64 from the FMA-proof functions of ``_elementary``.
- ``transcendental``: ``exp``, ``expm1``, ``log``, ``log1p``, ``rsqrt`` the same way.
- ``arithmetic``: ``divide`` and ``divide_no_nan``, whose quotients XLA's reciprocal rewrite cannot change,
  and ``add`` of a broadcast weight, whose gradient is replica-global.
- ``reductions``: ``reduce_sum``, ``reduce_mean``, ``bias_add``.
- ``optimizers``: Keras 3's Adam and SGD updates, FMA-proof.
- ``normalization``: Keras's ``LayerNormalization`` and ``BatchNormalization``, each one exact op with
  replica-global weight gradients (a synchronized batch norm's statistics global too).
- ``recurrent``: Keras 3's ``LSTMCell``, its carry ``f * c + i * g`` a sum of exact products, and
  ``GRUCell``, its products that an add reads passed on through the barrier.
- ``refusals``: what is not covered raises by name.
- ``coverage``: the audit of every traced step: what is not covered is named before it runs.

``TABLE`` maps each op to its replacement and the names it is bound under (``rebinding``'s format).
"""

from __future__ import annotations

import importlib
from typing import Any

# op name -> (module, function, targets)
_BINDINGS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "matmul": ("linalg", "matmul", ("tf.matmul", "tf.linalg.matmul", "tf.compat.v1.matmul",
                                    "tensorflow.python.ops.math_ops:matmul")),
    "einsum": ("linalg", "einsum", ("tf.einsum", "tf.linalg.einsum")),
    "convolution": ("convolutions", "convolution", ("tf.nn.convolution",)),
    "convolution_v1": ("convolutions", "convolution_v1", ("tf.compat.v1.nn.convolution",)),
    "conv2d": ("convolutions", "conv2d", ("tf.nn.conv2d",)),
    "conv1d": ("convolutions", "conv1d", ("tf.nn.conv1d",)),
    "conv2d_v1": ("convolutions", "conv2d_v1", ("tf.compat.v1.nn.conv2d", "tf.compat.v2.compat.v1.nn.conv2d")),
    "conv1d_v1": ("convolutions", "conv1d_v1", ("tf.compat.v1.nn.conv1d", "tf.compat.v2.compat.v1.nn.conv1d")),
    "conv_transpose": ("convolutions", "conv_transpose", ("tf.nn.conv_transpose",)),
    "conv2d_transpose": ("convolutions", "conv2d_transpose", ("tf.nn.conv2d_transpose",)),
    "conv1d_transpose": ("convolutions", "conv1d_transpose", ("tf.nn.conv1d_transpose",)),
    "conv2d_transpose_v1": ("convolutions", "conv2d_transpose_v1", ("tf.compat.v1.nn.conv2d_transpose",
                                                                    "tf.compat.v2.compat.v1.nn.conv2d_transpose")),
    "max_pool": ("pooling", "max_pool", ("tf.nn.max_pool", "tf.nn.max_pool1d")),
    "max_pool_v1": ("pooling", "max_pool_v1", ("tf.compat.v1.nn.max_pool", "tf.compat.v2.compat.v1.nn.max_pool")),
    "max_pool2d": ("pooling", "max_pool2d", ("tf.nn.max_pool2d",)),
    "avg_pool": ("pooling", "avg_pool", ("tf.nn.avg_pool", "tf.nn.avg_pool1d")),
    "avg_pool_v1": ("pooling", "avg_pool_v1", ("tf.compat.v1.nn.avg_pool", "tf.compat.v2.compat.v1.nn.avg_pool")),
    "avg_pool2d": ("pooling", "avg_pool2d", ("tf.nn.avg_pool2d",)),
    "stateless_dropout": ("noise", "stateless_dropout", ("tf.nn.experimental.stateless_dropout",)),
    "general_dropout": ("noise", "general_dropout", ("tf.nn.experimental.general_dropout",)),
    "reduce_sum": ("reductions", "reduce_sum", ("tf.reduce_sum", "tf.math.reduce_sum",
                                                "tensorflow.python.ops.math_ops:reduce_sum")),
    "reduce_mean": ("reductions", "reduce_mean", ("tf.reduce_mean", "tf.math.reduce_mean",
                                                  "tensorflow.python.ops.math_ops:reduce_mean")),
    "bias_add": ("reductions", "bias_add", ("tf.nn.bias_add", "tf.compat.v1.nn.bias_add",
                                            "tensorflow.python.ops.nn_ops:bias_add")),
    "softmax_cross_entropy_with_logits": ("losses", "softmax_cross_entropy_with_logits", (
        "tf.nn.softmax_cross_entropy_with_logits",)),
    "softmax_cross_entropy_with_logits_v1": ("losses", "softmax_cross_entropy_with_logits_v1", (
        "tf.compat.v1.nn.softmax_cross_entropy_with_logits_v2",
        "tensorflow.python.ops.nn_ops:softmax_cross_entropy_with_logits_v2")),
    "softmax": ("activations", "softmax", ("tf.nn.softmax", "tf.math.softmax")),
    "divide": ("arithmetic", "divide", ("tf.divide", "tf.math.divide")),
    "add": ("arithmetic", "add", ("tf.add", "tf.math.add")),
    "divide_no_nan": ("arithmetic", "divide_no_nan", ("tf.math.divide_no_nan", "tf.compat.v1.div_no_nan")),
    "log_softmax": ("activations", "log_softmax", ("tf.nn.log_softmax", "tf.math.log_softmax")),
    "sigmoid_cross_entropy_with_logits": ("losses", "sigmoid_cross_entropy_with_logits", (
        "tf.nn.sigmoid_cross_entropy_with_logits",)),
    "tanh": ("activations", "tanh", ("tf.tanh", "tf.math.tanh", "tf.nn.tanh")),
    "sigmoid": ("activations", "sigmoid", ("tf.sigmoid", "tf.math.sigmoid", "tf.nn.sigmoid")),
    "silu": ("activations", "silu", ("tf.nn.silu", "tf.nn.swish")),
    "gelu": ("activations", "gelu", ("tf.nn.gelu",)),
    "elu": ("activations", "elu", ("tf.nn.elu",)),
    "selu": ("activations", "selu", ("tf.nn.selu",)),
    "softplus": ("activations", "softplus", ("tf.math.softplus", "tf.nn.softplus")),
    "exp": ("transcendental", "exp", ("tf.exp", "tf.math.exp")),
    "expm1": ("transcendental", "expm1", ("tf.math.expm1",)),
    "log": ("transcendental", "log", ("tf.math.log",)),
    "log1p": ("transcendental", "log1p", ("tf.math.log1p",)),
    "rsqrt": ("transcendental", "rsqrt", ("tf.math.rsqrt",)),
    "sparse_softmax_cross_entropy_with_logits": ("losses", "sparse_softmax_cross_entropy_with_logits", (
        "tf.nn.sparse_softmax_cross_entropy_with_logits",
        "tensorflow.python.ops.nn_ops:sparse_softmax_cross_entropy_with_logits_v2")),
}
EXACT_OPS = tuple(_BINDINGS)


def table() -> dict[str, tuple[Any, tuple[str, ...]]]:
    """The exact tier's ops in ``rebinding.TABLE``'s format (imports TensorFlow), refusals included."""
    from tfrepro.ops.exact import coverage, refusals

    found = {name: (coverage.covered(getattr(importlib.import_module(f"{__name__}.{module}"), function)), targets)
             for name, (module, function, targets) in _BINDINGS.items()}
    for api, targets in refusals.REFUSED.items():
        found[f"refused {api}"] = (refusals.refusing(api), targets)
    return found


_SUBMODULES = ("_elementary", "_fixed", "activations", "arithmetic", "convolutions", "coverage", "linalg", "losses",
               "noise", "normalization", "optimizers", "pooling", "recurrent", "reductions", "refusals", "transcendental")


def __getattr__(name: str) -> Any:
    """``tfrepro.ops.exact.coverage`` and the other submodules, imported on first use (they import
    TensorFlow)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
