"""Exact fixed-point products and sums: the arithmetic every exact-tier op is built on.

**The exact matrix product** (after Ozaki, Ogita, Oishi and Rump, 2011). For ``A`` [M, K] and ``B``
[K, N] in float32 (float16 and bfloat16 upcast exactly):

- ``ea`` per row of A and ``eb`` per column of B, with ``max|a| < 2**ea`` (a max is exact).
- ``bits = min(46, 62 - ceil(log2 K))``, split ``a_bits = ceil(bits / 2)``, ``b_bits = bits - a_bits``
  (23 and 23 up to ``K = 2**16``).
- ``qa = round(a * 2**(a_bits - ea))``, ``qb = round(b * 2**(b_bits - eb))``: integers of at most
  ``2**a_bits`` and ``2**b_bits``, so the sum of K products is an integer of at most ``2**62``.
- The products are formed so that every float64 partial sum is an integer of at most ``2**53``,
  hence exact whatever order, blocking, thread count, FMA use or device sums it (``_plan``): one
  float64 product for ``K <= 128`` (``128 * 2**46 = 2**53``); else K in the fewest chunks of at most
  128 (of even width), one batched product, the chunks' int64 totals added; or ``qa = hi * 2**12 +
  lo`` in two limbs and two products. Every way gives the same integers. The int64 total is rounded to float32 once, then
  scaled by a power of two (exact for normal results; TF flushes subnormals to zero on a CPU).

Accuracy: quantisation moves each ``a`` by at most ``2**(ea - a_bits - 1)`` and each ``b`` by
``2**(eb - b_bits - 1)``, so ``|C - A @ B| <= K * 2**(ea + eb) * (2**-a_bits + 2**-b_bits) / 2``
(plus the square of those terms) before the final rounding's half an ulp. For K up to ``2**16``
that is ``K * 2**(ea + eb - 23)``: within float32's own worst case, ``K * 2**-24 * sum|a||b|``, for
``K >= 2``, and measured no worse than TF's float32 matmul on training shapes (the tests). Beyond
``2**16``, a bit is given up per doubling of K (two beyond ``2**19``, from ``b_bits``). Rows and
columns with a NaN or an infinity give NaN. Float16 and bfloat16 results are rounded twice
(to float32, then to their dtype).

**Replicas.** When a product sums over the batch (a weight's gradient) under a ``tf.distribute``
strategy with more than one replica, each replica holds part of the batch. ``Replicas`` makes the
scales global (the max of the replicas' exponents), the bit budget global (the global K), sums
the int64 totals across replicas exactly (as three float64 limbs of 21 bits), rounds once, and
hands the result to the first replica only (zeros elsewhere), so that the strategy's sum of the
replicas' gradients adds only zeros. The result is then the bits of one device with the whole
batch. With one replica every step is the identity, and the computation is the same.

**FMA barriers.** XLA contracts ``a * b + c`` into a fused multiply-add, which rounds once instead
of twice; TF's kernels round twice. ``barrier(p)`` rounds a float64 product to 48 bits through its
integer bits: an operation no compiler can fuse through, so the product is rounded the same way
with and without XLA.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator

import tensorflow as tf

from tfrepro.errors import warn
from tfrepro.ops import _stock
from tfrepro.ops import _exact_sum
from tfrepro.ops._exact_sum import _bit_length, _exact_pow2, _exponent, _pow2
from tfrepro.ops.exact import slices

LOW_LIMB_BITS = 12
MAX_BITS = 46  # 23 + 23, for K up to 2**16
CHUNK_K = 128  # K * 2**46 <= 2**53: one float64 product of a chunk of K is exact
SYMMETRIC_K = 2**(62 - MAX_BITS)  # up to this K, ``bit_budget`` gives both sides of a product 23 bits
# Below this many elements (of the dimensions known when traced), an elementwise step runs on TF's
# kernels: XLA's compile of a kernel (a tenth of a second or more, per shape) would outweigh what
# fusing its passes saves, in the short runs tests and notebooks make.
COMPILE_MIN_ELEMENTS = 2**12


def worth_compiling(x) -> bool:
    """Whether ``x`` (a tensor or variable) is large enough for its elementwise step to run as an
    XLA kernel (``COMPILE_MIN_ELEMENTS``; a dimension unknown when traced counts as 1)."""
    shape = tf.TensorShape(x.shape)
    return shape.rank is not None and math.prod(d for d in shape.as_list() if d is not None) >= COMPILE_MIN_ELEMENTS


def working(x: tf.Tensor) -> tf.Tensor:
    """float16/bfloat16/float32 as float32 (exact); float64 as it is."""
    return x if x.dtype == tf.float64 else tf.cast(x, tf.float32)


def finite_or_zero(x: tf.Tensor) -> tf.Tensor:
    return tf.where(tf.math.is_finite(x), x, tf.zeros_like(x))


def exponent_of_max(x: tf.Tensor, axis: int | list[int], replicas: Replicas | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """The int32 ``e`` with ``max|x| < 2**e`` over ``axis`` (kept), and whether every element there
    is finite (where one is not, ``e`` is that of the dtype's largest value, so that every finite
    element there quantises within range; the caller's result there is NaN); global over
    ``replicas`` when given. One pass: a non-finite element counts as an infinite magnitude, and
    no element (a replica's empty share of a batch) as zero."""
    magnitude = tf.reduce_max(tf.where(tf.math.is_finite(x), tf.abs(x), tf.constant(float("inf"), x.dtype)),
                              axis=axis, keepdims=True)
    finite = magnitude < float("inf")
    e = _exponent(tf.where(finite, tf.maximum(magnitude, 0), tf.constant(x.dtype.max, x.dtype)))
    if replicas is None:
        return e, finite
    e, bad = replicas.max(e), replicas.max(tf.cast(tf.logical_not(finite), tf.int32))
    return e, tf.equal(bad, 0)


def bit_budget(k: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``(a_bits, b_bits)`` for a sum of ``k`` products (int32 tensors): ``a_bits + b_bits <=
    min(46, 62 - L)`` with ``L = ceil(log2 k)``, and ``b_bits <= 42 - L`` so that the low limb's
    float64 sums (``k * 2**11 * 2**b_bits``) stay within ``2**53`` for any K."""
    bits_of_k = _bit_length(tf.cast(k, tf.int64))
    total = tf.minimum(MAX_BITS, 62 - bits_of_k)
    a_bits = total - total // 2
    b_bits = tf.minimum(total - a_bits, 42 - bits_of_k)
    return a_bits, b_bits


def quantise(x: tf.Tensor, e: tf.Tensor, bits: tf.Tensor) -> tf.Tensor:
    """``round(x * 2**(bits - e))`` as float64 integers (``x`` finite or zeroed)."""
    return tf.round(tf.cast(x, tf.float64) * _exact_pow2(bits - e, tf.float64))


def narrow(x: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Float64 ``x`` rounded to ``dtype`` as TF's CPU kernels round it, through float32 for float16
    and bfloat16 (XLA would round float64 to float16 once, where TF rounds twice)."""
    if dtype in (tf.float16, tf.bfloat16):
        x = tf.cast(x, tf.float32)
    if dtype == tf.bfloat16:
        return _round_to_bfloat16(x)
    return tf.cast(x, dtype)


def _round_to_bfloat16(x: tf.Tensor) -> tf.Tensor:
    """Float32 ``x`` rounded to the nearest bfloat16, ties to even, on its bits; every NaN becomes the
    positive quiet NaN. The same bits as TF's CPU cast for every other value (TF's vectorised cast
    makes NaN positive too, its scalar tail keeps the sign); XLA's convert keeps NaN's sign, and the
    next XLA (tf-nightly 2.22.0.dev20260905) did not finish compiling a float64 function's convert
    to bfloat16."""
    bits = tf.bitcast(x, tf.int32)
    lsb = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 16), 1)
    upper = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits + 0x7FFF + lsb, 16), 0xFFFF)
    rounded = tf.bitcast(tf.cast(upper, tf.uint16), tf.bfloat16)
    return tf.where(tf.math.is_nan(x), tf.constant(float("nan"), tf.bfloat16), rounded)


def round_scaled(total: tf.Tensor, shift: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``total * 2**shift`` for int64 ``total``: one rounding to float32 (float64 for float64),
    then exact scaling."""
    precision = tf.float64 if dtype == tf.float64 else tf.float32
    value = tf.cast(total, precision)
    for factor in _pow2(shift, precision):
        value = value * factor
    return tf.cast(value, dtype)


def int64_from_float64(x: tf.Tensor) -> tf.Tensor:
    return tf.cast(x, tf.int64)


def split_int64(q: tf.Tensor) -> tf.Tensor:
    """``q`` (|q| < 2**62) as three float64 limbs below 2**21 stacked on a new last axis: float64
    sums of up to 2**32 of each limb are exact."""
    low = 2**21 - 1
    limbs = (tf.bitwise.right_shift(q, 42), tf.bitwise.bitwise_and(tf.bitwise.right_shift(q, 21), low),
             tf.bitwise.bitwise_and(q, low))
    return tf.stack([tf.cast(limb, tf.float64) for limb in limbs], axis=-1)


def join_int64(limbs: tf.Tensor) -> tf.Tensor:
    high, middle, lowest = (tf.cast(limbs[..., i], tf.int64) for i in range(3))
    return (high * 2**21 + middle) * 2**21 + lowest


MARK = _exact_sum.MARK  # the name scope of the exact tier's ops, which its audit trusts (``coverage``)
marking = _exact_sum.marking  # enters it (``_exact_sum.backward_mark`` where TF builds a gradient)
REPLICA_GLOBAL = MARK + "_replica_global"  # the scope of a replica-global value: all on the first replica


def marked_scope(part: str) -> bool:
    return part == MARK or part.startswith(MARK + "_")


@contextlib.contextmanager
def unmarked() -> Iterator[None]:
    """The current name scope without ``MARK``: where an exact-tier op falls back to TF's own kernel
    (a dtype it does not cover), whose ops the audit must see for what they are."""
    graph = tf.compat.v1.get_default_graph()
    parts = graph.get_name_scope().split("/") if not tf.executing_eagerly() else []
    if not any(marked_scope(part) for part in parts):
        yield
        return
    kept = [part for part in parts if not marked_scope(part)]
    with graph.name_scope("/".join(kept) + "/" if kept else ""):
        yield


class Replicas:
    """The replicas of the calling ``tf.distribute`` replica context that share a batch: global
    maxima, sums and counts, and the first replica's share of a result. Every method is the
    identity for one replica."""

    def __init__(self) -> None:
        context = tf.distribute.get_replica_context()
        self.context = context
        self.count = 1 if context is None else int(context.num_replicas_in_sync)
        if self.count > 1 and _in_control_flow():
            warn("tfrepro exact tier: a weight's gradient inside a loop or condition (an RNN layer, say) cannot "
                 "be summed across replicas exactly (TF allows no cross-replica call there); it is exact per "
                 "replica, and the replicas' sum is TF's, so the weights can depend on the replica count")
            self.count = 1

    @property
    def many(self) -> bool:
        return self.count > 1

    def max(self, x: tf.Tensor) -> tf.Tensor:
        if not self.many:
            return x
        return tf.reduce_max(self.context.all_gather(x[None], axis=0), axis=0)

    def total(self, n: tf.Tensor) -> tf.Tensor:
        """The sum of an integer count (below 2**53) over the replicas."""
        if not self.many:
            return n
        summed = self.context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(n, tf.float64))
        return tf.cast(summed, n.dtype)

    def sum_int64(self, q: tf.Tensor) -> tf.Tensor:
        """The exact sum of int64 ``q`` (every partial sum below 2**62 in magnitude) over the replicas."""
        if not self.many:
            return q
        return join_int64(self.context.all_reduce(tf.distribute.ReduceOp.SUM, split_int64(q)))

    def first_only(self, x: tf.Tensor) -> tf.Tensor:
        """``x`` on the first replica and zeros on the others: their sum is ``x``, exactly."""
        if not self.many:
            return x
        with tf.name_scope(REPLICA_GLOBAL):  # the audit lets a cross-replica sum of these pass (``coverage``)
            first = tf.equal(tf.cast(self.context.replica_id_in_sync_group, tf.int32), 0)
            return tf.where(first, x, tf.zeros_like(x))


def _in_control_flow() -> bool:
    """Whether ops are being built in a ``tf.while_loop`` or ``tf.cond`` body graph."""
    from tensorflow.python.framework import func_graph  # no public equivalent
    from tensorflow.python.ops import control_flow_v2_func_graphs as graphs

    graph = tf.compat.v1.get_default_graph()
    while isinstance(graph, func_graph.FuncGraph):
        if isinstance(graph, (graphs.CondBranchFuncGraph, graphs.WhileBodyFuncGraph, graphs.WhileCondFuncGraph)):
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def exact_matmul(a: tf.Tensor, b: tf.Tensor, replicas: Replicas | None = None,
                 out_dtype: tf.DType | None = None) -> tf.Tensor:
    """``a @ b`` exactly rounded from an exact fixed-point sum (module doc), for float ``a``
    [..., M, K] and ``b`` [..., K, N] with equal batch dimensions, in ``a``'s dtype (or
    ``out_dtype``: float64 rounds the exact total to 53 bits). With ``replicas``, K is split
    across them (each holds a part of it) and the product is global, on the first replica."""
    if replicas is None or not replicas.many:
        return _compiled(_whole_product, _plan(a.shape, b.shape), out_dtype or a.dtype)(a, b)
    dtype = out_dtype or a.dtype
    a, b = working(a), working(b)
    ea, rows_ok = exponent_of_max(a, -1, replicas)
    eb, cols_ok = exponent_of_max(b, -2, replicas)
    a_bits, b_bits = bit_budget(replicas.total(tf.shape(a)[-1]))
    integers = _compiled(_integer_product, _plan(a.shape, b.shape), dtype)(a, b, ea, eb, a_bits, b_bits)
    total = replicas.sum_int64(integers)
    result = round_scaled(total, ea + eb - a_bits - b_bits, dtype)
    return replicas.first_only(tf.where(rows_ok & cols_ok, result, tf.constant(float("nan"), dtype)))


def exact_matmul_transposed_a(a: tf.Tensor, b: tf.Tensor, replicas: Replicas | None = None) -> tf.Tensor:
    """``exact_matmul(transpose(a), b)`` for matrices ``a`` [K, M] and ``b`` [K, N]: a weight's
    gradient, whose ``a`` (a convolution's patches) is the larger operand. Where both sides are
    quantised to the same number of bits (K at most ``SYMMETRIC_K``, decided when the kernel is
    compiled where K is known only then), it is computed as ``(b^T @ a)^T``, which has the same
    integers (the row scales of one are the column scales of the other) and transposes only the
    smaller ``b``."""
    if (replicas is not None and replicas.many) or (a.shape[0] is not None and a.shape[0] > SYMMETRIC_K):
        return exact_matmul(tf.transpose(a), b, replicas)
    plan = _plan(tf.TensorShape([a.shape[1], a.shape[0]]), b.shape)  # its cost is that of the product as asked
    return _compiled(_transposed_product, plan, a.dtype)(a, b)


def _transposed_product(a: tf.Tensor, b: tf.Tensor, plan: tuple[str, int | None, int | None],
                        dtype: tf.DType) -> tf.Tensor:
    """``exact_matmul_transposed_a``'s kernel: ``(b^T @ a)^T``, or ``a^T @ b`` where K exceeds
    ``SYMMETRIC_K`` (``plan``, made for ``a^T @ b``, depends on K and the rank alone: it fits both)."""
    def swapped():
        return tf.transpose(_whole_product(tf.transpose(b), a, plan, dtype))

    if a.shape[0] is not None:
        return swapped()
    # K from the batch: a shape, so a constant when XLA compiles the kernel (both branches are
    # traced and compiled; one runs)
    return tf.cond(tf.shape(a)[0] <= SYMMETRIC_K, swapped, lambda: _whole_product(tf.transpose(a), b, plan, dtype))


def _plan(a_shape: tf.TensorShape, b_shape: tf.TensorShape) -> tuple[str, int | None, int | None]:
    """How the exact products are formed (every plan gives the same integers): "single" (K <= 128:
    one float64 product), "chunks" (K in chunks of at most 128, one batched float64 product, the
    chunks' int64 totals added; for a K known only when the kernel is compiled, a batch's size, the
    chunks are counted then), or "limbs" (``a`` split in two limbs, for an unknown rank or N, or
    where the chunks' partial products would outweigh a second product: N above 256 for an unknown
    K); or "slices" (float32 digit products, ``slices``, where ``slices.path()`` says so); with the
    static K and rank (a kernel is traced per plan: one traced for two ranks would be generalised
    to an unknown rank)."""
    a_shape, b_shape = tf.TensorShape(a_shape), tf.TensorShape(b_shape)
    rank = a_shape.rank
    k, n = (a_shape[-1], b_shape[-1]) if rank and b_shape.rank else (None, None)
    if slices.path() == "float32":
        return "slices", k, rank
    if rank is None or n is None:
        return "limbs", None, rank
    if k is None:  # known when the kernel is compiled (a batch's size): chunks unless N would make them outweigh limbs
        return ("chunks" if n <= 2 * CHUNK_K else "limbs"), None, rank
    if k <= CHUNK_K:
        return "single", k, rank
    return ("chunks" if -(-k // CHUNK_K) * n <= 2 * k else "limbs"), k, rank


def _integer_product(a, b, ea, eb, a_bits, b_bits, plan: tuple[str, int | None, int | None]) -> tf.Tensor:
    """The exact int64 sums of the quantised products (module doc)."""
    how, k, rank = plan
    if how == "slices":  # the same integers from float32 slices (``slices``), float64 inputs quantised as they are
        def sliced(x, e, bits):
            if x.dtype == tf.float64:
                return tf.cast(quantise(finite_or_zero(x), e, bits), tf.float32)
            return slices.quantise(finite_or_zero(x), e, bits)

        return slices.integer_product(sliced(a, ea, a_bits), sliced(b, eb, b_bits), k)
    qa = quantise(finite_or_zero(a), ea, a_bits)
    qb = quantise(finite_or_zero(b), eb, b_bits)
    if how == "single":
        return int64_from_float64(_stock.matmul(qa, qb))
    if how == "chunks":
        depth = tf.shape(qa)[-1] if k is None else k  # a constant when XLA compiles the kernel
        chunks = tf.maximum((depth + CHUNK_K - 1) // CHUNK_K, 1) if k is None else -(-k // CHUNK_K)
        width = (depth + chunks - 1) // chunks  # chunks of even width (K = 288: three of 96, no padding to 384)
        pad = chunks * width - depth
        qa = tf.pad(qa, [[0, 0]] * (rank - 1) + [[0, pad]])
        qb = tf.pad(qb, [[0, 0]] * (rank - 2) + [[0, pad], [0, 0]])
        lead = tf.shape(qa)[:-2]
        qa = tf.reshape(qa, tf.concat([lead, [tf.shape(qa)[-2], chunks, width]], 0))
        qa = tf.transpose(qa, [*range(rank - 2), rank - 1, rank - 2, rank])  # [..., chunks, M, width]
        qb = tf.reshape(qb, tf.concat([lead, [chunks, width, tf.shape(qb)[-1]]], 0))
        return _stock.reduce_sum(int64_from_float64(_stock.matmul(qa, qb)), axis=-3)
    hi = tf.round(qa * 2.0**-LOW_LIMB_BITS)
    lo = qa - hi * 2.0**LOW_LIMB_BITS
    rows = tf.shape(qa)[-2]
    both = _stock.matmul(tf.concat([hi, lo], axis=-2), qb)
    return int64_from_float64(both[..., :rows, :]) * 2**LOW_LIMB_BITS + int64_from_float64(both[..., rows:, :])


def _whole_product(a, b, plan: tuple[str, int | None, int | None], dtype: tf.DType) -> tf.Tensor:
    a, b = working(a), working(b)
    ea, rows_ok = exponent_of_max(a, -1)
    eb, cols_ok = exponent_of_max(b, -2)
    a_bits, b_bits = bit_budget(tf.shape(a)[-1])
    total = _integer_product(a, b, ea, eb, a_bits, b_bits, plan)
    result = round_scaled(total, ea + eb - a_bits - b_bits, dtype)
    return tf.where(rows_ok & cols_ok, result, tf.constant(float("nan"), dtype))


_COMPILED: dict = {}


def compiled(function):
    """``function`` as an XLA-compiled ``tf.function`` (one trace per rank and dtype; XLA compiles per
    shape). For kernels whose every step is exact or correctly rounded elementwise, so that
    compiling fuses their passes without changing a bit. Every kernel runs inside one of the
    tier's custom gradients (or computes one), so TF's own gradient of it never runs (the audit
    leaves out the backward function TF traces for it eagerly under a tape, ``BACKWARD_OF_KERNEL``).
    Its arguments keep their place on the tape: a second-order gradient reaches the tier's refusal."""
    def kernel(*args):
        with tf.name_scope(MARK):  # the audit trusts the kernel's ops by this scope, not by the function's name
            return function(*args)

    kernel.__name__ = f"{KERNEL_PREFIX}{function.__name__.strip('<>_')}"
    return tf.function(kernel, jit_compile=True, autograph=False, reduce_retracing=True)


KERNEL_PREFIX = "tfrepro_exact_"
BACKWARD_OF_KERNEL = "__backward_" + KERNEL_PREFIX  # TF's name for the backward function of a kernel


def _compiled(kernel, plan: tuple[str, int | None, int | None], dtype: tf.DType):
    """``kernel`` as an XLA-compiled ``tf.function``: its elementwise passes fuse (about 1.7x
    faster on a CPU). Every step is exact, so compiling cannot change a bit."""
    key = (kernel, plan) if kernel is _integer_product else (kernel, plan, dtype)
    if key not in _COMPILED:
        extra = (plan,) if kernel is _integer_product else (plan, dtype)

        def bound(*args):
            return kernel(*args, *extra)

        bound.__name__ = kernel.__name__  # the kernel's name in a profile
        _COMPILED[key] = compiled(bound)
    return _COMPILED[key]


def exact_batch_sum(x: tf.Tensor, axes: list[int], replicas: Replicas | None = None,
                    shared: bool = False) -> tf.Tensor:
    """``reduce_sum(x, axes)`` exactly rounded from an exact fixed-point sum: per kept element,
    ``e`` with ``max|x| < 2**e`` over the summed elements, ``round(x * 2**(62 - ceil(log2 n) - e))``
    summed as int64 (in one XLA kernel; across replicas as three exact float64 limbs, which every
    device sums), rounded once. With
    ``replicas``, the batch is split across them and the sum is global: on the first replica (a
    weight's gradient, which the strategy then sums), or with ``shared`` on every replica (a
    statistic each replica goes on to use)."""
    axes = sorted(axis % x.shape.rank for axis in axes)
    if (replicas is None or not replicas.many) and worth_compiling(x):
        return _batch_sum_kernel(tuple(axes))(x)
    return _batch_sum(x, axes, replicas, shared)


@functools.lru_cache(maxsize=None)
def _batch_sum_kernel(axes: tuple[int, ...]):
    """``_batch_sum`` on one device as an XLA kernel: its dozen passes over ``x`` fuse into a few,
    and the int64 integers are summed as they are (an exact sum, which XLA runs on every device):
    about 5x faster than TF's kernels one by one on a convolution's bias gradient."""
    def batch_sum(x):
        return _batch_sum(x, list(axes), limbs=False)

    return compiled(batch_sum)


def _batch_sum(x: tf.Tensor, axes: list[int], replicas: Replicas | None = None, shared: bool = False,
               limbs: bool = True) -> tf.Tensor:
    """``exact_batch_sum``'s arithmetic; ``limbs``: the int64 integers summed as float64 limbs, which
    TF's kernels sum exactly on every device (else as int64, in an XLA kernel)."""
    dtype = x.dtype
    x = working(x)
    e, finite = exponent_of_max(x, axes, replicas)
    n = tf.reduce_prod(_stock.gather(tf.shape(x), axes))
    if replicas is not None:
        n = replicas.total(n)
    shift = 62 - _bit_length(tf.cast(n, tf.int64)) - e
    q = tf.cast(quantise(finite_or_zero(x), tf.zeros_like(shift), shift), tf.int64)
    if limbs:
        total = join_int64(_stock.reduce_sum(split_int64(q), axis=axes, keepdims=True))
    else:
        total = _stock.reduce_sum(q, axis=axes, keepdims=True)
    if replicas is not None:
        total = replicas.sum_int64(total)
    result = round_scaled(total, -shift, dtype)
    result = tf.where(finite, result, tf.constant(float("nan"), dtype))
    result = tf.squeeze(result, axis=axes)
    return result if replicas is None or shared else replicas.first_only(result)


def custom_gradient(forward):
    """``tf.custom_gradient(forward)``, its gradient function's ops marked the exact tier's too (TF
    builds them in the gradient's scope: ``_exact_sum.backward_mark``)."""
    def marked(*args):
        result, gradient = forward(*args)

        def in_scope(*upstream):
            with marking():
                return gradient(*upstream)

        return result, in_scope

    return tf.custom_gradient(marked)


def first_order_only(gradient: tf.Tensor, what: str, *sources: tf.Tensor) -> tf.Tensor:
    """``gradient`` (one the exact tier computed in fixed point from ``sources``: the upstream
    gradient and the forward values it reads), whose own gradient refuses by name: quantising and
    rounding have no useful gradient, so a second-order gradient through it (a gradient penalty, a
    Hessian-vector product) would be silently zero, None or wrong. The refusal is raised where TF
    builds that gradient: when a ``tf.function`` is traced, before any step. ``sources`` are inputs
    of the refusing op: the integer steps of a fixed-point sum cut TF's gradient paths (neither
    ``tf.gradients`` nor a tape follows an int64 tensor), so without them a second-order gradient
    would never reach the refusal and would come out None."""
    @tf.custom_gradient
    def identity(value, *_):
        def refuse(*upstream):
            raise NotImplementedError(
                f"tfrepro exact tier: a second-order gradient through {what} is not covered (its gradient is an "
                "exact fixed-point sum, which has no gradient of its own); a gradient penalty or a Hessian-vector "
                "product needs patch(ops='auto')")

        return tf.identity(value), refuse

    return identity(gradient, *[s for s in sources if s.dtype.is_floating])


def barrier(p: tf.Tensor) -> tf.Tensor:
    """Float64 ``p`` rounded to 48 significant bits through its integer bits (module doc), so that
    no compiler can fuse the multiply that made ``p`` into a following add. NaN stays NaN."""
    bits = tf.bitcast(p, tf.int64)
    rounded = tf.bitcast(tf.bitwise.bitwise_and(bits + 16, ~31), tf.float64)
    return tf.where(tf.math.is_nan(p), p, rounded)


def keep_graph_order() -> Callable[[], None]:
    """Turn off Grappler's arithmetic optimizer and constant folding, which re-associate float sums
    and products (``a + (b + c)`` becomes an ``AddN`` summed left to right; ``C1 - (a + b)``,
    ``C * (a * b)`` are rotated to bring the constant in) where XLA keeps the traced order; so a
    step computes as traced with XLA on and off, but for the chains whose constants XLA folds
    (``(a + C1) + C2``), which the audit names. Returns the undo."""
    options = ("arithmetic_optimization", "constant_folding")
    before = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options(dict.fromkeys(options, False))

    def undo() -> None:
        # unset (TF's default) cannot be set back; on is the default's meaning
        tf.config.optimizer.set_experimental_options({option: before.get(option) is not False for option in options})

    return undo


def mul(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``a * b`` in float64, rounded through ``barrier``: safe to add to."""
    return barrier(a * b)
