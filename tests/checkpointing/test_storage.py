"""Checkpoint files: atomic, newest-N, pickle-free, damaged ones skipped. No TensorFlow needed."""

from __future__ import annotations

import io
import json
import warnings
import zipfile

import numpy as np
import pytest

from tfrepro._files import atomic_file
from tfrepro.checkpointing import storage
from tfrepro.errors import ReproducibilityWarning

pytestmark = pytest.mark.core


def manifest(epoch, batch, members=()):
    return {"format": storage.FORMAT, "position": {"epoch": epoch, "batch": batch, "trained": 0},
            "members": sorted(members)}


def save(folder, epoch, batch=0, keep=3):
    return storage.write(folder, manifest(epoch, batch, ["variable/0"]), {"variable/0": bytes([epoch, batch])}, keep)


def test_round_trip_and_order(tmp_path):
    for epoch, batch in [(1, 0), (0, 7), (2, 3)]:
        save(tmp_path, epoch, batch)
    assert [p.name for p in storage.list_checkpoints(tmp_path)] == [
        "ckpt-e000000-b00000007.npz", "ckpt-e000001-b00000000.npz", "ckpt-e000002-b00000003.npz"]
    latest = storage.latest(tmp_path)
    assert (latest.epoch, latest.batch, latest.members) == (2, 3, {"variable/0": bytes([2, 3])})


def test_keeps_the_newest_n(tmp_path):
    for epoch in range(1, 6):
        save(tmp_path, epoch, keep=2)
    assert [p.name for p in storage.list_checkpoints(tmp_path)] == ["ckpt-e000004-b00000000.npz",
                                                                    "ckpt-e000005-b00000000.npz"]


def test_a_write_that_fails_leaves_the_previous_file_whole(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_file(target) as file:
        file.write(b"half of the new")
        raise RuntimeError("killed")
    assert target.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [target]


def test_a_killed_writers_temporary_file_is_never_read_and_is_removed_by_the_next_save(tmp_path):
    save(tmp_path, 1)
    leftover = tmp_path / ".ckpt-e000002-b00000000.npz.123.456.tmp"
    leftover.write_bytes(b"PK\x03\x04 half a zip")
    assert storage.latest(tmp_path).epoch == 1
    save(tmp_path, 2)
    assert not leftover.exists()


def test_a_damaged_newest_file_is_skipped_with_a_warning(tmp_path):
    save(tmp_path, 1)
    damaged = save(tmp_path, 2)
    damaged.write_bytes(damaged.read_bytes()[:40])
    with pytest.warns(ReproducibilityWarning, match="skipping checkpoint .*e000002"):
        assert storage.latest(tmp_path).epoch == 1


def test_loading_never_unpickles(tmp_path):
    # A file holding a pickled object array (what np.save writes for dtype=object) is refused, not run.
    path = tmp_path / "ckpt-e000001-b00000000.npz"
    buffer = io.BytesIO()
    np.savez(buffer, manifest=np.frombuffer(json.dumps(manifest(1, 0)).encode(), np.uint8),
             payload=np.array([{"__reduce__": "os.system"}], dtype=object))
    path.write_bytes(buffer.getvalue())
    with pytest.raises(ValueError, match="not readable"):
        storage.read(path)
    with zipfile.ZipFile(path) as archive:  # it really is a pickle inside
        assert b"\x80" in archive.read("payload.npy")


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(format="other/9"), "not a tfrepro.checkpoint/1 checkpoint"),
    (lambda m: m.update(members=["variable/0", "variable/1"]), "lacks variable/1"),
])
def test_a_file_that_is_not_a_whole_checkpoint_is_refused(tmp_path, change, message):
    body = manifest(1, 0, ["variable/0"])
    change(body)
    storage.write(tmp_path, body, {"variable/0": b"\x00"}, keep=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert storage.latest(tmp_path) is None
    assert message in str(caught[0].message)
