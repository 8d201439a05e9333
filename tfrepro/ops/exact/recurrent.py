"""The exact tier's recurrent cells: Keras 3's ``LSTMCell``, whose carry ``c = f * c_tm1 + i * g``
is a sum of two products that XLA may fuse into a multiply-add (one rounding, not three), computed
as ``sum_of_products``: each product exact in float64, their float64 sum rounded to the carry's
dtype, its gradient four single products. The cell's matrix products, bias adds and activations are the tier's own ops
already; the output ``h = o * tanh(c)`` is a product alone, passed on through ``_fixed.barrier``
so that no compiler can fuse it into an add that reads it (XLA inlines a one-step loop). So an LSTM
trained under ``patch(ops="exact")`` gives the same bits across threads, oneDNN and XLA (tested,
fresh processes). For float32 (Keras's implementation 2, its default), everything after the
matrix products runs as ``lstm_step``, one XLA kernel forward and one backward, with the bits of
those ops one by one (tested): a step in the layer's loop pays two kernels' fixed cost, not some
sixty ops'. That ``call`` mirrors Keras's own, so it runs only in the Keras releases it was compared
with (the target ``keras3:lstm_call``) and for cells that override none of the methods Keras's
``call`` reads; elsewhere the step runs op by op (the same bits, slower).

Not covered, and left to Keras's own code (which the audit then names): tf-keras's LSTM (its layer
runs its own traced step, ``standard_lstm``), a cell whose activations are not ``tanh`` and
``sigmoid``, recurrent dropout (TF adds the four masked inputs' gradients), GRU cells, and cuDNN's
kernels on a GPU (``LSTM(use_cudnn=False)`` runs this cell). On several replicas, a weight's
gradient inside the loop is exact per replica and summed by the strategy in float
(``_fixed.Replicas`` warns; the audit names the sum). Float16 and bfloat16 carries are rounded
through float32, as the tier rounds them everywhere.

Keras 3's ``GRUCell`` (its default ``implementation=2``, with or without ``reset_after``, input
dropout): its step is Keras's, but for its three products that an add reads (``r * (h_tm1 @ U_h)``,
``z * h_tm1`` and ``(1 - z) * hh``), each ``product``: TF's float32 product (exact in float64,
rounded once) through the barrier, with the gradient TF's products rounded alike. So its values are
those of Keras's own step with XLA off (tested bit for bit), and XLA cannot change them. Recurrent
dropout (``implementation=1``), other activations and tf-keras's ``GRU`` (its own traced step,
``standard_gru``) run Keras's code, which the audit names.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tfrepro import _targets
from tfrepro._import_hooks import call_after_import
from tfrepro.ops.exact import _elementary, _fixed
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
        a, b, c, d = _checked("sum_of_products", a, b, c, d)
        dtype = a.dtype

        @_fixed.custom_gradient
        def total(*operands):
            wide = [tf.cast(v, tf.float64) for v in operands]
            return _fixed.narrow(_fixed.mul(wide[0], wide[1]) + _fixed.mul(wide[2], wide[3]), dtype), \
                _partner_products(wide, (1, 0, 3, 2), dtype, "an LSTM cell")

        return total(a, b, c, d)


def product(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``a * b`` for two tensors of one shape and dtype, TF's float32 product (exact in float64,
    rounded once to the dtype), passed on through ``_fixed.barrier`` so that no compiler can fuse it
    into an add that reads it; its gradient ``(dy * b, dy * a)``, each rounded once, as TF's.
    Second-order gradients are refused by name.

    Args:
        a, b: float16, bfloat16 or float32 tensors of one dtype and one static shape.

    Returns:
        ``a * b``, in their dtype.
    """
    with tf.name_scope("ExactProduct"):
        a, b = _checked("product", a, b)

        @_fixed.custom_gradient
        def rounded(*operands):
            wide = [tf.cast(v, tf.float64) for v in operands]
            return _fixed.narrow(_fixed.mul(wide[0], wide[1]), a.dtype), _partner_products(wide, (1, 0), a.dtype,
                                                                                            "a GRU cell")

        return rounded(a, b)


def lstm_step(z: tf.Tensor, c_tm1: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The elementwise part of a step of Keras 3's ``LSTMCell``: from its gates before their
    activations ``z`` (float32 [batch, 4 * units], in Keras's order: input, forget, cell, output) and
    the carry ``c_tm1`` (float32 [batch, units]), ``(h, c)`` with ``i, f, o = sigmoid(z0, z1, z3)``,
    ``g = tanh(z2)``, ``c = sum_of_products(f, c_tm1, i, g)`` and ``h = o * tanh(c)`` passed on
    opaque: the same bits as the tier's ops one by one (tested, forward and backward), but in one
    XLA kernel forward and one backward, so that a step inside the layer's loop runs two kernels
    where the ops one by one run about sixty (each op has a fixed cost in a loop). One difference:
    where ``c`` has several consumers outside the step (a returned state used twice), TF adds their
    gradients before this step's own, where the ops one by one add all in one ``AddN`` (another
    order, as deterministic). Second-order gradients are refused by name.

    Args:
        z: float32, [batch, 4 * units].
        c_tm1: float32, [batch, units].

    Returns:
        ``(h, c)``, float32, [batch, units] each.

    Raises:
        TypeError: ``z`` or ``c_tm1`` is not float32.
    """
    with tf.name_scope("ExactLSTMStep"):
        z, c_tm1 = tf.convert_to_tensor(z), tf.convert_to_tensor(c_tm1)
        if z.dtype != tf.float32 or c_tm1.dtype != tf.float32:
            raise TypeError(f"lstm_step takes float32 tensors; got {z.dtype.name} and {c_tm1.dtype.name}")

        @_fixed.custom_gradient
        def step(z, c_tm1):
            h, c, *saved = _lstm_forward(z, c_tm1)
            for value in (h, c):
                value.set_shape(c_tm1.shape)

            def gradient(dh, dc):  # a None dc (c unused) adds nothing: -0.0 stays -0.0, as one by one
                dh = tf.zeros_like(h) if dh is None else dh
                dz, dc_tm1 = _lstm_backward(dh, dc, c_tm1, *saved)
                dz.set_shape(z.shape)
                dc_tm1.set_shape(c_tm1.shape)
                return tuple(_fixed.first_order_only(d, "an LSTM cell", dh, *saved[-5:]) for d in (dz, dc_tm1))

            return (h, c), gradient

        return step(z, c_tm1)


@_fixed.compiled
def _lstm_forward(z, c_tm1):
    """``lstm_step``'s ``h`` and ``c``, and what its gradient reads (kept: computing them again in
    the gradient made a Keras LSTM's step about 10% slower): the gates and ``tanh(c)`` (float32) and
    each activation's derivative (float64), as ``activations.elementwise`` computes them."""
    wide = tf.split(tf.cast(z, tf.float64), 4, axis=1)
    (i, di), (f, df), (o, do) = (_sigmoid_and_derivative(wide[k]) for k in (0, 1, 3))
    g, dg = _tanh_and_derivative(wide[2])
    c = tf.cast(_fixed.mul(_wide(f), tf.cast(c_tm1, tf.float64)) + _fixed.mul(_wide(i), _wide(g)), tf.float32)
    tanh_c, dtanh_c = _tanh_and_derivative(_wide(c))
    h = tf.cast(_fixed.barrier(_wide(o * tanh_c)), tf.float32)  # opaque: no compiler fuses o * tanh(c) into an add
    return h, c, i, f, g, o, tanh_c, di, df, dg, do, dtanh_c


@_fixed.compiled
def _lstm_backward(dh, dc, c_tm1, i, f, g, o, tanh_c, di, df, dg, do, dtanh_c):
    """``lstm_step``'s gradient: TF's float32 products for ``h = o * tanh(c)``, the carry's two
    gradients added in float32 (as TF adds them), each activation's ``dy * derivative`` and the
    carry's partner products rounded once (``activations.elementwise``, ``_partner_products``)."""
    def times(dy, derivative):
        return tf.cast(_fixed.mul(_wide(dy), _fixed.barrier(derivative)), tf.float32)

    dc = times(dh * o, dtanh_c) if dc is None else dc + times(dh * o, dtanh_c)
    dc64 = _wide(dc)
    dz = [times(tf.cast(_fixed.mul(dc64, _wide(partner)), tf.float32), derivative)
          for partner, derivative in ((g, di), (c_tm1, df), (i, dg))]
    dz.append(times(dh * tanh_c, do))
    return tf.concat(dz, axis=1), tf.cast(_fixed.mul(dc64, _wide(f)), tf.float32)


def _wide(x: tf.Tensor) -> tf.Tensor:
    return tf.cast(x, tf.float64)


def _sigmoid_and_derivative(x64: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``activations.sigmoid``'s value (float32) and derivative (float64) at ``x64``."""
    y, complement = _elementary.sigmoid_parts(x64)
    return tf.cast(y, tf.float32), _fixed.mul(y, complement)


def _tanh_and_derivative(x64: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``activations.tanh``'s value (float32) and derivative (float64) at ``x64``."""
    y, complement = _elementary.tanh_parts(x64)
    return tf.cast(y, tf.float32), _fixed.mul(complement, 2.0 - complement)


def _checked(what: str, *tensors) -> list[tf.Tensor]:
    tensors = [tf.convert_to_tensor(v) for v in tensors]
    dtype = tensors[0].dtype
    if dtype not in EXACT_DTYPES or any(v.dtype != dtype for v in tensors):
        raise TypeError(f"{what} takes {len(tensors)} float16, bfloat16 or float32 tensors of one dtype; got "
                        f"{[v.dtype.name for v in tensors]}")
    if not all(v.shape.is_compatible_with(tensors[0].shape) for v in tensors):
        raise ValueError(f"{what} takes {len(tensors)} tensors of one shape; got {[v.shape for v in tensors]}")
    return tensors


def _partner_products(wide: list[tf.Tensor], partners: tuple[int, ...], dtype: tf.DType, what: str) -> Callable:
    """The gradient of a sum of products of ``wide`` (float64): ``dy`` times each operand's
    partner, exact and rounded once to ``dtype``."""
    def gradient(dy):
        dy64 = tf.cast(dy, tf.float64)
        return tuple(_fixed.first_order_only(_fixed.narrow(_fixed.mul(dy64, wide[partner]), dtype), what, dy,
                                             wide[partner])
                     for partner in partners)

    return gradient


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


_MIRRORED_METHODS = ("_compute_carry_and_output_fused", "get_dropout_mask")  # what Keras's call reads of the cell


def _one_kernel(cell, owner: type, inputs, h_tm1, c_tm1) -> bool:
    """Whether the step can run its elementwise part as ``lstm_step``: Keras's implementation 2,
    its own activations, float32, rank 2, and none of the methods its ``call`` reads overridden by
    a subclass of ``owner`` (a cell with its own gates keeps them)."""
    return cell.implementation == 2 and _covered(cell, h_tm1, c_tm1) and all(
        getattr(type(cell), name) is getattr(owner, name) for name in _MIRRORED_METHODS) and all(
        isinstance(t, tf.Tensor) and t.dtype == tf.float32 and t.shape.rank == 2 for t in (inputs, h_tm1, c_tm1))


def _call(original: Callable) -> Callable:
    """``LSTMCell.call``: Keras's implementation 2 (its products and adds as Keras writes them) with
    the rest one ``lstm_step``, in the Keras releases whose ``call`` this mirrors (compared bit for
    bit); otherwise Keras's, its output ``h = o * tanh(c)`` passed on opaque where the carry is the
    tier's."""
    mirrored = _targets.expected(_targets.target("keras3:lstm_call"))

    def call(self, inputs, states, training=False):
        owner = next((cls for cls in type(self).__mro__ if cls.__dict__.get("call") is call), None)
        if mirrored and owner is not None and _one_kernel(self, owner, inputs, *states[:2]):
            from keras import ops  # Keras 3's: the module this hook is installed in is Keras 3's

            if training and 0.0 < self.dropout < 1.0:
                inputs = inputs * self.get_dropout_mask(inputs)
            z = ops.add(ops.matmul(inputs, self.kernel), ops.matmul(states[0], self.recurrent_kernel))
            if self.use_bias:
                z = ops.add(z, self.bias)
            with _fixed.marking():
                h, c = lstm_step(z, states[1])
            return h, [h, c]
        h, new_states = original(self, inputs, states, training=training)
        if not _covered(self, h, new_states[1]):
            return h, new_states
        with _fixed.marking():
            h = _opaque(h)
        return h, [h, *new_states[1:]]

    call.__doc__, call.__wrapped__ = original.__doc__, original
    return call


def _gru_covered(cell, inputs, h_tm1, training) -> bool:
    """Whether the step can be the tier's: implementation 2 (no recurrent dropout), Keras's own
    activations, one float dtype, rank 2."""
    names = (getattr(cell.activation, "__name__", None), getattr(cell.recurrent_activation, "__name__", None))
    return (cell.implementation == 2 and names == ("tanh", "sigmoid") and not (training and cell.recurrent_dropout)
            and all(isinstance(t, tf.Tensor) and t.dtype == h_tm1.dtype and t.dtype in EXACT_DTYPES
                    and t.shape.rank == 2 for t in (inputs, h_tm1)))


def _gru_call(original: Callable) -> Callable:
    """``GRUCell.call``: Keras's implementation 2, its three products that an add reads ``product``s."""
    def call(self, inputs, states, training=False):
        from keras import ops  # Keras 3's: the module this hook is installed in is Keras 3's

        nested = isinstance(states, (list, tuple))
        h_tm1 = states[0] if nested else states
        if not _gru_covered(self, inputs, h_tm1, training):
            return original(self, inputs, states, training=training)

        def times(a, b):
            with _fixed.marking():
                return product(a, b)

        units, input_bias, recurrent_bias = self.units, None, None
        if self.use_bias:
            input_bias, recurrent_bias = (self.bias, None) if not self.reset_after else (
                ops.squeeze(e, axis=0) for e in ops.split(self.bias, self.bias.shape[0], axis=0))
        if training and 0.0 < self.dropout < 1.0:
            inputs = times(inputs, self.get_dropout_mask(inputs))
        matrix_x = ops.matmul(inputs, self.kernel)
        if self.use_bias:
            matrix_x = ops.add(matrix_x, input_bias)
        x_z, x_r, x_h = ops.split(matrix_x, 3, axis=-1)
        if self.reset_after:
            matrix_inner = ops.matmul(h_tm1, self.recurrent_kernel)
            if self.use_bias:
                matrix_inner += recurrent_bias
        else:
            matrix_inner = ops.matmul(h_tm1, self.recurrent_kernel[:, :2 * units])
        z = self.recurrent_activation(x_z + matrix_inner[:, :units])
        r = self.recurrent_activation(x_r + matrix_inner[:, units:units * 2])
        if self.reset_after:
            recurrent_h = times(r, matrix_inner[:, units * 2:])
        else:
            recurrent_h = ops.matmul(times(r, h_tm1), self.recurrent_kernel[:, 2 * units:])
        hh = self.activation(x_h + recurrent_h)
        h = times(z, h_tm1) + times(1 - z, hh)
        return h, [h] if nested else h

    call.__doc__, call.__wrapped__ = original.__doc__, original
    return call


_CELLS = {  # target key -> the class and its methods to replace, each by what makes the replacement
    "keras3:lstm_cell": ("LSTMCell", {"_compute_carry_and_output_fused": _fused, "_compute_carry_and_output": _split,
                                      "call": _call}),
    "keras3:gru_cell": ("GRUCell", {"call": _gru_call}),
}


def install() -> Callable[[], None]:
    """Make Keras 3's ``LSTMCell`` and ``GRUCell`` the tier's in every Keras 3 this process loads,
    now or when it is imported; returns the undo."""
    saved = []
    active = [True]

    def replacer(key: str) -> Callable:
        class_name, methods = _CELLS[key]

        def replace(module) -> None:
            if not active[0] or not _targets.expected(_targets.target(key)) or _targets.find(module, key) is None:
                return
            cls = getattr(module, class_name)
            for name, make in methods.items():
                original = cls.__dict__.get(name)
                if original is not None:
                    saved.append((cls, name, original))
                    setattr(cls, name, make(original))

        return replace

    call_after_import({_targets.target(key).module: replacer(key) for key in _CELLS})

    def undo() -> None:
        active[0] = False
        for cls, name, original in reversed(saved):
            setattr(cls, name, original)

    return undo
