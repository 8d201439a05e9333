"""``tfrepro.data.skip``: ``Dataset.skip`` that does not compute the elements it skips, where that
gives the same elements.

``Dataset.skip(n)`` pulls its first ``n`` elements through the whole pipeline and drops them: every
map above the source runs for them (TF computes what it skips). ``skip`` rewrites a copy of the
dataset's graph instead: the skip moves down, past each stage that makes one element of the one
below (prefetch, a map whose function keeps no state across elements, ``assert_cardinality``), or a
fixed number of them (``batch(B)``: n batches are n * B elements; ``unbatch()`` of blocks of static
size; ``zip``: each input), and stops above the first stage that does not (a shuffle, ``filter``,
``interleave``, a generator, a map with stateful random ops, whose draws follow the elements it has
made). It never reads or runs the dataset.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

from tfrepro import _tf
from tfrepro.data.addressing import serialized_graph, why_not_addressable

_ONE_TO_ONE = {"PrefetchDataset", "ModelDataset", "OptionsDataset", "MaxIntraOpParallelismDataset",
               "PrivateThreadPoolDataset", "ExperimentalMaxIntraOpParallelismDataset",
               "ExperimentalPrivateThreadPoolDataset", "AssertCardinalityDataset"}
_MAPS = {"MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2"}
_BATCHES = {"BatchDataset", "BatchDatasetV2", "PaddedBatchDataset", "PaddedBatchDatasetV2", "ParallelBatchDataset"}
# Copying a graph costs about 20 ms per MiB (serialised, parsed, rewritten, rebuilt): larger ones,
# which hold arrays as constants, are drawn instead.
_COPIED_AT_MOST = 16 << 20
# Stateful ops that change no value a later element gets: skipping their element skips only a check.
_HARMLESS = {"Assert", "Print", "PrintV2", "ReadVariableOp"}


@dataclass
class Skip:
    """A plan to skip ``count`` elements of a dataset: the rewritten dataset, or why there is none."""

    count: int
    dataset: Any = None
    why_not: str | None = None
    bypassed: list[str] = field(default_factory=list)  # the ops the skipped elements no longer run

    def told(self, what: str) -> str:
        """The log's words for this plan, ``what`` naming the skipped elements."""
        if self.dataset is not None:
            return f"{what} skipped without computing them (past {', '.join(self.bypassed)})"
        return f"{what} drawn and dropped: {self.why_not}"


def skip(dataset: Any, count: int) -> Any:
    """Skips the first `count` elements of `dataset`, without computing them where the pipeline allows.

    `dataset.skip(count)`, whose skipped elements go through every map above the source (TF
    computes what it skips). This one rewrites a copy of the dataset's graph so that the skip moves
    down past the stages that make one element, or a fixed number of elements, of the one below
    (prefetch, a stateless map, `batch`, `unbatch` of static blocks, `zip`); it never reads or runs
    the dataset. The result yields the same elements, bit for bit, as the next pass of
    `dataset.skip(count)`, for a dataset whose passes do not depend on the passes before
    (`tfrepro.data.shuffle` and `map_with_seed` are keyed by the epoch; see
    `tfrepro.checkpointing.input_position`). Where they do, where no map can be passed, or where
    the graph captures a variable or a table or holds over 16 MiB (arrays embedded as constants
    cost more to copy than to draw), it is `dataset.skip(count)` itself
    (`tfrepro.data.skipping.plan(dataset, count).why_not` says why). The skipped elements' maps
    above a keyed shuffle, its batches and prefetches are not run; the shuffle's own input is
    still pulled. For a custom loop's mid-epoch resume, say.

    Args:
        dataset: The `tf.data.Dataset` to skip elements of.
        count: How many elements to skip, a non-negative int (0 returns `dataset` itself).

    Returns:
        A `tf.data.Dataset` of the elements of `dataset` after the first `count`.

    Raises:
        TypeError: `dataset` is not a `tf.data.Dataset`.
        ValueError: `count` is not a non-negative int.

    Examples:
        >>> import tensorflow as tf, tfrepro.data
        >>> def at_least_30(i):  # fails on an element below 30
        ...     tf.debugging.assert_greater_equal(i, tf.constant(30, tf.int64))
        ...     return i
        >>> ds = tf.data.Dataset.range(40).map(at_least_30).batch(10)
        >>> [batch.numpy().tolist() for batch in tfrepro.data.skip(ds, 3)]  # the map never sees 0-29
        [[30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]
    """
    tf = _tf.import_tf()
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset; got {type(dataset).__name__}")
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
        raise ValueError(f"count must be a non-negative int (elements to skip); got {count!r}")
    planned = plan(dataset, int(count))
    return planned.dataset if planned.dataset is not None else dataset.skip(count)


def plan(dataset: Any, count: int) -> Skip:
    """How ``count`` elements of ``dataset`` can be skipped without computing them."""
    tf = _tf.import_tf()
    if count == 0:
        return Skip(count, dataset)
    try:
        graph = serialized_graph(dataset, most_bytes=_COPIED_AT_MOST)
    except Exception as exc:  # a graph over 2 GB, say
        return Skip(count, why_not=f"its graph cannot be copied ({type(exc).__name__}: {str(exc).splitlines()[0]})")
    if graph is None:
        return Skip(count, why_not=f"its graph holds over {_COPIED_AT_MOST >> 20} MiB (arrays embedded as "
                                   "constants), which costs more to copy than drawing small batches does; "
                                   "read large data from files")
    why = why_not_addressable(dataset, graph)
    if why is not None:
        return Skip(count, why_not=why)
    captured = _captured_state(tf, graph)
    if captured is not None:
        return Skip(count, why_not=f"it captures {captured}, which a copy of its graph would freeze")
    rewrite = _Rewrite(tf, graph)
    output = next((node for node in graph.node if node.op == "_Retval"), None)
    if output is None:
        return Skip(count, why_not="its graph has no output node")
    rewrite.push(output, 0, count)
    if rewrite.failed is not None:
        return Skip(count, why_not=rewrite.failed)
    if not any(op in _MAPS for op in rewrite.bypassed):
        return Skip(count, why_not="no map can be passed: the stages under the skip make their elements by "
                                   "the ones before (a shuffle, filter, interleave, stateful map, or unknown sizes)")
    variant = tf.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString())
    rewritten = tf.data.experimental.from_variant(variant, dataset.element_spec)
    return Skip(count, rewritten, bypassed=sorted(set(rewrite.bypassed)))


class _Rewrite:
    """Moves a skip down a dataset's ``GraphDef``, in place."""

    def __init__(self, tf: Any, graph: Any):
        self.tf, self.graph = tf, graph
        self.nodes = {node.name: node for node in graph.node}
        self.functions = {function.signature.name: function for function in graph.library.function}
        self.bypassed: list[str] = []
        self.failed: str | None = None
        self.made = 0

    def push(self, consumer: Any, slot: int, count: int) -> None:
        """Skip ``count`` elements of ``consumer``'s input ``slot``, as far down as is exact."""
        node = self.nodes[_node_name(consumer.input[slot])]
        op = node.op
        if count == 0:
            return
        if op in _ONE_TO_ONE or (op in _MAPS and self._keeps_no_state(node)):
            if op == "AssertCardinalityDataset" and not self._lower_cardinality(node, count):
                return self.insert(consumer, slot, count)
            if op in _MAPS:
                self.bypassed.append(op)
            return self.push(node, 0, count)
        if op in _BATCHES:
            size = self._constant(node.input[1])
            if size is None or size < 1 or not self._in_order(node):
                return self.insert(consumer, slot, count)
            self.bypassed.append(op)
            return self.push(node, 0, count * size)
        if op == "UnbatchDataset":
            size = self._leading_dimension(self.nodes[_node_name(node.input[0])])
            if size is None or count < size:
                return self.insert(consumer, slot, count)
            self.push(node, 0, count // size)
            return self.insert(consumer, slot, count % size)
        if op == "ZipDataset":
            for index, name in enumerate(node.input):
                if not name.startswith("^"):
                    self.push(node, index, count)
            return None
        return self.insert(consumer, slot, count)

    def insert(self, consumer: Any, slot: int, count: int) -> None:
        """A ``SkipDataset`` of ``count`` between ``consumer`` and its input ``slot``."""
        if count == 0:
            return
        tf = self.tf
        source = self.nodes[_node_name(consumer.input[slot])]
        types = next((name for name in ("output_types", "Toutput_types") if name in source.attr), None)
        if types is None or "output_shapes" not in source.attr:
            self.failed = f"a {source.op} does not say what it yields"
            return
        self.made += 1
        constant = self.graph.node.add(name=f"tfrepro_skip/count_{self.made}", op="Const")
        constant.attr["dtype"].type = tf.int64.as_datatype_enum
        constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(count, tf.int64))
        skipped = self.graph.node.add(name=f"tfrepro_skip/skip_{self.made}", op="SkipDataset",
                                      input=[consumer.input[slot], constant.name])
        skipped.attr["output_types"].CopyFrom(source.attr[types])
        skipped.attr["output_shapes"].CopyFrom(source.attr["output_shapes"])
        consumer.input[slot] = skipped.name

    def _lower_cardinality(self, node: Any, count: int) -> bool:
        """Make an ``assert_cardinality`` expect ``count`` fewer elements (False if it cannot)."""
        expected = self._constant(node.input[1])
        if expected is None:
            return False
        if expected >= 0:
            tf = self.tf
            constant = self.graph.node.add(name=f"tfrepro_skip/cardinality_{self.made}_{node.name}", op="Const")
            constant.attr["dtype"].type = tf.int64.as_datatype_enum
            constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(max(expected - count, 0), tf.int64))
            node.input[1] = constant.name
        return True

    def _constant(self, name: str) -> int | None:
        node = self.nodes.get(_node_name(name))
        if node is None or node.op != "Const":
            return None
        value = self.tf.make_ndarray(node.attr["value"].tensor)
        return int(value) if value.ndim == 0 else None

    def _leading_dimension(self, node: Any) -> int | None:
        """The size of the first dimension of every element ``node`` yields, but maybe its last (a
        batch's remainder, after the elements any skip can reach): static, or a batch's size."""
        if node.op in _BATCHES:
            return self._constant(node.input[1])
        if node.op in _ONE_TO_ONE or (node.op in _MAPS and self._passes_through(node.attr["f"].func.name)):
            return self._leading_dimension(self.nodes[_node_name(node.input[0])])
        shapes = node.attr["output_shapes"].list.shape if "output_shapes" in node.attr else []
        sizes = {shape.dim[0].size if not shape.unknown_rank and shape.dim else -1 for shape in shapes}
        return sizes.pop() if len(sizes) == 1 and min(sizes) > 0 else None

    def _passes_through(self, name: str) -> bool:
        """Whether function ``name`` returns its arguments as they are (Identity only)."""
        function = self.functions.get(name)
        if function is None:
            return False
        arguments = [argument.name for argument in function.signature.input_arg]
        identities = {node.name: node.input[0] for node in function.node_def if node.op == "Identity" and node.input}
        if len(identities) != len(function.node_def):
            return False
        returned = [identities.get(function.ret[out.name].split(":")[0]) for out in function.signature.output_arg]
        return returned == arguments

    def _keeps_no_state(self, node: Any) -> bool:
        """Whether a map's function gives each element what it would give it alone: no stateful op
        (a stateful random op's draws follow the elements before), and a deterministic order."""
        return self._in_order(node) and self._pure(node.attr["f"].func.name, set())

    def _in_order(self, node: Any) -> bool:
        """Whether a parallel stage yields its elements in order: ``deterministic="true"``, or the
        default where no ``tf.data.Options`` of the pipeline turns it off (nor ``sloppy``)."""
        if "sloppy" in node.attr and node.attr["sloppy"].b:
            return False
        if "deterministic" not in node.attr:
            return True
        setting = node.attr["deterministic"].s
        return setting == b"true" or (setting == b"default" and self.default_in_order)

    @property
    def default_in_order(self) -> bool:
        from tensorflow.core.framework import dataset_options_pb2

        for node in self.graph.node:
            if node.op == "OptionsDataset" and "serialized_options" in node.attr:
                options = dataset_options_pb2.Options.FromString(node.attr["serialized_options"].s)
                if options.HasField("deterministic") and not options.deterministic:
                    return False
        return True

    def _pure(self, name: str, seen: set[str]) -> bool:
        if name in seen:
            return True
        seen.add(name)
        function = self.functions.get(name)
        if function is None:
            return False
        from tensorflow.python.framework import op_def_registry  # the ops' own declarations

        for node in function.node_def:
            called = [value.func.name for value in node.attr.values() if value.HasField("func")]
            called += [f.name for value in node.attr.values() if value.HasField("list") for f in value.list.func]
            if called:
                if not all(self._pure(inner, seen) for inner in called):
                    return False
                continue
            if node.op in self.functions:  # a function called as an op
                if not self._pure(node.op, seen):
                    return False
                continue
            declared = op_def_registry.get(node.op)
            if declared is None or (declared.is_stateful and node.op not in _HARMLESS):
                return False
        return True


def _captured_state(tf: Any, graph: Any) -> str | None:
    """What state ``graph``'s functions capture (a variable, a lookup table), or None."""
    resource = tf.resource.as_datatype_enum
    for node in [*graph.node, *(n for function in graph.library.function for n in function.node_def)]:
        if node.op in ("VarHandleOp", "HashTableV2", "MutableHashTableV2", "MutableDenseHashTableV2"):
            return f"a {node.op}"
        if "Targuments" in node.attr and resource in node.attr["Targuments"].list.type:
            return f"a resource (a variable or a table) in a {node.op}'s function"
    return None


def _node_name(reference: str) -> str:
    """The node an input reference names (``"^a"``, ``"a:0"`` and ``"a"`` all name ``a``)."""
    return reference.lstrip("^").split(":")[0]
