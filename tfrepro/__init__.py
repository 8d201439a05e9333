"""tfrepro: bit-for-bit reproducible TensorFlow and Keras training.

Call ``tfrepro.patch(seed)`` before building the model, or run an unmodified script with
``tfrepro run --seed N -- python train.py``. Importing tfrepro never imports TensorFlow;
``tfrepro.ReproducibilityCallback``, ``tfrepro.ReproCheckpoint``, ``tfrepro.LoopCheckpoint``, the
ops in ``tfrepro.ops`` and ``tfrepro.layers`` do, on first use.

The package is laid out by verb, lowest first (a module imports only from its own floor or below):
``_tf``, ``_files`` and ``errors`` (the ground floor), ``ops`` (deterministic ops, the table of ops
without deterministic GPU kernels, Keras drop-ins), ``determinism`` (patch, switches, seeding,
status), ``proof`` (fingerprints, traces, the callback, comparisons, verify) and ``data``
(``map_with_seed``), ``launching`` (``tfrepro run``/``check``), ``examples``, ``sweeps`` (seed sweeps
and their statistics), ``diagnosis`` (``diagnose``, ``tfrepro doctor``) and ``checkpointing``
(``ReproCheckpoint``, ``LoopCheckpoint``, ``tfrepro run --checkpoint``), ``tuning`` (races over
seeds, KerasTuner searches), ``plotting``, ``cli``;
``testing`` sits on ``proof``.
"""

import importlib
import sys
import types
from typing import Any

from tfrepro import ops, testing
from tfrepro._version import __version__
from tfrepro.determinism import patching as _patching
from tfrepro.determinism.patching import enable_determinism, patch, patched, unpatch
from tfrepro.determinism.reporting import Report, Setting, status
from tfrepro.determinism.seeding import derive_seed, rng_state, seed_everything, set_rng_state
from tfrepro.errors import (CheckpointError, DivergenceError, NotComparableError, ReproducibilityWarning,
                            UncoveredOpError)
from tfrepro.proof.comparison import Comparison, Divergence, compare
from tfrepro.proof.environment_info import EnvDifference, environment, environment_diff
from tfrepro.proof.fingerprints import fingerprint
from tfrepro.proof.traces import Trace, TraceError, read_trace
from tfrepro.proof.verification import Verification, verify

_patching.FOLLOWERS.append("tfrepro.data.dataset_shuffling")  # Dataset.shuffle keyed under patch

__all__ = [
    "CheckpointError",
    "Comparison",
    "Divergence",
    "Diagnosis",
    "DivergenceError",
    "EnvDifference",
    "Finding",
    "LoopCheckpoint",
    "NotComparableError",
    "Report",
    "ReproCheckpoint",
    "ReproducibilityCallback",
    "ReproducibilityWarning",
    "Setting",
    "SweepResult",
    "Trace",
    "TraceError",
    "UncoveredOpError",
    "Verification",
    "__version__",
    "compare",
    "compare_sweeps",
    "data",
    "derive_seed",
    "diagnose",
    "enable_determinism",
    "environment",
    "environment_diff",
    "fingerprint",
    "layers",
    "ops",
    "patch",
    "patched",
    "plot_runs",
    "plot_sweeps",
    "plot_tuning",
    "read_trace",
    "report_metric",
    "rng_state",
    "seed_everything",
    "set_rng_state",
    "status",
    "sweep",
    "testing",
    "tuning",
    "unpatch",
    "verify",
]


class _ModuleAlias(types.ModuleType):
    """``tfrepro.layers``: an alias of ``tfrepro.ops.layers`` that imports it (and so Keras) only
    when one of its names is first used, so that ``import tfrepro.layers`` works and stays cheap."""

    def __init__(self, name: str, target: str):
        super().__init__(name, f"Alias of ``{target}``, imported on first use.")
        self.__target = target

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # module machinery (repr, pickling, introspection): not forwarded
            raise AttributeError(name)
        return getattr(importlib.import_module(self.__target), name)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(self.__target))


layers = sys.modules.setdefault(f"{__name__}.layers", _ModuleAlias(f"{__name__}.layers", "tfrepro.ops.layers"))


# Names that load on first use: they import TensorFlow (and Keras), or NumPy, SciPy and matplotlib.
_LAZY = {
    "ReproducibilityCallback": "tfrepro.proof.callback",
    "ReproCheckpoint": "tfrepro.checkpointing.callback",
    "LoopCheckpoint": "tfrepro.checkpointing.loop",
    "diagnose": "tfrepro.diagnosis.diagnosing",
    "Diagnosis": "tfrepro.diagnosis.findings",
    "Finding": "tfrepro.diagnosis.findings",
    "sweep": "tfrepro.sweeps.running",
    "SweepResult": "tfrepro.sweeps.statistics",
    "compare_sweeps": "tfrepro.sweeps.statistics",
    "report_metric": "tfrepro.sweeps.metrics",
    "plot_runs": "tfrepro.plotting.figures",
    "plot_sweeps": "tfrepro.plotting.figures",
    "plot_tuning": "tfrepro.plotting.figures",
}


def __getattr__(name: str) -> Any:
    """The ``_LAZY`` names, imported on first use, never at ``import tfrepro``."""
    if name in ("data", "tuning"):  # subpackages, free to import (their functions import TensorFlow)
        return importlib.import_module(f"tfrepro.{name}")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfrepro' has no attribute {name!r}")
