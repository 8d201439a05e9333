"""The exact tier's softmax and sigmoid cross-entropies.

TF's ``exp`` and ``log`` kernels and XLA's differ in their last bits, and XLA contracts
multiply-adds in fused code; so the cross-entropies here are computed in float64 with the FMA-proof
``exp`` and ``log1p`` of ``_elementary``, and the class sums are exact fixed-point sums
(``_fixed.exact_batch_sum``). The softmax loss is ``log(sum(exp(z - max))) - (z - max)[label]``
rounded once to the logits' dtype, its gradient ``softmax - labels``; the sigmoid loss is
``max(z, 0) - z * label + log1p(exp(-|z|))``, its gradient ``sigmoid(z) - label``.
"""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops._checks import after
from tfrepro.ops.exact import _fixed
from tfrepro.ops.exact._elementary import exp, log1p, plain, sigmoid
from tfrepro.ops.exact.linalg import EXACT_DTYPES


def _log_softmax_parts(logits: tf.Tensor, axis: int):
    """``z - max`` (float64), ``exp`` of it, and per row the sum of the exps and its log, for the
    last ``axis``. The sum is ``m + rest``: ``m`` terms are ``exp(0) = 1`` (the maxima), ``rest`` an
    exact sum of the others, so ``log(total) = log1p(m - 1 + rest)`` keeps a confident row's tiny
    loss to its float32 ulp (``log`` of the rounded total lost it by up to 12 ulps)."""
    z = tf.cast(logits, tf.float64)
    shifted = z - tf.reduce_max(z, axis=axis, keepdims=True)
    e = exp(shifted)
    top = tf.equal(shifted, 0.0)
    count = _stock.reduce_sum(tf.cast(top, tf.float64), axis=axis, keepdims=True)  # small integers: exact
    rest = tf.expand_dims(_fixed.exact_batch_sum(tf.where(top, tf.zeros_like(e), e), [axis]), axis)
    return shifted, e, count + rest, log1p((count - 1.0) + rest)


def _with_softmax_gradient(logits, labels_prob, loss_of, labels=None):
    """``loss_of(shifted, log_total)`` with the gradient ``softmax - labels`` (softmax = e / total),
    and, for dense ``labels``, their gradient ``-log_softmax`` (TF's)."""
    dtype = logits.dtype

    def compute(z, *label_values):
        shifted, e, total, log_total = _log_softmax_parts(z, -1)
        loss = loss_of(shifted, log_total)

        def logits_grad(dloss):
            softmax = e / total
            return _fixed.first_order_only(_fixed.narrow((softmax - labels_prob(z)) * tf.cast(dloss, tf.float64)[..., None],
                                                         dtype), "a softmax cross-entropy", dloss, e, *label_values)

        def labels_grad(dloss):
            return -(shifted - log_total) * tf.cast(dloss, tf.float64)[..., None]

        return _fixed.narrow(loss, dtype), logits_grad, labels_grad

    if labels is None:
        @_fixed.custom_gradient
        def xent(z):
            loss, logits_grad, _ = compute(z)
            return loss, logits_grad

        return xent(logits)

    @_fixed.custom_gradient
    def xent_with_labels(z, y):
        loss, logits_grad, labels_grad = compute(z, y)
        return loss, lambda dloss: (logits_grad(dloss), _fixed.narrow(labels_grad(dloss), y.dtype))

    return xent_with_labels(logits, labels)


def _known_rank(logits: tf.Tensor, what: str) -> None:
    if logits.shape.rank is None:
        raise NotImplementedError(f"tfrepro exact tier: {what} of logits of unknown rank is not covered (its exact "
                                  "sum needs the class axis); give the logits a static rank, e.g. with ensure_shape")


def sparse_softmax_cross_entropy_with_logits(labels=None, logits=None, name=None):
    """``tf.nn.sparse_softmax_cross_entropy_with_logits`` with XLA-invariant bits (module doc).
    The labels are checked as TF checks them: their shapes at the call where static, else, with
    their values, when the op runs (TF's InvalidArgumentError and message, as its CPU kernel
    raises). Under XLA, which compiles no run-time check, a label outside ``[0, classes)`` gives a
    NaN loss, as TF's GPU kernel does."""
    from tfrepro.ops.nn import _sparse_labels, _sparse_xent_static_shapes

    with tf.name_scope(name or "ExactSparseSoftmaxCrossEntropyWithLogits"):
        logits = tf.convert_to_tensor(logits)
        labels = tf.convert_to_tensor(labels)
        if not labels.dtype.is_integer:
            raise TypeError(f"labels must be int32 or int64; got {labels.dtype.name}")
        _known_rank(logits, "sparse softmax cross-entropy")
        shapes = _sparse_xent_static_shapes(labels, logits)
        classes = tf.shape(logits)[-1]
        labels = after(_sparse_labels(labels, tf.shape(logits), tf.cast(classes, labels.dtype), shapes), labels)
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


def sigmoid_cross_entropy_with_logits(labels=None, logits=None, name=None):
    """``tf.nn.sigmoid_cross_entropy_with_logits`` with bits that XLA, oneDNN and threads cannot
    change (module doc): float64, rounded once; gradients ``sigmoid(z) - label`` for the logits and
    ``-z`` for the labels, as TF's. Dtypes outside the tier's run TF's op (its audit checks it)."""
    if not (plain(logits) and plain(labels)):
        with _fixed.unmarked():
            return _stock.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    with tf.name_scope(name or "ExactSigmoidCrossEntropyWithLogits"):
        logits = tf.convert_to_tensor(logits)
        labels = tf.convert_to_tensor(labels, dtype=logits.dtype)
        logits.shape.assert_is_compatible_with(labels.shape)
        if logits.dtype not in EXACT_DTYPES:
            with _fixed.unmarked():
                return _stock.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        dtype = logits.dtype

        @_fixed.custom_gradient
        def xent(z, y):
            z64, y64 = tf.cast(z, tf.float64), tf.cast(y, tf.float64)
            loss = (tf.maximum(z64, 0.0) - _fixed.mul(z64, y64)) + log1p(exp(-tf.abs(z64)))

            def gradient(upstream):
                dloss = tf.cast(upstream, tf.float64)
                dz = _fixed.mul(sigmoid(z64) - y64, dloss)
                return (_fixed.first_order_only(_fixed.narrow(dz, dtype), "a sigmoid cross-entropy", upstream, z64,
                                                y64),
                        _fixed.narrow(-_fixed.mul(z64, dloss), dtype))

            return _fixed.narrow(loss, dtype), gradient

        return xent(logits, labels)
