"""The exact tier's optimizer arithmetic: Keras's Adam and SGD updates made FMA-proof.

An optimizer's update is elementwise, so every thread count and oneDNN setting computes it by the
same code. XLA, though, contracts ``m + (g - m) * (1 - beta_1)`` into a fused multiply-add, which
rounds once where TF's kernels round twice (measured: 57 of 10,000 Adam weights differ after three
steps on TF 2.21's CPU). ``install()`` replaces the ``update_step`` of ``Adam`` and ``SGD`` in
Keras 3 and in tf-keras (and their subclasses, Keras 3's ``AdamW`` among them) with the same update
computed in float64,
each product rounded through ``_fixed.barrier`` before it is added to, and each result rounded
once to the variable's dtype: the same bits with XLA and without. Each update runs as one XLA
kernel (its passes fused; the same bits as on TF's kernels one by one, tested). ``beta ** step`` is computed by
repeated squaring (products only). Adam's ``amsgrad`` (and tf-keras's ``adaptive_epsilon``) is kept;
SGD's momentum and Nesterov too. Sparse gradients (``IndexedSlices``) are made dense first, by the
exact segment sum.

Not covered (they run Keras's own update, identical across threads and oneDNN, possibly not
across XLA on and off): the other optimizers, and weight decay (``AdamW``'s decay, applied by
Keras's base class before the update).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import tensorflow as tf

from tfrepro import _targets
from tfrepro._import_hooks import call_after_import
from tfrepro.ops.exact._fixed import compiled, mul, narrow, worth_compiling
from tfrepro.ops.exact import coverage

COVERED = ("Adam", "SGD")


def _f64(x) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(x), tf.float64)


def _power(base: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """``base ** step`` for float64 ``base`` and an integer ``step`` in [0, 2**31), by repeated
    squaring: products only, each correctly rounded, so XLA and TF's kernels agree."""
    step = tf.cast(step, tf.int64)
    result = tf.ones_like(base)
    square = base
    for bit in range(31):
        odd = tf.equal(tf.bitwise.bitwise_and(tf.bitwise.right_shift(step, bit), 1), 1)
        result = tf.where(odd, mul(result, square), result)
        square = mul(square, square)
    return result


def _adam_factors(lr, step, beta_1, beta_2, epsilon, adaptive_epsilon: bool):
    """Adam's step size ``alpha`` and ``epsilon`` (scaled with tf-keras's ``adaptive_epsilon``) at
    ``step``, in float64: scalars, one kernel for every variable."""
    beta_1, beta_2, epsilon, lr = _f64(beta_1), _f64(beta_2), _f64(epsilon), _f64(lr)
    correction_2 = tf.sqrt(1.0 - _power(beta_2, step))
    alpha = mul(lr, correction_2) / (1.0 - _power(beta_1, step))
    return alpha, mul(epsilon, correction_2) if adaptive_epsilon else epsilon


def _adam_values(g, m, v, v_hat, w, alpha, beta_1, beta_2, epsilon):
    """Adam's new ``m``, ``v``, ``v_hat`` (None without amsgrad) and weight ``w``, each rounded to its
    dtype as TF's kernels round (``narrow``: float16 and bfloat16 through float32, where XLA would
    round once): float64 arithmetic, every product rounded through ``barrier`` (module doc)."""
    alpha, beta_1, beta_2, epsilon = _f64(alpha), _f64(beta_1), _f64(beta_2), _f64(epsilon)
    g, m_old, v_old = _f64(g), _f64(m), _f64(v)
    m_new = m_old + mul(g - m_old, 1.0 - beta_1)
    v_new = v_old + mul(mul(g, g) - v_old, 1.0 - beta_2)
    v_hat_new = None
    if v_hat is not None:
        v_new_hat = tf.maximum(_f64(v_hat), v_new)
        v_hat_new = narrow(v_new_hat, v_hat.dtype)
    update = mul(m_new, alpha) / (tf.sqrt(v_new if v_hat is None else v_new_hat) + epsilon)
    return narrow(m_new, m.dtype), narrow(v_new, v.dtype), v_hat_new, narrow(_f64(w) - update, w.dtype)


def _sgd_values(g, m, w, lr, momentum, nesterov: bool):
    """SGD's new momentum ``m`` (None without) and weight ``w``, each rounded to its dtype as
    ``_adam_values`` rounds (module doc)."""
    step = mul(_f64(g), _f64(lr))
    if m is None:
        return None, narrow(_f64(w) - step, w.dtype)
    momentum = _f64(momentum)
    m_new = mul(_f64(m), momentum) - step
    change = mul(m_new, momentum) - step if nesterov else m_new
    return narrow(m_new, m.dtype), narrow(_f64(w) + change, w.dtype)


# One XLA kernel per update of a large variable (``worth_compiling``): its float64 passes fuse into one
# (about 6x faster than TF's kernels one by one on the MNIST CNN's 9216x128 kernel), and every step is
# correctly rounded, so compiling changes no bit.
# Adam's scalar factors are a kernel of their own, compiled once: XLA compiles an update per shape.
adam_factors = compiled(_adam_factors)
adam_values = compiled(_adam_values)
sgd_values = compiled(_sgd_values)


def _dense(gradient) -> tf.Tensor:
    """A gradient as a dense tensor (``IndexedSlices`` summed by the exact segment sum)."""
    return tf.convert_to_tensor(gradient)


def _read(*variables) -> list[tf.Tensor | None]:
    """The variables' values (None stays None): a kernel takes tensors, and its results are assigned."""
    return [None if variable is None else tf.convert_to_tensor(variable) for variable in variables]


def _adam(optimizer, gradient, variable, learning_rate, m, v, v_hat, adaptive_epsilon: bool = False) -> None:
    step = tf.cast(optimizer.iterations, tf.int64) + 1
    beta_1, beta_2 = _f64(optimizer.beta_1), _f64(optimizer.beta_2)
    alpha, epsilon = adam_factors(_f64(learning_rate), step, beta_1, beta_2, _f64(optimizer.epsilon), adaptive_epsilon)
    update = adam_values if worth_compiling(variable) else _adam_values
    values = update(_dense(gradient), *_read(m, v, v_hat, variable), alpha, beta_1, beta_2, epsilon)
    for slot, value in zip((m, v, v_hat, variable), values):
        if slot is not None:
            slot.assign(value)


def _sgd(optimizer, gradient, variable, learning_rate, m) -> None:
    update = sgd_values if worth_compiling(variable) else _sgd_values
    values = update(_dense(gradient), *_read(m, variable), _f64(learning_rate), _f64(optimizer.momentum),
                    bool(optimizer.nesterov))
    for slot, value in zip((m, variable), values):
        if slot is not None:
            slot.assign(value)


def adam_update_step(self, gradient, variable, learning_rate) -> None:
    """Keras 3's ``Adam.update_step``, FMA-proof (module doc)."""
    index = self._get_variable_index(variable)
    _adam(self, gradient, variable, learning_rate, self._momentums[index], self._velocities[index],
          self._velocity_hats[index] if self.amsgrad else None)


def sgd_update_step(self, gradient, variable, learning_rate) -> None:
    """Keras 3's ``SGD.update_step``, FMA-proof (module doc)."""
    _sgd(self, gradient, variable, learning_rate,
         self.momentums[self._get_variable_index(variable)] if self.momentum != 0 else None)


def tf_keras_adam_update_step(self, gradient, variable) -> None:
    """tf-keras's ``Adam.update_step``, FMA-proof (module doc); sparse gradients made dense."""
    index = self._index_dict[self._var_key(variable)]
    _adam(self, gradient, variable, tf.cast(self.learning_rate, variable.dtype), self._momentums[index],
          self._velocities[index], self._velocity_hats[index] if self.amsgrad else None,
          adaptive_epsilon=getattr(self, "adaptive_epsilon", False))


def tf_keras_sgd_update_step(self, gradient, variable) -> None:
    """tf-keras's ``SGD.update_step``, FMA-proof (module doc); sparse gradients made dense."""
    index = self._index_dict[self._var_key(variable)]
    _sgd(self, gradient, variable, tf.cast(self.learning_rate, variable.dtype),
         self.momentums[index] if self.momentum != 0 else None)


_UPDATES = {("Adam", 3): adam_update_step, ("SGD", 3): sgd_update_step,
            ("Adam", 2): tf_keras_adam_update_step, ("SGD", 2): tf_keras_sgd_update_step}


def install() -> Callable[[], None]:
    """Make Adam and SGD update FMA-proof in every Keras this process loads (Keras 3's
    ``update_step(gradient, variable, learning_rate)``, Keras 2's ``update_step(gradient,
    variable)``), now or when it is imported; returns the undo."""
    saved = []
    active = [True]

    def replace(name: str, key: str) -> Callable:
        def hook(module) -> None:
            if not active[0] or _targets.find(module, key) is None:
                return
            cls = getattr(module, name)
            original = cls.__dict__.get("update_step")
            if original is None:  # inherited: a subclass of another optimizer, not the one tfrepro replaces
                return
            arguments = len(inspect.signature(original).parameters) - 1
            saved.append((cls, original))
            cls.update_step = coverage.covered(_UPDATES[(name, 3 if arguments == 3 else 2)])

        return hook

    call_after_import({entry.module: replace(name, entry.key) for name, role in (("Adam", "adam"), ("SGD", "sgd"))
                       for entry in _targets.for_role(role)})

    def undo() -> None:
        active[0] = False
        for cls, original in reversed(saved):
            cls.update_step = original

    return undo
