"""The exact tier's activations: ``softmax`` and ``log_softmax``, and ``tanh``, ``sigmoid``,
``silu`` (swish), ``gelu`` (both forms), ``elu``, ``selu`` and ``softplus``: the same bits with XLA
and without, with oneDNN on and off, at any thread count (and for any order of the classes).

Each is computed in float64 from the FMA-proof functions of ``_elementary`` and rounded once to the
input's dtype: within an ulp of the float64 result (tested). ``softmax`` and ``log_softmax`` are
built as the cross-entropies are (``losses``): ``z - max`` exactly, the row's sum an exact
fixed-point sum, ``log_softmax = (z - max) - log(sum)`` with ``log1p`` near 1; their gradients,
``y * (dy - sum(dy * y))`` and ``dy - softmax * sum(dy)``, sum exactly too. The elementwise
activations' gradients are ``dy`` times their derivative, in float64, rounded once. Second-order
gradients are refused by name, as through the tier's other ops; float64 inputs run TF's ops (the
audit checks them).
"""

from __future__ import annotations

import math

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops.exact import _elementary, _fixed
from tfrepro.ops.exact._elementary import elementwise
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

            def gradient(upstream):
                dy = tf.cast(upstream, tf.float64)
                if log:  # d log_softmax: dy - softmax * sum(dy)
                    dx = dy - _fixed.mul(softmax, _fixed.exact_batch_sum(dy, [-1])[..., None])
                else:  # d softmax: y * (dy - sum(dy * y))
                    dx = _fixed.mul(softmax, dy - _fixed.exact_batch_sum(_fixed.mul(dy, softmax), [-1])[..., None])
                return _fixed.first_order_only(_fixed.narrow(dx, dtype), "a softmax", upstream, softmax)

            return _fixed.narrow(shifted - log_total if log else softmax, dtype), gradient

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


def tanh(x, name=None):
    """``tf.math.tanh`` with bits that XLA, oneDNN and threads cannot change (module doc); its
    gradient ``dy * (1 - tanh**2)`` from the complement ``1 - |tanh|``, accurate in the tails."""
    def derivative(x, y, complement):
        return _fixed.mul(complement, 2.0 - complement)

    return elementwise(x, name or "ExactTanh", _stock.tanh, _elementary.tanh_parts, derivative)


def sigmoid(x, name=None):
    """``tf.math.sigmoid`` with bits that XLA, oneDNN and threads cannot change (module doc); its
    gradient ``dy * sigmoid(x) * sigmoid(-x)``."""
    return elementwise(x, name or "ExactSigmoid", _stock.sigmoid, _elementary.sigmoid_parts,
                       lambda x, y, complement: _fixed.mul(y, complement))


def silu(features, beta=1.0, name=None):
    """``tf.nn.silu`` (``tf.nn.swish``), ``x * sigmoid(beta * x)``, with bits that XLA, oneDNN and
    threads cannot change (module doc), for a ``beta`` known when traced (a Python number, or a
    constant: a trainable ``beta`` runs TF's op, which the audit names)."""
    value = beta if isinstance(beta, (int, float)) else None if hasattr(beta, "assign") else tf.get_static_value(beta)
    if value is None or getattr(value, "size", 1) != 1:
        with _fixed.unmarked():
            return _stock.silu(features, beta=beta)  # TF's swish takes no name
    b = float(value)

    def forward(x):  # and sigmoid(b x), sigmoid(-b x) for the gradient
        s, complement = _elementary.sigmoid_parts(_elementary.argument(b * x))
        return _fixed.mul(x, s), s, complement

    def derivative(x, y, s, complement):  # s + b x s (1 - s), with 1 - s = sigmoid(-b x)
        return s + _fixed.mul(_fixed.mul(_elementary.argument(b * x), s), complement)

    return elementwise(features, name or "ExactSilu", lambda x: _stock.silu(x, beta=beta), forward, derivative)


_GELU_C = math.sqrt(2 / math.pi)
_GELU_CUBIC = 0.044715


def gelu(features, approximate=False, name=None):
    """``tf.nn.gelu`` with bits that XLA, oneDNN and threads cannot change (module doc): exact,
    ``x * P(N(0, 1) <= x)``; or approximate, ``x * sigmoid(2 u)`` with ``u = sqrt(2 / pi) (x +
    0.044715 x**3)`` (the same as TF's ``x (1 + tanh(u)) / 2``, without its cancellation for
    negative ``x``)."""
    def inner(x):  # 2 u and its derivative
        square = _fixed.mul(x, x)
        two_u = _elementary.argument((2 * _GELU_C) * (x + _fixed.mul(_GELU_CUBIC * x, square)))
        return two_u, (2 * _GELU_C) * (1.0 + _fixed.mul(3 * _GELU_CUBIC, square))

    if approximate:
        def forward(x):  # and sigmoid(2 u), sigmoid(-2 u) for the gradient
            s, complement = _elementary.sigmoid_parts(inner(x)[0])
            return _fixed.mul(x, s), s, complement

        def derivative(x, y, s, complement):  # s + x s (1 - s) (2 u)'
            return s + _fixed.mul(_fixed.mul(x, inner(x)[1]), _fixed.mul(s, complement))
    else:
        def forward(x):
            return _fixed.mul(x, _elementary.normal_cdf(x))

        def derivative(x, y):  # P(x) + x p(x)
            return _elementary.normal_cdf(x) + _fixed.mul(x, _elementary.normal_pdf(x))

    return elementwise(features, name or "ExactGelu", lambda x: _stock.gelu(x, approximate=approximate),
                       forward, derivative)


def elu(features, name=None):
    """``tf.nn.elu`` with bits that XLA, oneDNN and threads cannot change (module doc)."""
    return elementwise(features, name or "ExactElu", _stock.elu,
                       lambda x: tf.where(x > 0, x, _elementary.expm1(x)),
                       lambda x, y: tf.where(x > 0, tf.ones_like(x), _elementary.exp(x)))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(features, name=None):
    """``tf.nn.selu`` with bits that XLA, oneDNN and threads cannot change (module doc)."""
    return elementwise(features, name or "ExactSelu", _stock.selu,
                       lambda x: tf.where(x > 0, _SELU_SCALE * x, (_SELU_SCALE * _SELU_ALPHA) * _elementary.expm1(x)),
                       lambda x, y: tf.where(x > 0, tf.fill(tf.shape(x), tf.constant(_SELU_SCALE, tf.float64)),
                                             (_SELU_SCALE * _SELU_ALPHA) * _elementary.exp(x)))


def softplus(features, name=None):
    """``tf.math.softplus``, ``log(1 + e**x)``, with bits that XLA, oneDNN and threads cannot change
    (module doc); its gradient ``sigmoid(x)``."""
    return elementwise(features, name or "ExactSoftplus", _stock.softplus,
                       lambda x: tf.maximum(x, 0.0) + _elementary.log1p(_elementary.exp(-tf.abs(x))),
                       lambda x, y: _elementary.sigmoid(x))
