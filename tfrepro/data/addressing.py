"""Whether a training input can be addressed by epoch: whether epoch E's batches are the same when
the epochs before it were never drawn.

They are when every random draw in it is keyed (fit's shuffle of arrays under ``patch``,
``tfrepro.data.shuffle``, ``map_with_seed``) or restarts with every pass (a ``Dataset.shuffle`` with
``reshuffle_each_iteration=False``, a ``Dataset.random`` that is not rerandomised, TF's stateful
random ops in a tf.data function, whose kernels each new iterator makes afresh). They are not when a
draw depends on how many passes came before (``Dataset.shuffle``'s default reshuffle, a rerandomised
``Dataset.random``, a ``tf.random.Generator`` or a variable the pipeline updates) or on Python
(``Dataset.from_generator``, ``py_function``, Keras's ``PyDataset``/``Sequence``, generators).
``why_not_addressable`` reads the dataset's graph, functions included; it never runs it.
"""

from __future__ import annotations

from typing import Any

from tfrepro import _tf

# Ops whose draws follow the number of passes before, by what they read to say so.
_RESHUFFLING = {"ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
                "ShuffleAndRepeatDatasetV2"}
_RANDOM_DATASETS = {"RandomDataset", "RandomDatasetV2", "ExperimentalRandomDataset"}
_PYTHON = {"PyFunc", "PyFuncStateless", "EagerPyFunc", "GeneratorDataset"}
_CACHES = {"CacheDataset", "CacheDatasetV2", "SnapshotDataset", "SnapshotDatasetV2"}  # epoch 0's draws, kept
_STATE_UPDATES = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "RngReadAndSkip", "RngSkip",
                  "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt", "StatefulStandardNormalV2",
                  "StatefulTruncatedNormal", "StatefulRandomBinomial", "ResourceScatterUpdate", "ResourceScatterAdd"}


def serialized_graph(dataset: Any, most_bytes: int | None = None) -> Any:
    """``dataset``'s ``GraphDef``, functions included, or None if it is over ``most_bytes``.
    Stateful ops are kept as they are; captured state (a variable, a lookup table) is copied as its
    value, so a dataset rebuilt from the graph would hold a frozen copy of it."""
    tf = _tf.import_tf()
    serialized = tf.raw_ops.DatasetToGraphV2(input_dataset=dataset._variant_tensor,
                                             external_state_policy=1,  # IGNORE: keep stateful ops, copy state
                                             strip_device_assignment=True).numpy()
    if most_bytes is not None and len(serialized) > most_bytes:
        return None
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(serialized)
    return graph


def why_not_addressable(dataset: Any, graph: Any = None) -> str | None:
    """None if ``dataset``'s epochs can be drawn directly; else what in it draws by history
    (``graph``: its ``serialized_graph``, if already made)."""
    graph = serialized_graph(dataset) if graph is None else graph
    # The graph's own nodes are its datasets (and, serialised, the values of the variables its
    # functions capture); what the pipeline does to state is in its functions.
    in_functions = [node for function in graph.library.function for node in function.node_def]
    function_nodes = {id(node) for node in in_functions}
    for node in [*graph.node, *in_functions]:
        attrs = node.attr
        if node.op in _PYTHON:
            return "it runs Python (a generator or py_function), which tfrepro cannot address"
        if node.op in _CACHES:
            return "a cache or snapshot keeps the first pass's elements, draws included"
        if node.op in _RESHUFFLING and ("reshuffle_each_iteration" not in attrs or attrs["reshuffle_each_iteration"].b):
            return "a Dataset.shuffle reshuffles each pass by how many passes came before (use tfrepro.data.shuffle)"
        if node.op in _RANDOM_DATASETS and "rerandomize_each_iteration" in attrs and attrs["rerandomize_each_iteration"].b:
            return ("a Dataset.random (or a repeat() after a keyed draw) draws each pass by how many passes came "
                    "before (use tfrepro.data.map_with_seed, and no repeat() after it)")
        if node.op in _STATE_UPDATES and id(node) in function_nodes:
            return f"it updates state that outlives a pass ({node.op}: a tf.random.Generator or a variable)"
    return None
