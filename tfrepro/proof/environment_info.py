"""``tfrepro.environment()``: a JSON-serialisable fingerprint of everything that changes results.

Bitwise reproducibility needs the same hardware, the same software stack and the same thread
counts. ``environment_diff`` lists how two fingerprints differ and flags the differences known to
break bitwise reproducibility.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfrepro import _tf
from tfrepro.determinism import distribution, state

# The environment variables recorded, by name: those that TensorFlow, XLA, CUDA and the CPU math
# libraries read and that can change results, with where each is documented. Anything else, even
# when it starts with TF_ (TF_CLI_CONFIG_FILE is Terraform's), is not recorded.
RECORDED_VARIABLES: dict[str, str] = {
    "TF_DETERMINISTIC_OPS": "TF 2.1-2.7 release notes; the initial op-determinism state since 2.8",
    "TF_CUDNN_DETERMINISTIC": "TF 1.14 release notes",
    "TF_CUDNN_USE_FRONTEND": "TF #53771 (cuDNN frontend algorithm selection, 2.5-2.7)",
    "TF_CUDNN_USE_AUTOTUNE": "tensorflow/core/util/use_cudnn.cc",
    "TF_CUDNN_WORKSPACE_LIMIT_IN_MB": "tensorflow/core/kernels/conv_ops_gpu.cc (limits the cuDNN algorithms)",
    "TF_ENABLE_ONEDNN_OPTS": "TF 2.5 release notes; on by default on Linux x86 since 2.9",
    "TF_USE_LEGACY_KERAS": "TF 2.16 release notes (tf.keras is Keras 2)",
    "TF_ENABLE_AUTO_MIXED_PRECISION": "TF mixed-precision graph rewrite (changes numerics)",
    "TF_XLA_FLAGS": "XLA documentation (tf_xla_auto_jit and friends)",
    "XLA_FLAGS": "XLA documentation (compiler options, e.g. --xla_gpu_deterministic_ops)",
    "TF_NUM_INTRAOP_THREADS": "tensorflow/core/common_runtime/process_util.cc",
    "TF_NUM_INTEROP_THREADS": "tensorflow/core/common_runtime/process_util.cc",
    "TF_DISABLE_SEGMENT_REDUCTION_OP_DETERMINISM_EXCEPTIONS": "TF 2.5/2.6 release notes",
    "TF_DISABLE_SPARSE_SOFTMAX_XENT_WITH_LOGITS_OP_DETERMINISM_EXCEPTIONS": "TF 2.6 release notes",
    "TF_DISABLE_DEPTHWISE_CONV_DETERMINISM_EXCEPTIONS": "TF 2.9 release notes",
    "CUDA_VISIBLE_DEVICES": "CUDA documentation (which GPUs are used)",
    "NVIDIA_TF32_OVERRIDE": "NVIDIA documentation (TF32 matmul precision)",
    "CUBLAS_WORKSPACE_CONFIG": "cuBLAS documentation (reproducibility of cuBLAS results)",
    "OMP_NUM_THREADS": "OpenMP (CPU thread counts)",
    "MKL_NUM_THREADS": "oneMKL (CPU thread counts)",
    "KMP_AFFINITY": "Intel OpenMP runtime",
    "KMP_BLOCKTIME": "Intel OpenMP runtime",
    "KERAS_BACKEND": "Keras 3 documentation (the backend in use)",
    "TFREPRO_EXACT_PRODUCTS": "tfrepro's exact tier: how its products are formed (the same bits either way)",
}


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str | None:
    version_file = Path("/proc/driver/nvidia/version")
    if version_file.exists():
        match = re.search(r"Kernel Module\s+(\S+)", version_file.read_text(errors="replace"))
        if match:
            return match.group(1)
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10, check=False,
            ).stdout.strip()
            return out.splitlines()[0] if out else None
        except (OSError, subprocess.TimeoutExpired):
            return None
    return None


def _tensorflow_part() -> dict[str, Any]:
    tf = _tf.import_tf()
    build = {k: (v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
             for k, v in dict(tf.sysconfig.get_build_info()).items()}
    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        gpus.append({
            "name": details.get("device_name", device.name),
            "compute_capability": ".".join(map(str, capability)) if capability else None,
        })
    threading = tf.config.threading
    return {
        "version": tf.__version__,
        "build_info": build,
        "gpus": gpus,
        "intra_op_threads": threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": threading.get_inter_op_parallelism_threads(),
        "op_determinism": _tf.op_determinism_enabled(),
    }


def environment() -> dict[str, Any]:
    """Fingerprints everything in this process that can change training results.

    Records Python, OS, CPU, library versions, TensorFlow's CUDA/cuDNN build, GPUs and driver, the
    determinism-relevant environment variables (`RECORDED_VARIABLES`, by name; no others), thread
    pools, oneDNN, op determinism, `PYTHONHASHSEED` at interpreter start, and the `TF_CONFIG`
    cluster with the collective implementation of each `MultiWorkerMirroredStrategy`. Every trace
    header holds one; `environment_diff` compares two.

    Imports TensorFlow if it is installed: call it after `tfrepro.patch`.

    Returns:
        A dict of plain JSON data (strings, numbers, None, lists and dicts); its `"tensorflow"` key
        is None when TensorFlow is not installed.
    """
    import numpy as np

    keras = _tf.keras_info()
    tf_installed = _tf.installed_tf_version() is not None
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "keras": _tf.distribution_version("keras", "keras-nightly"),
        "tf_keras": _tf.distribution_version("tf-keras", "tf_keras", "tf-keras-nightly"),
        "tf.keras": keras.describe(),
        "tensorflow": _tensorflow_part() if tf_installed else None,
        "nvidia_driver": _nvidia_driver(),
        "onednn": _tf.onednn(),
        "python_hash_seed": state.STARTUP_HASHSEED,
        "env": {name: os.environ[name] for name in sorted(RECORDED_VARIABLES) if name in os.environ},
        "distribution": _distribution(),
    }


def _distribution() -> dict[str, Any]:
    """The ``TF_CONFIG`` cluster, and the collectives of the MultiWorkerMirroredStrategies built (the
    key only when there is one: a trace from before it was recorded compares equal)."""
    found: dict[str, Any] = {"cluster": distribution.cluster()}
    if distribution.chosen():
        found["collectives"] = distribution.chosen()
    return found


# Keys whose difference is known to change bits, with the reason; matched by prefix.
_BREAKING = {
    "tensorflow.version": "a different TensorFlow version can select different kernels",
    "tensorflow.build_info": "a different CUDA/cuDNN build selects different GPU kernels",
    "tensorflow.gpus": "different GPUs run different kernels and reduction orders",
    "tensorflow.intra_op_threads": "CPU results depend on the thread-pool sizes",
    "tensorflow.inter_op_threads": "CPU results depend on the thread-pool sizes",
    "tensorflow.op_determinism": "op determinism was on in one run only",
    "cpu": "CPU numerics depend on the instruction set the kernels dispatch to",
    "cpu_count": "default thread-pool sizes follow the core count",
    "onednn": "oneDNN changes CPU numerics",
    "nvidia_driver": "a different driver can change cuBLAS/cuDNN kernel selection",
    "keras": "a different Keras can build, seed or train differently",
    "tf_keras": "a different Keras can build, seed or train differently",
    "tf.keras": "a different Keras can build, seed or train differently",
    "numpy": "a different NumPy can draw different random numbers or round differently",
    "machine": "a different architecture runs different kernels",
    "env.TF_DETERMINISTIC_OPS": "a determinism switch differs",
    "env.TF_CUDNN_DETERMINISTIC": "a determinism switch differs",
    "env.TF_ENABLE_ONEDNN_OPTS": "oneDNN changes CPU numerics",
    "python_hash_seed": "the iteration order of sets of strings differs",
    "env.XLA_FLAGS": "XLA flags change compiled kernels",
    "env.TF_XLA_FLAGS": "XLA flags change compiled kernels",
    "env.CUDA_VISIBLE_DEVICES": "a different set of GPUs is used",
    "env.OMP_NUM_THREADS": "CPU results depend on thread counts",
    "env.NVIDIA_TF32_OVERRIDE": "TF32 changes matmul precision",
    "distribution.cluster.workers": "another number of workers splits the batch and sums the gradients differently",
    "distribution.collectives": "another collective implementation all-reduces in another order",
}


@dataclass(frozen=True)
class EnvDifference:
    """One difference between two environment fingerprints, as `environment_diff` finds it.

    Attributes:
        key: The dotted path of the value that differs, e.g. `"tensorflow.version"` or
            `"env.TF_ENABLE_ONEDNN_OPTS"`.
        a: Its value in fingerprint A (None when A lacks it).
        b: Its value in fingerprint B (None when B lacks it).
        breaks_bitwise: True when this difference is known to break bitwise reproducibility;
            False when it is informational.
        why: Why it breaks bitwise reproducibility; empty when it is informational.
    """

    key: str
    a: Any
    b: Any
    breaks_bitwise: bool
    why: str = ""

    def __str__(self) -> str:
        flag = "breaks bitwise reproducibility" if self.breaks_bitwise else "informational"
        return f"{self.key}: {self.a!r} != {self.b!r} ({flag}{': ' + self.why if self.why else ''})"


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def environment_diff(a: dict[str, Any], b: dict[str, Any]) -> list[EnvDifference]:
    """Lists how two `environment()` fingerprints differ, flagging what breaks bitwise reproducibility.

    Nested values are compared leaf by leaf. `breaks_bitwise` marks the differences known to break
    bitwise reproducibility (another GPU, CUDA/cuDNN build, TF, Keras or NumPy version, CPU, thread
    count, oneDNN, determinism switch, number of workers...); the rest are informational.

    Args:
        a: Fingerprint A, a dict as `tfrepro.environment()` returns (or a trace header holds).
        b: Fingerprint B, the same.

    Returns:
        A list of `EnvDifference`s sorted by key; empty when the fingerprints are equal.

    Raises:
        TypeError: `a` or `b` is not a dict.
    """
    if not isinstance(a, dict) or not isinstance(b, dict):
        raise TypeError("environment_diff expects two dicts returned by tfrepro.environment()")
    flat_a, flat_b = _flatten(a), _flatten(b)
    diffs = []
    for key in sorted(set(flat_a) | set(flat_b)):
        va, vb = flat_a.get(key), flat_b.get(key)
        if va == vb:
            continue
        why = next((reason for prefix, reason in _BREAKING.items()
                    if key == prefix or key.startswith(prefix + ".")), "")
        diffs.append(EnvDifference(key, va, vb, bool(why), why))
    return diffs
