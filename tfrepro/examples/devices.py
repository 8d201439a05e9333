"""What the notebooks run on: the device, and what determinism costs there (from the project's
facts and its own benchmarks), so a reader on a CPU, a GTX 1050 Ti or a datacenter GPU knows what
to expect."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

from tfrepro import _tf

_GPU_COST = ("on a GPU, op determinism selects deterministic cuDNN algorithms and runs tf.data maps "
             "with stateful random ops serially: reported costs range from about 6% on one model to 10x "
             "on CNNs (TF #62100); ops with no deterministic GPU kernel raise unless tfrepro replaces them")
_CPU_COST = ("on this CPU, `tfrepro.patch` costs the MNIST CNN 0.99x plain TF with arrays and 1.20x with a "
             "random-augmentation tf.data map, which TF then runs serially (bench/patch_overhead.py)")


def _gpu_memory() -> list[str]:
    """Each GPU's total memory as nvidia-smi reports it (TensorFlow reports only what it uses)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        query = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in query.stdout.splitlines() if line.strip()]


def describe_device() -> str:
    """The GPUs TensorFlow sees (name, compute capability, memory) or the CPU (cores, memory), and
    the cost of determinism there. These notebooks' models need well under 1 GB: a 4 GB GTX 1050 Ti
    runs them."""
    tf = _tf.import_tf()
    lines = []
    gpus = tf.config.list_physical_devices("GPU")
    memory = _gpu_memory() if gpus else []
    for index, gpu in enumerate(gpus):
        details = tf.config.experimental.get_device_details(gpu)
        capability = ".".join(str(part) for part in details.get("compute_capability", ())) or "unknown"
        total = memory[index] if index < len(memory) else "unknown (no nvidia-smi)"
        lines.append(f"GPU {gpu.name}: {details.get('device_name', 'unknown')}, compute capability {capability}, "
                     f"memory {total}")
    if lines:
        lines.append(f"determinism cost: {_GPU_COST}")
    else:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else None
        lines.append(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores"
                     + (f", {ram:.0f} GiB memory" if ram else "") + "; no GPU visible")
        lines.append(f"determinism cost: {_CPU_COST}")
    lines.append(f"TensorFlow {tf.__version__}")
    return "\n".join(lines)
