"""Run a function right after a module is first imported, before the importing code goes on.

``tfrepro run`` applies the TensorFlow half of ``patch`` this way: a script that never imports
TensorFlow never pays for loading it, and one that does gets op determinism, TF's seeds and the op
replacements before its next line runs.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


class _CallAfterLoading(importlib.abc.Loader):
    """Wraps a module's loader: executes the module, puts the original loader back, calls ``after``."""

    def __init__(self, loader: Any, after: Callable[[ModuleType], None]):
        self._loader, self._after = loader, after

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__.loader = module.__loader__ = self._loader
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:  # resource readers, get_source, ... of the real loader
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]):
        self._hooks = hooks

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self._hooks:
            return None
        after = self._hooks.pop(fullname)
        if not self._hooks:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _CallAfterLoading(spec.loader, after)
                return spec
        return None


def call_after_import(hooks: dict[str, Callable[[ModuleType], None]]) -> None:
    """Call ``hooks[name](module)`` once, right after top-level module ``name`` is first imported
    (at once if it already is). A hook that raises makes the import raise."""
    pending = {}
    for name, hook in hooks.items():
        if name in sys.modules:
            hook(sys.modules[name])
        else:
            pending[name] = hook
    if pending:
        sys.meta_path.insert(0, _PostImportFinder(pending))
