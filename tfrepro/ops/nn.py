"""``bias_add``, the softmax cross-entropies and fused batch norm's inference-mode backprop, with
order-invariant reductions in their gradients."""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops._checks import after, check, joined, shape_text, text
from tfrepro.ops._exact_sum import same_summation
from tfrepro.ops.segment import reduce_sum


def bias_add(value: tf.Tensor, bias: tf.Tensor, data_format: str | None = None, name: str | None = None) -> tf.Tensor:
    """Adds `bias` to `value`, with a bias gradient bitwise independent of the summation order.

    A drop-in for `tf.nn.bias_add`. The forward op is TF's own; the gradient to `bias`, a sum over
    every axis but the channels', is order-invariant (`reduce_sum`), where TF's `BiasAddGrad`
    accumulates on a GPU with atomics before TF 2.1 and in thread order without op determinism.
    The gradient to `value` is `dy` itself, as in TF.

    Args:
        value: A `Tensor` of a numeric dtype, as in `tf.nn.bias_add`.
        bias: A 1-D `Tensor` whose size is the channels dimension of `value`; converted to
            `value`'s dtype.
        data_format: `None` or a format whose channels come last (`"NHWC"`, ...), or `"NC..."`
            (`"NCHW"`, ...) for channels after the batch dimension, as in `tf.nn.bias_add`.
        name: A name for the operation (optional).

    Returns:
        A `Tensor` of `value`'s dtype and shape.
    """
    with tf.name_scope(name or "DeterministicBiasAdd"):
        value = tf.convert_to_tensor(value)
        bias = tf.convert_to_tensor(bias, dtype=value.dtype)
        channels_first = data_format is not None and data_format.startswith("NC")  # TF's op checks the format

        @tf.custom_gradient
        def forward(v, b):
            out = _stock.bias_add(v, b, data_format=data_format)

            def grad(dy):
                rank = dy.shape.rank
                if rank is not None:
                    axes = [a for a in range(rank) if a != (1 if channels_first else rank - 1)]
                else:  # every axis but the channels'
                    axes = tf.range(tf.rank(dy) - 1)
                    axes = tf.where(axes >= 1, axes + 1, axes) if channels_first else axes
                return dy, reduce_sum(dy, axis=axes)

            return out, grad

        return forward(value, bias)


def _compute_dtype(dtype: tf.DType) -> tf.DType:
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


def _log_softmax(logits: tf.Tensor, axis: int) -> tf.Tensor:
    """Numerically stable log-softmax; the max is exact, the sum order-invariant."""
    shifted = logits - tf.reduce_max(logits, axis=axis, keepdims=True)
    return shifted - _stock.log(reduce_sum(_stock.exp(shifted), axis=axis, keepdims=True))


@check
def _broadcastable(labels_shape: tf.Tensor, logits_shape: tf.Tensor):
    """TF's check that labels and logits broadcast (when the static shapes show it, the product in
    the loss fails at graph build, as TF's shape function does)."""
    rank = tf.maximum(tf.size(labels_shape), tf.size(logits_shape))

    def padded(shape: tf.Tensor) -> tf.Tensor:
        return tf.concat([tf.ones([rank - tf.size(shape)], tf.int32), shape], 0)

    ones, twos = padded(labels_shape), padded(logits_shape)  # tf.equal: in a TF1 graph, == compares identity
    return tf.reduce_all(tf.equal(ones, twos) | tf.equal(ones, 1) | tf.equal(twos, 1)), lambda: tf.strings.join([
        "logits and labels must be broadcastable: logits_size=", shape_text(logits_shape),
        " labels_size=", shape_text(labels_shape)])


def softmax_cross_entropy_with_logits(labels: tf.Tensor, logits: tf.Tensor, axis: int = -1,
                                      name: str | None = None) -> tf.Tensor:
    """Computes softmax cross entropy between `logits` and `labels`, with order-invariant sums.

    A drop-in for `tf.nn.softmax_cross_entropy_with_logits`, computed from a numerically stable
    log-softmax; its sum over the classes and the loss's are bitwise independent of the order of
    the classes (`reduce_sum`): the same bits on every device and thread count, not bit-equal to
    TF's fused kernel (which was order-dependent on a GPU before TF 2.6). The gradient is
    `softmax - labels` for the logits and `-log_softmax` for the labels, as TF's. float16 and
    bfloat16 inputs compute in float32.

    Args:
        labels: Probability distributions over the classes along `axis` (each row a valid
            distribution), broadcastable to `logits`; cast to `logits`' dtype.
        logits: Unscaled log probabilities, a float `Tensor`, as in
            `tf.nn.softmax_cross_entropy_with_logits`.
        axis: The class dimension (default -1, the last).
        name: A name for the operation (optional).

    Returns:
        A `Tensor` of `logits`' dtype and shape without `axis`: the loss of each example.

    Raises:
        tf.errors.InvalidArgumentError: When the op runs (eagerly: at the call), for `labels` and
            `logits` that do not broadcast (TF's message).
    """
    with tf.name_scope(name or "DeterministicSoftmaxCrossEntropyWithLogits"):
        logits = tf.convert_to_tensor(logits)
        labels = tf.cast(tf.convert_to_tensor(labels), logits.dtype)
        labels = after(_broadcastable(tf.shape(labels), tf.shape(logits)), labels)
        dtype = _compute_dtype(logits.dtype)

        @tf.custom_gradient
        def forward(labels_in, logits_in):
            log_probs = _log_softmax(tf.cast(logits_in, dtype), axis)
            loss = -reduce_sum(tf.cast(labels_in, dtype) * log_probs, axis=axis)

            def grad(dy):
                dy = tf.expand_dims(tf.cast(dy, dtype), axis)
                d_logits = dy * (_stock.exp(log_probs) - tf.cast(labels_in, dtype))
                return tf.cast(dy * -log_probs, labels_in.dtype), tf.cast(d_logits, logits_in.dtype)

            return tf.cast(loss, logits_in.dtype), grad

        return forward(labels, logits)


def _sparse_xent_static_shapes(labels: tf.Tensor, logits: tf.Tensor) -> str:
    """TF's checks of the labels' shape against the logits' that the static shapes decide: a
    ValueError at the call. Returns what is left for run time: "none", "rows" (2-D logits, whose
    kernel takes 1-D labels, one per row) or "leading" (labels.shape == logits.shape[:-1])."""
    labels_shape, logits_shape = labels.shape, logits.shape
    if logits_shape.rank == 0:
        raise ValueError(f"`logits` cannot be a scalar. Received logits={logits}`")
    if logits_shape.rank is not None and labels_shape.rank is not None and labels_shape.rank != logits_shape.rank - 1:
        raise ValueError("`labels.shape.rank` must equal `logits.shape.rank - 1`. Received: "
                         f"labels.shape={labels_shape} of rank {labels_shape.rank} and logits.shape={logits_shape} "
                         f"of rank {logits_shape.rank}")
    defined = labels_shape.is_fully_defined() and logits_shape[:-1].is_fully_defined()
    if defined and labels_shape != logits_shape[:-1]:
        raise ValueError("`labels.shape` must equal `logits.shape` except for the last dimension. Received: "
                         f"labels.shape={labels_shape} and logits.shape={logits_shape}")
    return "none" if defined else "rows" if logits_shape.rank == 2 else "leading"


@check
def _sparse_labels(labels: tf.Tensor, logits_shape: tf.Tensor, classes: tf.Tensor, shapes: str):
    """TF's run-time checks of sparse labels: their shape (as ``shapes`` says), then their values,
    with the kernel's message (the smallest label if negative, else the largest, and every label)."""
    labels_shape = tf.shape(labels)
    if shapes == "rows":
        vector = tf.equal(tf.size(labels_shape), 1)
        shape_ok = vector & tf.equal(tf.reduce_prod(labels_shape[-1:]), logits_shape[0])

        def shape_message() -> tf.Tensor:
            return tf.cond(vector, lambda: tf.strings.join([
                "logits and labels must have the same first dimension, got logits shape ", shape_text(logits_shape),
                " and labels shape ", shape_text(labels_shape)]),
                lambda: tf.strings.join(["labels must be 1-D, but got shape ", shape_text(labels_shape)]))
    elif shapes == "leading":
        leading = logits_shape[:-1]
        shape_ok = tf.equal(tf.size(labels_shape), tf.size(leading)) & tf.reduce_all(tf.equal(
            tf.concat([labels_shape, leading], 0)[:tf.size(leading)], leading))

        def shape_message() -> tf.Tensor:
            return tf.strings.join(["logits and labels must have the same shape except for the last dimension: "
                                    "labels.shape = ", shape_text(labels_shape), ", logits.shape = ",
                                    shape_text(logits_shape)])
    else:
        shape_ok, shape_message = tf.constant(True), None
    flat = tf.reshape(labels, [-1])
    padded = tf.concat([flat, tf.zeros([1], flat.dtype)], 0)  # no minimum of an empty tensor
    lowest, highest = tf.reduce_min(padded), tf.reduce_max(padded)
    in_range = (lowest >= 0) & (highest < classes)

    def range_message() -> tf.Tensor:
        return tf.strings.join(["Received a label value of ", text(tf.where(lowest < 0, lowest, highest)),
                                " which is outside the valid range of [0, ", text(classes), ").  Label values: ",
                                joined(flat, " ")])

    return shape_ok & in_range, lambda: tf.cond(shape_ok, range_message, shape_message) if shape_message else range_message()


def sparse_softmax_cross_entropy_with_logits(labels: tf.Tensor, logits: tf.Tensor,
                                             name: str | None = None) -> tf.Tensor:
    """Computes sparse softmax cross entropy between `logits` and `labels`, with order-invariant sums.

    A drop-in for `tf.nn.sparse_softmax_cross_entropy_with_logits`, computed from a numerically
    stable log-softmax whose sum over the classes is bitwise independent of their order: the same
    bits on every device and thread count, not bit-equal to TF's fused kernel (which was
    order-dependent on a GPU before TF 2.6, and raised under op determinism in TF 2.6). The
    gradient is `softmax - one_hot(labels)`, as TF's. float16 and bfloat16 logits compute in
    float32. Labels outside `[0, num_classes)` raise on every device, as TF's CPU kernel does
    (its GPU kernel returns NaN for them).

    Args:
        labels: An int32 or int64 `Tensor` of shape `logits.shape[:-1]`: the class of each
            example, in `[0, num_classes)`.
        logits: Unscaled log probabilities, a float `Tensor` of shape `labels.shape +
            [num_classes]`, as in `tf.nn.sparse_softmax_cross_entropy_with_logits`.
        name: A name for the operation (optional).

    Returns:
        A `Tensor` of `labels`' shape and `logits`' dtype: the loss of each example.

    Raises:
        TypeError: `labels` is not of an integer dtype.
        ValueError: `logits` is a scalar, or the static shapes of `labels` and `logits` do not
            match (rank or leading dimensions).
        tf.errors.InvalidArgumentError: When the op runs (eagerly: at the call), for a label
            outside `[0, num_classes)` or shapes that turn out not to match (TF's messages).
    """
    with tf.name_scope(name or "DeterministicSparseSoftmaxCrossEntropyWithLogits"):
        logits = tf.convert_to_tensor(logits)
        labels = tf.convert_to_tensor(labels)
        if not labels.dtype.is_integer:
            raise TypeError(f"labels must be int32 or int64; got {labels.dtype.name}")
        dtype = _compute_dtype(logits.dtype)
        shapes = _sparse_xent_static_shapes(labels, logits)  # first, as in TF: before any slicing of shapes
        classes = tf.shape(logits, out_type=labels.dtype)[-1]
        labels = after(_sparse_labels(labels, tf.shape(logits), tf.cast(classes, labels.dtype), shapes), labels)

        @tf.custom_gradient
        def forward(logits_in):
            # After the class count: for scalar logits, TF's own error (its slice), never the reduction's.
            log_probs = _log_softmax(tf.cast(after([classes], logits_in), dtype), -1)
            rows = tf.reshape(log_probs, tf.stack([-1, tf.cast(classes, tf.int32)]))  # any rank, known or not
            picked = _stock.gather(rows, tf.reshape(labels, [-1, 1]), axis=1, batch_dims=1)
            picked = tf.reshape(picked, tf.shape(labels))

            def grad(dy):
                one_hot = tf.one_hot(labels, tf.cast(classes, tf.int32), dtype=dtype)
                return tf.cast(tf.expand_dims(tf.cast(dy, dtype), -1) * (_stock.exp(log_probs) - one_hot), logits_in.dtype)

            return tf.cast(-picked, logits_in.dtype), grad

        return forward(logits)


def fused_batch_norm(x: tf.Tensor, scale: tf.Tensor, offset: tf.Tensor, mean: tf.Tensor | None = None,
                     variance: tf.Tensor | None = None, epsilon: float = 0.001, data_format: str = "NHWC",
                     is_training: bool | tf.Tensor = True, name: str | None = None,
                     exponential_avg_factor: float = 1.0) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Batch normalization, with a deterministic backprop in inference mode (batch norm fine-tuning).

    A drop-in for `tf.compat.v1.nn.fused_batch_norm`, the op behind Keras 2's fused
    `BatchNormalization`. In training mode (`is_training` true, or a tensor not known statically)
    it is TF's op as it is: its backprop is deterministic. With `is_training=False` (frozen
    statistics, trainable scale and offset), the forward pass is TF's kernel, bit for bit, and the
    backprop to `scale` and `offset` sums over the batch and spatial axes order-invariantly: TF's
    fused backprop for this case has no deterministic GPU kernel and raises under op determinism
    (TF >= 2.7). As in TF, no gradient flows to `mean` and `variance`.

    Args:
        x: A 4-D or 5-D `Tensor` (`data_format` says which), as in `tf.compat.v1.nn.fused_batch_norm`.
        scale: A 1-D `Tensor` of the channels' scale (gamma).
        offset: A 1-D `Tensor` of the channels' offset (beta).
        mean: A 1-D `Tensor` of the channels' population mean, for inference (`is_training=False`);
            a value that is not a tensor takes `scale`'s dtype, as in TF.
        variance: A 1-D `Tensor` of the channels' population variance, for inference.
        epsilon: A small float added to the variance to avoid dividing by zero.
        data_format: `"NHWC"`, `"NCHW"`, `"NDHWC"` or `"NCDHW"`.
        is_training: Whether to normalize with the batch's statistics (TF's op) or with `mean` and
            `variance` (the deterministic backprop).
        name: A name for the operation (optional).
        exponential_avg_factor: The factor of the running averages in training mode, as in TF.

    Returns:
        A tuple `(y, running_mean, running_variance)`, as TF's op returns it: the normalized
            `x`, and the statistics (in inference mode, TF's kernel's outputs for `mean` and
            `variance`).
    """
    static_training = tf.get_static_value(is_training) if tf.is_tensor(is_training) else is_training
    if static_training is None or bool(static_training):
        return _stock.fused_batch_norm(x, scale, offset, mean=mean, variance=variance, epsilon=epsilon,
                                       data_format=data_format, is_training=is_training, name=name,
                                       exponential_avg_factor=exponential_avg_factor)
    with tf.name_scope(name or "DeterministicFusedBatchNorm"):
        x = tf.convert_to_tensor(x)
        scale = tf.convert_to_tensor(scale)
        # As TF's op: values that are not tensors (NumPy float64 statistics) take scale's dtype.
        offset, mean, variance = (v if tf.is_tensor(v) else tf.convert_to_tensor(v, scale.dtype)
                                  for v in (offset, mean, variance))
        channels_last = not data_format.startswith("NC")
        rank = len(data_format)  # NHWC, NCHW, NDHWC, NCDHW: exact also when x's rank is unknown
        axes = [a for a in range(rank) if a != (rank - 1 if channels_last else 1)]

        def per_channel(v: tf.Tensor) -> tf.Tensor:
            shape = [1] * rank
            shape[rank - 1 if channels_last else 1] = -1
            return tf.reshape(v, shape)

        @tf.custom_gradient
        def forward(x_in, scale_in, offset_in, mean_in, variance_in):
            y, running_mean, running_variance = _stock.fused_batch_norm(
                x_in, scale_in, offset_in, mean=mean_in, variance=variance_in, epsilon=epsilon, data_format=data_format,
                is_training=False, exponential_avg_factor=exponential_avg_factor)

            @same_summation
            def grad(dy, *_):  # TF's gradient: none for the (frozen) statistics, nor through the returned ones
                with tf.control_dependencies([y]):  # TF's forward checked the shapes all of this relies on
                    dy32 = tf.cast(dy, tf.float32)
                    inverse = _stock.rsqrt(tf.identity(variance_in) + epsilon)
                    centred = tf.cast(x_in, tf.float32) - per_channel(tf.identity(mean_in))
                    scaled = tf.identity(scale_in) * inverse
                d_x = tf.cast(dy32 * per_channel(scaled), x_in.dtype)
                d_scale = reduce_sum(dy32 * centred, axis=axes) * inverse
                d_offset = reduce_sum(dy32, axis=axes)
                return d_x, d_scale, d_offset, None, None

            return (y, running_mean, running_variance), grad

        return forward(x, scale, offset, mean, variance)
