"""``tfrepro run --workers N`` and ``tfrepro check --workers N``: localhost clusters of fresh
processes. The launcher's own tests use a worker without TensorFlow; the training ones train the
MNIST CNN under MultiWorkerMirroredStrategy on 2 workers."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import SCRIPTS, clean_env, run_python, run_tfrepro

pytestmark = [pytest.mark.workers, pytest.mark.keras]
PROBE = str(SCRIPTS / "workers_probe.py")
CNN = str(SCRIPTS / "multi_worker_cnn.py")


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status  # a zombie has exited; its parent (init here) reaps it


def pids_in(folder: Path) -> list[int]:
    return [int(pid) for path in folder.glob("*.pids") for pid in path.read_text().split()]


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def launcher(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tfrepro", "run", *args], env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# The launcher ----------------------------------------------------------------------------------------

def test_each_worker_gets_its_task_in_one_cluster_and_its_lines_are_prefixed():
    proc = run_tfrepro("run", "--workers", "3", "--", sys.executable, PROBE, "echo")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = sorted(proc.stdout.splitlines())
    assert [line.split(" ", 2)[:2] for line in lines] == [["[worker", f"{k}]"] for k in range(3)]
    clusters = set()
    for k, line in enumerate(lines):
        fields = dict(field.split("=", 1) for field in line.split("] ", 1)[1].split(" ", 2))
        assert fields["worker"] == str(k) and fields["task"] == f"worker:{k}"
        clusters.add(json.dumps(json.loads(fields["cluster"])["cluster"]))
    (cluster,) = clusters  # one cluster, the same for every worker
    addresses = json.loads(cluster)["worker"]
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert sorted(proc.stderr.splitlines()) == [f"[worker {k}] stderr of {k}" for k in range(3)]


@pytest.mark.parametrize("how, code", [("3", 3), ("kill", 128 + signal.SIGKILL)])
def test_a_dying_worker_stops_the_others_and_leaves_no_process(tmp_path, how, code):
    proc = launcher("--workers", "2", "--", sys.executable, PROBE, "hold", str(tmp_path), "--die", "1", how, "--child")
    assert wait_for(lambda: len(list(tmp_path.glob("*.pids"))) == 2, 60), proc.communicate(timeout=30)
    started = time.monotonic()
    _, stderr = proc.communicate(timeout=30)
    assert time.monotonic() - started < 5  # worker 0 would hold for 120 s
    assert proc.returncode == code
    assert f"worker 1 exited with {code}; the other workers were stopped" in stderr
    pids = pids_in(tmp_path)
    assert len(pids) == 4  # two workers, each with a child of its own
    assert wait_for(lambda: not any(alive(pid) for pid in pids), 5), [pid for pid in pids if alive(pid)]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_ctrl_c_or_sigterm_stops_every_worker(tmp_path, sig, code):
    proc = launcher("--workers", "2", "--", sys.executable, PROBE, "hold", str(tmp_path), "--child")
    assert wait_for(lambda: len(list(tmp_path.glob("*.pids"))) == 2, 60)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == code, stderr[-2000:]
    assert "interrupted; every worker was stopped" in stderr
    own = [line for line in stderr.splitlines() if not line.startswith("[worker ")]
    assert own == ["tfrepro run: interrupted; every worker was stopped"]  # the workers' KeyboardInterrupts are theirs
    assert len(pids_in(tmp_path)) == 4
    pids = pids_in(tmp_path)
    assert wait_for(lambda: not any(alive(pid) for pid in pids), 5)


def test_workers_die_with_a_launcher_killed_by_sigkill(tmp_path):
    proc = launcher("--workers", "2", "--", sys.executable, PROBE, "hold", str(tmp_path))
    assert wait_for(lambda: len(list(tmp_path.glob("*.pids"))) == 2, 60)
    proc.kill()
    proc.communicate(timeout=30)
    pids = pids_in(tmp_path)
    assert len(pids) == 2
    assert wait_for(lambda: not any(alive(pid) for pid in pids), 5), [pid for pid in pids if alive(pid)]


@pytest.mark.parametrize("args, message", [
    (["run", "--workers", "0"], "--workers must be an integer from 1 to 64; got 0"),
    (["run", "--workers", "65"], "--workers must be an integer from 1 to 64; got 65"),
    (["check", "--workers", "0"], "--workers must be an integer from 1 to 64; got 0"),
    (["run", "--workers", "two"], "argument --workers: invalid int value: 'two'"),
    (["check", "--workers", "2", "--gradients"], "--gradients is not supported with --workers"),
])
def test_bad_worker_counts_are_one_line_errors(args, message):
    proc = run_tfrepro(*args, "--", sys.executable, PROBE, "echo")
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_check_with_one_worker_is_a_one_worker_cluster(tmp_path):
    proc = run_tfrepro("check", "--workers", "1", "--out", str(tmp_path), "--", sys.executable, PROBE, "echo")
    assert proc.returncode == 2  # the probe never calls Model.fit
    assert "never called Model.fit" in proc.stdout + proc.stderr
    said = (tmp_path / "run-0" / "worker-0" / "stdout.log").read_text()
    assert "worker=0 task=worker:0" in said


# Training under MultiWorkerMirroredStrategy ----------------------------------------------------------

def header(trace: Path) -> dict:
    return json.loads(trace.read_text().splitlines()[0])


@pytest.mark.slow
def test_check_workers_on_the_mnist_cnn_is_identical_and_records_the_pinned_collectives(tmp_path):
    proc = run_tfrepro("check", "--workers", "2", "--runs", "2", "--out", str(tmp_path), "--", sys.executable, "-m",
                       "tfrepro.examples.mnist_cnn", "--strategy", "multi-worker", "--limit", "256", "--epochs", "1",
                       "--offline", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "identical: 2 runs x 2 workers (each against worker 0 at every record)" in proc.stdout
    for run in range(2):
        for worker in range(2):
            (trace,) = (tmp_path / f"run-{run}" / f"worker-{worker}").glob("fit-*.jsonl")
            distribution = header(trace)["environment"]["distribution"]
            assert distribution["cluster"] == {"workers": 2, "task": f"worker:{worker}"}
            assert distribution["collectives"] == [{"implementation": "RING", "bytes_per_pack": 0, "pinned": True}]


@pytest.mark.slow
@pytest.mark.parametrize("plant, named", [
    ("worker", "diverged: worker 1 differs from worker 0 (run 0, Model.fit call 0) at epoch 0, batch 0 (step 0) "
               "in layer dense"),
    ("run", "diverged: run 1 of worker 0 differs from run 0 (Model.fit call 0) at epoch 0, batch 1 (step 1) "
            "in layer dense_1"),
])
def test_check_workers_names_planted_noise(tmp_path, plant, named):
    proc = run_tfrepro("check", "--workers", "2", "--runs", "2", "--out", str(tmp_path / "out"), "--",
                       sys.executable, CNN, "--weights", str(tmp_path / "w.npz"), "--epochs", "1", "--plant", plant,
                       timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert named in " ".join(proc.stdout.split()), proc.stdout


def weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[key] for key in sorted(saved.files, key=lambda k: int(k.split("_")[1]))]


def same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in zip(a, b))


@pytest.mark.slow
def test_a_two_worker_run_killed_by_sigkill_resumes_to_the_uninterrupted_bits(tmp_path):
    def train(name, *extra):
        return run_tfrepro("run", "--workers", "2", *extra, "--", sys.executable, CNN, "--weights",
                           str(tmp_path / f"{name}.npz"), "--epochs", "3", timeout=600)

    reference = train("reference")
    assert reference.returncode == 0, reference.stderr[-3000:]
    checkpoint = ["--checkpoint", str(tmp_path / "ckpt"), "--checkpoint-every", "2"]
    kill = ["--kill-at", "1,3", "--marker", str(tmp_path / "killed")]
    killed = run_tfrepro("run", "--workers", "2", *checkpoint, "--", sys.executable, CNN, "--weights",
                         str(tmp_path / "resumed.npz"), "--epochs", "3", *kill, timeout=600)
    assert killed.returncode == 128 + signal.SIGKILL, killed.stderr[-3000:]
    assert "worker 1 exited with 137; the other workers were stopped" in killed.stderr
    assert not list(tmp_path.glob("resumed.*"))
    saved = sorted(path.name for path in (tmp_path / "ckpt" / "fit-0").glob("*.npz"))
    assert saved == ["ckpt-e000000-b00000002.npz", "ckpt-e000001-b00000000.npz", "ckpt-e000001-b00000002.npz"]
    resumed = run_tfrepro("run", "--workers", "2", *checkpoint, "--", sys.executable, CNN, "--weights",
                          str(tmp_path / "resumed.npz"), "--epochs", "3", *kill, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for worker in range(2):
        assert f"[worker {worker}] tfrepro: resumed from" in resumed.stderr
        assert same_bits(weights(tmp_path / f"reference.worker-{worker}.npz"),
                         weights(tmp_path / f"resumed.worker-{worker}.npz"))
    assert same_bits(weights(tmp_path / "resumed.worker-0.npz"), weights(tmp_path / "resumed.worker-1.npz"))


@pytest.mark.slow
def test_a_keyed_shuffle_trains_on_two_workers_under_the_default_auto_shard_policy(tmp_path):
    """``tfrepro.data.shuffle`` has no file source to shard by: it asks for sharding by data, so
    Keras's default (AUTO) policy splits its keyed order between the workers instead of failing."""
    proc = run_tfrepro("run", "--workers", "2", "--seed", "0", "--", sys.executable, CNN, "--weights",
                       str(tmp_path / "w.npz"), "--epochs", "2", "--keyed-shuffle", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert same_bits(weights(tmp_path / "w.worker-0.npz"), weights(tmp_path / "w.worker-1.npz"))


# Randomness per replica -----------------------------------------------------------------------------

def draws(*launch: str, patched: bool = True) -> list[dict]:
    """Each replica's draws, in replica order: {"generator": [per step], "dropout": [per step]}."""
    mode = "multi-worker" if "--workers" in launch else "mirrored"
    script = str(SCRIPTS / "replica_randomness.py")
    proc = run_tfrepro("run", *launch, "--", sys.executable, script, mode) if patched else run_python(script, mode)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(line for line in proc.stdout.splitlines() if "generator" in line)
    found = [json.loads(line.split("] ", 1)[-1]) for line in lines]
    replicas = []
    for drawn in found:
        for replica in range(len(drawn["generator"][0])):
            replicas.append({kind: None if steps is None else [step[replica] for step in steps]
                             for kind, steps in drawn.items()})
    return replicas


@pytest.mark.slow
def test_randomness_is_keyed_by_replica_alike_on_two_workers_and_two_devices(keras):
    workers, devices = draws("--workers", "2"), draws()
    assert len(workers) == len(devices) == 2
    assert workers == devices  # replica R draws the same on worker R and on device R
    for kind in ("generator", "dropout"):
        assert workers[0][kind] != workers[1][kind], kind  # keyed by replica: the replicas differ
    assert draws("--workers", "2") == workers  # and run to run, the same
    if workers[0]["moving_mean"] is not None:  # Keras 3: one set of moving statistics, on every replica
        assert workers[0]["moving_mean"] == workers[1]["moving_mean"]


@pytest.mark.slow
def test_without_the_patch_keras3_repeats_dropout_masks_and_splits_batchnorm_statistics(keras):
    if not hasattr(keras, "version") or not keras.version().startswith("3"):
        pytest.skip("Keras 2's random layers already draw per replica, and its moving statistics are averaged")
    unpatched = draws(patched=False)  # negative controls, on 2 devices (unpatched Keras 3 cannot fit on 2 workers)
    assert unpatched[0]["dropout"] == unpatched[1]["dropout"]  # the mirrored SeedGenerator: one mask for all
    assert unpatched[0]["generator"] != unpatched[1]["generator"]
    assert unpatched[0]["moving_mean"] != unpatched[1]["moving_mean"]  # each copy from its own replica's part
