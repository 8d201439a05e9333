"""Which Keras layer produced which op and which tensor: every sublayer's ``call``, spied on while a
train step is traced.

While ``LayerCalls.recording()`` is active, each layer's ``call`` (nested layers and the model included) runs
inside a name scope ``tfrepro_layer_<N>``, so every op it makes, and every gradient op that
``GradientTape`` derives from those ops (named ``gradient_tape/<forward op's scope>/...``), carries
the layer's mark; and each call is recorded with its tensor inputs and outputs (every dtype a
fingerprint reads: floating, integer and boolean) and its ``training`` argument. With
``gradients=True`` each floating input and output also passes through an identity of the call's
own whose gradient records what arrives there whenever a tape differentiates through it: at the
outputs, the gradient the call receives; at the inputs, the one it passes back (its own, not the sum
over the input's other readers). The spy lives on the layer instances and is removed when the block
ends.
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
    input_gradients: list[Any] = field(default_factory=list)  # with gradients=True, in the order they arrive
    output_gradients: list[Any] = field(default_factory=list)

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


def fingerprintable(tf: Any, structure: Any) -> list[Any]:
    """The tensors in a nested structure that a fingerprint reads (floating, integer, boolean), composite
    tensors (sparse, ragged) by their parts, flattened."""
    return [t for t in tf.nest.flatten(structure, expand_composites=True) if isinstance(t, tf.Tensor)
            and (t.dtype.is_floating or t.dtype.is_integer or t.dtype == tf.bool)]


def _watched(tf: Any, tensor: Any, sink: list[Any]) -> Any:
    """``tensor`` through an identity whose gradient is appended to ``sink`` each time a tape passes it."""

    @tf.custom_gradient
    def identity(value: Any) -> Any:
        def gradient(upstream: Any) -> Any:
            sink.append(upstream)
            return upstream

        return tf.identity(value), gradient

    watched = identity(tensor)
    mask = getattr(tensor, "_keras_mask", None)  # Keras 2 and 3 carry masks on the tensor
    if mask is not None:
        watched._keras_mask = mask
    return watched


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
    def recording(self, *, gradients: bool = False) -> Iterator[list[LayerCall]]:
        """Spy on every sublayer's ``call`` for the duration of the block; yields the calls list.
        ``gradients``: also record the gradients at each call's inputs and outputs (see the module doc)."""
        tf = _tf.import_tf()
        self.calls = []
        stack: list[LayerCall] = []
        counter = iter(range(1 << 62))
        saved = []
        try:
            for layer in self.layers:
                own = layer.obj.__dict__.get("call")
                saved.append((layer.obj, own))
                layer.obj.call = self._spy(tf, layer, layer.obj.call, stack, counter, gradients)
            yield self.calls
        finally:
            for obj, own in saved:
                if own is None:
                    del obj.call
                else:
                    obj.call = own

    def _spy(self, tf: Any, layer: Layer, original: Any, stack: list[LayerCall], counter: Iterator[int],
             gradients: bool) -> Any:
        calls = self.calls

        def call(*args: Any, **kwargs: Any) -> Any:
            record = LayerCall(layer, next(counter), stack[-1] if stack else None, kwargs.get("training"))
            # Every floating tensor argument goes in through an identity of this call's own, so that the
            # gradient with respect to it is what this call passes back, not the sum over all readers.
            wrap = (lambda v: _watched(tf, v, record.input_gradients)) if gradients else tf.identity
            args, kwargs = tf.nest.map_structure(lambda v: wrap(v) if _is_floating(tf, v) else v, (args, kwargs))
            record.inputs = fingerprintable(tf, (args, kwargs))
            calls.append(record)
            stack.append(record)
            try:
                with tf.name_scope(f"{MARK}{layer.number}"):
                    outputs = original(*args, **kwargs)
            finally:
                stack.pop()
                record.end = next(counter)
            if gradients:
                outputs = tf.nest.map_structure(
                    lambda v: _watched(tf, v, record.output_gradients) if _is_floating(tf, v) else v, outputs)
            record.outputs = fingerprintable(tf, outputs)
            return outputs

        return call
