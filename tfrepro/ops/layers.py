"""Keras layers that use ``tfrepro.ops``: drop-ins for ``Embedding`` and ``UpSampling2D``.

Importing this module imports TensorFlow and the Keras that ``tf.keras`` resolves to (Keras 3, or
tf_keras with ``TF_USE_LEGACY_KERAS=1``); the layers subclass that Keras's layers.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfrepro import _tf
from tfrepro.ops.gathering import gather
from tfrepro.ops.image import resize_nearest_neighbor

keras = _tf.keras_module()

__all__ = ["Embedding", "UpSampling2D"]


class Embedding(keras.layers.Embedding):
    """Turns non-negative integers (indexes) into dense vectors, with an order-invariant gradient.

    A drop-in for `keras.layers.Embedding`, with the same arguments. Its lookup is
    `tfrepro.ops.gather`, whose gradient sums the rows of repeated ids exactly and
    order-invariantly: identical bits for any batch layout, on any device. LoRA, quantised or
    sparse configurations fall back to Keras's lookup. Ids of a dtype other than int32 and int64
    are cast to int32, as Keras does.
    """

    def call(self, inputs: Any) -> Any:
        if getattr(self, "lora_enabled", False) or getattr(self, "quantization_mode", None) or getattr(self, "sparse", False):
            return super().call(inputs)
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype not in (tf.int32, tf.int64):
            inputs = tf.cast(inputs, tf.int32)
        return tf.cast(gather(self.embeddings, inputs), self.compute_dtype)


class UpSampling2D(keras.layers.UpSampling2D):
    """Upsampling layer for 2D inputs, with an order-invariant backprop for nearest-neighbour interpolation.

    A drop-in for `keras.layers.UpSampling2D`, with the same arguments. With
    `interpolation="nearest"` (the default) it resizes with `tfrepro.ops.resize_nearest_neighbor`,
    whose backprop sums the gradients of the copies of each pixel exactly and order-invariantly
    (TF's GPU kernel for it raises under op determinism). Other interpolations
    (`"bilinear"`, ...) use Keras's own resize.
    """

    def call(self, inputs: Any) -> Any:
        if self.interpolation != "nearest":
            return super().call(inputs)
        channels_first = self.data_format == "channels_first"
        x = tf.transpose(inputs, [0, 2, 3, 1]) if channels_first else tf.convert_to_tensor(inputs)
        height, width = self.size
        new_size = tf.shape(x)[1:3] * tf.constant([height, width], tf.int32)
        out = resize_nearest_neighbor(x, new_size, half_pixel_centers=True)
        if x.shape[1] is not None and x.shape[2] is not None:
            out.set_shape([x.shape[0], x.shape[1] * height, x.shape[2] * width, x.shape[3]])
        return tf.transpose(out, [0, 3, 1, 2]) if channels_first else out
