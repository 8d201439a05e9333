"""ReproCheckpoint in one process: arguments, mismatch errors, callback state, ended runs, the CLI."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

import tfrepro
from conftest import positions_checked, run_tfrepro
from tfrepro.checkpointing import storage

pytestmark = pytest.mark.keras


def dataset(tf, batch_size=8):
    x = np.linspace(0, 1, 64 * 4, dtype="float32").reshape(64, 4)
    y = (x.sum(axis=1) > 2).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=3).batch(batch_size)


def model(keras, units=8, **compile_options):
    built = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units, activation="relu"), keras.layers.Dense(2)])
    built.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  **compile_options)
    return built


def weights_bytes(trained):
    return [np.asarray(w.numpy()).tobytes() for w in trained.weights]


# Resumed in the same process from a middle checkpoint; the model has no random layer, so the
# resumed run must end on the uninterrupted one's bits. Each variant once broke a first version.
VARIANTS = {
    "steps_per_execution=3 (a short last execution)": ({"steps_per_execution": 3}, {}, 4, None),
    "validation each epoch": ({}, {"validation": True}, "epoch", None),
    "ReduceLROnPlateau listed after the checkpoint": ({}, {}, "epoch", "plateau"),
    "LearningRateScheduler on the current rate, mid-epoch": ({}, {}, 3, "schedule"),
    "every divides the steps per epoch": ({}, {}, 4, None),
    "NumPy arrays shuffled by fit": ({}, {"input": "numpy"}, 3, None),
    "a Python generator": ({}, {"input": "generator"}, 3, None),
}


def inputs(tf, kind):
    """What fit is given: a tf.data pipeline reshuffled each epoch, arrays for fit to shuffle, or an
    endless generator of batches drawn from a seeded NumPy generator (with steps_per_epoch)."""
    x = np.linspace(0, 1, 64 * 4, dtype="float32").reshape(64, 4)
    y = (x.sum(axis=1) > 2).astype("int64")
    if kind == "numpy":
        return {"x": x, "y": y, "batch_size": 8, "shuffle": True}
    if kind == "generator":
        def batches():
            rng = np.random.default_rng(5)
            while True:
                pick = rng.choice(64, 8, replace=False)
                yield x[pick], y[pick]
        return {"x": batches(), "steps_per_epoch": 8}
    return {"x": tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=3, reshuffle_each_iteration=True).batch(8)}


@pytest.mark.parametrize("variant", VARIANTS)
def test_resuming_in_process_ends_on_the_uninterrupted_bits(tmp_path, keras, variant):
    import tensorflow as tf

    compile_options, fit_options, every, extra = VARIANTS[variant]

    def run(folder):
        after = []
        if extra == "plateau":
            after = [keras.callbacks.ReduceLROnPlateau(monitor="loss", min_delta=10.0, patience=1, factor=0.5)]
        before = [keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.5)] if extra == "schedule" else []
        trained = model(keras, **compile_options)
        validation = dataset(tf) if fit_options.get("validation") else None
        with tfrepro.patched(3):  # the same TF op seeds in both runs (Keras shuffles arrays with TF ops)
            trained.fit(**inputs(tf, fit_options.get("input")), epochs=4, verbose=0, validation_data=validation,
                        callbacks=[*before, tfrepro.ReproCheckpoint(folder, save_freq=every, max_to_keep=20), *after])
        return trained, after

    whole, after_whole = run(tmp_path / "whole")
    saved = storage.list_checkpoints(tmp_path / "whole")
    middle = saved[len(saved) // 2 - 1]
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    for newer in storage.list_checkpoints(tmp_path / "resumed")[len(saved) // 2:]:
        newer.unlink()
    resumed, after_resumed = run(tmp_path / "resumed")
    assert weights_bytes(resumed) == weights_bytes(whole), f"resumed from {middle.name}"
    assert float(resumed.optimizer.learning_rate.numpy()) == float(whole.optimizer.learning_rate.numpy())
    assert [(c.wait, c.best) for c in after_resumed] == [(c.wait, c.best) for c in after_whole]
    if every == 4 and not compile_options:  # 8 batches an epoch: a save on its last batch lands at the next start
        assert all(name.name.endswith("-b00000000.npz") or "-b00000004" in name.name for name in saved)


def test_a_fit_that_raised_leaves_no_checkpointing_behind(tmp_path, keras):
    import tensorflow as tf

    class Fail(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("crash")

    trained = model(keras)
    with pytest.raises(RuntimeError, match="crash"):
        trained.fit(dataset(tf), epochs=3, verbose=0, callbacks=[tfrepro.ReproCheckpoint(tmp_path), Fail()])
    before = int(trained.optimizer.iterations.numpy())
    trained.fit(dataset(tf), epochs=1, verbose=0)  # no ReproCheckpoint: a plain epoch of 8 batches
    assert int(trained.optimizer.iterations.numpy()) == before + 8


@pytest.mark.parametrize("kwargs, error", [
    ({"backup_dir": 3}, TypeError),
    ({"save_freq": 0}, ValueError),
    ({"save_freq": True}, ValueError),
    ({"save_freq": "batch"}, ValueError),
    ({"max_to_keep": 0}, ValueError),
])
def test_bad_arguments_are_refused_in_init(tmp_path, keras, kwargs, error):
    with pytest.raises(error):
        tfrepro.ReproCheckpoint(**{"backup_dir": tmp_path, **kwargs})


def test_a_checkpoint_of_another_model_or_configuration_lists_the_mismatch(tmp_path, keras):
    import tensorflow as tf

    model(keras).fit(dataset(tf), epochs=1, verbose=0, callbacks=[tfrepro.ReproCheckpoint(tmp_path)])
    with pytest.raises(tfrepro.CheckpointError) as caught:
        model(keras, units=9).fit(dataset(tf), epochs=2, verbose=0, callbacks=[tfrepro.ReproCheckpoint(tmp_path)])
    assert any("model variable 0" in line and "[4, 8]" in line and "[4, 9]" in line for line in caught.value.mismatch)
    with pytest.raises(tfrepro.CheckpointError, match="steps per epoch: checkpoint 8, this run 4"):
        model(keras).fit(dataset(tf, 16), epochs=2, verbose=0, callbacks=[tfrepro.ReproCheckpoint(tmp_path)])


def test_callback_state_is_restored_and_an_ended_run_trains_nothing(tmp_path, keras):
    import tensorflow as tf

    def run(folder):
        watched = [keras.callbacks.ReduceLROnPlateau(monitor="loss", min_delta=10.0, patience=10),
                   keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=10)]
        trained = model(keras)
        trained.fit(dataset(tf), epochs=4, verbose=0, callbacks=[*watched, tfrepro.ReproCheckpoint(folder)])
        return trained, watched

    whole, watched_whole = run(tmp_path / "whole")
    assert min(c.wait for c in watched_whole) >= 3  # no epoch improves by 10: both count up
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    for newer in storage.list_checkpoints(tmp_path / "resumed")[-2:]:  # back to the end of epoch 2
        newer.unlink()
    resumed, watched_resumed = run(tmp_path / "resumed")
    assert [(c.wait, c.best) for c in watched_resumed] == [(c.wait, c.best) for c in watched_whole]
    assert watched_resumed[1].best_epoch == watched_whole[1].best_epoch
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(resumed.weights, whole.weights))

    again, _ = run(tmp_path / "resumed")  # the run ended: resuming it trains nothing, and restores it
    assert int(again.optimizer.iterations.numpy()) == int(whole.optimizer.iterations.numpy()) == 32
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(again.weights, whole.weights))


def test_keras2_layers_with_kernel_held_random_state_are_refused(tmp_path, keras):
    import tensorflow as tf

    if keras.__name__ == "keras" and keras.__version__.startswith("3"):
        pytest.skip("Keras 3 layers keep their seeds in variables")
    experimental = keras.backend.experimental
    enabled = experimental.is_tf_random_generator_enabled()
    experimental.disable_tf_random_generator()
    try:
        dropout = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.5), keras.layers.Dense(2)])
        dropout.compile(optimizer="sgd", loss="mse")
        with pytest.raises(tfrepro.CheckpointError, match="enable_tf_random_generator"):
            dropout.fit(dataset(tf), epochs=1, verbose=0, callbacks=[tfrepro.ReproCheckpoint(tmp_path)])
    finally:
        if enabled:
            experimental.enable_tf_random_generator()


@pytest.mark.parametrize("flags, message", [
    (["--checkpoint-every", "0"], "--checkpoint-every must be"),
    (["--checkpoint-every", "often"], "--checkpoint-every must be"),
    (["--checkpoint-keep", "0"], "--checkpoint-keep must be a positive integer"),
])
def test_cli_refuses_bad_checkpoint_options_in_one_line(tmp_path, flags, message):
    proc = run_tfrepro("run", "--checkpoint", str(tmp_path), *flags, "--", "python", "-c", "pass")
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_cli_refuses_a_file_as_the_checkpoint_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    proc = run_tfrepro("run", "--checkpoint", str(tmp_path / "file"), "--", "python", "-c", "pass")
    assert proc.returncode == 2 and "must name a folder" in proc.stderr


def test_cli_refuses_checkpoint_options_without_a_folder():
    proc = run_tfrepro("run", "--checkpoint-every", "5", "--", "python", "-c", "pass")
    assert proc.returncode == 2 and "need --checkpoint DIR" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_cli_reports_a_checkpoint_of_another_model_in_one_line(tmp_path):
    code = ("import sys, numpy as np, tensorflow as tf; k = tf.keras; n = int(sys.argv[1]); "
            "m = k.Sequential([k.Input((2,)), k.layers.Dense(n)]); m.compile('sgd', 'mse'); "
            "m.fit(np.ones((4, 2)), np.ones((4, n)), epochs=1, verbose=0)")
    folder = str(tmp_path / "ckpt")
    assert run_tfrepro("run", "--checkpoint", folder, "--", sys.executable, "-c", code, "1").returncode == 0
    proc = run_tfrepro("run", "--checkpoint", folder, "--", sys.executable, "-c", code, "2")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "tfrepro run --checkpoint: " in proc.stderr and "does not fit this training run" in proc.stderr
    assert "model variable 0: checkpoint" in proc.stderr


@pytest.mark.parametrize("loop", ["started at the checkpoint's epoch", "through the earlier epochs"])
def test_a_resume_of_keyed_input_draws_no_earlier_epoch_and_says_so(tmp_path, keras, caplog, monkeypatch, loop):
    """Input keyed by the epoch (tfrepro.data.shuffle, map_with_seed): resuming at epoch 3 of 4 draws
    and validates epoch 3 only, and ends on the uninterrupted run's bits: with fit's loop started at
    epoch 3 (through Keras's BackupAndRestore hook), and where that hook is missing, going through
    the earlier epochs without drawing. The elements drawn are counted by a py_function, which the
    input scan rightly refuses (Python may hold state): the scan is checked without the probe, and
    told to pass the probe."""
    import logging

    import tensorflow as tf

    import tfrepro.data
    from tfrepro.checkpointing import input_position
    from tfrepro.data.addressing import why_not_addressable

    x = np.linspace(0, 1, 64 * 4, dtype="float32").reshape(64, 4)
    y = (x.sum(axis=1) > 2).astype("int64")
    drawn, epochs_begun = [], []

    class Watched(tfrepro.ReproCheckpoint):
        def on_epoch_begin(self, epoch, logs=None):
            epochs_begun.append(epoch)
            super().on_epoch_begin(epoch, logs)

    def noisy(features, label, seed):
        features = tf.py_function(lambda v: drawn.append(1) or v, [features], tf.float32)
        return tf.ensure_shape(features, [4]) + tf.random.stateless_uniform([4], seed, -0.01, 0.01), label

    def run(folder, epochs=4):
        with tfrepro.patched(3):
            data = tfrepro.data.shuffle(tf.data.Dataset.from_tensor_slices((x, y)), 64)
            train = tfrepro.data.map_with_seed(data, noisy, key="noise").batch(8)
            validation = tfrepro.data.map_with_seed(tf.data.Dataset.from_tensor_slices((x, y)), noisy, key="val").batch(32)
            trained = model(keras)
            trained.fit(train, epochs=epochs, verbose=0, validation_data=validation,
                        callbacks=[Watched(folder, max_to_keep=20)])
        return trained

    with tfrepro.patched(3):
        keyed = tfrepro.data.map_with_seed(tfrepro.data.shuffle(tf.data.Dataset.from_tensor_slices((x, y)), 64),
                                           lambda f, label, seed: (f + tf.random.stateless_uniform([4], seed), label))
        assert why_not_addressable(keyed.batch(8)) is None
        assert "runs Python" in why_not_addressable(keyed.map(lambda f, label: (tf.py_function(tf.identity, [f], tf.float32), label)))
    monkeypatch.setattr(input_position, "why_not_addressable", lambda dataset: None)
    if loop == "through the earlier epochs":
        monkeypatch.setattr(input_position, "start_fit_at", lambda model, epoch, arguments: None)
    whole = run(tmp_path / "whole")
    assert len(drawn) == 4 * (64 + 64)  # 4 epochs of training and validation
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    storage.list_checkpoints(tmp_path / "resumed")[-1].unlink()  # the newest left: the end of epoch 3
    drawn.clear()
    epochs_begun.clear()
    with caplog.at_level(logging.INFO, logger="tfrepro.checkpointing"):
        resumed = run(tmp_path / "resumed")
    assert len(drawn) == 64 + 64  # epoch 3 only: no earlier epoch replayed, none validated again
    assert weights_bytes(resumed) == weights_bytes(whole)
    assert "epoch 3's input drawn directly, no earlier epoch replayed" in caplog.text
    assert epochs_begun == ([3] if loop == "started at the checkpoint's epoch" else [0, 1, 2, 3])
    history = resumed.fit(x, y, epochs=1, verbose=0)  # the hook undone: a later fit starts at its own epoch
    assert history.epoch == [0]


def test_a_resume_of_input_that_cannot_be_addressed_replays_and_says_why(tmp_path, keras, caplog):
    import logging

    import tensorflow as tf

    def run(folder, epochs):
        unkeyed = dataset(tf)  # made before the patch: TF's own reshuffle (under patch it would be keyed)
        with tfrepro.patched(3):
            trained = model(keras)
            trained.fit(unkeyed, epochs=epochs, verbose=0, callbacks=[tfrepro.ReproCheckpoint(folder)])

    run(tmp_path, 2)
    with caplog.at_level(logging.INFO, logger="tfrepro.checkpointing"):
        run(tmp_path, 3)
    assert "replaying the input of the 2 epochs before: the training input: a Dataset.shuffle reshuffles" in caplog.text


@pytest.mark.parametrize("within", ["skipped", "drawn (the negative control)"])
def test_a_mid_epoch_resume_of_keyed_input_skips_the_batches_before_without_computing_them(
        tmp_path, keras, caplog, monkeypatch, within):
    """Resumed at batch 6 of epoch 3 of 4, keyed input: the map never sees the 48 elements of the 6
    batches before (its assertion on the element's position in the pass would fail the fit), the run
    ends on the uninterrupted run's bits, and the log says so. Drawing them instead trips it."""
    import logging

    import tensorflow as tf

    from tfrepro.checkpointing import input_position
    from tfrepro.data import skipping

    def run(folder, first_position):
        with tfrepro.patched(3):
            trained = model(keras)
            checkpoint = tfrepro.ReproCheckpoint(tmp_path / folder, save_freq=3, max_to_keep=20)
            trained.fit(positions_checked(tf, 64, first_position), epochs=4, verbose=0, callbacks=[checkpoint])
        return trained

    whole = run("whole", 0)
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    newest = storage.list_checkpoints(tmp_path / "resumed")
    assert [p.name for p in newest[-2:]] == ["ckpt-e000003-b00000006.npz", "ckpt-e000004-b00000000.npz"]
    newest[-1].unlink()
    if within != "skipped":
        monkeypatch.setattr(input_position, "skip_within_epoch",
                            lambda iterator, batches: skipping.Skip(batches, why_not="told to draw"))
        with pytest.raises(tf.errors.InvalidArgumentError, match="assert"):
            run("resumed", 48)
        return
    with caplog.at_level(logging.INFO, logger="tfrepro.checkpointing"):
        resumed = run("resumed", 48)
    assert weights_bytes(resumed) == weights_bytes(whole)
    assert "the 6 batches before it skipped without computing them (past " in caplog.text
    assert "ParallelMapDatasetV2" in caplog.text
