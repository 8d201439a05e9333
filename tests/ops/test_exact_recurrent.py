"""The exact tier's recurrent cells (``tfrepro.ops.exact.recurrent``), in one process: the carry's
sum of products is the same bits compiled by XLA and not, the float64 sum of the exact products rounded,
and its gradient is TF's products bit for bit; a Keras 3 LSTM step in one kernel gives the bits of
the tier's ops one by one; Keras 3's ``LSTM`` trains under ``patch(ops="exact")``
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


def test_a_keras3_lstm_steps_in_one_kernel_with_the_bits_of_the_tiers_ops_one_by_one(keras, monkeypatch):
    """``lstm_step`` (one XLA kernel forward, one backward) against the same cell with its elementwise
    part as the tier's ops one by one: the outputs and every gradient, bit for bit, with XLA off and
    on; gates driven into both tails, input dropout, both directions of a Bidirectional layer."""
    if not keras.__version__.startswith("3"):
        pytest.skip("Keras 3's LSTMCell: tf-keras's layer runs its own traced step (named by the audit)")
    x = RNG.standard_normal((16, 7, 5)).astype(np.float32) * 3
    x[::4] *= 30  # saturated gates: sigmoid and tanh in their tails
    x, head = tf.constant(x), tf.constant(RNG.standard_normal((12, 3)).astype(np.float32))

    steps = []

    def counted(*args):
        steps.append(args)
        return one_step(*args)

    one_step = recurrent.lstm_step

    def run(one_kernel: bool, jit: bool) -> list[bytes]:
        monkeypatch.setattr(recurrent, "lstm_step", counted)
        if not one_kernel:
            monkeypatch.setattr(recurrent, "_one_kernel", lambda *args: False)
        keras.utils.set_random_seed(1)
        layer = keras.layers.Bidirectional(keras.layers.LSTM(6, return_sequences=True, dropout=0.2))
        layer(x[:1])

        @tf.function(jit_compile=jit)
        def step(x):
            with tf.GradientTape() as tape:
                y = layer(x, training=True)  # a product's gradient would feed the step's add (named)
                loss = tf.reduce_sum(tf.linalg.matmul(tf.reshape(y, [-1, 12]), head))
            return y, tape.gradient(loss, layer.trainable_variables)

        try:
            y, gradients = step(x)
        finally:
            monkeypatch.undo()
        return [bits(v) for v in (y, *gradients)]

    with tfrepro.patched(0, ops="exact"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for jit in (False, True):
            fused = run(True, jit)
            assert steps, "the one-kernel step did not run"
            steps.clear()
            assert fused == run(False, jit)
            assert not steps


def test_a_cell_subclass_with_its_own_gates_keeps_them(keras, monkeypatch):
    """A subclass that overrides what Keras's ``call`` reads (here the gates) is not stepped in one
    kernel, which would drop its override: it runs its own code, op by op."""
    if not keras.__version__.startswith("3"):
        pytest.skip("Keras 3's LSTMCell")
    calls, steps = [], []
    monkeypatch.setattr(recurrent, "lstm_step", lambda *args: steps.append(args))

    class BiasedForget(keras.layers.LSTMCell):
        def _compute_carry_and_output_fused(self, z, c_tm1):
            calls.append(z)
            return super()._compute_carry_and_output_fused((z[0], z[1] + 1.0, z[2], z[3]), c_tm1)

    with tfrepro.patched(0, ops="exact"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = keras.layers.RNN(BiasedForget(4))
        layer(tf.constant(RNG.standard_normal((2, 3, 5)).astype(np.float32)))
    assert calls and not steps


def test_a_second_order_gradient_through_an_lstm_step_is_refused_by_name():
    z, c = (tf.constant(RNG.standard_normal(shape).astype(np.float32)) for shape in ((4, 12), (4, 3)))
    with tf.GradientTape() as outer:
        outer.watch(z)
        with tf.GradientTape() as inner:
            inner.watch(z)
            h, _ = recurrent.lstm_step(z, c)
        dz = inner.gradient(h, z)
    with pytest.raises(NotImplementedError, match="second-order gradient through an LSTM cell"):
        outer.gradient(dz, z)
    with pytest.raises(TypeError, match="lstm_step takes float32"):
        recurrent.lstm_step(tf.cast(z, tf.float16), tf.cast(c, tf.float16))


def test_the_carry_takes_one_dtype_and_shape():
    a = tf.ones([2, 3])
    with pytest.raises(TypeError, match="one dtype"):
        recurrent.sum_of_products(a, a, a, tf.ones([2, 3], tf.float64))
    with pytest.raises(ValueError, match="one shape"):
        recurrent.sum_of_products(a, a, a, tf.ones([3]))
    with pytest.raises(TypeError, match="one dtype"):
        recurrent.product(a, tf.ones([2, 3], tf.float64))


def _product(a, b, dy):
    with tf.GradientTape() as tape:
        tape.watch([a, b])
        y = recurrent.product(a, b)
    return (y, *tape.gradient(y, [a, b], output_gradients=dy))


def test_a_second_order_gradient_through_a_product_is_refused_by_name():
    """d(dy/da)/db is b's partner's gradient differentiated: eagerly too, it raises by name (a
    fixed-point path alone cuts the tape, which then gave None silently)."""
    a, b = tf.constant([[1.5, -2.0]]), tf.constant([[0.25, 3.0]])
    with tf.GradientTape() as outer:
        outer.watch([a, b])
        with tf.GradientTape() as inner:
            inner.watch(a)
            y = recurrent.product(a, b)
        first = inner.gradient(y, a)
    with pytest.raises(NotImplementedError, match="second-order gradient through a GRU cell"):
        outer.gradient(first, b)


def test_a_product_is_tfs_the_same_under_xla_and_its_gradient_is_tfs_products():
    a, b, dy = (tf.constant(RNG.standard_normal((16, 32)).astype(np.float32) * 10 ** RNG.uniform(-3, 3))
                for _ in range(3))
    plain = _product(a, b, dy)
    compiled = tf.function(_product, jit_compile=True, autograph=False)(a, b, dy)
    assert all(bits(x) == bits(y) for x, y in zip(plain, compiled))
    assert bits(plain[0]) == bits(a * b)
    assert bits(plain[1]) == bits(dy * b) and bits(plain[2]) == bits(dy * a)


@pytest.mark.parametrize("reset_after", [True, False])
def test_keras3_gru_step_is_kerass_own_with_xla_off_and_the_same_compiled(keras, reset_after):
    """The tier's GRU step computes Keras's own step's values (its products are TF's, made opaque to
    XLA), forward and backward, bit for bit; compiled by XLA it gives the same bits."""
    if not keras.__version__.startswith("3"):
        pytest.skip("tf-keras's GRU runs its own traced step (standard_gru), which the audit names")
    x, h = (tf.constant(RNG.standard_normal(shape).astype(np.float32)) for shape in ((16, 5), (16, 8)))
    with tfrepro.patched(0, ops="exact"):
        cell = keras.layers.GRUCell(8, reset_after=reset_after)
        cell.build((16, 5))
        hooked = type(cell).call
        assert hooked.__wrapped__ is not hooked

        def step(call, x, h):
            with tf.GradientTape() as tape:
                tape.watch([x, h])
                out, _ = call(cell, x, [h])
            return (out, *tape.gradient(out, [x, h, *cell.trainable_weights]))

        ours = step(hooked, x, h)
        kerass = step(hooked.__wrapped__, x, h)
        compiled = tf.function(lambda x, h: step(hooked, x, h), jit_compile=True, autograph=False)(x, h)
    assert len(ours) == 6 and all(bits(a) == bits(b) for a, b in zip(ours, kerass))  # h; x, h, 3 weights
    assert all(bits(a) == bits(b) for a, b in zip(ours, compiled))


def test_keras_gru_trains_with_a_clean_audit_or_is_named_by_its_traced_step(keras):
    x = RNG.standard_normal((40, 6, 5)).astype(np.float32)
    keras2 = not keras.__version__.startswith("3")
    with tfrepro.patched(0, ops="exact"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if keras2:
            with pytest.raises(RuntimeError, match=r"(?s)tfrepro exact tier.+gru"):
                keras.Sequential([keras.Input((6, 5)), keras.layers.GRU(4)])
            return
        for options in ({"reset_after": False}, {"dropout": 0.2}):
            model = keras.Sequential([keras.Input((6, 5)), keras.layers.GRU(4, **options), keras.layers.Dense(2)])
            model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(x, RNG.integers(0, 2, 40), batch_size=16, epochs=1, verbose=0)
            assert "every op covered" in str(tfrepro.status())
        # recurrent dropout runs Keras's own step (implementation 1): named before the first step
        model = keras.Sequential([keras.Input((6, 5)), keras.layers.GRU(4, recurrent_dropout=0.2),
                                  keras.layers.Dense(2)])
        model.compile("adam", "mse")
        with pytest.raises(tfrepro.UncoveredOpError, match="gru"):
            model.fit(x, RNG.standard_normal((40, 2)).astype(np.float32), batch_size=16, epochs=1, verbose=0)
