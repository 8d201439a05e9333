"""Which determinism switches the installed TensorFlow reads.

This is pure version logic with no TensorFlow import, so it can be tested for any version string.
From TF 2.8 on, ``tf.config.experimental.enable_op_determinism()`` turns op determinism on, and
``TF_DETERMINISTIC_OPS`` is read as its initial state; tfrepro supports TF 2.12 and later, and sets
both ``TF_DETERMINISTIC_OPS=1`` and ``TF_CUDNN_DETERMINISTIC=1`` as well, so that subprocesses
agree. An older TensorFlow gets a plan that ``patch`` refuses, naming the floor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from tfrepro._tf import env_flag, parse_version

DETERMINISM_ENV = ("TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC")
SUPPORTED_TF = (2, 12)  # the oldest TensorFlow tfrepro supports and tests (CI leg c)


@dataclass(frozen=True)
class DeterminismPlan:
    """What turns on op determinism for one TensorFlow version."""

    tf_version: str | None
    env: dict[str, str]
    call_enable_op_determinism: bool
    mechanism: str  # what switches determinism on for this version ("unsupported" below the floor)
    limits: tuple[str, ...] = ()


def plan_for(tf_version: str | None) -> DeterminismPlan:
    """The switches for ``tf_version`` (e.g. ``"2.15.1"``); None means "not known yet"."""
    env = {"TF_DETERMINISTIC_OPS": "1", "TF_CUDNN_DETERMINISTIC": "1"}
    version = parse_version(tf_version)
    if version is None:
        return DeterminismPlan(
            tf_version, env, False, "TF_DETERMINISTIC_OPS", ("TensorFlow version unknown: environment variables only",)
        )
    if version < SUPPORTED_TF:
        floor = ".".join(map(str, SUPPORTED_TF))
        return DeterminismPlan(tf_version, env, False, "unsupported",
                               (f"TensorFlow {tf_version} is older than {floor}, the oldest tfrepro supports: "
                                f"pip install 'tensorflow>={floor}'",))
    return DeterminismPlan(tf_version, env, True, "enable_op_determinism")


def contradicting_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """User-set determinism variables that TF reads as off (``TF_DETERMINISTIC_OPS=0``) or rejects
    (``TF_DETERMINISTIC_OPS=yes``)."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in DETERMINISM_ENV if env_flag(name, environ) in ("off", "invalid")}
