"""Exact resume, in fresh processes: train 4 epochs uninterrupted; separately, kill the run with
SIGKILL and start it again. The final weights and the per-batch traces from the resume point on are
bitwise identical. The model has Dropout, its tf.data input reshuffles every epoch, and a
``map_with_seed`` augmentation draws stateless noise per element (tests/scripts/resume_train.py).
Negative control: Keras's own BackupAndRestore, in the same experiment, ends elsewhere."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from conftest import SCRIPTS, clean_env, run_python, run_tfrepro
from tfrepro.checkpointing import storage

pytestmark = [pytest.mark.keras, pytest.mark.slow]
# Keras 2's leg keeps the kill between epochs (also the oldest TF's, core) and BackupAndRestore's negative control
# (Keras's own callback, another in tf-keras), and leaves the rest to Keras 3, within CI's budget: on Keras 2 the
# zoo's resume column kills every pattern mid-epoch (step 5 of 8, 4 batches an epoch) under tfrepro run
# --checkpoint, the custom loops' included, and resumes it to the uninterrupted bits, and the messages checked do
# not depend on the Keras version.
KERAS2 = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
KERAS3_LEG = pytest.mark.skipif(KERAS2, reason="Keras 3's leg: on Keras 2 the zoo's resume column (KERAS2 above)")
SCRIPT = str(SCRIPTS / "resume_train.py")
KILLED = -signal.SIGKILL


def run_train(tmp_path, name, *args, expect=0, tfrepro_run=None):
    """The script's process, its weights in ``tmp_path/NAME.npy``."""
    weights = tmp_path / f"{name}.npy"
    if tfrepro_run is None:
        proc = run_python(SCRIPT, "--weights", str(weights), *args, env=clean_env(PYTHONHASHSEED="7"))
    else:
        proc = run_tfrepro("run", "--seed", "7", *tfrepro_run, "--", sys.executable, SCRIPT, "--weights",
                           str(weights), *args)
    assert proc.returncode == expect, proc.stderr[-3000:]
    return proc


def train(tmp_path, name, *args, expect=0, tfrepro_run=None):
    run_train(tmp_path, name, *args, expect=expect, tfrepro_run=tfrepro_run)
    return (tmp_path / f"{name}.npy").read_bytes() if expect == 0 else None


def records(path):
    """The batch records of a trace, by (epoch, batch), without the per-fit step counter."""
    found = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "batch":
            found[(record["epoch"], record["batch"])] = {k: v for k, v in record.items() if k != "step"}
    return found


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The 4-epoch run without interruption: its weights and its trace."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    weights = train(folder, "full", "--checkpoint", str(folder / "ckpt"), "--trace", str(folder / "full.jsonl"))
    return weights, records(folder / "full.jsonl")


def resume_and_compare(tmp_path, uninterrupted, kill_args, resume_args, first_resumed):
    full_weights, full_records = uninterrupted
    if kill_args is not None:
        train(tmp_path, "killed", *kill_args, expect=KILLED)
    weights = train(tmp_path, "resumed", *resume_args, "--trace", str(tmp_path / "resumed.jsonl"))
    assert weights == full_weights  # the raw bytes of every weight
    resumed = records(tmp_path / "resumed.jsonl")
    assert min(resumed) == first_resumed  # the trace starts at the resume point: nothing before was trained
    assert len(resumed) == len([k for k in full_records if k >= first_resumed])
    for key, record in resumed.items():
        assert record == full_records[key], key  # exact loss and metric bits, weight fingerprints


@pytest.mark.core
def test_resume_after_sigkill_between_epochs_is_bitwise(tmp_path, uninterrupted):
    ckpt = str(tmp_path / "ckpt")
    resume_and_compare(tmp_path, uninterrupted, ["--checkpoint", ckpt, "--kill-at", "2,1"], ["--checkpoint", ckpt],
                       first_resumed=(2, 0))


@KERAS3_LEG
def test_resume_mid_epoch_is_bitwise(tmp_path, uninterrupted):
    ckpt = str(tmp_path / "ckpt")
    resume_and_compare(tmp_path, uninterrupted, ["--checkpoint", ckpt, "--every", "7", "--kill-at", "1,4"],
                       ["--checkpoint", ckpt, "--every", "7"], first_resumed=(1, 4))


@pytest.mark.skipif(KERAS2, reason="Keras 3's leg: the write is tfrepro's storage, no Keras in it (a kill inside "
                                   "it: tests/checkpointing/test_storage.py, on every leg)")
def test_sigkill_during_a_checkpoint_write_resumes_from_the_one_before(tmp_path, uninterrupted):
    ckpt = tmp_path / "ckpt"
    # The 3rd file (after epoch 3) dies after its bytes, before its rename: epoch 2's is the newest whole one.
    train(tmp_path, "killed", "--checkpoint", str(ckpt), "--kill-in-write", "3", expect=KILLED)
    assert sorted(p.name for p in ckpt.glob("ckpt-*")) == ["ckpt-e000001-b00000000.npz", "ckpt-e000002-b00000000.npz"]
    assert len(list(ckpt.glob(".ckpt-e000003-b00000000.npz.*.tmp"))) == 1  # the half-made file, never read
    resume_and_compare(tmp_path, uninterrupted, None, ["--checkpoint", str(ckpt)], first_resumed=(2, 0))
    assert not list(ckpt.glob(".*.tmp"))  # cleaned up by the next save


@KERAS3_LEG
def test_unmodified_script_under_tfrepro_run_checkpoint_resumes_exactly(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    full = train(tmp_path, "full", "--plain", tfrepro_run=["--checkpoint", str(tmp_path / "full-ckpt")])
    train(tmp_path, "killed", "--plain", "--kill-at", "2,3", expect=KILLED, tfrepro_run=["--checkpoint", ckpt])
    newest = tmp_path / "ckpt" / "fit-0" / "ckpt-e000002-b00000000.npz"
    assert newest.is_file()
    proc = run_train(tmp_path, "resumed", "--plain", tfrepro_run=["--checkpoint", ckpt])
    assert (tmp_path / "resumed.npy").read_bytes() == full
    said = [line for line in proc.stderr.splitlines() if line.startswith("tfrepro: resumed")]
    # Dataset.shuffle is keyed under patch (tfrepro run's too); the script's own Dataset.random is not
    assert said == [f"tfrepro: resumed from {newest}: epoch 2, batch 0, 20 batches trained; replaying the input of "
                    "the 2 epochs before: the training input: a Dataset.random (or a repeat() after a keyed draw) "
                    "draws each pass by how many passes came before (use tfrepro.data.map_with_seed, and no repeat() "
                    "after it)"]


@KERAS3_LEG
def test_a_custom_loop_under_tfrepro_run_checkpoint_resumes_mid_epoch_exactly(tmp_path):
    """A GradientTape loop with tfrepro.LoopCheckpoint() (no folder: tfrepro run gives it DIR/loop-0),
    every 7 batches of 10 per epoch, killed before batch 3 of epoch 2 (the newest checkpoint is
    after batch 1 of it)."""
    every = ["--checkpoint-every", "7"]
    full = train(tmp_path, "full", "--loop", tfrepro_run=["--checkpoint", str(tmp_path / "full-ckpt"), *every])
    ckpt = tmp_path / "ckpt"
    train(tmp_path, "killed", "--loop", "--kill-at", "2,3", expect=KILLED,
          tfrepro_run=["--checkpoint", str(ckpt), *every])
    newest = ckpt / "loop-0" / "ckpt-e000002-b00000001.npz"
    assert storage.list_checkpoints(ckpt / "loop-0")[-1] == newest
    proc = run_train(tmp_path, "resumed", "--loop", tfrepro_run=["--checkpoint", str(ckpt), *every])
    assert (tmp_path / "resumed.npy").read_bytes() == full
    assert f"tfrepro: resumed from {newest}: epoch 2, batch 1, 21 batches trained" in proc.stderr.splitlines()


def test_negative_control_backup_and_restore_alone_ends_elsewhere(tmp_path, uninterrupted):
    backup = str(tmp_path / "backup")
    train(tmp_path, "killed", "--backup", backup, "--kill-at", "2,1", expect=KILLED)
    weights = train(tmp_path, "resumed", "--backup", backup)
    assert weights != uninterrupted[0]
