"""The docs cannot rot: every Python and shell block of the README, CONTRIBUTING and ``docs/`` runs, as
written, or says why it does not; the runnable examples in the public docstrings run too.

A page's blocks run in order, in one fresh interpreter (Python blocks share its namespace, shell
blocks run in ``bash -e``), in a temporary folder, with this venv's ``python`` and ``tfrepro`` first on
``PATH``. The line before a block may say:

- ``<!-- file: NAME -->``: the block is the file ``NAME``, written there for later blocks;
- ``<!-- exits: N -->``: the block must exit with code ``N``;
- ``<!-- not run: REASON -->``: it is not run, for the reason given.

A page whose runnable blocks train (``fit``, or a ``tfrepro`` command that launches a training
script) is in the slow tier. The pages run on the Keras 3 legs (the docs' examples use ``tf.keras``,
which is tf-keras on the tf-keras legs; those legs run the same capabilities in their own tests).
"""

from __future__ import annotations

import doctest
import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import clean_env

ROOT = Path(__file__).resolve().parents[1]
CODE = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash", "console": "bash"}
MARKER = re.compile(r"<!--\s*(file|exits|not run):\s*(.*?)\s*-->")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^\s`{]*)")
TRAINS = re.compile(r"\.fit\(|\btfrepro (?:run|check|doctor|sweep|demo)\b|LoopCheckpoint|\.loop\(")


@dataclass
class Block:
    page: Path
    line: int
    language: str  # the fence's info string
    code: str
    marker: tuple[str, str] | None  # ("file" | "exits" | "not run", argument)

    @property
    def kind(self) -> str | None:
        """``python`` or ``bash`` for a code block, ``None`` for output, data and the like."""
        return CODE.get(self.language.lower())

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, each with the marker on the line before it, if any."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise AssertionError(f"{page}:{i + 1}: a code fence that never closes")
        code = textwrap.dedent("\n".join(line[len(indent):] if line.startswith(indent) else line
                                          for line in lines[i + 1:end])) + "\n"
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.fullmatch(before)
        found.append(Block(page, i + 1, opening["info"], code, (marker[1], marker[2]) if marker else None))
        i = end + 1
    return found


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.kind and not (b.marker and b.marker[0] == "not run")]


def test_every_code_block_runs_or_says_why_not():
    problems = []
    for page in pages():
        found = blocks(page)
        for block in found:
            if block.marker is None:
                continue
            kind, argument = block.marker
            if kind == "not run" and len(argument.split()) < 3:
                problems.append(f"{block.where}: `not run` needs a reason of a few words, not {argument!r}")
            if kind == "exits" and not argument.isdigit():
                problems.append(f"{block.where}: `exits` takes an exit code, not {argument!r}")
            if kind == "file" and not re.fullmatch(r"[\w./-]+", argument):
                problems.append(f"{block.where}: `file` takes a relative file name, not {argument!r}")
            if not block.kind and kind != "file":
                problems.append(f"{block.where}: a `{kind}` marker on a {block.language or 'plain'} block")
        # every marker must sit right before a block
        text = page.read_text().splitlines()
        marked_lines = {b.line for b in found if b.marker}
        for number, line in enumerate(text, 1):
            if MARKER.fullmatch(line.strip()):
                following = next((n for n in range(number + 1, len(text) + 1) if text[n - 1].strip()), None)
                if following not in marked_lines:
                    problems.append(f"{page.relative_to(ROOT)}:{number}: a marker with no block right after it")
    assert not problems, "\n".join(problems)
    assert sum(len(runnable(page)) for page in pages()) >= 20  # the check has something to check


def test_the_block_reader_sees_markers_and_indented_fences(tmp_path):
    """The negative control for the reader: a marked, an indented and an unmarked block."""
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- not run: a placeholder script -->\n```bash\ntfrepro run -- python x.py\n```\n\n"
                    "- item\n\n  ```python\n  print(1)\n  ```\n\n```text\noutput\n```\n")
    found = blocks(page)
    assert [(b.kind, b.marker, b.code) for b in found] == [
        ("bash", ("not run", "a placeholder script"), "tfrepro run -- python x.py\n"),
        ("python", None, "print(1)\n"),
        (None, None, "output\n"),
    ]


DRIVER = '''
import json, subprocess, sys
from pathlib import Path

namespace = {"__name__": "__main__"}
for step in json.loads(Path(sys.argv[1]).read_text()):
    print(f"--- {step['where']}", flush=True)
    if step["kind"] == "file":
        Path(step["name"]).parent.mkdir(parents=True, exist_ok=True)
        Path(step["name"]).write_text(step["code"])
    elif step["kind"] == "python":
        exec(compile(step["code"], step["where"], "exec"), namespace)
    else:
        code = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", step["code"]]).returncode
        if code != step["exits"]:
            sys.exit(f"{step['where']}: exited with {code}, the page says {step['exits']}")
'''


def _page_cases():
    for page in pages():
        steps = runnable(page)
        if not steps:
            continue
        slow = any(TRAINS.search(b.code) for b in steps)
        yield pytest.param(page, id=str(page.relative_to(ROOT)), marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("page", list(_page_cases()))
def test_page_runs_as_written(page, tmp_path):
    steps = []
    for block in runnable(page):
        kind, argument = block.marker or (None, None)
        steps.append({"where": block.where, "kind": "file" if kind == "file" else block.kind, "name": argument,
                      "code": block.code, "exits": int(argument) if kind == "exits" else 0})
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    (tmp_path / "driver.py").write_text(DRIVER)
    work = tmp_path / "work"
    work.mkdir()
    env = clean_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "steps.json")], cwd=work,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"


# Every module that defines a public name; the examples in their docstrings run as doctests.
PUBLIC_MODULES = ("tfrepro.checkpointing.callback", "tfrepro.checkpointing.loop", "tfrepro.data.augmentation",
                  "tfrepro.data.seeded_maps", "tfrepro.data.shuffling", "tfrepro.data.skipping",
                  "tfrepro.determinism.epochs", "tfrepro.determinism.patching", "tfrepro.determinism.reporting",
                  "tfrepro.determinism.seeding", "tfrepro.diagnosis.diagnosing", "tfrepro.diagnosis.findings",
                  "tfrepro.ops.kernel_facts", "tfrepro.plotting.figures", "tfrepro.proof.callback",
                  "tfrepro.proof.comparison", "tfrepro.proof.environment_info", "tfrepro.proof.fingerprints",
                  "tfrepro.proof.traces", "tfrepro.proof.verification", "tfrepro.sweeps.metrics",
                  "tfrepro.sweeps.running", "tfrepro.sweeps.statistics", "tfrepro.testing",
                  "tfrepro.tuning.keras_tuning", "tfrepro.tuning.racing", "tfrepro.tuning.script_tuning")


def test_the_doctest_list_holds_every_module_with_a_public_name(keras):
    from test_docstrings import public_objects

    homes = {getattr(value, "__module__", None) for value in public_objects().values()}
    homes = {home for home in homes if home and home.startswith("tfrepro.") and not home.startswith("tfrepro.ops.")
             and home != "tfrepro.errors"}
    assert homes <= set(PUBLIC_MODULES), homes - set(PUBLIC_MODULES)


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_docstring_examples(module_name, keras):
    module = importlib.import_module(module_name)
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0


def test_the_public_modules_carry_runnable_examples(keras):
    tried = sum(doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS).attempted
                for name in PUBLIC_MODULES)
    assert tried >= 20, tried


def test_the_readme_is_short_and_links_straight_to_the_four_questions():
    """At most 150 lines, and one click from the README: how to make a script multi-worker, how to
    resume, how to read a divergence report, what the exact tier covers."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    links = set(re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme))
    for page in ("docs/how-to/multi-worker.md", "docs/how-to/resume.md", "docs/how-to/read-a-divergence.md",
                 "docs/explanation/exact-tier.md"):
        assert page in links, page


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"],
                         ids=lambda p: p.name)
def test_every_relative_link_outside_the_site_resolves(page):
    """``mkdocs build --strict`` checks the links inside docs/; these files are read on the forge."""
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if not re.match(r"[a-z]+://", target):
            assert (page.parent / target).exists(), f"{page.name}: {target}"
