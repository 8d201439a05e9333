"""The checkpointers take Keras's names (``backup_dir``, ``save_freq``, ``max_to_keep``); the names before
0.1.0 (``directory``, ``every``, ``keep``) still work for one release, with a DeprecationWarning at the
caller's line, and never together with the new ones. Constructing is enough: nothing trains."""

from __future__ import annotations

import inspect
import warnings

import pytest

import tfrepro

OLD_TO_NEW = {"directory": "backup_dir", "every": "save_freq", "keep": "max_to_keep"}


def test_the_signatures_show_the_new_names_only(keras):
    repro = inspect.signature(tfrepro.ReproCheckpoint)
    assert list(repro.parameters) == ["backup_dir", "save_freq", "max_to_keep"]
    assert repro.parameters["save_freq"].default == "epoch" and repro.parameters["max_to_keep"].default == 3
    loop = inspect.signature(tfrepro.LoopCheckpoint)
    assert list(loop.parameters) == ["backup_dir", "save_freq", "max_to_keep", "objects"]
    assert loop.parameters["save_freq"].kind is inspect.Parameter.KEYWORD_ONLY


def test_the_new_names_set_the_attributes(tmp_path, keras):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the new names never warn
        repro = tfrepro.ReproCheckpoint(tmp_path, save_freq=5, max_to_keep=2)
        loop = tfrepro.LoopCheckpoint(tmp_path, save_freq=4, max_to_keep=7, model=object())
        positional = tfrepro.ReproCheckpoint(tmp_path, 6, 4)
    assert (repro.backup_dir, repro.save_freq, repro.max_to_keep) == (tmp_path, 5, 2)
    assert (loop.backup_dir, loop.save_freq, loop.max_to_keep) == (tmp_path, 4, 7)
    assert (positional.save_freq, positional.max_to_keep) == (6, 4)
    assert list(loop.objects) == ["model"]


@pytest.mark.parametrize("cls", ["ReproCheckpoint", "LoopCheckpoint"])
def test_each_old_name_warns_at_the_callers_line_and_maps_to_the_new_one(tmp_path, keras, cls):
    make = getattr(tfrepro, cls)
    objects = {"model": object()} if cls == "LoopCheckpoint" else {}
    with pytest.warns(DeprecationWarning) as caught:
        checkpoint = make(directory=tmp_path, every=3, keep=5, **objects)
    assert (checkpoint.backup_dir, checkpoint.save_freq, checkpoint.max_to_keep) == (tmp_path, 3, 5)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(messages) == 3, messages
    for (old, new), message in zip(OLD_TO_NEW.items(), messages):
        assert f"{cls}({old}=...) is deprecated" in message and f"pass {new}=" in message, message
    assert {w.filename for w in caught} == {__file__}  # the caller's line, not tfrepro's
    if cls == "LoopCheckpoint":
        assert list(checkpoint.objects) == ["model"]  # no old name was taken for an object to save


@pytest.mark.parametrize("cls", ["ReproCheckpoint", "LoopCheckpoint"])
@pytest.mark.parametrize("old", list(OLD_TO_NEW))
def test_an_old_name_with_its_new_one_is_refused(tmp_path, keras, cls, old):
    make = getattr(tfrepro, cls)
    objects = {"model": object()} if cls == "LoopCheckpoint" else {}
    values = {"directory": tmp_path, "every": 2, "keep": 2}
    new = OLD_TO_NEW[old]
    given = {"backup_dir": tmp_path, new: values[old], old: values[old]}
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # refused before any warning
        with pytest.raises(TypeError, match=f"got both '{new}' and '{old}'"):
            make(**given, **objects)


def test_an_old_name_with_its_new_one_given_positionally_is_refused(tmp_path, keras):
    with pytest.raises(TypeError, match="got both 'backup_dir' and 'directory'"):
        tfrepro.ReproCheckpoint(tmp_path, directory=tmp_path)
    with pytest.raises(TypeError, match="got both 'save_freq' and 'every'"):
        tfrepro.ReproCheckpoint(tmp_path, "epoch", every=3)
    with pytest.raises(TypeError, match="got both 'backup_dir' and 'directory'"):
        tfrepro.LoopCheckpoint(tmp_path, directory=tmp_path, model=object())


@pytest.mark.parametrize("old", list(OLD_TO_NEW))
def test_an_object_under_an_old_name_is_refused_not_saved(tmp_path, keras, old):
    """LoopCheckpoint's **objects: an object named like a deprecated argument is never swallowed."""
    import tensorflow as tf

    given = {"backup_dir": tmp_path} if old != "directory" else {}
    with pytest.raises(TypeError, match=f"deprecated name of {OLD_TO_NEW[old]}=, not an object to save"):
        tfrepro.LoopCheckpoint(**given, **{old: tf.Variable(1.0)}, model=object())
