"""``bias_add`` and the softmax cross-entropies with order-invariant reductions in their gradients."""

from __future__ import annotations

import tensorflow as tf

from tfrepro.ops import _stock
from tfrepro.ops.segment import reduce_sum


def _channel_axis(data_format: str | None, rank: int) -> int:
    if data_format is None or data_format.startswith("N") and data_format.endswith("C"):
        return rank - 1
    if data_format.startswith("NC"):
        return 1
    raise ValueError(f"unsupported data_format {data_format!r}: expected 'N...C' or 'NC...'")


def bias_add(value, bias, data_format=None, name=None):
    """``tf.nn.bias_add``: the same forward op; the bias gradient is an order-invariant sum (on GPU,
    TF's BiasAddGrad accumulates with atomics before TF 2.1 and in thread order without determinism)."""
    with tf.name_scope(name or "DeterministicBiasAdd"):
        value = tf.convert_to_tensor(value)
        bias = tf.convert_to_tensor(bias, dtype=value.dtype)
        rank = value.shape.rank
        if rank is None:
            raise ValueError("bias_add needs a value of known rank")
        axis = _channel_axis(data_format, rank)
        reduce_axes = [a for a in range(rank) if a != axis]

        @tf.custom_gradient
        def forward(v, b):
            def grad(dy):
                return dy, reduce_sum(dy, axis=reduce_axes)

            return _stock.bias_add(v, b, data_format=data_format), grad

        return forward(value, bias)


def _compute_dtype(dtype: tf.DType) -> tf.DType:
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


def _log_softmax(logits: tf.Tensor, axis: int) -> tf.Tensor:
    """Numerically stable log-softmax; the max is exact, the sum order-invariant."""
    shifted = logits - tf.reduce_max(logits, axis=axis, keepdims=True)
    return shifted - tf.math.log(reduce_sum(tf.exp(shifted), axis=axis, keepdims=True))


def softmax_cross_entropy_with_logits(labels, logits, axis=-1, name=None):
    """``tf.nn.softmax_cross_entropy_with_logits``: log-softmax based, order-invariant sums; the
    gradient is ``softmax - labels`` for logits and ``-log_softmax`` for labels, as TF's."""
    with tf.name_scope(name or "DeterministicSoftmaxCrossEntropyWithLogits"):
        logits = tf.convert_to_tensor(logits)
        labels = tf.cast(tf.convert_to_tensor(labels), logits.dtype)
        dtype = _compute_dtype(logits.dtype)

        @tf.custom_gradient
        def forward(labels_in, logits_in):
            log_probs = _log_softmax(tf.cast(logits_in, dtype), axis)
            loss = -reduce_sum(tf.cast(labels_in, dtype) * log_probs, axis=axis)

            def grad(dy):
                dy = tf.expand_dims(tf.cast(dy, dtype), axis)
                d_logits = dy * (tf.exp(log_probs) - tf.cast(labels_in, dtype))
                return tf.cast(dy * -log_probs, labels_in.dtype), tf.cast(d_logits, logits_in.dtype)

            return tf.cast(loss, logits_in.dtype), grad

        return forward(labels, logits)


def _sparse_xent_shape_checks(labels: tf.Tensor, logits: tf.Tensor) -> list:
    """TF's checks of the labels' shape against the logits': ValueError for what the static shapes
    show at the call, InvalidArgumentError when the op runs for what only the run-time shapes show."""
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
    if defined:
        return []
    if logits_shape.rank == 2:  # TF's kernel takes such labels as they are: 1-D, one per row
        return [tf.debugging.assert_rank(labels, 1, message="labels must be 1-D"),
                tf.debugging.assert_equal(tf.shape(labels)[0], tf.shape(logits)[0],
                                          message="logits and labels must have the same first dimension")]
    return [tf.debugging.assert_equal(tf.shape(labels), tf.shape(logits)[:-1],
                                      message="logits and labels must have the same shape except for the last "
                                              "dimension")]


def sparse_softmax_cross_entropy_with_logits(labels, logits, name=None):
    """``tf.nn.sparse_softmax_cross_entropy_with_logits``: labels out of ``[0, num_classes)`` raise
    InvalidArgumentError (as TF's CPU kernel); the gradient is ``softmax - one_hot(labels)``."""
    with tf.name_scope(name or "DeterministicSparseSoftmaxCrossEntropyWithLogits"):
        logits = tf.convert_to_tensor(logits)
        labels = tf.convert_to_tensor(labels)
        if not labels.dtype.is_integer:
            raise TypeError(f"labels must be int32 or int64; got {labels.dtype.name}")
        dtype = _compute_dtype(logits.dtype)
        classes = tf.shape(logits, out_type=labels.dtype)[-1]
        checks = _sparse_xent_shape_checks(labels, logits) + [
            tf.debugging.assert_non_negative(labels, message="Received a label value below 0 (valid range [0, num_classes))"),
            tf.debugging.assert_less(labels, classes, message="Received a label value outside the valid range [0, num_classes)"),
        ]
        with tf.control_dependencies(checks):
            labels = tf.identity(labels)

        @tf.custom_gradient
        def forward(logits_in):
            log_probs = _log_softmax(tf.cast(logits_in, dtype), -1)
            rows = tf.reshape(log_probs, tf.stack([-1, tf.cast(classes, tf.int32)]))  # any rank, known or not
            picked = _stock.gather(rows, tf.reshape(labels, [-1, 1]), axis=1, batch_dims=1)
            picked = tf.reshape(picked, tf.shape(labels))

            def grad(dy):
                one_hot = tf.one_hot(labels, tf.cast(classes, tf.int32), dtype=dtype)
                return tf.cast(tf.expand_dims(tf.cast(dy, dtype), -1) * (tf.exp(log_probs) - one_hot), logits_in.dtype)

            return tf.cast(-picked, logits_in.dtype), grad

        return forward(logits)
