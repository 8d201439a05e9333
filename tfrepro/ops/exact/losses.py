"""The exact tier's softmax cross-entropies, and the FMA-proof ``exp`` and ``log`` they use.

TF's ``exp`` and ``log`` kernels and XLA's differ in their last bits (measured on TF 2.21's CPU),
and XLA contracts multiply-adds in fused code. So the cross-entropies here compute ``exp`` (a
Cody-Waite reduction and a degree-13 Taylor polynomial) and ``log`` (an ``atanh`` series) in
float64 from multiplications, additions and divisions alone, each product rounded through
``_fixed.barrier`` before it is added to: the same bits with XLA and without, at any thread count.
Both are accurate to about 1e-13 relative (the barriers round each step to 48 bits), far below
the float32 result's rounding. The class sums
are exact fixed-point sums (``_fixed.exact_batch_sum``). The loss is ``log(sum(exp(z - max))) -
(z - max)[label]`` rounded once to the logits' dtype; its gradient ``softmax - labels``.
"""

from __future__ import annotations

import math

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops._exact_sum import _pow2
from tfrepro.ops.exact import _fixed

_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # 32 significant bits: n * _LN2_HI is exact for |n| < 2**21
_LN2_LO = math.log(2) - _LN2_HI
_EXP_TERMS = [1.0 / math.factorial(i) for i in range(14)]
_ATANH_TERMS = [1.0 / (2 * j + 1) for j in range(14)]


def exp(x: tf.Tensor) -> tf.Tensor:
    """``e**x`` in float64 for float64 ``x`` (module doc); 0 below -745, inf above 709.78."""
    x = tf.clip_by_value(x, -746.0, 710.0)
    n = tf.round(x * (1.0 / math.log(2)))
    r = (x - n * _LN2_HI) - _fixed.mul(n, _LN2_LO)
    p = tf.fill(tf.shape(r), tf.constant(_EXP_TERMS[-1], tf.float64))
    for c in reversed(_EXP_TERMS[:-1]):
        p = _fixed.mul(p, r) + c
    for factor in _pow2(tf.cast(n, tf.int32), tf.float64):
        p = p * factor
    return p


def log(x: tf.Tensor) -> tf.Tensor:
    """``ln(x)`` in float64 for positive, finite, normal float64 ``x`` (module doc)."""
    bits = tf.bitcast(x, tf.int64)
    k = tf.bitwise.right_shift(bits, 52) - 1023
    f = tf.bitcast(bits - tf.bitwise.left_shift(k, 52), tf.float64)  # in [1, 2)
    big = f > math.sqrt(2)
    f = tf.where(big, f * 0.5, f)
    k = tf.cast(tf.where(big, k + 1, k), tf.float64)
    t = (f - 1.0) / (f + 1.0)
    return (k * _LN2_HI + _fixed.mul(k, _LN2_LO)) + _atanh_series(t, 2.0)


def log1p(x: tf.Tensor) -> tf.Tensor:
    """``ln(1 + x)`` in float64 for non-negative, finite float64 ``x``, accurate relative to the
    result however small ``x`` is (``log(1 + x)`` loses ``x``'s low bits in ``1 + x``)."""
    small = x < math.sqrt(2) - 1
    t = x / (2.0 + x)  # ln(1 + x) = 2 atanh(x / (2 + x)), |t| < 0.18 where it is used
    return tf.where(small, _atanh_series(t, 2.0), log(tf.where(small, tf.ones_like(x), 1.0 + x)))


def _atanh_series(t: tf.Tensor, factor: float) -> tf.Tensor:
    """``factor * atanh(t)`` for ``|t| < 0.18``: 14 terms of its odd series, FMA-proof."""
    u = _fixed.mul(t, t)
    p = tf.fill(tf.shape(u), tf.constant(_ATANH_TERMS[-1], tf.float64))
    for c in reversed(_ATANH_TERMS[:-1]):
        p = _fixed.mul(p, u) + c
    return _fixed.mul(factor * t, p)


def _log_softmax_parts(logits: tf.Tensor, axis: int):
    """``z - max`` (float64), ``exp`` of it, and per row the sum of the exps and its log, for the
    last ``axis``. The sum is ``m + rest``: ``m`` terms are ``exp(0) = 1`` (the maxima), ``rest`` an
    exact sum of the others, so ``log(total) = log1p(m - 1 + rest)`` keeps a confident row's tiny
    loss to its float32 ulp (``log`` of the rounded total lost it by up to 12 ulps)."""
    z = tf.cast(logits, tf.float64)
    shifted = z - tf.reduce_max(z, axis=axis, keepdims=True)
    e = exp(shifted)
    top = tf.equal(shifted, 0.0)
    count = tf.reduce_sum(tf.cast(top, tf.float64), axis=axis, keepdims=True)  # small integers: exact
    rest = tf.expand_dims(_fixed.exact_batch_sum(tf.where(top, tf.zeros_like(e), e), [axis]), axis)
    return shifted, e, count + rest, log1p((count - 1.0) + rest)


def _with_softmax_gradient(logits, labels_prob, loss_of, labels=None):
    """``loss_of(shifted, log_total)`` with the gradient ``softmax - labels`` (softmax = e / total),
    and, for dense ``labels``, their gradient ``-log_softmax`` (TF's)."""
    dtype = logits.dtype

    def compute(z):
        shifted, e, total, log_total = _log_softmax_parts(z, -1)
        loss = loss_of(shifted, log_total)

        def logits_grad(dloss):
            softmax = e / total
            return _fixed.first_order_only(tf.cast((softmax - labels_prob(z)) * tf.cast(dloss, tf.float64)[..., None],
                                                   dtype), "a softmax cross-entropy")

        def labels_grad(dloss):
            return -(shifted - log_total) * tf.cast(dloss, tf.float64)[..., None]

        return tf.cast(loss, dtype), logits_grad, labels_grad

    if labels is None:
        @_fixed.custom_gradient
        def xent(z):
            loss, logits_grad, _ = compute(z)
            return loss, logits_grad

        return xent(logits)

    @_fixed.custom_gradient
    def xent_with_labels(z, y):
        loss, logits_grad, labels_grad = compute(z)
        return loss, lambda dloss: (logits_grad(dloss), tf.cast(labels_grad(dloss), y.dtype))

    return xent_with_labels(logits, labels)


def _known_rank(logits: tf.Tensor, what: str) -> None:
    if logits.shape.rank is None:
        raise NotImplementedError(f"tfrepro exact tier: {what} of logits of unknown rank is not covered (its exact "
                                  "sum needs the class axis); give the logits a static rank, e.g. with ensure_shape")


def sparse_softmax_cross_entropy_with_logits(labels=None, logits=None, name=None):
    """``tf.nn.sparse_softmax_cross_entropy_with_logits`` with XLA-invariant bits (module doc).
    Shapes are checked as TF checks them when they are static; a label outside ``[0, classes)``
    gives a NaN loss, as TF's GPU kernel does (a run-time error, as TF's CPU kernel raises, could
    not be compiled by XLA)."""
    from tfrepro.ops.nn import _sparse_xent_static_shapes

    with tf.name_scope(name or "ExactSparseSoftmaxCrossEntropyWithLogits"):
        logits = tf.convert_to_tensor(logits)
        labels = tf.convert_to_tensor(labels)
        if not labels.dtype.is_integer:
            raise TypeError(f"labels must be int32 or int64; got {labels.dtype.name}")
        _known_rank(logits, "sparse softmax cross-entropy")
        _sparse_xent_static_shapes(labels, logits)
        classes = tf.shape(logits)[-1]
        chosen = tf.one_hot(labels, classes, on_value=True, off_value=False)
        valid = (labels >= 0) & (labels < tf.cast(classes, labels.dtype))

        def loss_of(shifted, log_total):  # one term in each row's sum: exact
            loss = log_total[..., 0] - _stock.reduce_sum(tf.where(chosen, shifted, tf.zeros_like(shifted)), -1)
            return tf.where(valid, loss, tf.constant(float("nan"), tf.float64))

        return _with_softmax_gradient(logits, lambda z: tf.cast(chosen, tf.float64), loss_of)


def softmax_cross_entropy_with_logits(labels, logits, axis=-1, name=None):
    """``tf.nn.softmax_cross_entropy_with_logits`` with XLA-invariant bits (module doc); the sum
    ``labels . log_softmax`` is an exact fixed-point sum of float64 products. Gradients reach the
    logits and the labels, as TF's."""
    with tf.name_scope(name or "ExactSoftmaxCrossEntropyWithLogits"):
        logits = tf.convert_to_tensor(logits)
        labels = tf.convert_to_tensor(labels, dtype=logits.dtype)
        axis = -1 if axis is None else axis
        _known_rank(logits, "softmax cross-entropy")
        rank = logits.shape.rank
        if axis not in (-1, rank - 1):
            perm = [i for i in range(rank) if i != axis % rank] + [axis % rank]
            logits, labels = tf.transpose(logits, perm), tf.transpose(labels, perm)

        def loss_of(shifted, log_total):
            return -_fixed.exact_batch_sum(tf.cast(labels, tf.float64) * (shifted - log_total), [-1])

        return _with_softmax_gradient(logits, lambda z: tf.cast(labels, tf.float64), loss_of, labels)


def softmax_cross_entropy_with_logits_v1(labels, logits, axis=None, name=None, dim=None):
    """``tf.compat.v1.nn.softmax_cross_entropy_with_logits_v2``'s signature (``dim`` is ``axis``)."""
    return softmax_cross_entropy_with_logits(labels, logits, axis=dim if axis is None else axis, name=name)
