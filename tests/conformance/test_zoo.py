"""The conformance matrix: every capability over every pattern of the zoo (``zoo.py``).

Columns (capabilities) and what a supported cell demands:

- ``patch``: the same bits in fresh processes (the two runs of ``tfrepro check``, ``tfrepro run``
  of the zoo with ``import keras`` first, and ``tfrepro.patch(S)`` as the script's first line);
- ``check``: ``tfrepro check`` says identical; with a planted culprit it says diverged (with
  ``--gradients``: a gradient's difference can stay below the weights' rounding for a while), in
  every pattern's own ``fit`` (the planted half on Keras 3: Keras 2's is ``tests/proof``'s);
- ``doctor``: ``tfrepro doctor`` names the planted culprit as nondeterministic (``--every-fit``:
  every pattern's own ``fit`` diagnosed in one process); Keras 3's leg alone (Keras 2's diagnosis
  is ``tests/diagnosis``'s, within CI's budget);
- ``resume``: under ``tfrepro run --checkpoint``, a run killed with SIGKILL and started again ends
  on the uninterrupted run's bits (and says it resumed);
- ``seed`` (Keras 3's leg alone, ``KERAS3_ONLY``): seed S means one computation: ``tfrepro run
  --seed S`` (of the zoo with ``import keras`` as its first line: every other entry point imports
  TensorFlow first), each run of ``tfrepro check --seed S``, seed S of ``tfrepro sweep`` (``tfrepro
  tune`` launches each seed as sweep does), ``tfrepro doctor --continue --seed S``, ``tfrepro run
  --checkpoint`` and ``tfrepro.patch(S)`` as the first line give the same weights and leave
  Python's, NumPy's and TensorFlow's RNGs in the same state (``run --checkpoint``, the resume
  column's uninterrupted run, is compared with ``run`` on the patterns it does not refuse, since a
  refusal stops the script, each pattern started as the resume column starts it);
- ``keyed``: under ``tfrepro.patch(S, init="keyed")`` (keyed initial weights, and ``fit``'s keyed
  shuffles), two fresh processes give the same bits;
- ``workers`` (on Keras 2 its refused cells alone, ``KERAS3_SUPPORTED_ONLY``): built and trained
  under ``MultiWorkerMirroredStrategy`` on 2 localhost workers,
  ``tfrepro check --workers 2 --runs 2`` says identical: every worker agrees with worker 0 at every
  record, each worker with itself run to run, and the trained variables (optimizer's too) are the
  same bits on both workers;
- ``exact``: under ``tfrepro run --ops exact`` (the exact tier), a run with 1 thread and oneDNN
  off and a run with 2 threads and oneDNN on give the same bits; on Keras 2 the second run is of
  the issue's models alone (``KERAS2_EXACT_PAIRS``), and every other pattern trains with a clean
  audit or is refused by name in the first.

A cell that a capability does not support is in ``REFUSED``: the test demands that the capability
refuses it by name (the message it must print), and the docs' zoo page lists it (a check
at the bottom). Every column runs every pattern in one process per entry point (``zoo.py all``):
crossing processes is the point of ``patch``, ``check`` and ``seed``, and a pattern whose
computation leaked into the next one's would show there too; ``workers`` runs one cluster per run,
``doctor`` diagnoses each pattern's ``fit`` in turn. ``resume`` kills a process per pattern (a
process is killed once), each pattern alone, then starts them all again in one process, each
``fit`` from its killed run's checkpoints, and compares with one uninterrupted process; there each
pattern after the first starts as if it were the process's first (``zoo.py``'s ``ZOO_RESET``), so
that it computes the same as alone, and the first keeps the launcher's seeding to show. A refused cell runs the pattern alone (the two custom loops, which the launcher
refuses as a whole, share one process). The processes run two at a time, started as soon as the
first zoo test needs them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import clean_env

pytestmark = [pytest.mark.keras, pytest.mark.slow, pytest.mark.zoo]

ZOO = Path(__file__).with_name("zoo.py")
ZOO_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "zoo.md"
SEED = 3
KERAS2 = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
sys.path.insert(0, str(ZOO.parent))
from zoo_patterns import PATTERNS  # noqa: E402  (the names only: importing zoo.py would load TensorFlow)

CAPABILITIES = ("patch", "check", "doctor", "resume", "seed", "keyed", "workers", "exact")


_EXACT_REFUSALS = {"vae": "AddV2 in encoder", "bert_masking": "RandomUniform",
                   "gan": "RandomStandardNormal in " if KERAS2 else "StatelessRandomNormalV2 in ",
                   "tf_random_ops": "AddV2 in ", "generator_layer": "RngReadAndSkip in ",
                   # tf-keras's LSTM traces its own step, whose f * c + i * g is a multiply-add XLA may fuse
                   **({"lstm": "'standard_lstm'"} if KERAS2 else {})}


NEVER_FITS = "never called Model.fit"  # the launcher's refusal, once the whole script has run


def _refused() -> dict[tuple[str, str], str]:
    """(pattern, capability) -> the words the capability must refuse it with."""
    refused = {
        ("custom_loop", "check"): NEVER_FITS,
        ("custom_loop", "doctor"): NEVER_FITS,
        ("custom_loop", "resume"): NEVER_FITS,
        ("custom_loop_checkpointed", "check"): NEVER_FITS,
        ("custom_loop_checkpointed", "doctor"): NEVER_FITS,
        ("tf_random_ops", "resume"): "tf_random",
        ("custom_loop", "workers"): NEVER_FITS,
        ("custom_loop_checkpointed", "workers"): NEVER_FITS,
    }
    if KERAS2:  # Keras 2 refuses a loss object with automatic reduction in a train_step under a strategy
        refused[("custom_train_step", "workers")] = "when losses are used with `tf.distribute.Strategy`"
        refused[("gan", "workers")] = "when losses are used with `tf.distribute.Strategy`"
    else:  # Keras 3 builds a model by calling it before the first step under a tf.distribute strategy
        refused[("gan", "workers")] = "has no call()"
    # The exact tier's audit names the ops it does not cover (every op named, in the order it meets them).
    refused.update({(pattern, "exact"): words for pattern, words in _EXACT_REFUSALS.items()})
    if KERAS2:  # Keras 2's keras-io examples draw from TF's stateful random ops
        refused[("vae", "resume")] = "sampling"
        refused[("gan", "resume")] = "train_step"
        refused[("bert_masking", "resume")] = "masking"
    return refused


REFUSED = _refused()

# Columns whose cells Keras 2's leg leaves to Keras 3's, within CI's budget (docs/reference/zoo.md):
KERAS3_ONLY = {
    "doctor": "Keras 3's leg: Keras 2's diagnosis is tested in tests/diagnosis (sequential, functional, subclassed "
              "and nested models, custom train steps), within CI's budget",
    "seed": "Keras 3's leg: the entry points' launcher code does not depend on the Keras version; on Keras 2 the "
            "patch column compares run (Keras imported first), check's runs and patch(S) in the script, and the "
            "comparisons of doctor --continue and run --checkpoint with run are Keras 3's alone",
}
# Keras 2's exact column compares its two runs on these patterns (the MNIST CNN and the models of issue #33),
# within CI's budget (docs/reference/zoo.md); its other patterns run once: each trains with a clean audit or
# is refused by name, the bits across threads and oneDNN coming from the tier's TF ops, the same under either Keras
KERAS2_EXACT_PAIRS = ("cnn_dropout", "mlp_softmax", "transformer", "resnet_block", "autoencoder")
KERAS3_SUPPORTED_ONLY = {  # Keras 2 runs the refused cells alone (their refusals are Keras 2's own)
    "workers": "Keras 3's leg: Keras 2's multi-worker runs are its refusals here (custom_train_step, gan), within "
               "CI's budget; tests/launching/test_workers.py is Keras 3's too",
}


# --- running the processes ------------------------------------------------------------------------

class Runs:
    """The zoo's processes, each started once, two at a time, in a folder that is removed at the end."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tfrepro-zoo-")).resolve()  # as the launcher names it
        self._pool = ThreadPoolExecutor(max_workers=2)
        self._jobs: dict[tuple, Future] = {}
        self._lock = threading.Lock()

    def get(self, *job: str) -> dict:
        return self.submit(*job).result()

    def submit(self, *job: str) -> Future:
        with self._lock:
            if job not in self._jobs:
                more = (self,) if job[0] in _NEEDS_RUNS else ()
                self._jobs[job] = self._pool.submit(_JOBS[job[0]], self.folder / "-".join(job), *job[1:], *more)
            return self._jobs[job]

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)
        shutil.rmtree(self.folder, ignore_errors=True)


def _env(results: Path, **extra: str) -> dict[str, str]:
    return clean_env(ZOO_RESULTS=str(results), **extra)


def _tfrepro(folder: Path, *args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "tfrepro", *args], env=env, cwd=folder, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _python(pattern: str, *args: str) -> list[str]:
    return ["--", sys.executable, str(ZOO), pattern, *args]


def _alone(pattern: str) -> tuple[str, str]:
    """``zoo.py``'s argument for one pattern, or for patterns joined by ``+`` (the custom loops, which
    the launcher refuses as a whole: neither calls ``fit``) in one process, and the ``ZOO_SKIP`` that
    leaves the others out."""
    if "+" not in pattern:
        return pattern, ""
    together = pattern.split("+")
    return "all", ",".join(p for p in PATTERNS if p not in together)


def _results(path: Path) -> dict[str, list[dict]]:
    """The result lines of a file, by pattern (a pattern has one line per run that wrote there)."""
    found: dict[str, list[dict]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            found.setdefault(record["pattern"], []).append(record)
    return found


def _job(folder: Path, proc: subprocess.CompletedProcess, results: Path, **more) -> dict:
    return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
            "results": _results(results), "folder": folder, **more}


def _entry_point(folder: Path, entry: str, planted: str = "0", skip: str = "") -> dict:
    """One entry point running every pattern in one process (``zoo.py all``); ``skip="resume"``
    leaves out the patterns that ``run --checkpoint`` refuses and starts each pattern as the resume
    column's runs do (``_checkpointed``)."""
    results = folder / "results.jsonl"
    env = _env(results, ZOO_PLANT=planted, ZOO_SKIP=",".join(p for p, c in REFUSED if c == skip),
               **({"ZOO_RESET": str(SEED)} if skip == "resume" else {}))
    seed = ("--seed", str(SEED))
    if entry == "run":  # a script whose first line is `import keras`; every other entry imports TensorFlow first
        proc = _tfrepro(folder, "run", *seed, *_python("all"), env=dict(env, ZOO_FIRST_IMPORT="keras"))
    elif entry == "check":  # planted: gradients recorded too, since a gradient's difference can stay below the
        gradients = ("--gradients",) if planted == "1" else ()  # weights' rounding for a while
        proc = _tfrepro(folder, "check", "--runs", "2", *seed, *gradients, "--out", str(folder / "out"),
                        *_python("all"), env=env)
    elif entry == "sweep":
        proc = _tfrepro(folder, "sweep", "--seeds", str(SEED), "--metric", "zoo_loss", "--out", str(folder / "out"),
                        *_python("all"), env=env)
    elif entry == "doctor":
        proc = _tfrepro(folder, "doctor", "--continue", *seed, "--out", str(folder / "out"), *_python("all"), env=env)
    elif entry == "doctor_every_fit":  # the planted culprit in every pattern, each pattern's fit diagnosed
        proc = _tfrepro(folder, "doctor", "--every-fit", "--repeats", "2", *seed, "--out", str(folder / "out"),
                        *_python("all"),
                        env=_env(results, ZOO_PLANT="1", ZOO_SKIP=",".join(p for p, c in REFUSED if c == "doctor")))
        return _job(folder, proc, results, reports=_reports(folder / "out"))
    elif entry in ("exact", "exact2"):  # the exact tier: 1 thread, oneDNN off; 2 threads, oneDNN on
        variant = ("--threads", "1", "--onednn", "off") if entry == "exact" else ("--threads", "2", "--onednn", "on")
        if KERAS2:  # each pattern started as if first (ZOO_RESET), so that the second run's patterns compute alike
            env["ZOO_RESET"] = str(SEED)
            if entry == "exact2":
                env["ZOO_SKIP"] = ",".join(p for p in PATTERNS if p not in KERAS2_EXACT_PAIRS)
        proc = _tfrepro(folder, "run", "--ops", "exact", *variant, *seed, *_python("all"), env=env)
    elif entry in ("inscript", "keyed", "keyed2"):
        folder.mkdir(parents=True, exist_ok=True)
        init = "order" if entry == "inscript" else "keyed"
        proc = subprocess.run([sys.executable, str(ZOO), "all"], cwd=folder, capture_output=True, text=True, check=False,
                              env=dict(env, ZOO_INSCRIPT_SEED=str(SEED), ZOO_INSCRIPT_INIT=init, PYTHONHASHSEED=str(SEED)))
    else:
        raise ValueError(entry)
    return _job(folder, proc, results)


def _workers(folder: Path, pattern: str = "all") -> dict:
    """``tfrepro check --workers 2 --runs 2`` with every pattern (but the refused) built under
    MultiWorkerMirroredStrategy, in one cluster per run; or one pattern alone."""
    results = folder / "results.jsonl"
    pattern, skip = ("all", ",".join(p for p, c in REFUSED if c == "workers")) if pattern == "all" else _alone(pattern)
    proc = _tfrepro(folder, "check", "--workers", "2", "--runs", "2", "--seed", str(SEED), "--out",
                    str(folder / "out"), *_python(pattern), env=_env(results, ZOO_STRATEGY="multi-worker", ZOO_SKIP=skip))
    return _job(folder, proc, results)


def _check_alone(folder: Path, pattern: str) -> dict:
    results = folder / "results.jsonl"
    pattern, skip = _alone(pattern)
    proc = _tfrepro(folder, "check", "--runs", "2", "--seed", str(SEED), "--out", str(folder / "out"),
                    *_python(pattern), env=_env(results, ZOO_SKIP=skip))
    return _job(folder, proc, results)


def _reports(out: Path) -> list[dict]:
    """The diagnoses ``tfrepro doctor`` wrote, one per ``fit`` diagnosed, in order."""
    from tfrepro.diagnosis.doctoring import REPORT, report_path

    found = []
    while report_path(out / REPORT, len(found)).exists():
        found.append(json.loads(report_path(out / REPORT, len(found)).read_text()))
    return found


def _doctor(folder: Path, pattern: str) -> dict:
    """``tfrepro doctor`` on one pattern alone, with its culprit planted (a refused cell)."""
    results = folder / "results.jsonl"
    pattern, skip = _alone(pattern)
    proc = _tfrepro(folder, "doctor", "--seed", str(SEED), "--out", str(folder / "out"), *_python(pattern),
                    env=_env(results, ZOO_PLANT="1", ZOO_SKIP=skip))
    return _job(folder, proc, results)


def _checkpointed(folder: Path, pattern: str, **extra: str) -> dict:
    """``tfrepro run --checkpoint`` (a checkpoint every 3 batches, 4 batches an epoch: a resume starts
    mid-epoch and crosses an epoch's end) of one pattern, or of ``all`` the patterns it does not refuse,
    each pattern after the first started as if it were the process's first (``ZOO_RESET``: Keras's
    state cleared, every RNG seeded anew), so that a pattern computes the same in either."""
    results = folder / "results.jsonl"
    skip = ",".join(p for p in PATTERNS if (p, "resume") in REFUSED) if pattern == "all" else ""
    proc = _tfrepro(folder, "run", "--seed", str(SEED), "--checkpoint", str(folder / "ckpt"), "--checkpoint-every", "3",
                    *_python(pattern, "--epochs", "2"),
                    env=_env(results, ZOO_RESET=str(SEED), ZOO_SKIP=skip,
                             **{"ZOO_LOOP_DIR": str(folder / "loop"), **extra}))
    return _job(folder, proc, results)


def _killed(folder: Path, pattern: str) -> dict:
    """One pattern alone, killed with SIGKILL after its step 5 of 8; or, where the column refuses the
    pattern, run alone uninterrupted (refused before any checkpoint: nothing to kill or resume)."""
    return _checkpointed(folder, pattern, **({} if (pattern, "resume") in REFUSED else {"ZOO_KILL_AT": "5"}))


def _resumed(folder: Path, runs: Runs) -> dict:
    """Every killed pattern started again, in one process: each killed run's checkpoints become those
    of its ``fit`` in ``zoo.py all`` (``DIR/fit-K`` by the fits' order; a custom loop's
    ``LoopCheckpoint`` folder is its own), so each ``fit`` resumes where its pattern was killed."""
    fits, loops, moved = folder / "ckpt", [], {}
    fits.mkdir(parents=True)
    for pattern in (p for p in PATTERNS if (p, "resume") not in REFUSED):
        killed = runs.get("resume_killed", pattern)
        moved[pattern] = []
        for fit in sorted((killed["folder"] / "ckpt").glob("fit-*"), key=lambda path: int(path.name[4:])):
            moved[pattern].append(fit.rename(fits / f"fit-{len(list(fits.iterdir()))}"))
        if (killed["folder"] / "loop").exists():
            loops.append(killed["folder"] / "loop")
            moved[pattern].append(loops[-1])
    assert len(loops) <= 1, loops  # ZOO_LOOP_DIR names one folder
    count = len(list(fits.iterdir()))  # before the run, which makes a folder for each fit it runs
    return dict(_checkpointed(folder, "all", **({"ZOO_LOOP_DIR": str(loops[0])} if loops else {})),
                fits=count, checkpoints=moved)


_JOBS = {"entry": _entry_point, "check_alone": _check_alone, "doctor": _doctor, "resume_killed": _killed,
         "resume_whole": lambda folder: _checkpointed(folder, "all"), "resume_resumed": _resumed,
         "workers": _workers}
_NEEDS_RUNS = {"resume_resumed"}  # jobs that wait on others' results
# tune launches each seed as sweep does (tfrepro.sweeps.running.seed_run, tested for tune in
# tests/tuning): the seed column's sweep cell stands for both.
_ENTRIES = ("run", "check", "sweep", "doctor", "inscript")


def _jobs_for(capability: str, pattern: str) -> list[tuple[str, ...]]:
    supported = (pattern, capability) not in REFUSED
    if KERAS2 and (capability in KERAS3_ONLY or (capability in KERAS3_SUPPORTED_ONLY and supported)):
        return []  # the tests' reasons
    if (pattern, capability) in REFUSED and capability != "exact":  # an exact refusal is in the entry's own run
        if REFUSED[(pattern, capability)] == NEVER_FITS and capability != "resume":  # one process for the loops
            pattern = "+".join(p for p in PATTERNS if REFUSED.get((p, capability)) == NEVER_FITS)
        return [{"check": ("check_alone", pattern), "doctor": ("doctor", pattern),
                 "resume": ("resume_killed", pattern), "workers": ("workers", pattern)}[capability]]
    return {"patch": [("entry", "run"), ("entry", "check"), ("entry", "inscript")],
            "check": [("entry", "check"), *(() if KERAS2 else [("entry", "check", "1")])],  # test_check's reason
            "doctor": [("entry", "doctor_every_fit")],
            "resume": [("resume_killed", pattern), ("resume_whole",), ("resume_resumed",)],
            "keyed": [("entry", "keyed"), ("entry", "keyed2")],
            "exact": [("entry", "exact"),
                      *(() if KERAS2 and pattern not in KERAS2_EXACT_PAIRS else [("entry", "exact2")])],
            "workers": [("workers", "all")],
            "seed": [*(("entry", e) for e in _ENTRIES), ("entry", "run", "0", "resume"), ("resume_whole",)]}[capability]


@pytest.fixture(scope="module")
def runs(request):
    """Starts, two at a time, every process that the selected zoo tests need."""
    zoo, jobs = Runs(), []
    for item in request.session.items:
        if item.module is request.module and hasattr(item, "callspec"):
            params = item.callspec.params
            if "pattern" in params:
                jobs += _jobs_for(item.originalname.removeprefix("test_"), params["pattern"])
    for job in sorted(jobs, key=lambda job: job[0] in _NEEDS_RUNS):  # a job that waits on others after them
        zoo.submit(*job)
    yield zoo
    zoo.close()


def _ok(job: dict) -> None:
    assert job["returncode"] == 0, f"exit {job['returncode']}\n{job['stdout'][-1500:]}\n{job['stderr'][-3000:]}"


def _refusal(runs: Runs, capability: str, pattern: str) -> None:
    """A refused cell: the capability says so by name, and does not claim success."""
    words = REFUSED[(pattern, capability)]
    job = runs.get(*_jobs_for(capability, pattern)[0])
    said = job["stdout"] + job["stderr"]
    assert words in said, f"expected a refusal naming {words!r}; got exit {job['returncode']}\n{said[-3000:]}"
    if capability != "resume":  # run --checkpoint keeps the script's exit code and says it checkpointed nothing
        assert job["returncode"] != 0
    else:  # its one-line refusal, not a traceback that happens to hold the words
        assert "tfrepro run --checkpoint: " in said, said[-3000:]


def _result(job: dict, pattern: str, index: int = 0) -> dict:
    _ok(job)
    lines = job["results"].get(pattern, [])
    assert len(lines) > index, f"no result for {pattern}: {job['stderr'][-2000:]}"
    return {k: v for k, v in lines[index].items() if k != "loss"}


patterns = pytest.mark.parametrize("pattern", PATTERNS)


# --- the cells ---------------------------------------------------------------------------------------

@patterns
def test_patch(runs, pattern):
    """Fresh processes, one seed: the same bits (check's two runs, run, and patch(S) in the script)."""
    check = runs.get("entry", "check")
    results = [_result(check, pattern, 0), _result(check, pattern, 1), _result(runs.get("entry", "run"), pattern),
               _result(runs.get("entry", "inscript"), pattern)]
    assert all(r == results[0] for r in results), results


@patterns
def test_keyed(runs, pattern):
    """Keyed initial weights and keyed shuffles: fresh processes, one seed, the same bits."""
    first, second = (_result(runs.get("entry", entry), pattern) for entry in ("keyed", "keyed2"))
    assert first == second


@pytest.mark.exact
@patterns
def test_exact(runs, pattern):
    """The exact tier: the same bits with 1 thread and oneDNN off as with 2 threads and oneDNN on; or, where the
    pattern holds ops the tier does not cover, refused by name before its first step (its audit,
    ``tfrepro.ops.exact.coverage``), the same ops named in both runs. On Keras 2, the patterns outside
    ``KERAS2_EXACT_PAIRS`` run once."""
    jobs = [runs.get(*job) for job in _jobs_for("exact", pattern)]
    for job in jobs:
        _ok(job)
    results = [_result(job, pattern) for job in jobs]
    if (pattern, "exact") in REFUSED:
        words = REFUSED[(pattern, "exact")]
        assert all(words in result.get("refused", "") for result in results), results
        assert all(r == results[0] for r in results) and "not covered" in results[0]["refused"]
        return
    assert "refused" not in results[0], results[0]["refused"]
    assert all(r == results[0] for r in results)


@patterns
def test_check(runs, pattern):
    if (pattern, "check") in REFUSED:
        return _refusal(runs, "check", pattern)
    from tfrepro import compare

    index = [p for p in PATTERNS if (p, "check") not in REFUSED].index(pattern)  # fit-K of `zoo.py all`
    clean = runs.get("entry", "check")
    _ok(clean)
    assert "identical" in clean["stdout"], clean["stdout"][-2000:]
    assert compare(*(clean["folder"] / "out" / f"run-{r}" / f"fit-{index}.jsonl" for r in (0, 1))).identical
    if KERAS2:  # Keras 2's planted divergence, gradients recorded, is tests/proof's (b1), within CI's budget
        return
    planted = runs.get("entry", "check", "1")
    assert planted["returncode"] == 1, planted["stdout"][-2000:] + planted["stderr"][-2000:]
    assert "diverged" in planted["stdout"]
    comparison = compare(*(planted["folder"] / "out" / f"run-{r}" / f"fit-{index}.jsonl" for r in (0, 1)))
    assert not comparison.identical, str(comparison)  # naming the layer is doctor's column


@pytest.mark.skipif(KERAS2, reason=KERAS3_ONLY["doctor"])
@patterns
def test_doctor(runs, pattern):
    if (pattern, "doctor") in REFUSED:
        return _refusal(runs, "doctor", pattern)
    index = [p for p in PATTERNS if (p, "doctor") not in REFUSED].index(pattern)  # fit-K of `zoo.py all`
    job = runs.get("entry", "doctor_every_fit")
    assert job["returncode"] == 1, job["stdout"][-2000:] + job["stderr"][-3000:]
    assert len(job["reports"]) == len([p for p in PATTERNS if (p, "doctor") not in REFUSED]), job["stdout"][-2000:]
    findings = job["reports"][index]["diagnosis"]["findings"]
    blamed = [f["where"] for f in findings if f["severity"] == "nondeterministic"]
    assert blamed and "culprit" in blamed[0], json.dumps(findings, indent=1)[:3000]


@patterns
def test_resume(runs, pattern):
    if (pattern, "resume") in REFUSED:
        return _refusal(runs, "resume", pattern)
    killed = runs.get("resume_killed", pattern)
    assert killed["returncode"] == -signal.SIGKILL, killed["stderr"][-3000:]
    whole, resumed = runs.get("resume_whole"), runs.get("resume_resumed")
    # one checkpoint folder a killed pattern (one fit or one loop: a pattern killed in the first of two
    # fits would shift the later fits' folders), and as many fit folders as the uninterrupted run made
    assert len(resumed["checkpoints"][pattern]) == 1, resumed["checkpoints"]
    assert resumed["fits"] == len(list((whole["folder"] / "ckpt").iterdir()))
    assert _result(resumed, pattern) == _result(whole, pattern)
    # and it did resume (a run that found no checkpoint would train from the start to the same bits)
    folder = resumed["checkpoints"][pattern][0]
    assert f"tfrepro: resumed from {folder}{os.sep}" in resumed["stderr"], resumed["stderr"][-3000:]


@pytest.mark.skipif(KERAS2, reason=KERAS3_ONLY["seed"])
@patterns
def test_seed(runs, pattern):
    results = {entry: _result(runs.get("entry", entry), pattern) for entry in _ENTRIES}
    results["check run 1"] = _result(runs.get("entry", "check"), pattern, 1)
    different = {entry: r for entry, r in results.items() if r != results["run"]}
    assert not different, {"run": results["run"], **different}
    if (pattern, "resume") not in REFUSED:  # run --checkpoint (the resume column's), beside a run without the
        alone = _result(runs.get("entry", "run", "0", "resume"), pattern)  # patterns it refuses
        assert _result(runs.get("resume_whole"), pattern) == alone


@pytest.mark.workers
@patterns
def test_workers(runs, pattern):
    if (pattern, "workers") in REFUSED:
        return _refusal(runs, "workers", pattern)
    if KERAS2:
        pytest.skip(KERAS3_SUPPORTED_ONLY["workers"])
    from tfrepro import compare

    index = [p for p in PATTERNS if (p, "workers") not in REFUSED].index(pattern)  # fit-K of `zoo.py all`
    job = runs.get("workers", "all")
    _ok(job)
    assert "identical: 2 runs x 2 workers" in job["stdout"], job["stdout"][-2000:]
    trace = lambda run, worker: job["folder"] / "out" / f"run-{run}" / f"worker-{worker}" / f"fit-{index}.jsonl"
    for a, b in [((0, 0), (0, 1)), ((1, 0), (1, 1)), ((0, 0), (1, 0)), ((0, 1), (1, 1))]:
        comparison = compare(trace(*a), trace(*b))
        assert comparison.identical and comparison.records_compared > 1, str(comparison)
    lines = job["results"][pattern]
    assert sorted(line["worker"] for line in lines) == [0, 0, 1, 1]
    assert len({line["weights"] for line in lines}) == 1, lines  # model and optimizer, on every worker


def test_the_docs_list_every_refused_cell():
    section = ZOO_PAGE.read_text()
    for (pattern, capability), words in REFUSED.items():
        assert f"`{pattern}`" in section and capability in section, (pattern, capability)
    # the matrix: a cell says "refused" exactly where this Keras refuses it
    header = next(line for line in section.splitlines() if line.startswith("| pattern | patch |"))
    columns = [cell.strip() for cell in header.strip("|").split("|")][1:]
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        pattern = cells[0].strip("`")
        if len(cells) != len(columns) + 1 or pattern not in PATTERNS:
            continue
        for capability, cell in zip(columns, cells[1:]):
            refused_here = cell == "refused" or (cell == "refused on Keras 2" and KERAS2) or (
                cell == "refused on Keras 3" and not KERAS2)
            assert refused_here == ((pattern, capability) in REFUSED), (pattern, capability, cell)
