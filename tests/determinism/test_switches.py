"""The version table: which switches each TensorFlow version reads (pure logic, mocked versions)."""

import pytest

import tfrepro
from tfrepro._tf import env_flag
from tfrepro.determinism import switches

pytestmark = pytest.mark.core

BOTH = {"TF_DETERMINISTIC_OPS": "1", "TF_CUDNN_DETERMINISTIC": "1"}


@pytest.mark.parametrize(
    "version, env, call_api, mechanism",
    [
        ("1.14.0", BOTH, False, "unsupported"),
        ("2.7.4", BOTH, False, "unsupported"),
        ("2.11.1", BOTH, False, "unsupported"),
        ("2.12.0rc1", BOTH, True, "enable_op_determinism"),
        ("2.12.1", BOTH, True, "enable_op_determinism"),
        ("2.16.0rc0", BOTH, True, "enable_op_determinism"),
        ("2.21.0", BOTH, True, "enable_op_determinism"),
        ("2.22.0.dev20261101", BOTH, True, "enable_op_determinism"),
    ],
)
def test_plan_per_version(version, env, call_api, mechanism):
    plan = switches.plan_for(version)
    assert plan.env == env
    assert plan.call_enable_op_determinism is call_api
    assert plan.mechanism == mechanism


def test_a_tensorflow_below_the_floor_is_named_with_what_to_install():
    assert switches.plan_for("2.9.3").limits == (
        "TensorFlow 2.9.3 is older than 2.12, the oldest tfrepro supports: pip install 'tensorflow>=2.12'",)
    assert switches.plan_for("2.15.0").limits == ()


def test_patch_refuses_a_tensorflow_below_the_floor(monkeypatch):
    """No code path runs for TF < 2.12: patch raises before changing anything."""
    import os

    from tfrepro import _tf

    monkeypatch.setattr(_tf, "installed_tf_version", lambda: "2.9.3")
    before = dict(os.environ)
    with pytest.raises(ImportError, match=r"older than 2\.12.*tensorflow>=2\.12"):
        tfrepro.patch(0)
    assert dict(os.environ) == before


@pytest.mark.parametrize("version", [None, "", "garbage"])
def test_unknown_version_sets_environment_only(version):
    plan = switches.plan_for(version)
    assert plan.env == BOTH
    assert not plan.call_enable_op_determinism


def test_contradicting_env_names_only_values_that_turn_determinism_off():
    env = {"TF_DETERMINISTIC_OPS": "0", "TF_CUDNN_DETERMINISTIC": "false", "X": "0"}
    assert switches.contradicting_env(env) == {"TF_DETERMINISTIC_OPS": "0", "TF_CUDNN_DETERMINISTIC": "false"}
    assert switches.contradicting_env({"TF_DETERMINISTIC_OPS": "true"}) == {}


@pytest.mark.parametrize("value, state", [
    ("1", "on"), ("true", "on"), ("TRUE", "on"), ("True", "on"),
    ("0", "off"), ("false", "off"), ("FALSE", "off"),
    ("yes", "invalid"), (" 1", "invalid"), ("1 ", "invalid"), ("", "invalid"), ("on", "invalid"),
    (None, "unset"),
])
def test_env_flags_are_read_as_tensorflow_reads_them(value, state):
    """TF's C++ reader (tsl ReadBoolFromEnvVar) takes 1/true/0/false in any ASCII case, nothing else."""
    environ = {} if value is None else {"TF_DETERMINISTIC_OPS": value}
    assert env_flag("TF_DETERMINISTIC_OPS", environ) == state


@pytest.mark.parametrize("value, state", [("1", "on"), ("true", "on"), ("True", "on"), ("TRUE", "off"),
                                          ("yes", "off"), ("0", "off")])
def test_tf_use_legacy_keras_is_read_as_tensorflows_python_reads_it(value, state):
    assert env_flag("TF_USE_LEGACY_KERAS", {"TF_USE_LEGACY_KERAS": value}) == state


def test_patch_and_status_agree_on_an_upper_case_flag(monkeypatch):
    """Before one parser, status() called TF_DETERMINISTIC_OPS=TRUE off while patch() took it as on."""
    monkeypatch.setenv("TF_DETERMINISTIC_OPS", "TRUE")
    monkeypatch.setenv("TF_CUDNN_DETERMINISTIC", "1")
    assert switches.contradicting_env() == {}
    assert tfrepro.status()["TF_DETERMINISTIC_OPS"].ok is True
    monkeypatch.setenv("TF_DETERMINISTIC_OPS", "yes")  # TF rejects it and keeps determinism off
    assert switches.contradicting_env() == {"TF_DETERMINISTIC_OPS": "yes"}
    assert tfrepro.status()["TF_DETERMINISTIC_OPS"].ok is False
