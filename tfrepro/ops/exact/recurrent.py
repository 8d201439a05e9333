"""The exact tier's recurrent cells: Keras 3's ``LSTMCell``, whose carry ``c = f * c_tm1 + i * g``
is a sum of two products that XLA may fuse into a multiply-add (one rounding, not three), computed
as ``sum_of_products``: each product exact in float64, their float64 sum rounded to the carry's
dtype, its gradient four single products. The cell's matrix products, bias adds and activations are the tier's own ops
already; the output ``h = o * tanh(c)`` is a product alone, passed on through ``_fixed.barrier``
so that no compiler can fuse it into an add that reads it (XLA inlines a one-step loop). So an LSTM
trained under ``patch(ops="exact")`` gives the same bits across threads, oneDNN and XLA (tested,
fresh processes).

Not covered, and left to Keras's own code (which the audit then names): tf-keras's LSTM (its layer
runs its own traced step, ``standard_lstm``), a cell whose activations are not ``tanh`` and
``sigmoid``, recurrent dropout (TF adds the four masked inputs' gradients), GRU cells, and cuDNN's
kernels on a GPU (``LSTM(use_cudnn=False)`` runs this cell). On several replicas, a weight's
gradient inside the loop is exact per replica and summed by the strategy in float
(``_fixed.Replicas`` warns; the audit names the sum). Float16 and bfloat16 carries are rounded
through float32, as the tier rounds them everywhere.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tfrepro import _targets
from tfrepro._import_hooks import call_after_import
from tfrepro.ops.exact import _fixed
from tfrepro.ops.exact.linalg import EXACT_DTYPES


def sum_of_products(a: tf.Tensor, b: tf.Tensor, c: tf.Tensor, d: tf.Tensor) -> tf.Tensor:
    """``a * b + c * d`` for four tensors of one shape and dtype: both products exact in float64
    (a float32 product has at most 48 significant bits), their float64 sum rounded to the dtype
    (within an ulp of the exact sum), so that no compiler can fuse a product into the add; its gradient ``(dy * b, dy * a, dy * d, dy *
    c)``, each a single rounding, as TF's. Second-order gradients are refused by name.

    Args:
        a, b, c, d: float16, bfloat16 or float32 tensors of one dtype and one static shape.

    Returns:
        ``a * b + c * d``, in their dtype.
    """
    with tf.name_scope("ExactSumOfProducts"):
        a, b, c, d = (tf.convert_to_tensor(v) for v in (a, b, c, d))
        dtype = a.dtype
        if dtype not in EXACT_DTYPES or any(v.dtype != dtype for v in (b, c, d)):
            raise TypeError(f"sum_of_products takes four float16, bfloat16 or float32 tensors of one dtype; got "
                            f"{[v.dtype.name for v in (a, b, c, d)]}")
        if not all(v.shape.is_compatible_with(a.shape) for v in (b, c, d)):
            raise ValueError(f"sum_of_products takes four tensors of one shape; got {[v.shape for v in (a, b, c, d)]}")

        @_fixed.custom_gradient
        def total(*operands):
            wide = [tf.cast(v, tf.float64) for v in operands]

            def gradient(dy):
                dy = tf.cast(dy, tf.float64)
                return tuple(_fixed.first_order_only(_fixed.narrow(_fixed.mul(dy, wide[partner]), dtype), "an LSTM cell")
                             for partner in (1, 0, 3, 2))

            return _fixed.narrow(_fixed.mul(wide[0], wide[1]) + _fixed.mul(wide[2], wide[3]), dtype), gradient

        return total(a, b, c, d)


def _covered(cell, *tensors) -> bool:
    """Whether the cell's carry can be the tier's: Keras's own activations, one dtype and shape."""
    names = (getattr(cell.activation, "__name__", None), getattr(cell.recurrent_activation, "__name__", None))
    first = tensors[0]
    return names == ("tanh", "sigmoid") and all(
        isinstance(t, tf.Tensor) and t.dtype == first.dtype and t.dtype in EXACT_DTYPES and t.shape.is_compatible_with(
            first.shape) and t.shape.rank == 2 for t in tensors)


def _carry(cell, i, f, c_tm1, g) -> tf.Tensor:
    if not _covered(cell, f, c_tm1, i, g):
        return f * c_tm1 + i * g  # Keras's own arithmetic: the audit names the multiply-add
    with _fixed.marking():
        return sum_of_products(f, c_tm1, i, g)


def _fused(original: Callable) -> Callable:
    """``LSTMCell._compute_carry_and_output_fused`` (implementation 2, Keras 3's default)."""
    def compute(self, z, c_tm1):
        z0, z1, z2, z3 = z
        i, f = self.recurrent_activation(z0), self.recurrent_activation(z1)
        c = _carry(self, i, f, c_tm1, self.activation(z2))
        return c, self.recurrent_activation(z3)

    compute.__doc__ = original.__doc__
    return compute


def _split(original: Callable) -> Callable:
    """``LSTMCell._compute_carry_and_output`` (implementation 1: split kernels, recurrent dropout)."""
    def compute(self, x, h_tm1, c_tm1):
        from keras import ops  # Keras 3's: the module this hook is installed in is Keras 3's

        x_i, x_f, x_c, x_o = x
        h_i, h_f, h_c, h_o = h_tm1
        units = self.units

        def gate(x_part, h_part, index):
            return x_part + ops.matmul(h_part, self.recurrent_kernel[:, units * index:units * (index + 1)])

        i = self.recurrent_activation(gate(x_i, h_i, 0))
        f = self.recurrent_activation(gate(x_f, h_f, 1))
        c = _carry(self, i, f, c_tm1, self.activation(gate(x_c, h_c, 2)))
        return c, self.recurrent_activation(gate(x_o, h_o, 3))

    compute.__doc__ = original.__doc__
    return compute


@_fixed.custom_gradient
def _opaque(x: tf.Tensor):
    """``x`` through ``_fixed.barrier`` (exact for a float32, float16 or bfloat16 value): whatever
    reads it cannot fuse the product that made ``x``; its gradient passes through."""
    return tf.cast(_fixed.barrier(tf.cast(x, tf.float64)), x.dtype), lambda dy: dy


def _call(original: Callable) -> Callable:
    """``LSTMCell.call``, its output ``h = o * tanh(c)`` passed on opaque where the carry is the tier's."""
    def call(self, inputs, states, training=False):
        h, new_states = original(self, inputs, states, training=training)
        if not _covered(self, h, new_states[1]):
            return h, new_states
        with _fixed.marking():
            h = _opaque(h)
        return h, [h, *new_states[1:]]

    call.__doc__ = original.__doc__
    return call


def install() -> Callable[[], None]:
    """Make Keras 3's ``LSTMCell`` carry exact in every Keras 3 this process loads, now or when it is
    imported; returns the undo."""
    saved = []
    active = [True]

    def replace(module) -> None:
        key = "keras3:lstm_cell"
        if not active[0] or not _targets.expected(_targets.target(key)) or _targets.find(module, key) is None:
            return
        cls = module.LSTMCell
        for name, make in (("_compute_carry_and_output_fused", _fused), ("_compute_carry_and_output", _split),
                           ("call", _call)):
            original = cls.__dict__.get(name)
            if original is not None:
                saved.append((cls, name, original))
                setattr(cls, name, make(original))

    call_after_import({_targets.target("keras3:lstm_cell").module: replace})

    def undo() -> None:
        active[0] = False
        for cls, name, original in reversed(saved):
            setattr(cls, name, original)

    return undo
