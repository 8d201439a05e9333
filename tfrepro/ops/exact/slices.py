"""The exact products in float32 slices: the same integers as ``_fixed``'s float64 products, formed
with no float64 arithmetic, for the GPUs whose float64 runs at 1/32 or 1/64 of their float32 rate.

**The method** (Ozaki's splitting, with float32 slices). ``_fixed`` quantises ``A`` and ``B`` to
integers ``qa``, ``qb`` of at most ``2**23`` in magnitude and needs the exact sums
``T = sum_k qa[m, k] * qb[k, n]``. Here each integer is split into three signed base-``2**8``
digits by round-to-nearest, ``q = d2 * 2**16 + d1 * 2**8 + d0`` with ``|d| <= 2**7`` (every step
exact in float32), so that ``T = sum_ij 2**(8 * (i + j)) * (D_i @ E_j)``. Each digit product is at
most ``2**14``, so a float32 sum of up to ``CHUNK_K = 1024`` of them is an integer of at most
``2**24``: exact in float32 whatever the order, blocking, thread count, FMA use or split-K of the
kernel that sums it, and exact with TF32 (or bfloat16) inputs, which hold every digit. The nine
digit products are one float32 GEMM (the digits of ``A`` stacked along M, those of ``B`` along
N); K beyond 1024 (or unknown when traced) is cut into chunks of at most 1024, one GEMM each in a
loop whose int64 totals are added. The nine int64 partial totals are shifted and added: ``T``, the
same integer as the float64 path's, so every result is the same bits (tested over shapes,
magnitudes and K).

**Cost.** Nine float32 products for the float64 path's one (two beyond K = 128 where the chunks'
partial products would outweigh a second product): on a CPU, whose float64 runs at half its
float32 rate, the float64 path is cheaper; on a GPU whose float64 runs at 1/32 (GeForce 10 and 20
series, T4) or 1/64 (GeForce 30 and 40 series, A10, L4) of float32, the slices are about 3.5x or
7x faster (the docs' cost model). ``path()`` chooses.

**Choosing.** ``TFREPRO_EXACT_PRODUCTS`` selects the path: ``auto`` (the default: float32 slices
where a visible GPU runs float64 at a small fraction of float32, by its compute capability;
float64 elsewhere), ``float64`` or ``float32``. Both give the same bits, so the choice changes
the cost alone; it is read when a product is traced.
"""

from __future__ import annotations

import functools
import os

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops._exact_sum import _pow2

ENV = "TFREPRO_EXACT_PRODUCTS"
PATHS = ("auto", "float64", "float32")
DIGIT_BITS = 8
DIGITS = 3  # 3 * 8 bits: every quantised integer (at most 2**23) is three digits
CHUNK_K = 1024  # 1024 * 2**7 * 2**7 = 2**24: a float32 sum of a chunk's digit products is exact
# Compute capabilities whose float64 rate is half of float32's (P100, V100, A100, H100/H200, B200):
# everything else NVIDIA makes runs float64 at 1/32 or 1/64 of float32.
FULL_RATE_FLOAT64 = ((6, 0), (7, 0), (8, 0), (9, 0), (10, 0))


def path() -> str:
    """The product path in force: ``"float32"`` or ``"float64"`` (module doc).

    Raises:
        ValueError: ``TFREPRO_EXACT_PRODUCTS`` is set to something other than ``PATHS``.
    """
    chosen = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if chosen not in PATHS:
        raise ValueError(f"{ENV} must be one of {', '.join(PATHS)}; got {os.environ[ENV]!r}")
    return _auto() if chosen == "auto" else chosen


@functools.lru_cache(maxsize=None)
def _auto() -> str:
    """float32 where a visible GPU runs float64 slowly (a device's details do not change in a process;
    the visible devices are set before TF's runtime starts, and a product is traced after)."""
    for gpu in tf.config.get_visible_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if capability is not None and tuple(capability) not in FULL_RATE_FLOAT64:
            return "float32"
    return "float64"


def quantise(x: tf.Tensor, e: tf.Tensor, bits: tf.Tensor) -> tf.Tensor:
    """``round(x * 2**(bits - e))`` in float32 for float32 ``x`` (finite or zeroed): the integers of
    ``_fixed.quantise``, whose float64 product is exact, by two exact power-of-two factors (the
    scale can exceed float32's range where the result does not)."""
    value = x
    for factor in _pow2(bits - e, tf.float32):
        value = value * factor
    return tf.round(value)


def digits(q: tf.Tensor) -> list[tf.Tensor]:
    """Float32 integers ``|q| <= 2**23`` as their three signed digits, lowest first: ``q = d2 * 2**16
    + d1 * 2**8 + d0``, ``|d| <= 2**7``, every step exact."""
    high = tf.round(q * 2.0**-16)
    rest = q - high * 2.0**16
    middle = tf.round(rest * 2.0**-8)
    return [rest - middle * 2.0**8, middle, high]


def integer_product(qa: tf.Tensor, qb: tf.Tensor, k: int | None) -> tf.Tensor:
    """``qa @ qb`` as exact int64 sums, for float32 integers ``qa`` [..., M, K] and ``qb`` [..., K, N]
    of at most ``2**23`` in magnitude (``k``: the static K, or None). K up to ``CHUNK_K`` is one
    product; beyond, a loop over chunks of ``CHUNK_K`` (the last one zero-padded) adds each chunk's
    int64 totals, so that memory stays that of one chunk's product whatever K."""
    lead, rows, columns = tf.shape(qa)[:-2], tf.shape(qa)[-2], tf.shape(qb)[-1]
    depth = tf.shape(qa)[-1]
    # the batch dimensions as one (none: one), so that every step below has a known rank
    stacked_a = tf.reshape(tf.concat(digits(qa), axis=-2), [-1, DIGITS * rows, depth])  # digit i: rows i*M ..
    stacked_b = tf.reshape(tf.concat(digits(qb), axis=-1), [-1, depth, DIGITS * columns])
    if k is not None and k <= CHUNK_K:
        partial = tf.cast(_stock.matmul(stacked_a, stacked_b), tf.int64)
    else:
        chunk = tf.clip_by_value(depth, 1, CHUNK_K)  # K = 0: no chunk, a total of zeros
        chunks = (depth + chunk - 1) // chunk
        pad = chunks * chunk - depth
        batch = tf.shape(stacked_a)[0]
        # chunk-major, so that each step reads one contiguous chunk (slicing K in place made XLA's loop
        # about 10x slower than its products: 1.5 s for K = 36,864)
        chunked_a = tf.transpose(tf.reshape(tf.pad(stacked_a, [[0, 0], [0, 0], [0, pad]]),
                                            tf.stack([batch, DIGITS * rows, chunks, chunk])), [2, 0, 1, 3])
        chunked_b = tf.reshape(tf.transpose(tf.pad(stacked_b, [[0, 0], [0, pad], [0, 0]]), [1, 0, 2]),
                               tf.stack([chunks, chunk, batch, DIGITS * columns]))

        def add_chunk(index, total):
            b_part = tf.transpose(chunked_b[index], [1, 0, 2])
            return index + 1, total + tf.cast(_stock.matmul(chunked_a[index], b_part), tf.int64)

        zeros = tf.zeros(tf.stack([batch, DIGITS * rows, DIGITS * columns]), tf.int64)
        _, partial = tf.while_loop(lambda index, _: index < chunks, add_chunk, (tf.constant(0), zeros))
    blocks = tf.reshape(partial, [-1, DIGITS, rows, DIGITS, columns])
    total = None
    for i in range(DIGITS):
        for j in range(DIGITS):
            term = blocks[:, i, :, j, :] * 2 ** (DIGIT_BITS * (i + j))
            total = term if total is None else total + term
    return tf.reshape(total, tf.concat([lead, [rows, columns]], 0))
