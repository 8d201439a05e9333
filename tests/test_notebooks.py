"""The teaching notebooks run top to bottom, and their own assertions hold."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each notebook trains in a fresh kernel

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def _files(folder):
    return sorted(p.relative_to(folder) for p in folder.rglob("*"))


# A notebook that starts localhost clusters is a multi-worker test too (`-m workers`).
PARAMS = [pytest.param(p, marks=pytest.mark.workers) if '"--workers"' in p.read_text() else p for p in NOTEBOOKS]


@pytest.mark.parametrize("path", PARAMS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_where_it_stands_and_leaves_nothing(path, tmp_path, monkeypatch):
    """Run in notebooks/, as a reader runs it; its temporary folders (and those of what it starts)
    go to a private TMPDIR, which must be empty afterwards, as notebooks/ must be as it was."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    before = _files(path.parent)
    notebook = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert _files(path.parent) == before
    assert _files(tmp_path) == []


def test_there_are_notebooks():
    assert NOTEBOOKS
