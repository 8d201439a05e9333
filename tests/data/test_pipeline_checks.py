"""Pipelines that would silently undo keyed draws are made right or named as they are built
(``tfrepro.data.pipeline_checks``): ``repeat()`` after a draw keyed by the training epoch keys each
pass anew (or raises where it cannot), a pass while the clock was never set draws
anew, ``cache()`` after a draw and ``zip`` of two draws with one key warn, and each shows the
symptom it names."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfrepro.data
from tfrepro.errors import ReproducibilityWarning


def _numbers(seed=1, **kwargs):
    data = tf.data.Dataset.range(8).map(lambda x: tf.cast(x, tf.float32))
    return tfrepro.data.map_with_seed(data, lambda x, s: x + tf.random.stateless_uniform([], s), seed=seed, **kwargs)


def _values(dataset):
    return np.array(list(dataset.as_numpy_iterator()))


def test_repeat_after_a_draw_keyed_by_the_training_epoch_keys_each_pass_anew_and_raises_where_it_cannot():
    """Each pass of the repeat is the pipeline made again, its draws keyed by a number drawn as the
    pass begins (never the clock): moving the clock meanwhile, as fit does while the next pass is
    pulled ahead, changes nothing, and a second build gives the same passes. TF's repeat keeps its
    rules (its count, its end on an empty pass). A pipeline tfrepro cannot make again raises,
    naming what made it."""
    def pipeline():  # one call site, one key
        return _numbers(key="aug").batch(3)

    def passes(clock_then):
        tfrepro.data.set_epoch(5)
        iterator = iter(pipeline().repeat(3))
        got = [next(iterator)]
        tfrepro.data.set_epoch(clock_then)  # the race a repeat read from the clock would lose
        return np.concatenate(got + list(iterator))

    try:
        first, second = passes(40), passes(6)
        assert first.tobytes() == second.tobytes() and first.shape == (24,)
        assert not np.array_equal(first[:8], first[8:16])  # every pass draws anew
        assert np.array_equal(np.sort(np.floor(first[:8])), np.arange(8))  # each a pass of the pipeline
        assert pipeline().repeat(3).cardinality() == 9
        assert pipeline().repeat().cardinality() == tf.data.INFINITE_CARDINALITY
        assert list(_numbers(key="aug").batch(9, drop_remainder=True).repeat()) == []  # an empty pass ends it
        shuffled = tfrepro.data.shuffle(tf.data.Dataset.range(8), 8, seed=1)
        with pytest.raises(ValueError, match=r"repeat\(\) after tfrepro.data.shuffle \(key 'shuffle'\) .* races with "
                                             r"fit's clock.* made by _AssertCardinalityDataset"):
            tf.data.experimental.assert_cardinality(8)(shuffled).repeat(2)
        with pytest.raises(ValueError, match=r"TF's own reshuffling Dataset.shuffle \(a new one in each pass would repeat"):
            shuffled.shuffle(8).repeat(2)  # no patch: TF's shuffle, which a pass made anew would restart
    finally:
        tfrepro.data.set_epoch(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _numbers(key="aug").repeat(1)  # one pass: nothing starts ahead
        _numbers(key="aug", epoch=4).repeat()  # a fixed epoch reads no clock
        data = tf.data.Dataset.range(8).repeat()  # repeat() before the draw: one endless pass
        tfrepro.data.map_with_seed(data, lambda x, s: x, seed=1, key="after").take(3)


def test_a_repeat_keys_draws_made_in_its_functions_too_and_restarts_nothing_tf_would_not():
    """An interleave whose sub-datasets are keyed by the training epoch reads the clock as each
    sub-dataset starts: under repeat() that races too, so its passes are made again with the
    interleave's function traced inside them, its draws at the pass's number. Steps that start over
    in TF too (a shuffle that does not reshuffle, sample_from_datasets) are not refused."""
    def files():
        return tf.data.Dataset.range(2).interleave(lambda f: _numbers(key=f"file").map(lambda x: x + tf.cast(
            f, tf.float32) * 100), cycle_length=2)

    def passes(clock_then):
        tfrepro.data.set_epoch(1)
        iterator = iter(files().batch(4).repeat(2))
        got = [next(iterator)]
        tfrepro.data.set_epoch(clock_then)
        return np.concatenate(got + list(iterator))

    try:
        first = passes(9)
        assert first.tobytes() == passes(2).tobytes() and first.shape == (32,)
        assert not np.array_equal(first[:16], first[16:])
        plain = tf.data.Dataset.range(8)
        _values(_numbers(key="still").shuffle(8, reshuffle_each_iteration=False).repeat(2))
        _values(tf.data.Dataset.sample_from_datasets([_numbers(key="a"), _numbers(key="b")], seed=1).repeat(2))
        _values(tf.data.Dataset.zip((_numbers(key="z"), plain)).repeat(2))
    finally:
        tfrepro.data.set_epoch(0)


def test_cache_after_a_keyed_draw_warns_and_would_freeze_its_first_epoch():
    keyed = _numbers(key="frozen")
    with pytest.warns(ReproducibilityWarning, match=r"cache\(\) after map_with_seed \(key 'frozen'\)"):
        cached = keyed.cache()
    tfrepro.data.set_epoch(0)
    try:
        first = _values(cached)
        tfrepro.data.set_epoch(1)
        assert np.array_equal(_values(cached), first)  # the symptom: epoch 1 got epoch 0's draws
        assert not np.array_equal(_values(keyed), first)  # uncached, epoch 1 draws anew
    finally:
        tfrepro.data.set_epoch(0)


def test_zip_of_two_draws_with_one_key_warns_and_they_are_the_same():
    with pytest.warns(ReproducibilityWarning, match="Dataset.zip of 2 datasets built on map_with_seed"):
        views = tf.data.Dataset.zip((_numbers(key="view"), _numbers(key="view")))
    first, second = zip(*views.as_numpy_iterator())
    assert np.array_equal(first, second)  # the symptom: two "random" views, one draw
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        distinct = tf.data.Dataset.zip((_numbers(key="view 1"), _numbers(key="view 2")))
    first, second = zip(*distinct.as_numpy_iterator())
    assert not np.array_equal(first, second)
    with pytest.warns(ReproducibilityWarning, match=r"tfrepro.data.shuffle \(key 'shuffle'\)"):
        tf.data.Dataset.zip((tfrepro.data.shuffle(tf.data.Dataset.range(8), 8, seed=2),
                             tfrepro.data.shuffle(tf.data.Dataset.range(8, 16), 8, seed=2)))


def test_one_key_applied_twice_in_a_row_warns():
    with pytest.warns(ReproducibilityWarning, match="already built on a draw with the same seed and key"):
        tfrepro.data.map_with_seed(_numbers(key="twice"), lambda x, s: x, seed=1, key="twice")


def test_passes_while_the_clock_was_never_set_draw_anew_in_the_same_order_every_run(monkeypatch):
    """A custom loop without set_epoch: the n-th iterator over the same draws iterates the pipeline
    made again at epoch n (it used to draw epoch 0's numbers every pass: the same augmentation every
    epoch), as a loop calling set_epoch(n) would; other draws count apart. Where the pipeline cannot
    be made again, the second pass is warned about (the symptom: the same draws)."""
    from tfrepro.data import pipeline_checks
    from tfrepro.determinism import epochs

    monkeypatch.setattr(epochs, "_moved", False)  # a fresh custom loop: no fit, no set_epoch yet

    def passes():
        monkeypatch.setattr(pipeline_checks, "_passes", {})  # as in a fresh process
        keyed = _numbers(key="loop")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return [_values(keyed) for _ in range(3)]

    first = passes()
    assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[1], first[2])
    assert all(np.array_equal(a, b) for a, b in zip(first, passes()))  # the same in every run
    assert np.array_equal(first[2], _values(_numbers(key="loop", epoch=2)))  # pass 2: epoch 2's draws
    unmade = tf.data.experimental.assert_cardinality(8)(_numbers(key="unmade"))
    once = _values(unmade)
    with pytest.warns(ReproducibilityWarning, match=r"a second pass over map_with_seed \(key 'unmade'\) began while"):
        assert np.array_equal(_values(unmade), once)


def test_keyed_draws_ask_to_be_sharded_by_element_unless_their_input_chose():
    """A keyed pass has no file source to shard by: each worker draws the whole pass and keeps its
    share (``AutoShardPolicy.DATA``); a policy set on the input stands."""
    policies = tf.data.experimental.AutoShardPolicy
    data = tf.data.Dataset.range(8)
    for keyed in (tfrepro.data.shuffle(data, 8, seed=1), _numbers(key="aug")):
        assert keyed.options().experimental_distribute.auto_shard_policy == policies.DATA
    chosen = tf.data.Options()
    chosen.experimental_distribute.auto_shard_policy = policies.OFF
    own = tfrepro.data.shuffle(data.with_options(chosen), 8, seed=1)
    assert own.options().experimental_distribute.auto_shard_policy == policies.OFF
    assert data.options().experimental_distribute.auto_shard_policy == policies.AUTO
    by_file = tf.data.Options()
    by_file.experimental_distribute.auto_shard_policy = policies.FILE
    with pytest.raises(ValueError, match="auto-shard policy is FILE: a keyed draw cannot be sharded by file"):
        tfrepro.data.shuffle(data.with_options(by_file), 8, seed=1)
