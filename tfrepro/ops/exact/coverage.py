"""The exact tier's precondition audit: every op of a traced step is covered, or named before it runs.

``patch(ops="exact")`` rebinds the ops it replaces; anything else a model calls runs TF's own
kernels, whose bits can depend on the thread count, oneDNN, XLA or the replica count. So under the
exact tier every function TensorFlow traces (``fit``'s train, test and predict steps, a custom
``tf.function`` training loop, and every condition, loop and gradient function inside them) is
audited as its trace ends, before it first runs: each op that reaches the function's outputs or a
state update is checked against what is proven to give the same bits on all four axes:

- ops the exact tier built on its exact path (their name scope carries ``MARK``, in a gradient
  the mark of that gradient's depth, so TF's own gradient of a tier op is audited; functions they
  call inherit it; an exact op that falls back to TF's kernel builds it outside the scope);
- data movement, comparisons, selection, ``relu``, elementwise max/min: exact for any input;
- integer and boolean arithmetic: exact in any order (an op with a float output or a float ``T``
  is a float op);
- single IEEE-rounded float arithmetic (add, subtract, multiply, divide, sqrt): the same bits
  everywhere, except where XLA rewrites it: it may fuse a multiply into the add that consumes it
  (an FMA; products are seen through views, data movement, ``IdentityN`` and function calls),
  it turns a division by a value it knows when it compiles into a multiplication by its
  reciprocal (and ``A / sqrt(B)``, ``(A / B) / C`` into other roundings), and it folds the
  constants of a chain of adds or of multiplies: those are named for XLA. (Grappler's own
  re-associations are off under the exact tier: ``_fixed.keep_graph_order``.)

Everything else is named with its layer (the name scope it was built in) and the axes it can break
(``Uncovered``): float reductions and products (threads, XLA, replicas; oneDNN for its kernels),
float max/min reductions (signed zeros and NaNs), transcendental functions and reciprocals (oneDNN,
XLA), fused normalisations, stateful and stateless random ops (XLA, replicas), a sum over replicas
(a collective all-reduce, or an ``AddN`` of values from two devices) of anything but the tier's
replica-global values (replicas), a computed float converted to an integer (XLA), and any op type
not in these tables (all four). ``patch(ops="exact")`` raises ``UncoveredOpError`` listing them
all, before the first step; ``on_uncovered="warn"`` warns and trains. Trust comes from the name
scope only, never from a function's name. Not audited: functions that ``tf.data`` traces (they run
outside XLA and oneDNN, element by element), functions loaded from a SavedModel, and ops run
eagerly (a custom loop without ``tf.function``; ``fit`` with ``run_eagerly=True`` is refused by
name).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tfrepro import _targets
from tfrepro._import_hooks import call_after_import
from tfrepro.errors import UncoveredOpError, warn
from tfrepro.ops import _exact_sum
from tfrepro.ops.exact import _fixed

AXES = ("threads", "oneDNN", "XLA", "replicas")
MARK = _fixed.MARK

_ANY_DTYPE_EXACT = frozenset("""
    Const Identity IdentityN Placeholder NoOp Snapshot EnsureShape CheckNumerics CheckNumericsV2
    ReadVariableOp AssignVariableOp VarHandleOp VarIsInitializedOp DestroyResourceOp
    Reshape Shape ShapeN Size Rank StridedSlice StridedSliceGrad ResourceStridedSliceAssign Slice ConcatV2 Concat
    ConcatOffset Pack Unpack Split SplitV Transpose ExpandDims Squeeze Fill ZerosLike OnesLike Tile GatherV2
    Gather GatherNd ResourceGather BroadcastTo BroadcastArgs BroadcastGradientArgs Cast Bitcast Select SelectV2
    Where Range OneHot StopGradient PreventGradient Pad PadV2 MirrorPad Reverse ReverseV2 InvertPermutation
    IteratorGetNext IteratorGetNextAsOptional OptionalFromValue OptionalGetValue OptionalHasValue OptionalNone
    Equal NotEqual Less Greater LessEqual GreaterEqual LogicalAnd LogicalOr LogicalNot ApproximateEqual
    Abs Neg Sign Floor Ceil Round Rint IsFinite IsNan IsInf BitwiseAnd BitwiseOr BitwiseXor Invert LeftShift
    RightShift ArgMax ArgMin All Any Maximum Minimum ClipByValue Relu ReluGrad Relu6 Relu6Grad
    StatelessRandomGetKeyCounter StatelessRandomGetKeyCounterAlg StatelessRandomGetAlg
    Unique Assert AsString StringJoin StringFormat PrintV2 Print
    TensorListReserve TensorListSetItem TensorListGetItem TensorListFromTensor TensorListStack TensorListLength
    TensorListElementShape TensorListPushBack TensorListPopBack TensorListConcatV2 TensorListSplit
    If StatelessIf While StatelessWhile PartitionedCall StatefulPartitionedCall Case StatelessCase RemoteCall
    DisableCopyOnRead SaveV2 RestoreV2 MergeV2Checkpoints ShardedFilename StaticRegexFullMatch RegexFullMatch
""".split())  # (the last line: the functions a SavedModel's saver traces, which move the variables' bytes)
# One IEEE-rounded operation per element: the same bits on every axis, but for XLA's multiply-add fusion.
_ROUNDED_ONCE = frozenset("""
    Add AddV2 Sub Mul MulNoNan RealDiv Div DivNoNan Sqrt Square SquaredDifference BiasAdd AddN
    FloorDiv FloorMod TruncateDiv TruncateMod AssignAddVariableOp AssignSubVariableOp LeakyRelu LeakyReluGrad
""".split())
_ADDS = frozenset("Add AddV2 Sub BiasAdd AddN AssignAddVariableOp AssignSubVariableOp".split())
_SUMS = frozenset("Add AddV2 AddN".split())  # a sum of values from two replicas' devices is a cross-replica sum
_PRODUCTS = frozenset("Mul MulNoNan Square SquaredDifference".split())
_DIVISIONS = frozenset("RealDiv Div DivNoNan".split())
_CHAINS = (frozenset("Add AddV2 Sub".split()), frozenset(["Mul"]))  # XLA folds constants along a chain of one kind
# XLA rewrites A / sqrt(B) as A * rsqrt(B) and A / exp(B) as A * exp(-B), and re-associates divisions of divisions
_DIVISOR_REWRITES = _DIVISIONS | frozenset("Sqrt Exp Pow Rsqrt".split())
_VIEWS = frozenset("Identity Snapshot Reshape ExpandDims Squeeze BroadcastTo Neg StopGradient PreventGradient "
                   "EnsureShape".split())  # XLA looks through them
# Ops that move a product's elements without rounding them: XLA fuses through them too
_MOVES = frozenset("""Transpose Slice StridedSlice Tile GatherV2 Gather GatherNd ResourceGather Reverse ReverseV2
    Pad PadV2 MirrorPad ConcatV2 Concat Pack Unpack Split SplitV Select SelectV2 Roll ReverseSequence SpaceToBatchND
    BatchToSpaceND SpaceToDepth DepthToSpace ExtractImagePatches MatrixBandPart MatrixDiag MatrixDiagPart
    MatrixDiagV2 MatrixDiagV3 MatrixDiagPartV2 MatrixDiagPartV3 MatrixSetDiag MatrixSetDiagV2 MatrixSetDiagV3
    TensorScatterUpdate DynamicStitch ParallelDynamicStitch
    ResizeNearestNeighbor TensorListGetItem TensorListStack TensorListFromTensor TensorListSetItem""".split())
_CALLS = {"PartitionedCall": 0, "StatefulPartitionedCall": 0, "If": 1, "StatelessIf": 1, "Case": 1,
          "StatelessCase": 1, "While": 0, "StatelessWhile": 0}  # op -> the input that is the callee's first argument
_BRANCHES = frozenset("If StatelessIf Case StatelessCase While StatelessWhile".split())  # outputs from callees' results
_STATIC = frozenset("Const Shape ShapeN Size Rank".split())  # values XLA knows when it compiles
_DATA = frozenset("Placeholder IteratorGetNext IteratorGetNextSync OptionalGetValue Const ReadVariableOp".split())
_CROSS_REPLICA = frozenset("CollectiveReduce CollectiveReduceV2 NcclAllReduce".split())
_GATHERS = frozenset("CollectiveGather CollectiveGatherV2 NcclAllGather".split())  # of a sparse gradient's rows
_CARRY = frozenset("Identity Reshape ExpandDims Squeeze ConcatV2 Pack Cast StopGradient".split())
_ACCUMULATING = {
    **dict.fromkeys("""MatMul BatchMatMul BatchMatMulV2 BatchMatMulV3 Einsum Conv1D Conv2D Conv3D
        Conv2DBackpropInput Conv2DBackpropFilter Conv3DBackpropInputV2 Conv3DBackpropFilterV2
        DepthwiseConv2dNative DepthwiseConv2dNativeBackpropInput DepthwiseConv2dNativeBackpropFilter
        FusedBatchNorm FusedBatchNormV2 FusedBatchNormV3 FusedBatchNormGrad FusedBatchNormGradV2
        FusedBatchNormGradV3 _FusedMatMul _FusedConv2D AvgPool AvgPoolGrad MaxPoolGrad MaxPoolGradV2
        MaxPoolGradGrad ResizeBilinearGrad""".split(), AXES),
    **dict.fromkeys("""Sum Mean Prod EuclideanNorm Cumsum Cumprod BiasAddGrad L2Loss SegmentSum UnsortedSegmentSum
        SparseSegmentSum SparseSegmentMean SparseSegmentSqrtN SparseSegmentSumGrad SparseSegmentMeanGrad
        ScatterNd TensorScatterAdd ResourceScatterAdd ResourceScatterSub UnsortedSegmentProd
        SparseSoftmaxCrossEntropyWithLogits SoftmaxCrossEntropyWithLogits Bincount DenseBincount
        MirrorPadGrad Max Min""".split(),
                    ("threads", "XLA", "replicas")),
}
_TRANSCENDENTAL = frozenset("""
    Exp Expm1 Log Log1p Tanh TanhGrad Sigmoid SigmoidGrad Softmax LogSoftmax Erf Erfc Erfinv Pow Sin Cos Tan Asin
    Acos Atan Atan2 Sinh Cosh Asinh Acosh Atanh Rsqrt RsqrtGrad SqrtGrad Elu EluGrad Selu SeluGrad Softplus
    SoftplusGrad Softsign SoftsignGrad Lgamma Digamma Xlogy Xlog1py Xdivy Gelu Swish Reciprocal Inv ReciprocalGrad
    InvGrad
""".split())
_RANDOM = frozenset("""
    RandomUniform RandomUniformInt RandomStandardNormal TruncatedNormal RandomShuffle RandomGamma RandomPoisson
    RandomPoissonV2 Multinomial StatelessRandomUniform StatelessRandomUniformV2 StatelessRandomNormal
    StatelessRandomNormalV2 StatelessTruncatedNormal StatelessTruncatedNormalV2 StatelessRandomUniformInt
    StatelessRandomUniformIntV2 StatelessRandomUniformFullInt StatelessRandomUniformFullIntV2
    StatelessMultinomial StatefulUniform StatefulUniformInt StatefulUniformFullInt StatefulStandardNormalV2
    StatefulTruncatedNormal RngReadAndSkip RngSkip
""".split())
_FLOATS = frozenset(dtype.as_datatype_enum for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64,
                                                          tf.complex64, tf.complex128))
_CALLERS = ("f", "then_branch", "else_branch", "body", "cond", "branches")


@dataclass(frozen=True)
class Uncovered:
    """One op of a traced function that the exact tier does not cover.

    Attributes:
        op: The op's type, e.g. ``"Softmax"``.
        node: Its node's name in the traced function, e.g. ``"sequential/dense_1/Softmax"``.
        layer: The layer it was built in (its name scope), ``"... (gradient)"`` for a gradient op,
            or ``"the step"`` outside any layer.
        axes: The axes of ``AXES`` across which it can give other bits.
        why: The reason, in words.
    """

    op: str
    node: str
    layer: str
    axes: tuple[str, ...]
    why: str

    def __str__(self) -> str:
        return f"{self.op} in {self.layer} (can differ across {', '.join(self.axes)}: {self.why})"


def classify(op: str, dtype: int | None, product_input: bool = False) -> tuple[tuple[str, ...], str] | None:
    """The axes an uncovered op of type ``op`` can break and why, or None when it gives the same bits
    on all four. ``dtype``: the enum of a float output of the op if it has one, else of its
    ``T``/``dtype`` attribute (None: unknown, taken for a float). ``product_input``: a float input
    of an add is a float product (XLA may fuse them)."""
    floating = dtype is None or dtype in _FLOATS
    if op in _ANY_DTYPE_EXACT or op.endswith("Dataset") or "Iterator" in op:  # data in, data out
        return None
    if op in _RANDOM:
        return ("XLA", "replicas"), "random numbers drawn by TF's generators, which XLA and each replica draw their own way"
    if op in _ROUNDED_ONCE:
        if op in _ADDS and floating and product_input:
            return _FMA
        return None
    if not floating:
        return None
    if op in _CROSS_REPLICA:
        return _REPLICA_SUM
    if op in _GATHERS:
        return _SPARSE_GATHER
    if op in _ACCUMULATING:
        return _ACCUMULATING[op], ("a float reduction whose order (and so its rounding, or which of -0 and +0 or of "
                                   "two NaNs survives) the kernel, its threads or the batch split chooses")
    if op in _TRANSCENDENTAL:
        return ("oneDNN", "XLA"), "TF's, oneDNN's and XLA's approximations of this function differ in the last bits"
    return AXES, "not in the exact tier's list of ops proven to give the same bits"


_FMA = (("XLA",), "XLA may fuse the multiply that feeds this add into one FMA, rounded once, not twice")
_REPLICA_SUM = (("replicas",), "each replica's partial value, summed in float by the strategy: one device's sum "
                               "rounds otherwise")
_SPARSE_GATHER = (("replicas",), "a sparse gradient (an Embedding's) gathered across replicas: its sum differs from "
                                 "one device's in the last bit (measured), so sparse weights can differ with the replica "
                                 "count")
_DIVISION = (("XLA",), "XLA turns a division by a value it knows when it compiles into a multiplication by its "
                       "reciprocal (and A / sqrt(B) into A * rsqrt(B), (A / B) / C into A / (B * C)), rounded otherwise")
_FOLDED = (("XLA",), "XLA folds the constants of a chain of float adds or multiplies into one ((a + C1) + C2 into "
                     "a + (C1 + C2)), rounded otherwise")
_TO_INTEGER = (("XLA",), "a computed float converted to an integer: NaN and out-of-range values convert to other "
                         "integers under XLA than in TF")
# What the exact tier computes exactly but whose meaning changes along an axis: an identity of the value,
# built in the scope ``REFUSED_PREFIX + key``, is named as this (``refuse_in_place``).
REFUSED_PREFIX = "tfrepro_refused_"
_REFUSED_IN_PLACE = {
    "unsynchronized_batch_norm": ("BatchNormalization", ("replicas",), (
        "with synchronized=False each replica normalises its share of the batch by that share's own statistics, "
        "another computation than one device's; BatchNormalization(synchronized=True) normalises by the global "
        "batch's, exactly")),
    "moving_statistics_averaged_when_read": ("BatchNormalization", ("replicas",), (
        "Keras 2 keeps a moving statistic per replica and averages the copies in float when it is read (a "
        "checkpoint, get_weights): identical copies average exactly on 2 replicas, not on more")),
}


class _Function:
    """One function's nodes (a traced graph's or a library function's) for the walk, with where it
    is called from (``caller``: the calling function, the call node, and the call input that is the
    function's first argument), so that a value can be traced across calls both ways."""

    def __init__(self, nodes: Iterable[Any], sinks: Iterable[str], library: dict[str, Any], trusted: bool = False,
                 args: tuple[str, ...] = (), caller: tuple[_Function, Any, int] | None = None):
        self.nodes = {node.name: node for node in nodes}
        self.sinks = [_producer(name) for name in sinks]
        self.library, self.trusted, self.args, self.caller = library, trusted, args, caller
        self._callees: dict[str, list[_Function]] = {}

    @classmethod
    def of(cls, definition: Any, library: dict[str, Any], trusted: bool,
           caller: tuple[_Function, Any, int]) -> _Function:
        signature = definition.signature
        function = cls(definition.node_def, [*definition.ret.values(), *definition.control_ret.values()], library,
                       trusted, tuple(arg.name for arg in signature.input_arg), caller)
        function.rets = [definition.ret[arg.name] for arg in signature.output_arg]
        function.name = signature.name
        return function

    def marked(self, node: Any) -> bool:
        return self.trusted or _marked(node.name)

    def callees(self, node: Any) -> list[_Function]:
        """The functions ``node`` calls (a call, a condition's branches, a loop's condition and body)."""
        if node.name not in self._callees:
            offset = _CALLS.get(node.op, 0)
            names = [node.op] if node.op in self.library else _called(node)
            self._callees[node.name] = [_Function.of(self.library[name], self.library, self.marked(node),
                                                     (self, node, offset))
                                        for name in names if name in self.library]
        return self._callees[node.name]

    def live(self) -> Iterator[Any]:
        """The nodes whose results reach the sinks (outputs and state updates), through data inputs."""
        seen: set[str] = set()
        stack = [name for name in self.sinks if name in self.nodes]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            node = self.nodes[name]
            yield node
            stack.extend(p for p in (_producer(i) for i in _data(node)) if p in self.nodes)

    def source(self, edge: str, through: frozenset[str] = _VIEWS) -> tuple[_Function, Any] | None:
        """The node that computes the value on ``edge``, looking through the ops in ``through``,
        ``IdentityN``, function calls and arguments; None for an argument of the outermost function."""
        found = self.source_edge(edge, through)
        return None if found is None else (found[0], found[0].nodes[_producer(found[1])])

    def source_edge(self, edge: str, through: frozenset[str] = _VIEWS,
                    carried: list[tuple[_Function, str]] | None = None) -> tuple[_Function, str] | None:
        """``source``, as the function and the edge of the node's output that carries the value. A
        loop body's argument is its initial value, the loop's input; and from the second pass on its
        own previous result, which is added to ``carried`` where it is given."""
        function = self
        for _ in range(10_000):
            name = _producer(edge)
            node = function.nodes.get(name)
            if node is None:  # an argument: the caller's input
                if function.caller is None or name not in function.args:
                    return None
                caller, call, offset = function.caller
                if carried is not None and call.op in ("While", "StatelessWhile") and \
                        call.attr["body"].func.name == function.name:
                    carried.append((function, function.rets[function.args.index(name)]))
                inputs = _data(call)
                index = function.args.index(name) + offset
                if index >= len(inputs):
                    return None
                function, edge = caller, inputs[index]
            elif node.op in through and node.input:
                edge = node.input[0]
            elif node.op == "IdentityN":  # its outputs are its inputs, one to one
                edge = node.input[_output_index(edge)]
            elif node.op in ("PartitionedCall", "StatefulPartitionedCall") and function.callees(node):
                function = function.callees(node)[0]
                edge = function.rets[_output_index(edge)]
            else:
                return function, edge
        return None

    def carried(self, edge: str) -> list[tuple[_Function, str]]:
        """The edges whose values a condition's or a loop's output ``edge`` can be: each branch's
        result, or the loop body's result and the loop's initial value (XLA inlines a condition
        whose predicate it knows, and a loop it unrolls, and then fuses across them)."""
        node = self.nodes[_producer(edge)]
        index, loop = _output_index(edge), node.op in ("While", "StatelessWhile")
        names = [name for name in _called(node) if name in self.library]  # as ``callees`` makes them
        found = [(callee, callee.rets[index]) for name, callee in zip(names, self.callees(node))
                 if index < len(callee.rets) and not (loop and name == node.attr["cond"].func.name)]
        if loop and index < len(_data(node)):
            found.append((self, _data(node)[index]))
        return found

    def product_input(self, node: Any) -> bool:
        """Whether an input of ``node`` is a float product that is not the exact tier's (its
        products are rounded through a barrier that no compiler fuses)."""
        stack, seen, followed = [(self, edge) for edge in _data(node)], set(), set()
        while stack:
            if len(seen) > 1_000 or len(followed) > 10_000:
                return True  # too far to follow: named, not trusted
            function, edge = stack.pop()
            if (id(function), edge) in followed:  # a loop's value carried round unchanged comes back to itself
                continue
            followed.add((id(function), edge))
            carried: list[tuple[_Function, str]] = []
            found = function.source_edge(edge, carried=carried)
            stack.extend(carried)
            if found is None or (id(found[0]), found[1]) in seen:
                continue
            seen.add((id(found[0]), found[1]))
            function, edge = found
            producer = function.nodes[_producer(edge)]
            if producer.op in _PRODUCTS and not function.marked(producer) and _floating(producer):
                return True
            if producer.op in _MOVES:
                stack.extend((function, edge) for edge in _data(producer))
            elif producer.op in _BRANCHES:
                stack.extend(function.carried(edge))
        return False

    def folded_constants(self, node: Any) -> bool:
        """Whether this add or multiply has a constant operand and its other operand is an op of
        the same kind with a constant operand: XLA folds the two constants into one."""
        family = next((ops for ops in _CHAINS if node.op in ops), None)
        if family is None:
            return False
        constants, others = self._operands(node)
        if not constants or len(others) != 1 or others[0] is None:
            return False
        function, inner = others[0]
        if inner.op not in family or not _floating(inner):
            return False
        inner_constants, others = function._operands(inner)
        if not inner_constants or len(others) != 1:
            return False
        # x * 2**k * C rounds once however it is grouped (unless x * 2**k overflows or is subnormal)
        return node.op != "Mul" or not any(_power_of_two_constant(*found) for found in constants + inner_constants)

    def _operands(self, node: Any) -> tuple[list[Any], list[Any]]:
        """The sources of ``node``'s two operands: (those XLA knows when it compiles, the others)."""
        constants, others = [], []
        for edge in _data(node)[:2]:
            found = self.source(edge)
            (constants if found is not None and found[0].static(found[1]) else others).append(found)
        return constants, others

    def rewritten_division(self, node: Any) -> bool:
        """Whether XLA may rewrite this float division into other roundings (``_DIVISION``)."""
        numerator, divisor = (self.source(edge) for edge in _data(node)[:2])
        if numerator is not None and numerator[1].op in _DIVISIONS:
            return True
        if divisor is None:
            return False  # a value XLA does not know when it compiles
        function, producer = divisor
        if producer.op in _DIVISOR_REWRITES:
            return True
        if producer.op == "Const":
            return not _powers_of_two(producer)
        return function.static(producer)

    def static(self, node: Any) -> bool:
        """Whether ``node``'s value is known when XLA compiles (computed from constants and shapes)."""
        stack, seen = [(self, node)], set()
        while stack:
            function, node = stack.pop()
            if (id(function), node.name) in seen:
                continue
            seen.add((id(function), node.name))
            if node.op in _STATIC:
                continue
            if node.op in _DATA or node.op in _RANDOM or node.op in _CALLS or "Variable" in node.op or len(seen) > 200:
                return False
            for edge in _data(node):
                found = function.source(edge, frozenset())
                if found is None:
                    return False
                stack.append(found)
        return True

    def computed(self, edge: str) -> bool:
        """Whether the float on ``edge`` is computed in the step (not data, a constant, a weight, or
        an integer converted: labels cast to float and back)."""
        found = self.source(edge)
        if found is not None and found[1].op == "Cast" and found[1].attr["SrcT"].type not in _FLOATS:
            return False
        return found is not None and found[1].op not in _DATA

    def spans_replicas(self, node: Any) -> bool:
        """Whether ``node`` adds values computed on different devices (a strategy's sum over replicas)."""
        devices = set()
        for edge in _data(node):
            producer = self.nodes.get(_producer(edge))
            while producer is not None and not producer.device and producer.op in _CARRY and producer.input:
                producer = self.nodes.get(_producer(producer.input[0]))
            if producer is not None and producer.device:
                spec = tf.DeviceSpec.from_string(producer.device)
                devices.add((spec.job or "localhost", spec.replica or 0, spec.task or 0, (spec.device_type or "").upper(),
                             spec.device_index or 0))
        return len(devices) > 1

    def replica_global(self, node: Any) -> bool:
        """Whether every float value that ``node`` sums over the replicas is a replica-global one
        of the exact tier (carried to it unchanged): whole on the first replica, zero elsewhere."""
        summed = _data(node)[:1] if node.op in _CROSS_REPLICA else _data(node)  # not a collective's keys
        stack, seen = list(summed), set()
        while stack:
            edge = stack.pop()
            producer = self.nodes.get(_producer(edge))
            if producer is None:
                return False
            if producer.op == "IdentityN":  # follow the one input used
                stack.append(producer.input[_output_index(edge)])
                continue
            if producer.name in seen:
                continue
            seen.add(producer.name)
            if any(part.startswith(_fixed.REPLICA_GLOBAL) for part in producer.name.split("/")):
                continue
            if producer.op == "Const" or not _floating(producer):
                continue  # an axis, a shape, a key
            if producer.op not in _CARRY:
                return False
            stack.extend(_data(producer))
        return True


def _data(node: Any) -> list[str]:
    return [name for name in node.input if not name.startswith("^")]


def _output_index(edge: str) -> int:
    """The output index an input edge reads: ``node:2`` in a graph, ``node:output:2`` in a function."""
    last = edge.split(":")[-1]
    return int(last) if ":" in edge and last.isdigit() else 0


def _producer(name: str) -> str:
    return name.lstrip("^").split(":")[0]


def _dtype(node: Any) -> int | None:
    for key in ("T", "dtype", "Tparams", "SrcT"):
        if key in node.attr and node.attr[key].type:
            return node.attr[key].type
    return None


def _output_types(node: Any) -> list[int] | None:
    """The dtypes of ``node``'s outputs, from its op's definition (None where it cannot tell)."""
    get = _op_definitions()
    definition = get(node.op) if get is not None else None
    if definition is None:
        return None
    types: list[int] = []
    for arg in definition.output_arg:
        if arg.type:
            types.append(arg.type)
        elif arg.type_attr:
            if arg.type_attr not in node.attr:
                return None
            types.append(node.attr[arg.type_attr].type)
        elif arg.type_list_attr in node.attr:
            types += list(node.attr[arg.type_list_attr].list.type)
    return types


def _float_dtype(node: Any) -> int | None:
    """A float dtype among ``node``'s outputs and its ``T``, else its ``T`` (None: unknown)."""
    dtype, outputs = _dtype(node), _output_types(node)
    if outputs is None:
        return dtype
    return next((t for t in (*outputs, dtype) if t in _FLOATS), dtype if dtype is not None else
                next(iter(outputs), None))


def _floating(node: Any) -> bool:
    dtype = _float_dtype(node)
    return dtype is None or dtype in _FLOATS


def _op_definitions() -> Callable[[str], Any] | None:
    from tensorflow.python.framework import op_def_registry  # an op's OpDef: no public equivalent

    return _targets.find(op_def_registry, "tf:op_defs")


def _power_of_two_constant(function: _Function, node: Any) -> bool:
    """Whether ``node`` is a constant, or a constant cast, whose every value is a power of two (or 0)."""
    found = function.source(node.name + ":0", _VIEWS | {"Cast"}) if node.op == "Cast" else (function, node)
    return found is not None and found[1].op == "Const" and _powers_of_two(found[1])


def _powers_of_two(node: Any) -> bool:
    """Whether every value of a float constant has an exact reciprocal (a power of two, or 0, inf, NaN)."""
    import numpy as np

    values = tf.make_ndarray(node.attr["value"].tensor).astype(np.float64)
    mantissas = np.abs(np.frexp(values)[0])
    return bool(np.all((mantissas == 0.5) | ~np.isfinite(values) | (values == 0)))


def _marked(name: str) -> bool:
    """Whether ``name`` is an op the exact tier built (in a gradient, TF's own gradient of one is not)."""
    depth = _exact_sum.gradient_depth(name)
    if depth:
        mark = _exact_sum.backward_mark(depth)
        return any(part == mark or part.startswith(mark + "_") for part in name.split("/"))
    return any(_fixed.marked_scope(part) for part in name.split("/"))


def _refused_in_place(name: str) -> tuple[str, tuple[str, ...], str] | None:
    for part in name.split("/"):
        if part.startswith(REFUSED_PREFIX):
            return next((found for key, found in _REFUSED_IN_PLACE.items()
                         if part[len(REFUSED_PREFIX):].startswith(key)), None)
    return None


def refuse_in_place(x: tf.Tensor, key: str) -> tf.Tensor:
    """``x`` through an identity that the audit names as ``_REFUSED_IN_PLACE[key]`` says, in the
    layer that builds it: for a value the tier computes exactly that still differs on an axis."""
    if key not in _REFUSED_IN_PLACE:
        raise KeyError(key)
    with _fixed.unmarked(), tf.name_scope(REFUSED_PREFIX + key):
        return tf.identity(x)


def _layer(name: str) -> str:
    parts = [part for part in name.split("/")[:-1] if not _fixed.marked_scope(part) and
             not part.startswith(REFUSED_PREFIX)]
    gradient = bool(parts) and _exact_sum.gradient_depth(parts[0]) > 0
    parts = parts[1:-1] if gradient else parts  # a gradient op's scope is its forward op's name
    scope = "/".join(parts) or "the step"
    return f"{scope} (gradient)" if gradient else scope


def _called(node: Any) -> list[str]:
    names = []
    for key in _CALLERS:
        if key in node.attr:
            value = node.attr[key]
            names += [value.func.name] if value.func.name else [f.name for f in value.list.func]
    return names


def _verdict(function: _Function, node: Any) -> tuple[tuple[str, ...], str] | None:
    """``classify``, with what the op's neighbours say: a sum across replicas' devices, an add of a
    product, a division XLA rewrites, a computed float turned integer. The exact tier's own ops
    pass, but for an add of a product that is not the tier's (XLA would fuse across the border)."""
    op, floating = node.op, _floating(node)
    if function.marked(node):
        return _FMA if op in _ADDS and floating and function.product_input(node) else None
    if op in _CROSS_REPLICA or (op in _SUMS and floating and function.spans_replicas(node)):
        return None if function.replica_global(node) else _REPLICA_SUM
    if op in _DIVISIONS and floating and function.rewritten_division(node):
        return _DIVISION
    if floating and function.folded_constants(node):
        return _FOLDED
    if op == "Cast" and node.attr["SrcT"].type in _FLOATS and node.attr["DstT"].type not in _FLOATS and \
            function.computed(node.input[0]):
        return _TO_INTEGER
    return classify(op, _float_dtype(node), op in _ADDS and floating and function.product_input(node))


def audit(graph_def: Any, outputs: Iterable[str]) -> list[Uncovered]:
    """The uncovered ops of a traced function: ``graph_def`` (its ``GraphDef``, library included)
    and ``outputs``, the names of its output tensors and of its state-changing ops. Ops whose
    results reach neither are not audited (a softmax computed for a prediction the step never
    uses changes no bit of what it returns or updates). Every function it calls is walked once per
    call site, inheriting the call's trust: a function called by one of the exact tier's ops is
    the tier's."""
    library = {f.signature.name: f for f in graph_def.library.function}
    found: dict[tuple[str, str], Uncovered] = {}

    def walk(function: _Function) -> None:
        for node in function.live():
            for callee in function.callees(node):
                walk(callee)
            refused = _refused_in_place(node.name)
            op, verdict = (refused[0], refused[1:]) if refused else (node.op, _verdict(function, node))
            if verdict is not None:
                layer = _layer(node.name)
                found.setdefault((op, layer), Uncovered(op, node.name, layer, *verdict))

    walk(_Function(graph_def.node, outputs, library))
    return sorted(found.values(), key=lambda u: (u.layer, u.op))


def audit_graph(graph: Any) -> list[Uncovered]:
    """``audit`` of a traced ``FuncGraph`` (``tf.function(...).get_concrete_function().graph``)."""
    outputs = [t.name for t in graph.outputs] + [op.name for op in getattr(graph, "control_outputs", [])]
    return audit(graph.as_graph_def(), outputs)


class _Auditor:
    """Audits every function traced while the exact tier is active (``install``)."""

    def __init__(self) -> None:
        self.policy = "raise"
        self.local = threading.local()
        self.audited = 0
        self.uncovered: dict[tuple[str, str], Uncovered] = {}

    def tracing(self, trace: Callable[..., Any]) -> Callable[..., Any]:
        def traced(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self.local, "depth", 0)
            self.local.depth = depth + 1
            try:
                graph = trace(*args, **kwargs)
            finally:
                self.local.depth = depth
            if depth == 0 and _active[0] and not getattr(self.local, "data", False) and not \
                    graph.name.startswith(_fixed.BACKWARD_OF_KERNEL):  # TF's gradient of a kernel: never run
                self.check(graph)
            return graph

        traced._tfrepro_audits = True  # type: ignore[attr-defined]
        return traced

    def check(self, graph: Any) -> None:
        found = audit_graph(graph)
        self.audited += 1
        if not found:
            return
        for item in found:
            self.uncovered.setdefault((item.op, item.layer), item)
        shown = "\n  - ".join(str(item) for item in found[:25])
        more = f"\n  ... and {len(found) - 25} more" if len(found) > 25 else ""
        message = (f"tfrepro exact tier: {len(found)} op(s) of the traced function {graph.name!r} are not covered, so "
                   f"its bits can differ across threads, oneDNN, XLA or replicas:\n  - {shown}{more}")
        if self.policy == "raise":
            raise UncoveredOpError(message + "\nReplace or remove them, or pass patch(ops='exact', on_uncovered='warn') "
                                   "(the CLI's --on-uncovered warn) to train with them named (patch(ops='auto') is "
                                   "deterministic on one machine).", found)
        warn(message + "\n(on_uncovered='warn': training goes on; these ops can make runs on the axes named differ)")


_AUDITOR = _Auditor()
_active = [False]


def set_policy(policy: str) -> None:
    """What the audit does with what it names: ``"raise"`` ``UncoveredOpError`` or ``"warn"``
    (``patch`` has checked it is one of ``tfrepro.ops.selection.ON_UNCOVERED``)."""
    _AUDITOR.policy = policy


def install() -> Callable[[], None]:
    """Audit every function traced from now on (TF is loaded), with a fresh record; returns the undo."""
    _active[0] = True
    _AUDITOR.audited, _AUDITOR.uncovered = 0, {}

    def hook_tracing(module: Any) -> None:
        if _targets.find(module, "tf:trace") is not None and not getattr(module.func_graph_from_py_func,
                                                                          "_tfrepro_audits", False):
            module.func_graph_from_py_func = _AUDITOR.tracing(module.func_graph_from_py_func)

    def hook_data(module: Any) -> None:
        wrapper = _targets.find(module, "tf:dataset_functions")
        if wrapper is None or getattr(wrapper, "_tfrepro_data", False):
            return
        cls = module.StructuredFunctionWrapper

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            before = getattr(_AUDITOR.local, "data", False)
            _AUDITOR.local.data = True
            try:
                wrapper(self, *args, **kwargs)
            finally:
                _AUDITOR.local.data = before

        init._tfrepro_data = True  # type: ignore[attr-defined]
        cls.__init__ = init

    call_after_import({_targets.target("tf:trace").module: hook_tracing,
                       _targets.target("tf:dataset_functions").module: hook_data})

    def undo() -> None:
        _active[0] = False

    return undo


def check_fit(model: Any) -> None:
    """As ``fit`` begins: a model that runs its step eagerly (``run_eagerly=True``) traces nothing
    for the audit to see, so it is refused (or warned about, under ``on_uncovered="warn"``)."""
    if not getattr(model, "run_eagerly", False):
        return
    message = ("tfrepro exact tier: fit(run_eagerly=True) runs the step's ops eagerly, where the audit of traced "
               "steps cannot check them; compile without run_eagerly")
    if _AUDITOR.policy == "raise":
        raise UncoveredOpError(message + ", or pass patch(ops='exact', on_uncovered='warn') (the CLI's "
                               "--on-uncovered warn) to go on unaudited.", [])
    warn(message + " (on_uncovered='warn': training goes on, unaudited)")


def findings() -> tuple[int, list[Uncovered]]:
    """How many traced functions the audit has checked in this process, and what it named."""
    return _AUDITOR.audited, list(_AUDITOR.uncovered.values())


def covered(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (an exact-tier op) building its ops under the ``MARK`` name scope, so that the
    audit knows them for the exact tier's own (where it falls back to TF's kernel, a dtype it does
    not cover, it steps out of the scope: ``_fixed.unmarked``)."""
    import functools

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _fixed.marking():
            return function(*args, **kwargs)

    return call
