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
import importlib
import importlib.abc
import sys
import threading
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
        try:
            for context in self._around.pop(name, []):
                stack.enter_context(context())
        except BaseException:
            stack.close()
            raise
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
    has finished (``run_deferred``): Keras goes on importing after its backend has loaded, so hooks
    on Keras's modules run before ``import keras`` returns."""
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


# Hooks of modules that were still executing when they were asked for, run by ``run_deferred``.
_deferred: list[tuple[str, Hook]] = []
_builtin_import: Callable[..., ModuleType] | None = None
_lock = threading.RLock()


def _defer(name: str, hook: Hook) -> None:
    global _builtin_import
    with _lock:
        _deferred.append((name, hook))
        if _builtin_import is None:
            _builtin_import = builtins.__import__
            builtins.__import__ = _importing


def _importing(*args: Any, **kwargs: Any) -> ModuleType:
    """``__import__`` while hooks are deferred: each import statement, then ``run_deferred``. The
    original ``__import__`` is back once no hook is left (another thread may put it back meanwhile)."""
    original = _builtin_import or (builtins.__import__ if builtins.__import__ is not _importing
                                   else importlib.__import__)
    try:
        return original(*args, **kwargs)
    finally:
        run_deferred()


def run_deferred() -> None:
    """Run the deferred hooks whose module has finished executing (one that failed to import drops
    its hooks, as the importer sees the failure). Import statements run it, so a hook runs at the
    first import statement after its module has finished: for a module that the outermost import
    statement loads last, that is the next import statement anywhere, or a call of this function
    (``tfrepro.status()`` and ``patch`` make one). A hook that raises is warned about, by name; the
    import statement that ran it, which has nothing to do with it, goes on."""
    global _builtin_import
    with _lock:
        ready = [(name, hook) for name, hook in _deferred if not _initializing(sys.modules.get(name))]
        for item in ready:
            _deferred.remove(item)
        if not _deferred and _builtin_import is not None:
            if builtins.__import__ is _importing:
                builtins.__import__ = _builtin_import
            _builtin_import = None
    for name, hook in ready:
        module = sys.modules.get(name)
        if module is None:
            continue
        try:
            hook(module)
        except Exception as exc:  # noqa: BLE001  (any failure, named: the hook's own import is long over)
            warn(f"tfrepro's hook on {name} failed after {name} had loaded, so what it sets up is not in place: "
                 f"{type(exc).__name__}: {exc}")
