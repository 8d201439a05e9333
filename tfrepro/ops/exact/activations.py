"""The exact tier's ``softmax`` and ``log_softmax``: the same bits with XLA and without, with oneDNN
on and off, at any thread count, and for any order of the classes.

Both are computed as the cross-entropies compute them (``losses``): in float64, ``z - max`` exactly,
the FMA-proof ``exp``, the row's sum as an exact fixed-point sum, ``softmax = exp / sum`` and
``log_softmax = (z - max) - log(sum)`` with ``log1p`` near 1, each rounded once to the input's
dtype: within an ulp of the float64 result (tested). Their gradients, ``y * (dy - sum(dy * y))``
and ``dy - softmax * sum(dy)``, sum exactly too, with every product rounded through its bits.
Second-order gradients are refused by name, as through the tier's other ops.
"""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops.exact import _fixed
from tfrepro.ops.exact.losses import _known_rank, _log_softmax_parts


def _last_axis(x: tf.Tensor, axis: int) -> tuple[tf.Tensor, list[int] | None]:
    """``x`` with ``axis`` moved last, and the permutation that moves it back (None: it was last)."""
    rank = x.shape.rank
    axis = axis % rank
    if axis == rank - 1:
        return x, None
    perm = [i for i in range(rank) if i != axis] + [axis]
    return tf.transpose(x, perm), [perm.index(i) for i in range(rank)]


def _normalised(logits, axis: int, name: str, log: bool) -> tf.Tensor:
    with tf.name_scope(name):
        logits = tf.convert_to_tensor(logits)
        if not logits.dtype.is_floating:
            raise TypeError(f"{name}: logits must be a float tensor; got {logits.dtype.name}")
        _known_rank(logits, "softmax")
        z, back = _last_axis(logits, -1 if axis is None else axis)
        dtype = z.dtype

        @_fixed.custom_gradient
        def normalise(z):
            shifted, e, total, log_total = _log_softmax_parts(z, -1)
            softmax = e / total

            def gradient(dy):
                dy = tf.cast(dy, tf.float64)
                if log:  # d log_softmax: dy - softmax * sum(dy)
                    dx = dy - _fixed.mul(softmax, _fixed.exact_batch_sum(dy, [-1])[..., None])
                else:  # d softmax: y * (dy - sum(dy * y))
                    dx = _fixed.mul(softmax, dy - _fixed.exact_batch_sum(_fixed.mul(dy, softmax), [-1])[..., None])
                return _fixed.first_order_only(tf.cast(dx, dtype), "a softmax")

            return tf.cast(shifted - log_total if log else softmax, dtype), gradient

        result = normalise(z)
        return result if back is None else tf.transpose(result, back)


def softmax(logits, axis=None, name=None):
    """``tf.nn.softmax`` with bits that XLA, oneDNN, threads and the classes' order cannot change
    (module doc). ``axis`` None is the last axis, as TF's."""
    return _normalised(logits, axis, name or "ExactSoftmax", log=False)


def log_softmax(logits, axis=None, name=None):
    """``tf.nn.log_softmax`` with bits that XLA, oneDNN, threads and the classes' order cannot change
    (module doc). ``axis`` None is the last axis, as TF's."""
    return _normalised(logits, axis, name or "ExactLogSoftmax", log=True)
