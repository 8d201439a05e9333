"""The package is laid out by verb, without import cycles, and the docs' API overview resolves."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import tfrepro

pytestmark = [pytest.mark.core, pytest.mark.keras]

ROOT = Path(tfrepro.__file__).parent
API_INDEX = ROOT.parent / "docs" / "reference" / "api" / "index.md"
# Floors, lowest first: a module imports only from its own unit or from units on lower floors.
FLOORS = [
    {"_tf", "_files", "errors", "_version"},
    {"_import_hooks", "_object_graph"},
    {"_targets"},
    {"ops"},
    {"determinism"},
    {"proof", "data"},
    {"testing", "launching"},
    {"examples", "sweeps", "diagnosis", "checkpointing"},
    {"tuning"},
    {"plotting"},
    {"cli"},
    {"__init__", "__main__"},
]
LOOSE_MODULES = {"__init__", "__main__", "_files", "_import_hooks", "_object_graph", "_targets", "_tf", "_version", "errors",
                 "testing"}


def _modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (packages by their own name)."""
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The tfrepro modules that ``name`` imports anywhere in its file, lazy imports included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in modules else base)
    return {t for t in targets if t in modules and t != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _floor(module: str) -> int:
    unit = _unit(module)
    return next(level for level, units in enumerate(FLOORS) if unit in units)


def test_no_import_cycles_lazy_imports_included():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_the_cycle_check_can_fail(tmp_path, monkeypatch):
    """A negative control for the walk above: two modules that import each other lazily."""
    (tmp_path / "a.py").write_text("def f():\n    from tfrepro.b import g\n")
    (tmp_path / "b.py").write_text("import tfrepro.a\n")
    modules = {"tfrepro.a": tmp_path / "a.py", "tfrepro.b": tmp_path / "b.py"}
    assert _imports("tfrepro.a", modules["tfrepro.a"], modules) == {"tfrepro.b"}
    assert _imports("tfrepro.b", modules["tfrepro.b"], modules) == {"tfrepro.a"}


def test_nothing_low_imports_anything_high():
    graph = _graph()
    wrong = [f"{module} imports {target}" for module, targets in graph.items() for target in targets
             if _unit(target) != _unit(module) and _floor(target) >= _floor(module)]
    assert not wrong, wrong


def test_every_unit_has_a_floor_and_the_top_holds_only_a_handful_of_loose_modules():
    loose = {path.stem for path in ROOT.glob("*.py")}
    assert loose <= LOOSE_MODULES, loose - LOOSE_MODULES
    for module in _modules():
        _floor(module)  # raises StopIteration for a unit that has no floor


def test_every_subpackage_says_what_lives_there():
    for package in ROOT.iterdir():
        if (package / "__init__.py").is_file():
            docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
            assert docstring and len(docstring) > 80, package.name


def test_no_submodule_is_named_like_a_public_function():
    """The NVIDIA package's crash: ``pkg.name`` being a module in one place and a function in another."""
    for package_name in ("tfrepro", "tfrepro.ops", "tfrepro.determinism", "tfrepro.proof", "tfrepro.launching",
                         "tfrepro.cli", "tfrepro.examples"):
        package = importlib.import_module(package_name)
        submodules = {info.name for info in pkgutil.iter_modules(package.__path__)}
        for name in set(getattr(package, "__all__", ())) & submodules:
            assert getattr(package, name).__name__ == f"{package_name}.{name}", f"{package_name}.{name}"
    public_functions = {name for name in tfrepro.__all__ if callable(getattr(tfrepro, name, None))
                        and not isinstance(getattr(tfrepro, name), type)}
    module_names = {name.rpartition(".")[2] for name in _modules()}
    assert not public_functions & module_names


def _api_index_names() -> list[str]:
    section = API_INDEX.read_text()
    names = []
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names += [re.match(r"[\w.*]+", span).group(0) for span in re.findall(r"`([^`]+)`", first_cell)]
    return names


def test_every_name_in_the_docs_api_overview_resolves(keras):
    names = _api_index_names()
    assert len(names) >= 20, names
    for dotted in names:
        parts = dotted.removeprefix("tfrepro.").split(".")
        if parts[-1] == "*":
            module = getattr(tfrepro, parts[0])
            assert module.__all__
            for name in module.__all__:
                assert callable(getattr(module, name)), f"{dotted}: {name}"
            continue
        obj = tfrepro
        for part in parts:
            obj = getattr(obj, part)  # AttributeError names what does not resolve
        assert obj is not None, dotted


def test_contributing_names_every_module_in_its_row():
    """The layout table of CONTRIBUTING.md names each subpackage and each module file, in its row."""
    text = (ROOT.parent / "CONTRIBUTING.md").read_text()
    table = text.split("## How the code is laid out", 1)[1].split("\n## ", 1)[0]
    rows = {re.match(r"\| `([\w.]+/?)`", line).group(1): line for line in table.splitlines()
            if re.match(r"\| `[\w.]+/?`", line)}
    ground = next(line for line in table.splitlines() if line.startswith("| `_tf.py`"))
    missing = []
    for entry in sorted(ROOT.iterdir()):
        if entry.name.startswith("__") or entry.suffix not in (".py", ""):
            continue
        if entry.is_dir():
            row = rows.get(f"{entry.name}/")
            if row is None:
                missing.append(f"{entry.name}/")
                continue
            for module in sorted(entry.rglob("*.py")):
                if "__pycache__" in module.parts:
                    continue
                if module.name == "__init__.py":  # a nested package is named as `exact/`
                    if module.parent != entry and f"`{module.parent.name}/`" not in row:
                        missing.append(f"{entry.name}/{module.parent.name}/")
                elif f"`{module.name}`" not in row:
                    missing.append(str(module.relative_to(ROOT)))
        elif entry.name not in rows and f"`{entry.name}`" not in ground:
            missing.append(entry.name)
    assert not missing, f"CONTRIBUTING.md's layout table does not name: {missing}"
