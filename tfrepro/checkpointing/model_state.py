"""Everything in a Keras model that training changes, as named groups of variables.

Groups: ``model`` (weights, and in Keras 3 every SeedGenerator state: Dropout, random layers),
``generators`` (Keras 2: each random layer's ``tf.random.Generator``), ``optimizer`` (iterations,
slots, the learning rate), ``metrics`` (the running totals behind Keras's batch logs). The order is
the order Keras gives, which is the same for the same model code in every process; names are only
for messages (Keras numbers layers per process: ``dense_1`` here may be ``dense`` there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

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


def build_optimizer(model: Any) -> None:
    """Create the optimizer's slots now, as its first step would, so that they can be restored."""
    optimizer = model.optimizer
    if optimizer is None or getattr(optimizer, "built", False) or getattr(optimizer, "_built", False):
        return
    if hasattr(optimizer, "build"):
        optimizer.build(model.trainable_variables)
    elif hasattr(optimizer, "_create_all_weights"):  # Keras 2's legacy optimizers
        optimizer._create_all_weights(model.trainable_variables)


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


def slots(model: Any) -> list[Slot]:
    """The variables of every group, each once."""
    groups = {
        "model": list(model.variables),
        "generators": _keras2_generators(model),  # Keras 3 layers have none: their seeds are in `variables`
        "optimizer": [] if model.optimizer is None else _optimizer_variables(model.optimizer),
        "metrics": [v for metric in model.metrics for v in metric.variables],
    }
    seen: set[int] = set()
    found = []
    for group in GROUPS:
        for variable in groups[group]:
            if id(variable) not in seen:
                seen.add(id(variable))
                found.append(Slot(group, _name(variable), variable))
    return found


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
