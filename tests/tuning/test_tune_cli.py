"""`tfrepro tune`: a script's hyperparameters raced over seeds in fresh interpreters; the printed
rerun command reproduces the best fit's weights; bad input exits 2 in one line before any run;
`tfrepro.tuning.hyperparameters` refuses a name the script does not take."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import SCRIPTS, clean_env, run_tfrepro
from tfrepro.tuning import hyperparameters
from tfrepro.tuning.script_tuning import HYPERPARAMETERS_ENV, parse_params

SCRIPT = SCRIPTS / "tune_me.py"


@pytest.mark.slow
def test_tune_races_a_script_and_its_rerun_command_gives_the_same_weights(tmp_path):
    out = tmp_path / "out"
    proc = run_tfrepro("tune", "--param", "units=2,16", "--budget", "4", "--min-seeds", "2", "--metric", "val_loss",
                       "--out", str(out), "--", sys.executable, str(SCRIPT), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = json.loads((out / "tuning.json").read_text())
    assert saved["spent"] == len(list(out.glob("c*/seed-*"))) <= 4
    assert saved["goal"] == "min" and saved["metric"] == "val_loss"
    assert [c["config"] for c in saved["candidates"]] == [{"units": 2}, {"units": 16}]
    best = next(c for c in saved["candidates"] if c["status"] == "best")
    seed = best["scores"][0][0]
    logged = (out / best["name"] / f"seed-{seed}" / "stdout.log").read_text()
    rerun = re.search(r"rerun the best \(c\d, seed \d+\): (.*)", proc.stdout).group(1)
    assert rerun.startswith(f"{HYPERPARAMETERS_ENV}=") and "tfrepro run --seed" in rerun
    again = subprocess.run(rerun.replace("tfrepro run", f"{sys.executable} -m tfrepro run", 1), shell=True,
                           env=clean_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert re.search(r"weights \w+", again.stdout).group(0) == re.search(r"weights \w+", logged).group(0)
    logs = {path: path.stat().st_mtime_ns for path in out.glob("c*/seed-*/stdout.log")}
    proc = run_tfrepro("tune", "--param", "units=2,16", "--budget", "4", "--min-seeds", "2", "--metric", "val_loss",
                       "--out", str(out), "--", sys.executable, str(SCRIPT), timeout=600)  # every fit is read back, none run again
    assert proc.returncode == 0 and json.loads((out / "tuning.json").read_text()) == saved
    assert {path: path.stat().st_mtime_ns for path in logs} == logs


@pytest.mark.parametrize("args, message", [
    ((), "needs at least one --param"),
    (("--param", "units"), "write NAME=V1,V2"),
    (("--param", "units=2,", "--budget", "4"), "a value is empty"),
    (("--param", "units=2", "--param", "units=4", "--budget", "4"), "given twice"),
    (("--param", "units=2,4"), "--budget must be a number of fits"),
    (("--param", "units=2,4", "--budget", "4", "--metric", "val_accuracy"), "--goal max"),
    (("--param", "units=2,4", "--budget", "4", "--max-seeds", "1"), "--min-seeds must be at least 2"),
    (("--param", "units=2,4", "--budget", "4", "--min-seeds", "1"), "--min-seeds must be at least 2"),
    (("--param", "units=2,4", "--budget", "4", "--max-seeds", "10000000"), "--max-seeds at most 100000"),
    (("--param", "units=2,4", "--budget", "4", "--seeds", "0-2"), "at least --max-seeds seeds"),
    (("--param", "lr=0.1,NaN", "--budget", "4"), "lr: NaN is not a finite number"),
    (("--param", "lr=Infinity", "--budget", "4"), "lr: Infinity is not a finite number"),
    (("--param", "units=2,4", "--budget", "4", "--seeds", ""), "'' is not a seed or a range"),
])
def test_tune_bad_options_exit_2_in_one_line_before_any_run(tmp_path, args, message):
    proc = run_tfrepro("tune", *args, "--out", str(tmp_path / "out"), "--", sys.executable, str(SCRIPT))
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_grid_is_every_combination_with_json_values():
    assert parse_params(["lr=0.1,0.10,1e-1", "flag=1,true"]) == [{"lr": 0.1, "flag": 1}, {"lr": 0.1, "flag": True}]
    assert parse_params(["units=16,64", "act=relu,gelu", "lr=1e-3"]) == [
        {"units": 16, "act": "relu", "lr": 0.001}, {"units": 16, "act": "gelu", "lr": 0.001},
        {"units": 64, "act": "relu", "lr": 0.001}, {"units": 64, "act": "gelu", "lr": 0.001}]


def test_a_script_gets_its_defaults_or_what_tune_passed_and_never_a_name_it_lacks(monkeypatch):
    assert hyperparameters(units=4) == {"units": 4}
    monkeypatch.setenv(HYPERPARAMETERS_ENV, json.dumps({"units": 16}))
    assert hyperparameters(units=4, lr=0.1) == {"units": 16, "lr": 0.1}
    monkeypatch.setenv(HYPERPARAMETERS_ENV, json.dumps({"unit": 16}))
    with pytest.raises(ValueError, match="passed unit, which this script does not take: it takes units"):
        hyperparameters(units=4)
    monkeypatch.setenv(HYPERPARAMETERS_ENV, "[1]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        hyperparameters(units=4)
