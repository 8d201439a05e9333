"""tfrepro: bit-for-bit reproducible TensorFlow and Keras training.

Call ``tfrepro.patch(seed)`` before building the model, or run an unmodified script with
``tfrepro run --seed N -- python train.py``. Importing tfrepro never imports TensorFlow;
``tfrepro.ReproducibilityCallback``, ``tfrepro.ops`` and ``tfrepro.layers`` do, on first access.
"""

import importlib
from typing import Any

from tfrepro import testing
from tfrepro._version import __version__
from tfrepro.comparison import Comparison, Divergence, compare
from tfrepro.environment_info import EnvDifference, environment, environment_diff
from tfrepro.errors import DivergenceError, NotComparableError, ReproducibilityWarning
from tfrepro.patching import enable_determinism, patch, patched, unpatch
from tfrepro.reporting import Report, Setting, status
from tfrepro.seeding import derive_seed, rng_state, seed_everything, set_rng_state
from tfrepro.traces import Trace, TraceError, read_trace
from tfrepro.verification import Verification, verify

__all__ = [
    "Comparison",
    "Divergence",
    "DivergenceError",
    "EnvDifference",
    "NotComparableError",
    "ReproducibilityCallback",
    "Report",
    "ReproducibilityWarning",
    "Setting",
    "Trace",
    "TraceError",
    "Verification",
    "__version__",
    "compare",
    "derive_seed",
    "enable_determinism",
    "environment",
    "environment_diff",
    "layers",
    "ops",
    "patch",
    "patched",
    "read_trace",
    "rng_state",
    "seed_everything",
    "set_rng_state",
    "status",
    "testing",
    "unpatch",
    "verify",
]


def __getattr__(name: str) -> Any:
    """Names that import TensorFlow (and Keras) load on first use, never at ``import tfrepro``."""
    if name == "ReproducibilityCallback":
        from tfrepro.callback import ReproducibilityCallback

        return ReproducibilityCallback
    if name in ("ops", "layers"):
        return importlib.import_module(f"tfrepro.{name}")
    raise AttributeError(f"module 'tfrepro' has no attribute {name!r}")
