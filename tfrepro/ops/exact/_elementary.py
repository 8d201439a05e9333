"""The exact tier's elementary functions in float64, built from additions, divisions, square roots
and multiplications alone, each product rounded through ``_fixed.barrier`` before it is added to:
the same bits with XLA and without, with oneDNN on and off, at any thread count. An argument that
is an inexact product must come through the barrier too (``argument``), so that XLA cannot fuse
it into the function's first add or fold its constant factor into the function's own.

TF's ``exp``, ``log``, ``tanh``, ``erf`` kernels and XLA's differ in their last bits (measured on TF
2.21's CPU), and XLA contracts multiply-adds in fused code; so these are computed here instead:

- ``exp``: a Cody-Waite reduction by ``ln 2`` and a degree-13 Taylor polynomial;
- ``expm1``: its series below ``|x| < 0.35`` (no cancellation), ``exp(x) - 1`` above;
- ``log``, ``log1p``: an ``atanh`` series of the mantissa;
- ``tanh``, ``sigmoid``: from ``expm1`` and ``exp`` (``tanh`` odd by construction);
- ``erfc``: the Maclaurin series of ``erf`` below 2, Laplace's continued fraction (60 levels) above.

Each is within about 1e-13 relative of the true value (``erfc`` about 2e-12 near 2, where its
series cancels; the barriers round each step to 48 bits), far below a float32 result's rounding
(tested through the ops, within an ulp of float64 references). Results are rounded to float16 and
bfloat16 through float32, as TF's CPU kernels round them. ``elementwise`` wraps one
of them as a float32/16 op with its gradient, rounded once.

Each function runs as one XLA kernel, with XLA on or off in the caller: its dozens of elementwise
passes fuse into one (a Keras 3 LSTM's steady epoch 13.8x ``"auto"``'s before, 8.8x after, with the
gradients' reuse of the forward pass's ``exp``), and tracing a step is about half as long; compiling
changes no bit, since it is what XLA on does (tested).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfrepro.ops._exact_sum import _pow2
from tfrepro.ops.exact import _fixed
from tfrepro.ops.exact.linalg import EXACT_DTYPES

_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # 32 significant bits: n * _LN2_HI is exact for |n| < 2**21
_LN2_LO = math.log(2) - _LN2_HI
_EXP_TERMS = [1.0 / math.factorial(i) for i in range(14)]
_EXPM1_TERMS = [1.0 / math.factorial(i) for i in range(1, 17)]  # 0.35**17 / 17! < 1e-20
_ATANH_TERMS = [1.0 / (2 * j + 1) for j in range(14)]
_ERF_TERMS = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(33)]  # erf(z) / z, in z**2
_ERFC_LEVELS = 60  # Laplace's continued fraction: within 2**-52 of erfc for z >= 2 (measured)
_SERIES_EDGE = 2.0


argument = _fixed.barrier  # for an argument that is an inexact product (module doc)


def _kernel(function: Callable) -> Callable:
    """``function`` (float64, elementwise) as one XLA kernel (``_fixed.compiled``): its passes fuse
    into one, and every step is exact or correctly rounded, so compiling changes no bit (each is
    tested with XLA on and off). The result keeps the argument's static shape."""
    compiled = _fixed.compiled(function)

    @functools.wraps(function)
    def call(x):
        x = tf.convert_to_tensor(x, tf.float64)
        result = compiled(x)
        for part in tf.nest.flatten(result):
            part.set_shape(x.shape)
        return result

    return call


def _horner(u: tf.Tensor, coefficients: list[float]) -> tf.Tensor:
    """``sum(c[i] * u**i)``, every product rounded before its add (no FMA)."""
    p = tf.fill(tf.shape(u), tf.constant(coefficients[-1], tf.float64))
    for c in reversed(coefficients[:-1]):
        p = _fixed.mul(p, u) + c
    return p


@_kernel
def exp(x: tf.Tensor) -> tf.Tensor:
    """``e**x`` (module doc); 0 below -745, inf above 709.78, NaN for NaN."""
    x = tf.clip_by_value(x, -746.0, 710.0)
    n = tf.round(x * (1.0 / math.log(2)))
    r = (x - n * _LN2_HI) - _fixed.mul(n, _LN2_LO)
    p = _horner(r, _EXP_TERMS)
    for factor in _pow2(tf.cast(tf.where(tf.math.is_nan(n), tf.zeros_like(n), n), tf.int32), tf.float64):
        p = p * factor
    return p


@_kernel
def expm1(x: tf.Tensor) -> tf.Tensor:
    """``e**x - 1``, accurate relative to the result however small ``x`` is."""
    small = tf.abs(x) < 0.35
    series = _fixed.mul(x, _horner(tf.where(small, x, tf.zeros_like(x)), _EXPM1_TERMS))
    return tf.where(small, series, exp(x) - 1.0)


@_kernel
def log(x: tf.Tensor) -> tf.Tensor:
    """``ln(x)`` for positive, finite, normal ``x`` (module doc)."""
    bits = tf.bitcast(x, tf.int64)
    k = tf.bitwise.right_shift(bits, 52) - 1023
    f = tf.bitcast(bits - tf.bitwise.left_shift(k, 52), tf.float64)  # in [1, 2)
    big = f > math.sqrt(2)
    f = tf.where(big, f * 0.5, f)
    k = tf.cast(tf.where(big, k + 1, k), tf.float64)
    t = (f - 1.0) / (f + 1.0)
    return (k * _LN2_HI + _fixed.mul(k, _LN2_LO)) + _atanh_series(t, 2.0)


@_kernel
def log1p(x: tf.Tensor) -> tf.Tensor:
    """``ln(1 + x)`` for finite ``x > -1``, accurate relative to the result however small ``x`` is
    (``log(1 + x)`` loses ``x``'s low bits in ``1 + x``)."""
    small = (x > -0.29) & (x < math.sqrt(2) - 1)
    t = x / (2.0 + x)  # ln(1 + x) = 2 atanh(x / (2 + x)), |t| < 0.18 where it is used
    return tf.where(small, _atanh_series(t, 2.0), log(tf.where(small, tf.ones_like(x), 1.0 + x)))


def _atanh_series(t: tf.Tensor, factor: float) -> tf.Tensor:
    """``factor * atanh(t)`` for ``|t| < 0.18``: 14 terms of its odd series, FMA-proof."""
    return _fixed.mul(factor * t, _horner(_fixed.mul(t, t), _ATANH_TERMS))


def any_log(x: tf.Tensor, log_of: Callable[[tf.Tensor], tf.Tensor], low: float) -> tf.Tensor:
    """``log_of(x)`` where ``x`` is in its domain (above ``low``, finite), and there IEEE's values:
    ``-inf`` at ``low``, NaN below it and for NaN, ``inf`` for ``inf``."""
    inside = (x > low) & tf.math.is_finite(x)
    value = log_of(tf.where(inside, x, tf.ones_like(x)))
    edge = tf.where(tf.equal(x, low), tf.constant(-math.inf, tf.float64),
                    tf.where(tf.equal(x, math.inf), x, tf.constant(math.nan, tf.float64)))
    return tf.where(inside, value, edge)


@_kernel
def tanh_parts(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``tanh(x)`` and ``1 - |tanh(x)|`` (its complement, for the gradient ``1 - tanh**2``),
    each accurate relative to itself for any ``x``."""
    a = tf.abs(x)
    t = expm1(2.0 * tf.minimum(a, 20.0))  # tanh(20) rounds to 1
    magnitude = t / (t + 2.0)
    negative = tf.bitcast(x, tf.int64) < 0  # -0.0 too: tanh(-0) = -0
    e = exp(-2.0 * a)  # 1 - tanh(a) = 2 e / (1 + e)
    return tf.where(negative, -magnitude, magnitude), (2.0 * e) / (1.0 + e)


@_kernel
def sigmoid_parts(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``sigmoid(x) = 1 / (1 + e**-x)`` and ``sigmoid(-x) = e**-x * sigmoid(x)`` from one ``exp``,
    each accurate relative to itself in both tails (``sigmoid(-x)`` is 1 where ``e**-x`` overflows
    or ``sigmoid(x)`` is below the normal range, which TF's CPU flushes to zero)."""
    e = exp(-x)
    s = 1.0 / (1.0 + e)
    return s, tf.where(tf.math.is_inf(e) | (s < 2.0**-1022), tf.ones_like(e), _fixed.mul(e, s))


def sigmoid(x: tf.Tensor) -> tf.Tensor:
    """``1 / (1 + e**-x)``, accurate relative to the result in both tails."""
    return sigmoid_parts(x)[0]


@_kernel
def erfc(z: tf.Tensor) -> tf.Tensor:
    """``1 - erf(z)`` for ``z >= 0``, accurate relative to the result (module doc)."""
    near = z < _SERIES_EDGE
    zn = tf.where(near, z, tf.zeros_like(z))
    series = 1.0 - _fixed.mul(zn * (2.0 / math.sqrt(math.pi)), _horner(_fixed.mul(zn, zn), _ERF_TERMS))
    zf = tf.where(near, tf.fill(tf.shape(z), tf.constant(_SERIES_EDGE, tf.float64)), z)
    fraction = zf
    for level in range(_ERFC_LEVELS, 0, -1):
        fraction = zf + (level / 2) / fraction
    tail = exp(-_fixed.mul(zf, zf)) / (fraction * math.sqrt(math.pi))
    return tf.where(near, series, tail)


@_kernel
def normal_cdf(x: tf.Tensor) -> tf.Tensor:
    """``P(N(0, 1) <= x)``, accurate relative to the result in both tails."""
    lower = 0.5 * erfc(argument(tf.abs(x) * (1.0 / math.sqrt(2))))
    return tf.where(x < 0, lower, 1.0 - lower)


@_kernel
def normal_pdf(x: tf.Tensor) -> tf.Tensor:
    """The standard normal density."""
    return exp(-0.5 * _fixed.mul(x, x)) * (1.0 / math.sqrt(2 * math.pi))


def plain(x) -> bool:
    """Whether ``x`` is a dense tensor, a variable or a Python or NumPy value (what the tier's ops
    take; anything else goes to TF's op, whose dispatch knows it)."""
    return isinstance(x, (tf.Tensor, int, float, list, tuple, np.ndarray, np.generic)) or hasattr(x, "assign")


def elementwise(x, name: str, stock: Callable, forward: Callable, derivative: Callable) -> tf.Tensor:
    """An elementwise op of the exact tier: ``forward(x)`` in float64 rounded once to ``x``'s dtype;
    its gradient ``dy * derivative(x, y, *saved)`` in float64, rounded once (``x``, ``y`` float64;
    ``saved``: what ``forward`` returned after ``y``, if it returned a tuple, so that the gradient
    reuses the forward pass's work; second-order gradients refused by name). Dtypes outside ``EXACT_DTYPES`` (float64, complex) run
    ``stock``, TF's op, outside the tier's scope, so that its audit checks them."""
    if not plain(x):  # a ragged or Keras symbolic tensor: TF's op, which dispatches it
        with _fixed.unmarked():
            return stock(x)
    with tf.name_scope(name):
        x = tf.convert_to_tensor(x)
        if x.dtype not in EXACT_DTYPES:
            with _fixed.unmarked():
                return stock(x)
        dtype = x.dtype

        @_fixed.custom_gradient
        def op(v):
            v64 = tf.cast(v, tf.float64)
            y64, *saved = tf.nest.flatten(forward(v64))

            def gradient(dy):  # the barrier: XLA cannot re-associate a constant factor of the derivative
                dx = _fixed.mul(tf.cast(dy, tf.float64), _fixed.barrier(derivative(v64, y64, *saved)))
                return _fixed.first_order_only(_fixed.narrow(dx, dtype), name, dy, v64)

            return _fixed.narrow(y64, dtype), gradient

        return op(x)
