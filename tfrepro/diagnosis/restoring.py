"""Every state a training step can change, found and put back bit for bit.

The variables come from three places, each variable once: what Keras lists (the model's variables,
the optimizer's, the metrics'), the object graph as ``tf.train.Checkpoint`` walks it from the model,
its optimizers and metrics (so a layer's ``tf.random.Generator`` and plain ``tf.Variable``
attributes count, which Keras 3 does not list), and every variable a traced train step reads or
writes (``FuncGraph.variables``: also those no object tracks). The RNGs are ``rng_state()``'s, and
Keras 2's per-layer seed counters (Python ints that each trace of a random layer advances).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfrepro import _tf
from tfrepro._object_graph import Tracked, plain, walk as object_graph
from tfrepro.determinism.seeding import rng_state, set_rng_state


def listed(value: Any) -> list[Any]:
    """A Keras ``variables``/``metrics`` attribute as a list (Keras 2 has some as methods)."""
    return list(value() if callable(value) else value or [])


def metrics(model: Any) -> list[Any]:
    """Every Keras metric of the model, nested ones (Keras 3's ``CompileMetrics`` holds the compiled
    ones) included, outer before inner, each once."""
    keras = _tf.keras_module()
    found: dict[int, Any] = {}

    def visit(value: Any) -> None:
        if isinstance(value, keras.metrics.Metric):
            if id(value) in found:
                return
            found[id(value)] = value
            for attribute in vars(value).values():
                visit(attribute)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)

    visit(listed(getattr(model, "metrics", [])))
    return list(found.values())


def optimizers(model: Any, tracked: Sequence[Tracked] | None = None) -> list[Any]:
    """The model's optimizer and any other optimizer it tracks (a GAN's two), each once; ``tracked``:
    ``object_graph([model])`` if already walked."""
    keras = _tf.keras_module()
    kinds = tuple(kind for kind in (getattr(keras.optimizers, "Optimizer", None),
                                    getattr(getattr(keras.optimizers, "legacy", None), "Optimizer", None)) if kind)
    found = {id(model.optimizer): model.optimizer} if getattr(model, "optimizer", None) is not None else {}
    for entry in object_graph([model]) if tracked is None else tracked:
        for obj in entry.ancestors:
            if isinstance(obj, kinds):
                found.setdefault(id(obj), obj)
    return list(found.values())


def _legacy_seed_holders(layers: Sequence[Any]) -> list[Any]:
    """Keras 2's per-layer seed counters (``layer._random_generator._seed``, advanced on each trace)."""
    holders = []
    for layer in layers:
        generator = getattr(layer, "_random_generator", None)
        if generator is not None and isinstance(getattr(generator, "_seed", None), int):
            holders.append(generator)
    return holders


class Snapshot:
    """The values of a set of variables, every RNG's state and Keras 2's seed counters, taken now;
    ``add`` takes more variables (their values at that moment), ``restore`` puts everything back."""

    def __init__(self, layers: Sequence[Any]):
        self._variables: dict[int, tuple[Any, Any]] = {}
        self._components: set[int] = set()
        self._rng = rng_state()
        self._holders = _legacy_seed_holders(layers)
        self._seeds = [holder._seed for holder in self._holders]

    def add(self, variables: Iterable[Any]) -> None:
        tf = _tf.import_tf()
        for variable in variables:
            variable = plain(tf, variable)
            if variable is None or id(variable) in self._variables or id(variable) in self._components:
                continue
            if isinstance(variable, tf.distribute.DistributedValues):  # restored as one; its replicas are its parts
                self._components |= {id(part) for part in variable.values}
            self._variables[id(variable)] = (variable, np.array(variable.numpy(), copy=True))

    @property
    def variables(self) -> list[Any]:
        """The saved ``tf.Variable``s, in the order they were added."""
        return [variable for variable, _ in self._variables.values()]

    def restore(self) -> None:
        for variable, value in self._variables.values():
            variable.assign(value)
        set_rng_state(self._rng)
        for holder, seed in zip(self._holders, self._seeds):
            holder._seed = seed


def model_variables(model: Any) -> list[Any]:
    """Every variable of the model, its optimizers and its metrics that Keras lists or the object graph
    reaches (see the module doc), as ``tf.Variable``s, each once."""
    tf = _tf.import_tf()
    tracked = object_graph([model])
    extra_roots = [*optimizers(model, tracked), *metrics(model)]
    candidates = [*listed(model.variables), *(t.variable for t in tracked)]
    for obj in extra_roots:
        candidates += listed(getattr(obj, "variables", []))
    candidates += [t.variable for t in object_graph(extra_roots)]
    unique: dict[int, Any] = {}
    for variable in candidates:
        variable = plain(tf, variable)
        if variable is not None:
            unique.setdefault(id(variable), variable)
    return list(unique.values())
