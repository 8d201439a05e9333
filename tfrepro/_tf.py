"""Lazy access to TensorFlow and Keras.

Nothing here imports TensorFlow at module import time: environment variables only take effect
when they are set before TensorFlow loads, so ``import tfrepro`` must stay TF-free.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

INSTALL_HINT = (
    'pip install "tfrepro[cpu]"  (CPU-only TensorFlow), or pip install "tfrepro[tf]" / '
    '"tfrepro[gpu]"; any existing tensorflow, tensorflow-cpu or tensorflow[and-cuda] also works'
)

# Distributions that provide the ``tensorflow`` module, most common first.
_TF_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-gpu",
    "tensorflow-intel",
    "tensorflow-macos",
    "tf-nightly",
    "tf-nightly-cpu",
)


FlagState = Literal["on", "off", "unset", "invalid"]
# TF's Python reads these flags itself, as exactly one of the listed strings meaning "on"; every other
# boolean TF_* flag is read by the C++ runtime (tsl ReadBoolFromEnvVar): "1"/"true"/"0"/"false" in
# any ASCII case, nothing else (no surrounding spaces; TF then falls back to its default).
_PYTHON_READ_FLAGS = {"TF_USE_LEGACY_KERAS": ("true", "True", "1")}


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> FlagState:
    """How TensorFlow reads the boolean environment variable ``name``: "on", "off", "unset", or
    "invalid" (a value TF rejects and replaces by its default). The one reader of TF's flags in tfrepro."""
    value = (os.environ if environ is None else environ).get(name)
    if value is None:
        return "unset"
    if name in _PYTHON_READ_FLAGS:
        return "on" if value in _PYTHON_READ_FLAGS[name] else "off"
    lowered = value.lower() if value.isascii() else value
    if lowered in ("1", "true"):
        return "on"
    if lowered in ("0", "false"):
        return "off"
    return "invalid"


def onednn() -> str:
    """oneDNN as TF reads ``TF_ENABLE_ONEDNN_OPTS``: "on", "off", or "default" (TF's own choice)."""
    flag = env_flag("TF_ENABLE_ONEDNN_OPTS")
    return flag if flag in ("on", "off") else "default"


def tf_imported() -> bool:
    """Whether TensorFlow has been imported in this process (never imports it)."""
    return "tensorflow" in sys.modules


def import_tf() -> ModuleType:
    """Import TensorFlow, or raise an ImportError that says how to install it."""
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise ImportError(f"tfrepro needs TensorFlow, which is not installed. Install it: {INSTALL_HINT}") from exc
    return tf


def distribution_version(*names: str) -> str | None:
    """The installed version of the first of ``names`` that is installed, without importing it."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed_tf_version() -> str | None:
    """TensorFlow's version: from the loaded module if imported, else from package metadata."""
    if tf_imported():
        return getattr(sys.modules["tensorflow"], "__version__", None)
    return distribution_version(*_TF_DISTRIBUTIONS)


def parse_version(version: str | None) -> tuple[int, int] | None:
    """``"2.15.0rc1"`` -> ``(2, 15)``; None for None or an unparsable string."""
    if not version:
        return None
    parts = version.split(".")
    try:
        major = int(parts[0])
        minor = int("".join(ch for ch in parts[1] if ch.isdigit()) or "0") if len(parts) > 1 else 0
    except ValueError:
        return None
    return major, minor


def legacy_keras_requested() -> bool:
    return env_flag("TF_USE_LEGACY_KERAS") == "on"


@dataclass(frozen=True)
class KerasInfo:
    """Which Keras ``tf.keras`` resolves to, worked out without importing Keras."""

    module: str | None  # "keras" or "tf_keras"; None without TensorFlow
    major: int | None  # 2 or 3
    version: str | None

    def describe(self) -> str:
        if self.module is None:
            return "unknown (TensorFlow not installed)"
        return f"Keras {self.version} (module {self.module!r}, Keras {self.major})"


def keras_info() -> KerasInfo:
    """Resolve ``tf.keras`` by TensorFlow's own rule: Keras 2 up to TF 2.15; from TF 2.16 Keras 3,
    unless ``TF_USE_LEGACY_KERAS=1`` and tf_keras is installed."""
    tf_version = parse_version(installed_tf_version())
    if tf_version is None:
        return KerasInfo(None, None, None)
    keras_version = distribution_version("keras", "keras-nightly")
    tf_keras_version = distribution_version("tf-keras", "tf_keras", "tf-keras-nightly")
    if tf_version < (2, 16):
        return KerasInfo("keras", 2, keras_version)
    if legacy_keras_requested() and tf_keras_version:
        return KerasInfo("tf_keras", 2, tf_keras_version)
    return KerasInfo("keras", 3, keras_version)


def keras_module() -> ModuleType:
    """Import and return the Keras that ``tf.keras`` resolves to."""
    import_tf()
    info = keras_info()
    if info.module is None:
        raise ImportError(f"Keras is not installed. Install it: {INSTALL_HINT}")
    return importlib.import_module(info.module)


def loaded_kerases() -> list[ModuleType]:
    """Keras modules imported in this process (``keras`` and/or ``tf_keras``), not counting one that
    is still being imported (Keras 3 imports TensorFlow halfway through its own import)."""
    modules = [sys.modules[name] for name in ("keras", "tf_keras") if name in sys.modules]
    return [m for m in modules if not getattr(getattr(m, "__spec__", None), "_initializing", False)]


def keras_major(keras: ModuleType) -> int:
    return parse_version(getattr(keras, "__version__", None) or "2.0")[0]  # type: ignore[index]


def runtime_initialized() -> bool:
    """Whether TensorFlow's eager runtime has started (ops ran, or devices were set up).

    After that, thread-pool sizes can no longer change. Uses TF's private context object, which
    has kept this attribute since TF 2.0; returns False when TF is not imported.
    """
    if not tf_imported():
        return False
    try:
        from tensorflow.python.eager import context
    except ImportError:
        return False
    ctx = context.context()
    return bool(getattr(ctx, "_initialized", False) or getattr(ctx, "_context_handle", None) is not None)


def op_determinism_enabled() -> bool | None:
    """TensorFlow's op-determinism state, or None when it cannot be read without importing TF."""
    if not tf_imported():
        return None
    try:
        from tensorflow.python.framework import config
    except ImportError:
        return None
    return bool(config.is_op_determinism_enabled())
