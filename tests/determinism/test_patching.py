"""tfrepro.patch / unpatch / patched: the switches, the warnings, the bad input."""

import json
import os

import pytest

import tfrepro
from tfrepro import _tf
from tfrepro.determinism import patching, state
from tfrepro.ops import selection

from conftest import SCRIPTS, clean_env, run_python

pytestmark = pytest.mark.core


def probe(mode: str, **env: str) -> dict:
    proc = run_python(str(SCRIPTS / "patch_probe.py"), mode, env=clean_env(**env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_patch_turns_determinism_on_and_unpatch_restores(monkeypatch):
    monkeypatch.delenv("TF_DETERMINISTIC_OPS", raising=False)
    monkeypatch.setenv("TF_CUDNN_DETERMINISTIC", "1")
    report = tfrepro.patch(7)
    assert isinstance(report, tfrepro.Report)
    assert report["op determinism"].ok and report["op determinism"].value == "on (enable_op_determinism)"
    assert report["seeds"].value == "seeded with 7"
    assert os.environ["TF_DETERMINISTIC_OPS"] == "1" and os.environ["PYTHONHASHSEED"] == "7"
    assert _tf.op_determinism_enabled() is True
    report = tfrepro.unpatch()
    assert "TF_DETERMINISTIC_OPS" not in os.environ
    assert os.environ["TF_CUDNN_DETERMINISTIC"] == "1"
    assert _tf.op_determinism_enabled() is False
    assert report["op determinism"].ok is False  # negative control: the report does show "off"


def test_patch_is_idempotent_and_unpatch_restores_the_original(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "99")
    first = tfrepro.patch(3)
    second = tfrepro.patch(3)
    assert str(first) == str(second)
    tfrepro.patch(4)
    assert os.environ["PYTHONHASHSEED"] == "4"
    tfrepro.unpatch()
    assert os.environ["PYTHONHASHSEED"] == "99"
    assert state.active_seed() is None
    tfrepro.unpatch()  # unpatching twice is harmless


def test_patched_context_manager_and_alias():
    with tfrepro.patched(5) as report:
        assert report["op determinism"].ok
        assert state.active_seed() == 5
    assert state.active_seed() is None and _tf.op_determinism_enabled() is False
    report = tfrepro.enable_determinism(6)
    assert report["seeds"].value == "seeded with 6"


def test_nested_patched_restores_the_outer_patch_and_the_rng_streams(monkeypatch):
    import random

    import tensorflow as tf

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    tfrepro.patch(1, ops=["bias_add"])
    bias_add = tf.nn.bias_add
    assert bias_add.__module__ == "tfrepro.ops.nn" and state.active_ops() == ("bias_add",)
    expected = random.Random()
    expected.setstate(random.getstate())
    with tfrepro.patched(2):  # ops="auto": what this TF cannot run deterministically on a GPU, not bias_add
        assert state.active_seed() == 2 and state.active_ops() == selection.select_ops("auto")
        assert "bias_add" not in state.active_ops() and os.environ["PYTHONHASHSEED"] == "2"
        assert tf.nn.bias_add is not bias_add
        random.random()
    assert state.active_seed() == 1 and state.active_ops() == ("bias_add",)
    assert tf.nn.bias_add is bias_add and os.environ["PYTHONHASHSEED"] == "1"
    assert _tf.op_determinism_enabled() is True
    assert random.random() == expected.random()  # the block's draws are undone too
    tfrepro.unpatch()
    assert "PYTHONHASHSEED" not in os.environ and _tf.op_determinism_enabled() is False
    assert tf.nn.bias_add.__module__ != "tfrepro.ops.nn"


@pytest.mark.parametrize("outer", [None, 1])
def test_a_patch_that_fails_midway_leaves_nothing_behind(monkeypatch, outer):
    import tensorflow as tf

    from tfrepro.determinism import seeding

    monkeypatch.setenv("PYTHONHASHSEED", "99")
    if outer is not None:
        tfrepro.patch(outer, ops=["gather"])
    before = (dict(os.environ), _tf.op_determinism_enabled(), tf.nn.bias_add, tf.gather, state.active_ops())

    def broken(seed):
        raise RuntimeError("seeding failed")

    monkeypatch.setattr(seeding, "seed_everything", broken)
    with pytest.raises(RuntimeError, match="seeding failed"):
        tfrepro.patch(2, ops=["bias_add"], onednn=False)  # env, determinism and ops are applied by then
    after = (dict(os.environ), _tf.op_determinism_enabled(), tf.nn.bias_add, tf.gather, state.active_ops())
    assert after == before
    assert state.active_seed() == outer


def test_a_warning_turned_error_undoes_the_patch_too(monkeypatch):
    import warnings

    monkeypatch.setattr(state, "STARTUP_HASHSEED", None)  # patch() will warn about PYTHONHASHSEED
    before = dict(os.environ)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tfrepro.ReproducibilityWarning)
        with pytest.raises(tfrepro.ReproducibilityWarning, match="PYTHONHASHSEED"):
            tfrepro.patch(5)
        with pytest.raises(tfrepro.ReproducibilityWarning):
            with tfrepro.patched(6):
                pass
    assert state.active_seed() is None and dict(os.environ) == before


def test_a_patch_under_an_active_patch_does_not_repeat_its_warnings(monkeypatch):
    import warnings

    import tensorflow as tf

    monkeypatch.setattr(state, "STARTUP_HASHSEED", None)
    with pytest.warns(tfrepro.ReproducibilityWarning, match="PYTHONHASHSEED"):
        tfrepro.patch(3)
    tf.random.uniform([1])  # the runtime is up now, and it was seeded by patch(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tfrepro.patched(4):
            pass
    assert [str(w.message) for w in caught if issubclass(w.category, tfrepro.ReproducibilityWarning)] == []


def test_patch_prints_nothing(capsys):
    tfrepro.patch(1)
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("kwargs, error", [
    ({"seed": -5}, ValueError), ({"seed": 2**32}, ValueError), ({"seed": 1.5}, ValueError),
    ({"seed": True}, ValueError), ({"seed": "3"}, ValueError),
    ({"seed": 1, "threads": 0}, ValueError), ({"seed": 1, "threads": True}, ValueError),
    ({"seed": 1, "onednn": "off"}, ValueError), ({"seed": 1, "sede": 2}, TypeError),
])
def test_bad_input(kwargs, error):
    with pytest.raises(error):
        tfrepro.patch(**kwargs)
    assert state.active_seed() is None  # nothing half-applied


def test_contradicting_env_is_named_and_overridden(monkeypatch):
    monkeypatch.setenv("TF_DETERMINISTIC_OPS", "0")
    with pytest.warns(tfrepro.ReproducibilityWarning, match="TF_DETERMINISTIC_OPS=0"):
        tfrepro.patch(1)
    assert os.environ["TF_DETERMINISTIC_OPS"] == "1"
    tfrepro.unpatch()
    assert os.environ["TF_DETERMINISTIC_OPS"] == "0"


def test_autotune_off_is_warned_about_and_left_alone(monkeypatch):
    monkeypatch.setenv("TF_CUDNN_USE_AUTOTUNE", "0")
    with pytest.warns(tfrepro.ReproducibilityWarning, match="TF_CUDNN_USE_AUTOTUNE=0"):
        report = tfrepro.patch(1)
    assert os.environ["TF_CUDNN_USE_AUTOTUNE"] == "0"
    assert report["TF_CUDNN_USE_AUTOTUNE"].ok is False


@pytest.mark.slow
def test_pythonhashseed_warning_points_to_tfrepro_run():
    unset = probe("hashseed")
    assert any("PYTHONHASHSEED was not set" in w and "tfrepro run" in w for w in unset["warnings"])
    matching = probe("hashseed", PYTHONHASHSEED="5")
    assert not any("PYTHONHASHSEED" in w for w in matching["warnings"])


def test_late_patch_names_what_may_not_apply(keras):
    result = probe("late")
    late = [w for w in result["warnings"] if "called late" in w]
    assert len(late) == 1
    assert "runtime is already initialised" in late[0]
    assert "Keras object(s)" in late[0]
    assert "threads=3" in late[0]
    assert "onednn= cannot change oneDNN in this process" in late[0] and "tfrepro run --onednn" in late[0]


def test_threads_are_pinned_in_a_fresh_process():
    result = probe("threads")
    assert result["threads"] == [1, 1]
    assert result["report"] == "intra=1, inter=1"


def test_missing_tensorflow_names_the_install_command():
    assert "pip install" in probe("no_tf")["error"]


def test_import_tfrepro_imports_neither_tensorflow_nor_numpy():
    assert probe("import")["modules"] == []


@pytest.mark.keras
def test_keras3_before_3_7_never_picks_xla_under_determinism(monkeypatch, keras):
    if _tf.keras_major(keras) < 3:
        pytest.skip("Keras 3 only")
    trainer = pytest.importorskip("keras.src.trainers.trainer")
    original = trainer.model_supports_jit
    monkeypatch.setattr(_tf, "distribution_version", lambda *names: "3.6.0" if "keras" in names else None)
    undo = patching._guard_keras_auto_jit()
    assert undo is not None
    try:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        assert original(model) is True  # control: Keras alone would allow XLA here
        _tf.import_tf().config.experimental.enable_op_determinism()
        assert trainer.model_supports_jit(model) is False
    finally:
        undo()
        from tensorflow.python.framework import config

        config.disable_op_determinism()
    assert trainer.model_supports_jit is original
    monkeypatch.undo()
    assert patching._guard_keras_auto_jit() is None  # the installed Keras needs no guard
