"""The order-invariant segment sum every tfrepro op is built on.

Floating-point addition is not associative, so a sum accumulated in thread-arrival order (GPU
atomics) changes its bits from run to run. Integer addition is associative. So each element is
turned into an integer by a scale that depends only on order-invariant quantities, summed in int64,
and scaled back:

- For each (segment, column): ``m`` = the largest finite magnitude (a max is exact), ``e`` with
  ``m < 2**e``, and ``n`` = the number of elements (exact). ``P = 62 - ceil(log2(n))`` bits.
- Each finite element becomes ``q = trunc(x * 2**(P - e))``; ``|q| < 2**P``, so the int64 sum of
  ``n`` of them stays below ``2**62``: no overflow, for any segment size.
- The int64 sum is converted to float64 and scaled by ``2**(e - P)``, then rounded once to the
  output dtype (float16/bfloat16 data is summed as float32, exactly upcast). NaN and infinities are counted separately, with IEEE semantics (NaN if any NaN or
  both infinities, else the infinity present).

Accuracy: the absolute error is below ``n * m * 2**-P`` (quantisation) plus the final rounding; with
``P >= 24`` that beats a float32 sum's bound ``(n - 1) * 2**-24 * sum|x|`` for every segment of up to
``2**38`` elements, and a float64 sum's bound for every segment of up to ``2**9`` elements (beyond,
the extra error stays below ``n * m * 2**-62``). Elements smaller than ``m * 2**-P`` vanish, as they
do in a float sum that holds ``m``. The result is the same for every order
and layout of the inputs; it is not bit-equal to TF's float sum (which has no single answer).
Signed zeros sum to +0.0.
"""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock

# Per working dtype: (bits type, mantissa bits, exponent bias, exponent mask, largest exponent a
# single power-of-two factor may have). float16/bfloat16/float32 work in float32 (exact upcast).
_LAYOUT = {
    tf.float32: (tf.int32, 23, 127, 0xFF, 120),
    tf.float64: (tf.int64, 52, 1023, 0x7FF, 1000),
}


def _exponent(m: tf.Tensor) -> tf.Tensor:
    """For finite ``m >= 0``: the int32 ``e`` with ``m < 2**e`` (and ``m >= 2**(e-1)`` if m is normal)."""
    bits, mantissa, bias, mask, _ = _LAYOUT[m.dtype]
    biased = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.bitcast(m, bits), mantissa), mask)
    return tf.cast(tf.maximum(biased, 1) - (bias - 1), tf.int32)


def _bit_length(count: tf.Tensor) -> tf.Tensor:
    """``ceil(log2(count))`` for int counts >= 1 (0 for 1), exactly, via the float64 exponent."""
    below = tf.cast(tf.maximum(count - 1, 0), tf.float64)
    return tf.where(below > 0, _exponent(below), 0)


def _exact_pow2(k: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``2**k`` in ``dtype``, built from its bits, for k in the dtype's normal exponent range."""
    bits, mantissa, bias, _, _ = _LAYOUT[dtype]
    return tf.bitcast(tf.bitwise.left_shift(tf.cast(k + bias, bits), mantissa), dtype)


def _pow2(shift: tf.Tensor, dtype: tf.DType) -> tuple[tf.Tensor, tf.Tensor]:
    """Two factors of ``dtype`` whose product is exactly ``2**shift`` (shift clipped to the range two
    normal factors can span)."""
    limit = _LAYOUT[dtype][4]
    shift = tf.clip_by_value(shift, -2 * limit, 2 * limit)
    half = tf.math.floordiv(shift, 2)
    return _exact_pow2(half, dtype), _exact_pow2(shift - half, dtype)


def segment_sum_2d(data: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    """Order-invariant ``unsorted_segment_sum`` of float ``data`` [N, K] by ``segment_ids`` [N]
    (negative ids dropped) into [num_segments, K], in float32 (float64 for float64 data). Ids >=
    num_segments raise InvalidArgumentError from TF's own kernels on CPU; GPU kernels drop them."""
    dtype = tf.float64 if data.dtype == tf.float64 else tf.float32
    x = tf.cast(data, dtype)
    all_finite = tf.math.is_finite(tf.reduce_sum(x))  # any NaN or infinity makes the sum non-finite
    return tf.cond(all_finite, lambda: _finite_sum(x, segment_ids, num_segments),
                   lambda: _with_non_finite(x, segment_ids, num_segments))


def _finite_sum(x: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    magnitude = tf.maximum(_stock.unsorted_segment_max(tf.abs(x), segment_ids, num_segments), 0)
    counts = _stock.unsorted_segment_sum(tf.ones_like(segment_ids, dtype=tf.int32), segment_ids, num_segments)
    precision = 62 - _bit_length(counts)  # [S]
    shift = precision[:, None] - _exponent(magnitude)  # [S, K]: |x| * 2**shift < 2**P
    rows = tf.maximum(segment_ids, 0)  # negative ids are dropped by the segment sum below

    def one_factor() -> tf.Tensor:  # the common case: 2**shift is a normal number of x's dtype
        return x * _stock.gather(_exact_pow2(shift, x.dtype), rows)

    def two_factors() -> tf.Tensor:  # segments of tiny magnitudes need scales beyond the dtype's range
        up_a, up_b = _pow2(shift, x.dtype)
        return x * _stock.gather(up_a, rows) * _stock.gather(up_b, rows)

    bias = _LAYOUT[x.dtype][2]
    in_range = (tf.reduce_max(shift) < bias) & (tf.reduce_min(shift) > -bias)
    scaled = tf.cond(in_range, one_factor, two_factors)
    quantised = tf.cast(scaled, tf.int64)  # truncation toward zero: |error| < 1 quantum per element
    total = tf.cast(_stock.unsorted_segment_sum(quantised, segment_ids, num_segments), tf.float64)
    down_a, down_b = _pow2(-shift, tf.float64)
    return tf.cast(total * down_a * down_b, x.dtype)


def _with_non_finite(x: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
    """The finite elements summed exactly, then IEEE semantics for the non-finite ones."""
    finite = tf.math.is_finite(x)
    result = _finite_sum(tf.where(finite, x, tf.zeros_like(x)), segment_ids, num_segments)

    def present(mask: tf.Tensor) -> tf.Tensor:
        return _stock.unsorted_segment_max(tf.cast(mask, tf.int32), segment_ids, num_segments) > 0

    nan, pos, neg = present(tf.math.is_nan(x)), present(tf.equal(x, float("inf"))), present(tf.equal(x, float("-inf")))
    inf = tf.constant(float("inf"), x.dtype)
    result = tf.where(neg, -inf, result)
    result = tf.where(pos, inf, result)
    return tf.where(nan | (pos & neg), tf.constant(float("nan"), x.dtype), result)
