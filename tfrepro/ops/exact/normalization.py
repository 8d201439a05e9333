"""The exact tier's normalisations: Keras's ``LayerNormalization`` and ``BatchNormalization``
(Keras 3, tf-keras and the Keras 2 of TF 2.12-2.15), each computed as one op, the same bits for any
thread count, with oneDNN on and off, with XLA on and off, and on one device or several replicas.

Keras computes a layer norm as ``x * inv + (beta - mean * inv)`` (Keras 3) or through a fused batch
norm and ``y * gamma + beta`` (tf-keras), and a batch norm through ``tf.nn.moments`` (or its fused
kernel) and ``tf.nn.batch_normalization``: multiply-adds that XLA fuses, kernels whose sums follow
the threads, and per-replica float sums of the ``gamma`` and ``beta`` gradients. Here, in float64:
the mean and the variance are exact fixed-point sums (``_fixed.exact_batch_sum``) times ``1 / n``,
the variance the mean square of ``x - mean``; ``inv = 1 / sqrt(variance + epsilon)``; ``y = (x -
mean) * inv * gamma + beta``, every product rounded through ``_fixed.barrier`` before it is added
to, rounded once. The gradient is the normalisation's own, ``inv * (g - mean(g) - xhat * mean(g *
xhat))`` with ``g = dy * gamma`` (``g * inv`` by moving statistics), its sums exact; ``gamma``'s and
``beta``'s are exact sums rounded to float64 and then to the weight's dtype, global over replicas
(whole on the first, zero on the others, which the strategy's all-reduce adds exactly).

A layer norm normalises over its ``axes`` per example; a batch norm over every axis but the
channels', and with ``synchronized=True`` over the global batch of every replica (the integer sums
all-reduced, exact), so that two replicas compute what one device does. Its moving statistics are
``moving * momentum + statistic * (1 - momentum)``, each product through the barrier; tf-keras's
fused layer averages the unbiased variance, as its kernel does.

Within about ``2**-40`` relative of the float64 normalisation before the final rounding (tested).
Not covered, and left to Keras's own ``call`` (which the audit then names): Keras 3's
``rms_scaling``, a batch norm's mask, renormalisation, virtual batches and ``adjustment``, a
``training`` flag unknown when traced, ragged inputs (tf-keras), inputs of unknown rank or of a dtype
outside the tier's, and normalised axes of unknown size. An unsynchronized batch norm on several
replicas is computed exactly per replica and named for the replicas axis. Second-order gradients
are refused by name.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import tensorflow as tf

from tfrepro import _targets
from tfrepro._import_hooks import call_after_import
from tfrepro.ops import _stock
from tfrepro.ops.exact import _fixed, coverage
from tfrepro.ops.exact.linalg import EXACT_DTYPES, weight_gradient_replicas


def _row_sum(x: tf.Tensor, axes: list[int], replicas: _fixed.Replicas | None = None) -> tf.Tensor:
    """The exact sum over ``axes``, kept as size-1 dimensions; with ``replicas``, over the global
    batch, on every replica."""
    total = _fixed.exact_batch_sum(x, axes, replicas, shared=True)
    for axis in axes:
        total = tf.expand_dims(total, axis)
    return total


def _moments(x64: tf.Tensor, axes: list[int], inverse_n, replicas: _fixed.Replicas | None) -> tuple[tf.Tensor,
                                                                                                     tf.Tensor]:
    """The float64 mean and (biased) variance of ``x64`` over ``axes`` (kept), from exact sums: the
    variance is the mean square of ``x - mean``, two passes (no cancellation)."""
    mean = _fixed.mul(_row_sum(x64, axes, replicas), inverse_n)
    centred = x64 - mean
    return mean, _fixed.mul(_row_sum(_fixed.mul(centred, centred), axes, replicas), inverse_n)


def _normalise(x: tf.Tensor, mean: tf.Tensor, variance: tf.Tensor, gamma: tf.Tensor | None, beta: tf.Tensor | None,
               axes: list[int], param_axes: list[int], epsilon: float, inverse_n, training: bool,
               weight_replicas: _fixed.Replicas | None, batch_replicas: _fixed.Replicas | None,
               what: str) -> tf.Tensor:
    """``(x - mean) / sqrt(variance + epsilon) * gamma + beta`` in float64, rounded once to float32
    (to ``x``'s dtype for a layer norm: ``dtype``), with its gradient. ``mean`` and ``variance``
    (float64, ``axes`` kept) are the batch's own where ``training`` (the gradient then flows
    through them: ``inv * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dy * gamma``, its means
    over ``axes``, global over ``batch_replicas``) or given (moving statistics: ``dx = g * inv``).
    ``gamma``'s and ``beta``'s gradients are exact sums over the axes outside ``param_axes``,
    replica-global over ``weight_replicas``."""
    rank = x.shape.rank
    kept = [x.shape[axis] if axis in param_axes else 1 for axis in range(rank)]
    weight_axes = [axis for axis in range(rank) if axis not in param_axes]
    gamma, beta = (None if p is None else tf.convert_to_tensor(p) for p in (gamma, beta))  # variables read
    params = [p for p in (gamma, beta) if p is not None]

    def broadcast(p: tf.Tensor) -> tf.Tensor:
        p = tf.cast(p, tf.float64)
        return p if p.shape.rank == rank else tf.reshape(p, kept)

    @_fixed.custom_gradient
    def normalise(v, *weights):
        g = broadcast(weights[0]) if gamma is not None else None
        b = broadcast(weights[-1]) if beta is not None else None
        inv = 1.0 / _fixed.barrier(tf.sqrt(variance + epsilon))
        xhat = _fixed.mul(tf.cast(v, tf.float64) - mean, inv)
        y = xhat if g is None else _fixed.mul(xhat, g)
        if b is not None:
            y = y + b

        def gradient(upstream):
            dy = tf.cast(upstream, tf.float64)
            sources = (upstream, xhat, *[t for t in (g, b) if t is not None])  # what the gradient reads
            gdy = dy if g is None else _fixed.mul(dy, g)
            if training:
                mean_g = _fixed.mul(_row_sum(gdy, axes, batch_replicas), inverse_n)
                mean_gx = _fixed.mul(_row_sum(_fixed.mul(gdy, xhat), axes, batch_replicas), inverse_n)
                dx = _fixed.mul(inv, (gdy - mean_g) - _fixed.mul(xhat, mean_gx))
            else:
                dx = _fixed.mul(gdy, inv)
            grads = [_fixed.first_order_only(_fixed.narrow(dx, v.dtype), what, *sources)]
            for p, term in ((gamma, _fixed.mul(dy, xhat)), (beta, dy)):
                if p is not None:
                    total = _fixed.exact_batch_sum(term, weight_axes, weight_replicas)
                    grads.append(_fixed.first_order_only(_fixed.narrow(tf.reshape(total, tf.shape(p)), p.dtype),
                                                         what, *sources))
            return grads

        return _fixed.narrow(y, v.dtype), gradient

    return normalise(x, *params)


def layer_normalization(x: tf.Tensor, gamma: tf.Tensor | None, beta: tf.Tensor | None, axes: list[int],
                        epsilon: float, replicas: _fixed.Replicas | None = None) -> tf.Tensor:
    """``(x - mean) / sqrt(variance + epsilon) * gamma + beta`` over ``axes`` (module doc).

    Args:
        x: a float16, bfloat16 or float32 tensor of known rank whose ``axes`` have known sizes.
        gamma: the scale, shaped as ``x``'s ``axes`` (or broadcastable to ``x``), or None.
        beta: the offset, likewise, or None.
        axes: the normalised axes.
        epsilon: added to the variance.
        replicas: where ``gamma`` and ``beta`` are weights, the replicas their gradients sum over.

    Returns:
        The normalised ``x``, in ``x``'s dtype.
    """
    with tf.name_scope("ExactLayerNormalization"):
        rank = x.shape.rank
        axes = sorted(axis % rank for axis in axes)
        inverse_n = 1.0 / math.prod(x.shape[axis] for axis in axes)
        mean, variance = _moments(tf.cast(tf.stop_gradient(x), tf.float64), axes, inverse_n, None)
        return _normalise(x, mean, variance, gamma, beta, axes, axes, epsilon, inverse_n, True, replicas, None,
                          "a layer normalisation")


def batch_normalization(x: tf.Tensor, gamma: tf.Tensor | None, beta: tf.Tensor | None, axes: list[int],
                        epsilon: float, training: bool, moving: tuple[tf.Tensor, tf.Tensor] | None = None,
                        replicas: _fixed.Replicas | None = None,
                        synchronized: bool = False) -> tuple[tf.Tensor, tuple[tf.Tensor, tf.Tensor, tf.Tensor] | None]:
    """A batch normalisation over every axis but ``axes`` (the channels), as Keras's
    ``BatchNormalization`` computes it (module doc).

    Args:
        x: a float32 tensor (Keras normalises half precisions in float32) of known rank whose
            ``axes`` have known sizes.
        gamma: the scale, shaped as ``x``'s ``axes``, or None.
        beta: the offset, likewise, or None.
        axes: the channel axes.
        epsilon: added to the variance.
        training: normalise by the batch's statistics (and return them), else by ``moving``.
        moving: the moving mean and variance (inference), shaped as ``gamma``.
        replicas: the replicas of the weights' gradients (and, with ``synchronized``, of the
            batch statistics).
        synchronized: the statistics of the global batch (Keras's ``synchronized=True``), else of
            each replica's share.

    Returns:
        The normalised ``x`` (float32), and in training the float64 batch mean, variance and
        element count, shaped as ``gamma``, for the moving statistics.
    """
    with tf.name_scope("ExactBatchNormalization"):
        rank = x.shape.rank
        axes = sorted(axis % rank for axis in axes)
        reduced = [axis for axis in range(rank) if axis not in axes]
        kept = [x.shape[axis] if axis in axes else 1 for axis in range(rank)]
        batch_replicas = replicas if synchronized else None
        if training:
            count = tf.reduce_prod(_stock.gather(tf.shape(x, out_type=tf.int64), reduced))
            if batch_replicas is not None:
                count = batch_replicas.total(count)
            count = tf.cast(count, tf.float64)
            inverse_n = 1.0 / count
            mean, variance = _moments(tf.cast(tf.stop_gradient(x), tf.float64), reduced, inverse_n, batch_replicas)
        else:
            inverse_n = None
            mean, variance = (tf.reshape(tf.cast(tf.stop_gradient(s), tf.float64), kept) for s in moving)
        y = _normalise(x, mean, variance, gamma, beta, reduced, axes, epsilon, inverse_n, training, replicas,
                       batch_replicas, "a batch normalisation")
        if not training:
            return y, None
        shape = [x.shape[axis] for axis in axes]
        return y, (tf.reshape(mean, shape), tf.reshape(variance, shape), count)


def moving_average(moving: tf.Variable, statistic: tf.Tensor, momentum: float) -> tf.Tensor:
    """``moving * momentum + statistic * (1 - momentum)`` in float64, each product rounded before
    the add (``_fixed.mul``), rounded once to ``moving``'s dtype."""
    old = tf.cast(moving, tf.float64)
    return _fixed.narrow(_fixed.mul(old, momentum) + _fixed.mul(statistic, 1.0 - momentum), moving.dtype)


def _covered_input(inputs, axes: list[int]) -> bool:
    shape = getattr(inputs, "shape", None)
    return (isinstance(inputs, tf.Tensor) and inputs.dtype in EXACT_DTYPES and shape.rank is not None
            and all(shape[axis] is not None for axis in axes))


def _keras_call(original: Callable, base: type) -> Callable:
    """``LayerNormalization.call`` of any Keras, through ``layer_normalization`` where it is covered."""
    def call(self, inputs):  # Keras's own signature: Keras reads it to choose what to pass
        axes = [self.axis] if isinstance(self.axis, int) else list(self.axis)
        dtype = tf.as_dtype(self.compute_dtype)
        x = inputs
        if getattr(self, "autocast", True) and isinstance(inputs, tf.Tensor):  # tf-keras casts the input first;
            x = tf.cast(inputs, dtype)  # Keras 3 (autocast off) normalises it as it comes, then casts the output
        if getattr(self, "rms_scaling", False) or dtype not in EXACT_DTYPES or not _covered_input(x, axes):
            with _fixed.unmarked():
                return original(self, inputs)
        gamma, beta = (getattr(self, name, None) if getattr(self, flag, True) else None
                       for name, flag in (("gamma", "scale"), ("beta", "center")))
        with _fixed.marking():  # not coverage.covered: its (*args, **kwargs) would make tf-keras pass training=
            return tf.cast(layer_normalization(x, gamma, beta, axes, self.epsilon, weight_gradient_replicas(True)),
                           dtype)

    call.__doc__ = original.__doc__
    return call


def _training(layer, training) -> bool | None:
    """Whether ``layer`` normalises by the batch's statistics, as its Keras decides (None: not
    known when traced, a learning-phase tensor of Keras 2)."""
    if hasattr(layer, "_get_training_value"):  # Keras 2: the learning phase, and not when frozen
        training = layer._get_training_value(training)
    if isinstance(training, (tf.Tensor, tf.Variable)):
        training = tf.get_static_value(training)
        if training is None:
            return None
    return bool(training) and bool(layer.trainable)


# Methods a subclass may override to change what ``call`` computes: the exact op would not run them.
_BATCH_NORM_HOOKS = ("_moments", "_calculate_mean_and_var", "_assign_moving_average", "_assign_new_value",
                     "_get_training_value")


def _batch_norm_uncovered(layer, base: type, inputs, axes: list[int], batch_statistics: bool | None,
                          mask) -> bool:
    """Whether ``layer``'s call is one the exact op does not compute as its Keras would."""
    return (batch_statistics is None or (batch_statistics and mask is not None)  # masked moments
            or getattr(layer, "renorm", False) or getattr(layer, "virtual_batch_size", None) is not None
            or getattr(layer, "adjustment", None) is not None or getattr(layer, "_USE_V2_BEHAVIOR", True) is False
            or isinstance(layer.momentum, bool) or not isinstance(layer.momentum, (int, float))
            or any(getattr(type(layer), name, None) is not getattr(base, name, None) for name in _BATCH_NORM_HOOKS)
            or not _covered_input(inputs, axes))


def _batch_norm_call(original: Callable, base: type) -> Callable:
    """``BatchNormalization.call`` of any Keras (``base``, the class that defines it), through
    ``batch_normalization`` where it is covered; Keras's own ``call`` otherwise (a mask in training,
    renormalisation, virtual batches, ``adjustment``, a V1 layer, a tensor momentum, a subclass's own
    moments or updates, an input outside the tier's), which the audit then names."""
    takes_mask = "mask" in inspect.signature(original).parameters  # Keras 3.0.0-3.0.1's call has none

    def call(self, inputs, training=None, mask=None):  # Keras's own signature: Keras reads it
        axes = [self.axis] if isinstance(self.axis, int) else list(self.axis)
        batch_statistics = _training(self, training)
        context = tf.distribute.get_replica_context()
        replicas = weight_gradient_replicas(True)
        in_sync = 1 if context is None else int(context.num_replicas_in_sync)
        # inside a loop or condition no replica can all-reduce: synchronized statistics would be each replica's
        if _batch_norm_uncovered(self, base, inputs, axes, batch_statistics, mask) or in_sync != replicas.count:
            with _fixed.unmarked():
                return original(self, inputs, training=training, **({"mask": mask} if takes_mask else {}))
        synchronized = bool(getattr(self, "synchronized", False))
        moving = None if batch_statistics else (self.moving_mean, self.moving_variance)
        with _fixed.marking():
            y, statistics = batch_normalization(
                tf.cast(inputs, tf.float32), getattr(self, "gamma", None) if self.scale else None,
                getattr(self, "beta", None) if self.center else None,
                axes, self.epsilon, batch_statistics, moving, replicas, synchronized)
            if statistics is not None:
                mean, variance, count = statistics
                if getattr(self, "fused", False):  # Keras 2's fused kernel averages the unbiased variance
                    variance = _fixed.mul(_fixed.mul(variance, count), 1.0 / tf.maximum(count - 1.0, 1.0))
                updates = [(variable, moving_average(variable, tf.reshape(statistic, variable.shape), self.momentum))
                           for variable, statistic in ((self.moving_mean, mean), (self.moving_variance, variance))]
        if statistics is not None:
            for variable, value in updates:  # outside the mark: the audit sees how the strategy aggregates them
                variable.assign(value)
            if replicas.many and not synchronized:
                y = coverage.refuse_in_place(y, "unsynchronized_batch_norm")
            elif replicas.count > 2 and _averaged_when_read(self.moving_mean):
                y = coverage.refuse_in_place(y, "moving_statistics_averaged_when_read")
        return tf.cast(y, self.compute_dtype)

    call.__doc__ = original.__doc__
    return call


def _averaged_when_read(variable) -> bool:
    """Whether ``variable`` is a Keras 2 moving statistic kept per replica and averaged in float when
    read (``ON_READ``, ``MEAN``): exact for two identical copies, rounded for more."""
    return getattr(variable, "synchronization", None) == tf.VariableSynchronization.ON_READ


def install() -> Callable[[], None]:
    """Make ``LayerNormalization`` and ``BatchNormalization`` exact in every Keras this process
    loads, now or when it is imported; returns the undo."""
    saved = []
    active = [True]

    def hook(key: str, make_call: Callable[[Callable], Callable]) -> Callable:
        def replace(module) -> None:
            if not active[0] or not _targets.expected(_targets.target(key)) or _targets.find(module, key) is None:
                return  # (Keras 3 and the Keras 2 of TF 2.13-2.15 share module names)
            cls = getattr(module, _targets.target(key).attribute.split(".")[0])
            original = cls.__dict__["call"]
            saved.append((cls, original))
            cls.call = make_call(original, cls)

        return replace

    hooks = {}
    for role, make_call in (("layer_norm", _keras_call), ("batch_norm_call", _batch_norm_call)):
        for entry in _targets.for_role(role):
            hooks.setdefault(entry.module, []).append(hook(entry.key, make_call))
    call_after_import({module: _chain(found) for module, found in hooks.items()})

    def undo() -> None:
        active[0] = False
        for cls, original in reversed(saved):
            cls.call = original

    return undo


def _chain(hooks: list[Callable]) -> Callable:
    def run(module) -> None:
        for hook in hooks:
            hook(module)

    return run
