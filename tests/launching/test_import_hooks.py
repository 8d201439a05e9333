"""`tfrepro run` applies the TensorFlow half of patch() when the script imports TensorFlow: never
before (a script without TensorFlow stays fast), never after its next line."""

import subprocess
import sys

import pytest

from tfrepro._import_hooks import call_after_import

from conftest import clean_env, run_tfrepro


@pytest.fixture
def package(tmp_path, monkeypatch):
    (tmp_path / "hooked_pkg").mkdir()
    (tmp_path / "hooked_pkg" / "__init__.py").write_text("VALUE = 41\nVALUE += 1\n")
    (tmp_path / "hooked_pkg" / "data.txt").write_text("resource")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "hooked_pkg"
    sys.modules.pop("hooked_pkg", None)


def test_the_hook_runs_once_right_after_the_module_executed(package):
    seen = []
    call_after_import({package: lambda module: seen.append(module.VALUE)})
    assert seen == []
    import hooked_pkg  # noqa: F401

    assert seen == [42]  # the whole module had run, and nothing of the importer after it yet
    assert type(hooked_pkg.__loader__).__name__ != "_CallAfterLoading"  # the real loader is back
    from importlib import resources

    assert resources.files(package).joinpath("data.txt").read_text() == "resource"
    sys.modules.pop(package)
    import hooked_pkg  # noqa: F401,F811  (a second import: the hook does not run again)

    assert seen == [42]


def test_looking_a_module_up_without_importing_it_keeps_the_hook(package):
    import importlib.util

    seen = []
    call_after_import({package: lambda module: seen.append(module.VALUE)})
    assert importlib.util.find_spec(package) is not None  # "is it installed?": loads nothing
    assert seen == []
    import hooked_pkg  # noqa: F401

    assert seen == [42]


def test_a_module_already_imported_is_hooked_at_once(package):
    import hooked_pkg  # noqa: F401

    seen = []
    call_after_import({package: lambda module: seen.append(module.__name__)})
    assert seen == [package]


def test_a_module_still_executing_gets_its_hook_before_its_importer_goes_on(tmp_path, monkeypatch):
    # Keras 3 imports TensorFlow halfway through its own import: a hook asked for then on a Keras
    # module that is still executing runs at the first import statement after it has finished.
    import builtins

    (tmp_path / "outer_pkg").mkdir()
    (tmp_path / "outer_pkg" / "__init__.py").write_text(
        "from outer_pkg import inner\nimport json\nSEEN_BEFORE_NEXT_LINE = list(inner.SEEN)\n")
    (tmp_path / "outer_pkg" / "inner.py").write_text(
        "from tfrepro._import_hooks import call_after_import\nSEEN = []\n"
        "call_after_import({'outer_pkg.inner': lambda module: SEEN.append(module.VALUE)})\nVALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    original = builtins.__import__
    try:
        import outer_pkg

        assert outer_pkg.SEEN_BEFORE_NEXT_LINE == [7]  # the whole module had run; the hook ran once
        assert builtins.__import__ is original  # nothing is left wrapped
    finally:
        builtins.__import__ = original
        for name in ("outer_pkg", "outer_pkg.inner"):
            sys.modules.pop(name, None)


def test_a_failing_hook_fails_the_import(package):
    def broken(module):
        raise RuntimeError("hook failed")

    call_after_import({package: broken})
    with pytest.raises(RuntimeError, match="hook failed"):
        import hooked_pkg  # noqa: F401


def test_run_on_a_script_without_tensorflow_never_imports_it(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import random, sys\nprint(random.random(), 'tensorflow' in sys.modules, 'numpy' in sys.modules)\n")
    outputs = {run_tfrepro("run", "--seed", "4", "--", sys.executable, str(script)).stdout for _ in range(2)}
    assert len(outputs) == 1 and outputs.pop().split()[1:] == ["False", "False"]
    import random

    assert run_tfrepro("run", "--seed", "4", "--", sys.executable, str(script)).stdout.split()[0] == \
        repr(random.Random(4).random())  # seeded before the first line


@pytest.mark.parametrize("first", ["tensorflow", pytest.param("keras", marks=pytest.mark.slow)])
def test_tensorflow_imported_mid_script_is_patched_before_the_next_line(tmp_path, first):
    script = tmp_path / "late.py"
    script.write_text(
        "import random\n"
        "head = random.random()\n"
        f"import {first}\n"
        "import tensorflow as tf\n"
        "from tfrepro import _tf, status\n"
        "print(head, _tf.op_determinism_enabled(), status()['seeds'].value, float(tf.random.uniform([])),"
        " random.random())\n")
    outputs = [run_tfrepro("run", "--seed", "9", "--", sys.executable, str(script)) for _ in range(2)]
    assert outputs[0].returncode == 0, outputs[0].stderr[-2000:]
    assert outputs[0].stdout == outputs[1].stdout
    head, determinism, *seeded = outputs[0].stdout.split()[:5]
    assert determinism == "True" and seeded[:3] == ["seeded", "with", "9"]
    plain = subprocess.run([sys.executable, str(script)], env=clean_env(), capture_output=True, text=True)
    assert plain.stdout.split()[1] == "False"  # the control: nothing turns it on by itself


def test_a_script_that_patches_itself_keeps_its_own_seed_and_onednn_is_not_called_late(tmp_path):
    script = tmp_path / "own_patch.py"
    script.write_text(
        "import warnings, tfrepro\n"
        "warnings.simplefilter('error', tfrepro.ReproducibilityWarning)  # any of tfrepro's would end the script\n"
        "tfrepro.patch(42)\n"
        "import os, tensorflow as tf\n"
        "print(tfrepro.status()['seeds'].value, os.environ['PYTHONHASHSEED'])\n")
    proc = run_tfrepro("run", "--seed", "42", "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-4:] == ["seeded", "with", "42", "42"]
    script.write_text(
        "import warnings, tfrepro\n"
        "warnings.simplefilter('error', tfrepro.ReproducibilityWarning)\n"
        "import tensorflow as tf\n"
        "from tfrepro import status\n"
        "print(status()['oneDNN'].value)\n")
    proc = run_tfrepro("run", "--onednn", "off", "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]  # no "onednn= cannot change oneDNN" warning
    assert proc.stdout.split()[-1] == "off"
