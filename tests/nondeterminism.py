"""Layers that inject the nondeterminism tfrepro must detect and locate (CPU stand-ins for GPU atomics)."""

import numpy as np


def _random_order(n):
    return np.random.default_rng().permutation(int(n)).astype(np.int32)  # unseeded: differs every call


def _random_noise(shape):
    return np.random.default_rng().normal(0.0, 1e-3, size=shape).astype(np.float32)


def make_layers(keras, tf):
    """Return (NondeterministicGradientDense, UnseededNoise) for the given Keras."""

    class NondeterministicGradientDense(keras.layers.Layer):
        """A bias-free Dense whose kernel gradient sums the per-example contributions sequentially in
        a fresh random order on every step, the way atomicAdd accumulates in thread-arrival order on
        a GPU. The forward pass and the gradient passed to earlier layers stay deterministic."""

        def __init__(self, units, shuffle=True, input_gradient=False, **kwargs):
            super().__init__(**kwargs)
            self.units, self.shuffle = units, shuffle  # shuffle=False: the same layer, deterministic
            self.input_gradient = input_gradient  # True: the gradient passed back is summed in random order too

        def build(self, input_shape):
            self.kernel = self.add_weight(name="kernel", shape=(int(input_shape[-1]), self.units),
                                          initializer="glorot_uniform")

        def call(self, inputs):
            @tf.custom_gradient
            def matmul(x, kernel):
                def grad(dy):
                    per_example = tf.einsum("bi,bj->bij", x, dy)
                    if self.shuffle:
                        per_example = tf.gather(per_example, tf.numpy_function(_random_order, [tf.shape(x)[0]], tf.int32))
                    summed = tf.scan(lambda acc, term: acc + term, per_example)[-1]
                    if not (self.shuffle and self.input_gradient):
                        return tf.matmul(dy, kernel, transpose_b=True), summed
                    per_unit = tf.einsum("bj,ij->jbi", dy, kernel)  # dx = sum over units, in random order
                    per_unit = tf.gather(per_unit, tf.numpy_function(_random_order, [tf.shape(dy)[1]], tf.int32))
                    return tf.scan(lambda acc, term: acc + term, per_unit)[-1], summed

                return tf.matmul(x, kernel), grad

            return matmul(inputs, tf.convert_to_tensor(self.kernel))

    class UnseededNoise(keras.layers.Layer):
        """Adds forward noise from an unseeded source that no seed controls."""

        def call(self, inputs):
            noise = tf.numpy_function(_random_noise, [tf.shape(inputs)], tf.float32)
            return inputs + tf.reshape(noise, tf.shape(inputs))

    return NondeterministicGradientDense, UnseededNoise


def make_noisy_gradient_dense(keras, tf):
    """A bias-free Dense whose kernel gradient gets noise from OS entropy (normal, 1e-3, times
    1 + |gradient|) on every step: a stand-in for GPU atomics whose difference always reaches the
    weights (an order-only difference can round to the same bits for many steps on some models).
    The noise grows with the gradient so that it survives float16: under mixed precision the
    gradient is loss-scaled (2**15) before the sum, and a fixed 1e-3 rounds away there in most
    steps (the zoo's doctor cell for mixed_float16 then saw nothing in about half the runs)."""
    base, _ = make_layers(keras, tf)

    class NoisyGradientDense(base):
        def call(self, inputs):
            @tf.custom_gradient
            def matmul(x, kernel):
                def grad(dy):
                    summed = tf.matmul(x, dy, transpose_a=True)
                    noise = tf.reshape(tf.numpy_function(_random_noise, [tf.shape(summed)], tf.float32), tf.shape(summed))
                    return tf.matmul(dy, kernel, transpose_b=True), summed + tf.cast(noise, summed.dtype) * (1 + tf.abs(summed))

                return tf.matmul(x, kernel), grad

            return matmul(inputs, tf.cast(self.kernel, inputs.dtype))

    return NoisyGradientDense
