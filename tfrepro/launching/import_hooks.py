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

from tfrepro.errors import warn


class _CallAfterLoading(importlib.abc.Loader):
    """Wraps a module's loader: executes the module, puts the original loader back, runs the hook."""

    def __init__(self, loader: Any, finder: _PostImportFinder):
        self._loader, self._finder = loader, finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__.loader = module.__loader__ = self._loader
        self._loader.exec_module(module)
        self._finder.loaded(module)

    def __getattr__(self, name: str) -> Any:  # resource readers, get_source, ... of the real loader
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it asks the finders after it, and wraps the loader of a hooked module.
    A hook is used up only when its module is actually executed (``importlib.util.find_spec``, an
    "is it installed?" check, loads nothing and keeps it)."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]):
        self._hooks = hooks

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self._hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _CallAfterLoading(spec.loader, self)
            else:
                warn(f"tfrepro cannot run its hook after importing {fullname} (its loader cannot be wrapped); "
                     f"call tfrepro.patch() yourself after importing {fullname}")
            return spec
        return None

    def loaded(self, module: ModuleType) -> None:
        hook = self._hooks.pop(module.__name__, None)
        if not self._hooks and self in sys.meta_path:
            sys.meta_path.remove(self)
        if hook is not None:
            hook(module)


def call_after_import(hooks: dict[str, Callable[[ModuleType], None]]) -> None:
    """Call ``hooks[name](module)`` once, right after top-level module ``name`` is first executed
    (at once if it already is). A hook that raises makes the import raise."""
    pending = {}
    for name, hook in hooks.items():
        if name in sys.modules:
            hook(sys.modules[name])
        else:
            pending[name] = hook
    if pending:
        sys.meta_path.insert(0, _PostImportFinder(pending))
