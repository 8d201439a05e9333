"""The exact tier's layer normalisation: Keras's ``LayerNormalization`` (Keras 3, tf-keras and the
Keras 2 of TF 2.12-2.15) computed as one op, the same bits for any thread count, with oneDNN on and
off, with XLA on and off, and on one device or several replicas.

Keras computes a layer norm as ``x * inv + (beta - mean * inv)`` (Keras 3) or through a fused batch
norm and ``y * gamma + beta`` (tf-keras): multiply-adds that XLA fuses, a fused kernel whose sums
follow the threads, and per-replica float sums of the ``gamma`` and ``beta`` gradients. Here, in
float64: the mean and the variance are exact fixed-point sums (``_fixed.exact_batch_sum``) times
``1 / n``; ``inv = 1 / sqrt(variance + epsilon)``; ``y = (x - mean) * inv * gamma + beta``, every
product rounded through ``_fixed.barrier`` before it is added to, rounded once to the input's dtype.
The gradient is the layer norm's own, ``inv * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dy *
gamma``, its sums exact; ``gamma``'s and ``beta``'s are exact sums over the batch rounded to float64
and then to the weight's dtype, global over replicas (whole on the first, zero on the others,
which the strategy's all-reduce adds exactly).

Within about ``2**-40`` relative of the float64 layer norm before the final rounding (tested).
Not covered, and left to Keras's own ``call`` (which the audit then names): Keras 3's
``rms_scaling``, ragged inputs (tf-keras), inputs of unknown rank or of a dtype outside the tier's,
and normalised axes of unknown size. Second-order gradients are refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tensorflow as tf

from tfrepro import _targets
from tfrepro._import_hooks import call_after_import
from tfrepro.ops.exact import _fixed
from tfrepro.ops.exact.linalg import EXACT_DTYPES, weight_gradient_replicas


def _row_sum(x: tf.Tensor, axes: list[int]) -> tf.Tensor:
    """The exact sum over ``axes``, kept as size-1 dimensions."""
    total = _fixed.exact_batch_sum(x, axes)
    for axis in axes:
        total = tf.expand_dims(total, axis)
    return total


def layer_normalization(x: tf.Tensor, gamma: tf.Tensor | None, beta: tf.Tensor | None, axes: list[int],
                        epsilon: float, replicas: _fixed.Replicas | None = None) -> tf.Tensor:
    """``(x - mean) / sqrt(variance + epsilon) * gamma + beta`` over ``axes`` (module doc).

    Args:
        x: a float16, bfloat16 or float32 tensor of known rank whose ``axes`` have known sizes.
        gamma: the scale, shaped as ``x``'s ``axes`` (or broadcastable to ``x``), or None.
        beta: the offset, likewise, or None.
        axes: the normalised axes.
        epsilon: added to the variance.
        replicas: where ``gamma`` and ``beta`` are weights, the replicas their gradients sum over.

    Returns:
        The normalised ``x``, in ``x``'s dtype.
    """
    with tf.name_scope("ExactLayerNormalization"):
        dtype, rank = x.dtype, x.shape.rank
        axes = sorted(axis % rank for axis in axes)
        others = [axis for axis in range(rank) if axis not in axes]
        kept = [x.shape[axis] if axis in axes else 1 for axis in range(rank)]
        inverse_n = 1.0 / math.prod(kept)
        gamma, beta = (None if p is None else tf.convert_to_tensor(p) for p in (gamma, beta))  # variables read
        params = [p for p in (gamma, beta) if p is not None]

        def broadcast(p: tf.Tensor) -> tf.Tensor:
            p = tf.cast(p, tf.float64)
            return p if p.shape.rank == rank else tf.reshape(p, kept)

        @_fixed.custom_gradient
        def normalise(v, *weights):
            g = broadcast(weights[0]) if gamma is not None else None
            b = broadcast(weights[-1]) if beta is not None else None
            x64 = tf.cast(v, tf.float64)
            mean = _fixed.mul(_row_sum(x64, axes), inverse_n)
            centred = x64 - mean
            variance = _fixed.mul(_row_sum(_fixed.mul(centred, centred), axes), inverse_n)
            inv = 1.0 / _fixed.barrier(tf.sqrt(variance + epsilon))
            xhat = _fixed.mul(centred, inv)
            y = xhat if g is None else _fixed.mul(xhat, g)
            if b is not None:
                y = y + b

            def gradient(dy):
                dy = tf.cast(dy, tf.float64)
                gdy = dy if g is None else _fixed.mul(dy, g)
                mean_g = _fixed.mul(_row_sum(gdy, axes), inverse_n)
                mean_gx = _fixed.mul(_row_sum(_fixed.mul(gdy, xhat), axes), inverse_n)
                dx = _fixed.mul(inv, (gdy - mean_g) - _fixed.mul(xhat, mean_gx))
                grads = [_fixed.first_order_only(_fixed.narrow(dx, dtype), "a layer normalisation")]
                for p, term in ((gamma, _fixed.mul(dy, xhat)), (beta, dy)):
                    if p is not None:
                        total = _fixed.exact_batch_sum(term, others, replicas)
                        grads.append(_fixed.first_order_only(_fixed.narrow(tf.reshape(total, tf.shape(p)), p.dtype),
                                                             "a layer normalisation"))
                return grads

            return _fixed.narrow(y, dtype), gradient

        return normalise(x, *params)


def _covered_input(inputs, axes: list[int]) -> bool:
    shape = getattr(inputs, "shape", None)
    return (isinstance(inputs, tf.Tensor) and inputs.dtype in EXACT_DTYPES and shape.rank is not None
            and all(shape[axis] is not None for axis in axes))


def _keras_call(original: Callable) -> Callable:
    """``LayerNormalization.call`` of any Keras, through ``layer_normalization`` where it is covered."""
    def call(self, inputs):  # Keras's own signature: Keras reads it to choose what to pass
        axes = [self.axis] if isinstance(self.axis, int) else list(self.axis)
        dtype = tf.as_dtype(self.compute_dtype)
        x = inputs
        if getattr(self, "autocast", True) and isinstance(inputs, tf.Tensor):  # tf-keras casts the input first;
            x = tf.cast(inputs, dtype)  # Keras 3 (autocast off) normalises it as it comes, then casts the output
        if getattr(self, "rms_scaling", False) or dtype not in EXACT_DTYPES or not _covered_input(x, axes):
            with _fixed.unmarked():
                return original(self, inputs)
        gamma, beta = (getattr(self, name, None) if getattr(self, flag, True) else None
                       for name, flag in (("gamma", "scale"), ("beta", "center")))
        with _fixed.marking():  # not coverage.covered: its (*args, **kwargs) would make tf-keras pass training=
            return tf.cast(layer_normalization(x, gamma, beta, axes, self.epsilon, weight_gradient_replicas(True)),
                           dtype)

    call.__doc__ = original.__doc__
    return call


def install() -> Callable[[], None]:
    """Make ``LayerNormalization`` exact in every Keras this process loads, now or when it is
    imported; returns the undo."""
    saved = []
    active = [True]

    def hook(key: str) -> Callable:
        def replace(module) -> None:
            if not active[0] or _targets.find(module, key) is None:
                return
            cls = module.LayerNormalization
            original = cls.__dict__["call"]
            saved.append((cls, original))
            cls.call = _keras_call(original)

        return replace

    call_after_import({entry.module: hook(entry.key) for entry in _targets.for_role("layer_norm")})

    def undo() -> None:
        active[0] = False
        for cls, original in reversed(saved):
            cls.call = original

    return undo
