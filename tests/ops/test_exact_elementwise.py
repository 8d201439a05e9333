"""The exact tier's elementwise ops (``tfrepro.ops.exact.activations``, ``transcendental`` and the
sigmoid cross-entropy), in one process: each gives the same bits compiled by XLA and not, forward
and backward; each is within an ulp of a float64 reference (its gradient within an ulp plus the
float64 work's own rounding); IEEE's special values come out as TF's; and TF's own kernels, the
negative control, change bits under XLA on this CPU."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfrepro
from tfrepro.ops.exact import _elementary, activations, losses, transcendental

RNG = np.random.default_rng(7)
_SQRT2 = math.sqrt(2.0)
_ERFC = np.vectorize(math.erfc)
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _sigmoid(x):
    return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


def _cdf(x):
    return 0.5 * _ERFC(-x / _SQRT2)


def _gelu_tanh_parts(x):
    c = math.sqrt(2 / math.pi)
    two_u = 2 * c * (x + 0.044715 * x**3)
    return _sigmoid(two_u), 2 * c * (1 + 3 * 0.044715 * x**2), two_u


# name -> (the tier's op, float64 value, float64 derivative, where the inputs lie)
OPS = {
    "tanh": (activations.tanh, np.tanh, lambda x: 1 / np.cosh(x) ** 2, 40),
    "sigmoid": (activations.sigmoid, _sigmoid, lambda x: _sigmoid(x) * _sigmoid(-x), 40),
    "silu": (activations.silu, lambda x: x * _sigmoid(x), lambda x: _sigmoid(x) * (1 + x * _sigmoid(-x)), 40),
    "gelu": (activations.gelu, lambda x: x * _cdf(x), lambda x: _cdf(x) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi), 12),
    "gelu_tanh": (lambda x: activations.gelu(x, approximate=True),
                  lambda x: x * _gelu_tanh_parts(x)[0],
                  lambda x: (lambda s, slope, two_u: s + x * slope * s * _sigmoid(-two_u))(*_gelu_tanh_parts(x)), 8),
    "elu": (activations.elu, lambda x: np.where(x > 0, x, np.expm1(x)), lambda x: np.where(x > 0, 1.0, np.exp(x)), 20),
    "selu": (activations.selu, lambda x: _SELU_SCALE * np.where(x > 0, x, _SELU_ALPHA * np.expm1(x)),
             lambda x: _SELU_SCALE * np.where(x > 0, 1.0, _SELU_ALPHA * np.exp(x)), 20),
    "softplus": (activations.softplus, lambda x: np.logaddexp(0, x), _sigmoid, 40),
    "exp": (transcendental.exp, np.exp, np.exp, 80),
    "expm1": (transcendental.expm1, np.expm1, np.exp, 80),
    "log": (transcendental.log, np.log, lambda x: 1 / x, 0),
    "log1p": (transcendental.log1p, np.log1p, lambda x: 1 / (1 + x), -1),
    "rsqrt": (transcendental.rsqrt, lambda x: 1 / np.sqrt(x), lambda x: -0.5 * x**-1.5, 0),
}


def bits(x) -> bytes:
    return np.ascontiguousarray(np.asarray(x)).tobytes()


def _inputs(spread: float) -> np.ndarray:
    """Values over the op's domain (``spread`` > 0: [-spread, spread]; 0: positive; -1: above -1),
    tiny ones and the points where the implementations change method."""
    if spread > 0:
        x = np.concatenate([RNG.uniform(-spread, spread, 20_000), RNG.standard_normal(5_000),
                            [0.0, 1e-30, -1e-30, 1e-8, -1e-8, 0.35, -0.35, 0.3499999, 2.0 * _SQRT2, -2.0 * _SQRT2]])
    elif spread == 0:
        x = np.concatenate([np.exp(RNG.uniform(-80, 80, 20_000)), [1.0, 2.0, 1e-30, 1.4142135, 1.4142137]])
    else:
        x = np.concatenate([np.expm1(RNG.uniform(-16, 16, 20_000)), [0.0, 1e-30, -0.29, -0.2900001, 0.41421354]])
    return x.astype(np.float32)


@pytest.mark.parametrize("name", OPS)
def test_each_op_is_the_same_under_xla_and_within_an_ulp_of_float64(name):
    op, value, derivative, spread = OPS[name]
    x = _inputs(spread)
    dy = RNG.standard_normal(x.shape).astype(np.float32)

    def run(v, upstream):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = op(v)
        return y, tape.gradient(y, v, output_gradients=upstream)

    y, grad = run(tf.constant(x), tf.constant(dy))
    compiled = tf.function(run, jit_compile=True, autograph=False)(tf.constant(x), tf.constant(dy))
    assert bits(y) == bits(compiled[0]) and bits(grad) == bits(compiled[1])
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", divide="ignore"):
        want, slope = value(x64), derivative(x64)
    normal = (np.abs(want) >= np.finfo(np.float32).tiny) & (np.abs(want) < np.finfo(np.float32).max)
    # within an ulp: the float64 result is far closer than that, so it rounds to one of the two floats around it
    assert np.all(np.abs(y.numpy()[normal] - want[normal]) <= np.spacing(np.abs(want[normal]).astype(np.float32)))
    want_grad = dy * slope
    normal = (np.abs(want_grad) >= np.finfo(np.float32).tiny) & (np.abs(want_grad) < np.finfo(np.float32).max)
    bound = np.spacing(np.abs(want_grad[normal]).astype(np.float32)) + 1e-12 * np.abs(want_grad[normal])
    assert np.all(np.abs(grad.numpy()[normal] - want_grad[normal]) <= bound)


KERNELS = ("exp", "expm1", "log", "log1p", "tanh_parts", "sigmoid_parts", "erfc", "normal_cdf", "normal_pdf")


@pytest.mark.parametrize("name", KERNELS)
def test_each_float64_kernel_gives_the_bits_of_its_uncompiled_ops(name):
    """Each elementary function runs as one XLA kernel; op by op, on TF's own kernels (eagerly: no
    graph rewrites), it gives the same bits, special values included: compiling changed nothing,
    and no multiply-add was fused (every product goes through the barrier)."""
    function = getattr(_elementary, name)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, -1e-300, 5e-324, 708.0, -708.5, -745.5, 710.0]
    x = np.concatenate([RNG.uniform(-30, 30, 4_000), RNG.standard_normal(2_000) * 1e-3, special])
    if name in ("log", "log1p", "erfc"):  # their domains (log1p above -1; erfc from 0); any_log and gelu guard them
        x = np.abs(x) + (1e-300 if name == "log" else 0.0)
    compiled, by_op = function(tf.constant(x)), function.__wrapped__(tf.constant(x))
    for a, b in zip(tf.nest.flatten(compiled), tf.nest.flatten(by_op)):
        assert bits(a) == bits(b), name


def test_special_values_are_tfs():
    special = tf.constant([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0], tf.float32)
    for name, (op, _, _, _) in OPS.items():
        stock = {"gelu_tanh": lambda v: tf.nn.gelu(v, approximate=True)}.get(name) or getattr(tf.nn, name, None) \
            or getattr(tf.math, name)
        ours, theirs = op(special).numpy(), stock(special).numpy()
        assert np.array_equal(np.isnan(ours), np.isnan(theirs)), (name, ours, theirs)
        finite = ~np.isnan(theirs)
        finite[-1] = False  # -1.0: a NaN where TF's is; elsewhere an ordinary value (within an ulp, above)
        assert np.array_equal(ours[finite], theirs[finite]), (name, ours, theirs)
        assert np.array_equal(np.signbit(ours[finite]), np.signbit(theirs[finite])), (name, ours, theirs)


def test_half_precisions_compute_and_float64_runs_tfs_op():
    x = RNG.uniform(-4, 4, 1000)
    for dtype in (tf.float16, tf.bfloat16):
        ours = activations.tanh(tf.constant(x, dtype))
        assert ours.dtype == dtype
        assert np.abs(ours.numpy().astype(np.float64) - np.tanh(tf.cast(tf.constant(x, dtype), tf.float64).numpy())).max() \
            <= 2.0 ** -(8 if dtype == tf.bfloat16 else 11)
    assert bits(activations.gelu(tf.constant(x))) == bits(tf.nn.gelu(tf.constant(x)))  # float64: TF's op


def test_sigmoid_cross_entropy_is_the_same_under_xla_and_accurate():
    logits = (RNG.standard_normal((256, 8)) * 6).astype(np.float32)
    labels = RNG.uniform(0, 1, (256, 8)).astype(np.float32)

    def run(z, y):
        with tf.GradientTape() as tape:
            tape.watch([z, y])
            loss = losses.sigmoid_cross_entropy_with_logits(labels=y, logits=z)
        return (loss, *tape.gradient(loss, [z, y]))

    plain = run(tf.constant(logits), tf.constant(labels))
    compiled = tf.function(run, jit_compile=True, autograph=False)(tf.constant(logits), tf.constant(labels))
    assert all(bits(a) == bits(b) for a, b in zip(plain, compiled))
    z, y = logits.astype(np.float64), labels.astype(np.float64)
    want = np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
    assert np.all(np.abs(plain[0].numpy() - want) <= np.spacing(want.astype(np.float32)))
    assert np.all(np.abs(plain[1].numpy() - (_sigmoid(z) - y)) <= np.spacing(np.abs(_sigmoid(z) - y).astype(np.float32)))
    assert bits(plain[2]) == bits(-logits)
    stock = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits).numpy()
    assert np.abs(stock - plain[0].numpy()).max() <= 1e-5


@pytest.mark.parametrize("stock", [tf.math.tanh, tf.math.sigmoid, tf.nn.gelu, tf.math.log1p],
                         ids=["tanh", "sigmoid", "gelu", "log1p"])
def test_tfs_kernels_change_bits_under_xla_negative_control(stock):
    """What the tier removes: TF's own kernels and XLA's round differently on this CPU."""
    x = tf.constant(RNG.uniform(0 if stock is tf.math.log1p else -6, 6, 200_000).astype(np.float32))
    assert bits(tf.function(stock, jit_compile=True, autograph=False)(x)) != bits(stock(x))


def test_a_second_order_gradient_through_an_activation_is_refused_by_name():
    x = tf.constant(RNG.standard_normal(8).astype(np.float32))

    def penalty():
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf.reduce_sum(tf.math.tanh(x))
            g = tf.reduce_sum(inner.gradient(y, x))
        return outer.gradient(g, x)

    assert float(tf.reduce_max(tf.abs(penalty()))) > 0  # TF's op: a real second-order gradient
    with tfrepro.patched(0, ops="exact", on_uncovered="warn"), warnings.catch_warnings():
        warnings.simplefilter("ignore", tfrepro.ReproducibilityWarning)
        with pytest.raises(NotImplementedError, match="second-order gradient through ExactTanh"):
            penalty()


def test_a_trainable_beta_runs_tfs_swish_and_other_tensors_reach_tfs_dispatch():
    beta = tf.Variable(1.5)
    x = tf.constant(RNG.standard_normal(16).astype(np.float32))
    assert bits(activations.silu(x, beta=beta)) == bits(tf.nn.silu(x, beta=beta))
    ragged = tf.ragged.constant([[0.5], [1.0, -2.0]])
    assert activations.tanh(ragged).to_list() == tf.math.tanh(ragged).to_list()
    assert transcendental.exp(ragged).to_list() == tf.math.exp(ragged).to_list()


def test_subnormal_results_flush_to_zero_as_tfs_kernels_do_and_half_precisions_round_through_float32():
    x = tf.constant([-100.0, -95.5, -88.0, 100.0], tf.float32)
    assert bits(transcendental.exp(x)) == bits(tf.exp(x))
    assert bits(activations.sigmoid(x)) == bits(tf.math.sigmoid(x))
    assert bits(transcendental.exp(x))[:4] == bits(np.float32(0.0))  # exp(-100) is subnormal in float32: 0
    for dtype in (tf.float16, tf.bfloat16):
        h = tf.constant(RNG.uniform(-8, 8, 4096), dtype)
        for op in (activations.tanh, activations.gelu, transcendental.exp):
            assert bits(op(h)) == bits(tf.function(op, jit_compile=True, autograph=False)(h)), (op, dtype)


def test_rounding_to_bfloat16_is_tfs_cast_bit_for_bit_and_the_same_under_xla():
    """The tier rounds float32 to bfloat16 on the bits (``_fixed.narrow``): the next XLA did not finish
    compiling a float64 GELU's convert to bfloat16. Every kind of float32: random bit patterns, ties,
    subnormals, the largest finite (rounds to infinity), infinities and NaNs of both signs."""
    from tfrepro.ops.exact import _fixed

    special = [0, 0x80000000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
               0xFFC00001, 1, 0x8000FFFF, 0x00008000, 0x00018000, 0x3F808000, 0x3F818000, 0xBF818000]
    patterns = np.concatenate([RNG.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32),
                               np.array(special, np.uint32)])
    x = tf.constant(patterns.view(np.float32))
    theirs = tf.cast(x, tf.bfloat16)
    ours = _fixed.narrow(x, tf.bfloat16)
    assert ours.dtype == tf.bfloat16 and bits(ours) == bits(theirs)
    assert bits(tf.function(lambda v: _fixed.narrow(v, tf.bfloat16), jit_compile=True)(x)) == bits(theirs)


def test_keras_activations_and_binary_cross_entropies_train_with_a_clean_audit(keras):
    """Every activation by name, the binary cross-entropy from logits and from a sigmoid output."""
    x = RNG.standard_normal((64, 8)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    with tfrepro.patched(0, ops="exact"):
        for activations_, head, loss in (
                (("tanh", "sigmoid", "gelu", "swish", "elu", "selu", "softplus", "exponential"), None,
                 keras.losses.BinaryCrossentropy(from_logits=True)),
                (("relu",), "sigmoid", "binary_crossentropy")):
            model = keras.Sequential([keras.Input((8,)), *(keras.layers.Dense(8, activation=a) for a in activations_),
                                      keras.layers.Dense(1, activation=head)])
            model.compile("adam", loss)
            model.fit(x, y, batch_size=16, epochs=1, verbose=0)
            assert "every op covered" in str(tfrepro.status())
            assert np.isfinite(model.evaluate(x, y, verbose=0))
