"""Random state that no checkpoint can hold: TensorFlow's stateful random kernels.

``tf.random.normal``, ``tf.random.uniform``, ``tf.nn.dropout`` without a seed tensor and their kin
(with or without an op seed) keep their stream inside the op's kernel: no API reads or sets it, so a
resumed run draws other numbers than the uninterrupted one. Random ops that read a variable
(``tf.random.Generator``'s ``Stateful*`` ops, Keras 3's SeedGenerator feeding ``Stateless*`` ops)
are checkpointable and are not flagged here.

Two ways to find them: ``train_step_findings`` traces a Keras model's train step to a graph that
never runs, and ``watching`` sees the ops a custom loop's step builds or runs eagerly. Both name the
layer by the name scope Keras opens around each layer's call.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from typing import Any

from tfrepro import _tf
from tfrepro.checkpointing import model_state
from tfrepro.errors import CheckpointError

# Op type: (the API that makes it, the stateless replacement).
KERNEL_STATE_OPS = {
    "RandomStandardNormal": ("tf.random.normal", "tf.random.stateless_normal"),
    "RandomUniform": ("tf.random.uniform (also behind tf.nn.dropout and tf.image.random_*)",
                      "tf.random.stateless_uniform (tf.nn.experimental.stateless_dropout, "
                      "tf.image.stateless_random_*)"),
    "RandomUniformInt": ("tf.random.uniform with an integer dtype", "tf.random.stateless_uniform"),
    "TruncatedNormal": ("tf.random.truncated_normal", "tf.random.stateless_truncated_normal"),
    "ParameterizedTruncatedNormal": ("parameterized_truncated_normal",
                                     "tf.random.stateless_parameterized_truncated_normal"),
    "RandomShuffle": ("tf.random.shuffle", "tf.random.experimental.stateless_shuffle"),
    "RandomGamma": ("tf.random.gamma", "tf.random.stateless_gamma"),
    "RandomPoisson": ("tf.random.poisson", "tf.random.stateless_poisson"),
    "RandomPoissonV2": ("tf.random.poisson", "tf.random.stateless_poisson"),
    "Multinomial": ("tf.random.categorical", "tf.random.stateless_categorical"),
    "RandomCrop": ("tf.image.random_crop", "tf.image.stateless_random_crop"),
    "SampleDistortedBoundingBox": ("tf.image.sample_distorted_bounding_box",
                                   "tf.image.stateless_sample_distorted_bounding_box"),
    "SampleDistortedBoundingBoxV2": ("tf.image.sample_distorted_bounding_box",
                                     "tf.image.stateless_sample_distorted_bounding_box"),
}
_UNIQUIFIED = re.compile(r"_\d+$")


def _owner(scope: str, layers: dict[str, str], outside: str) -> str:
    """Who made an op, from its name scope: the innermost layer it names, else ``outside``."""
    tokens = [t for t in scope.split("/") if t]
    for token in reversed(tokens):
        for name in (token, _UNIQUIFIED.sub("", token)):
            if name in layers:
                return layers[name]
    return outside


def _layer_names(model: Any) -> dict[str, str]:
    """Layer name -> how a message names it (the model itself: ``model 'name'``)."""
    flatten = getattr(model, "_flatten_layers", None)
    layers = list(flatten(include_self=False, recursive=True)) if flatten is not None else []
    named = {layer.name: f"layer '{layer.name}'" for layer in layers}
    if getattr(model, "name", None):
        named[model.name] = f"model '{model.name}'"
    return named


def findings(ops: Iterable[tuple[str, str]], models: Iterable[Any], outside: str) -> list[str]:
    """One line per (owner, API) among ``ops`` (op type, scoped name) whose state is in the kernel:
    the innermost layer of ``models`` whose scope the op is in, else ``outside``."""
    layers: dict[str, str] = {}
    for model in models:
        layers.update(_layer_names(model))
    lines: dict[tuple[str, str], str] = {}
    for op_type, scope in ops:
        if op_type in KERNEL_STATE_OPS:
            owner = _owner(scope, layers, outside)
            api, stateless = KERNEL_STATE_OPS[op_type]
            lines.setdefault((owner, api), f"{owner} calls {api} ({op_type}); draw with {stateless} instead")
    return list(lines.values())


def refusal(lines: list[str], what: str) -> str:
    """The message of the CheckpointError that refuses ``lines``."""
    head = lines[0] if len(lines) == 1 else f"{len(lines)} random ops of this model keep their state in TF's kernels"
    return (f"{what} cannot checkpoint the random state of this model: {head}. TF's stateful random ops keep "
            "their state inside the kernel, where no checkpoint can reach it, so a resumed run would draw other "
            "numbers (stateless ops take their seed from a keras.random.SeedGenerator or a tf.random.Generator "
            "owned by the layer, e.g. seed = self.generator.make_seeds(1)[:, 0], which checkpoints hold)")


def refuse_keras2_legacy_layers(model: Any, what: str) -> None:
    """Raise CheckpointError for Keras 2 random layers on TF's kernel-held generator (tf_keras's
    default), naming them and the switch that moves their state into variables."""
    legacy = model_state.keras2_legacy_random_layers(model)
    if legacy:
        raise CheckpointError(
            f"{what} cannot save the random state of these Keras 2 layers: TF keeps it inside "
            "its kernels. Call tf.keras.backend.experimental.enable_tf_random_generator() before "
            "building the model (`tfrepro run --checkpoint` does)", [", ".join(legacy)])


def graph_ops(graph_def: Any) -> Iterator[tuple[str, str]]:
    """(op type, name) of every node of a ``GraphDef`` and of its library functions. Ops inside a
    function keep the name scope they were traced under, which names their layer."""
    yield from ((node.op, node.name) for node in graph_def.node)
    for function in graph_def.library.function:
        yield from ((node.op, node.name) for node in function.node_def)


def train_step_findings(model: Any, element_spec: Any) -> list[str]:
    """The kernel-state random ops of ``model.train_step`` (forward, loss, gradients, update; an
    overridden step as written), traced on ``element_spec`` to a graph that never runs. Tracing
    creates what the first step would (optimizer slots, metric variables) and draws nothing."""
    tf = _tf.import_tf()
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None and _distributed(tf, element_spec):
        def step(data: Any) -> Any:  # as Keras runs it under a tf.distribute strategy: on every replica
            return strategy.run(model.train_step, args=(data,))

        concrete = tf.function(step).get_concrete_function(element_spec)
    else:
        concrete = tf.function(model.train_step).get_concrete_function(element_spec)
    return findings(graph_ops(concrete.graph.as_graph_def()), [model], f"{type(model).__name__}.train_step")


def _distributed(tf: Any, element_spec: Any) -> bool:
    return any(isinstance(spec, tf.distribute.DistributedValues) or type(spec).__name__ == "PerReplicaSpec"
               for spec in tf.nest.flatten(element_spec, expand_composites=False))


@contextlib.contextmanager
def watching() -> Iterator[list[tuple[str, str]]]:
    """While active, collect (op type, scoped name) of every op this thread builds into a graph
    (a ``tf.function`` traced) or runs eagerly. Yields the list, which grows."""
    from tensorflow.python.framework import op_callbacks  # TF has no public hook for this

    tf = _tf.import_tf()
    seen: list[tuple[str, str]] = []

    def callback(op_type: Any, inputs: Any, attrs: Any, outputs: Any, op_name: Any = None, graph: Any = None) -> None:
        op_type = op_type.decode() if isinstance(op_type, bytes) else str(op_type)
        if op_type in KERNEL_STATE_OPS:
            name = op_name.decode() if isinstance(op_name, bytes) else op_name
            scope = getattr(tf, "get_current_name_scope", lambda: "")  # eager ops have no name, only a scope
            seen.append((op_type, name or scope()))

    op_callbacks.add_op_callback(callback)
    try:
        yield seen
    finally:
        op_callbacks.remove_op_callback(callback)
