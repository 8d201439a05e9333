"""The gradient piece of ``ReproducibilityCallback``: fingerprints every gradient the optimizer
applies, inside the traced train step."""

from __future__ import annotations

from typing import Any

from tfrepro import _tf
from tfrepro.proof.fingerprints import gradient_fingerprints, to_hex


class GradientHook:
    """Wraps ``model.optimizer.apply_gradients`` (Keras 3 and tf_keras both call it from the train
    step) so that the train step also writes each gradient's fingerprint to a variable.
    ``remove()`` restores the optimizer; both rebuild the train function."""

    def __init__(self, model: Any):
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError("gradients=True needs a compiled model (model.optimizer is None)")
        self.model = model
        self._optimizer = optimizer
        self._prints: Any = None  # tf.Variable [n_variables, 2] int32, written by the train step
        tf = _tf.import_tf()
        if getattr(optimizer.__dict__.get("apply_gradients"), "tfrepro_hook", False):
            del optimizer.apply_gradients  # left by a fit that ended without on_train_end (an exception)
        original = optimizer.apply_gradients

        def apply_gradients(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            pairs = list(grads_and_vars)
            if tf.distribute.has_strategy():
                raise ValueError("ReproducibilityCallback(gradients=True) does not support tf.distribute "
                                 "strategies; use gradients=False")
            position = {id(w): i for i, w in enumerate(model.trainable_weights)}
            ordered = sorted(pairs, key=lambda pair: position.get(id(pair[1]), len(position)))
            prints = gradient_fingerprints(tf, [g for g, _ in ordered])
            with tf.init_scope():  # a plain eager variable, outside the traced function
                if self._prints is None or self._prints.shape[0] != len(ordered):
                    self._prints = tf.Variable(tf.zeros([len(ordered), 2], tf.int32), trainable=False)
            self._prints.assign(prints)
            return original(pairs, *args, **kwargs)

        apply_gradients.tfrepro_hook = True
        optimizer.apply_gradients = apply_gradients
        model.train_function = None  # retrace so that the train step calls the wrapper

    def fingerprints(self) -> list[str | None] | None:
        """The last step's gradient fingerprints, one per model weight (None for non-trainable
        weights), or None before the first step."""
        if self._prints is None:
            return None
        trainable = {id(w) for w in self.model.trainable_weights}
        prints = iter(to_hex(pair) for pair in self._prints.numpy())
        return [next(prints) if id(w) in trainable else None for w in self.model.weights]

    def remove(self) -> None:
        del self._optimizer.apply_gradients  # the instance attribute; the class method shows again
        self.model.train_function = None
