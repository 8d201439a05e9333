"""The test tiers hold together: the default tier (plain ``python -m pytest``) leaves out every test
that starts a training process, yet still exercises every public name and every CLI command; and
``.ci/run`` runs the legs CONTRIBUTING lists.

Read statically (no TensorFlow, no test run), so a test marked wrongly fails here in a second.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import tfrepro

pytestmark = [pytest.mark.core, pytest.mark.keras]

TESTS = Path(__file__).parent
ROOT = TESTS.parent
# What starts a process: the conftest helpers, subprocess, a notebook kernel.
LAUNCHERS = {"run_python", "run_tfrepro", "Popen", "NotebookClient"}
# A training workload, named in a launched command: a script of tests/scripts that trains, the zoo, the
# bundled example, or a script written on the spot that calls fit or applies gradients.
TRAINING_SCRIPTS = {path.name for path in (TESTS / "scripts").glob("*.py")
                    if re.search(r"\.fit\(|apply_gradients|GradientTape", path.read_text())}
TRAINING_WORDS = ("demo", "mnist_cnn", "zoo.py", ".fit(", "apply_gradients", "GradientTape", *TRAINING_SCRIPTS)


@dataclass
class _Test:
    module: str
    name: str
    slow: bool
    trains: bool = False                             # launches a process that trains
    names: set[str] = field(default_factory=set)     # every attribute reached, and every name imported
    strings: set[str] = field(default_factory=set)   # every string constant reached


def _marks(decorators: list[ast.expr]) -> set[str]:
    """The ``pytest.mark.X`` names among decorators or in a ``pytestmark`` value."""
    found = set()
    for node in decorators:
        params = [sub for sub in ast.walk(node) if isinstance(sub, ast.Call) and getattr(sub.func, "attr", "") == "param"]
        inside_params = {id(sub) for param in params for sub in ast.walk(param)}  # a mark of one case, not the test's
        for sub in ast.walk(node):
            if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark"
                    and id(sub) not in inside_params):
                found.add(sub.attr)
    return found


def _callee(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "subprocess":
        return func.attr if func.attr in ("run", "Popen") else ""
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def _runs_a_command(call: ast.Call) -> bool:
    """Whether a launch runs the command it is given: ``tfrepro compare``, ``env`` or ``status`` only
    read their arguments."""
    if _callee(call) != "run_tfrepro" or not call.args or not isinstance(call.args[0], ast.Constant):
        return True
    return call.args[0].value in ("run", "check", "doctor", "sweep", "demo")


class _Module:
    """One test file: its module-level definitions, and what each test reaches through them."""

    def __init__(self, path: Path):
        self.tree = ast.parse(path.read_text(), str(path))
        self.definitions: dict[str, ast.AST] = {}
        self.marks: set[str] = set()
        self.imported = {alias.asname or alias.name for node in self.tree.body if isinstance(node, ast.ImportFrom)
                         for alias in node.names}
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                self.definitions[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        self.definitions[target.id] = node.value
                        if target.id == "pytestmark":
                            self.marks = _marks([node.value])

    def strings(self, node: ast.AST, local: dict[str, list[ast.AST]], seen: set[str]) -> set[str]:
        """The string constants an expression is made of, its names resolved (locals, then constants)."""
        found = set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                found.add(sub.value)
            elif isinstance(sub, ast.Name) and sub.id not in seen:
                seen.add(sub.id)
                values = local.get(sub.id) or [self.definitions.get(sub.id)]
                for value in values:
                    if value is not None and not isinstance(value, ast.FunctionDef):
                        found |= self.strings(value, local, seen)
        return found

    def trains(self, function: ast.FunctionDef, seen: set[str]) -> bool:
        """Whether ``function``, or a helper or fixture of this module it reaches, launches a
        process whose command names a training workload."""
        local: dict[str, list[ast.AST]] = {}
        for sub in ast.walk(function):
            if isinstance(sub, (ast.Assign, ast.For)):
                for target in sub.targets if isinstance(sub, ast.Assign) else [sub.target]:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            local.setdefault(name.id, []).append(sub.value if isinstance(sub, ast.Assign) else sub.iter)
            elif isinstance(sub, ast.Call) and _callee(sub) == "write_text" and isinstance(sub.func, ast.Attribute):
                written = sub.func.value  # script.write_text(TEXT): `script` names TEXT
                if isinstance(written, ast.Name):
                    local.setdefault(written.id, []).extend(sub.args)
        for sub in ast.walk(function):
            if isinstance(sub, ast.Call) and _callee(sub) in LAUNCHERS | {"run"} and _runs_a_command(sub):
                said = set().union(*(self.strings(arg, local, set()) for arg in [*sub.args, *sub.keywords]))
                if any(word in text for text in said for word in TRAINING_WORDS):
                    return True
        helpers = {arg.arg for arg in function.args.args}
        helpers |= {_callee(sub) for sub in ast.walk(function) if isinstance(sub, ast.Call)}
        for name in sorted(helpers - seen):
            seen.add(name)
            helper = self.definitions.get(name)
            if isinstance(helper, ast.FunctionDef) and self.trains(helper, seen):
                return True
        return False

    def reached(self, function: ast.FunctionDef, test: _Test, seen: set[str]) -> None:
        for sub in ast.walk(function):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                test.strings.add(sub.value)
            elif isinstance(sub, ast.ImportFrom):
                test.names |= {alias.asname or alias.name for alias in sub.names}
            elif isinstance(sub, ast.Name):
                if sub.id in self.imported:
                    test.names.add(sub.id)
                if sub.id not in seen and sub.id in self.definitions:
                    seen.add(sub.id)
                    self.reached(self.definitions[sub.id], test, seen)
            elif isinstance(sub, ast.Attribute):
                test.names.add(sub.attr)
        if isinstance(function, ast.FunctionDef):
            for arg in function.args.args:  # fixtures of this module
                if arg.arg not in seen and arg.arg in self.definitions:
                    seen.add(arg.arg)
                    self.reached(self.definitions[arg.arg], test, seen)


def _tests() -> Iterator[_Test]:
    for path in sorted(TESTS.rglob("test_*.py")):
        module = _Module(path)
        for node in module.tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                test = _Test(str(path.relative_to(ROOT)), node.name, "slow" in module.marks | _marks(node.decorator_list),
                             trains=module.trains(node, set()))
                module.reached(node, test, set())
                yield test


TESTS_FOUND = list(_tests())


def test_the_tiers_are_found():
    assert len(TESTS_FOUND) > 300 and TRAINING_SCRIPTS >= {"unmodified.py", "train_cnn.py", "culprit_fit.py"}
    assert any(t.trains for t in TESTS_FOUND)  # the rule below can fire


def test_every_test_that_starts_a_training_process_is_marked_slow():
    unmarked = [f"{t.module}::{t.name}" for t in TESTS_FOUND if t.trains and not t.slow]
    assert not unmarked, "start a training process but are not marked slow (the default tier must not):\n" + \
        "\n".join(unmarked)


def _public_names() -> dict[str, set[str]]:
    """The public API by namespace, less the result types: a class that only comes back from another
    public name (``compare`` returns a ``Comparison``, whose ``divergence`` is a ``Divergence``) is
    exercised through it."""
    import inspect

    import tfrepro.data
    import tfrepro.ops
    import tfrepro.testing
    import tfrepro.tuning

    spaces = {"tfrepro": (tfrepro, set(tfrepro.__all__) - {"__version__", "data", "ops", "layers", "testing", "tuning"}),
              "tfrepro.ops": (tfrepro.ops, set(tfrepro.ops.__all__)),
              "tfrepro.data": (tfrepro.data, set(tfrepro.data.__all__)),
              "tfrepro.tuning": (tfrepro.tuning, set(tfrepro.tuning.__all__)),
              "tfrepro.testing": (tfrepro.testing, {n for n in vars(tfrepro.testing) if n.startswith("assert_")})}
    objects = {name: getattr(module, name) for module, names in spaces.values() for name in names}
    annotations = " ".join(str(inspect.signature(obj).return_annotation) if inspect.isfunction(obj)
                           else str(getattr(obj, "__annotations__", "")) for obj in objects.values())
    results = {name for name, obj in objects.items() if inspect.isclass(obj) and re.search(rf"\b{name}\b", annotations)}
    return {where: names - results for where, (module, names) in spaces.items()}


def test_the_default_tier_exercises_every_public_name_and_cli_command():
    """Every name of the public API is used by a test of the default tier, and every CLI command is
    run there (its bad input at least)."""
    fast_names = set().union(*(t.names for t in TESTS_FOUND if not t.slow))
    fast_strings = set().union(*(t.strings for t in TESTS_FOUND if not t.slow))
    missing = {where: sorted(names - fast_names) for where, names in _public_names().items()}
    assert not any(missing.values()), f"public names no default-tier test uses: {missing}"
    from tfrepro.cli.commands import build_parser

    commands = next(action for action in build_parser()._actions if action.dest == "cmd").choices
    assert set(commands) - fast_strings == set(), "CLI commands no default-tier test runs"


def _legs_in_ci() -> list[str]:
    return re.findall(r"^\s*(?:\S+=\S+ )*leg (\S+)", (ROOT / ".ci" / "run").read_text(), flags=re.M)


def test_contributing_and_ci_agree_on_the_legs():
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    table = contributing.split("\n## Testing\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| (\S+?):", table, flags=re.M)
    assert listed == _legs_in_ci() and listed
    assert f"runs the {len(listed)} CI legs" in " ".join(table.split())
