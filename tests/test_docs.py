"""The runnable examples in the public docstrings run and show what they claim."""

import doctest
import re
from pathlib import Path

import pytest

import tfrepro


@pytest.mark.parametrize("module_name", ["tfrepro.determinism.seeding", "tfrepro.proof.callback", "tfrepro.proof.fingerprints",
                                         "tfrepro.ops.kernel_facts", "tfrepro.data.seeded_maps",
                                         "tfrepro.data.skipping"])
def test_docstring_examples(module_name, keras):
    import importlib

    module = importlib.import_module(module_name)
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0


README = Path(__file__).parent.parent / "README.md"


def readme_snippet(section: str, containing: str) -> str:
    """The first ```python block of README section ``section`` that contains ``containing``, verbatim."""
    text = README.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return next(block for block in blocks if containing in block)


def test_readme_callback_snippet_runs_as_written(keras, tmp_path, monkeypatch, capsys):
    """The snippet, run verbatim after the setup a reader has: tfrepro.patch, data, a model builder."""
    import numpy as np

    import tfrepro

    snippet = readme_snippet("Prove it: record, compare, check", "ReproducibilityCallback")
    monkeypatch.chdir(tmp_path)
    tfrepro.patch(42)
    x = np.random.RandomState(0).rand(64, 4).astype("float32")

    def build_model():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    exec(compile(snippet, "README.md", "exec"), {"tfrepro": tfrepro, "build_model": build_model, "x": x,
                                                 "y": x.sum(axis=1, keepdims=True)})
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    expected = re.search(r"^# (.*)$", snippet.split("print(", 1)[1], flags=re.M).group(1)
    assert re.fullmatch(re.escape(expected).replace("N", r"\d+"), printed), (printed, expected)


def test_readme_keyed_init_snippet_runs_as_written(keras):
    snippet = readme_snippet("Keyed randomness: every draw is keyed by what it is for", "init=")
    try:
        exec(compile(snippet, "README.md", "exec"), {})
        assert tfrepro.status()["randomness"].value.endswith("(init='keyed')")
    finally:
        tfrepro.unpatch()
