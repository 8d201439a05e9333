"""Run a function right after a module is first imported, before the importing code goes on.

``tfrepro run`` applies the TensorFlow half of ``patch`` this way: a script that never imports
TensorFlow never pays for loading it, and one that does gets op determinism, TF's seeds and the op
replacements before its next line runs. ``patch`` seeds a Keras that is imported after it the same
way. A context can also be put around the module's execution (``around``): the launcher keeps
Python's RNG where it was while TensorFlow's import draws from it.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.abc
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, ContextManager

from tfrepro.errors import warn

Hook = Callable[[ModuleType], None]


class _CallAfterLoading(importlib.abc.Loader):
    """Wraps a module's loader: executes the module (inside its ``around`` context), puts the
    original loader back, runs the hook."""

    def __init__(self, loader: Any, finder: _PostImportFinder):
        self._loader, self._finder = loader, finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__.loader = module.__loader__ = self._loader
        with self._finder.around(module.__name__):
            self._loader.exec_module(module)
        self._finder.loaded(module)

    def __getattr__(self, name: str) -> Any:  # resource readers, get_source, ... of the real loader
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it asks the finders after it, and wraps the loader of a hooked module.
    A hook is used up only when its module is actually executed (``importlib.util.find_spec``, an
    "is it installed?" check, loads nothing and keeps it). One finder holds every pending hook
    (``_FINDER``): two finders asking each other for one name would never return."""

    def __init__(self) -> None:
        self._hooks: dict[str, list[Hook]] = {}
        self._around: dict[str, list[Callable[[], ContextManager[Any]]]] = {}

    def add(self, name: str, hook: Hook, around: Callable[[], ContextManager[Any]] | None) -> None:
        self._hooks.setdefault(name, []).append(hook)
        if around is not None:
            self._around.setdefault(name, []).append(around)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

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

    def around(self, name: str) -> ContextManager[Any]:
        stack = contextlib.ExitStack()
        for context in self._around.pop(name, []):
            stack.enter_context(context())
        return stack

    def loaded(self, module: ModuleType) -> None:
        hooks = self._hooks.pop(module.__name__, [])
        if not self._hooks and self in sys.meta_path:
            sys.meta_path.remove(self)
        for hook in hooks:
            hook(module)


_FINDER = _PostImportFinder()


def call_after_import(hooks: Mapping[str, Hook],
                      around: Mapping[str, Callable[[], ContextManager[Any]]] | None = None) -> None:
    """Call ``hooks[name](module)`` once, right after module ``name`` (dotted names too) is first
    executed, at once if it is loaded already. ``around[name]()``, if given, is a context the
    module executes in (not entered for a module loaded already). A hook that raises makes the
    import raise. A module that is still executing (it imported the caller: Keras 3 imports
    TensorFlow halfway through its own import) gets its hook at the first import statement after it
    has finished, which is before the code that imported it goes on."""
    pending = {}
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is None:
            pending[name] = hook
        elif _initializing(module):
            _defer(name, hook)
        else:
            hook(module)
    for name, hook in pending.items():
        _FINDER.add(name, hook, (around or {}).get(name))


def _initializing(module: ModuleType) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


# Hooks of modules that were still executing when they were asked for, run by ``_importing``.
_deferred: list[tuple[str, Hook]] = []
_builtin_import: Callable[..., ModuleType] | None = None


def _defer(name: str, hook: Hook) -> None:
    global _builtin_import
    _deferred.append((name, hook))
    if _builtin_import is None:
        _builtin_import = builtins.__import__
        builtins.__import__ = _importing


def _importing(*args: Any, **kwargs: Any) -> ModuleType:
    """``__import__`` while hooks are deferred: each import statement, then the hooks whose module
    has finished executing (or failed to); the original ``__import__`` is back once none is left."""
    assert _builtin_import is not None
    try:
        return _builtin_import(*args, **kwargs)
    finally:
        _run_deferred()


def _run_deferred() -> None:
    global _builtin_import
    ready = [(name, hook) for name, hook in _deferred if not _initializing(sys.modules.get(name))]
    if not ready:
        return
    for item in ready:
        _deferred.remove(item)
    if not _deferred and builtins.__import__ is _importing:
        builtins.__import__, _builtin_import = _builtin_import, None
    for name, hook in ready:
        module = sys.modules.get(name)
        if module is not None:  # None: its import failed, and the failure is the importer's to see
            hook(module)
