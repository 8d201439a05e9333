"""Which TensorFlow ops have no deterministic GPU kernel, by TensorFlow version: one table of data.

Under op determinism (``TF_DETERMINISTIC_OPS``, ``enable_op_determinism``) an op either runs a
deterministic kernel, raises ``UnimplementedError`` on a GPU because it has none ("raises"), or, in
releases before TensorFlow covered it, ran its order-dependent kernel silently ("nondeterministic").
Each ``KernelFact`` names the graph op types concerned, what they are in the Python API, the TF
versions and behaviour, the Keras layers that reach them, the fix, the ``tfrepro.ops`` replacement
if there is one, the source, and whether the op is a gradient (reached only in training).
``tfrepro.diagnose`` matches a traced train step against it, and ``patch(ops="auto")`` replaces
what it lists for the installed version (``selection.auto_ops``): the one place that says what a
TensorFlow version cannot run deterministically.

TF-free: importing this module never imports TensorFlow, and ``tf_version`` defaults to the
installed version read from package metadata.

Examples:
    >>> [fact.key for fact in ops_without_deterministic_kernel("2.9")][-1]
    'depthwise_conv_filter_backprop'
    >>> "depthwise_conv_filter_backprop" in {fact.key for fact in ops_without_deterministic_kernel("2.10")}
    False
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tfrepro import _tf

Behaviour = Literal["raises", "nondeterministic"]
Version = tuple[int, int]


@dataclass(frozen=True)
class Span:
    """TensorFlow versions ``[since, until)`` (``None``: unbounded) in which an op ``behaviour``s
    under op determinism on a GPU."""

    behaviour: Behaviour
    since: Version | None
    until: Version | None = None

    def covers(self, version: Version) -> bool:
        return (self.since is None or version >= self.since) and (self.until is None or version < self.until)

    def describe(self) -> str:
        low = "2.0" if self.since is None else f"{self.since[0]}.{self.since[1]}"
        if self.until is None:
            return f"{self.behaviour} since TF {low}"
        return f"{self.behaviour} in TF {low}-{self.until[0]}.{self.until[1] - 1}"


@dataclass(frozen=True)
class KernelFact:
    """One op (or family of graph op types) and its GPU determinism over TensorFlow versions.

    Attributes:
        key: A short stable name (`"bincount"`).
        api: What the op is in the Python API (`"tf.math.bincount"`).
        op_types: The graph op types concerned (`("Bincount", "DenseBincount")`).
        spans: The TF versions in which it raises or is silently nondeterministic, each a `Span`.
        layers: The Keras layers (and other callers) that reach it.
        fix: What to do about it.
        source: Where the fact comes from (release notes, an issue).
        replacement: The `tfrepro.ops` op that replaces it (a `patch(ops=[...])` name), or `None`.
        attr: Only graph nodes whose attribute (name, values) has one of these values, or `None`.
        xla_only: Whether it concerns only functions that XLA compiles (`jit_compile=True`).
        backprop: Whether the op is a gradient, which a model reaches only when it trains.
    """

    key: str
    api: str
    op_types: tuple[str, ...]
    spans: tuple[Span, ...]
    layers: tuple[str, ...]
    fix: str
    source: str
    replacement: str | None = None  # the ``tfrepro.ops`` op (a ``patch(ops=[...])`` name)
    attr: tuple[str, tuple[Any, ...]] | None = None  # only nodes whose attribute has one of these values
    xla_only: bool = False  # only inside XLA-compiled functions (``jit_compile=True``)
    backprop: bool = False  # the op is a gradient: a model reaches it only when it trains

    def behaviour(self, tf_version: str | Version | None = None) -> Behaviour | None:
        """The op's behaviour on a GPU under op determinism in a TensorFlow version.

        Args:
            tf_version: `"2.15"`, `"2.15.1"` or `(2, 15)`; `None`: the installed TensorFlow's.

        Returns:
            `"raises"`, `"nondeterministic"`, or `None` for a deterministic kernel.
        """
        version = resolve_version(tf_version)
        return next((span.behaviour for span in self.spans if span.covers(version)), None)

    def matches(self, op_type: str, attrs: Mapping[str, Any] | None = None, *, xla: bool = False) -> bool:
        """Whether a graph node is this op, versions aside.

        Args:
            op_type: The node's op type (`"Bincount"`).
            attrs: The node's attributes, by name (only those this fact's `attr` names matter).
            xla: Whether the node is in a function that XLA compiles.

        Returns:
            Whether it is.
        """
        if op_type not in self.op_types or (self.xla_only and not xla):
            return False
        if self.attr is not None:
            name, values = self.attr
            return (attrs or {}).get(name) in values
        return True

    def history(self) -> str:
        return "; ".join(span.describe() for span in self.spans) + "; deterministic otherwise"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "api": self.api, "op_types": list(self.op_types), "history": self.history(),
                "layers": list(self.layers), "fix": self.fix, "replacement": self.replacement, "source": self.source,
                "backprop": self.backprop}


_RELEASE_NOTES = "TensorFlow release notes, determinism section"
FACTS: tuple[KernelFact, ...] = (
    KernelFact(
        "resize_nearest_backprop", "tf.image.resize(method='nearest') backprop", ("ResizeNearestNeighborGrad",),
        (Span("nondeterministic", None, (2, 7)), Span("raises", (2, 7))),
        ("UpSampling2D (Keras 2; Keras 3 repeats pixels instead and never reaches it)",
         "Resizing(interpolation='nearest')"),
        "tfrepro.patch(): its default ops='auto' replaces it (ops=['resize_nearest_neighbor'] for the "
        "order-invariant version), or the tfrepro.layers.UpSampling2D drop-in",
        f"{_RELEASE_NOTES}, TF 2.7", "resize_nearest_neighbor", backprop=True),
    KernelFact(
        "crop_and_resize_backprop", "tf.image.crop_and_resize backprop (to image and to boxes)",
        ("CropAndResizeGradImage", "CropAndResizeGradBoxes"),
        (Span("nondeterministic", None, (2, 6)), Span("raises", (2, 6))),
        ("layers that call tf.image.crop_and_resize (detection heads, ROI align)",),
        "tfrepro.patch(): its default ops='auto' replaces it (ops=['crop_and_resize'] for the order-invariant "
        "version)", f"{_RELEASE_NOTES}, TF 2.6", "crop_and_resize", backprop=True),
    KernelFact(
        "sparse_dense_matmul", "tf.sparse.sparse_dense_matmul", ("SparseTensorDenseMatMul",),
        (Span("nondeterministic", None, (2, 6)), Span("raises", (2, 6))),
        ("Dense on tf.SparseTensor input", "layers that call tf.sparse.sparse_dense_matmul"),
        "tfrepro.patch(): its default ops='auto' replaces it (ops=['sparse_dense_matmul'] for the "
        "order-invariant version)", f"{_RELEASE_NOTES}, TF 2.6", "sparse_dense_matmul"),
    KernelFact(
        "bincount", "tf.math.bincount", ("Bincount", "DenseBincount"),
        (Span("nondeterministic", None, (2, 7)), Span("raises", (2, 7))),
        ("CategoryEncoding(output_mode='count' or 'multi_hot')", "keras.ops.bincount", "metrics that count"),
        "tfrepro.patch(): its default ops='auto' replaces it (ops=['bincount'] for the order-invariant "
        "version)", f"{_RELEASE_NOTES}, TF 2.7", "bincount"),
    KernelFact(
        "fused_batch_norm_backprop_inference",
        "fused batch-norm backprop with is_training=False, i.e. batch norm fine-tuning",
        ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"),
        (Span("raises", (2, 7)),),
        ("BatchNormalization called with training=False while trainable (Keras 2's fused path; Keras 3 "
         "computes batch norm unfused)",),
        "tfrepro.patch(): its default ops='auto' replaces it (ops=['fused_batch_norm']); or freeze the "
        "BatchNormalization layers when fine-tuning (layer.trainable = False), or BatchNormalization(fused=False)",
        f"{_RELEASE_NOTES}, TF 2.7", "fused_batch_norm", attr=("is_training", (False,)), backprop=True),
    KernelFact(
        "adjust_contrast", "tf.image.adjust_contrast", ("AdjustContrastv2", "AdjustContrast"),
        (Span("raises", (2, 7)),),
        ("RandomContrast (Keras 2)", "tf.image.random_contrast / stateless_random_contrast in a model"),
        "tfrepro.patch(): its default ops='auto' replaces it (ops=['adjust_contrast']); or compute it as "
        "(x - mean) * factor + mean with the mean over height and width", f"{_RELEASE_NOTES}, TF 2.7", "adjust_contrast"),
    KernelFact(
        "debug_numeric_summary", "tf.debugging dumps: DebugNumericSummaryV2 in CONCISE_HEALTH or FULL_HEALTH mode",
        ("DebugNumericSummaryV2",), (Span("raises", (2, 7)),), ("tf.debugging.experimental.enable_dump_debug_info",),
        "dump with another tensor_debug_mode (CURT_HEALTH, SHAPE, FULL_TENSOR)", f"{_RELEASE_NOTES}, TF 2.7",
        attr=("tensor_debug_mode", (3, 4))),
    KernelFact(
        "depthwise_conv_filter_backprop", "depthwise convolution backprop to the filter",
        ("DepthwiseConv2dNativeBackpropFilter",),
        (Span("nondeterministic", None, (2, 7)), Span("raises", (2, 7), (2, 10))),
        ("DepthwiseConv2D", "SeparableConv2D"),
        "TensorFlow >= 2.10 with cuDNN >= 7.6 (on 2.9, TF_DISABLE_DEPTHWISE_CONV_DETERMINISM_EXCEPTIONS=1 silences "
        "the error but the kernel stays nondeterministic)",
        f"{_RELEASE_NOTES}, TF 2.7 and 2.10", backprop=True),
    KernelFact(
        "xla_max_pool_backprop", "max-pooling backprop compiled by XLA (it raises on a CPU too: measured on TF 2.21)",
        ("MaxPoolGrad", "MaxPoolGradV2"),
        (Span("raises", (2, 16)),), ("MaxPooling2D in a model compiled with jit_compile=True",),
        "compile(jit_compile=False); Keras >= 3.7 turns XLA off under op determinism unless jit_compile=True "
        "is asked for", "tensorflow/tensorflow#69417", xla_only=True, backprop=True),
    # Covered upstream since: silently order-dependent before, under the determinism switch of the day.
    KernelFact(
        "bias_add_backprop", "tf.nn.bias_add backprop", ("BiasAddGrad",), (Span("nondeterministic", None, (2, 1)),),
        ("Dense", "Conv1D/2D/3D", "every layer with a bias"), "tfrepro.patch(ops=['bias_add']) or TF >= 2.1",
        f"{_RELEASE_NOTES}, TF 2.1", "bias_add", backprop=True),
    KernelFact(
        "segment_reduction", "segment sums and means, the tf.gather backprop, IndexedSlices to dense",
        ("SegmentSum", "SegmentMean", "UnsortedSegmentSum", "UnsortedSegmentProd", "SparseSegmentSum",
         "SparseSegmentMean", "SparseSegmentSqrtN"),
        (Span("nondeterministic", None, (2, 5)), Span("raises", (2, 5), (2, 7))),
        ("Embedding (its gradient)", "layers that call tf.math.segment_* or tf.gather"),
        "tfrepro.patch(ops=['unsorted_segment_sum', 'gather', ...]) or TF >= 2.7",
        f"{_RELEASE_NOTES}, TF 2.5-2.7 (TF_DISABLE_SEGMENT_REDUCTION_OP_DETERMINISM_EXCEPTIONS)",
        "unsorted_segment_sum"),
    KernelFact(
        "softmax_cross_entropy", "tf.nn.softmax_cross_entropy_with_logits", ("SoftmaxCrossEntropyWithLogits",),
        (Span("nondeterministic", None, (2, 6)),), ("losses with from_logits=True",),
        "tfrepro.patch(ops=['softmax_cross_entropy_with_logits']) or TF >= 2.6", f"{_RELEASE_NOTES}, TF 2.6",
        "softmax_cross_entropy_with_logits"),
    KernelFact(
        "sparse_softmax_cross_entropy", "tf.nn.sparse_softmax_cross_entropy_with_logits",
        ("SparseSoftmaxCrossEntropyWithLogits",),
        (Span("nondeterministic", None, (2, 6)), Span("raises", (2, 6), (2, 7))),
        ("SparseCategoricalCrossentropy(from_logits=True)",),
        "tfrepro.patch(ops=['sparse_softmax_cross_entropy_with_logits']) or TF >= 2.7",
        f"{_RELEASE_NOTES}, TF 2.6-2.7 (TF_DISABLE_SPARSE_SOFTMAX_XENT_WITH_LOGITS_OP_DETERMINISM_EXCEPTIONS)",
        "sparse_softmax_cross_entropy_with_logits"),
    KernelFact(
        "resize_bilinear_backprop", "tf.image.resize(method='bilinear') backprop", ("ResizeBilinearGrad",),
        (Span("nondeterministic", None, (2, 4)),), ("UpSampling2D(interpolation='bilinear')", "Resizing"),
        "TF >= 2.4", f"{_RELEASE_NOTES}, TF 2.4", backprop=True),
    KernelFact(
        "ctc_loss", "tf.nn.ctc_loss on cuDNN", ("CTCLossV2",), (Span("nondeterministic", None, (2, 6)),),
        ("keras.backend.ctc_batch_cost",), "TF >= 2.6", f"{_RELEASE_NOTES}, TF 2.6"),
    KernelFact(
        "scatter", "scatter updates (tf.tensor_scatter_nd_add and the like)",
        ("ScatterNd", "ScatterNdAdd", "TensorScatterAdd", "TensorScatterUpdate", "ResourceScatterAdd",
         "ResourceScatterNdAdd"),
        (Span("nondeterministic", None, (2, 7)),), ("layers that scatter", "sparse optimizer updates"),
        "TF >= 2.7 (which runs them on the CPU under op determinism)", f"{_RELEASE_NOTES}, TF 2.7"),
)
"""The table: one `KernelFact` per op (or family of graph op types), by TensorFlow version."""
_BY_KEY = {fact.key: fact for fact in FACTS}


def resolve_version(tf_version: str | Version | None) -> Version:
    """``"2.15.1"``, ``"2.15"`` or ``(2, 15)`` as ``(2, 15)``; None: the installed TensorFlow's."""
    if isinstance(tf_version, tuple):
        return tf_version
    text = _tf.installed_tf_version() if tf_version is None else tf_version
    parsed = _tf.parse_version(text)
    if parsed is None:
        raise ValueError(f"not a TensorFlow version: {text!r} (expected e.g. '2.15' or '2.15.1')"
                         if tf_version is not None else
                         "TensorFlow is not installed; pass tf_version, e.g. '2.15'")
    return parsed


def installed_version() -> str | None:
    """The installed TensorFlow's version, from package metadata (never imports it)."""
    return _tf.installed_tf_version()


def fact(key: str) -> KernelFact:
    """The fact with this key."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"no kernel fact {key!r}; known: {', '.join(_BY_KEY)}") from None


def ops_without_deterministic_kernel(tf_version: str | Version | None = None) -> tuple[KernelFact, ...]:
    """Lists the ops that have no deterministic GPU kernel in a TensorFlow version.

    Under op determinism they raise `UnimplementedError` on a GPU.

    Args:
        tf_version: `"2.15"`, `"2.15.1"` or `(2, 15)`; `None`: the installed TensorFlow's.

    Returns:
        Their `KernelFact`s, in table order.

    Raises:
        ValueError: `tf_version` is not a version, or it is `None` and TensorFlow is not installed.

    Examples:
        >>> [fact.key for fact in ops_without_deterministic_kernel("2.9")][-1]
        'depthwise_conv_filter_backprop'
    """
    version = resolve_version(tf_version)
    return tuple(f for f in FACTS if f.behaviour(version) == "raises")


def silently_nondeterministic_ops(tf_version: str | Version | None = None) -> tuple[KernelFact, ...]:
    """Lists the ops whose GPU kernels a TensorFlow version runs order-dependently, even under op determinism.

    Args:
        tf_version: `"2.15"`, `"2.15.1"` or `(2, 15)`; `None`: the installed TensorFlow's.

    Returns:
        Their `KernelFact`s, in table order.

    Raises:
        ValueError: `tf_version` is not a version, or it is `None` and TensorFlow is not installed.
    """
    version = resolve_version(tf_version)
    return tuple(f for f in FACTS if f.behaviour(version) == "nondeterministic")


def match(op_type: str, attrs: Mapping[str, Any] | None = None, *, tf_version: str | Version | None = None,
          xla: bool = False) -> tuple[KernelFact, Behaviour] | None:
    """Finds the fact a graph node falls under in a TensorFlow version.

    Args:
        op_type: The node's op type (`"Bincount"`).
        attrs: The node's attributes, by name.
        tf_version: `"2.15"`, `"2.15.1"` or `(2, 15)`; `None`: the installed TensorFlow's.
        xla: Whether the node is in a function that XLA compiles.

    Returns:
        `(fact, behaviour)`, the `KernelFact` and `"raises"` or `"nondeterministic"`, or `None`
            when the node's op has a deterministic GPU kernel in that version.

    Raises:
        ValueError: `tf_version` is not a version, or it is `None` and TensorFlow is not installed.
    """
    version = resolve_version(tf_version)
    for candidate in FACTS:
        if candidate.matches(op_type, attrs, xla=xla):
            behaviour = candidate.behaviour(version)
            if behaviour is not None:
                return candidate, behaviour
    return None
