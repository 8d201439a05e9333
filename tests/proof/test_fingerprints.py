"""Exact on-device fingerprints: every single-bit change is seen (property-based)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrepro import _tf
from tfrepro.proof import fingerprints

tf = _tf.import_tf()
DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int32", "int64", "uint8", "uint64"]


def _as_numpy_dtype(name):
    return tf.dtypes.as_dtype(name).as_numpy_dtype


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), size=st.integers(1, 300), data=st.data())
def test_flipping_any_single_bit_changes_the_fingerprint(dtype, size, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    np_dtype = _as_numpy_dtype(dtype)
    raw = rng.integers(0, 256, size=size * np.dtype(np_dtype).itemsize, dtype=np.uint8)
    array = raw.view(np_dtype).copy()
    flipped_raw = raw.copy()
    bit = data.draw(st.integers(0, raw.size * 8 - 1))
    flipped_raw[bit // 8] ^= np.uint8(1 << (bit % 8))
    flipped = flipped_raw.view(np_dtype)
    original = fingerprints.fingerprint(tf.constant(array, dtype=dtype))
    assert original == fingerprints.fingerprint(tf.constant(array.copy(), dtype=dtype))  # same bits, same print
    assert original != fingerprints.fingerprint(tf.constant(flipped, dtype=dtype))


def test_fingerprint_sees_positions_and_nan_payloads():
    values = tf.constant([1.0, 2.0, 3.0])
    assert fingerprints.fingerprint(values) != fingerprints.fingerprint(tf.constant([2.0, 1.0, 3.0]))
    nan_a = np.array([np.nan], dtype=np.float32)
    nan_b = (nan_a.view(np.uint32) | np.uint32(1)).view(np.float32)
    assert fingerprints.fingerprint(tf.constant(nan_a)) != fingerprints.fingerprint(tf.constant(nan_b))
    assert fingerprints.fingerprint(tf.constant([0.0])) != fingerprints.fingerprint(tf.constant([-0.0]))
    with pytest.raises(TypeError, match="cannot fingerprint"):
        fingerprints.fingerprint(tf.constant(["text"]))


def test_variable_fingerprinter_matches_and_tracks_assignments():
    variables = [tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3)), tf.Variable([1, 2], dtype=tf.int64)]
    fingerprinter = fingerprints.VariableFingerprinter(variables)
    before = fingerprinter()
    assert before == [fingerprints.fingerprint(v) for v in variables]
    variables[0].assign_add(tf.constant([[0.0, 0.0, 2.0**-20], [0.0, 0.0, 0.0]]))
    after = fingerprinter()
    assert after[0] != before[0] and after[1] == before[1]
    assert fingerprints.combine(after) != fingerprints.combine(before)
