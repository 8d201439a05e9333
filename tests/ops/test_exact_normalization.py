"""The exact tier's layer and batch normalisations (``tfrepro.ops.exact.normalization``), in one
process: the same bits compiled by XLA and not, forward and backward; invariant to the order of the
normalised elements and to splitting the batch; close to a float64 reference; and Keras's own
``LayerNormalization`` and ``BatchNormalization`` routed through them under ``patch(ops="exact")``,
with their audit clean, and what they do not cover left to Keras and named (the fresh-process runs
across threads, oneDNN, XLA and replicas are in ``test_exact_training.py``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfrepro
from tfrepro.ops.exact import normalization

pytestmark = pytest.mark.exact
RNG = np.random.default_rng(11)


def bits(x) -> bytes:
    return np.ascontiguousarray(np.asarray(x)).tobytes()


def _run(x, gamma, beta, dy, axes=(-1,)):
    with tf.GradientTape() as tape:
        tape.watch([x, gamma, beta])
        y = normalization.layer_normalization(x, gamma, beta, list(axes), 1e-3)
    return (y, *tape.gradient(y, [x, gamma, beta], output_gradients=dy))


def _reference(x, gamma, beta, dy, eps=1e-3):
    """The layer norm and its gradients in float64 (NumPy), over the last axis."""
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    inv = 1 / np.sqrt((centred**2).mean(-1, keepdims=True) + eps)
    xhat = centred * inv
    g = dy * gamma
    dx = inv * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    axes = tuple(range(x.ndim - 1))
    return xhat * gamma + beta, dx, (dy * xhat).sum(axes), dy.sum(axes)


def _data(shape=(6, 5, 64), spread=4.0):
    x = (RNG.standard_normal(shape) * spread + 3.0).astype(np.float32)
    gamma = (1 + 0.3 * RNG.standard_normal(shape[-1])).astype(np.float32)
    beta = (0.2 * RNG.standard_normal(shape[-1])).astype(np.float32)
    dy = RNG.standard_normal(shape).astype(np.float32)
    return x, gamma, beta, dy


def test_layer_norm_is_the_same_under_xla_and_close_to_float64():
    x, gamma, beta, dy = _data()
    plain = _run(*map(tf.constant, (x, gamma, beta, dy)))
    compiled = tf.function(_run, jit_compile=True, autograph=False)(*map(tf.constant, (x, gamma, beta, dy)))
    assert all(bits(a) == bits(b) for a, b in zip(plain, compiled))
    for ours, want in zip(plain, _reference(*(v.astype(np.float64) for v in (x, gamma, beta, dy)))):
        scale = np.abs(want).max()
        assert np.all(np.abs(ours.numpy() - want) <= np.spacing(np.abs(want).astype(np.float32)) + 2.0**-40 * scale)


def test_layer_norm_is_invariant_to_the_order_of_its_elements_and_to_the_batch_split():
    x, gamma, beta, dy = _data()
    y, dx, dgamma, dbeta = _run(*map(tf.constant, (x, gamma, beta, dy)))
    order = RNG.permutation(x.shape[-1])
    permuted = _run(*(tf.constant(v[..., order]) for v in (x, gamma, beta, dy)))
    assert bits(permuted[0]) == bits(y.numpy()[..., order]) and bits(permuted[1]) == bits(dx.numpy()[..., order])
    assert bits(permuted[2]) == bits(dgamma.numpy()[order]) and bits(permuted[3]) == bits(dbeta.numpy()[order])
    half = _run(*map(tf.constant, (x[:3], gamma, beta, dy[:3])))
    assert bits(half[0]) == bits(y[:3]) and bits(half[1]) == bits(dx[:3])
    reversed_batch = _run(*map(tf.constant, (x[::-1], gamma, beta, dy[::-1])))
    assert bits(reversed_batch[2]) == bits(dgamma) and bits(reversed_batch[3]) == bits(dbeta)


def test_several_axes_and_a_missing_scale_or_offset():
    x, gamma, beta, dy = _data((4, 3, 8))
    both = normalization.layer_normalization(tf.constant(x), None, None, [1, 2], 1e-3).numpy().astype(np.float64)
    flat = x.reshape(4, -1).astype(np.float64)
    want = ((flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + 1e-3)).reshape(x.shape)
    assert np.abs(both - want).max() <= 1e-6
    only_beta = normalization.layer_normalization(tf.constant(x), None, tf.constant(beta), [-1], 1e-3)
    only_gamma = normalization.layer_normalization(tf.constant(x), tf.constant(gamma), None, [-1], 1e-3)
    plain = normalization.layer_normalization(tf.constant(x), None, None, [-1], 1e-3)
    assert np.abs(only_beta.numpy() - (plain.numpy() + beta)).max() <= 1e-6
    assert np.abs(only_gamma.numpy() - plain.numpy() * gamma).max() <= 1e-6


def test_keras_layer_norm_runs_the_exact_op_and_its_audit_is_clean(keras):
    x = RNG.standard_normal((32, 6, 16)).astype(np.float32) * 3
    with tfrepro.patched(0, ops="exact"):
        layer = keras.layers.LayerNormalization(axis=-1, beta_initializer="ones")
        model = keras.Sequential([keras.Input((6, 16)), layer, keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(2)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, RNG.integers(0, 2, 32), batch_size=8, epochs=1, verbose=0)
        assert "every op covered" in str(tfrepro.status())
        gamma, beta = (tf.constant(v) for v in layer.get_weights())
        ours = layer(tf.constant(x))
    assert bits(ours) == bits(normalization.layer_normalization(tf.constant(x), gamma, beta, [-1], layer.epsilon))
    stock = layer(tf.constant(x))  # unpatched: Keras's own arithmetic, within float32's error of the same
    assert np.abs(stock.numpy() - ours.numpy()).max() <= 1e-5


def test_rms_scaling_runs_kerass_own_ops_which_the_audit_checks(keras):
    """Keras 3's ``rms_scaling`` is left to Keras's own ``call``, audited op by op: its ``x * inv * gamma``
    holds no multiply-add and its sums are the tier's, so on one device it is covered; a planted
    multiply-add after it is named."""
    if not hasattr(keras.layers.LayerNormalization(), "rms_scaling"):
        pytest.skip("rms_scaling is Keras 3's")
    x = RNG.standard_normal((16, 8)).astype(np.float32)
    with tfrepro.patched(0, ops="exact"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        norm = keras.layers.LayerNormalization(rms_scaling=True)
        model = keras.Sequential([keras.Input((8,)), norm, keras.layers.Dense(2)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, RNG.integers(0, 2, 16), batch_size=8, epochs=1, verbose=0)
        assert "every op covered" in str(tfrepro.status())
        y = norm(tf.constant(x)).numpy()
        want = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) - x.astype(np.float64).mean(1, keepdims=True) ** 2
                           + norm.epsilon) * norm.get_weights()[0]
        assert np.abs(y - want).max() <= 1e-5


def _batch_norm(x, gamma, beta, dy, training=True, moving=None, axes=(-1,)):
    with tf.GradientTape() as tape:
        tape.watch([x, gamma, beta])
        y, statistics = normalization.batch_normalization(x, gamma, beta, list(axes), 1e-3, training, moving)
    return (y, *tape.gradient(y, [x, gamma, beta], output_gradients=dy), *(statistics or ())[:2])


def test_batch_norm_is_the_same_under_xla_invariant_to_the_batch_order_and_close_to_float64():
    x, gamma, beta, dy = _data((8, 5, 5, 16))
    plain = _batch_norm(*map(tf.constant, (x, gamma, beta, dy)))
    compiled = tf.function(_batch_norm, jit_compile=True, autograph=False)(*map(tf.constant, (x, gamma, beta, dy)))
    assert all(bits(a) == bits(b) for a, b in zip(plain, compiled))
    order = RNG.permutation(8)
    shuffled = _batch_norm(*(tf.constant(v) for v in (x[order], gamma, beta, dy[order])))
    assert bits(shuffled[0]) == bits(plain[0].numpy()[order]) and bits(shuffled[1]) == bits(plain[1].numpy()[order])
    assert all(bits(a) == bits(b) for a, b in zip(shuffled[2:], plain[2:]))  # the weights' gradients, the statistics
    # the float64 reference: a layer norm of each channel's values (the batch transposed to [channel, values])
    rows = [np.moveaxis(v, -1, 0).reshape(16, -1).astype(np.float64) for v in (x, dy)]
    y, dx = (np.moveaxis(v.numpy(), -1, 0).reshape(16, -1) for v in plain[:2])
    want_y, want_dx, _, _ = _reference(rows[0], gamma[:, None].astype(np.float64), beta[:, None].astype(np.float64),
                                       rows[1])
    xhat = (rows[0] - rows[0].mean(1, keepdims=True)) / np.sqrt(rows[0].var(1, keepdims=True) + 1e-3)
    for got, want in ((y, want_y), (dx, want_dx), (plain[2], (rows[1] * xhat).sum(1)), (plain[3], rows[1].sum(1)),
                      (plain[4], rows[0].mean(1)), (plain[5], rows[0].var(1))):
        assert np.abs(np.asarray(got) - want).max() <= 2 * np.spacing(np.float32(np.abs(want).max())), got


def test_batch_norm_by_moving_statistics_and_over_the_channels_first_axis():
    x, _, _, dy = _data((4, 16, 3, 3))
    gamma, beta = _data((16,))[1:3]
    moving = (tf.constant(RNG.standard_normal(16)), tf.constant(RNG.uniform(0.5, 2, 16)))
    y, dx, dgamma, dbeta = _batch_norm(*map(tf.constant, (x, gamma, beta, dy)), training=False, moving=moving, axes=(1,))
    shape = (1, 16, 1, 1)
    inv = 1 / np.sqrt(moving[1].numpy().reshape(shape) + 1e-3)
    xhat = (x - moving[0].numpy().reshape(shape)) * inv
    assert np.abs(y.numpy() - (xhat * gamma.reshape(shape) + beta.reshape(shape))).max() <= 1e-5
    assert np.abs(dx.numpy() - dy * gamma.reshape(shape) * inv).max() <= 1e-5
    assert np.abs(dbeta.numpy() - dy.sum((0, 2, 3))).max() <= 1e-4


@pytest.mark.parametrize("channels_first", [False, True])
def test_keras_batch_norm_runs_the_exact_op_moving_statistics_included_and_its_audit_is_clean(keras, channels_first):
    """Keras's ``BatchNormalization`` in a conv net trained by ``fit``: its audit is clean; its output
    and moving statistics are the exact op's, within float32's error of Keras's own arithmetic."""
    shape = (6, 4, 4) if channels_first else (4, 4, 6)
    x = (RNG.standard_normal((32, *shape)) * 2 + 1).astype(np.float32)
    with tfrepro.patched(0, ops="exact"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        norm = keras.layers.BatchNormalization(axis=1 if channels_first else -1, momentum=0.5)
        model = keras.Sequential([keras.Input(shape), norm, keras.layers.Flatten(), keras.layers.Dense(2)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, RNG.integers(0, 2, 32), batch_size=32, epochs=1, verbose=0, shuffle=False)
        assert "every op covered" in str(tfrepro.status())
        moved = [w.copy() for w in norm.get_weights()[2:]]
        ours = norm(tf.constant(x), training=False)
    channel = 1 if channels_first else 3
    axes = tuple(a for a in range(4) if a != channel)
    variance = x.astype(np.float64).var(axes)
    if getattr(norm, "fused", False):  # Keras 2's fused kernel keeps the unbiased variance
        variance *= x.size / 6 / (x.size / 6 - 1)
    assert np.abs(moved[0] - 0.5 * x.astype(np.float64).mean(axes)).max() <= 1e-6
    assert np.abs(moved[1] - (0.5 + 0.5 * variance)).max() <= 1e-5
    stock = norm(tf.constant(x), training=False)  # unpatched: Keras's own arithmetic
    assert np.abs(stock.numpy() - ours.numpy()).max() <= 1e-5


def test_what_the_exact_batch_norm_does_not_cover_runs_kerass_own_call_which_the_audit_names(keras):
    """A masked or renormalising ``BatchNormalization`` is left to Keras's own ``call``: its float
    sums are named, with the layer, before the first step."""
    if "renorm" not in keras.layers.BatchNormalization.__init__.__code__.co_varnames and not hasattr(
            keras.layers.BatchNormalization(), "renorm"):
        pytest.skip("this Keras has no batch renormalisation")
    x = RNG.standard_normal((16, 8)).astype(np.float32)
    with tfrepro.patched(0, ops="exact"), warnings.catch_warnings(), pytest.raises(Exception) as raised:
        warnings.simplefilter("ignore")
        model = keras.Sequential([keras.Input((8,)), keras.layers.BatchNormalization(renorm=True, name="renormed"),
                                  keras.layers.Dense(2)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, RNG.integers(0, 2, 16), batch_size=8, epochs=1, verbose=0)
    assert "tfrepro exact tier" in str(raised.value) and "renormed" in str(raised.value), str(raised.value)[:2000]
