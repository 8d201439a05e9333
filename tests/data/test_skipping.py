"""``tfrepro.data.skip``: the same elements as ``Dataset.skip``, bit for bit, without running the maps
of what it skips where that is exact; where it is not, it is ``Dataset.skip``. A map that asserts on
the position of its element in the pass proves which elements it was run on."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tfrepro

pytestmark = pytest.mark.core


def elements(dataset):
    import tensorflow as tf

    return [tuple(np.asarray(c).tobytes() for c in tf.nest.flatten(e)) for e in dataset.as_numpy_iterator()]


def keyed(tf, length, batch, block=None, first=0):
    """A keyed shuffle, ``map_with_seed`` over (position, value) whose function fails on a position
    below ``first``, and a batch."""
    import tfrepro.data

    def noisy(position, value, seed):
        tf.debugging.assert_greater_equal(position, tf.constant(first, tf.int64))
        return value + tf.random.stateless_uniform([3], seed), position

    values = tf.reshape(tf.range(length * 3, dtype=tf.float32), [length, 3])
    data = tfrepro.data.shuffle(tf.data.Dataset.from_tensor_slices(values), length, seed=5, epoch=0).enumerate()
    return tfrepro.data.map_with_seed(data, noisy, seed=5, epoch=0, block=block).batch(batch).prefetch(2)


@settings(max_examples=10, deadline=None)
@given(length=st.integers(1, 40), batch=st.integers(1, 9), block=st.sampled_from([None, 1]), data=st.data())
def test_the_same_bits_as_dataset_skip_and_no_skipped_element_is_mapped(length, batch, block, data):
    import tensorflow as tf

    batches = -(-length // batch)
    count = data.draw(st.integers(0, batches), label="count")
    expected = elements(keyed(tf, length, batch, block).skip(count))
    # map_with_seed maps in blocks of the largest size up to 8 that divides the length: a block
    # holding the first element kept is mapped whole
    size = 1 if block == 1 else max(d for d in range(1, 9) if length % d == 0)
    first = min(count * batch, length) // size * size
    skipped = tfrepro.data.skip(keyed(tf, length, batch, block, first=first), count)
    assert elements(skipped) == expected
    assert skipped.cardinality().numpy() == batches - count


def test_dataset_skip_runs_the_map_on_what_it_skips_the_negative_control():
    import tensorflow as tf

    with pytest.raises(tf.errors.InvalidArgumentError):
        elements(keyed(tf, 40, 4, first=16).skip(4))
    assert len(elements(tfrepro.data.skip(keyed(tf, 40, 4, first=16), 4))) == 6


@pytest.mark.parametrize("shape", ["zip", "unbatch with a remainder", "padded_batch", "interleave", "filter"])
def test_pipelines_of_other_shapes_give_dataset_skips_bits(shape):
    import tensorflow as tf

    from tfrepro.data import skipping

    def build():
        base = keyed(tf, 48, 4)
        if shape == "zip":
            return tf.data.Dataset.zip((base, tf.data.Dataset.range(100).map(lambda i: i * 2).batch(4)))
        if shape == "unbatch with a remainder":
            return base.unbatch().batch(3)
        if shape == "padded_batch":
            return keyed(tf, 48, 1).unbatch().map(lambda v, p: tf.repeat(v, p % 3 + 1)).padded_batch(4)
        if shape == "interleave":
            return tf.data.Dataset.range(3).interleave(lambda i: keyed(tf, 12, 2), cycle_length=3)
        return base.unbatch().filter(lambda v, p: p % 3 > 0).batch(4)

    planned = skipping.plan(build(), 5)
    assert elements(tfrepro.data.skip(build(), 5)) == elements(build().skip(5))
    if shape in ("zip", "unbatch with a remainder", "padded_batch"):
        assert "ParallelMapDatasetV2" in planned.bypassed
    else:  # the skip stops above the interleave, or above the filter (whose input count is unknown)
        assert "ParallelMapDatasetV2" not in planned.bypassed


def test_a_map_with_stateful_random_ops_is_run_for_the_elements_it_skips():
    """Its draws follow the elements it has made: skipping under it would give the later elements
    other numbers. The skip stays above it, and the bits are Dataset.skip's on a fresh pass."""
    import tensorflow as tf

    from tfrepro.data import skipping

    def build():
        noisy = tf.data.Dataset.range(30).map(lambda i: tf.cast(i, tf.float32) + tf.random.uniform([], seed=4))
        return noisy.map(lambda v: v * 2).batch(5)

    planned = skipping.plan(build(), 3)
    assert planned.dataset is not None and planned.bypassed == ["BatchDatasetV2", "MapDataset"]  # the * 2 only
    assert elements(tfrepro.data.skip(build(), 3)) == elements(build().skip(3))


@pytest.mark.parametrize("case", ["a reshuffling Dataset.shuffle", "a captured variable"])
def test_what_it_cannot_rewrite_is_dataset_skip_and_says_why(case):
    import tensorflow as tf

    from tfrepro.data import skipping

    offset = tf.Variable(1.0)
    if case == "a reshuffling Dataset.shuffle":
        build = lambda: tf.data.Dataset.range(20).shuffle(20, seed=1).map(lambda i: i + 1).batch(4)  # noqa: E731
    else:
        build = lambda: tf.data.Dataset.range(20).map(lambda i: tf.cast(i, tf.float32) + offset).batch(4)  # noqa: E731
    planned = skipping.plan(build(), 2)
    assert planned.dataset is None
    assert ("reshuffles" if case == "a reshuffling Dataset.shuffle" else "captures a VarHandleOp") in planned.why_not
    assert elements(tfrepro.data.skip(build(), 2)) == elements(build().skip(2))


@pytest.mark.parametrize("count, error", [(-1, ValueError), (True, ValueError), (1.5, ValueError), ("2", ValueError)])
def test_bad_arguments_are_refused(count, error):
    import tensorflow as tf

    with pytest.raises(error, match="count must be a non-negative int"):
        tfrepro.data.skip(tf.data.Dataset.range(3), count)
    with pytest.raises(TypeError, match="dataset must be a tf.data.Dataset"):
        tfrepro.data.skip([1, 2, 3], 1)


def test_an_unordered_parallel_map_is_not_passed():
    """Skipping n inputs of a map that yields in completion order is not skipping n outputs."""
    import tensorflow as tf

    from tfrepro.data import skipping

    values = tf.data.Dataset.range(40)
    unordered = values.map(lambda i: i * 2, num_parallel_calls=2, deterministic=False).batch(4)
    assert "ParallelMapDatasetV2" not in skipping.plan(unordered, 3).bypassed
    options = tf.data.Options()
    options.deterministic = False
    by_options = values.map(lambda i: i * 2, num_parallel_calls=2).batch(4).with_options(options)
    assert "ParallelMapDatasetV2" not in skipping.plan(by_options, 3).bypassed
    ordered = values.map(lambda i: i * 2, num_parallel_calls=2).batch(4)
    assert "ParallelMapDatasetV2" in skipping.plan(ordered, 3).bypassed
    assert elements(tfrepro.data.skip(ordered, 3)) == elements(ordered.skip(3))
    assert elements(tfrepro.data.skip(ordered, np.int64(2))) == elements(ordered.skip(2))


def test_a_graph_too_large_to_copy_cheaply_is_drawn(monkeypatch):
    import tensorflow as tf

    from tfrepro.data import skipping

    monkeypatch.setattr(skipping, "_COPIED_AT_MOST", 1 << 10)
    data = tf.data.Dataset.from_tensor_slices(np.zeros([64, 16], np.float32)).map(lambda v: v + 1).batch(4)
    planned = skipping.plan(data, 2)
    assert planned.dataset is None and "its graph holds over 0 MiB" in planned.why_not
    assert elements(tfrepro.data.skip(data, 2)) == elements(data.skip(2))
