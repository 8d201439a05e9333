"""Pipelines that would silently undo keyed draws are named as they are built
(``tfrepro.data.pipeline_checks``): ``repeat()`` after a draw keyed by the training epoch raises,
``cache()`` after one and ``zip`` of two draws with one key warn, and each shows the symptom it names."""

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


def test_repeat_after_a_draw_keyed_by_the_training_epoch_raises_and_before_it_does_not():
    with pytest.raises(ValueError, match=r"repeat\(\) after map_with_seed .* races with fit's clock"):
        _numbers(key="aug").batch(2).repeat()
    with pytest.raises(ValueError, match=r"repeat\(\) after tfrepro.data.shuffle \(key 'shuffle'\)"):
        tfrepro.data.shuffle(tf.data.Dataset.range(8), 8, seed=1).repeat(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _numbers(key="aug").repeat(1)  # one pass: nothing starts ahead
        _numbers(key="aug", epoch=4).repeat()  # a fixed epoch reads no clock
        data = tf.data.Dataset.range(8).repeat()  # repeat() before the draw: the documented way
        tfrepro.data.map_with_seed(data, lambda x, s: x, seed=1, key="after").take(3)


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


def test_a_second_pass_while_the_clock_was_never_set_warns_and_draws_the_same(monkeypatch):
    from tfrepro.data import pipeline_checks
    from tfrepro.determinism import epochs

    monkeypatch.setattr(epochs, "_moved", False)  # a fresh custom loop: no fit, no set_epoch yet
    monkeypatch.setattr(pipeline_checks, "_passes", {})
    keyed = _numbers(key="loop")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = _values(keyed)  # one pass: nothing to say
    with pytest.warns(ReproducibilityWarning, match=r"a second pass over map_with_seed \(key 'loop'\) began while"):
        second = _values(keyed)
    assert np.array_equal(first, second)  # the symptom: the same augmentation every epoch
    tfrepro.data.set_epoch(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert not np.array_equal(_values(keyed), first)  # the fix: a new epoch draws anew, silently
    finally:
        tfrepro.data.set_epoch(0)


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
