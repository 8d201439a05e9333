"""The exact tier's pooling: ``tf.nn.max_pool`` and ``tf.nn.avg_pool``, 1-D and 2-D, with their own
gradients.

A max is exact in any order (its zeros are made +0: XLA and TF's kernels choose between -0 and +0
differently). TF's max-pool gradient has no deterministic XLA kernel (under op
determinism it raises even on a CPU), so the gradient here goes to the first maximum of each
window in row-major order, as TF's CPU kernel does, through a select. Average pooling
sums each window with an order-invariant sum and divides by the count of real (unpadded)
elements. "SAME" padding pads as TF does.

Windows whose strides equal the pool size (Keras's default) are blocks of a reshape. Overlapping
windows (a ResNet stem's 3x3 pool with stride 2) and gapped ones are image patches: where windows
overlap, an input's gradient is the sum of its windows' gradients, added into place (col2im) in
an order the code fixes, in float64, and rounded once, as the convolution's input gradient is.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops.exact import _fixed
from tfrepro.ops.exact._fixed import compiled, custom_gradient
from tfrepro.ops.exact.convolutions import _pair, _same_padding, col2im, windows
from tfrepro.ops.exact.linalg import EXACT_DTYPES
from tfrepro.ops.segment import reduce_sum


def _blocks(x: tf.Tensor, k: list[int], padding: str, fill: float) -> tuple[tf.Tensor, list]:
    """NHWC ``x`` as [B, Ho, kh, Wo, kw, C] windows (a reshape: no copy), and the (before, after)
    padding per dimension (a negative after: the remainder VALID drops)."""
    pads = []
    for i, size in enumerate((tf.shape(x)[1], tf.shape(x)[2])):
        pads.append(_same_padding(size, k[i], k[i], 1) if padding == "SAME" else (0, -(size % k[i])))
    cropped = x[:, :tf.shape(x)[1] + tf.minimum(pads[0][1], 0), :tf.shape(x)[2] + tf.minimum(pads[1][1], 0)]
    padded = tf.pad(cropped, [[0, 0], [pads[0][0], tf.maximum(pads[0][1], 0)],
                              [pads[1][0], tf.maximum(pads[1][1], 0)], [0, 0]], constant_values=fill)
    shape = tf.shape(padded)
    return tf.reshape(padded, tf.stack([shape[0], shape[1] // k[0], k[0], shape[2] // k[1], k[1], shape[3]])), pads


def _unblock(blocks: tf.Tensor, pads: list, like: tf.Tensor) -> tf.Tensor:
    """The inverse of ``_blocks``: back to ``like``'s shape (padding removed, dropped remainders as zeros)."""
    shape = tf.shape(blocks)
    padded = tf.reshape(blocks, tf.stack([shape[0], shape[1] * shape[2], shape[3] * shape[4], shape[5]]))
    size = tf.shape(like)
    inner = padded[:, pads[0][0]:pads[0][0] + size[1] + tf.minimum(pads[0][1], 0),
                   pads[1][0]:pads[1][0] + size[2] + tf.minimum(pads[1][1], 0)]
    return tf.pad(inner, [[0, 0], [0, -tf.minimum(pads[0][1], 0)], [0, -tf.minimum(pads[1][1], 0)], [0, 0]])


def _first(hits: tf.Tensor) -> tf.Tensor:
    """The first True of each [kh, kw] window (axes 2 and 4) in row-major order."""
    counts = tf.cast(hits, tf.int32)
    earlier_in_row = tf.cumsum(counts, axis=4, exclusive=True) > 0
    row_hit = tf.reduce_max(counts, axis=4, keepdims=True)
    earlier_row = tf.cumsum(row_hit, axis=2, exclusive=True) > 0
    return hits & ~earlier_in_row & ~earlier_row


def _checked(input, ksize, strides, padding, data_format, what: str):
    x = tf.convert_to_tensor(input)
    rank = x.shape.rank
    if rank not in (3, 4):
        raise NotImplementedError(f"tfrepro exact tier: {what} over {'unknown-rank' if rank is None else f'{rank}-D'} "
                                  "input is not covered (3-D and 4-D are)")
    spatial = rank - 2
    channels_first = data_format is not None and data_format.startswith("NC")
    k, s = (_pair(ksize, spatial, "ksize", channels_first, what), _pair(strides, spatial, "strides", channels_first, what))
    padding = padding.upper() if isinstance(padding, str) else padding
    if padding not in ("SAME", "VALID"):
        raise NotImplementedError(f"tfrepro exact tier: {what} padding {padding!r} is not covered")
    if channels_first:
        x = tf.transpose(x, [0, *range(2, rank), 1])
    if rank == 3:
        x, k, s = tf.expand_dims(x, 1), [1, *k], [1, *s]
    return x, k, s, padding, rank, channels_first


def _restored(y: tf.Tensor, rank: int, channels_first: bool) -> tf.Tensor:
    if rank == 3:
        y = tf.squeeze(y, 1)
    if channels_first:
        y = tf.transpose(y, [0, rank - 1, *range(1, rank - 1)])
    return y


def _max_of_blocks(inputs: tf.Tensor, k, padding: str):
    blocks, pads = _blocks(inputs, list(k), padding, float("-inf"))
    top = tf.reduce_max(blocks, axis=[2, 4])
    return blocks, pads, tf.where(tf.equal(top, 0), tf.zeros_like(top), top)  # XLA and TF's kernels pick -0 or +0 differently


@functools.lru_cache(maxsize=None)
def _max_pool_kernels(k: tuple[int, int], padding: str):
    """The forward and backward of a max pool as XLA-compiled functions (their passes fuse; every
    step is exact, so compiling cannot change a bit)."""
    def forward(inputs):
        return _max_of_blocks(inputs, k, padding)[2]

    def backward(inputs, dy):
        blocks, pads, top = _max_of_blocks(inputs, k, padding)
        first = _first(tf.equal(blocks, top[:, :, None, :, None]))
        return _unblock(tf.where(first, dy[:, :, None, :, None], tf.zeros_like(blocks)), pads, inputs)

    return compiled(forward), compiled(backward)


def _placed(contributions: tf.Tensor, inputs: tf.Tensor, k: list[int], s: list[int], padding: str) -> tf.Tensor:
    """Each window's [B, Ho, Wo, kh * kw, C] gradient added into place in ``inputs``' shape (col2im)."""
    shape = tf.shape(contributions)
    columns = tf.reshape(tf.cast(contributions, tf.float64), tf.stack([shape[0], shape[1], shape[2], k[0], k[1], shape[4]]))
    columns.set_shape([None, None, None, k[0], k[1], None])
    return col2im(columns, tf.shape(inputs), [1, 1], s, padding, inputs.dtype)


@functools.lru_cache(maxsize=None)
def _overlapping_max_pool_kernels(k: tuple[int, int], s: tuple[int, int], padding: str):
    """``_max_pool_kernels`` for windows whose strides differ from their size."""
    def top_of(values):
        top = tf.reduce_max(values, axis=3)
        return tf.where(tf.equal(top, 0), tf.zeros_like(top), top)

    def forward(inputs):
        return top_of(windows(inputs, list(k), list(s), padding, float("-inf")))

    def backward(inputs, dy):
        values = windows(inputs, list(k), list(s), padding, float("-inf"))
        real = windows(tf.ones_like(inputs[..., :1]), list(k), list(s), padding, 0.0) > 0  # an all -inf window's
        hits = tf.cast(tf.equal(values, top_of(values)[:, :, :, None]) & real, tf.int32)  # first real element
        first = (hits > 0) & ~(tf.cumsum(hits, axis=3, exclusive=True) > 0)
        return _placed(tf.where(first, dy[:, :, :, None], tf.zeros_like(values)), inputs, list(k), list(s), padding)

    return compiled(forward), compiled(backward)


def max_pool(input, ksize, strides, padding, data_format=None, name=None):
    """``tf.nn.max_pool`` (1-D and 2-D) with a deterministic gradient that XLA compiles: the first
    maximum of each window gets the window's gradient (module doc)."""
    if tf.convert_to_tensor(input).dtype not in EXACT_DTYPES + (tf.float64,):
        with _fixed.unmarked():
            return _stock.max_pool(input, ksize, strides, padding, data_format=data_format, name=name)
    x, k, s, padding, rank, channels_first = _checked(input, ksize, strides, padding, data_format, "max pooling")
    with tf.name_scope(name or "ExactMaxPool"):
        forward, backward = (_max_pool_kernels(tuple(k), padding) if k == s
                             else _overlapping_max_pool_kernels(tuple(k), tuple(s), padding))

        @custom_gradient
        def pool(inputs):
            return forward(inputs), lambda dy: backward(inputs, dy)

        return _restored(pool(x), rank, channels_first)


def max_pool2d(input, ksize, strides, padding, data_format="NHWC", name=None):
    return max_pool(input, ksize, strides, padding, data_format=data_format, name=name)


def avg_pool(input, ksize, strides, padding, data_format=None, name=None):
    """``tf.nn.avg_pool`` (1-D and 2-D): an order-invariant window sum over the count of real
    elements (module doc)."""
    if tf.convert_to_tensor(input).dtype not in EXACT_DTYPES + (tf.float64,):
        with _fixed.unmarked():
            return _stock.avg_pool(input, ksize, strides, padding, data_format=data_format, name=name)
    x, k, s, padding, rank, channels_first = _checked(input, ksize, strides, padding, data_format, "average pooling")
    with tf.name_scope(name or "ExactAvgPool"):
        if k != s:
            return _restored(_overlapping_avg_pool(x, k, s, padding), rank, channels_first)
        blocks, _ = _blocks(x, k, padding, 0.0)
        counts, _ = _blocks(tf.ones_like(x[..., :1]), k, padding, 0.0)
        # in float64, rounded once: XLA divides by a constant count as a multiply by its reciprocal
        y = _fixed.narrow(tf.cast(reduce_sum(blocks, axis=[2, 4]), tf.float64)
                          / tf.cast(_stock.reduce_sum(counts, axis=[2, 4]), tf.float64), x.dtype)
        return _restored(y, rank, channels_first)


def _overlapping_avg_pool(x: tf.Tensor, k: list[int], s: list[int], padding: str) -> tf.Tensor:
    """``avg_pool``'s overlapping or gapped windows: each window's exact sum over its count of real
    elements in float64, rounded once; its gradient ``dy / count``, correctly rounded to ``dy``'s
    type (a quotient of two float32s rounds the same from float64 whether XLA divides or multiplies
    by the reciprocal of a count it knows), added into place."""
    counts = tf.cast(_stock.reduce_sum(windows(tf.ones_like(x[..., :1]), k, s, padding, 0.0), axis=3), tf.float64)

    @custom_gradient
    def pool(inputs):
        total = tf.cast(reduce_sum(windows(inputs, k, s, padding, 0.0), axis=3), tf.float64)

        def grad(dy):
            share = _fixed.narrow(tf.cast(dy, tf.float64) / counts, dy.dtype)
            return _placed(tf.repeat(share[:, :, :, None], k[0] * k[1], axis=3), inputs, k, s, padding)

        return _fixed.narrow(total / counts, inputs.dtype), grad

    return pool(x)


def max_pool_v1(value, ksize, strides, padding, data_format="NHWC", name=None, input=None):
    """``tf.compat.v1.nn.max_pool`` (tf-keras's pooling layers)."""
    return max_pool(value if input is None else input, ksize, strides, padding, data_format=data_format, name=name)


def avg_pool_v1(value, ksize, strides, padding, data_format="NHWC", name=None, input=None):
    """``tf.compat.v1.nn.avg_pool``."""
    return avg_pool(value if input is None else input, ksize, strides, padding, data_format=data_format, name=name)


def avg_pool2d(input, ksize, strides, padding, data_format="NHWC", name=None):
    return avg_pool(input, ksize, strides, padding, data_format=data_format, name=name)
