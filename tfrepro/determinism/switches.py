"""Which determinism switches each TensorFlow version reads.

This is pure version logic with no TensorFlow import, so it can be tested for any version string.

| TF          | switches                                                             |
|-------------|----------------------------------------------------------------------|
| 1.14 - 2.0  | ``TF_CUDNN_DETERMINISTIC=1`` (bias_add backprop still nondeterministic)|
| 2.1 - 2.4   | ``TF_DETERMINISTIC_OPS=1``                                           |
| 2.5 - 2.7   | ``TF_DETERMINISTIC_OPS=1`` and ``TF_CUDNN_USE_FRONTEND=1``           |
| >= 2.8      | ``tf.config.experimental.enable_op_determinism()``                   |

tfrepro always sets both ``TF_DETERMINISTIC_OPS=1`` and ``TF_CUDNN_DETERMINISTIC=1`` so that
subprocesses of any TF version agree; newer versions read them as the initial state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from tfrepro._tf import env_flag, parse_version

DETERMINISM_ENV = ("TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC", "TF_CUDNN_USE_FRONTEND")


@dataclass(frozen=True)
class DeterminismPlan:
    """What turns on op determinism for one TensorFlow version."""

    tf_version: str | None
    env: dict[str, str]
    call_enable_op_determinism: bool
    mechanism: str  # what actually switches determinism on for this version
    limits: tuple[str, ...] = ()


def plan_for(tf_version: str | None) -> DeterminismPlan:
    """The switches for ``tf_version`` (e.g. ``"2.15.1"``); None means "not known yet"."""
    env = {"TF_DETERMINISTIC_OPS": "1", "TF_CUDNN_DETERMINISTIC": "1"}
    version = parse_version(tf_version)
    if version is None:
        return DeterminismPlan(
            tf_version, env, False, "TF_DETERMINISTIC_OPS", ("TensorFlow version unknown: environment variables only",)
        )
    if version < (1, 14):
        limits = (f"TensorFlow {tf_version} predates GPU determinism support (1.14)",)
        return DeterminismPlan(tf_version, env, False, "none", limits)
    if version < (2, 1):
        limits = ("bias_add backprop still uses atomics on GPU before TF 2.1",)
        return DeterminismPlan(tf_version, env, False, "TF_CUDNN_DETERMINISTIC", limits)
    if version < (2, 8):
        limits = ("TF_DETERMINISTIC_OPS is read once, at first use: it must be set before the first op",)
        if version >= (2, 5):
            env["TF_CUDNN_USE_FRONTEND"] = "1"  # deterministic cuDNN algorithm selection, TF #53771
        return DeterminismPlan(tf_version, env, False, "TF_DETERMINISTIC_OPS", limits)
    return DeterminismPlan(tf_version, env, True, "enable_op_determinism")


def contradicting_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """User-set determinism variables that TF reads as off (``TF_DETERMINISTIC_OPS=0``) or rejects
    (``TF_DETERMINISTIC_OPS=yes``)."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in DETERMINISM_ENV if env_flag(name, environ) in ("off", "invalid")}
