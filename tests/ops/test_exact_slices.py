"""The exact tier's float32-slice products (``tfrepro.ops.exact.slices``): the same bits as the
float64 path over shapes, magnitudes, K (across the chunk size), dtypes and special values, in
products, their gradients and the convolutions built on them, eager and compiled by XLA; and no
float64 tensor in the float32 path's kernels (what a GPU that runs float64 slowly would run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tfrepro
from conftest import clean_env
from tfrepro.ops.exact import _fixed, convolutions, linalg, slices

GPU_CHECK = Path(__file__).resolve().parents[2] / "bench" / "exact_gpu_check.py"


def bits(x) -> bytes:
    return np.ascontiguousarray(np.asarray(x)).tobytes()


def both_paths(compute):
    """``compute()`` under the float64 path and under the float32 slices (kernels are cached per path)."""
    results = []
    for path in ("float64", "float32"):
        with mock.patch.dict(os.environ, {slices.ENV: path}):
            results.append(compute())
    return results


def _data(rng: np.random.Generator, shape, spread: int, dtype: str) -> np.ndarray:
    """Normal data times powers of two over ``spread`` binades per row, zeros and exact ties sprinkled in."""
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread + 1, shape[:-1] + (1,))
    x[rng.random(shape) < 0.05] = 0.0
    x[rng.random(shape) < 0.05] = 0.5 * np.sign(rng.standard_normal()) * 2.0 ** rng.integers(-3, 3)
    return x.astype(dtype)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 24), n=st.integers(1, 20),
       k=st.sampled_from([1, 2, 7, 128, 129, 500, 1023, 1024, 1025, 2048, 2500]), spread=st.integers(0, 40),
       dtype=st.sampled_from(["float32", "float16", "bfloat16", "float64"]), batch=st.booleans())
def test_slices_give_the_bits_of_the_float64_path(seed, m, n, k, spread, dtype, batch):
    rng = np.random.default_rng(seed)
    lead = (2,) if batch else ()
    a, b = _data(rng, lead + (m, k), spread, "float32"), _data(rng, lead + (k, n), spread // 2, "float32")
    a, b = (tf.cast(x, dtype) for x in (a, b))
    wide, sliced = both_paths(lambda: _fixed.exact_matmul(a, b).numpy())
    assert bits(sliced) == bits(wide)


def test_extreme_magnitudes_and_special_values_give_the_same_bits():
    """Rows near float32's largest and smallest normals, subnormals, signed zeros, NaN and infinity
    (NaN rows and columns), and the largest quantised integer (a row of equal magnitudes)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 300)).astype(np.float32)
    a[0] *= 2.0**100
    a[1] *= 2.0**-120
    a[2, :5] = [1e-40, -1e-42, -0.0, 0.0, 3e-39]
    a[3, 7] = np.nan
    a[4, 9] = np.inf
    a[5] = 1.0
    a[6] = -(2.0**127)
    b = rng.standard_normal((300, 6)).astype(np.float32)
    b[:, 1] = 2.0**-100
    b[3, 2] = -np.inf
    wide, sliced = both_paths(lambda: _fixed.exact_matmul(a, b).numpy())
    assert bits(sliced) == bits(wide)
    assert np.isnan(sliced[3]).all() and np.isnan(sliced[:, 2]).all()


def test_the_largest_digits_over_the_longest_chunk_give_the_same_bits():
    """Every digit product at its largest (127 * 127, all of one sign) over K = 2047: each chunk's
    float32 sum below 2**24, where K = 2047 in one chunk would be an odd integer above 2**24, which
    float32 cannot hold."""
    largest = (127 * 2**16 + 127 * 2**8 + 127) / 2**23  # quantised to 127 * (2**16 + 2**8 + 1): three digits of 127
    a, b = np.full((3, 2047), largest, np.float32), np.full((2047, 2), largest, np.float32)
    wide, sliced = both_paths(lambda: _fixed.exact_matmul(a, b).numpy())
    assert bits(sliced) == bits(wide)
    assert wide[0, 0] == np.float32(2047 * np.float64(largest) ** 2)


def test_digits_of_128_fill_a_chunk_to_exactly_2_to_the_24():
    """The largest quantised integers, ``|q| = 2**23`` (values just below a power of two round up to
    it), whose high digit is 128: each chunk of 1,024 sums to 2**24 exactly."""
    largest = np.float32(1 - 2.0**-24)  # quantised to 2**23: digits (0, 0, 128)
    for k in (1024, 2048):
        a, b = np.full((2, k), largest, np.float32), np.full((k, 3), -largest, np.float32)
        wide, sliced = both_paths(lambda: _fixed.exact_matmul(a, b).numpy())
        assert bits(sliced) == bits(wide)
        assert wide[0, 0] == -k  # each value quantised to 2**23 / 2**23 = 1 (within the documented bound)


def test_rows_whose_largest_value_is_subnormal_give_the_same_bits():
    """A row's scale from a subnormal maximum: the float32 path's two power-of-two factors against the
    float64 path's exact upcast (whatever the CPU does with subnormal inputs, both paths agree)."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((4, 50)).astype(np.float32)
    a[0] = (rng.standard_normal(50) * 1e-39).astype(np.float32)  # every element subnormal or zero
    a[1] = (rng.standard_normal(50) * 2.0**-126).astype(np.float32)
    b = rng.standard_normal((50, 3)).astype(np.float32)
    b[:, 0] = (rng.standard_normal(50) * 1e-40).astype(np.float32)
    wide, sliced = both_paths(lambda: _fixed.exact_matmul(a, b).numpy())
    assert bits(sliced) == bits(wide)


def test_one_product_at_two_ranks_gives_the_same_bits():
    """A kernel traced at rank 2 and then at rank 3 with the same K (a Dense layer and an attention
    product): each rank has its own traced kernel, on either path."""
    rng = np.random.default_rng(6)
    for k in (300, 3000):
        flat = rng.standard_normal((5, k)).astype(np.float32), rng.standard_normal((k, 4)).astype(np.float32)
        batched = rng.standard_normal((2, 5, k)).astype(np.float32), rng.standard_normal((2, k, 4)).astype(np.float32)
        wide, sliced = both_paths(lambda: [bits(_fixed.exact_matmul(*flat)), bits(_fixed.exact_matmul(*batched))])
        assert sliced == wide


def test_gradients_and_xla_compiled_steps_give_the_same_bits():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((33, 1500)).astype(np.float32), rng.standard_normal((1500, 17)).astype(np.float32)

    def step(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = linalg.matmul(x, w)
            loss = tf.reduce_sum(y * y)
        return [y, *tape.gradient(loss, [x, w])]

    def run():
        eager = step(tf.constant(x), tf.constant(w))
        compiled = tf.function(step, jit_compile=True)(tf.constant(x), tf.constant(w))
        return [bits(t) for t in eager + compiled]

    wide, sliced = both_paths(run)
    assert sliced == wide
    assert wide[:3] == wide[3:]  # XLA's compile of the step changes no bit either


@pytest.mark.parametrize("strides, padding", [((1, 1), "SAME"), ((2, 2), "VALID")])
def test_convolutions_forward_and_backward_give_the_same_bits(strides, padding):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((3, 9, 9, 4)).astype(np.float32), rng.standard_normal((3, 3, 4, 5)).astype(np.float32)

    def run():
        xs, ws = tf.constant(x), tf.constant(w)
        with tf.GradientTape() as tape:
            tape.watch([xs, ws])
            y = convolutions.convolution(xs, ws, strides=strides, padding=padding)
        return [bits(t) for t in [y, *tape.gradient(y, [xs, ws])]]

    wide, sliced = both_paths(run)
    assert sliced == wide


def test_an_unknown_k_gives_the_same_bits():
    """K known only when the step runs (a ``tf.function`` traced with unknown shapes): chunked at run time."""
    rng = np.random.default_rng(4)
    spec = [tf.TensorSpec([None, None], tf.float32)] * 2
    for k in (5, 1024, 3000):
        a, b = rng.standard_normal((6, k)).astype(np.float32), rng.standard_normal((k, 4)).astype(np.float32)
        wide, sliced = both_paths(lambda: bits(tf.function(_fixed.exact_matmul, input_signature=spec)(a, b)))
        assert sliced == wide


@settings(max_examples=50, deadline=None)
@given(q=st.lists(st.integers(-(2**23), 2**23), min_size=1, max_size=64))
def test_digits_are_exact_and_small(q):
    values = tf.constant(np.array(q, np.float32))
    low, middle, high = (d.numpy().astype(np.int64) for d in slices.digits(values))
    assert np.array_equal(high * 2**16 + middle * 2**8 + low, np.array(q))
    assert max(np.abs(d).max() for d in (low, middle, high)) <= 2**7


def _dtypes_in(function) -> set[str]:
    graph = function.graph
    return {tf.as_dtype(t.dtype).name for op in graph.get_operations() for t in (*op.inputs, *op.outputs)}


def test_the_float32_path_holds_no_float64_tensor():
    """What a GPU runs under the float32 path: every tensor of a float32 product's kernels, forward
    and replica-free, is float32 or an integer (the float64 path's, the control, holds float64)."""
    def kernel_dtypes(k):
        plan = _fixed._plan(tf.TensorShape([4, k]), tf.TensorShape([k, 3]))
        kernel = _fixed._compiled(_fixed._whole_product, plan, tf.float32)
        return _dtypes_in(kernel.get_concrete_function(tf.TensorSpec([4, k], tf.float32),
                                                       tf.TensorSpec([k, 3], tf.float32)))

    for k in (100, 5000):
        wide, sliced = both_paths(lambda: kernel_dtypes(k))
        assert "float64" in wide
        assert "float64" not in sliced, sliced


def test_the_path_is_chosen_by_the_environment_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv(slices.ENV, "Float32")
    assert slices.path() == "float32"
    monkeypatch.setenv(slices.ENV, "auto")
    capabilities = [tf.config.experimental.get_device_details(gpu).get("compute_capability")
                    for gpu in tf.config.get_visible_devices("GPU")]
    slow = [c for c in capabilities if c is not None and tuple(c) not in slices.FULL_RATE_FLOAT64]
    assert slices.path() == ("float32" if slow else "float64")  # a CPU: float64
    monkeypatch.setenv(slices.ENV, "fp16")
    with pytest.raises(ValueError, match=r"^TFREPRO_EXACT_PRODUCTS must be one of auto, float64, float32; got 'fp16'$"):
        slices.path()


def test_status_says_which_path_patch_refuses_a_bad_one_and_traces_record_it(monkeypatch):
    from tfrepro.proof.environment_info import environment

    monkeypatch.setenv(slices.ENV, "float32")
    with tfrepro.patched(0, ops="exact"):
        assert "products in float32 slices (the same bits either way)" in str(tfrepro.status())
        assert environment()["env"][slices.ENV] == "float32"
    monkeypatch.setenv(slices.ENV, "float64")
    with tfrepro.patched(0, ops="exact"):
        assert "products in float64 (the same bits either way)" in str(tfrepro.status())
    monkeypatch.setenv(slices.ENV, "fp16")
    with pytest.raises(ValueError, match="TFREPRO_EXACT_PRODUCTS must be one of"):
        tfrepro.patch(0, ops="exact")
    assert "exact tier" not in str(tfrepro.status())  # all or nothing: the failed patch left nothing


@pytest.mark.slow
def test_the_gpu_check_prints_the_same_op_hashes_for_either_path_threads_and_onednn():
    """``bench/exact_gpu_check.py --ops-only`` (the per-op hashes a GPU user compares) in two fresh
    processes: float64 products, 1 thread, oneDNN off; float32 slices, 2 threads, oneDNN on."""
    found = []
    for products, threads, onednn in (("float64", "1", "0"), ("float32", "2", "1")):
        proc = subprocess.run([sys.executable, str(GPU_CHECK), "--ops-only", "--json", "--cpu", "--products", products,
                               "--threads", threads], env=clean_env(TF_ENABLE_ONEDNN_OPTS=onednn),
                              capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        found.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert [f["products"] for f in found] == ["float64", "float32"]
    assert len(found[0]["ops"]) >= 15
    assert found[0]["ops"] == found[1]["ops"]
