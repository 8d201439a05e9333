"""TensorFlow's and Keras's own tests under the exact tier: which stock-passing tests it loses, and why.

    python tests/conformance/upstream_suites.py [--suite NAME ...] [--out DIR]

Runs each suite twice in fresh pytest processes, as it stands (no tfrepro) and under
``tfrepro.patch(0, ops="exact")`` (applied before TensorFlow loads, by this file as a pytest
plugin), and compares the outcomes test by test. A test that passes as it stands and not under the
exact tier is *refused by name* when its failure names the refusal (the tier's ``UncoveredOpError``,
its ``NotImplementedError`` for a second-order gradient, TF's op-determinism errors), and *lost*
otherwise. Prints a table per suite and the lost tests with their first error line; exits 1 if any
test is lost, 0 if none.

The suites are the test files Keras ships in its wheel for the layers and optimizers the tier
covers, and the kernel test bases TF's wheel ships for the ops it replaces (each run through a
subclass written to ``--out``). Nothing is downloaded. Slow (minutes per suite): not part of CI;
its latest figures are in ``docs/explanation/exact-tier.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ARM = "UPSTREAM_ARM"  # "exact" in the exact tier's processes; set for this file as a pytest plugin
RECORDS = "UPSTREAM_RECORDS"  # where the plugin writes one JSON line per test

KERAS_SUITES = {
    "dense": ["layers/core/dense_test.py", "layers/core/einsum_dense_test.py", "layers/core/embedding_test.py"],
    "convolution": ["layers/convolutional/conv_test.py", "layers/convolutional/conv_transpose_test.py",
                    "layers/convolutional/depthwise_conv_test.py"],
    "pooling": ["layers/pooling/max_pooling_test.py", "layers/pooling/average_pooling_test.py",
                "layers/pooling/global_average_pooling_test.py", "layers/pooling/global_max_pooling_test.py"],
    "normalization": ["layers/normalization/batch_normalization_test.py",
                      "layers/normalization/layer_normalization_test.py"],
    "attention": ["layers/attention/multi_head_attention_test.py"],
    "recurrent": ["layers/rnn/lstm_test.py", "layers/rnn/gru_test.py"],
    "activations": ["activations/activations_test.py"],
    "optimizers": ["optimizers/adam_test.py", "optimizers/sgd_test.py"],
}
TF_BASES = {  # suite -> (module, class) of a kernel test base in TF's wheel
    "tf_xent": ("tensorflow.python.kernel_tests.nn_ops.xent_op_test_base", "XentOpTestBase"),
    "tf_sparse_xent": ("tensorflow.python.kernel_tests.sparse_ops.sparse_xent_op_test_base", "SparseXentOpTestBase"),
    "tf_bias_add": ("tensorflow.python.kernel_tests.nn_ops.bias_op_base", "BiasAddTestBase"),
    "tf_depthwise_conv": ("tensorflow.python.kernel_tests.nn_ops.depthwise_conv_op_base", "DepthwiseConv2DBase"),
}
SUITES = (*KERAS_SUITES, *TF_BASES)
# What a refusal by name says (the exact tier's, TF's op determinism's)
NAMED = ("UncoveredOpError", "tfrepro exact tier", "not covered", "does not have a deterministic implementation",
         "determinism is enabled")


# --- as a pytest plugin (``-p upstream_suites``) ---------------------------------------------------

def pytest_configure(config) -> None:
    if os.environ.get(ARM) == "exact":
        import tfrepro

        tfrepro.patch(0, ops="exact")


def pytest_runtest_logreport(report) -> None:
    if report.when != "call" and report.passed:
        return
    if report.when == "teardown" and report.passed:
        return
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    message = crash.message if crash is not None else (str(report.longrepr) if report.longrepr else "")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    # A refusal raised in a tf.function reads "in user code:", its own words further down: keep those.
    named = [line for line in lines if any(words in line for words in NAMED)]
    record = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
              "message": (named or lines or [""])[0][:300]}
    with open(os.environ[RECORDS], "a") as out:
        out.write(json.dumps(record) + "\n")


# --- the comparison ---------------------------------------------------------------------------------

def _files(suite: str, folder: Path) -> list[str]:
    if suite in KERAS_SUITES:
        root = Path(importlib.util.find_spec("keras").submodule_search_locations[0]) / "src"
        return [str(root / name) for name in KERAS_SUITES[suite]]
    module, cls = TF_BASES[suite]
    path = folder / f"{suite}_test.py"
    path.write_text(f"import {module} as base\n\n\nclass Test{cls}(base.{cls}):\n    pass\n")  # the base: not collected
    return [str(path)]


def _outcomes(suite: str, arm: str, folder: Path) -> dict[str, dict]:
    """Each test's outcome in one fresh pytest process: passed, failed, skipped or error."""
    records = folder / f"{suite}-{arm}.jsonl"
    records.unlink(missing_ok=True)
    env = dict(os.environ, **{ARM: arm, RECORDS: str(records)}, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    files = _files(suite, folder)
    root = os.path.commonpath([str(Path(name).parent) for name in files])  # test ids relative to it
    args = [sys.executable, "-m", "pytest", "-q", "-p", "upstream_suites", "-p", "no:cacheprovider", "-p", "no:xdist",
            "-p", "no:randomly", "-o", "addopts=", "--rootdir", root, *files]
    proc = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):  # 1: some tests failed; anything else: pytest itself did not run them
        raise SystemExit(f"{suite} ({arm}): pytest exited {proc.returncode}\n"
                         f"{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    found: dict[str, dict] = {}
    for line in records.read_text().splitlines() if records.exists() else []:
        record = json.loads(line)
        if found.get(record["test"], {}).get("outcome") in ("failed", "error"):
            continue  # the first failure of a test (setup, call or teardown) is its outcome
        outcome = "error" if record["when"] != "call" and record["outcome"] == "failed" else record["outcome"]
        found[record["test"]] = dict(record, outcome=outcome)
    return found


def compare(suite: str, folder: Path) -> tuple[dict[str, int], list[dict]]:
    """The counts of one suite's comparison, and its lost tests."""
    stock, exact = _outcomes(suite, "stock", folder), _outcomes(suite, "exact", folder)
    passing = [test for test, record in stock.items() if record["outcome"] == "passed"]
    counts = {"stock-passing": len(passing), "pass under exact": 0, "refused by name": 0, "skipped under exact": 0,
              "lost": 0}
    lost = []
    for test in passing:
        record = exact.get(test, {"outcome": "missing", "message": "not run under the exact tier"})
        if record["outcome"] == "passed":
            counts["pass under exact"] += 1
        elif record["outcome"] == "skipped":
            counts["skipped under exact"] += 1
        elif any(words in record["message"] for words in NAMED):
            counts["refused by name"] += 1
        else:
            counts["lost"] += 1
            lost.append({"test": test, "message": record["message"]})
    return counts, lost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", action="append", choices=SUITES, help="a suite to run (default: all)")
    parser.add_argument("--out", help="a folder for the records (default: a temporary one)")
    args = parser.parse_args(argv)
    folder = Path(args.out or tempfile.mkdtemp(prefix="tfrepro-upstream-"))
    folder.mkdir(parents=True, exist_ok=True)
    total_lost = []
    print(f"{'suite':20s} {'stock-passing':>13s} {'pass':>6s} {'refused':>8s} {'skipped':>8s} {'lost':>5s}")
    for suite in args.suite or SUITES:
        counts, lost = compare(suite, folder)
        print(f"{suite:20s} {counts['stock-passing']:13d} {counts['pass under exact']:6d} "
              f"{counts['refused by name']:8d} {counts['skipped under exact']:8d} {counts['lost']:5d}", flush=True)
        total_lost += lost
    for item in total_lost:
        print(f"lost: {item['test']}: {item['message']}")
    print(f"records in {folder}")
    return 1 if total_lost else 0


if __name__ == "__main__":
    sys.exit(main())
