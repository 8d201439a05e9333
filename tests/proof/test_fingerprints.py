"""Exact on-device fingerprints: every single-bit change is seen (property-based)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrepro import _tf
from tfrepro.proof import fingerprints

tf = _tf.import_tf()
DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
          "uint64"]


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


# --- The structured changes that cancelled in the earlier, linear fingerprint ------------------------

def _linear_fingerprint(array: np.ndarray) -> tuple[int, int]:
    """The earlier design (two linear sums of 32-bit words modulo 2**32), kept as the negative control."""
    words = array.view(np.uint32).astype(np.uint64).ravel()
    index = np.arange(words.size, dtype=np.uint64)
    weyl = ((index * 0x9E3779B9 + 0x9E3779B9) | 1) & 0xFFFFFFFF
    return int((words * (2 * index + 1)).sum() % 2**32), int((words * weyl).sum() % 2**32)


def _flip_sign(array: np.ndarray, positions) -> np.ndarray:
    changed = array.copy()
    changed[list(positions)] *= -1
    return changed


def test_pairs_of_sign_flips_cancelled_in_the_linear_sums_and_are_seen_now():
    array = np.random.default_rng(1).normal(size=64).astype(np.float32)
    flipped = _flip_sign(array, (3, 40))
    assert _linear_fingerprint(flipped) == _linear_fingerprint(array)  # the hole, reproduced
    assert fingerprints.fingerprint(flipped) != fingerprints.fingerprint(array)


STRUCTURED = {
    "sign flips in pairs": lambda a, rng: _flip_sign(a, rng.choice(a.size, 2, replace=False)),
    "sign flips in fours": lambda a, rng: _flip_sign(a, rng.choice(a.size, 4, replace=False)),
    "top bit of several words": lambda a, rng: _xor_words(a, rng.choice(a.size, rng.integers(2, 9), replace=False),
                                                         0x80000000),
    "swap of two elements": lambda a, rng: _swap(a, *rng.choice(a.size, 2, replace=False)),
    "the same bit in two words": lambda a, rng: _xor_words(a, rng.choice(a.size, 2, replace=False),
                                                          1 << int(rng.integers(0, 32))),
}


def _xor_words(array: np.ndarray, positions, mask: int) -> np.ndarray:
    words = array.view(np.uint32).copy()
    words[list(positions)] ^= np.uint32(mask)
    return words.view(array.dtype)


def _swap(array: np.ndarray, i: int, j: int) -> np.ndarray:
    changed = array.copy()
    changed[[i, j]] = changed[[j, i]]
    return changed


@pytest.mark.parametrize("family", sorted(STRUCTURED))
def test_structured_perturbations_change_the_fingerprint(family):
    rng = np.random.default_rng(7)
    array = rng.normal(size=257).astype(np.float32)
    original = fingerprints.fingerprint(array)
    for _ in range(200):
        changed = STRUCTURED[family](array, rng)
        if changed.tobytes() != array.tobytes():
            assert fingerprints.fingerprint(changed) != original


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_one_ulp_change_at_every_position_is_seen(dtype):
    np_dtype = _as_numpy_dtype(dtype)
    rng = np.random.default_rng(3)
    array = (rng.normal(size=40) * 50).astype(np_dtype)
    original = fingerprints.fingerprint(tf.constant(array, dtype=dtype))
    seen = set()
    for position in range(array.size):
        changed = array.copy()
        if np.issubdtype(np_dtype, np.integer):
            changed[position] = changed[position] + np_dtype(1)
        else:
            as_float = changed.astype(np.float64)
            changed[position] = np.nextafter(changed[position], np_dtype(np.inf)) if dtype != "bfloat16" else \
                np_dtype(as_float[position] * (1 + 2**-7) + 2**-20)
        assert changed.tobytes() != array.tobytes()
        seen.add(fingerprints.fingerprint(tf.constant(changed, dtype=dtype)))
    assert original not in seen and len(seen) == array.size


def test_int64_high_words_and_float64_halves_are_seen():
    array = np.arange(-20, 20, dtype=np.int64) * 1_000_003
    original = fingerprints.fingerprint(array)
    for position in (0, 17, 39):
        for delta in (1 << 32, -(1 << 32), 1 << 62, (1 << 32) + 1):
            changed = array.copy()
            changed[position] += np.int64(delta)
            assert fingerprints.fingerprint(changed) != original
    doubles = np.linspace(-3, 3, 33)
    words = doubles.view(np.uint32).copy()
    words[[4, 5]] ^= np.uint32(0x80000000)  # the top bit of both halves of one element
    assert fingerprints.fingerprint(words.view(np.float64)) != fingerprints.fingerprint(doubles)


def test_thousands_of_random_perturbations_are_all_seen():
    rng = np.random.default_rng(11)
    array = rng.normal(size=128).astype(np.float32)
    seen = {fingerprints.fingerprint(array)}
    for _ in range(3000):
        changed = array.view(np.uint32).copy()
        positions = rng.choice(array.size, int(rng.integers(1, 9)), replace=False)
        changed[positions] ^= rng.integers(1, 2**32, size=positions.size, dtype=np.uint64).astype(np.uint32)
        seen.add(fingerprints.fingerprint(changed.view(np.float32)))
    assert len(seen) == 3001  # each perturbation gave a fingerprint of its own


def test_the_fused_and_unfused_computations_give_the_same_fingerprints():
    variables = [tf.Variable(np.random.default_rng(0).normal(size=(300, 7))), tf.Variable([True, False]),
                 tf.Variable(np.arange(5, dtype=np.uint8))]
    fused = fingerprints.VariableFingerprinter(variables)()
    plain = tf.function(lambda tensors: fingerprints._stack(tf, tensors), jit_compile=False)
    unfused = [fingerprints.to_hex(pair) for pair in plain([tf.convert_to_tensor(v) for v in variables]).numpy()]
    assert fused == unfused == [fingerprints.fingerprint(v) for v in variables]
    assert fingerprints.fingerprints_of._function._jit_compile is True  # XLA here: no silent fallback


def test_gradient_fingerprints_combine_indexed_slices_values_and_indices():
    values = tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2))
    dense = fingerprints.gradient_fingerprints(tf, [values, None])
    assert fingerprints.to_hex(dense[0].numpy()) == fingerprints.fingerprint(values)
    assert fingerprints.to_hex(dense[1].numpy()) == "0" * 16
    a = tf.IndexedSlices(values, tf.constant([0, 2, 5]), tf.constant([8, 2]))
    b = tf.IndexedSlices(values, tf.constant([0, 2, 4]), tf.constant([8, 2]))  # same rows, other places
    prints = fingerprints.gradient_fingerprints(tf, [a, b]).numpy()
    assert fingerprints.to_hex(prints[0]) != fingerprints.to_hex(prints[1])


def test_booleans_are_fingerprinted_element_by_element():
    flags = np.zeros(50, dtype=bool)
    seen = {fingerprints.fingerprint(flags)}
    for position in range(flags.size):
        flipped = flags.copy()
        flipped[position] = True
        seen.add(fingerprints.fingerprint(flipped))
    assert len(seen) == 51
