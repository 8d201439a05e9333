"""``tfrepro sweep`` and ``tfrepro.sweep``: the table and the interval, shards merged into the same
table, resumption, metrics read from traces, bad input, and the plots."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SCRIPTS, run_tfrepro
from tfrepro.sweeps.running import format_seeds, parse_seeds

pytest.importorskip("scipy")

REPORTING = """
import random, sys
from pathlib import Path
import tfrepro
Path(sys.argv[1]).open("a").write("ran\\n")  # counts the runs
tfrepro.report_metric("score", random.random())
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "score.py"
    path.write_text(REPORTING)
    return path


def sweep(tmp_path, script, *options):
    return run_tfrepro("sweep", "--metric", "score", *options, "--", sys.executable, str(script),
                       str(tmp_path / "runs.txt"))


def runs(folder):
    return json.loads((Path(folder) / "sweep.json").read_text())["runs"]


@pytest.mark.slow
def test_three_seeds_print_the_table_and_the_interval_and_shards_merge_to_the_same(tmp_path, script):
    whole = sweep(tmp_path, script, "--seeds", "0-2", "--jobs", "2", "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    lines = whole.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ["0", "1", "2"]
    assert "n=3 mean=" in whole.stdout and "95% CI of the mean [" in whole.stdout
    assert "metric: reported by the script" in whole.stdout
    values = [run["value"] for run in runs(tmp_path / "whole")]
    assert len(set(values)) == 3  # the seeds differ ...
    import random
    assert values[2] == random.Random(2).random()  # ... and each is the seeded value, exactly
    for shard in ("0/2", "1/2"):
        done = sweep(tmp_path, script, "--seeds", "0-2", "--shard", shard, "--out", str(tmp_path / shard[0]))
        assert done.returncode == 0, done.stderr
    assert [run["seed"] for run in runs(tmp_path / "0")] == [0, 2]
    merged = run_tfrepro("sweep", "merge", str(tmp_path / "0"), str(tmp_path / "1"), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr
    assert runs(tmp_path / "merged") == runs(tmp_path / "whole")
    summary = [line for line in whole.stdout.splitlines() if line.startswith("n=3")]
    assert summary and summary[0] in merged.stdout
    assert (tmp_path / "merged" / "sweep.csv").read_text() == (tmp_path / "whole" / "sweep.csv").read_text()


@pytest.mark.slow
def test_a_rerun_with_the_same_folder_skips_finished_seeds_of_the_same_command(tmp_path, script):
    out = str(tmp_path / "out")
    first = sweep(tmp_path, script, "--seeds", "0-1", "--out", out)
    assert first.returncode == 0 and "skipped" not in first.stdout
    rerun = sweep(tmp_path, script, "--seeds", "0-1,3", "--out", out)
    assert rerun.returncode == 0
    assert (tmp_path / "runs.txt").read_text().count("ran") == 3  # 2, then only seed 3
    said = [line for line in rerun.stdout.splitlines() if "skipped" in line]
    assert said == [f"skipped seeds 0-1: finished earlier in {out} with the same command and options"], rerun.stdout
    assert [run["seed"] for run in runs(out)] == [0, 1, 3]
    other = tmp_path / "nan.py"  # another command: every seed runs again, and a NaN fails its seed
    other.write_text("import tfrepro\ntfrepro.report_metric('score', float('nan'))\n")
    rerun = run_tfrepro("sweep", "--metric", "score", "--seeds", "0", "--out", out, "--", sys.executable, str(other))
    assert rerun.returncode == 2 and "score is nan" in rerun.stdout
    assert [run["status"] for run in runs(out)] == ["failed"]  # and sweep.json stays valid JSON


def test_skipped_seeds_are_written_as_the_seeds_option_reads_them():
    for text in ("0-4,10", "0", "0,2,4", "3-5,7-9,11"):
        assert format_seeds(parse_seeds(text)) == text


@pytest.mark.slow
def test_a_failing_seed_and_bad_input_exit_2_in_one_line(tmp_path, script):
    wrong_metric = run_tfrepro("sweep", "--metric", "accuracy", "--seeds", "0", "--out", str(tmp_path / "w"), "--",
                               sys.executable, str(script), str(tmp_path / "runs.txt"))
    assert wrong_metric.returncode == 2 and "no metric 'accuracy': the script reported ['score']" in wrong_metric.stdout
    for options in (["--seeds", "5-1"], ["--seeds", "x"], ["--seeds", "0-4294967296"], ["--seeds", "0-200000"],
                    ["--shard", "2/2"], ["--seeds", "0", "--shard", "1/2"], ["--jobs", "0"], ["--plot", "p.xyz"],
                    ["--plot", str(tmp_path / "nowhere" / "p.png")]):
        bad = sweep(tmp_path, script, *options, "--out", str(tmp_path / "never"))
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, (options, bad.stderr)
        assert "Traceback" not in bad.stderr and "tfrepro sweep --help" in bad.stderr
        assert not (tmp_path / "never").exists()  # nothing created
    mixed = run_tfrepro("sweep", "--metric", "zzz", "merge", str(tmp_path / "m"))
    assert mixed.returncode == 2 and "`merge` must come right after `sweep`" in mixed.stderr
    nothing = run_tfrepro("sweep", "merge", str(tmp_path / "nowhere"))
    assert nothing.returncode == 2 and "holds no sweep.json" in nothing.stderr
    assert nothing.stderr.startswith("tfrepro sweep merge: error:") and "tfrepro sweep merge --help" in nothing.stderr


def test_sweep_merge_is_a_command_of_its_own_in_the_help():
    listed = run_tfrepro("--help")
    assert listed.returncode == 0 and "sweep merge" in listed.stdout
    own = run_tfrepro("sweep", "merge", "--help")
    assert own.returncode == 0 and own.stdout.startswith("usage: tfrepro sweep merge")


@pytest.mark.slow
@pytest.mark.keras
def test_metrics_from_the_fit_trace_final_or_best_and_the_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out, image = tmp_path / "out", tmp_path / "sweep.png"
    final = run_tfrepro("sweep", "--seeds", "0-1", "--jobs", "2", "--out", str(out), "--plot", str(image), "--",
                        sys.executable, str(SCRIPTS / "unmodified.py"))
    assert final.returncode == 0, final.stderr
    assert "metric: final epoch (2) of the last Model.fit" in final.stdout
    finals = [run["value"] for run in runs(out)]
    best = run_tfrepro("sweep", "--seeds", "0-1", "--best", "min", "--out", str(out), "--",
                       sys.executable, str(SCRIPTS / "unmodified.py"))
    assert "lowest over 2 epochs" in best.stdout  # read again from the kept traces, not rerun
    assert all(run["value"] <= value for run, value in zip(runs(out), finals)) and finals[0] != finals[1]
    _assert_drawn(image)
    traces = [next((out / f"seed-{seed}").glob("fit-*.jsonl")) for seed in (0, 1)]
    compared = run_tfrepro("compare", str(traces[0]), str(traces[1]), "--plot", str(tmp_path / "runs.png"))
    assert compared.returncode == 1  # different seeds: the runs differ
    _assert_drawn(tmp_path / "runs.png")


def _assert_drawn(path):
    from matplotlib.image import imread

    pixels = imread(path)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert np.std(pixels) > 0.05 and np.mean(pixels[..., :3] < 0.5) > 0.005  # not blank: some dark ink


@pytest.mark.parametrize("args, message", [
    (("--seeds", "4-2"), "--seeds"),
    (("--seeds", "0-1", "--jobs", "0"), "--jobs"),
    (("--seeds", "0-1", "--shard", "2/2"), "--shard"),
])
def test_sweep_bad_options_exit_2_in_one_line_before_any_run(tmp_path, script, args, message):
    proc = run_tfrepro("sweep", "--metric", "score", *args, "--out", str(tmp_path / "out"), "--",
                       sys.executable, str(script), str(tmp_path / "runs.txt"))
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not (tmp_path / "runs.txt").exists() and not (tmp_path / "out").exists()
