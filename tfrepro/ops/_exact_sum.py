"""The order-invariant segment sum every tfrepro op is built on.

Floating-point addition is not associative, so a sum accumulated in thread-arrival order (GPU
atomics) changes its bits from run to run. Integer addition is associative. So each element is
turned into an integer by a scale that depends only on order-invariant quantities, summed in int64,
and scaled back. The result is defined by this canonical computation:

- For each (segment, column): ``m`` = the largest finite magnitude (a max is exact), ``e`` with
  ``m < 2**e``, and ``n`` = the number of elements (exact). ``P = 62 - ceil(log2(n))`` bits.
- Each finite element becomes ``q = trunc(x * 2**(P - e))``; ``|q| < 2**P``, so the int64 sum of
  ``n`` of them stays below ``2**62``: no overflow, for any segment size.
- The int64 sum is converted to float64 (rounded when it needs more than 53 bits) and scaled by
  ``2**(e - P)``, then rounded to the output dtype: two roundings, so a float32 result can be one
  ulp from the correctly rounded sum (``[1, 2**-24, 2**-59]`` gives 1.0, not 1.0000001).
  Float16/bfloat16 data is summed as float32, exactly upcast. NaN and infinities are
  counted separately, with IEEE semantics (NaN if any NaN or both infinities, else the infinity
  present).

Accuracy: the absolute error is below ``n * m * 2**-P`` (quantisation) plus the two roundings; with
``P >= 24`` that beats a float32 sum's bound ``(n - 1) * 2**-24 * sum|x|`` for every segment of up to
``2**38`` elements, and a float64 sum's bound for every segment of up to ``2**9`` elements (beyond,
the extra error stays below ``n * m * 2**-62``). Elements smaller than ``m * 2**-P`` vanish, as they
do in a float sum that holds ``m``. The result is the same for every order
and layout of the inputs; it is not bit-equal to TF's float sum (which has no single answer).
Signed zeros sum to +0.0.

Fast path (float32 working dtype, segment sums): the per-(segment, column) max costs a full segment
reduction, so segments are first tried with one scale per segment, from the largest magnitude in
the whole segment (row maxima, then a 1-D segment max: both cheap). When every element is then an
exact integer (checked), both scales give the exact sum, so the fast result is bit-identical to the
canonical one; otherwise (magnitudes within a segment spanning more than about ``2**(38 -
log2(n))``, magnitudes of ``2**(62 - log2(n))`` and more, or NaN/Inf) the canonical computation
runs. The quantisation runs in row chunks of about 2**19 elements, so that no intermediate is large
enough to be freshly mapped (and page faulted) on every call; int64 sums of chunks are exact, so chunking cannot change a bit. On CPU the
int64 sums use DenseBincount (a little faster than the segment-sum kernel) while its table of
sums stays in cache. Where GPUs are visible, DenseBincount (no deterministic GPU kernel) and int64
segment sums and reductions (TF registers no GPU kernels for them) are avoided: each int64 is split
into three 21-bit limbs whose float64 sums are exact in any order. All of these are exact, so none
can change a bit.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfrepro.ops import _stock

MARK = "tfrepro_exact"  # the name scope of ops exact in any order, which the exact tier's audit trusts
_GRADIENT_SCOPE = re.compile(r"gradient_tape|gradients(_\d+)?")  # where the tape and tf.gradients build gradients


def gradient_depth(scope: str) -> int:
    """How many gradients deep the name scope (or node name) ``scope`` is: 0 in a forward pass, 1
    in a gradient, 2 in a gradient of a gradient."""
    return sum(bool(_GRADIENT_SCOPE.fullmatch(part)) for part in scope.split("/"))


def backward_mark(depth: int) -> str:
    """The name scope of the exact tier's own ops in a gradient ``depth`` deep. There the forward
    op's scope (``MARK`` or a shallower gradient's mark included) is part of every name, so the
    audit trusts a gradient's ops by the mark of its own depth alone, never TF's gradient of the
    exact tier's ops."""
    return f"{MARK}_backward{depth}"


def marking() -> tf.name_scope:
    """The name scope of the exact tier's own ops: ``MARK``, or ``backward_mark`` in a gradient."""
    depth = 0 if tf.executing_eagerly() else gradient_depth(tf.compat.v1.get_default_graph().get_name_scope())
    return tf.name_scope(backward_mark(depth) if depth else MARK)

# Per working dtype: (bits type, mantissa bits, exponent bias, exponent mask, largest exponent a
# single power-of-two factor may have). float16/bfloat16/float32 work in float32 (exact upcast).
_LAYOUT = {
    tf.float32: (tf.int32, 23, 127, 0xFF, 120),
    tf.float64: (tf.int64, 52, 1023, 0x7FF, 1000),
}


def _biased_exponent(m: tf.Tensor) -> tf.Tensor:
    """The exponent field of ``m``'s bits (0 for zeros and subnormals, all ones for NaN and inf)."""
    bits, mantissa, _, mask, _ = _LAYOUT[m.dtype]
    return tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.bitcast(m, bits), mantissa), mask)


def _exponent(m: tf.Tensor) -> tf.Tensor:
    """For finite ``m >= 0``: the int32 ``e`` with ``m < 2**e`` (and ``m >= 2**(e-1)`` if m is normal)."""
    return _unbiased(_biased_exponent(m), m.dtype)


def _unbiased(biased: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    return tf.cast(tf.maximum(biased, 1) - (_LAYOUT[dtype][2] - 1), tf.int32)


def _bit_length(count: tf.Tensor) -> tf.Tensor:
    """``ceil(log2(count))`` for int counts >= 1 (0 for 1) as int32: the bit length of ``count - 1``,
    by a binary search in integers (no float64 on the device: ``exact.slices``)."""
    rest = tf.maximum(tf.cast(count, tf.int64) - 1, 0)
    length = tf.zeros_like(rest)
    for shift in (32, 16, 8, 4, 2, 1):
        above = rest >= 2**shift
        rest = tf.where(above, tf.bitwise.right_shift(rest, shift), rest)
        length += tf.where(above, tf.constant(shift, tf.int64), 0)
    return tf.cast(length + rest, tf.int32)


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


def _with_pow2_factors(shift: tf.Tensor, dtype: tf.DType, apply):
    """``apply(factors)`` with factors of ``dtype`` whose product is ``2**shift``: one in the common
    case, two where some group's scale lies outside the dtype's normal range (tiny magnitudes)."""
    bias = _LAYOUT[dtype][2]
    in_range = (tf.reduce_max(shift) < bias) & (tf.reduce_min(shift) > -bias)
    return tf.cond(in_range, lambda: apply([_exact_pow2(shift, dtype)]), lambda: apply(list(_pow2(shift, dtype))))


class _Segments:
    """Groups elements [N, K] by segment id (rows), as ``unsorted_segment_sum`` does: ids outside
    ``[0, num_segments)`` are dropped (the callers check them first)."""

    def __init__(self, segment_ids: tf.Tensor, num_segments: tf.Tensor, plan: Plan | None = None):
        self.plan = plan or current_plan()
        self.num = num_segments
        kept = (segment_ids >= 0) & (segment_ids < tf.cast(num_segments, segment_ids.dtype))
        self.slot = tf.where(kept, tf.cast(segment_ids, tf.int32), num_segments)  # dropped: a spare slot
        self.slots = num_segments + 1
        self.accumulate = _ACCUMULATORS[self.plan.accumulator]

    def max(self, values: tf.Tensor) -> tf.Tensor:
        return _stock.unsorted_segment_max(values, self.slot, self.slots)[:self.num]

    def magnitude(self, x: tf.Tensor) -> tf.Tensor:
        """The largest ``|x|`` per segment and column (``|x|`` made a chunk at a time)."""
        def step(start: tf.Tensor, end: tf.Tensor, largest: tf.Tensor) -> tuple[tf.Tensor]:
            chunk = _stock.unsorted_segment_max(tf.abs(x[start:end]), self.slot[start:end], self.slots)
            return (tf.maximum(largest, chunk),)

        lowest = tf.fill(tf.stack([self.slots, tf.shape(x)[1]]), tf.constant(0, x.dtype))  # empty: 0
        return _over_row_chunks(x, self, step, (lowest,))[0][:self.num]

    def count(self) -> tf.Tensor:
        n = tf.shape(self.slot)[0]
        return self.accumulate(tf.ones(tf.stack([n, 1]), tf.int64), self.slot, self.slots)[:self.num]

    def quantised_total(self, x: tf.Tensor, shift: tf.Tensor) -> tf.Tensor:
        """The int64 sums of ``trunc(x * 2**shift)``, ``shift`` per segment and column."""
        def sums(factors: list[tf.Tensor]) -> tf.Tensor:
            tables = [tf.concat([factor, tf.zeros_like(factor[:1])], 0) for factor in factors]  # + the spare slot

            def scaled(start: tf.Tensor, end: tf.Tensor) -> tf.Tensor:
                values, at = x[start:end], self.slot[start:end]
                for table in tables:
                    values *= _stock.gather(table, at)  # exact: a power of two
                return values

            return _chunked_int64_sums(x, scaled, self, check=False)[0]

        return _with_pow2_factors(shift, x.dtype, sums)[:self.num]


class _Axes:
    """Groups the elements along ``axis`` (kept as size-1 dimensions), as ``reduce_sum`` does."""

    def __init__(self, values: tf.Tensor, axis: tf.Tensor | tuple[int, ...], plan: Plan | None = None):
        self.plan = plan or current_plan()
        self.axis = tf.constant(axis, tf.int32, shape=[len(axis)]) if isinstance(axis, tuple) else axis  # () too
        self.n = tf.reduce_prod(_stock.gather(tf.shape(values), self.axis))

    def max(self, values: tf.Tensor) -> tf.Tensor:
        return tf.reduce_max(values, self.axis, keepdims=True)

    def magnitude(self, x: tf.Tensor) -> tf.Tensor:
        """The largest ``|x|`` per group, from two reads of ``x`` (no ``|x|`` written)."""
        return tf.maximum(self.max(x), -tf.reduce_min(x, self.axis, keepdims=True))

    def count(self) -> tf.Tensor:
        return self.n

    def quantised_total(self, x: tf.Tensor, shift: tf.Tensor) -> tf.Tensor:
        """The int64 sums of ``trunc(x * 2**shift)``, ``shift`` per group (broadcast)."""
        def sums(factors: list[tf.Tensor]) -> tf.Tensor:
            values = x
            for factor in factors:
                values *= factor  # exact: a power of two
            return self._total(tf.cast(values, tf.int64))

        return _with_pow2_factors(shift, x.dtype, sums)

    def _total(self, quantised: tf.Tensor) -> tf.Tensor:
        """The int64 sums (exact in any order and grouping). Sums over leading axes (a bias gradient)
        go in blocks of rows: TF's int64 reduction over a leading axis is slow."""
        if self.plan.accumulator == "float64_limbs":  # TF's GPU reductions sum no int64
            return _int64_sum_by_limbs(quantised, lambda limb: _stock.reduce_sum(limb, self.axis, keepdims=True))
        lead = _leading_block(self.axis, quantised.shape.rank)
        if lead is None:
            return _stock.reduce_sum(quantised, self.axis, keepdims=True)
        shape = tf.shape(quantised)
        rows = tf.reshape(quantised, tf.stack([tf.reduce_prod(shape[:lead]), tf.reduce_prod(shape[lead:])]))
        whole = tf.shape(rows)[0] // _ROW_BLOCK * _ROW_BLOCK
        blocks = tf.reshape(rows[:whole], tf.stack([-1, _ROW_BLOCK, tf.shape(rows)[1]]))
        total = _stock.reduce_sum(_stock.reduce_sum(blocks, 1), 0) + _stock.reduce_sum(rows[whole:], 0)
        return tf.reshape(total, tf.concat([tf.ones([lead], tf.int32), shape[lead:]], 0))


def _leading_block(axis: tf.Tensor, rank: int | None) -> int | None:
    """``r`` when ``axis`` is statically ``[0, ..., r - 1]`` with ``0 < r < rank``; else None."""
    value = tf.get_static_value(axis)
    if value is None or rank is None:
        return None
    axes = sorted(int(a) for a in np.reshape(value, [-1]))
    return len(axes) if 0 < len(axes) < rank and axes == list(range(len(axes))) else None


_ROW_BLOCK = 256


def traced(kernel):
    """``kernel`` as ``tf.function``s: in a graph, each call is one call node and the kernel's loops
    and conditions are stored once, not once per op instance; eagerly, one dispatch per call.

    Tensor arguments are traced with their dtype and rank but no dimensions (one trace serves every
    batch size); the other arguments are Python values that select the trace, and so does the
    calling context's ``current_plan()`` (XLA or not, GPUs visible or not), which TF's own trace
    cache does not tell apart under XLA. The traces of a TF1 ``tf.Graph`` live on that graph and go
    with it. Gradients are built colocated with their forward ops, and a colocation would key a new
    trace per op instance, so a call drops the colocation and keeps the device scope it is in."""
    shared: dict = {}

    @functools.wraps(kernel)
    def call(*args):
        is_tensor = [isinstance(arg, tf.Tensor) for arg in args]
        key = (current_plan(), *((arg.dtype, arg.shape.rank) if tensor else arg for arg, tensor in zip(args, is_tensor)))
        functions = _traces_of_this_graph(kernel) if _in_tf1_graph() else shared
        function = functions.get(key)
        if function is None:
            fixed = [None if tensor else arg for arg, tensor in zip(args, is_tensor)]  # holds no tensor

            def bound(*tensors):
                given = iter(tensors)
                with tf.name_scope(MARK):  # exact in any order: the exact tier's audit trusts ops in this scope
                    return kernel(*(next(given) if tensor else arg for arg, tensor in zip(fixed, is_tensor)))

            bound.__name__ = f"tfrepro_{kernel.__name__.lstrip('_')}"
            signature = [tf.TensorSpec(None if arg.shape.rank is None else [None] * arg.shape.rank, arg.dtype)
                         for arg, tensor in zip(args, is_tensor) if tensor]
            function = functions[key] = tf.function(bound, input_signature=signature, autograph=False)
        tensors = [arg for arg, tensor in zip(args, is_tensor) if tensor]
        if tf.executing_eagerly():
            return function(*tensors)
        graph = tf.compat.v1.get_default_graph()
        device = tf.no_op(name="device_scope").device  # the device the enclosing scopes give an op
        with graph.colocate_with(None, ignore_existing=True), tf.device(device or None):
            return function(*tensors)

    return call


def _in_tf1_graph() -> bool:
    """Whether ops are being built into a TF1 ``tf.Graph`` (not eagerly, not in a ``tf.function``)."""
    with tf.init_scope():
        return not tf.executing_eagerly()


def _traces_of_this_graph(kernel) -> dict:
    """The traces of ``kernel`` kept on the outermost graph being built, so they are freed with it
    (TF's trace cache holds that graph; a module-level cache would keep every graph alive)."""
    with tf.init_scope():
        graph = tf.compat.v1.get_default_graph()
    kept = graph.get_collection_ref("_tfrepro_traces")  # graph -> traces -> graph: a cycle gc collects
    if not kept:
        kept.append({})
    return kept[0].setdefault(kernel, {})


def segment_sum_2d(data: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor, plan: Plan) -> tf.Tensor:
    """Order-invariant ``unsorted_segment_sum`` of float ``data`` [N, K] by ``segment_ids`` [N]
    (ids outside ``[0, num_segments)`` dropped) into [num_segments, K], in float32 (float64 for
    float64 data)."""
    x = _working(data)
    groups = _Segments(segment_ids, num_segments, plan)
    if x.dtype != tf.float32:
        return _exact_sum(x, groups)
    fast, exact = _segment_sum_one_scale(x, groups)
    return tf.cond(exact, lambda: fast, lambda: _exact_sum(x, groups))


CHUNK_ELEMENTS = 1 << 19  # per quantisation step: 2 MiB of float32, 4 MiB of int64
PARALLEL_CHUNKS = 4  # steps in flight: one adds while the next quantises


def _segment_sum_one_scale(x: tf.Tensor, groups: _Segments) -> tuple[tf.Tensor, tf.Tensor]:
    """The fast path (module doc): float32 ``x`` [N, K] summed with one scale per segment. Returns
    the sums and whether every element was quantised exactly (then they equal the canonical ones)."""
    row_magnitude = tf.maximum(tf.reduce_max(x, 1), -tf.reduce_min(x, 1))  # NaN and inf fail the check
    largest = _largest_per_slot(_biased_exponent(row_magnitude), groups)[:groups.num]
    shift = tf.minimum(62 - _bit_length(groups.count()[:, 0]) - _unbiased(largest, tf.float32), _LAYOUT[tf.float32][4])
    row_scale = _stock.gather(tf.concat([_exact_pow2(shift, tf.float32), [0.0]], 0), groups.slot)[:, None]
    totals, exact = _chunked_int64_sums(x, lambda start, end: x[start:end] * row_scale[start:end], groups, check=True)
    # A scale below 1 (magnitudes of 2**P and more) can round a tiny element to zero, which the
    # integer check cannot see: such segments take the canonical path.
    exact &= tf.reduce_min(shift) >= 0
    down = _exact_pow2(-shift, tf.float64)[:, None]
    return tf.cast(tf.cast(totals[:groups.num], tf.float64) * down, tf.float32), exact


def _largest_per_slot(values: tf.Tensor, groups: _Segments) -> tf.Tensor:
    """The largest of int ``values`` [N] in [0, 256) per slot (0 for empty slots): from a presence
    table (DenseBincount) where that table is no larger than the input, else a segment max."""
    def segment_max() -> tf.Tensor:
        return tf.maximum(_stock.unsorted_segment_max(values, groups.slot, groups.slots), 0)

    if groups.accumulate not in (_sums_by_bincount, _sums_by_bincount_when_small):
        return segment_max()

    def table() -> tf.Tensor:
        present = tf.raw_ops.DenseBincount(input=groups.slot * 256 + values, size=groups.slots * 256,
                                           weights=tf.zeros([0], tf.int32), binary_output=True)
        return tf.reduce_max(tf.reshape(present, tf.stack([groups.slots, 256])) * tf.range(256), 1)

    return tf.cond(groups.slots <= tf.size(values) // 256, table, segment_max)  # no int32 overflow


def _chunked_int64_sums(x: tf.Tensor, scaled, groups: _Segments, check: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """Sum ``trunc(scaled(start, end))`` (the scaled rows [start, end) of ``x`` [N, K]) as int64 per
    slot into [slots, K], a chunk of rows at a time; with ``check``, also whether every scaled value
    was an integer (no NaN, no infinity, no fraction)."""
    def step(start: tf.Tensor, end: tf.Tensor, totals: tf.Tensor, exact: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        values = scaled(start, end)
        if check:
            exact &= tf.equal(_stock.reduce_sum(values - tf.floor(values)), 0)  # a sum of non-negatives
        return totals + groups.accumulate(tf.cast(values, tf.int64), groups.slot[start:end], groups.slots), exact

    zeros = tf.zeros(tf.stack([groups.slots, tf.shape(x)[1]]), tf.int64)
    return _over_row_chunks(x, groups, step, (zeros, tf.constant(True)))


def _over_row_chunks(x: tf.Tensor, groups: _Segments, step, initial: tuple) -> tuple:
    """Fold ``step(start, end, *state) -> state`` over the rows of ``x`` [N, K] in chunks of about
    ``CHUNK_ELEMENTS`` (at least ``slots`` rows, as each step may make a [slots, K] table); one
    step under XLA, which needs static slice sizes."""
    n, k = tf.shape(x)[0], tf.shape(x)[1]
    if not groups.plan.chunk_elements:
        return step(0, n, *initial)
    rows = tf.maximum(groups.plan.chunk_elements // tf.maximum(k, 1), groups.slots)

    def body(start, *state):
        end = tf.minimum(start + rows, n)
        return (end, *step(start, end, *state))

    state = tf.while_loop(lambda start, *_: start < n, body, (tf.constant(0), *initial),
                          parallel_iterations=PARALLEL_CHUNKS)
    return tuple(state[1:])


class Plan(NamedTuple):
    """How a sum is computed where it is traced: the int64 accumulator by name and the rows per
    quantisation step (0: one step, as XLA needs static slice sizes). Every plan gives the same bits.
    Every traced kernel is keyed by the plan of its calling context (``traced``), so that a trace is
    reused only where it fits."""

    accumulator: str
    chunk_elements: int


_SUMMATION: contextvars.ContextVar[str] = contextvars.ContextVar("tfrepro_summation", default="exact")


def summation() -> str:
    """How the ops sum in the calling context: "exact" (order-invariant, the default) or "tf" (TF's own
    sums, which TF runs deterministically on every device under op determinism: ``patch(ops="auto")``)."""
    return _SUMMATION.get()


@contextlib.contextmanager
def summing(mode: str) -> Iterator[None]:
    """Sum the ops' way ``mode`` ("exact" or "tf") inside the block (traces are keyed by it)."""
    if mode not in ("exact", "tf"):
        raise ValueError(f"summation must be 'exact' or 'tf'; got {mode!r}")
    token = _SUMMATION.set(mode)
    try:
        yield
    finally:
        _SUMMATION.reset(token)


def same_summation(grad):
    """``grad`` (a custom gradient, run later by the tape) summing the way its forward op did."""
    mode = summation()

    @functools.wraps(grad)
    def wrapped(*args, **kwargs):
        with summing(mode):
            return grad(*args, **kwargs)

    return wrapped


def current_plan() -> Plan:
    """The plan for the calling context. Under ``summing("tf")``, TF's own sums. On CPU,
    DenseBincount is the faster accumulator while its table of ``slots * K`` sums stays in cache;
    on GPUs it raises under op determinism, and TF's GPU segment sums take no int64, so they sum
    exact float64 limbs; XLA sums int64 itself."""
    if summation() == "tf":  # XLA apart: a trace with run-time checks cannot compile under XLA
        return Plan("tf_xla" if in_xla_context() else "tf", 0)
    if in_xla_context():
        return Plan("segment", 0)
    return Plan("float64_limbs" if _gpus_visible() else "bincount_when_small", CHUNK_ELEMENTS)


def gpus_visible() -> bool:
    """Whether TensorFlow sees a GPU (``ops="auto"`` runs tfrepro's versions only then)."""
    return _gpus_visible()


@functools.lru_cache(maxsize=None)
def _gpus_visible() -> bool:
    return bool(tf.config.list_logical_devices("GPU"))


def _int64_sum_by_limbs(q: tf.Tensor, float64_sum) -> tf.Tensor:
    """The exact int64 ``sum(q)`` from ``float64_sum`` (a float64 sum over the same groups), for
    devices whose kernels sum no int64. ``q`` (|q| < 2**62, group sums too) splits into three limbs
    below 2**21 in magnitude; float64 sums of up to 2**32 such integers are exact in any order."""
    low = 2**21 - 1
    limbs = (tf.bitwise.right_shift(q, 42), tf.bitwise.bitwise_and(tf.bitwise.right_shift(q, 21), low),
             tf.bitwise.bitwise_and(q, low))
    high, middle, lowest = (tf.cast(float64_sum(tf.cast(limb, tf.float64)), tf.int64) for limb in limbs)
    return (high * 2**21 + middle) * 2**21 + lowest  # each step stays below 2**63


def _sums_by_float64_limbs(q: tf.Tensor, slot: tf.Tensor, slots: tf.Tensor) -> tf.Tensor:
    return _int64_sum_by_limbs(q, lambda limb: _stock.unsorted_segment_sum(limb, slot, slots))


BINCOUNT_TABLE = 1 << 18  # int64 sums: 2 MiB


def _sums_by_bincount_when_small(q: tf.Tensor, slot: tf.Tensor, slots: tf.Tensor) -> tf.Tensor:
    fits = slots <= BINCOUNT_TABLE // tf.maximum(tf.shape(q)[1], 1)  # no int32 overflow
    return tf.cond(fits, lambda: _sums_by_bincount(q, slot, slots), lambda: _sums_by_segment(q, slot, slots))


def _sums_by_segment(q: tf.Tensor, slot: tf.Tensor, slots: tf.Tensor) -> tf.Tensor:
    return _stock.unsorted_segment_sum(q, slot, slots)


def _sums_by_bincount(q: tf.Tensor, slot: tf.Tensor, slots: tf.Tensor) -> tf.Tensor:
    k = tf.shape(q)[1]
    cell = tf.reshape(slot[:, None] * k + tf.range(k), [-1])
    sums = tf.raw_ops.DenseBincount(input=cell, size=slots * k, weights=tf.reshape(q, [-1]), binary_output=False)
    return tf.reshape(sums, tf.stack([slots, k]))


_ACCUMULATORS = {"bincount_when_small": _sums_by_bincount_when_small, "segment": _sums_by_segment,
                 "float64_limbs": _sums_by_float64_limbs, "bincount": _sums_by_bincount}


def in_xla_context() -> bool:
    from tensorflow.python.ops import control_flow_util  # no public equivalent

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def reduce_sum_keepdims(data: tf.Tensor, axis: tf.Tensor | tuple[int, ...], plan: Plan) -> tf.Tensor:
    """Order-invariant ``reduce_sum(data, axis, keepdims=True)`` of float data, in float32 (float64
    for float64 data): TF's reductions on int64, no segment ops, no transposes. ``axis``: a tuple of
    non-negative ints where known when traced (the sum picks its kernels by them), else a tensor."""
    x = _working(data)
    return _exact_sum(x, _Axes(x, axis, plan))


def _working(data: tf.Tensor) -> tf.Tensor:
    return tf.cast(data, tf.float64 if data.dtype == tf.float64 else tf.float32)


def _exact_sum(x: tf.Tensor, groups: _Segments | _Axes) -> tf.Tensor:
    all_finite = tf.math.is_finite(_stock.reduce_sum(x))  # any NaN or infinity makes the sum non-finite
    return tf.cond(all_finite, lambda: _finite_sum(x, groups), lambda: _with_non_finite(x, groups))


def _finite_sum(x: tf.Tensor, groups: _Segments | _Axes) -> tf.Tensor:
    magnitude = tf.maximum(groups.magnitude(x), 0)
    shift = 62 - _bit_length(groups.count()) - _exponent(magnitude)  # per group and column: |x| * 2**shift < 2**P
    total = tf.cast(groups.quantised_total(x, shift), tf.float64)
    down_a, down_b = _pow2(-shift, tf.float64)
    return tf.cast(total * down_a * down_b, x.dtype)


def _with_non_finite(x: tf.Tensor, groups: _Segments | _Axes) -> tf.Tensor:
    """The finite elements summed exactly, then IEEE semantics for the non-finite ones."""
    result = _finite_sum(tf.where(tf.math.is_finite(x), x, tf.zeros_like(x)), groups)

    def present(mask: tf.Tensor) -> tf.Tensor:
        return groups.max(tf.cast(mask, tf.int32)) > 0

    nan, pos, neg = present(tf.math.is_nan(x)), present(tf.equal(x, float("inf"))), present(tf.equal(x, float("-inf")))
    inf = tf.constant(float("inf"), x.dtype)
    result = tf.where(neg, -inf, result)
    result = tf.where(pos, inf, result)
    return tf.where(nan | (pos & neg), tf.constant(float("nan"), x.dtype), result)
