"""Under ``patch``, ``Dataset.shuffle`` orders each pass by the seed, the call and the epoch
(``tfrepro.data.dataset_shuffling``): epoch E's order is drawn directly, so a resume replays nothing.
Negative control: TF's own reshuffle, whose order of epoch E depends on the passes before it."""

import numpy as np
import pytest
import tensorflow as tf

import tfrepro
import tfrepro.data
from tfrepro.checkpointing import input_position


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


def test_the_call_site_and_the_seed_argument_key_the_order():
    with tfrepro.patched(3):
        here, there = _order(_shuffled()), _order(tf.data.Dataset.range(12).shuffle(12))
        seeded = [_order(_shuffled(seed=s)) for s in (1, 2, 1)]
        other_patch_seed = None
    with tfrepro.patched(4):
        other_patch_seed = _order(_shuffled())
    assert here != there  # two calls: two keys
    assert seeded[0] == seeded[2] != seeded[1]
    assert other_patch_seed != here


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
    assert "ShuffleDatasetV3" in ops(data.shuffle(12))  # no patch: TF's


def test_a_repeat_after_it_keys_each_pass_by_its_ordinal_and_the_input_is_addressable():
    """``shuffle(N).batch(B).repeat()`` under fit(steps_per_epoch=) one pass long: pass k is epoch
    e0 + k's order, read once; and fit's input is addressable by epoch (a resume draws its epoch)."""
    def pipeline():
        return tf.data.Dataset.range(10).shuffle(10).batch(4)

    with tfrepro.patched(3):
        tfrepro.data.set_epoch(2)
        iterator = iter(pipeline().repeat())
        first = next(iterator)
        tfrepro.data.set_epoch(30)  # fit moves the clock while the next pass is pulled ahead
        seen = [first.numpy().tolist()] + [next(iterator).numpy().tolist() for _ in range(8)]
        expected = [b.tolist() for e in (2, 3, 4) for b in (tfrepro.data.set_epoch(e) or pipeline()).as_numpy_iterator()]
        assert seen == expected
        addressable = input_position._why_input_replayed(tf, pipeline().prefetch(2), True, "the training input")
    assert addressable is None
    assert "a Dataset.shuffle reshuffles each pass" in input_position._why_input_replayed(
        tf, pipeline(), True, "the training input")  # no patch: TF's shuffle, replayed
