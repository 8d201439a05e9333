"""Every op of a traced TensorFlow graph, nested functions included (``tf.function`` calls, ``cond``
and ``while_loop`` bodies, custom gradients, ``tf.data`` map functions), each named by the scope of
the op that called its function, so that an op deep in a function still carries its layer's mark."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# The node attributes the kernel table and the pipeline checks read.
_ATTRS = ("is_training", "tensor_debug_mode", "_XlaMustCompile", "deterministic", "seed", "seed2", "f")
_FUNCTION_NAME = re.compile(r"^(?:__inference_|__forward_|__backward_)?(?:Dataset_\w+?_)?(.+?)(?:_\d+)*$")


@dataclass(frozen=True)
class Node:
    """One op: its type, its name with the scopes of the calls that lead to it, the attributes in
    ``_ATTRS``, whether XLA compiles it, and the library functions it sits in (outermost first)."""

    op: str
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)
    xla: bool = False
    functions: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()

    @property
    def function(self) -> str | None:
        """The Python name of the innermost function the op sits in, or None at the top level."""
        return python_name(self.functions[-1]) if self.functions else None


def python_name(function: str) -> str:
    """``__inference_augment_123`` -> ``augment``; ``__inference_Dataset_map_augment_45`` -> ``augment``."""
    found = _FUNCTION_NAME.match(function)
    return found.group(1) if found else function


def _attr(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "func":
        return value.func.name
    if kind == "s":
        return value.s.decode("utf-8", "replace")
    return getattr(value, kind) if kind in ("b", "i", "f") else None


def _called(node: Any, library: dict[str, Any]) -> list[str]:
    """The library functions a node calls: by op type, or through function-valued attributes."""
    called = [node.op] if node.op in library else []
    for value in node.attr.values():
        kind = value.WhichOneof("value")
        if kind == "func":
            called.append(value.func.name)
        elif kind == "list":
            called += [f.name for f in value.list.func]
    return [name for name in called if name in library]


def walk(graph_def: Any, *, xla: bool = False) -> Iterator[Node]:
    """Every op in ``graph_def`` and in the library functions it reaches (each as often as it is
    called; a function calling itself is followed once)."""
    library = {function.signature.name: function for function in graph_def.library.function}

    def nodes(node_defs: Any, prefix: str, in_xla: bool, stack: tuple[str, ...]) -> Iterator[Node]:
        for node in node_defs:
            name = f"{prefix}/{node.name}" if prefix else node.name
            attrs = {key: _attr(value) for key, value in node.attr.items() if key in _ATTRS}
            node_xla = in_xla or attrs.get("_XlaMustCompile") is True
            yield Node(node.op, name, attrs, node_xla, stack, tuple(node.input))
            for function in _called(node, library):
                if function not in stack:
                    yield from nodes(library[function].node_def, name, node_xla, (*stack, function))

    yield from nodes(graph_def.node, "", xla, ())
