"""Under ``patch``, ``Dataset.shuffle`` orders each pass by the seed, the call and the epoch
(``tfrepro.data.dataset_shuffling``): epoch E's order is drawn directly, so a resume replays nothing.
Negative control: TF's own reshuffle, whose order of epoch E depends on the passes before it."""

import numpy as np
import pytest
import tensorflow as tf

import tfrepro
import tfrepro.data
from tfrepro.checkpointing import input_position

pytestmark = pytest.mark.core  # TF 2.12's leg too


def _shuffled(size=12, **kwargs):
    return tf.data.Dataset.range(size).shuffle(size, **kwargs)  # one call site: one key


def _order(dataset):
    return [int(v) for v in dataset.as_numpy_iterator()]


def _at(epoch, dataset):
    tfrepro.data.set_epoch(epoch)
    return _order(dataset)


@pytest.fixture(autouse=True)
def _epoch_zero():
    yield
    tfrepro.data.set_epoch(0)


def test_each_epoch_gets_its_own_order_drawn_directly_and_tfs_own_reshuffle_does_not():
    with tfrepro.patched(3):
        trained = _shuffled()
        epochs = [_at(e, trained) for e in range(4)]  # as fit draws them, one pass an epoch
        direct = _at(2, _shuffled())  # a resume at epoch 2: a new pipeline, no epoch before it drawn
        assert _at(2, trained) == epochs[2]  # a peek or an evaluation changes nothing
    assert all(sorted(order) == list(range(12)) for order in epochs)
    assert len({tuple(order) for order in epochs}) == 4
    assert direct == epochs[2]
    assert _order(tf.data.Dataset.range(12).shuffle(12, reshuffle_each_iteration=False)) is not None
    # Negative control: TF's reshuffle draws pass k from a counter of the passes before it
    tf.random.set_seed(3)
    stock = _shuffled()
    passes = [_order(stock) for _ in range(3)]
    tf.random.set_seed(3)
    assert _order(_shuffled()) == passes[0] != passes[2]  # a new pipeline's first pass is pass 0's, not epoch 2's


def test_the_seed_argument_or_else_the_call_site_keys_the_order():
    """As with TF, one seed gives one order: features and labels shuffled apart with seed=7 stay
    paired (and zip says nothing). Without a seed, each call has its own order."""
    import warnings

    features, labels = tf.data.Dataset.range(12), tf.data.Dataset.range(100, 112)
    with tfrepro.patched(3):
        here, there = _order(_shuffled()), _order(tf.data.Dataset.range(12).shuffle(12))
        seeded = [_order(_shuffled(seed=s)) for s in (1, 2, 1)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pairs = list(tf.data.Dataset.zip((features.shuffle(12, seed=7), labels.shuffle(12, seed=7)))
                         .as_numpy_iterator())
        with pytest.warns(tfrepro.ReproducibilityWarning, match="give the second its own seed="):  # not key=
            tf.data.Dataset.range(12).shuffle(12).shuffle(6)  # one line, one key: the same permutation twice
    with tfrepro.patched(4):
        other_patch_seed = _order(_shuffled())
    assert here != there  # two calls: two keys
    assert seeded[0] == seeded[2] != seeded[1]
    assert other_patch_seed != here
    assert all(label == feature + 100 for feature, label in pairs) and [f for f, _ in pairs] != list(range(12))


def test_what_stays_tfs_shuffle():
    def ops(dataset):
        graph = tf.compat.v1.GraphDef.FromString(tf.raw_ops.DatasetToGraphV2(
            input_dataset=dataset._variant_tensor, external_state_policy=1, strip_device_assignment=True).numpy())
        return {node.op for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]}

    def keyed(dataset):  # TF's seed-tensor shuffle in a pass made from the epoch clock's file
        found = ops(dataset)
        return {"FlatMapDataset", "ShuffleDataset"} <= found and "ShuffleDatasetV3" not in found and any(
            op.startswith("FixedLengthRecordDataset") for op in found)

    data = tf.data.Dataset.range(12)
    unsharded = tf.data.Options()
    unsharded.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    with tfrepro.patched(3):
        assert keyed(data.shuffle(12))
        assert keyed(data.shuffle(tf.constant(12, tf.int64), reshuffle_each_iteration=True))
        assert "ShuffleDatasetV3" in ops(data.shuffle(12, reshuffle_each_iteration=False))  # addressable as it is
        assert "ShuffleDatasetV3" in ops(data.with_options(unsharded).shuffle(12))  # a keyed pass has no files
        # Built in a tf.data function, a sub-dataset's pass starts while training runs: TF's
        inner = data.interleave(lambda i: tf.data.Dataset.range(4).shuffle(4), cycle_length=2)
        assert "ShuffleDatasetV3" in ops(inner) and not keyed(inner)
        # TF's own shuffle of file names: a multi-worker strategy shards the files (a keyed pass has none)
        assert "ShuffleDatasetV3" in ops(tf.data.Dataset.list_files(__file__, shuffle=True))
    assert "ShuffleDatasetV3" in ops(data.shuffle(12))  # no patch: TF's


def test_a_repeat_after_it_keys_each_pass_anew_and_the_input_without_it_is_addressable():
    """``shuffle(N).batch(B).repeat()``, as under fit(steps_per_epoch=): each pass another order, the
    same in a second build, whatever the clock does meanwhile; and fit's input without the repeat is
    addressable by epoch (a resume draws its epoch directly)."""
    def pipeline():
        return tf.data.Dataset.range(10).shuffle(10).batch(4)

    def passes(clock_then):
        tfrepro.data.set_epoch(2)
        iterator = iter(pipeline().repeat())
        first = next(iterator)
        tfrepro.data.set_epoch(clock_then)  # fit moves the clock while the next pass is pulled ahead
        return [first.numpy().tolist()] + [next(iterator).numpy().tolist() for _ in range(8)]

    with tfrepro.patched(3):
        seen = passes(30)
        assert seen == passes(3)
        addressable = input_position._why_input_replayed(tf, pipeline().prefetch(2), True, "the training input")
    orders = [sum(seen[3 * k:3 * k + 3], []) for k in range(3)]
    assert all(sorted(order) == list(range(10)) for order in orders) and len({tuple(o) for o in orders}) == 3
    assert addressable is None
    assert "a Dataset.shuffle reshuffles each pass" in input_position._why_input_replayed(
        tf, pipeline(), True, "the training input")  # no patch: TF's shuffle, replayed
