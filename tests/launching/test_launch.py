"""`tfrepro run`: command rewriting, exit codes, Ctrl-C, and bad input without tracebacks."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tfrepro.errors import LaunchError
from tfrepro.launching.command import BOOTSTRAP, bootstrap_command
from tfrepro.launching.config import ENV_NAMES, LaunchConfig

from conftest import SCRIPTS, clean_env, run_tfrepro

pytestmark = pytest.mark.core
BOOT = ["-c", BOOTSTRAP]


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def test_rewrites_python_commands_to_run_through_the_bootstrap(script):
    py = sys.executable
    assert bootstrap_command([py, script, "--lr", "1"]) == [py, *BOOT, script, "--lr", "1"]
    assert bootstrap_command([py, "-u", "-W", "error", script]) == [py, "-u", "-W", "error", *BOOT, script]
    assert bootstrap_command([py, "-m", "pkg.train", "-x"]) == [py, *BOOT, "--module", "pkg.train", "-x"]
    assert bootstrap_command([py, "-c", "print(1)", "a"]) == [py, *BOOT, "--code", "print(1)", "a"]
    assert bootstrap_command([script, "a"]) == [sys.executable, *BOOT, script, "a"]


@pytest.mark.parametrize("command, message", [
    ([], "no command"),
    (["bash", "x.sh"], "not a Python interpreter"),
    ([sys.executable, "missing_script.py"], "script not found"),
    ([sys.executable], "no script"),
    ([sys.executable, "-m"], "needs an argument"),
    (["python9.9", "x.py"], "interpreter not found"),
])
def test_unlaunchable_commands_raise_launch_error(command, message):
    with pytest.raises(LaunchError, match=message):
        bootstrap_command(command)


def test_option_clusters_and_attached_values_are_parsed_as_python_parses_them(script):
    py = sys.executable
    assert bootstrap_command([py, "-Werror::ImportWarning", script]) == [py, "-Werror::ImportWarning", *BOOT, script]
    assert bootstrap_command([py, "-X", "importtime", script]) == [py, "-X", "importtime", *BOOT, script]
    assert bootstrap_command([py, "-uW", "error", script]) == [py, "-uW", "error", *BOOT, script]
    assert bootstrap_command([py, "-uc", "print(1)", "a"]) == [py, "-u", *BOOT, "--code", "print(1)", "a"]
    assert bootstrap_command([py, "-Bmpkg.train", "a"]) == [py, "-B", *BOOT, "--module", "pkg.train", "a"]
    assert bootstrap_command([py, "-mIPython"]) == [py, *BOOT, "--module", "IPython"]  # not -I
    assert bootstrap_command([py, "-c", "import sys; sys.exit('E')"]) == [py, *BOOT, "--code", "import sys; sys.exit('E')"]
    assert bootstrap_command([py, "-u", "--", script, "-x"]) == [py, "-u", *BOOT, script, "-x"]


@pytest.mark.parametrize("flag, value", [("-E", "5"), ("-I", "5")])
def test_a_hash_seed_the_interpreter_ignored_is_never_claimed(flag, value):
    code = "from tfrepro.determinism import reporting, state; print(state.STARTUP_HASHSEED, '|', reporting.status()['PYTHONHASHSEED'])"
    proc = subprocess.run([sys.executable, flag, "-c", code], env=clean_env(PYTHONHASHSEED=value),
                          capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("None | [!!] PYTHONHASHSEED: ignored (python -E or -I)")
    plain = subprocess.run([sys.executable, "-c", code], env=clean_env(PYTHONHASHSEED=value),
                           capture_output=True, text=True, check=True)
    assert plain.stdout.startswith("5 | [ok] PYTHONHASHSEED: 5")  # the control: honoured when not ignored
    changed = "import os; os.environ['PYTHONHASHSEED'] = '0'\n" + code.replace("; ", "\n", 1)
    late = subprocess.run([sys.executable, "-c", changed], env=clean_env(PYTHONHASHSEED=value),
                          capture_output=True, text=True, check=True)
    assert late.stdout.startswith("None |")  # set to 0 after start-up: not what the interpreter used


def test_child_env_sets_what_must_precede_interpreter_start():
    env = LaunchConfig(seed=9, threads=2, onednn=False).to_env(base={"TF_DETERMINISTIC_OPS": "0"})
    assert env["PYTHONHASHSEED"] == "9" and env["TF_DETERMINISTIC_OPS"] == "1"
    assert env["TF_ENABLE_ONEDNN_OPTS"] == "0" and env[ENV_NAMES["threads"]] == "2"
    unpatched = LaunchConfig(seed=9, patch=False).to_env(base={})
    assert "PYTHONHASHSEED" not in unpatched and unpatched[ENV_NAMES["patch"]] == "0"


@pytest.mark.parametrize("config", [
    LaunchConfig(),
    LaunchConfig(seed=2**32 - 1, threads=3, onednn=True, ops="all", trace_dir="/tmp/x y", gradients=True),
    LaunchConfig(seed=7, onednn=False, patch=False),
    LaunchConfig(seed=1, init="keyed"),
    LaunchConfig(seed=4, ops="exact"),
])
def test_launch_config_round_trips_through_the_child_environment(config):
    assert LaunchConfig.from_env(config.to_env(base={})) == config


def test_stale_protocol_variables_never_leak_into_the_child():
    stale = {name: "junk" for name in ENV_NAMES.values()}
    env = LaunchConfig(seed=1).to_env(base={**stale, "HOME": "/h"})
    assert LaunchConfig.from_env(env) == LaunchConfig(seed=1) and env["HOME"] == "/h"
    assert not {ENV_NAMES[name] for name in ("threads", "onednn", "trace_dir")} & set(env)


@pytest.mark.parametrize("args, message", [
    (["run", "--", sys.executable, "missing_script.py"], "script not found: missing_script.py"),
    (["run"], "no command given"),
    (["run", "--seed", "-3", "--", sys.executable, "-c", "1"], "--seed must be an int"),
    (["run", "--seed", "abc", "--", sys.executable, "-c", "1"], "invalid int value"),
    (["run", "--onednn", "maybe", "--", sys.executable, "-c", "1"], "expected on or off"),
    (["frobnicate"], "invalid choice"),
    (["check"], "no command given; usage: tfrepro check [options] -- python train.py"),
    (["check", "--runs", "1", "--", sys.executable, "-c", "1"], "--runs must be at least 2"),
    (["demo", "--bogus"], "unrecognized arguments: --bogus (see `tfrepro demo --help`)"),
    (["compare", "a.jsonl"], "the following arguments are required: b (see `tfrepro compare --help`)"),
])
def test_user_errors_exit_2_with_one_clear_line_and_no_traceback(args, message, tmp_path):
    proc = run_tfrepro(*args, env=clean_env(TMPDIR=str(tmp_path)))
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""  # one line, nothing else
    assert f"(see `tfrepro {args[0]} --help`)" in proc.stderr or args[0] == "frobnicate"
    assert not list(tmp_path.iterdir())  # validated before any temporary folder is made


def test_the_launcher_is_not_shadowed_by_a_tfrepro_folder_in_the_working_directory(tmp_path):
    """From a clone's parent folder, `tfrepro` there is the clone, which Python would import first
    as a namespace package; the child must still get the installed tfrepro."""
    (tmp_path / "tfrepro").mkdir()
    (tmp_path / "tfrepro" / "README.md").write_text("a clone\n")
    (tmp_path / "mymodule.py").write_text("import tfrepro\nprint('module', tfrepro.patch.__module__)\n")
    launcher = Path(sys.executable).with_name("tfrepro")
    code = "import sys, tfrepro; print('code', tfrepro.patch.__module__, repr(sys.path[0]))"
    for command, expected in ([sys.executable, "-c", code], "code tfrepro.determinism.patching ''"), \
                             ([sys.executable, "-m", "mymodule"], "module tfrepro.determinism.patching"):
        proc = subprocess.run([str(launcher), "run", "--", *command], cwd=tmp_path, env=clean_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip().splitlines()[-1] == expected


def test_exit_code_and_arguments_pass_through(tmp_path):
    script = tmp_path / "exit.py"
    script.write_text("import sys, os\nprint(sys.argv[1:], os.environ['PYTHONHASHSEED'])\nsys.exit(7)\n")
    proc = run_tfrepro("run", "--seed", "11", "--", sys.executable, str(script), "a", "--b")
    assert proc.returncode == 7, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "['a', '--b'] 11"


def test_ctrl_c_reaches_the_script():
    proc = subprocess.Popen([sys.executable, "-m", "tfrepro", "run", "--", sys.executable, str(SCRIPTS / "wait_for_ctrl_c.py")],
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3
    assert "interrupted" in out


def test_a_python_on_path_without_tfrepro_is_named_before_anything_runs(tmp_path):
    """`.venv/bin/tfrepro check -- python train.py` with the venv not activated: `python` is another
    interpreter, where the child would die of ModuleNotFoundError."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "other")], check=True)
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    env = clean_env(PATH=f"{tmp_path / 'other' / 'bin'}{os.pathsep}{os.environ['PATH']}", TMPDIR=str(tmp_path))
    before = set(tmp_path.iterdir())
    for verb in ("run", "check"):
        proc = run_tfrepro(verb, "--", "python", str(script), env=env)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.splitlines() == [
            f"tfrepro {verb}: error: `python` is {tmp_path / 'other' / 'bin' / 'python'}, which cannot import tfrepro; "
            f"use {sys.executable}, the Python tfrepro is installed in{_ACTIVATE} (see `tfrepro {verb} --help`)"]
    assert set(tmp_path.iterdir()) == before  # nothing made
    assert run_tfrepro("run", "--", sys.executable, str(script), env=env).stdout == "trained\n"  # the control


_ACTIVATE = (f", or activate its environment ({Path(sys.prefix) / 'bin' / 'activate'})"
             if sys.prefix != sys.base_prefix else "")
