"""Seeds, derived seeds and the exact RNG-state round trip."""

import json
import random

import numpy as np
import pytest

import tfrepro
from tfrepro import _tf
from tfrepro.determinism.seeding import MAX_SEED, validate_seed

from conftest import run_python

pytestmark = pytest.mark.core


@pytest.mark.parametrize("bad", [-1, MAX_SEED + 1, 2**64, 1.0, "1", None, True, False, [1]])
def test_bad_seeds_raise_value_error_naming_the_range(bad):
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32 - 1\]"):
        validate_seed(bad)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32 - 1\]"):
        tfrepro.seed_everything(bad)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32 - 1\]"):
        tfrepro.derive_seed(bad, "worker")


def test_numpy_integers_and_the_range_edges_are_accepted():
    assert validate_seed(np.int64(7)) == 7
    assert validate_seed(0) == 0 and validate_seed(MAX_SEED) == MAX_SEED


def test_derive_seed_is_pinned_across_versions_and_typed():
    # Pinned values: a change here breaks every user's derived seeds.
    assert tfrepro.derive_seed(0) == 1788734622
    assert tfrepro.derive_seed(42, "worker", 3) == 2005306999
    assert tfrepro.derive_seed(42, "worker", "3") == 3101799412
    assert tfrepro.derive_seed(MAX_SEED, "epoch", 10) == 2333944950
    seeds = {tfrepro.derive_seed(1, "replica", i) for i in range(1000)}
    assert len(seeds) == 1000 and all(0 <= s <= MAX_SEED for s in seeds)


def test_derive_seed_is_stable_across_processes_with_different_hash_seeds():
    code = "import tfrepro; print(tfrepro.derive_seed(5, 'worker', 2, 'epoch', 9))"
    outputs = {run_python("-c", code, env={"PYTHONHASHSEED": str(h), "PATH": ""}).stdout for h in (1, 2)}
    assert outputs == {f"{tfrepro.derive_seed(5, 'worker', 2, 'epoch', 9)}\n"}


@pytest.mark.parametrize("bad_key", [1.5, None, True, b"x"])
def test_derive_seed_rejects_untyped_keys(bad_key):
    with pytest.raises(TypeError, match="ints or strings"):
        tfrepro.derive_seed(1, bad_key)


def _draw(tf, keras=None):
    values = [random.random(), float(np.random.rand()), tf.random.get_global_generator().normal([4]).numpy().tobytes()]
    if keras is not None and _tf.keras_major(keras) >= 3:
        values.append(keras.ops.convert_to_numpy(keras.random.normal([4])).tobytes())
    return values


def test_rng_state_round_trip_is_exact(keras):
    tf = _tf.import_tf()
    tfrepro.seed_everything(3)
    _draw(tf, keras)  # creates Keras 3's global SeedGenerator
    state = json.loads(json.dumps(tfrepro.rng_state()))  # survives JSON
    first = _draw(tf, keras)
    second = _draw(tf, keras)
    assert first != second  # control: the generators do advance
    tfrepro.set_rng_state(state)
    assert _draw(tf, keras) == first
    expected = {"python", "numpy", "tensorflow_generator"} | ({"keras_seed_generator"} if _tf.keras_major(keras) >= 3 else set())
    assert expected <= set(state)


def test_keras2_internal_generator_round_trip(keras):
    if _tf.keras_major(keras) >= 3:
        pytest.skip("Keras 2 only")
    from tfrepro.determinism.seeding import _keras2_seed_holder

    tfrepro.seed_everything(11)
    holder = _keras2_seed_holder(keras)
    state = tfrepro.rng_state()
    assert "keras2_generator" in state
    first = holder.generator.randint(1, 10**9)
    tfrepro.set_rng_state(state)
    assert holder.generator.randint(1, 10**9) == first


def test_seed_everything_makes_keras_layers_repeat(keras):
    def initial_weights():
        tfrepro.seed_everything(123)
        layer = keras.layers.Dense(5)
        layer.build((None, 3))
        return [w.tobytes() for w in layer.get_weights()]

    assert initial_weights() == initial_weights()


def test_set_rng_state_rejects_garbage():
    with pytest.raises(ValueError, match="rng_state"):
        tfrepro.set_rng_state({"nope": 1})
