"""The static risk scan: no GPU needed, nothing run.

The model's own train step (``model.train_step``: forward, loss, gradients, optimizer update;
overridden steps included) is traced to a graph with every layer's calls marked
(``layer_calls``), every op in it and its nested functions is matched against the kernel table
(``tfrepro.ops.kernel_facts``) for the TensorFlow version given, and each match is named by its
layer. Then the layers (batch norm fine-tuning), the configuration (op determinism, the cuDNN
autotuner, XLA, mixed precision, the hash seed) and the input pipeline (``pipelines``) are checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from tfrepro import _tf
from tfrepro.determinism import reporting, state
from tfrepro.diagnosis import graph_walk, pipelines
from tfrepro.diagnosis.batches import Batch
from tfrepro.diagnosis.findings import Finding
from tfrepro.diagnosis.layer_calls import LayerCalls
from tfrepro.ops import kernel_facts
from tfrepro.ops.selection import REPLACEABLE_OPS

# tfrepro.ops open a name scope "Deterministic<OpName>" (e.g. DeterministicBincount) around their ops.
_REPLACED = {"Deterministic" + "".join(part.capitalize() for part in name.split("_")): name
             for name in (*REPLACEABLE_OPS, "reduce_sum")}
_SCOPE_SUFFIX = re.compile(r"_\d+$")
# The TensorFlow releases whose notes and kernels the table in tfrepro.ops.kernel_facts was checked against
# (its spans open at 2.0); a version beyond the newest is accepted when it is the one installed.
TABLE_VERSIONS = ((2, 0), (2, 21))
# Ops that run arbitrary Python (tf.numpy_function, tf.py_function, tf.compat.v1.py_func).
PYTHON_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}


def check_tf_version(tf_version: str) -> kernel_facts.Version:
    """``tf_version`` parsed, or ``ValueError`` naming the range for one the table does not cover."""
    version = kernel_facts.resolve_version(tf_version)
    low, high = TABLE_VERSIONS
    high = max(high, _tf.parse_version(_tf.installed_tf_version()) or high)
    if not low <= version <= high:
        raise ValueError(f"TF {version[0]}.{version[1]} is outside the versions the kernel table covers "
                         f"(TF {low[0]}.{low[1]}-{high[0]}.{high[1]}); give a version in that range")
    return version


def trace_train_step(model: Any, batch: Batch, spy: LayerCalls) -> tuple[Any, list[Any]]:
    """The model's train step traced (not run) on ``batch`` as ``fit`` hands it over, its layers'
    calls recorded: the graph's ``GraphDef`` and every variable the step reads or writes. Tracing
    creates what the first ``fit`` step creates (weights of an unbuilt model, optimizer slots, metric
    variables), with the values ``fit`` gives them."""
    tf = _tf.import_tf()
    with spy.recording():
        step = tf.function(model.train_step)
        concrete = step.get_concrete_function(batch.data())
    return concrete.graph.as_graph_def(), list(concrete.graph.variables)


def xla_compiled(model: Any) -> bool:
    """Whether ``fit`` compiles this model's step with XLA."""
    return getattr(model, "jit_compile", None) is True or getattr(model, "_jit_compile", None) is True


def _where(node: graph_walk.Node, spy: LayerCalls) -> str:
    layer = spy.layer_of(node.name)
    if layer is not None:
        return layer.path
    if node.function:
        return f"function {node.function}"
    scope = node.name.split("/")
    scope = scope[1:] if scope[0] == "gradient_tape" else scope
    return f"train step ({scope[0]})" if len(scope) > 1 else "train step"


def _replaced_op(node: graph_walk.Node) -> str | None:
    """The tfrepro op a node belongs to (its outermost ``Deterministic<Op>`` scope), or None."""
    for token in node.name.split("/"):
        name = _REPLACED.get(_SCOPE_SUFFIX.sub("", token))
        if name is not None:
            return name
    return None


def _in_tfrepro_kernel(node: graph_walk.Node) -> bool:
    return any(graph_walk.python_name(function).startswith("tfrepro_") for function in node.functions)


def op_findings(nodes: Iterable[graph_walk.Node], spy: LayerCalls, tf_version: str | None) -> list[Finding]:
    """The traced step's ops that the kernel table lists for ``tf_version``, and the ops tfrepro
    replaced, one finding per (layer, op), in model order. Ops inside tfrepro's replacements are
    theirs (they run only deterministic kernels on every device) and are not matched."""
    version = kernel_facts.resolve_version(tf_version)
    found: dict[tuple[str, str], Finding] = {}
    handled: dict[str, dict[str, Finding]] = {}
    for node in nodes:
        where = _where(node, spy)
        replaced = _replaced_op(node)
        if replaced is not None:
            covers = [f for f in kernel_facts.FACTS if f.replacement == replaced and f.behaviour(version)]
            why = (f"{covers[0].api} {covers[0].behaviour(version)} on a GPU in TF {version[0]}.{version[1]}; "
                   if covers else "")
            handled.setdefault(replaced, {}).setdefault(where, Finding(
                "handled", where, f"{why}tfrepro.ops.{replaced} runs instead (order-invariant)", "", "ops",
                {"op": replaced}))
            continue
        if _in_tfrepro_kernel(node):
            continue
        if node.op in PYTHON_OPS:
            found.setdefault((where, "python"), Finding(
                "risk", where, f"runs Python ({node.op}: tf.numpy_function or tf.py_function): op determinism does "
                "not cover arbitrary Python, so only the Python itself decides whether it gives the same result "
                "each run", "make the Python deterministic (seed its generators, no OS entropy, no thread-order "
                "effects) or replace it with TensorFlow ops", "ops", {"op": node.op}))
            continue
        hit = kernel_facts.match(node.op, node.attrs, tf_version=version, xla=node.xla)
        if hit is None or (where, hit[0].key) in found:
            continue
        fact, behaviour = hit
        if fact.replacement in state.active_ops() and state.active_summation() == "tf" and not node.xla:
            found[(where, fact.key)] = Finding(  # ops="auto" without a GPU runs TF's own (deterministic) kernel
                "handled", where, f"{fact.api} ({node.op}) {behaviour} on a GPU in TF {version[0]}.{version[1]}; "
                f"patch()'s ops='auto' runs tfrepro.ops.{fact.replacement} there (on a CPU, TF's own kernel where it has a "
                "gradient)", "", "ops",
                {"op": fact.replacement, "fact": fact.key})
            continue
        verb = "has no deterministic GPU kernel" if behaviour == "raises" else \
            "runs an order-dependent GPU kernel even under op determinism"
        found[(where, fact.key)] = Finding(
            "raises on GPU" if behaviour == "raises" else "nondeterministic on GPU", where,
            f"{fact.api} ({node.op}) {verb} in TF {version[0]}.{version[1]}"
            + (": UnimplementedError under op determinism" if behaviour == "raises" else ""),
            fact.fix, "ops", {"op": node.op, "fact": fact.key, "source": fact.source, "history": fact.history()})
    result = list(found.values())
    for places in handled.values():  # a replaced op's gradient outside its layer is the same replacement
        in_layers = [f for where, f in places.items() if not where.startswith(("train step", "function "))]
        result += in_layers or list(places.values())[:1]
    return sorted(result, key=lambda f: _model_order(f.where, spy))


def _model_order(where: str, spy: LayerCalls) -> int:
    return next((layer.number for layer in spy.layers if layer.path == where), len(spy.layers))


def layer_findings(spy: LayerCalls, op_found: list[Finding]) -> list[Finding]:
    """Layers whose risk depends on the Keras version: batch norm fine-tuning (a trainable
    BatchNormalization called with ``training=False``) and nearest ``UpSampling2D``. Where the op scan
    found their raising op this adds nothing; elsewhere it says why there is no risk."""
    flagged = {(f.where, f.details.get("fact")) for f in op_found}
    found: dict[str, Finding] = {}
    for call in spy.calls:
        layer = call.layer
        if layer.kind == "UpSampling2D" and getattr(layer.obj, "interpolation", "") == "nearest" and \
                (layer.path, "resize_nearest_backprop") not in flagged and _tf.keras_major(_tf.keras_module()) >= 3:
            found[layer.path] = Finding(
                "note", layer.path, "nearest-neighbour upsampling: Keras 3 repeats pixels (deterministic GPU kernels) "
                "and never reaches tf.image.resize's nearest backprop, which raises on a GPU (Keras 2's "
                "UpSampling2D and Resizing(interpolation='nearest') reach it)", "", "layers")
        if "BatchNormalization" not in layer.kind or not getattr(layer.obj, "trainable", False) \
                or call.training is not False or not layer.obj.trainable_weights \
                or (layer.path, "fused_batch_norm_backprop_inference") in flagged:
            continue
        found[layer.path] = Finding(
            "note", layer.path, "batch norm fine-tuning (trainable, called with training=False): this Keras "
            "computes it with unfused ops, whose GPU kernels are deterministic; its moving statistics stay "
            "frozen while gamma and beta train", "", "layers")
    return list(found.values())


def config_findings(model: Any) -> list[Finding]:
    """The settings that make runs differ, read as ``tfrepro.status()`` reads them, plus the model's
    compile options (XLA, mixed precision)."""
    report = reporting.status()
    found = []
    determinism = report["op determinism"]
    if determinism.ok is False:
        found.append(Finding("risk", "configuration", f"op determinism is {determinism.value}: GPU kernels may "
                             "sum in thread-arrival order and unseeded random ops draw new seeds each run",
                             "tfrepro.patch(seed) before building the model, or `tfrepro run -- python train.py`",
                             "configuration"))
    if _tf.env_flag("TF_CUDNN_USE_AUTOTUNE") == "off":
        found.append(Finding("risk", "configuration", "TF_CUDNN_USE_AUTOTUNE=0: deterministic mode selects its "
                             "deterministic cuDNN algorithms through the autotuner", "unset TF_CUDNN_USE_AUTOTUNE",
                             "configuration"))
    if report["PYTHONHASHSEED"].ok is False:
        found.append(Finding("note", "configuration", f"PYTHONHASHSEED {report['PYTHONHASHSEED'].value}: code that "
                             "iterates over sets of strings may order them differently in each run",
                             "`tfrepro run` (or set PYTHONHASHSEED before Python starts)", "configuration"))
    if xla_compiled(model):
        found.append(Finding("note", "configuration", "the train step is compiled with XLA (jit_compile=True): "
                             "XLA's GPU kernels are matched against the table as such (max-pool backprop raises "
                             "from TF 2.16), and tfrepro.ops run no input checks under XLA",
                             "compile(jit_compile=False) if an XLA kernel raises", "configuration"))
    policy = _policy_name(model)
    if policy is not None and policy not in ("float32", "float64"):
        found.append(Finding("note", "configuration", f"mixed precision ({policy}): deterministic under op "
                             "determinism, but float16 results differ more between GPU models than float32's",
                             "", "configuration"))
    return found


def distributed(model: Any) -> bool:
    """Whether the model lives under a ``tf.distribute`` strategy other than the default one."""
    tf = _tf.import_tf()
    strategy = getattr(model, "distribute_strategy", None)
    return strategy is not None and strategy is not tf.distribute.get_strategy() or tf.distribute.has_strategy()


def _policy_name(model: Any) -> str | None:
    policy = getattr(model, "dtype_policy", None) or getattr(model, "_dtype_policy", None)
    return getattr(policy, "name", None)


def scan(model: Any, batch: Batch, spy: LayerCalls, tf_version: str | None = None) -> tuple[list[Finding], list[Any]]:
    """The static findings (ops, layers, configuration, pipeline) for ``model`` on ``batch``, and every
    variable its train step reads or writes."""
    graph, variables = trace_train_step(model, batch, spy)
    found = op_findings(graph_walk.walk(graph, xla=xla_compiled(model)), spy, tf_version)
    found += layer_findings(spy, found)
    found += config_findings(model)
    if batch.dataset is not None:
        found += pipelines.pipeline_findings(batch.dataset, distributed=distributed(model), graph=batch.dataset_graph)
    return found, variables
