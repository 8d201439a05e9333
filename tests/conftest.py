"""Shared fixtures. TensorFlow is imported only by the tests that need it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfrepro.determinism.switches import DETERMINISM_ENV
from tfrepro.launching.config import ENV_NAMES

SCRIPTS = Path(__file__).parent / "scripts"
# Variables that would make a "without tfrepro" negative control secretly deterministic, or leak the
# launcher's configuration into a child.
_DETERMINISM_VARS = ("PYTHONHASHSEED", *DETERMINISM_ENV, *ENV_NAMES.values(), "TFREPRO_EXACT_PRODUCTS")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DETERMINISM_VARS}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(extra)
    return env


def run_python(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` in a fresh interpreter with a clean environment."""
    return subprocess.run([sys.executable, *args], env=clean_env() if env is None else env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def run_tfrepro(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_python("-m", "tfrepro", *args, env=env, timeout=timeout)


def write_trace(path, losses, shape=(2, 1), **header_items) -> str:
    """A trace of a one-variable model with these per-batch losses, ended (``header_items`` added to
    its header); returns its path."""
    from tfrepro.proof.traces import VERSION, TraceWriter, float_bits

    header = {"type": "header", "format": "tfrepro-trace", "version": VERSION, "environment": {},
              "model": {"layers": ["d"], "variables": [{"name": "d/kernel", "layer": "d", "shape": list(shape),
                                                        "dtype": "float32"}]}, **header_items}
    with TraceWriter(path) as writer:
        writer.write(header)
        for step, loss in enumerate(losses):
            writer.write({"type": "batch", "epoch": 0, "batch": step, "step": step, "logs": {"loss": loss},
                          "bits": {"loss": float_bits(loss)}, "weights": ["0" * 32]})
        writer.write({"type": "end", "weights": ["0" * 32]})
    return str(path)


@pytest.fixture(autouse=True)
def _isolate_patch():
    """Every test leaves the process unpatched and the environment as it found it."""
    saved = dict(os.environ)
    yield
    if "tfrepro.determinism.patching" in sys.modules:
        sys.modules["tfrepro.determinism.patching"].unpatch()
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def keras():
    """The Keras that tf.keras resolves to in this leg (Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1)."""
    from tfrepro import _tf

    return _tf.keras_module()


def pytest_collection_modifyitems(items):
    """A test that uses the ``keras`` fixture touches Keras, so it runs on the tf-keras leg too."""
    for item in items:
        if "keras" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.keras)


def positions_checked(tf, count: int, first_position: int):
    """Keyed training input (a ``tfrepro.data.shuffle`` of ``count`` rows, ``map_with_seed`` noise,
    batches of 8) whose map fails on an element whose position in the pass is below
    ``first_position``: what a resume that must not compute the batches before it runs on."""
    import tfrepro.data

    x = np.linspace(0, 1, count * 4, dtype="float32").reshape(count, 4)
    y = (x.sum(axis=1) > 2).astype("int64")

    def noisy(position, pair, seed):
        tf.debugging.assert_greater_equal(position, tf.constant(first_position, tf.int64))
        return pair[0] + tf.random.stateless_uniform([4], seed, -0.01, 0.01), pair[1]

    data = tfrepro.data.shuffle(tf.data.Dataset.from_tensor_slices((x, y)), count).enumerate()
    return tfrepro.data.map_with_seed(data, noisy, key="noise").batch(8)
