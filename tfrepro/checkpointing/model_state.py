"""Everything in a Keras model that training changes, as named groups of variables.

Groups: ``model`` (weights, and in Keras 3 every SeedGenerator state: Dropout, random layers),
``generators`` (every other variable reachable from the model through its object graph, as
``tf.train.Checkpoint`` walks it: Keras 2 random layers' ``tf.random.Generator``s, a generator or a
plain ``tf.Variable`` a layer owns), ``optimizer`` (iterations, slots, the learning rate),
``metrics`` (the running totals behind Keras's batch logs). The order is the order Keras and the
object graph give, which is the same for the same model code in every process; names are only for
messages (Keras numbers layers per process: ``dense_1`` here may be ``dense`` there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tfrepro import _object_graph, _tf
from tfrepro.checkpointing import storage

GROUPS = ("model", "generators", "optimizer", "metrics")


@dataclass(frozen=True)
class Slot:
    group: str
    name: str
    variable: Any

    def describe(self) -> dict[str, Any]:
        return {"group": self.group, "name": self.name, "shape": list(self.variable.shape),
                "dtype": _dtype_name(self.variable)}


def _dtype_name(variable: Any) -> str:
    dtype = variable.dtype
    return dtype if isinstance(dtype, str) else dtype.name


def _name(variable: Any) -> str:
    return str(getattr(variable, "path", None) or variable.name)


def keras2_legacy_random_layers(model: Any) -> list[str]:
    """Keras 2 layers whose random ops keep their state inside TF kernels, where no checkpoint can
    reach it (tf_keras's default "legacy_stateful" generator)."""
    return [layer.name for layer in _layers(model)
            if getattr(getattr(layer, "_random_generator", None), "_rng_type", None) == "legacy_stateful"]


def _layers(model: Any) -> list[Any]:
    flatten = getattr(model, "_flatten_layers", None)
    return list(flatten(include_self=True, recursive=True)) if flatten is not None else [model]


def build_optimizer(optimizer: Any, trainable: list[Any]) -> None:
    """Create a Keras optimizer's slots for ``trainable`` now, as its first step on them would, so
    that they can be restored. Anything else, or an optimizer already built, is left alone."""
    if optimizer is None or getattr(optimizer, "built", False) or getattr(optimizer, "_built", False):
        return
    if hasattr(optimizer, "build") and hasattr(optimizer, "apply_gradients"):
        optimizer.build(trainable)
    elif hasattr(optimizer, "_create_all_weights"):  # Keras 2's legacy optimizers
        optimizer._create_all_weights(trainable)


def _optimizer_variables(optimizer: Any) -> list[Any]:
    variables = optimizer.variables
    variables = list(variables() if callable(variables) else variables)
    learning_rate = getattr(optimizer, "_learning_rate", None)
    if hasattr(learning_rate, "assign") and all(v is not learning_rate for v in variables):
        variables.append(learning_rate)  # tf_keras keeps it out of `variables`; ReduceLROnPlateau changes it
    return variables


def _keras2_generators(model: Any) -> list[Any]:
    found = []
    for layer in _layers(model):
        random_generator = getattr(layer, "_random_generator", None)
        if getattr(random_generator, "_rng_type", None) == "stateful":
            random_generator._maybe_init()  # lazily created on the first call otherwise
            found.append(random_generator._generator.state)
    return found


def _variable_types() -> tuple[type, ...]:
    """tf.Variable, and Keras 3's Variable, which wraps one."""
    keras_variable = getattr(_tf.keras_module(), "Variable", None)
    return (_tf.import_tf().Variable, *([keras_variable] if isinstance(keras_variable, type) else []))


def graph_variables(root: Any) -> list[tuple[str, Any]]:
    """Every variable reachable from ``root`` through its object graph, breadth first, as
    ``tf.train.Checkpoint`` walks it, each once with its path (``layer/generator/state``). Keras 3
    SeedGenerators are not in that graph: a Keras 3 layer lists their states in ``variables``."""
    return [(tracked.path, tracked.found) for tracked in _object_graph.walk([root])]


def variables_of(root: Any) -> list[tuple[str, Any]]:
    """All the state of ``root`` that a resume must restore, each variable once: its own
    ``variables`` (a Keras model's or layer's include Keras 3 SeedGenerator states), its Keras 2
    random layers' generators, then the rest of its object graph (``graph_variables``)."""
    listed = getattr(root, "variables", None)
    listed = listed() if callable(listed) else listed
    own = [(_name(v), v) for v in ([root] if isinstance(root, _variable_types()) else list(listed or []))]
    if hasattr(root, "_flatten_layers"):
        own += [(_name(v), v) for v in _keras2_generators(root)]
    seen: set[int] = set()
    found = []
    for name, variable in [*own, *graph_variables(root)]:
        if id(variable) not in seen:
            seen.add(id(variable))
            found.append((name, variable))
    return found


def slots(model: Any) -> list[Slot]:
    """The variables of every group, each once."""
    groups = {
        "model": [(_name(v), v) for v in model.variables],
        "optimizer": [] if model.optimizer is None else [(_name(v), v) for v in _optimizer_variables(model.optimizer)],
        "metrics": [(_name(v), v) for metric in model.metrics for v in metric.variables],
    }
    taken = {id(v) for listed in groups.values() for _, v in listed}
    groups["generators"] = [(n, v) for n, v in variables_of(model) if id(v) not in taken]
    seen: set[int] = set()
    found = []
    for group in GROUPS:
        for name, variable in groups[group]:
            if id(variable) not in seen:
                seen.add(id(variable))
                found.append(Slot(group, name, variable))
    return found


def saved_value(stored: storage.Stored, index: int) -> np.ndarray:
    """Variable ``index`` of a checkpoint read back, as an array of its dtype."""
    entry = stored.manifest["variables"][index]
    dtype = _tf.import_tf().as_dtype(entry["dtype"]).as_numpy_dtype
    return storage.array_from(stored.members[f"variable/{index}"], dtype, entry["shape"])


def values(found: list[Slot]) -> list[np.ndarray]:
    return [np.asarray(slot.variable.numpy()) for slot in found]


def mismatch(saved: list[dict[str, Any]], found: list[Slot], groups: tuple[str, ...]) -> list[str]:
    """How the variables in ``groups`` differ between a checkpoint and this model (empty: they fit)."""
    ours = [slot.describe() for slot in found if slot.group in groups]
    theirs = [entry for entry in saved if entry["group"] in groups]
    lines = []
    for group in groups:
        mine = [e for e in ours if e["group"] == group]
        other = [e for e in theirs if e["group"] == group]
        if len(mine) != len(other):
            lines.append(f"{group}: the checkpoint has {len(other)} variables, this model {len(mine)}")
            continue
        for index, (a, b) in enumerate(zip(other, mine)):
            if (a["shape"], a["dtype"]) != (b["shape"], b["dtype"]):
                lines.append(f"{group} variable {index}: checkpoint {a['name']} {a['dtype']}{a['shape']}, "
                             f"this model {b['name']} {b['dtype']}{b['shape']}")
    return lines
