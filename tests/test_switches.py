"""The version table: which switches each TensorFlow version reads (pure logic, mocked versions)."""

import pytest

from tfrepro import switches

pytestmark = pytest.mark.core

BOTH = {"TF_DETERMINISTIC_OPS": "1", "TF_CUDNN_DETERMINISTIC": "1"}


@pytest.mark.parametrize(
    "version, env, call_api, mechanism",
    [
        ("1.13.2", BOTH, False, "none"),
        ("1.14.0", BOTH, False, "TF_CUDNN_DETERMINISTIC"),
        ("2.0.4", BOTH, False, "TF_CUDNN_DETERMINISTIC"),
        ("2.1.0", BOTH, False, "TF_DETERMINISTIC_OPS"),
        ("2.4.4", BOTH, False, "TF_DETERMINISTIC_OPS"),
        ("2.5.0", {**BOTH, "TF_CUDNN_USE_FRONTEND": "1"}, False, "TF_DETERMINISTIC_OPS"),
        ("2.7.4", {**BOTH, "TF_CUDNN_USE_FRONTEND": "1"}, False, "TF_DETERMINISTIC_OPS"),
        ("2.8.0", BOTH, True, "enable_op_determinism"),
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


def test_plans_note_their_limits():
    assert "bias_add" in switches.plan_for("2.0.0").limits[0]
    assert "first op" in switches.plan_for("2.6.0").limits[0]
    assert switches.plan_for("2.15.0").limits == ()


@pytest.mark.parametrize("version", [None, "", "garbage"])
def test_unknown_version_sets_environment_only(version):
    plan = switches.plan_for(version)
    assert plan.env == BOTH
    assert not plan.call_enable_op_determinism


def test_contradicting_env_names_only_values_that_turn_determinism_off():
    env = {"TF_DETERMINISTIC_OPS": "0", "TF_CUDNN_DETERMINISTIC": "1", "TF_CUDNN_USE_FRONTEND": "false", "X": "0"}
    assert switches.contradicting_env(env) == {"TF_DETERMINISTIC_OPS": "0", "TF_CUDNN_USE_FRONTEND": "false"}
    assert switches.contradicting_env({"TF_DETERMINISTIC_OPS": "true"}) == {}
