"""The exact tier's dropout: a mask from integer random bits, the same under XLA and without.

TF's ``stateless_dropout`` draws uniform floats, whose conversion from random bits XLA compiles
differently (measured: a different mask with ``jit_compile=True``). Here the mask keeps an element
where the high 24 bits of a Philox ``uint32`` draw, which both paths give bit for bit, reach
``round(rate * 2**24)``; kept elements are scaled by ``1 / (1 - rate)`` computed in float64 and
rounded once to the input's dtype (TF rounds twice: it may differ from TF's scale by an ulp).
"""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops.exact import _fixed
from tfrepro.ops.exact.linalg import EXACT_DTYPES

THRESHOLD_BITS = 24


def _masked(x, rate, bits_of_shape, noise_shape):
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise ValueError(f"x has to be a floating point tensor since it's going to be scaled; got {x.dtype}")
    if isinstance(rate, (int, float)) and not 0 <= rate < 1:
        raise ValueError(f"rate must be a scalar tensor or a float in the range [0, 1). Got {rate}")
    rate = tf.cast(rate, tf.float64)
    shape = tf.shape(x) if noise_shape is None else noise_shape
    threshold = tf.cast(tf.round(rate * 2.0**THRESHOLD_BITS), tf.int32)
    keep = tf.cast(tf.bitwise.right_shift(bits_of_shape(shape), 32 - THRESHOLD_BITS), tf.int32) >= threshold
    scale = tf.cast(1.0 / (1.0 - rate), x.dtype)
    if x.dtype not in EXACT_DTYPES:  # float64: TF's product, which the audit checks
        with _fixed.unmarked():
            return tf.where(keep, x * scale, tf.zeros_like(x))
    by = tf.cast(scale, tf.float64)

    @_fixed.custom_gradient
    def dropped(v):
        # v * scale is exact in float64, so rounding it once gives TF's float product; the barrier
        # keeps XLA from fusing it into an add that follows (a residual connection). Linear: the
        # gradient (of any order) is the same map.
        v = tf.convert_to_tensor(v)  # a gradient may arrive as IndexedSlices
        scaled = _fixed.narrow(_fixed.mul(tf.cast(v, tf.float64), by), v.dtype)
        return tf.where(keep, scaled, tf.zeros_like(v)), dropped

    return dropped(x)


def general_dropout(x, rate, uniform_sampler, noise_shape=None, name=None):
    """``tf.nn.experimental.general_dropout`` with an XLA-invariant mask: ``uniform_sampler`` (a
    ``tf.random.Generator``'s ``uniform``, as tf-keras passes) is asked for full-range uint32 bits."""
    with tf.name_scope(name or "ExactDropout"):
        return _masked(x, rate, lambda shape: uniform_sampler(shape=shape, minval=None, maxval=None, dtype=tf.uint32),
                       noise_shape)


def stateless_dropout(x, rate, seed, rng_alg=None, noise_shape=None, name=None):
    """``tf.nn.experimental.stateless_dropout`` with an XLA-invariant mask (module doc). ``rng_alg``
    other than Philox runs TF's op."""
    if rng_alg not in (None, "philox", tf.random.Algorithm.PHILOX, 1):
        with _fixed.unmarked():
            return _stock.stateless_dropout(x, rate, seed, rng_alg=rng_alg, noise_shape=noise_shape, name=name)
    with tf.name_scope(name or "ExactDropout"):
        seed = tf.convert_to_tensor(seed)
        return _masked(x, rate, lambda shape: tf.random.stateless_uniform(
            shape, seed, minval=None, maxval=None, dtype=tf.uint32, alg="philox"), noise_shape)
