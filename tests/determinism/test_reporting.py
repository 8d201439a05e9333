"""tfrepro.status() and tfrepro.environment(): structured, printable, JSON-serialisable."""

import copy
import json

import pytest

import tfrepro
from tfrepro.proof.environment_info import environment_diff

from conftest import run_tfrepro

pytestmark = pytest.mark.core


def test_status_is_structured_printable_and_serialisable():
    report = tfrepro.status()
    text = str(report)
    assert "op determinism" in text and "PYTHONHASHSEED" in text
    assert json.loads(json.dumps(report.to_dict()))["settings"]
    assert "op determinism" in report and "no such setting" not in report and 0 not in report
    assert [setting.name for setting in report] == [setting.name for setting in report.settings]
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(report)
    assert "op determinism" in console.export_text()


def test_status_reports_problems_with_reasons_and_fixes(monkeypatch):
    monkeypatch.setenv("TF_CUDNN_USE_AUTOTUNE", "0")
    monkeypatch.setattr("tfrepro.determinism.state.STARTUP_HASHSEED", None)
    report = tfrepro.status()
    assert not report.ok
    problems = {s.name: s for s in report.problems()}
    assert "tfrepro run" in problems["PYTHONHASHSEED"].why
    assert "unset it" in problems["TF_CUDNN_USE_AUTOTUNE"].why
    with tfrepro.patched(1) as patched_report:
        assert patched_report["op determinism"].ok


def test_environment_fingerprint_has_everything_and_is_json():
    env = tfrepro.environment()
    assert json.loads(json.dumps(env)) == env
    for key in ("python", "os", "cpu", "numpy", "keras", "tf_keras", "tf.keras", "tensorflow", "env", "onednn"):
        assert key in env
    tf_part = env["tensorflow"]
    for key in ("version", "build_info", "gpus", "intra_op_threads", "inter_op_threads", "op_determinism"):
        assert key in tf_part


def test_environment_diff_flags_what_breaks_bitwise_reproducibility():
    a = tfrepro.environment()
    b = copy.deepcopy(a)
    assert environment_diff(a, b) == []
    b["tensorflow"]["intra_op_threads"] = 7
    b["tensorflow"]["gpus"] = [{"name": "NVIDIA GeForce GTX 1080 Ti", "compute_capability": "6.1"}]
    b["env"]["TFREPRO_UNRELATED"] = "x"
    diffs = {d.key: d for d in environment_diff(a, b)}
    assert diffs["tensorflow.intra_op_threads"].breaks_bitwise
    assert "thread" in diffs["tensorflow.intra_op_threads"].why
    assert diffs["tensorflow.gpus"].breaks_bitwise
    assert not diffs["env.TFREPRO_UNRELATED"].breaks_bitwise
    assert "breaks bitwise" in str(diffs["tensorflow.gpus"])


def test_environment_records_the_cluster_and_flags_other_collectives_or_worker_counts(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                                    '"task": {"type": "worker", "index": 1}}')
    a = tfrepro.environment()
    assert a["distribution"] == {"cluster": {"workers": 2, "task": "worker:1"}}  # no strategy was built here
    b = copy.deepcopy(a)
    b["distribution"]["cluster"] = {"workers": 4, "task": "worker:0"}
    b["distribution"]["collectives"] = [{"implementation": "NCCL", "bytes_per_pack": 0, "pinned": False}]
    diffs = {d.key: d for d in environment_diff(a, b)}
    assert diffs["distribution.cluster.workers"].breaks_bitwise
    assert diffs["distribution.collectives"].breaks_bitwise
    assert not diffs["distribution.cluster.task"].breaks_bitwise  # every worker of a run has its own
    monkeypatch.setenv("TF_CONFIG", "{not json")
    assert tfrepro.environment()["distribution"]["cluster"]["workers"] is None
    with pytest.raises(TypeError):
        environment_diff(a, "not a fingerprint")


def test_environment_records_tensorflows_variables_by_name_and_the_hash_seed_in_effect(monkeypatch):
    from tfrepro.determinism import state

    monkeypatch.setenv("TF_CLI_CONFIG_FILE", "/home/u/.terraformrc")  # Terraform's, not TensorFlow's
    monkeypatch.setenv("TF_CUDNN_USE_AUTOTUNE", "0")
    env = tfrepro.environment()
    assert "TF_CLI_CONFIG_FILE" not in env["env"] and env["env"]["TF_CUDNN_USE_AUTOTUNE"] == "0"
    assert env["python_hash_seed"] == state.STARTUP_HASHSEED and "PYTHONHASHSEED" not in env["env"]
    tfrepro.patch(42)
    at_42 = tfrepro.environment()
    tfrepro.patch(43)  # sets PYTHONHASHSEED=43 for subprocesses; this interpreter's hash seed is unchanged
    assert not [d for d in environment_diff(at_42, tfrepro.environment()) if "hash" in d.key.lower()]


def test_env_and_status_commands():
    proc = run_tfrepro("env", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tensorflow"]["version"]
    proc = run_tfrepro("status")
    assert proc.returncode == 0 and "op determinism" in proc.stdout
    # stdout is a pipe here: plain text, each setting on one whole line, advice included
    assert ("[!!] PYTHONHASHSEED: not set; "
            "the iteration order of sets of strings may differ between runs; use `tfrepro run`"
            in proc.stdout.splitlines())
    assert "─" not in proc.stdout and "│" not in proc.stdout  # no table rules in a log file
