"""Deterministic ops: replacements bitwise independent of accumulation order on any hardware, and
the Keras drop-in layers built on them (``tfrepro.ops.layers``, also ``tfrepro.layers``).

Each op keeps the signature and semantics of the TensorFlow op it replaces, and fails on bad input
as TF's op does: the same error class and message, raised when TF raises it (``_checks``). The
kernels are ``tf.function``s traced once and called by every op instance (``_exact_sum.traced``),
so an instance costs a graph a few nodes, as TF's op does. Sums go through an
exact int64 fixed-point accumulation (see ``tfrepro.ops._exact_sum`` for the method and its
accuracy bound), so permuting the inputs or changing the device, thread count or schedule cannot
change a bit. ``tfrepro.patch(ops=True)`` rebinds TensorFlow's names, and the internal call sites
that Keras and TF's gradient code use, to these ops (``rebinding``; ``selection`` names them).

``exact`` is the exact tier (``patch(ops="exact")``): exact, order-invariant matrix products,
convolutions, pooling, dropout, losses and optimizer updates, for the same bits across thread
counts, oneDNN, XLA and replica counts.

``kernel_facts`` is the table of ops that have no deterministic GPU kernel, by TensorFlow version
(TF-free), which ``tfrepro.diagnose`` scans against. Importing this package is free; the first op
accessed imports TensorFlow. The ops package imports
only the ground floor (``tfrepro._tf``, ``tfrepro.errors``) and TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import Any

# public op -> the module that defines it
_HOMES = {
    "bias_add": "nn",
    "softmax_cross_entropy_with_logits": "nn",
    "sparse_softmax_cross_entropy_with_logits": "nn",
    "crop_and_resize": "image",
    "adjust_contrast": "image",
    "fused_batch_norm": "nn",
    "resize_nearest_neighbor": "image",
    "embedding_lookup": "gathering",
    "gather": "gathering",
    "bincount": "sparse",
    "sparse_dense_matmul": "sparse",
    "reduce_sum": "segment",
    "segment_mean": "segment",
    "segment_sum": "segment",
    "unsorted_segment_mean": "segment",
    "unsorted_segment_sqrt_n": "segment",
    "unsorted_segment_sum": "segment",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in ("kernel_facts", "exact"):  # TF-free: the table of ops without deterministic GPU kernels; the
        return importlib.import_module(f"{__name__}.{name}")  # exact tier's table
    if name in _HOMES:
        value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
