"""The exact tier's ``matmul`` and ``einsum``: products independent of the summation order, and
their gradients, replica-global where they sum a weight's gradient over the batch."""

from __future__ import annotations

import tensorflow as tf

from tfrepro.errors import warn
from tfrepro.ops import _stock
from tfrepro.ops.exact import _fixed

EXACT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


_VIEWS = ("Identity", "Cast", "ReadVariableOp", "Reshape", "Squeeze", "ExpandDims", "Transpose")


def is_weight(x) -> bool:
    """Whether ``x`` is a variable or a read of one (through casts, identities and reshapes): its
    gradient sums over the batch, which replicas split."""
    if isinstance(x, tf.Variable) or (hasattr(x, "assign") and hasattr(x, "trainable")):
        return True
    op = getattr(x, "op", None) if not tf.executing_eagerly() else None
    while op is not None and op.type in _VIEWS:
        if op.type == "ReadVariableOp":
            return True
        op = op.inputs[0].op if op.inputs else None
    return op is not None and op.type in ("VarHandleOp", "VariableV2")


def weight_gradient_replicas(weight: bool) -> _fixed.Replicas | None:
    """The replicas a weight's gradient is summed over, or None for an activation's."""
    return _fixed.Replicas() if weight else None


def _matrix(a: tf.Tensor, b: tf.Tensor, b_is_weight: bool, a_is_weight: bool) -> tf.Tensor:
    """The exact product of [..., M, K] and [..., K, N] (equal batch dimensions, or ``b`` rank 2)."""
    folded = a.shape.rank is not None and a.shape.rank > 2 and b.shape.rank == 2
    if folded:
        outer = tf.shape(a)[:-1]
        a = tf.reshape(a, tf.stack([-1, tf.shape(a)[-1]]))

    @_fixed.custom_gradient
    def product(x, y):
        def grad(dz):
            dx = _fixed.exact_matmul(dz, tf.linalg.matrix_transpose(y), weight_gradient_replicas(a_is_weight))
            dy = _fixed.exact_matmul(tf.linalg.matrix_transpose(x), dz, weight_gradient_replicas(b_is_weight))
            return _fixed.first_order_only(dx, "matmul", dz, y), _fixed.first_order_only(dy, "matmul", x, dz)

        return _fixed.exact_matmul(x, y), grad

    result = product(a, b)
    if folded:
        result = tf.reshape(result, tf.concat([outer, tf.shape(result)[-1:]], 0))
    return result


def matmul(a, b, transpose_a=False, transpose_b=False, adjoint_a=False, adjoint_b=False, a_is_sparse=False,
           b_is_sparse=False, output_type=None, grad_a=False, grad_b=False, name=None):
    """``tf.matmul`` (and ``tf.linalg.matmul``) with an exact, order-invariant product for float32,
    float16 and bfloat16: the same bits for any thread count, oneDNN setting, XLA or device
    (``_fixed``). Other dtypes run TF's op (integers are exact already; float64 and complex with a
    warning that they are not covered)."""
    a_weight, b_weight = is_weight(a), is_weight(b)
    a, b = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
    stock_kwargs = dict(transpose_a=transpose_a, transpose_b=transpose_b, adjoint_a=adjoint_a, adjoint_b=adjoint_b,
                        a_is_sparse=a_is_sparse, b_is_sparse=b_is_sparse, name=name)
    if output_type is not None:
        stock_kwargs["output_type"] = output_type
    if a.dtype not in EXACT_DTYPES or b.dtype != a.dtype or (output_type is not None and output_type != a.dtype):
        if a.dtype.is_floating or a.dtype.is_complex:
            warn(f"tfrepro exact tier: matmul of {a.dtype.name} runs TensorFlow's own kernel, which is not "
                 "order-invariant; use float32, float16 or bfloat16")
        with _fixed.unmarked():
            return _stock.matmul(a, b, **stock_kwargs)
    with tf.name_scope(name or "ExactMatMul"):
        if transpose_a or adjoint_a:
            a = tf.linalg.matrix_transpose(a)
        if transpose_b or adjoint_b:
            b = tf.linalg.matrix_transpose(b)
        if a.shape.rank is not None and b.shape.rank is not None and not (b.shape.rank == 2 and a.shape.rank >= 2):
            batch = tf.broadcast_dynamic_shape(tf.shape(a)[:-2], tf.shape(b)[:-2])
            a = tf.broadcast_to(a, tf.concat([batch, tf.shape(a)[-2:]], 0))
            b = tf.broadcast_to(b, tf.concat([batch, tf.shape(b)[-2:]], 0))
            # A batched product contracts over no batch axis: a weight's gradient is summed per
            # replica (order-invariantly) by the broadcast's gradient, and across replicas by TF.
            a_weight = b_weight = False
        elif a.shape.rank is None or b.shape.rank is None:
            a_weight = b_weight = False
        return _matrix(a, b, b_weight, a_weight)


def einsum(equation, *inputs, **kwargs):
    """``tf.einsum`` through transposes, reshapes and the exact ``matmul`` (TF's own reduction of an
    einsum to matrix products), for the equations that reduction handles: two operands, or one."""
    from tensorflow.python.ops import special_math_ops  # no public equivalent

    name = kwargs.pop("name", None)
    kwargs.pop("optimize", None)
    if kwargs:
        raise TypeError(f"einsum() got unexpected keyword arguments {sorted(kwargs)}")
    with tf.name_scope(name or "ExactEinsum"):
        return special_math_ops._einsum_v1(equation, *(tf.convert_to_tensor(x) for x in inputs))
