"""The exact tier's recurrent cells (``tfrepro.ops.exact.recurrent``), in one process: the carry's
sum of products is the same bits compiled by XLA and not, the float64 sum of the exact products rounded,
and its gradient is TF's products bit for bit; Keras 3's ``LSTM`` trains under ``patch(ops="exact")``
with a clean audit, and tf-keras's, which runs its own traced step, is named before the first step
(the fresh-process runs across threads, oneDNN and XLA are in ``test_exact_training.py``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfrepro
from tfrepro.ops.exact import recurrent

pytestmark = pytest.mark.exact
RNG = np.random.default_rng(5)


def bits(x) -> bytes:
    return np.ascontiguousarray(np.asarray(x)).tobytes()


def _run(a, b, c, d, dy):
    with tf.GradientTape() as tape:
        tape.watch([a, b, c, d])
        y = recurrent.sum_of_products(a, b, c, d)
    return (y, *tape.gradient(y, [a, b, c, d], output_gradients=dy))


def test_the_carry_is_the_rounded_float64_sum_the_same_under_xla_and_its_gradient_is_tfs_products():
    a, b, c, d, dy = (tf.constant(RNG.standard_normal((16, 32)).astype(np.float32) * 10 ** RNG.uniform(-3, 3))
                      for _ in range(5))
    plain = _run(a, b, c, d, dy)
    compiled = tf.function(_run, jit_compile=True, autograph=False)(a, b, c, d, dy)
    assert all(bits(x) == bits(y) for x, y in zip(plain, compiled))
    wide = [v.numpy().astype(np.float64) for v in (a, b, c, d)]
    assert bits(plain[0]) == bits((wide[0] * wide[1] + wide[2] * wide[3]).astype(np.float32))
    for got, partner in zip(plain[1:], (b, a, d, c)):
        assert bits(got) == bits(dy * partner)


def test_keras_lstm_trains_with_a_clean_audit_or_is_named_by_its_traced_step(keras):
    x = RNG.standard_normal((40, 6, 5)).astype(np.float32)  # 40: the last batch is short
    keras2 = not keras.__version__.startswith("3")
    with tfrepro.patched(0, ops="exact"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if keras2:  # tf-keras traces its own step function (standard_lstm) as the layer is built
            with pytest.raises(RuntimeError, match=r"(?s)tfrepro exact tier.+'standard_lstm'.+AddV2"):
                keras.Sequential([keras.Input((6, 5)), keras.layers.LSTM(4)])
            return
        for implementation in (1, 2):  # Keras 3's default (one kernel), and split kernels
            model = keras.Sequential([keras.Input((6, 5)), keras.layers.LSTM(4, implementation=implementation),
                                      keras.layers.Dense(2)])
            model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(x, RNG.integers(0, 2, 40), batch_size=16, epochs=1, verbose=0)
            assert "every op covered" in str(tfrepro.status())


def test_the_carry_takes_one_dtype_and_shape():
    a = tf.ones([2, 3])
    with pytest.raises(TypeError, match="one dtype"):
        recurrent.sum_of_products(a, a, a, tf.ones([2, 3], tf.float64))
    with pytest.raises(ValueError, match="one shape"):
        recurrent.sum_of_products(a, a, a, tf.ones([3]))
