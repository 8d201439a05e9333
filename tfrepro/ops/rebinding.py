"""``tfrepro.patch(ops=...)``: rebind TensorFlow's names, and the internal call sites that Keras and
TF's own gradient code use, to the ops in ``tfrepro.ops``.

Each target is either a public name (``tf.math.unsorted_segment_sum``), an attribute of an internal
module that callers look up at call time (``math_ops.unsorted_segment_sum``, used by the gather
gradient for ``axis != 0``, by ``IndexedSlices`` aggregation in the optimizers and elsewhere;
``math_ops.segment_sum``, which ``embedding_lookup_sparse`` sums with; ``nn_impl.fused_batch_norm``), or a
generated-op module seen by one module (``indexed_slices`` densifies ``IndexedSlices`` through
``gen_math_ops.unsorted_segment_sum``; ``tf.image.resize`` and ``crop_and_resize`` reach their kernels
through ``image_ops_impl.gen_image_ops``): such a module is replaced, in that one module only, by a
view that differs in the replaced ops alone.

``array_ops.gather`` is not rebound: TF's own code (shape arithmetic, gradients, ragged and sparse
ops) calls it everywhere, mostly on integer shapes; its gradient is an ``IndexedSlices`` whose
repeats are summed by the rebound segment sums (densified, or de-duplicated by the optimizers).
"""

from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Callable, Iterable
from typing import Any

import tensorflow as tf

from tfrepro import _targets
from tfrepro.errors import warn
from tfrepro.ops import gathering, image, nn, segment, sparse
from tfrepro.ops import _exact_sum
from tfrepro.ops._exact_sum import summing

# op name -> (replacement, targets). A target is "tf.<attribute path>" (also bound as
# "tf.compat.v2.<attribute path>"), "<module>:<attribute>", or "<module>:<generated-op module
# global>.<op>" (a view of that module, seen by that module only).
TABLE: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "unsorted_segment_sum": (segment.unsorted_segment_sum, (
        "tf.math.unsorted_segment_sum", "tf.compat.v1.math.unsorted_segment_sum",
        "tf.compat.v1.unsorted_segment_sum", "tensorflow.python.ops.math_ops:unsorted_segment_sum",
        "tensorflow.python.framework.indexed_slices:gen_math_ops.unsorted_segment_sum")),
    "unsorted_segment_mean": (segment.unsorted_segment_mean, (
        "tf.math.unsorted_segment_mean", "tf.compat.v1.math.unsorted_segment_mean",
        "tensorflow.python.ops.math_ops:unsorted_segment_mean")),
    "unsorted_segment_sqrt_n": (segment.unsorted_segment_sqrt_n, (
        "tf.math.unsorted_segment_sqrt_n", "tf.compat.v1.math.unsorted_segment_sqrt_n",
        "tensorflow.python.ops.math_ops:unsorted_segment_sqrt_n")),
    "segment_sum": (segment.segment_sum, ("tf.math.segment_sum", "tf.compat.v1.math.segment_sum",
                                      "tf.compat.v1.segment_sum", "tensorflow.python.ops.math_ops:segment_sum")),
    "segment_mean": (segment.segment_mean, ("tf.math.segment_mean", "tf.compat.v1.math.segment_mean",
                                        "tf.compat.v1.segment_mean", "tensorflow.python.ops.math_ops:segment_mean")),
    "bias_add": (nn.bias_add, ("tf.nn.bias_add", "tf.compat.v1.nn.bias_add",
                                "tensorflow.python.ops.nn_ops:bias_add")),
    "softmax_cross_entropy_with_logits": (nn.softmax_cross_entropy_with_logits, (
        "tf.nn.softmax_cross_entropy_with_logits", "tf.compat.v1.nn.softmax_cross_entropy_with_logits_v2",
        "tensorflow.python.ops.nn_ops:softmax_cross_entropy_with_logits_v2")),
    "sparse_softmax_cross_entropy_with_logits": (nn.sparse_softmax_cross_entropy_with_logits, (
        "tf.nn.sparse_softmax_cross_entropy_with_logits",
        "tensorflow.python.ops.nn_ops:sparse_softmax_cross_entropy_with_logits_v2")),
    "bincount": (sparse.bincount, ("tf.math.bincount", "tensorflow.python.ops.bincount_ops:bincount")),
    "sparse_dense_matmul": (sparse.sparse_dense_matmul, (
        "tf.sparse.sparse_dense_matmul", "tf.compat.v1.sparse.sparse_dense_matmul",
        "tf.compat.v1.sparse_tensor_dense_matmul", "tensorflow.python.ops.sparse_ops:sparse_tensor_dense_matmul")),
    "gather": (gathering.gather, ("tf.gather",)),
    "embedding_lookup": (gathering.embedding_lookup, ("tf.nn.embedding_lookup",)),
    "resize_nearest_neighbor": (image.resize_nearest_neighbor, (
        "tensorflow.python.ops.image_ops_impl:gen_image_ops.resize_nearest_neighbor",)),
    "crop_and_resize": (image.crop_and_resize, (
        "tensorflow.python.ops.image_ops_impl:gen_image_ops.crop_and_resize",)),
    "fused_batch_norm": (nn.fused_batch_norm, ("tf.compat.v1.nn.fused_batch_norm",
                                                "tensorflow.python.ops.nn_impl:fused_batch_norm",
                                                "tensorflow.python.ops.nn:fused_batch_norm")),
    "adjust_contrast": (image.adjust_contrastv2, (
        "tensorflow.python.ops.image_ops_impl:gen_image_ops.adjust_contrastv2",)),
}


class _ModuleView(types.ModuleType):
    """A module that answers with its overrides first and with the wrapped module otherwise."""

    def __init__(self, wrapped: types.ModuleType, overrides: dict[str, Any]):
        super().__init__(wrapped.__name__, wrapped.__doc__)
        self.__dict__.update(overrides)
        self.__wrapped__ = wrapped

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)


# Internal call sites that appeared after TF 2.12 (the oldest supported), with the version they appeared in.
_INTERNAL_SINCE = {"tensorflow.python.framework.indexed_slices:gen_math_ops.unsorted_segment_sum": (2, 13)}


def internal_target(op: str, target: str) -> _targets.Target:
    """The inventory entry of an internal call site ``target`` ("module:attribute") of ``op``."""
    module, attribute = target.split(":")
    return _targets.Target(f"ops:{target}", module, attribute, "tensorflow", (_INTERNAL_SINCE.get(target, (2, 12)), None),
                           f"patch(ops=...) cannot replace {op} where TF's own code calls it there: TF's kernel runs")


def _with_compat_v2(targets: tuple[str, ...]) -> list[str]:
    """Each public ``tf.X`` target also as ``tf.compat.v2.X``: a separate module object, and the one
    tf_keras (and the Keras 2 built into TF <= 2.15) calls through ``import tensorflow.compat.v2 as tf``."""
    expanded = []
    for target in targets:
        expanded.append(target)
        if target.startswith("tf.") and not target.startswith("tf.compat."):
            expanded.append("tf.compat.v2." + target[3:])
    return expanded


def _owner(target: str) -> tuple[Any, str]:
    """The object holding a target's attribute, and the attribute's name."""
    if target.startswith("tf."):
        *path, attribute = target.split(".")[1:]
        owner: Any = tf
        for part in path:
            owner = getattr(owner, part)
        return owner, attribute
    module, attribute = target.split(":")
    return importlib.import_module(module), attribute


# TF's op has no gradient (AdjustContrastv2): tfrepro's version, which has one, runs on every device.
_OURS_EVERYWHERE = {"adjust_contrast"}


def _summing(replacement: Callable[..., Any], mode: str, original: Callable[..., Any] | None) -> Callable[..., Any]:
    """``replacement`` as ``mode`` says: "exact" (order-invariant) as it is; "tf" (``ops="auto"``)
    summing with TF's own kernels where a GPU is visible, and else TF's ``original`` op itself (None:
    tfrepro's everywhere): on a CPU every TF kernel is deterministic, so there the replacement would
    only cost time."""
    if mode == "exact":
        return replacement

    @functools.wraps(replacement)
    def call(*args: Any, **kwargs: Any) -> Any:
        if original is not None and not _exact_sum.gpus_visible():
            return original(*args, **kwargs)
        with summing(mode):
            return replacement(*args, **kwargs)

    return call


def rebind(names: Iterable[str], summation: str = "exact") -> Callable[[], None]:
    """Point every target of the named ops at tfrepro's op, summing order-invariantly ("exact") or
    with TF's sums, deterministic under op determinism ("tf", for ``patch(ops="auto")``), or as the
    exact tier ("exact_tier", ``patch(ops="exact")``: ``tfrepro.ops.exact``'s ops where it has
    them, its refusals, Keras's optimizers made FMA-proof, its normalisations and Keras 3's LSTM cell exact, Grappler's re-association off, and the
    audit of traced steps, ``coverage``); returns the undo."""
    table = TABLE
    undo_optimizers = None
    if summation == "exact_tier":
        from tfrepro.ops import exact
        from tfrepro.ops.exact import _fixed, coverage, normalization, optimizers, recurrent

        table, summation = {**TABLE, **exact.table()}, "exact"
        undo_audit = coverage.install()
        undo_optimizers = optimizers.install()
        undo_normalization = normalization.install()
        undo_recurrent = recurrent.install()
        undo_order = _fixed.keep_graph_order()
    saved: list[tuple[Any, str, Any]] = []
    views: dict[tuple[int, str], dict[str, Any]] = {}
    owners: dict[tuple[int, str], Any] = {}

    def undo() -> None:
        for owner, attribute, original in reversed(saved):
            setattr(owner, attribute, original)
        if undo_optimizers is not None:
            undo_optimizers()
            undo_normalization()
            undo_recurrent()
            undo_audit()
            undo_order()

    try:  # all or nothing
        for name in names:
            replacement, targets = table[name]
            bound = 0
            for target in _with_compat_v2(targets):
                try:
                    owner, attribute = _owner(target)
                    current = getattr(owner, attribute.split(".")[0])
                    if "." in attribute:
                        getattr(current, attribute.split(".")[1])
                except (AttributeError, ImportError) as exc:
                    if ":" in target:  # an internal call site: TF's own kernel would run there, named
                        _targets.report(internal_target(name, target), f"{type(exc).__name__}: {exc}")
                    continue  # a public name not in this TensorFlow version
                bound += 1
                if "." in attribute:  # an op seen through a generated-op module global
                    module_global, op = attribute.split(".")
                    key = (id(owner), module_global)
                    owners[key] = owner
                    tf_op = None if name in _OURS_EVERYWHERE else getattr(current, op)
                    views.setdefault(key, {})[op] = _summing(replacement, summation, tf_op)
                    continue
                saved.append((owner, attribute, current))
                setattr(owner, attribute, _summing(replacement, summation, None if name in _OURS_EVERYWHERE else current))
            if not bound:
                warn(f"tfrepro.patch(ops=...): this TensorFlow has none of the names of {name}; it is not replaced")
        for key, overrides in views.items():
            owner, module_global = owners[key], key[1]
            original = getattr(owner, module_global)
            saved.append((owner, module_global, original))
            setattr(owner, module_global, _ModuleView(original, overrides))
    except BaseException:
        undo()
        raise
    return undo
