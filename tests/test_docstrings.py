"""Every public function and class documents itself in Google style, as the API reference renders it.

Public: the names of ``tfrepro.__all__``, ``tfrepro.ops``, ``tfrepro.data``, ``tfrepro.testing`` and
``tfrepro.layers``, and the public methods and properties their classes define. Each has a docstring;
one that takes arguments has an ``Args:`` section naming every one of them (a class: its
``__init__``'s); one that returns a value has ``Returns:`` (a generator: ``Yields:``); one whose own
code raises has ``Raises:``. The sections are found with the parser the docs site uses (griffe's
Google parser) where it is installed, and by their headings otherwise.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types

import pytest

import tfrepro

NAMESPACES = ("tfrepro", "tfrepro.ops", "tfrepro.data", "tfrepro.testing", "tfrepro.layers", "tfrepro.tuning")
# Names that are data or modules, not functions or classes.
NOT_DOCUMENTED_HERE = {"__version__"}


def public_objects() -> dict[str, object]:
    import importlib

    found: dict[str, object] = {}
    for namespace in NAMESPACES:
        module = importlib.import_module(namespace)
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
        for name in names:
            if name in NOT_DOCUMENTED_HERE:
                continue
            value = getattr(module, name)
            if isinstance(value, types.ModuleType):
                continue
            if inspect.isclass(value) and value.__module__.split(".")[0] != "tfrepro":
                continue  # a Keras/TF name re-exported by tfrepro.layers: not ours to document
            found[f"{namespace}.{name}"] = value
    return found


def sections(doc: str) -> dict[str, str]:
    """Google-style sections of ``doc``: heading -> its indented body."""
    found: dict[str, str] = {}
    current = None
    for line in inspect.cleandoc(doc).splitlines():
        heading = re.fullmatch(r"(Args|Arguments|Returns|Yields|Raises|Example|Examples|Attributes|Note|Notes):\s*", line)
        if heading:
            current = heading.group(1)
            found[current] = ""
        elif current and (line.startswith((" ", "\t")) or not line.strip()):
            found[current] += line + "\n"
        else:
            current = None
    return found


def documented_args(body: str) -> set[str]:
    return set(re.findall(r"^\s{2,4}\**([A-Za-z_][A-Za-z0-9_]*)(?:\s*\([^)]*\))?\s*:", body, flags=re.M))


def function_node(function) -> ast.FunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None
    tree = ast.parse(source)
    return next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)


def own_nodes(node: ast.AST):
    """The nodes of ``node``'s body, not of functions or classes defined inside it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield child
        yield from own_nodes(child)


def problems_of_function(qualname: str, function, *, params_from=None, doc=None) -> list[str]:
    doc = doc if doc is not None else inspect.getdoc(function)
    if not doc or not doc.strip():
        return [f"{qualname}: no docstring"]
    found = sections(doc)
    problems = []
    signature = inspect.signature(params_from or function)
    names = [p.name for p in signature.parameters.values() if p.name not in ("self", "cls")]
    if names:
        args = documented_args(found.get("Args", found.get("Arguments", "")))
        missing = [n for n in names if n not in args]
        if missing:
            problems.append(f"{qualname}: Args does not name {', '.join(missing)}")
    node = function_node(params_from or function)
    if node is not None and params_from is None:
        body = list(own_nodes(node))
        if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in body):
            if "Yields" not in found:
                problems.append(f"{qualname}: a generator without Yields")
        elif any(isinstance(n, ast.Return) and n.value is not None and not (isinstance(n.value, ast.Constant) and n.value.value is None)
                 for n in body) and "Returns" not in found:
            problems.append(f"{qualname}: returns a value without Returns")
    if node is not None:
        raises = [n for n in own_nodes(node) if isinstance(n, ast.Raise) and n.exc is not None]
        if raises and "Raises" not in found:
            problems.append(f"{qualname}: raises without Raises")
    return problems


def overrides_a_foreign_method(cls: type, name: str) -> bool:
    """A Keras hook (``call``, ``set_model``, ``on_epoch_end``, ...) that Keras documents."""
    return any(name in vars(base) for base in cls.__mro__[1:] if base.__module__.split(".")[0] != "tfrepro"
               and base is not object)


def problems_of(qualname: str, value) -> list[str]:
    if inspect.isclass(value):
        problems = []
        doc = inspect.getdoc(value)
        init = value.__dict__.get("__init__")
        if not doc:
            problems.append(f"{qualname}: no docstring")
        elif init is not None and not getattr(value, "__dataclass_fields__", None):
            problems += problems_of_function(qualname, init, doc=doc + "\n\n" + (inspect.getdoc(init) or ""))
        elif getattr(value, "__dataclass_fields__", None):
            fields = [n for n in value.__dataclass_fields__ if not n.startswith("_")]
            documented = documented_args(sections(doc).get("Attributes", "") + sections(doc).get("Args", ""))
            missing = [n for n in fields if n not in documented]
            if missing:
                problems.append(f"{qualname}: Attributes does not name {', '.join(missing)}")
        for name, member in vars(value).items():
            if name.startswith("_") or overrides_a_foreign_method(value, name):
                continue
            if isinstance(member, property):
                if not (member.__doc__ or "").strip():
                    problems.append(f"{qualname}.{name}: a property without a docstring")
            elif isinstance(member, (staticmethod, classmethod)):
                problems += problems_of_function(f"{qualname}.{name}", member.__func__)
            elif inspect.isfunction(member):
                problems += problems_of_function(f"{qualname}.{name}", member)
        return problems
    if callable(value):
        return problems_of_function(qualname, value)
    return []


def test_every_public_function_and_class_documents_args_returns_and_raises(keras):
    seen: set[int] = set()
    problems = []
    for qualname, value in sorted(public_objects().items(), key=lambda item: (item[0].count("."), item[0])):
        if id(value) not in seen:  # tfrepro.testing.verify is tfrepro.verify: checked once, under the shorter name
            seen.add(id(value))
            problems += problems_of(qualname, value)
    assert not problems, f"{len(problems)} docstring problem(s):\n" + "\n".join(problems)


def test_the_checker_finds_a_missing_argument_a_return_and_a_raise():
    """The negative control: a docstring without its sections is caught, one with them passes."""

    def bare(a, b=1):
        """Does something."""
        if a:
            raise ValueError("a")
        return a + b

    def documented(a, b=1):
        """Does something.

        Args:
            a: the first.
            b (int): the second.

        Returns:
            The sum.

        Raises:
            ValueError: when ``a`` is true.
        """
        if a:
            raise ValueError("a")
        return a + b

    assert problems_of("bare", bare) == ["bare: Args does not name a, b", "bare: returns a value without Returns",
                                         "bare: raises without Raises"]
    assert problems_of("documented", documented) == []
