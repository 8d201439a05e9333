"""`tfrepro check`, `tfrepro compare` and `tfrepro demo` end to end, in fresh processes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfrepro.examples import datasets

from conftest import SCRIPTS, clean_env, run_tfrepro, write_trace

pytestmark = pytest.mark.keras


@pytest.mark.slow
def test_check_passes_an_unmodified_script_and_keeps_the_traces(tmp_path):
    out = tmp_path / "out"
    for run in ("run-0", "run-1", "run-2", "run-3"):  # an earlier 4-run check in the same folder, 2 fits a run
        (out / run).mkdir(parents=True)
        write_trace(out / run / "fit-1.jsonl", [0.5])
        (out / run / "stdout.log").write_text("earlier\n")
    (out / "run-3" / "notes.txt").write_text("the user's own file")
    proc = run_tfrepro("check", "--runs", "2", "--seed", "3", "--out", str(out), "--",
                       sys.executable, str(SCRIPTS / "unmodified.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "identical: 2 runs x 1 Model.fit call(s)" in proc.stdout  # the earlier fits are not compared
    assert (out / "run-0" / "fit-0.jsonl").is_file() and (out / "run-1" / "fit-0.jsonl").is_file()
    assert not (out / "run-0" / "fit-1.jsonl").exists()
    assert not (out / "run-2").exists()  # tfrepro's files from the earlier check are gone, with their folder
    assert [p.name for p in (out / "run-3").iterdir()] == ["notes.txt"]  # and only tfrepro's
    assert "set order" in (out / "run-1" / "stdout.log").read_text()


@pytest.mark.slow
def test_check_without_patch_shows_the_divergence(tmp_path):
    proc = run_tfrepro("check", "--no-patch", "--out", str(tmp_path), "--", sys.executable, str(SCRIPTS / "unmodified.py"))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "diverged" in proc.stdout and "first divergence" in proc.stdout
    assert "epoch 0, batch 0" in proc.stdout
    assert f"to find the layer or op at fault: tfrepro doctor --no-patch -- {sys.executable} " in proc.stdout


@pytest.mark.slow
def test_check_reports_a_script_that_never_fits_or_fails(tmp_path):
    no_fit = tmp_path / "no_fit.py"
    no_fit.write_text("print('no training here')\n")
    proc = run_tfrepro("check", "--out", str(tmp_path / "a"), "--", sys.executable, str(no_fit))
    assert proc.returncode == 2 and "never called Model.fit" in proc.stdout
    failing = tmp_path / "failing.py"
    failing.write_text("import tensorflow as tf\n\ntf.constant(1)\nraise RuntimeError('boom in training')\n")
    noisy = {k: v for k, v in clean_env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # TF's start-up log on
    proc = run_tfrepro("check", "--out", str(tmp_path / "b"), "--", sys.executable, str(failing), env=noisy)
    assert proc.returncode == 2 and "failed with exit code 1" in proc.stdout
    # the user's error, from its own line, without TF's banner or tfrepro's and runpy's frames
    assert "boom in training" in proc.stdout and 'failing.py", line 4, in <module>' in proc.stdout
    assert "bootstrap.py" not in proc.stdout and "runpy" not in proc.stdout and "oneDNN" not in proc.stdout
    assert "oneDNN" in (tmp_path / "b" / "run-0" / "stderr.log").read_text()  # the log keeps everything
    proc = run_tfrepro("check", "--runs", "1", "--", sys.executable, str(failing))
    assert proc.returncode == 2 and "at least 2" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_tfrepro("demo", "--epochs", "0")
    assert proc.returncode == 2 and "--epochs must be >= 1" in proc.stderr and "Traceback" not in proc.stderr


def test_ctrl_c_names_the_incomplete_run_and_exits_130(tmp_path):
    """A real Ctrl-C: SIGINT to the foreground process group, tfrepro and the script alike."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "tfrepro", "check", "--out", str(out), "--", sys.executable,
                             str(SCRIPTS / "wait_for_ctrl_c.py")], env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        log, deadline = out / "run-0" / "stdout.log", time.monotonic() + 120
        while not (log.is_file() and "ready" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stdout + stderr
    assert stderr.splitlines() == [f"tfrepro check: interrupted: run 0 is incomplete ({out / 'run-0'}); rerun the "
                                   "same tfrepro check to start over"]
    assert "interrupted" in log.read_text()  # the script had its Ctrl-C too, and its output was kept


def test_compare_exit_codes(tmp_path):
    a = write_trace(tmp_path / "a.jsonl", [0.5, 0.25])
    same = write_trace(tmp_path / "same.jsonl", [0.5, 0.25])
    other = write_trace(tmp_path / "other.jsonl", [0.5, 0.2500001])
    wider = write_trace(tmp_path / "wider.jsonl", [0.5, 0.25], shape=(3, 1))
    assert run_tfrepro("compare", a, same).returncode == 0
    diverged = run_tfrepro("compare", a, other)
    assert diverged.returncode == 1 and "batch 1" in diverged.stdout
    incomparable = run_tfrepro("compare", a, wider)
    assert incomparable.returncode == 2 and incomparable.stdout == ""
    assert incomparable.stderr.splitlines() == [
        f"tfrepro compare: error: not comparable: {a} and {wider} are traces of different models: variable 0 "
        "(d/kernel): shape [2, 1] vs [3, 1] (see `tfrepro compare --help`)"]
    lines = Path(a).read_text().splitlines(keepends=True)
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text("".join([*lines[:2], "{not json\n", *lines[3:]]))
    proc = run_tfrepro("compare", a, str(corrupt))
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith(f"tfrepro compare: error: {corrupt}, line 3: not valid JSON (")
    for bad in (str(tmp_path / "missing.jsonl"), str(SCRIPTS / "unmodified.py")):
        proc = run_tfrepro("compare", a, bad)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.startswith("tfrepro compare: error")


@pytest.mark.slow
def test_demo_runs_offline_and_matches(tmp_path):
    env = clean_env(KERAS_HOME=str(tmp_path / "keras-home"))
    proc = run_tfrepro("demo", "--epochs", "1", "--limit", "256", "--offline", "--out", str(tmp_path / "demo"), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "scikit-learn's bundled handwritten digits" in proc.stdout
    lines = proc.stdout.splitlines()
    assert "no seeds: diverged" in lines
    # the negative control that matters: seeds set the usual way, and the runs still differ on a CPU
    assert "seeds only (keras.utils.set_random_seed(0)): diverged" in lines
    assert "tfrepro.patch(0): identical" in lines and any(line.endswith("same bits: yes") for line in lines)


def test_the_demos_control_arms_run_without_the_callers_determinism_switches(tmp_path, monkeypatch):
    from tfrepro.examples import demo

    watched = ("TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC", "PYTHONHASHSEED")
    seen = []

    def environment_of_the_runs(command, *, config, **kwargs):  # what check would launch the runs with
        env = config.to_env()
        seen.append((config.patch, {name: env.get(name) for name in watched}))

    monkeypatch.setattr(demo, "check", environment_of_the_runs)
    for name, value in zip(watched, ("1", "1", "5")):
        monkeypatch.setenv(name, value)
    for name in demo.ARMS:
        demo.run_arm(demo.arm(name, 0), epochs=1, limit=8, offline=True, out=tmp_path)
    assert seen[0] == seen[1] == (False, dict.fromkeys(watched))
    assert seen[2] == (True, {"TF_DETERMINISTIC_OPS": "1", "TF_CUDNN_DETERMINISTIC": "1", "PYTHONHASHSEED": "0"})
    assert [os.environ[name] for name in watched] == ["1", "1", "5"]  # the caller's, restored


def test_mnist_loader_prefers_the_keras_cache_and_falls_back_offline(tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    fallback = datasets.load_mnist(allow_download=False)
    assert fallback.source == "sklearn-digits" and fallback.x_train.shape == (1500, 28, 28, 1)
    assert 0.0 <= fallback.x_train.min() and fallback.x_train.max() <= 1.0
    (tmp_path / "datasets").mkdir()
    images = np.random.RandomState(0).randint(0, 256, size=(20, 28, 28), dtype=np.uint8)
    np.savez(tmp_path / "datasets" / "mnist.npz", x_train=images, y_train=np.arange(20) % 10,
             x_test=images[:4], y_test=np.arange(4))
    cached = datasets.load_mnist(allow_download=False, limit=8)
    assert cached.source == "keras-mnist" and cached.x_train.shape == (8, 28, 28, 1)
    assert np.array_equal(cached.x_train[0, ..., 0], images[0] / np.float32(255.0))


def test_piped_output_is_plain_text_even_where_color_is_forced():
    """FORCE_COLOR (CI systems, notebook kernels) must not put escape codes or progress bars in a pipe."""
    proc = run_tfrepro("status", env=clean_env(FORCE_COLOR="1", TERM="xterm-256color"))
    assert proc.returncode == 0 and "op determinism" in proc.stdout and "\x1b[" not in proc.stdout
