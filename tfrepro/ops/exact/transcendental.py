"""The exact tier's ``exp``, ``expm1``, ``log``, ``log1p`` and ``rsqrt``: the same bits with XLA and
without, with oneDNN on and off, at any thread count (``_elementary``: float64 from IEEE-rounded
steps, rounded once to the input's dtype, within an ulp of the true value). Gradients ``dy * exp(x)``,
``dy / x``, ``dy / (1 + x)``, ``-dy * rsqrt(x)**3 / 2`` the same way. IEEE's special values are kept:
``log(0) = -inf``, ``log(-1) = NaN``, ``rsqrt(0) = inf``. float64 and complex inputs run TF's ops, which
the audit checks.
"""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops.exact import _elementary, _fixed
from tfrepro.ops.exact._elementary import elementwise


def exp(x, name=None):
    """``tf.math.exp`` with bits that XLA, oneDNN and threads cannot change (module doc)."""
    return elementwise(x, name or "ExactExp", _stock.exp, _elementary.exp, lambda x, y: y)


def expm1(x, name=None):
    """``tf.math.expm1`` with bits that XLA, oneDNN and threads cannot change (module doc)."""
    return elementwise(x, name or "ExactExpm1", _stock.expm1, _elementary.expm1, lambda x, y: _elementary.exp(x))


def log(x, name=None):
    """``tf.math.log`` with bits that XLA, oneDNN and threads cannot change (module doc)."""
    return elementwise(x, name or "ExactLog", _stock.log, lambda x: _elementary.any_log(x, _elementary.log, 0.0),
                       lambda x, y: 1.0 / x)


def log1p(x, name=None):
    """``tf.math.log1p`` with bits that XLA, oneDNN and threads cannot change (module doc)."""
    return elementwise(x, name or "ExactLog1p", _stock.log1p,
                       lambda x: _elementary.any_log(x, _elementary.log1p, -1.0), lambda x, y: 1.0 / (1.0 + x))


def _rsqrt(x: tf.Tensor) -> tf.Tensor:
    # the barrier keeps XLA from turning 1 / sqrt(x) into its own rsqrt
    return 1.0 / _fixed.barrier(tf.sqrt(x))


def rsqrt(x, name=None):
    """``tf.math.rsqrt`` with bits that XLA, oneDNN and threads cannot change (module doc)."""
    return elementwise(x, name or "ExactRsqrt", _stock.rsqrt, _rsqrt,
                       lambda x, y: -0.5 * _fixed.mul(_fixed.mul(y, y), y))


