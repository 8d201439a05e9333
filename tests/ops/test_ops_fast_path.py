"""The fast segment-sum path gives the canonical bits whenever it is taken, and is not taken otherwise.

``tfrepro.ops`` defines each sum by one canonical computation (a scale per segment and column; see
``tfrepro.ops._exact_sum``). The fast path scales whole segments, which is exact, and so equal to
the canonical result, only when every element quantises to an integer; a check decides. These tests
compare the two paths bit for bit, force chunking and both int64 accumulators, and show (negative
control) that the fast path's own answer differs where the check rejects it.
"""

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrepro import _tf

pytestmark = pytest.mark.core  # the numerics must hold on the oldest TF too

tf = _tf.import_tf()
from tfrepro import ops  # noqa: E402  (imports TensorFlow)
from tfrepro.ops import _exact_sum  # noqa: E402


def bits(tensor):
    return np.asarray(tf.convert_to_tensor(tensor)).tobytes()


def grouping(ids, num_segments, accumulate=None):
    groups = _exact_sum._Segments(tf.constant(ids), tf.constant(num_segments))
    groups.accumulate = accumulate or groups.accumulate
    return groups


def canonical(data, ids, num_segments, accumulate=None):
    x = tf.cast(tf.convert_to_tensor(data), tf.float32)
    return _exact_sum._exact_sum(x, grouping(ids, num_segments, accumulate))


def fast(data, ids, num_segments, accumulate=None):
    x = tf.cast(tf.convert_to_tensor(data), tf.float32)
    return _exact_sum._segment_sum_one_scale(x, grouping(ids, num_segments, accumulate))


@contextlib.contextmanager
def chunk_elements(count: int):
    saved = _exact_sum.CHUNK_ELEMENTS
    _exact_sum.CHUNK_ELEMENTS = count
    try:
        yield
    finally:
        _exact_sum.CHUNK_ELEMENTS = saved


def _fast_equals_canonical(n, k, segments, span, chunk, seed) -> bool:
    """The op equals the canonical sum bit for bit, also permuted; when the fast path's check passed,
    so does the fast path's own result. Returns whether it passed."""
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal((n, k)) * np.exp2(rng.integers(-span, span + 1, (n, k)))).astype(np.float32)
    data[rng.random((n, k)) < 0.1] = 0.0
    ids = rng.integers(-1, segments, n).astype(np.int32)
    expected = canonical(data, ids, segments)
    order, relabel = rng.permutation(n), rng.permutation(segments)  # other chunk boundaries and slots
    moved_ids = np.where(ids >= 0, relabel[np.maximum(ids, 0)], -1)[order].astype(np.int32)
    with chunk_elements(chunk):
        result, exact = fast(data, ids, segments)
        assert bits(ops.unsorted_segment_sum(data, ids, segments)) == bits(expected)
        assert bits(tf.gather(ops.unsorted_segment_sum(data[order], moved_ids, segments), relabel)) == bits(expected)
    if exact:
        assert bits(result) == bits(expected)
    if span == 0:
        assert exact  # Gaussian magnitudes span far less than the 2**29 a 300-row segment allows
    return bool(exact)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), k=st.integers(1, 6), segments=st.integers(1, 9), span=st.sampled_from([0, 8, 24, 60, 120]),
       chunk=st.sampled_from([1, 7, 64, 1 << 20]), seed=st.integers(0, 2**32 - 1))
def test_fast_path_equals_the_canonical_sum_whenever_it_is_exact(n, k, segments, span, chunk, seed):
    _fast_equals_canonical(n, k, segments, span, chunk, seed)


def test_both_branches_of_the_fast_path_check_are_exercised():
    """The property above compares the fast result only when the check passed: here a fixed grid
    shows that both outcomes occur, so neither branch of it goes untested."""
    outcomes = [_fast_equals_canonical(200, 4, 3, span, chunk, seed)
                for span in (0, 120) for chunk in (7, 1 << 20) for seed in range(4)]
    assert outcomes.count(True) >= 8 and outcomes.count(False) >= 4, outcomes


def test_the_check_rejects_a_segment_whose_magnitudes_span_too_far_negative_control():
    data = np.array([[1.0, 3e-20], [1.0, -1e-20], [2.0, 5e-21]], np.float32)  # column 1 is tiny next to column 0
    ids = np.zeros(3, np.int32)
    result, exact = fast(data, ids, 1)
    assert not exact
    assert bits(result) != bits(canonical(data, ids, 1))  # the fast answer lost column 1: it must not be used
    np.testing.assert_allclose(ops.unsorted_segment_sum(data, ids, 1).numpy(), [[4.0, 2.5e-20]], rtol=1e-6)
    assert bits(ops.unsorted_segment_sum(data, ids, 1)) == bits(canonical(data, ids, 1))


def test_a_scale_below_one_leaves_the_fast_path():
    # Scaled by 2**-40 (for the 2**100), the 2**-120 rounds to 0.0: an "integer" the check cannot doubt.
    data = np.array([[2.0**100, 0.0], [0.0, 2.0**-120]], np.float32)
    ids = np.zeros(2, np.int32)
    assert not fast(data, ids, 1)[1]
    assert ops.unsorted_segment_sum(data, ids, 1).numpy()[0, 1] == np.float32(2.0**-120)
    assert bits(ops.unsorted_segment_sum(data, ids, 1)) == bits(canonical(data, ids, 1))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_values_leave_the_fast_path(value):
    data = np.array([[1.0, 2.0], [value, 1.0], [3.0, 4.0]], np.float32)
    ids = np.array([0, 1, 1], np.int32)
    assert not fast(data, ids, 2)[1]
    assert bits(ops.unsorted_segment_sum(data, ids, 2)) == bits(canonical(data, ids, 2))


def test_every_int64_accumulator_gives_the_same_sums():
    rng = np.random.default_rng(11)
    q = rng.integers(-(2**55), 2**55, (500, 7))
    q[0, 0], q[1, 1] = -(2**61), 2**61 - 1  # the extremes of one quantised element
    q, slot = tf.constant(q, tf.int64), tf.constant(rng.integers(0, 13, 500), tf.int32)
    expected = _exact_sum._sums_by_segment(q, slot, tf.constant(13))
    for accumulate in (_exact_sum._sums_by_bincount, _exact_sum._sums_by_bincount_when_small,
                       _exact_sum._sums_by_float64_limbs):
        assert bits(accumulate(q, slot, tf.constant(13))) == bits(expected)
    by_limbs = _exact_sum._int64_sum_by_limbs(q, lambda limb: tf.reduce_sum(limb, 0))
    assert bits(by_limbs) == bits(tf.reduce_sum(q, 0))


def test_the_gpu_flavour_gives_the_same_bits(monkeypatch):
    """Where GPUs are visible, sums go through float64 limbs (TF's GPU kernels sum no int64); forced
    here on CPU, every result must keep its bits."""
    rng = np.random.default_rng(13)
    data = (rng.standard_normal((3000, 6)) * np.exp2(rng.integers(-30, 30, (3000, 6)))).astype(np.float32)
    ids = rng.integers(-1, 9, 3000).astype(np.int32)

    def results():
        narrow = np.float32(1.5) ** (data > 0)  # the fast path; ``data`` itself spans too far for it
        return [bits(ops.unsorted_segment_sum(data, ids, 9)), bits(ops.unsorted_segment_sum(narrow, ids, 9)),
                bits(ops.reduce_sum(data, axis=0)), bits(ops.reduce_sum(data, axis=1))]

    on_cpu = results()
    monkeypatch.setattr(_exact_sum, "_gpus_visible", lambda: True)
    assert results() == on_cpu


def test_xla_compiles_the_same_bits():
    rng = np.random.default_rng(12)
    data = tf.constant(rng.standard_normal((1000, 5)), tf.float32)
    ids = tf.constant(rng.integers(0, 4, 1000), tf.int32)
    compiled = tf.function(lambda d, i: ops.unsorted_segment_sum(d, i, 4), jit_compile=True)
    assert bits(compiled(data, ids)) == bits(ops.unsorted_segment_sum(data, ids, 4))


@pytest.mark.parametrize("rows, count", [(3000, 5), (40, 5)])  # a presence table, and a segment max
def test_both_ways_to_find_the_largest_exponent_and_both_accumulators_agree(rows, count):
    rng = np.random.default_rng(rows)
    values = tf.constant(rng.integers(0, 256, rows), tf.int32)
    slot = tf.constant(rng.integers(0, count, rows), tf.int32)
    expected = tf.maximum(tf.math.unsorted_segment_max(values, slot, count), 0)
    for accumulate in (_exact_sum._sums_by_bincount, _exact_sum._sums_by_segment):
        largest = _exact_sum._largest_per_slot(values, grouping(slot.numpy(), count, accumulate))[:count]
        assert bits(largest) == bits(expected)
    data = (rng.standard_normal((rows, 3)) * np.exp2(rng.integers(-4, 4, (rows, 3)))).astype(np.float32)
    ids = rng.integers(-1, count, rows).astype(np.int32)
    expected = canonical(data, ids, count)
    tiny = data.copy()
    tiny[0, 0] = 1e-30  # too small to be exact: the canonical path
    for accumulate in (_exact_sum._sums_by_bincount, _exact_sum._sums_by_segment):
        result, exact = fast(data, ids, count, accumulate)
        assert exact and bits(result) == bits(expected)
        assert bits(canonical(tiny, ids, count, accumulate)) == bits(canonical(tiny, ids, count))
