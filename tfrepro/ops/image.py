"""Image ops whose TF backprop has no deterministic GPU kernel (it raises under op determinism)."""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops._checks import after, check, shape_text
from tfrepro.ops._exact_sum import same_summation, traced
from tfrepro.ops.segment import reduce_sum, unsorted_segment_sum


@traced
def _resize_nearest_grad(dy: tf.Tensor, out: tf.Tensor, x: tf.Tensor, size: tf.Tensor, align_corners: bool,
                         half_pixel_centers: bool) -> tf.Tensor:
    """The backprop of ``resize_nearest_neighbor`` (traced once, called per op instance)."""
    with tf.control_dependencies([out]):  # TF's forward checked the arguments the slicing relies on
        shape = tf.shape(x)
    batch, height, width, channels = shape[0], shape[1], shape[2], shape[3]
    index = tf.reshape(tf.range(height * width, dtype=tf.float64), tf.stack([1, height, width, 1]))
    source = _stock.resize_nearest_neighbor(images=index, size=size, align_corners=align_corners,
                                            half_pixel_centers=half_pixel_centers)
    source = tf.cast(tf.reshape(source, [-1]), tf.int32)  # the input pixel of each output pixel
    rows = tf.reshape(tf.transpose(dy, [1, 2, 0, 3]), tf.stack([-1, batch * channels]))
    summed = unsorted_segment_sum(rows, source, height * width)
    return tf.transpose(tf.reshape(summed, tf.stack([height, width, batch, channels])), [2, 0, 1, 3])


def resize_nearest_neighbor(images: tf.Tensor, size: tf.Tensor | list[int], align_corners: bool = False,
                            half_pixel_centers: bool = False, name: str | None = None) -> tf.Tensor:
    """Resizes images by nearest-neighbour interpolation, with an order-invariant backprop.

    A drop-in for TF's `ResizeNearestNeighbor` op (`tf.compat.v1.image.resize_nearest_neighbor`),
    the op behind `tf.image.resize(method="nearest")` and Keras 2's `UpSampling2D`, whose GPU
    backprop has no deterministic kernel (it raises under op determinism from TF 2.7). The forward
    pass is TF's kernel. In the backprop, every input pixel receives the exact, order-invariant sum
    (`unsorted_segment_sum`) of the gradients of the output pixels that copied it; the copy map is
    TF's own, read by resizing an image of pixel indices with the same options.

    Args:
        images: A 4-D `Tensor` of shape `[batch, height, width, channels]`, as in TF's op.
        size: A 1-D int32 `Tensor` of 2 elements, `[new_height, new_width]`.
        align_corners: If true, the centers of the 4 corner pixels of the input and output are
            aligned, as in TF's op.
        half_pixel_centers: If true, pixel centers are at half-integer coordinates, as
            `tf.image.resize` uses it.
        name: A name for the operation (optional).

    Returns:
        A 4-D `Tensor` of `images`' dtype and shape `[batch, new_height, new_width, channels]`.
    """
    with tf.name_scope(name or "DeterministicResizeNearestNeighbor"):
        images = tf.convert_to_tensor(images)
        size = tf.convert_to_tensor(size, tf.int32)

        @tf.custom_gradient
        def forward(x):
            out = _stock.resize_nearest_neighbor(images=x, size=size, align_corners=align_corners,
                                                 half_pixel_centers=half_pixel_centers)  # TF's checks

            @same_summation
            def grad(dy):
                return _resize_nearest_grad(dy, out, x, size, align_corners, half_pixel_centers)

            return out, grad

        return forward(images)


def _crop_coordinates(boxes: tf.Tensor, crop: tf.Tensor, size: tf.Tensor, first: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Sample positions along one axis, as TF's CropAndResize kernel computes them (float32, with its
    double-precision centre for a crop of size 1): ``(positions [boxes, crop], ratio, crop > 1)``."""
    start, end = boxes[:, first], boxes[:, first + 2]
    extent = tf.cast(size - 1, tf.float32)
    many = crop > 1
    denominator = tf.cast(tf.maximum(crop - 1, 1), tf.float32)
    scale = (end - start) * extent / denominator
    steps = tf.cast(tf.range(crop), tf.float32)
    spread = start[:, None] * extent + steps[None, :] * scale[:, None]
    centre = tf.cast(0.5 * tf.cast(start + end, tf.float64) * tf.cast(size - 1, tf.float64), tf.float32)
    positions = tf.where(many, spread, tf.broadcast_to(centre[:, None], tf.shape(spread)))
    return positions, extent / denominator, many


@traced
def _crop_and_resize_grad(dy: tf.Tensor, out: tf.Tensor, image_in: tf.Tensor, boxes_in: tf.Tensor,
                          box_indices: tf.Tensor, crop_size: tf.Tensor, method: str) -> tuple[tf.Tensor, tf.Tensor]:
    """The backprop of ``crop_and_resize`` to the image and the boxes (traced once, called per op)."""
    with tf.control_dependencies([out]):  # TF's forward checked the arguments the slicing relies on
        shape = tf.shape(image_in)
    batch, height, width, channels = shape[0], shape[1], shape[2], shape[3]
    in_y, height_ratio, many_y = _crop_coordinates(boxes_in, crop_size[0], height, 0)
    in_x, width_ratio, many_x = _crop_coordinates(boxes_in, crop_size[1], width, 1)
    valid = ((in_y >= 0) & (in_y <= tf.cast(height - 1, tf.float32)))[:, :, None] & \
            ((in_x >= 0) & (in_x <= tf.cast(width - 1, tf.float32)))[:, None, :]  # [boxes, ch, cw]
    rows_y = [tf.cast(tf.floor(in_y), tf.int32), tf.cast(tf.math.ceil(in_y), tf.int32)]
    cols_x = [tf.cast(tf.floor(in_x), tf.int32), tf.cast(tf.math.ceil(in_x), tf.int32)]
    y_lerp = (in_y - tf.floor(in_y))[:, :, None, None]
    x_lerp = (in_x - tf.floor(in_x))[:, None, :, None]

    def flat_index(y: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
        y = tf.clip_by_value(y, 0, height - 1)[:, :, None]
        x = tf.clip_by_value(x, 0, width - 1)[:, None, :]
        return (box_indices[:, None, None] * height + y) * width + x  # [boxes, ch, cw]

    corners = [flat_index(y, x) for y in rows_y for x in cols_x]  # top-left, top-right, bottom-left, bottom-right
    # C++ round() (half away from zero; in_y, in_x >= 0 where valid) picks the nearest pixel.
    nearest = flat_index(tf.cast(tf.floor(in_y + 0.5), tf.int32), tf.cast(tf.floor(in_x + 0.5), tf.int32))
    sources = [nearest] if method == "nearest" else corners  # the pixels each output read
    flat = tf.reshape(tf.cast(image_in, tf.float32), tf.stack([-1, channels]))
    top_left, top_right, bottom_left, bottom_right = [_stock.gather(flat, index) for index in corners]

    dy = tf.cast(dy, tf.float32) * tf.cast(valid[..., None], tf.float32)
    if method == "nearest":
        weights = [tf.ones_like(y_lerp * x_lerp)]
    else:
        weights = [(1 - y_lerp) * (1 - x_lerp), (1 - y_lerp) * x_lerp, y_lerp * (1 - x_lerp), y_lerp * x_lerp]
    contributions = tf.concat([tf.reshape(w * dy, tf.stack([-1, channels])) for w in weights], 0)
    ids = tf.concat([tf.reshape(index, [-1]) for index in sources], 0)
    d_image = unsorted_segment_sum(contributions, ids, batch * height * width)
    d_image = tf.cast(tf.reshape(d_image, shape), image_in.dtype)
    # The boxes' gradient uses the bilinear corners for both methods, as TF's does.
    grad_y = (1 - x_lerp) * (bottom_left - top_left) + x_lerp * (bottom_right - top_right)
    grad_x = (1 - y_lerp) * (top_right - top_left) + y_lerp * (bottom_right - bottom_left)
    steps_y = tf.cast(tf.range(crop_size[0]), tf.float32)[None, :, None, None]
    steps_x = tf.cast(tf.range(crop_size[1]), tf.float32)[None, None, :, None]
    half_h, half_w = 0.5 * tf.cast(height - 1, tf.float32), 0.5 * tf.cast(width - 1, tf.float32)
    d_y1 = tf.where(many_y, tf.cast(height - 1, tf.float32) - steps_y * height_ratio, half_h)
    d_y2 = tf.where(many_y, steps_y * height_ratio, half_h)
    d_x1 = tf.where(many_x, tf.cast(width - 1, tf.float32) - steps_x * width_ratio, half_w)
    d_x2 = tf.where(many_x, steps_x * width_ratio, half_w)
    per_box = [reduce_sum(g * dy * factor, axis=[1, 2, 3])
               for g, factor in ((grad_y, d_y1), (grad_x, d_x1), (grad_y, d_y2), (grad_x, d_x2))]
    return d_image, tf.stack(per_box, axis=1)


def crop_and_resize(image: tf.Tensor, boxes: tf.Tensor, box_indices: tf.Tensor, crop_size: tf.Tensor | list[int],
                    method: str = "bilinear", extrapolation_value: float = 0.0, name: str | None = None) -> tf.Tensor:
    """Crops boxes out of images and resizes them, with an order-invariant backprop.

    A drop-in for `tf.image.crop_and_resize`, whose GPU backprops (to the image and to the boxes)
    have no deterministic kernel (they raise under op determinism from TF 2.6). The forward pass is
    TF's kernel, deterministic. The backprop to the image is an exact, order-invariant sum over the
    output pixels that read each input pixel, and the backprop to the boxes an order-invariant sum
    per box, computed as TF's kernels compute them.

    Args:
        image: A 4-D `Tensor` of shape `[batch, image_height, image_width, depth]`, as in
            `tf.image.crop_and_resize`.
        boxes: A 2-D float32 `Tensor` of shape `[num_boxes, 4]`: `[y1, x1, y2, x2]` per box, in
            coordinates normalized to `[0, 1]` (a value that is not a tensor becomes float32).
        box_indices: A 1-D int32 `Tensor` of shape `[num_boxes]`: the image of each box, in
            `[0, batch)`.
        crop_size: A 1-D int32 `Tensor` of 2 elements, `[crop_height, crop_width]`.
        method: `"bilinear"` (the default) or `"nearest"`.
        extrapolation_value: The value of the output pixels that fall outside the image.
        name: A name for the operation (optional).

    Returns:
        A float32 `Tensor` of shape `[num_boxes, crop_height, crop_width, depth]`.

    Raises:
        ValueError: `method` is neither `"bilinear"` nor `"nearest"`.
    """
    if method not in ("bilinear", "nearest"):
        raise ValueError(f"method must be 'bilinear' or 'nearest'; got {method!r}")
    with tf.name_scope(name or "DeterministicCropAndResize"):
        image = tf.convert_to_tensor(image)
        # As TF's op: boxes that are not tensors become float32 (1e40 becomes inf, which TF's kernel
        # refuses), box indices int32; tensors of other dtypes reach TF's kernel, which refuses them.
        boxes = boxes if tf.is_tensor(boxes) else tf.convert_to_tensor(boxes, tf.float32)
        box_indices = box_indices if tf.is_tensor(box_indices) else tf.convert_to_tensor(box_indices, tf.int32)
        crop_size = tf.convert_to_tensor(crop_size, tf.int32)

        @tf.custom_gradient
        def forward(image_in, boxes_in):
            out = _stock.crop_and_resize(image=image_in, boxes=boxes_in, box_ind=box_indices, crop_size=crop_size,
                                         method=method, extrapolation_value=extrapolation_value)  # TF's checks

            @same_summation
            def grad(dy):
                return _crop_and_resize_grad(dy, out, image_in, boxes_in, box_indices, crop_size, method)

            return out, grad

        return forward(image, boxes)


@check
def _contrast_arguments(shape: tf.Tensor, factor_shape: tf.Tensor):
    """AdjustContrastv2's checks, in its kernel's order: images at least 3-D, a scalar factor."""
    three_d, scalar = tf.size(shape) >= 3, tf.equal(tf.size(factor_shape), 0)
    return three_d & scalar, lambda: tf.cond(
        three_d, lambda: tf.strings.join(["contrast_factor must be scalar: ", shape_text(factor_shape)]),
        lambda: tf.strings.join(["input must be at least 3-D, got shape", shape_text(shape)]))


def adjust_contrastv2(images: tf.Tensor, contrast_factor: float | tf.Tensor, name: str | None = None) -> tf.Tensor:
    """Adjusts the contrast of float images: the kernel behind `tf.image.adjust_contrast`.

    A drop-in for TF's `AdjustContrastv2` op, whose GPU kernel has no deterministic version (it
    raises under op determinism): `(x - mean) * contrast_factor + mean`, with the mean over height
    and width per image and channel an order-invariant sum (`reduce_sum`). float16 and bfloat16
    images compute in float32.

    Args:
        images: A float `Tensor` of rank >= 3, `[..., height, width, channels]`.
        contrast_factor: A float scalar.
        name: A name for the operation (optional).

    Returns:
        The adjusted images, of `images`' dtype and shape.

    Raises:
        ValueError: Where a graph is built, for `images` of static rank below 3 or a
            `contrast_factor` that is not a scalar.
        tf.errors.InvalidArgumentError: When the op runs (eagerly: at the call), for the same
            (TF's messages).
    """
    with tf.name_scope(name or "DeterministicAdjustContrast"):
        images = tf.convert_to_tensor(images)
        factor = tf.cast(tf.convert_to_tensor(contrast_factor), images.dtype)
        if not tf.executing_eagerly():  # TF's shape function
            if images.shape.rank is not None and images.shape.rank < 3:
                raise ValueError(f"Shape must be at least rank 3 but is rank {images.shape.rank}")
            if factor.shape.rank not in (None, 0):
                raise ValueError(f"Shape must be rank 0 but is rank {factor.shape.rank} (contrast_factor)")
        images = after(_contrast_arguments(tf.shape(images), tf.shape(factor)), images)
        shape = tf.shape(images)
        wide = tf.cast(images, tf.float32) if images.dtype in (tf.float16, tf.bfloat16) else images
        mean = reduce_sum(wide, axis=[-3, -2], keepdims=True) / tf.cast(shape[-3] * shape[-2], wide.dtype)
        return tf.cast((wide - mean) * tf.cast(factor, wide.dtype) + mean, images.dtype)


def adjust_contrast(images: tf.Tensor, contrast_factor: float | tf.Tensor) -> tf.Tensor:
    """Adjusts the contrast of images, deterministically on every device.

    A drop-in for `tf.image.adjust_contrast`: each channel of each image becomes
    `(x - mean) * contrast_factor + mean`, its mean over height and width an order-invariant sum.
    TF's kernel for it has no deterministic GPU version (it raises under op determinism from
    TF 2.7), nor a gradient; this one runs on every device and has one. As in TF, images of an
    integer dtype are converted to float32 and back, saturating.

    Args:
        images: A `Tensor` of rank >= 3, `[..., height, width, channels]`, as in
            `tf.image.adjust_contrast`.
        contrast_factor: A float scalar: the factor to multiply the deviations from the mean by.

    Returns:
        The contrast-adjusted images, of `images`' dtype and shape.

    Raises:
        ValueError: Where a graph is built, for `images` of static rank below 3 or a
            `contrast_factor` that is not a scalar.
        tf.errors.InvalidArgumentError: When the op runs (eagerly: at the call), for the same
            (TF's messages).
    """
    with tf.name_scope("DeterministicAdjustContrast"):
        images = tf.convert_to_tensor(images)
        adjusted = adjust_contrastv2(tf.image.convert_image_dtype(images, tf.float32), contrast_factor)
        return tf.image.convert_image_dtype(adjusted, images.dtype, saturate=True)
