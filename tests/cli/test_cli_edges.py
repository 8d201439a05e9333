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
                                    ["--on-uncovered", "warn"]])
def test_no_patch_refuses_the_options_of_the_patch(capsys, script, verb, option):
    err = _usage_error(capsys, verb, "--no-patch", *option, "--", sys.executable, script)
    assert f"so {option[0]} would do nothing" in err


@pytest.mark.parametrize("verb", ["run", "check", "doctor"])
def test_on_uncovered_needs_the_exact_tier_and_one_of_its_values(capsys, script, verb):
    err = _usage_error(capsys, verb, "--on-uncovered", "warn", "--", sys.executable, script)
    assert "--on-uncovered is what the exact tier's audit does with the ops it names: it needs --ops exact" in err
    err = _usage_error(capsys, verb, "--ops", "exact", "--on-uncovered", "ignore", "--", sys.executable, script)
    assert "--on-uncovered: invalid choice: 'ignore'" in err


def test_a_directory_given_as_the_script_is_named_a_directory_unless_python_runs_it(capsys, tmp_path):
    err = _usage_error(capsys, "run", "--", sys.executable, str(tmp_path))
    assert f"{tmp_path} is a directory without a __main__.py, not a script" in err
    app = tmp_path / "app"
    app.mkdir()
    (app / "helper.py").write_text("WORD = 'ran'\n")
    (app / "__main__.py").write_text("import helper\nprint(helper.WORD)\n")  # sys.path[0] is the folder itself
    proc = run_tfrepro("run", "--", sys.executable, str(app))
    assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr


def test_an_empty_seed_list_is_refused_not_replaced_by_the_default(capsys, script):
    err = _usage_error(capsys, "sweep", "--seeds", "", "--", sys.executable, script)
    assert "--seeds: '' is not a seed or a range" in err


def test_sweep_merge_names_itself(capsys, tmp_path):
    err = _usage_error(capsys, "sweep", "merge", str(tmp_path / "nonexistent"))
    assert err.startswith("tfrepro sweep merge: error:") and "`tfrepro sweep merge --help`" in err


def test_the_scripts_own_arguments_are_left_alone_without_a_separator(tmp_path):
    script = tmp_path / "argv.py"
    script.write_text("import sys\nprint(sys.argv[1:])\n")
    for args in (["--ops", "adam"], ["--ops", "exact"], ["--lr", "1", "--ops=fast"]):
        proc = run_tfrepro("run", sys.executable, str(script), *args)
        assert proc.returncode == 0 and proc.stdout == f"{args}\n", proc.stderr


def test_an_error_before_the_command_names_the_subcommand(capsys, script):
    err = _usage_error(capsys, "--ops", "banana", "run", "--", sys.executable, script)
    assert err.startswith("tfrepro run: error: --ops takes no value but exact")


def test_no_patch_keeps_onednn_an_environment_variable_applies_without_it():
    from tfrepro.launching.config import LaunchConfig

    assert LaunchConfig(patch=False, onednn=False).to_env({})["TF_ENABLE_ONEDNN_OPTS"] == "0"


def test_the_command_may_still_follow_ops_without_a_separator(script):
    proc = run_tfrepro("run", "--ops", sys.executable, script)  # --ops, then the command: not a value of --ops
    assert proc.returncode == 0 and proc.stdout == "trained\n", proc.stderr
