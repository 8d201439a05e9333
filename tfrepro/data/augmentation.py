"""Stateless random augmentations that draw per image in a batch (or for one image): flip,
translate (pad and crop back, the CIFAR recipe), brightness. Each takes a ``[2]`` int64 seed, as
``map_with_seed`` hands out; the same seed gives the same result on every run and device. Applied
to a whole batch in one call (vectorised), they cost a parallel map a fraction of what per-image
maps cost. ``tf.image.stateless_random_flip_left_right`` draws per image as well, but
``tf.image.stateless_random_brightness`` and ``stateless_random_crop`` draw once per call."""

from __future__ import annotations

from typing import Any

from tfrepro import _tf


def _batched(tf: Any, images: Any) -> tuple[Any, bool]:
    images = tf.convert_to_tensor(images)
    if images.shape.rank not in (3, 4):
        raise ValueError(f"images must be [height, width, channels] or [batch, height, width, channels]; "
                         f"got shape {images.shape}")
    return (images, False) if images.shape.rank == 4 else (images[None], True)


def random_flip_left_right(images: Any, seed: Any) -> Any:
    """Randomly flips each image left to right, with probability 1/2, as the seed says.

    The same seed gives the same flips on every run and device. Each image of a batch draws its
    own flip, as `tf.image.stateless_random_flip_left_right` does; a whole batch in one call costs
    a parallel map a fraction of what per-image calls cost.

    Args:
        images: One image, `[height, width, channels]`, or a batch, `[batch, height, width,
            channels]`.
        seed: A `[2]` int64 seed, as `map_with_seed` hands out (or any stateless seed).

    Returns:
        The images, of `images`' shape and dtype, each mirrored or not.

    Raises:
        ValueError: `images` is of rank other than 3 or 4.
    """
    tf = _tf.import_tf()
    batch, single = _batched(tf, images)
    flip = tf.random.stateless_uniform(tf.shape(batch)[:1], seed) < 0.5
    result = tf.where(flip[:, None, None, None], tf.reverse(batch, [2]), batch)
    return result[0] if single else result


def random_translate(images: Any, pad: int, seed: Any) -> Any:
    """Randomly shifts each image by up to `pad` pixels in each direction, as the seed says.

    Each image is zero-padded by `pad` pixels on every side and cropped back to its size at a
    random offset (the CIFAR recipe), each image of a batch at its own offset, where
    `tf.image.stateless_random_crop` draws once per call. The same seed gives the same shifts on
    every run and device.

    Args:
        images: One image, `[height, width, channels]`, or a batch, `[batch, height, width,
            channels]`.
        pad: The largest shift, in pixels, a non-negative int.
        seed: A `[2]` int64 seed, as `map_with_seed` hands out (or any stateless seed).

    Returns:
        The shifted images, of `images`' shape and dtype; the pixels shifted in are zeros.

    Raises:
        ValueError: `pad` is not a non-negative int, or `images` is of rank other than 3 or 4.
    """
    tf = _tf.import_tf()
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        raise ValueError(f"pad must be a non-negative int; got {pad!r}")
    batch, single = _batched(tf, images)
    shape = tf.shape(batch)
    padded = tf.pad(batch, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    offsets = tf.random.stateless_uniform(tf.stack([shape[0], 2]), seed, 0, 2 * pad + 1, dtype=tf.int32)
    rows = offsets[:, :1] + tf.range(shape[1])[None, :]
    columns = offsets[:, 1:] + tf.range(shape[2])[None, :]
    result = tf.gather(tf.gather(padded, rows, axis=1, batch_dims=1), columns, axis=2, batch_dims=1)
    return result[0] if single else result


def random_brightness(images: Any, max_delta: float, seed: Any) -> Any:
    """Randomly changes the brightness of each image, as the seed says.

    Adds to each image one draw from the uniform distribution on `[-max_delta, max_delta)`, each
    image of a batch its own draw, where `tf.image.stateless_random_brightness` draws once per
    call. The same seed gives the same draws on every run and device. The result is not clipped.

    Args:
        images: One float image, `[height, width, channels]`, or a batch of them, `[batch,
            height, width, channels]` (convert integer images with `tf.image.convert_image_dtype`
            first).
        max_delta: The largest change, a float >= 0.
        seed: A `[2]` int64 seed, as `map_with_seed` hands out (or any stateless seed).

    Returns:
        The images with their brightness changed, of `images`' shape and dtype.

    Raises:
        ValueError: `max_delta` is negative (or NaN), or `images` is of rank other than 3 or 4.
        TypeError: `images` is not of a float dtype.
    """
    tf = _tf.import_tf()
    if not max_delta >= 0:
        raise ValueError(f"max_delta must be >= 0; got {max_delta!r}")
    batch, single = _batched(tf, images)
    if not batch.dtype.is_floating:
        raise TypeError(f"random_brightness needs float images; got {batch.dtype.name} (convert_image_dtype first)")
    delta = tf.random.stateless_uniform(tf.shape(batch)[:1], seed, -max_delta, max_delta, dtype=batch.dtype)
    result = batch + delta[:, None, None, None]
    return result[0] if single else result
