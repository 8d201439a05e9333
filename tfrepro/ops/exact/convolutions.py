"""The exact tier's convolutions: ``tf.nn.convolution``, ``conv2d`` and ``conv1d`` as exact matrix
products of image patches (im2col), with exact gradients.

The forward product is ``patches @ kernel`` (the patches, strided slices of the image in an XLA
kernel of their own, only move data). The kernel's gradient is ``patches^T @ dy`` (the forward's
patches, kept; formed as ``(dy^T @ patches)^T``, ``_fixed.exact_matmul_transposed_a``),
replica-global (``_fixed.Replicas``). Both are one exact sum rounded once. The input's gradient is
each patch's gradient ``dy @ kernel^T``, exact and rounded once to float64, added into place
(col2im, one XLA kernel) in an order the code fixes, in float64, and rounded once to float32: at
most ``kh * kw`` float64 roundings, far below float32's, and the same under any thread count,
oneDNN setting, XLA or device.

The transposed convolutions (``tf.nn.conv_transpose``, ``conv2d_transpose``, ``conv1d_transpose``)
are that input gradient, and their gradients the forward product and the kernel's gradient.

Covered: 1-D and 2-D convolutions and transposed convolutions, NHWC/NWC and NCHW/NCW, extra batch dimensions, "SAME" and
"VALID" padding, spatial strides and dilations, float32/float16/bfloat16, under their v2 and
``tf.compat.v1`` names. Grouped convolutions, explicit padding lists, batch or channel strides,
inputs of unknown rank and 3-D convolutions raise ``NotImplementedError`` by name (``refusals``).
"""

from __future__ import annotations

import functools

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops.exact import _fixed
from tfrepro.ops.exact._fixed import compiled
from tfrepro.ops.exact.linalg import EXACT_DTYPES, is_weight, weight_gradient_replicas


def _pair(value, rank: int, name: str, channels_first: bool = False, what: str = "convolution") -> list[int]:
    """A spatial parameter (strides, dilations, ksize) as ``rank`` ints: one for all dimensions, one
    per spatial dimension, or one per dimension of the data format, whose batch and channel entries
    must be 1 (TF raises for a batch or channel stride of a convolution; pooling over the channels
    is not covered)."""
    if value is None:
        return [1] * rank
    values = [int(v) for v in ([value] if isinstance(value, int) else list(value))]
    if len(values) == 1:
        return values * rank
    if len(values) == rank + 2:
        outer = [values[0], values[1] if channels_first else values[-1]]
        if outer != [1, 1]:
            raise NotImplementedError(f"tfrepro exact tier: {what} with {name} {value!r} over the batch or channel "
                                      f"dimension is not covered (only spatial {name} are)")
        return values[2:] if channels_first else values[1:-1]
    if len(values) == rank:
        return values
    raise ValueError(f"{name} must have 1, {rank} or {rank + 2} entries; got {value!r}")


def _same_padding(size: int | tf.Tensor, kernel: int, stride: int, dilation: int):
    """TF's "SAME" padding of one spatial dimension: (before, after)."""
    extent = (kernel - 1) * dilation + 1
    out = (size + stride - 1) // stride
    total = tf.maximum((out - 1) * stride + extent - size, 0)
    return total // 2, total - total // 2


def windows(x: tf.Tensor, k: list[int], s: list[int], padding: str, fill: float = 0.0,
            d: tuple[int, ...] | list[int] = (1, 1)) -> tf.Tensor:
    """NHWC ``x``'s windows of ``k`` (strides ``s``, dilations ``d``) as [B, Ho, Wo, kh * kw, C], row-major
    in each window (``tf.image.extract_patches``'s order), padded with ``fill`` as TF pads for
    "SAME": strided slices, which only move data (XLA computes ``extract_patches`` as a
    convolution, in which ``inf * 0`` is NaN)."""
    if padding == "SAME":
        pads = [_same_padding(tf.shape(x)[i + 1], k[i], s[i], d[i]) for i in range(2)]
        x = tf.pad(x, [[0, 0], list(pads[0]), list(pads[1]), [0, 0]], constant_values=fill)
    extent = [((tf.shape(x)[i + 1] - (k[i] - 1) * d[i] - 1) // s[i]) * s[i] + 1 for i in range(2)]
    return tf.stack([x[:, a * d[0]:a * d[0] + extent[0]:s[0], e * d[1]:e * d[1] + extent[1]:s[1]]
                     for a in range(k[0]) for e in range(k[1])], axis=3)


@functools.lru_cache(maxsize=None)
def _patch_kernel(k: tuple[int, int], dilations: tuple[int, int], strides: tuple[int, int], padding: str):
    """``windows`` as image patches [B, Ho, Wo, kh * kw * C], an XLA kernel of its own (a copy in one
    pass: 5.2 ms against ``tf.image.extract_patches``'s 7.5 in ``bench/exact_cost.py``; fused into the
    product's passes, it slowed the product)."""
    def patches(x):
        found = windows(x, list(k), list(strides), padding, d=list(dilations))
        shape = tf.shape(found)
        return tf.reshape(found, tf.stack([shape[0], shape[1], shape[2], -1]))

    return compiled(patches)


def _patches(x: tf.Tensor, kernel_shape: list[int], dilations: list[int], strides: list[int],
             padding: str) -> tuple[tf.Tensor, tf.Tensor]:
    """The NHWC image patches of ``x`` as rows [B * Ho * Wo, kh * kw * C], and their [B, Ho, Wo] shape."""
    kh, kw, c, _ = kernel_shape
    if _fixed.worth_compiling(x):
        patches = _patch_kernel((kh, kw), tuple(dilations), tuple(strides), padding)(x)
    else:
        patches = _stock.extract_patches(x, sizes=[1, kh, kw, 1], strides=[1, *strides, 1], rates=[1, *dilations, 1],
                                         padding=padding)
    return tf.reshape(patches, tf.stack([-1, kh * kw * c])), tf.shape(patches)[:3]


def _dilate(x: tf.Tensor, axis: int, stride: int) -> tf.Tensor:
    """``stride - 1`` zeros between the entries of NHWC ``x`` along ``axis`` (1 or 2)."""
    if stride == 1:
        return x
    shape = tf.shape(x)
    paddings = [[0, 0]] * 5
    paddings[axis + 1] = [0, stride - 1]
    spread = tf.pad(tf.expand_dims(x, axis + 1), paddings)
    spread = tf.reshape(spread, tf.concat([shape[:axis], [shape[axis] * stride], shape[axis + 1:]], 0))
    end = shape[axis] * stride - stride + 1
    return spread[:, :end] if axis == 1 else spread[:, :, :end]


def _input_gradient(dy, kernel, input_shape, dilations, strides, padding) -> tf.Tensor:
    """The gradient of the input: each patch's gradient ``dy @ kernel^T`` exactly (float64, one
    rounding), then added into place (col2im) in a fixed order in float64, rounded once to
    float32. Each float64 addition is IEEE-rounded in an order the code fixes, so no thread
    count, compiler or device can change it."""
    kh, kw, c, f = kernel.shape.as_list()
    rows = tf.reshape(dy, tf.stack([-1, f]))
    weights = tf.transpose(tf.reshape(kernel, [kh * kw * c, f]))
    columns = _fixed.exact_matmul(rows, weights, out_dtype=tf.float64)
    shape = tf.shape(dy)
    columns = tf.reshape(columns, tf.concat([shape[:3], [kh, kw, c]], 0))
    columns.set_shape(dy.shape[:3].concatenate([kh, kw, c]))
    if not _fixed.worth_compiling(columns):
        return col2im(columns, input_shape, dilations, strides, padding, dy.dtype)
    placing = _compiled_col2im((kh, kw), tuple(dilations), tuple(strides), padding, dy.dtype)
    return placing(columns, tf.cast(input_shape, tf.int32))


@functools.lru_cache(maxsize=None)
def _compiled_col2im(window: tuple[int, int], dilations: tuple[int, ...], strides: tuple[int, ...], padding: str,
                     dtype: tf.DType):
    """``col2im`` as an XLA kernel: its additions fuse into one pass, each an IEEE float64 addition in
    the traced order, so compiling changes no bit (a separate kernel: fused with the product, XLA
    gave up its fast matrix product)."""
    def placed(columns, input_shape):
        columns.set_shape([None, None, None, *window, None])  # the window, as static as the code needs it
        return col2im(columns, input_shape, list(dilations), list(strides), padding, dtype)

    return compiled(placed)


def col2im(columns: tf.Tensor, input_shape, dilations, strides, padding: str, dtype: tf.DType) -> tf.Tensor:
    """Float64 ``columns`` [B, Ho, Wo, kh, kw, C] (each window's values) added into place in an NHWC
    input of ``input_shape``, in a fixed order (row by row of the window) in float64, rounded once
    to ``dtype``; what falls in the padding is dropped."""
    kh, kw = columns.shape[3], columns.shape[4]
    spans = []
    for i, k in enumerate((kh, kw)):
        before, after = _same_padding(input_shape[i + 1], k, strides[i], dilations[i]) if padding == "SAME" else (0, 0)
        spans.append((before, input_shape[i + 1] + before + after))
    total = None
    for a in range(kh):
        for e in range(kw):
            piece = _dilate(_dilate(columns[:, :, :, a, e], 1, strides[0]), 2, strides[1])
            top, left = a * dilations[0], e * dilations[1]
            placed = tf.pad(piece, [[0, 0], [top, spans[0][1] - top - tf.shape(piece)[1]],
                                    [left, spans[1][1] - left - tf.shape(piece)[2]], [0, 0]])
            total = placed if total is None else total + placed
    (top, _), (left, _) = spans
    return _fixed.narrow(total[:, top:top + input_shape[1], left:left + input_shape[2]], dtype)


def _spatial_rank(x: tf.Tensor, kernel: tf.Tensor, what: str) -> int:
    """The number of spatial dimensions of a convolution (1 or 2), or ``NotImplementedError`` by name."""
    if kernel.shape.rank is None or x.shape.rank is None:
        raise NotImplementedError(f"tfrepro exact tier: a {what} of an input or kernel of unknown rank is not covered "
                                  "(give them static ranks); use patch(ops='auto') for this model")
    rank = kernel.shape.rank - 2
    if rank not in (1, 2):
        raise NotImplementedError(f"tfrepro exact tier: a {rank}-D {what} is not covered (1-D and 2-D are); "
                                  "use patch(ops='auto') for this model")
    return rank


def _product(image: tf.Tensor, weights: tf.Tensor, dilations, strides, padding: str) -> tuple[tf.Tensor, tf.Tensor]:
    """The convolution's forward product: ``image``'s patches as rows, and ``rows @ kernel`` exactly,
    in the output grid's shape."""
    shape = weights.shape.as_list()
    rows, grid = _patches(image, shape, dilations, strides, padding)
    out = tf.reshape(_fixed.exact_matmul(rows, tf.reshape(weights, [-1, shape[-1]])), tf.concat([grid, [shape[-1]]], 0))
    return rows, out


def _gradients(dx: tf.Tensor, rows: tf.Tensor, dout: tf.Tensor, weights: tf.Tensor, kernel_is_weight: bool,
               what: str) -> tuple[tf.Tensor, tf.Tensor]:
    """``dx`` and the kernel's gradient ``rows^T @ dout`` (exact, replica-global for a weight), both
    first-order only."""
    shape = weights.shape.as_list()
    dw = _fixed.exact_matmul_transposed_a(rows, tf.reshape(dout, tf.stack([-1, shape[-1]])),
                                          weight_gradient_replicas(kernel_is_weight))
    return (_fixed.first_order_only(dx, what, dout, weights),
            _fixed.first_order_only(tf.reshape(dw, shape), what, rows, dout))


def _conv2d_nhwc(x: tf.Tensor, kernel: tf.Tensor, strides: list[int], dilations: list[int], padding: str,
                 kernel_is_weight: bool) -> tf.Tensor:
    @_fixed.custom_gradient
    def conv(inputs, weights):
        rows, out = _product(inputs, weights, dilations, strides, padding)

        def grad(dy):
            dx = _input_gradient(dy, weights, tf.shape(inputs), dilations, strides, padding)
            return _gradients(dx, rows, dy, weights, kernel_is_weight, "a convolution")

        return out, grad

    return conv(x, kernel)


def _conv2d_transpose_nhwc(x: tf.Tensor, kernel: tf.Tensor, output_shape: tf.Tensor, strides: list[int],
                           dilations: list[int], padding: str, kernel_is_weight: bool) -> tf.Tensor:
    """The transpose of ``_conv2d_nhwc``: its input's gradient, whose own gradients are the forward
    product (for ``x``) and the kernel's gradient with the roles of input and output exchanged."""
    @_fixed.custom_gradient
    def transpose(inputs, weights):
        def grad(dy):
            rows, dx = _product(dy, weights, dilations, strides, padding)
            return _gradients(dx, rows, inputs, weights, kernel_is_weight, "a transposed convolution")

        return _input_gradient(inputs, weights, output_shape, dilations, strides, padding), grad

    return transpose(x, kernel)


def _static_dims(output_shape, rank: int) -> list[int | None]:
    """The entries of ``output_shape`` (a list of ints and scalar tensors, or a tensor) known now."""
    if isinstance(output_shape, (list, tuple)):
        return [tf.get_static_value(v) if tf.is_tensor(v) else int(v) for v in output_shape]
    known = tf.get_static_value(output_shape, partial=True)
    return [None if v is None else int(v) for v in known] if known is not None else [None] * (rank + 2)


def _check_transpose_shapes(x: tf.Tensor, static: list, strides: list[int], dilations: list[int], kernel: list[int],
                            padding: str, channels_first: bool) -> None:
    """TF's ``ValueError`` where the input is not what a convolution of ``output_shape`` gives (known
    entries only)."""
    spatial = static[2:] if channels_first else static[1:-1]
    given = x.shape[2:] if channels_first else x.shape[1:-1]
    for size, got, stride, dilation, k in zip(spatial, given, strides, dilations, kernel):
        extent = (k - 1) * dilation + 1
        if size is not None and got is not None and got != (-(-size // stride) if padding == "SAME"
                                                            else (size - extent) // stride + 1):
            raise ValueError(f"a transposed convolution's input of spatial shape {list(given)} is not what a "
                             f"{padding} convolution of output_shape {static} gives")
    if static[0] is not None and x.shape[0] is not None and static[0] != x.shape[0]:
        raise ValueError(f"output_shape's batch {static[0]} differs from the input's {x.shape[0]}")


def conv_transpose(input, filters, output_shape, strides, padding="SAME", data_format=None, dilations=None,
                   name=None):
    """``tf.nn.conv_transpose`` (1-D and 2-D), the transpose of the exact convolution: each output
    is an exact product rounded once to float64, added into place in an order the code fixes and
    rounded once to the input's type (the convolution's input gradient, module doc); its gradients
    are the convolution's exact forward product and its exact, replica-global kernel gradient."""
    kernel_is_weight = is_weight(filters)
    x, kernel = tf.convert_to_tensor(input), tf.convert_to_tensor(filters)
    if x.dtype not in EXACT_DTYPES:
        with _fixed.unmarked():
            return _stock.conv_transpose(x, kernel, output_shape, strides, padding=padding, data_format=data_format,
                                         dilations=dilations, name=name)
    rank = _spatial_rank(x, kernel, "transposed convolution")
    if x.shape.rank != rank + 2:
        raise ValueError(f"a {rank}-D transposed convolution needs an input of rank {rank + 2}; got rank {x.shape.rank}")
    if not isinstance(padding, str) or padding.upper() not in ("SAME", "VALID"):
        raise NotImplementedError(f"tfrepro exact tier: transposed convolution padding {padding!r} is not covered "
                                  "('SAME' and 'VALID' are)")
    padding = padding.upper()
    channels_first = data_format is not None and data_format.startswith("NC")
    channel = 1 if channels_first else -1
    if None in kernel.shape.as_list() or x.shape[channel] is None:
        raise NotImplementedError("tfrepro exact tier: a transposed convolution needs static kernel and channel shapes")
    if x.shape[channel] != kernel.shape[-1]:
        raise ValueError(f"a transposed convolution's input has {x.shape[channel]} channels where its filters' last "
                         f"dimension has {kernel.shape[-1]}")
    static = _static_dims(output_shape, rank)
    if len(static) != rank + 2:
        raise ValueError(f"output_shape must have {rank + 2} entries; got {output_shape!r}")
    if static[channel] is not None and static[channel] != kernel.shape[-2]:
        raise ValueError(f"output_shape has {static[channel]} channels where the filters' third dimension has "
                         f"{kernel.shape[-2]}")
    strides = _pair(strides, rank, "strides", channels_first, "transposed convolution")
    dilations = _pair(dilations, rank, "dilations", channels_first, "transposed convolution")
    _check_transpose_shapes(x, static, strides, dilations, kernel.shape.as_list()[:rank], padding, channels_first)
    out = tf.cast(tf.convert_to_tensor(output_shape), tf.int32)
    with tf.name_scope(name or "ExactConvTranspose"):
        if channels_first:
            x = tf.transpose(x, [0, *range(2, rank + 2), 1])
            out = tf.concat([out[:1], out[2:], out[1:2]], 0)
        if rank == 1:
            x, kernel = tf.expand_dims(x, 1), tf.expand_dims(kernel, 0)
            out = tf.concat([out[:1], [1], out[1:]], 0)
            strides, dilations = [1, *strides], [1, *dilations]
        y = _conv2d_transpose_nhwc(x, kernel, out, strides, dilations, padding, kernel_is_weight)
        if rank == 1:
            y = tf.squeeze(y, 1)
        if channels_first:
            y = tf.transpose(y, [0, rank + 1, *range(1, rank + 1)])
        y.set_shape(static)
        return y


def conv2d_transpose(input, filters, output_shape, strides, padding="SAME", data_format="NHWC", dilations=None,
                     name=None):
    """``tf.nn.conv2d_transpose`` as the exact transposed convolution (``conv_transpose``)."""
    return conv_transpose(input, filters, output_shape, strides, padding=padding, data_format=data_format,
                          dilations=dilations, name=name)


def conv1d_transpose(input, filters, output_shape, strides, padding="SAME", data_format="NWC", dilations=None,
                     name=None):
    """``tf.nn.conv1d_transpose`` as the exact transposed convolution (``conv_transpose``)."""
    return conv_transpose(input, filters, output_shape, strides, padding=padding, data_format=data_format,
                          dilations=dilations, name=name)


def conv2d_transpose_v1(value=None, filter=None, output_shape=None, strides=None, padding="SAME", data_format="NHWC",
                        name=None, input=None, filters=None, dilations=None):
    """``tf.compat.v1.nn.conv2d_transpose`` (tf-keras's ``backend.conv2d_transpose``) as the exact
    transposed convolution (``conv_transpose``)."""
    return conv_transpose(value if input is None else input, filter if filters is None else filters, output_shape,
                          strides, padding=padding, data_format=data_format, dilations=dilations, name=name)


def convolution(input, filters, strides=None, padding="VALID", data_format=None, dilations=None, name=None):
    """``tf.nn.convolution`` as an exact product of patches (module doc)."""
    kernel_is_weight = is_weight(filters)
    x, kernel = tf.convert_to_tensor(input), tf.convert_to_tensor(filters)
    if x.dtype not in EXACT_DTYPES:
        with _fixed.unmarked():
            return _stock.convolution(x, kernel, strides=strides, padding=padding, data_format=data_format,
                                      dilations=dilations, name=name)
    rank = _spatial_rank(x, kernel, "convolution")
    if x.shape.rank < rank + 2:
        raise ValueError(f"a {rank}-D convolution needs an input of rank {rank + 2} or more; got rank {x.shape.rank}")
    if x.shape.rank > rank + 2:  # batch dimensions [B1, B2, ...] as one: a product does not depend on the batch
        batch = tf.shape(x)[:x.shape.rank - rank - 1]
        flat = tf.reshape(x, tf.concat([[-1], tf.shape(x)[x.shape.rank - rank - 1:]], 0))
        y = convolution(flat, filters, strides=strides, padding=padding, data_format=data_format,
                        dilations=dilations, name=name)  # `filters` as given: still known as a weight
        return tf.reshape(y, tf.concat([batch, tf.shape(y)[1:]], 0))
    if not isinstance(padding, str) or padding.upper() not in ("SAME", "VALID"):
        raise NotImplementedError(f"tfrepro exact tier: convolution padding {padding!r} is not covered "
                                  "('SAME' and 'VALID' are)")
    padding = padding.upper()
    channels_first = data_format is not None and data_format.startswith("NC")
    if None in kernel.shape.as_list() or x.shape[1 if channels_first else -1] is None:
        raise NotImplementedError("tfrepro exact tier: a convolution needs static kernel and channel shapes")
    if x.shape[1 if channels_first else -1] != kernel.shape[-2]:
        raise NotImplementedError("tfrepro exact tier: grouped convolution is not covered (groups=1 is)")
    strides = _pair(strides, rank, "strides", channels_first)
    dilations = _pair(dilations, rank, "dilations", channels_first)
    with tf.name_scope(name or "ExactConvolution"):
        if channels_first:
            x = tf.transpose(x, [0, *range(2, rank + 2), 1])
        if rank == 1:
            x, kernel = tf.expand_dims(x, 1), tf.expand_dims(kernel, 0)
            strides, dilations = [1, *strides], [1, *dilations]
        y = _conv2d_nhwc(x, kernel, strides, dilations, padding, kernel_is_weight)
        if rank == 1:
            y = tf.squeeze(y, 1)
        if channels_first:
            y = tf.transpose(y, [0, rank + 1, *range(1, rank + 1)])
        return y


def conv2d(input, filters, strides, padding, data_format="NHWC", dilations=None, name=None):
    """``tf.nn.conv2d`` as an exact product of patches."""
    return convolution(input, filters, strides=strides, padding=padding, data_format=data_format,
                       dilations=dilations, name=name)


def convolution_v1(input, filter=None, padding=None, strides=None, dilation_rate=None, name=None, data_format=None,
                   filters=None, dilations=None):
    """``tf.compat.v1.nn.convolution`` (tf-keras's ``backend.conv2d``) as an exact product of patches."""
    return convolution(input, filter if filters is None else filters, strides=strides, padding=padding,
                       data_format=data_format, dilations=dilation_rate if dilations is None else dilations, name=name)


def conv1d(input, filters, stride, padding, data_format="NWC", dilations=None, name=None):
    """``tf.nn.conv1d`` as an exact product of patches."""
    return convolution(input, filters, strides=stride, padding=padding, data_format=data_format,
                       dilations=dilations, name=name)


def conv2d_v1(input, filter=None, strides=None, padding=None, use_cudnn_on_gpu=True, data_format="NHWC",
              dilations=None, name=None, filters=None):
    """``tf.compat.v1.nn.conv2d`` as an exact product of patches."""
    return convolution(input, filter if filters is None else filters, strides=strides, padding=padding,
                       data_format=data_format, dilations=dilations, name=name)


def conv1d_v1(value=None, filters=None, stride=None, padding=None, use_cudnn_on_gpu=None, data_format=None,
              name=None, input=None, dilations=None):
    """``tf.compat.v1.nn.conv1d`` as an exact product of patches."""
    return convolution(value if input is None else input, filters, strides=stride, padding=padding,
                       data_format=data_format or "NWC", dilations=dilations, name=name)
