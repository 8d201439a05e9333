"""User errors at the CLI's edges: each is one line on stderr that names the mistake and the fix,
with exit code 2, before anything runs (in-process: none of these reaches TensorFlow)."""

import sys

import pytest

from tfrepro.cli.commands import main

from conftest import run_tfrepro

pytestmark = pytest.mark.core


def _usage_error(capsys, *argv: str) -> str:
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('trained')\n")
    return str(path)


@pytest.mark.parametrize("argv", [["--ops", "banana", "--"], ["--ops=banana", "--"]])
def test_a_value_of_ops_other_than_exact_is_named(capsys, script, argv):
    err = _usage_error(capsys, "run", *argv, sys.executable, script)
    assert "--ops takes no value but exact" in err and "'banana'" in err and "tfrepro run:" in err


def test_conflicting_ops_options_are_named_as_the_user_wrote_them(capsys, script):
    err = _usage_error(capsys, "run", "--ops", "exact", "--no-ops", "--", sys.executable, script)
    assert "--no-ops: not allowed with argument --ops exact" in err and "--ops-exact" not in err


@pytest.mark.parametrize("verb", ["check", "doctor"])
@pytest.mark.parametrize("option", [["--ops", "exact"], ["--ops"], ["--init", "keyed"], ["--threads", "1"],
                                    ["--onednn", "off"]])
def test_no_patch_refuses_the_options_of_the_patch(capsys, script, verb, option):
    err = _usage_error(capsys, verb, "--no-patch", *option, "--", sys.executable, script)
    assert f"so {option[0]} would do nothing" in err


def test_a_directory_given_as_the_script_is_named_a_directory(capsys, tmp_path):
    err = _usage_error(capsys, "run", "--", sys.executable, str(tmp_path))
    assert f"{tmp_path} is a directory, not a script" in err


def test_an_empty_seed_list_is_refused_not_replaced_by_the_default(capsys, script):
    err = _usage_error(capsys, "sweep", "--seeds", "", "--", sys.executable, script)
    assert "--seeds: '' is not a seed or a range" in err


def test_sweep_merge_names_itself(capsys, tmp_path):
    err = _usage_error(capsys, "sweep", "merge", str(tmp_path / "nonexistent"))
    assert err.startswith("tfrepro sweep merge: error:") and "`tfrepro sweep merge --help`" in err


def test_the_command_may_still_follow_ops_without_a_separator(script):
    proc = run_tfrepro("run", "--ops", sys.executable, script)  # --ops, then the command: not a value of --ops
    assert proc.returncode == 0 and proc.stdout == "trained\n", proc.stderr
