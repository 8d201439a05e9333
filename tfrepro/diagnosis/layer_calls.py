"""Which Keras layer produced which op and which tensor: every sublayer's ``call``, spied on while a
train step is traced.

While ``LayerCalls.recording()`` is active, each layer's ``call`` (nested layers and the model included) runs
inside a name scope ``tfrepro_layer_<N>``, so every op it makes, and every gradient op that
``GradientTape`` derives from those ops (named ``gradient_tape/<forward op's scope>/...``), carries
the layer's mark; and each call is recorded with its inputs, outputs and ``training`` argument.
The spy lives on the layer instances and is removed when the block ends.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tfrepro import _tf

MARK = "tfrepro_layer_"
_MARK_TOKEN = re.compile(rf"^{MARK}(\d+)(?:_\d+)?$")


@dataclass
class Layer:
    """One layer: its object and its path of names from the model (the model itself: its name)."""

    number: int
    obj: Any
    path: str

    @property
    def kind(self) -> str:
        return type(self.obj).__name__


@dataclass
class LayerCall:
    """One call of a sublayer while recording: entered ``start``-th, finished ``end``-th."""

    layer: Layer
    start: int
    parent: LayerCall | None
    training: Any
    inputs: list[Any] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    end: int = -1

    def within(self, other: LayerCall) -> bool:
        """Whether this call happened inside ``other`` (directly or deeper)."""
        call = self.parent
        while call is not None:
            if call is other:
                return True
            call = call.parent
        return False


def sublayers(model: Any) -> list[Layer]:
    """Every layer inside ``model``, depth first, each once, with its path; then the model itself
    (its own code between its layers), named by its name."""
    found: list[Layer] = []
    seen = {id(model)}

    def visit(layer: Any, path: str) -> None:
        for child in _children(layer):
            if id(child) in seen:
                continue
            seen.add(id(child))
            entry = Layer(len(found), child, f"{path}/{child.name}" if path else child.name)
            found.append(entry)
            visit(child, entry.path)

    visit(model, "")
    found.append(Layer(len(found), model, model.name))
    return found


def _children(layer: Any) -> list[Any]:
    # Keras 2 and 3 both keep a layer's direct sublayers behind `_flatten_layers` (no public name).
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is None:
        return []
    return list(flatten(include_self=False, recursive=False))


def _is_floating(tf: Any, value: Any) -> bool:
    return isinstance(value, tf.Tensor) and value.dtype.is_floating


def floating(tf: Any, structure: Any) -> list[Any]:
    """The floating-point tensors in a nested structure, flattened."""
    return [t for t in tf.nest.flatten(structure) if _is_floating(tf, t)]


class LayerCalls:
    """The spy. ``layers`` are the model's sublayers and, last, the model; ``calls`` the calls of the
    last recording."""

    def __init__(self, model: Any):
        self.layers = sublayers(model)
        self.calls: list[LayerCall] = []

    def layer_of(self, op_name: str) -> Layer | None:
        """The innermost layer whose mark is in an op's (scoped) name, or None."""
        number = None
        for token in op_name.split("/"):
            found = _MARK_TOKEN.match(token)
            if found:
                number = int(found.group(1))
        return None if number is None or number >= len(self.layers) else self.layers[number]

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[LayerCall]]:
        """Spy on every sublayer's ``call`` for the duration of the block; yields the calls list."""
        tf = _tf.import_tf()
        self.calls = []
        stack: list[LayerCall] = []
        counter = iter(range(1 << 62))
        saved = []
        try:
            for layer in self.layers:
                own = layer.obj.__dict__.get("call")
                saved.append((layer.obj, own))
                layer.obj.call = self._spy(tf, layer, layer.obj.call, stack, counter)
            yield self.calls
        finally:
            for obj, own in saved:
                if own is None:
                    del obj.call
                else:
                    obj.call = own

    def _spy(self, tf: Any, layer: Layer, original: Any, stack: list[LayerCall], counter: Iterator[int]) -> Any:
        calls = self.calls

        def call(*args: Any, **kwargs: Any) -> Any:
            # Every floating tensor argument goes in through an identity of this call's own, so that the
            # gradient with respect to it is what this call passes back, not the sum over all readers.
            args, kwargs = tf.nest.map_structure(lambda v: tf.identity(v) if _is_floating(tf, v) else v,
                                                 (args, kwargs))
            record = LayerCall(layer, next(counter), stack[-1] if stack else None, kwargs.get("training"),
                               inputs=floating(tf, (args, kwargs)))
            calls.append(record)
            stack.append(record)
            try:
                with tf.name_scope(f"{MARK}{layer.number}"):
                    outputs = original(*args, **kwargs)
            finally:
                stack.pop()
                record.end = next(counter)
            record.outputs = floating(tf, outputs)
            return outputs

        return call
