"""Input-pipeline risks, read from a ``tf.data.Dataset``'s graph (nested datasets included): parallel
maps and interleaves whose functions hold stateful random ops (Keras 3's random layers included: their
seed lives in a variable), ``deterministic=False`` (on a transformation or in the options), unseeded
shuffles, random ops and ``Dataset.random`` (behind ``sample_from_datasets``, also under a
distribution strategy).

Under op determinism TensorFlow forces ``deterministic=True`` and runs a parallel map with stateful
random ops serially: deterministic, but slow (TF #62100, #39992); without it, such a map hands its
random numbers to elements in thread order, and each run augments differently.
"""

from __future__ import annotations

from typing import Any

from tfrepro import _tf
from tfrepro.diagnosis import graph_walk
from tfrepro.diagnosis.findings import Finding

_PARALLEL = {"ParallelMapDataset", "ParallelMapDatasetV2", "MapAndBatchDataset", "ExperimentalMapAndBatchDataset",
             "ParallelInterleaveDataset", "ParallelInterleaveDatasetV2", "ParallelInterleaveDatasetV3",
             "ParallelInterleaveDatasetV4", "ParallelFilterDataset", "LegacyParallelInterleaveDatasetV2"}
_SHUFFLES = {"ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
             "ShuffleAndRepeatDatasetV2"}
_RANDOM_SOURCES = {"RandomDataset", "RandomDatasetV2", "ExperimentalRandomDataset"}
# Random ops whose stream lives in the kernel or in a generator: the order of calls decides who gets what.
STATEFUL_RANDOM = {"RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal", "RandomShuffle",
                   "RandomGamma", "RandomPoisson", "RandomPoissonV2", "Multinomial", "RandomCrop",
                   "ParameterizedTruncatedNormal", "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2",
                   "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt", "StatefulStandardNormal",
                   "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulRandomBinomial", "RngReadAndSkip",
                   "RngSkip"}
_STATELESS_FIX = ("tfrepro.data.map_with_seed(ds, fn): fn(*element, seed) gets a per-element stateless seed (fixed "
                  "by the seed, the position and the epoch) and runs in parallel; draw with "
                  "tf.image.stateless_random_* / tf.random.stateless_* or tfrepro.data's batch augmentations")


def dataset_graph(dataset: Any) -> Any:
    """The dataset's ``GraphDef`` (functions included; external state such as generators ignored)."""
    tf = _tf.import_tf()
    # `_variant_tensor` has no public name; DatasetToGraphV2 is what tf.data's own checkpointing uses.
    serialized = tf.raw_ops.DatasetToGraphV2(input_dataset=dataset._variant_tensor, external_state_policy=1,
                                             strip_device_assignment=True)
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(serialized.numpy())
    return graph


# Transformations that draw their seeds from a seed generator resource, which each new iterator advances
# (reshuffle_each_iteration, rerandomize_each_iteration); input 4 or 2 is that resource.
_SEEDED_BY_GENERATOR = {"ShuffleDatasetV3": 4, "ShuffleAndRepeatDatasetV2": 5, "RandomDatasetV2": 2}
# Ops that change state outside the dataset when an element is read.
_EXTERNAL_STATE = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "RngReadAndSkip", "RngSkip",
                   "ResourceScatterAdd", "ResourceScatterUpdate"} | \
    {op for op in STATEFUL_RANDOM if op.startswith("Stateful")}


def detached_copy(dataset: Any) -> tuple[Any, Any, list[Finding]]:
    """A copy of ``dataset`` whose first element is what a fresh iteration of ``dataset`` gives first,
    and reading which leaves ``dataset``'s own seed generators (reshuffle and ``Dataset.random``
    counters) where they were: its graph, with each seed generator replaced by a new one from the same
    seeds. Returns the copy (or ``dataset`` itself where no copy can be made), the graph (or None)
    and findings saying what reading it still changes for the training that follows."""
    tf = _tf.import_tf()
    try:
        graph = dataset_graph(dataset)
    except (tf.errors.OpError, ValueError, AttributeError) as exc:
        return dataset, None, [_moved(dataset, f"its graph cannot be copied ({str(exc).splitlines()[0][:200]})")]
    copy = tf.compat.v1.GraphDef()
    copy.CopyFrom(graph)
    nodes = {node.name: node for node in copy.node}
    for node in copy.node:
        position = _SEEDED_BY_GENERATOR.get(node.op)
        if position is not None and position < len(node.input):
            source = nodes.get(node.input[position].split(":")[0].lstrip("^"))
            if source is not None and source.op == "Const":
                source.op = "DummySeedGenerator"  # the op that makes the transformation own a new generator
                source.attr.clear()
    try:
        variant = tf.raw_ops.DatasetFromGraph(graph_def=copy.SerializeToString())
        reader = tf.data.experimental.from_variant(variant, dataset.element_spec)
    except (tf.errors.OpError, ValueError, TypeError) as exc:
        return dataset, graph, [_moved(dataset, f"its graph cannot be read back ({str(exc).splitlines()[0][:200]})")]
    external = sorted({n.op for n in graph_walk.walk(graph) if n.op in _EXTERNAL_STATE})
    if not external:
        return reader, graph, []
    return reader, graph, [Finding(
        "note", "input pipeline", f"reading its first batch ran ops that change state outside the dataset "
        f"({', '.join(external)}: a generator or a variable that its functions use), and TensorFlow gives "
        "no way to find that state from the dataset: unless the model holds it, the training that follows in "
        "this process starts from where the diagnosis left it", "diagnose a copy of the pipeline built the same "
        "way, or build the pipeline again after the diagnosis", "pipeline", {"ops": external})]


def _moved(dataset: Any, why: str) -> Finding:
    return Finding("note", "input pipeline", f"{why}, so its first batch was read from the dataset itself: its "
                   "reshuffle and Dataset.random counters, if it has any, have moved on by one iteration, and the "
                   "training that follows in this process shuffles and draws as it would have one epoch later",
                   "diagnose a copy of the pipeline built the same way, or build the pipeline again after the "
                   "diagnosis", "pipeline")


def _constants(graph: Any) -> dict[str, Any]:
    """The integer constants of the dataset's graph (seeds, buffer sizes), by node name."""
    tf = _tf.import_tf()
    integers = (tf.int32.as_datatype_enum, tf.int64.as_datatype_enum)
    return {node.name: tf.make_ndarray(node.attr["value"].tensor) for node in graph.node
            if node.op == "Const" and node.attr["dtype"].type in integers}


def _const(constants: dict[str, Any], name: str) -> Any:
    return constants.get(name.split(":")[0].lstrip("^"))


def _label(node: graph_walk.Node) -> str:
    """``map(augment)``, ``interleave(load)``, ``shuffle``...: the transformation and its function."""
    kind = ("sample_from_datasets" if "DirectedInterleave" in node.op else "interleave" if "Interleave" in node.op
            else "filter" if "Filter" in node.op else "shuffle" if "Shuffle" in node.op else "map")
    function = node.attrs.get("f")
    return f"{kind}({graph_walk.python_name(function)})" if function else kind


def _owner(node: graph_walk.Node, datasets: list[graph_walk.Node]) -> graph_walk.Node | None:
    """The innermost dataset transformation whose function holds ``node`` (by the scoped name)."""
    owners = [d for d in datasets if node.name.startswith(d.name + "/")]
    return max(owners, key=lambda d: len(d.name)) if owners else None


def _random_kinds(ops: list[graph_walk.Node]) -> list[str]:
    """The stateful random ops among ``ops``, and "a seed variable" for stateless random ops whose seed
    lives in a variable the function updates (a Keras 3 SeedGenerator: Keras 3's random layers)."""
    kinds = {n.op for n in ops if n.op in STATEFUL_RANDOM}
    if any(n.op.startswith("StatelessRandom") for n in ops) and \
            any(n.op in ("AssignVariableOp", "AssignAddVariableOp") for n in ops):
        kinds.add("a seed variable (Keras SeedGenerator)")
    return sorted(kinds)


def pipeline_findings(dataset: Any, *, distributed: bool = False, graph: Any = None) -> list[Finding]:
    """The input-pipeline risks of ``dataset`` (see the module doc), one finding per transformation,
    nested datasets (inside ``interleave`` or ``flat_map`` functions) included; ``graph``: its
    ``dataset_graph`` if already read."""
    tf = _tf.import_tf()
    determinism = bool(_tf.op_determinism_enabled())
    try:
        graph = dataset_graph(dataset) if graph is None else graph
    except (tf.errors.OpError, ValueError, AttributeError) as exc:
        return [Finding("note", "input pipeline", f"could not read the dataset's graph ({exc}); not checked",
                        check="pipeline")]
    nodes = list(graph_walk.walk(graph))
    constants = _constants(graph)
    datasets = [n for n in nodes if n.op.endswith("Dataset") or "DatasetV" in n.op]
    held: dict[str, list[graph_walk.Node]] = {}
    for node in nodes:
        owner = _owner(node, datasets)
        if owner is not None:
            held.setdefault(owner.name, []).append(node)
    found: list[Finding] = []
    for node in datasets:
        inside = held.get(node.name, [])
        random_ops = _random_kinds(inside)
        where = f"input pipeline: {_label(node)}"
        if node.op in _PARALLEL and random_ops:
            stateful = f"runs in parallel with stateful random ops ({', '.join(random_ops)}):"
            if determinism:
                found.append(Finding("note", where, f"{stateful} under op determinism TensorFlow runs it serially "
                                     "(deterministic, but slow: TF #62100)", _STATELESS_FIX, "pipeline",
                                     {"ops": random_ops}))
            else:
                found.append(Finding("risk", where, f"{stateful} random numbers go to elements in thread order, so "
                                     "each run augments "
                                     "differently", _STATELESS_FIX + "; or tfrepro.patch()", "pipeline",
                                     {"ops": random_ops}))
        if node.attrs.get("deterministic") == "false":
            found.append(_nondeterministic_order(where, determinism, "deterministic=False"))
        unseeded = sorted({n.op for n in inside if n.op in STATEFUL_RANDOM and "seed" in n.attrs
                           and not n.attrs.get("seed") and not n.attrs.get("seed2")})
        if unseeded and not determinism:
            found.append(Finding("risk", where, f"unseeded random ops ({', '.join(unseeded)}) draw new seeds each run",
                                 "tf.random.set_seed / tfrepro.patch(seed), or seed= on the ops", "pipeline"))
        seeds = [_const(constants, name) for name in node.inputs[2:4] if node.op in _SHUFFLES] or \
            [_const(constants, name) for name in node.inputs[:2] if node.op in _RANDOM_SOURCES]
        if seeds and all(seed is not None and int(seed) == 0 for seed in seeds):
            kind = "shuffle: each run reads the data in another order" if node.op in _SHUFFLES else \
                "Dataset.random (also behind sample_from_datasets and choose_from_datasets): each run draws anew"
            found.append(Finding("risk", f"input pipeline: {kind.split(':')[0].split(' (')[0]}", f"unseeded {kind}"
                                 + (" on every worker of the distribution strategy" if distributed else ""),
                                 "give it seed=S, or tf.random.set_seed / tfrepro.patch(seed) before the dataset is "
                                 "built", "pipeline"))
    options = dataset.options()
    if getattr(options, "deterministic", getattr(options, "experimental_deterministic", None)) is False:
        found.append(_nondeterministic_order("input pipeline: options", determinism,
                                             "Options.deterministic = False"))
    return found


def _nondeterministic_order(where: str, determinism: bool, what: str) -> Finding:
    if determinism:
        return Finding("note", where, f"{what}: overridden by op determinism (TensorFlow keeps the order)",
                       "", "pipeline")
    return Finding("risk", where, f"{what}: elements arrive in the order threads finish them",
                   f"drop {what}, or tfrepro.patch()", "pipeline")
