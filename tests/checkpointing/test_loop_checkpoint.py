"""LoopCheckpoint in one process: a GradientTape loop resumed from a middle checkpoint by a new model
of the same code ends on the uninterrupted run's bits; kernel-held random ops are refused by name;
bad arguments and other objects are refused. (Killed in a fresh process: test_resume.py.)"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import tfrepro
from conftest import positions_checked
from tfrepro.checkpointing import storage

pytestmark = pytest.mark.keras


def dataset(tf):
    x = np.linspace(0, 1, 48 * 4, dtype="float32").reshape(48, 4)
    y = (x.sum(axis=1) > 2).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(48, seed=3, reshuffle_each_iteration=True).batch(8)


def build(keras, tf, *middle):
    tfrepro.patch(3)  # before the model is built: Keras 2 layers then draw from generators (conftest unpatches)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), *middle,
                              keras.layers.Dropout(0.3), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam(1e-2)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    generator = tf.random.Generator.from_seed(9)  # drawn by the loop itself: a state of its own

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x + generator.normal(tf.shape(x)) * 0.01, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    return model, optimizer, generator, step


def state_bytes(*objects):
    from tfrepro.checkpointing import model_state

    return [np.asarray(v.numpy()).tobytes() for obj in objects for _, v in model_state.variables_of(obj)]


@pytest.mark.parametrize("every", ["epoch", 4])
def test_a_gradient_tape_loop_resumes_bitwise(tmp_path, keras, every):
    import tensorflow as tf

    def run(folder):
        with tfrepro.patched(3):
            model, optimizer, generator, step = build(keras, tf)
            checkpoint = tfrepro.LoopCheckpoint(folder, save_freq=every, max_to_keep=20, model=model,
                                                optimizer=optimizer, generator=generator)
            for _, (x, y) in checkpoint.loop(dataset(tf), epochs=3):
                step(x, y)
        return state_bytes(model, optimizer, generator), checkpoint

    whole, _ = run(tmp_path / "whole")
    saved = storage.list_checkpoints(tmp_path / "whole")
    assert [p.name for p in saved][-1] == "ckpt-e000003-b00000000.npz"  # 18 batches: the end is saved
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    middle = len(saved) // 2
    for newer in storage.list_checkpoints(tmp_path / "resumed")[middle:]:
        newer.unlink()
    resumed, checkpoint = run(tmp_path / "resumed")
    assert checkpoint.restored_from.name == saved[middle - 1].name
    assert resumed == whole

    again, checkpoint = run(tmp_path / "resumed")  # ended: yields nothing, restores the end
    assert again == whole and checkpoint.position.trained == 18


def test_a_loop_over_keyed_input_starts_at_the_checkpoints_epoch_and_skips_its_batches_uncomputed(
        tmp_path, keras, caplog):
    """Resumed at batch 4 of epoch 2 of 3, from keyed input: the map never sees the 32 elements of
    that epoch's 4 batches before, nor any earlier epoch's (its assertion on the element's position
    in the pass would fail), the state ends on the uninterrupted run's bits, and the log says so."""
    import logging

    import tensorflow as tf

    def run(folder, first_position):
        with tfrepro.patched(3):
            model, optimizer, generator, step = build(keras, tf)
            data = positions_checked(tf, 48, first_position)
            checkpoint = tfrepro.LoopCheckpoint(folder, save_freq=4, max_to_keep=20, model=model, optimizer=optimizer,
                                                generator=generator)
            for _, (features, labels) in checkpoint.loop(data, epochs=3):
                step(features, labels)
        return state_bytes(model, optimizer, generator)

    whole = run(tmp_path / "whole", 0)
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    saved = storage.list_checkpoints(tmp_path / "resumed")
    assert [p.name for p in saved[-2:]] == ["ckpt-e000002-b00000004.npz", "ckpt-e000003-b00000000.npz"]
    saved[-1].unlink()
    with caplog.at_level(logging.INFO, logger="tfrepro.checkpointing"):
        resumed = run(tmp_path / "resumed", 32)
    assert resumed == whole
    assert "epoch 2's input drawn directly, no earlier epoch replayed; its 4 batches before skipped without " \
           "computing them (past " in caplog.text


def test_restore_and_save_by_hand(tmp_path, keras):
    import tensorflow as tf

    model, optimizer, generator, step = build(keras, tf)
    checkpoint = tfrepro.LoopCheckpoint(tmp_path, model=model, optimizer=optimizer, generator=generator)
    assert checkpoint.restore() == tfrepro.checkpointing.loop.LoopPosition()  # nothing yet
    for x, y in dataset(tf).take(2):
        step(x, y)
    checkpoint.save(epoch=0, batch=2, trained=2)
    before = state_bytes(model, optimizer, generator)

    model2, optimizer2, generator2, _ = build(keras, tf)  # optimizer2 unbuilt: built to restore its slots
    position = tfrepro.LoopCheckpoint(tmp_path, model=model2, optimizer=optimizer2, generator=generator2).restore()
    assert (position.epoch, position.batch, position.trained) == (0, 2, 2)
    assert state_bytes(model2, optimizer2, generator2) == before

    with pytest.raises(tfrepro.CheckpointError, match="objects: checkpoint"):
        tfrepro.LoopCheckpoint(tmp_path, model=model2).restore()


def test_a_loop_calling_stateful_random_ops_is_refused_by_name(tmp_path, keras):
    import tensorflow as tf

    class Noisy(keras.layers.Layer):
        def call(self, x, training=None):
            return x + tf.random.normal(tf.shape(x))

    model, optimizer, _, step = build(keras, tf, Noisy(name="noisy"))
    checkpoint = tfrepro.LoopCheckpoint(tmp_path, save_freq=1, model=model, optimizer=optimizer)
    with pytest.raises(tfrepro.CheckpointError, match="layer 'noisy' calls tf.random.normal"):
        for _, (x, y) in checkpoint.loop(dataset(tf), epochs=1):
            step(x, y)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("kwargs, error", [
    ({}, ValueError),  # nothing to save
    ({"save_freq": 0, "model": 1}, ValueError),
    ({"max_to_keep": 0, "model": 1}, ValueError),
])
def test_bad_arguments_are_refused(tmp_path, kwargs, error):
    with pytest.raises(error):
        tfrepro.LoopCheckpoint(tmp_path, **kwargs)


def test_no_directory_outside_tfrepro_run_is_refused():
    with pytest.raises(ValueError, match="tfrepro run --checkpoint"):
        tfrepro.LoopCheckpoint(model=1)


@pytest.mark.slow
def test_cli_says_in_one_line_when_a_custom_loop_checkpointed_nothing(tmp_path):
    """Under `tfrepro run --checkpoint`, a loop without Model.fit nor LoopCheckpoint: one line on
    stderr, and the script's own exit code."""
    import sys

    from conftest import run_tfrepro
    from tfrepro.checkpointing.resuming import NOTHING_CHECKPOINTED

    code = ("import sys, tensorflow as tf; w = tf.Variable(1.0); opt = tf.keras.optimizers.SGD(0.1)\n"
            "for _ in range(3):\n"
            "    with tf.GradientTape() as tape: loss = w * w\n"
            "    opt.apply_gradients([(tape.gradient(loss, w), w)])\n"
            "sys.exit(3)")
    proc = run_tfrepro("run", "--checkpoint", str(tmp_path / "ckpt"), "--", sys.executable, "-c", code)
    assert proc.returncode == 3
    lines = [line for line in proc.stderr.splitlines() if "tfrepro" in line]
    assert lines == [NOTHING_CHECKPOINTED]
    assert not (tmp_path / "ckpt").exists()
