"""The ops the exact tier does not cover: under ``patch(ops="exact")`` they raise
``NotImplementedError`` by name instead of running TF's order-dependent kernels silently."""

from __future__ import annotations

from collections.abc import Callable


def refusing(api: str) -> Callable[..., None]:
    """A stand-in for ``api`` that raises, naming it and what to do."""
    def refuse(*args, **kwargs):
        raise NotImplementedError(
            f"tfrepro exact tier: {api} is not covered (its sums depend on the order of accumulation); "
            "patch(ops='auto') runs it deterministically on the same hardware and thread count")

    refuse.__name__ = refuse.__qualname__ = f"refused_{api.rsplit('.', 1)[-1]}"
    return refuse


# Public API name -> the targets it is bound under.
REFUSED = {
    "tf.nn.depthwise_conv2d": ("tf.nn.depthwise_conv2d", "tf.compat.v1.nn.depthwise_conv2d",
                               "tensorflow.python.ops.nn_impl:depthwise_conv2d"),
    "tf.nn.separable_conv2d": ("tf.nn.separable_conv2d", "tf.compat.v1.nn.separable_conv2d"),
    "tf.nn.conv3d": ("tf.nn.conv3d", "tf.compat.v1.nn.conv3d"),
    "tf.nn.conv3d_transpose": ("tf.nn.conv3d_transpose", "tf.compat.v1.nn.conv3d_transpose"),
    "tf.nn.max_pool3d": ("tf.nn.max_pool3d",),
    "tf.nn.avg_pool3d": ("tf.nn.avg_pool3d",),
}
