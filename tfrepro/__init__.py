"""tfrepro: bit-for-bit reproducible TensorFlow and Keras training.

Call ``tfrepro.patch(seed)`` before building the model, or run an unmodified script with
``tfrepro run --seed N -- python train.py``. Importing tfrepro never imports TensorFlow.
"""

from tfrepro._version import __version__
from tfrepro.errors import ReproducibilityWarning
from tfrepro.fingerprint import EnvDifference, environment, environment_diff
from tfrepro.patching import enable_determinism, patch, patched, unpatch
from tfrepro.reporting import Report, Setting, status
from tfrepro.seeding import derive_seed, rng_state, seed_everything, set_rng_state

__all__ = [
    "EnvDifference",
    "Report",
    "ReproducibilityWarning",
    "Setting",
    "__version__",
    "derive_seed",
    "enable_determinism",
    "environment",
    "environment_diff",
    "patch",
    "patched",
    "rng_state",
    "seed_everything",
    "set_rng_state",
    "status",
    "unpatch",
]
