"""Seed statistics: the interval, the comparison of two sweeps (known difference, none), its
false-positive rate on sweeps that differ only by chance, the coverage of its interval at small n
(simulated, with a negative control), and the cases seed noise cannot judge."""

import json
import math

import numpy as np
import pytest

from tfrepro.sweeps.statistics import SeedRun, SweepResult, compare_sweeps

pytest.importorskip("scipy")


def result(values, metric="accuracy"):
    return SweepResult(metric, [SeedRun(seed, float(v)) for seed, v in enumerate(values)])


def test_summary_is_the_student_t_interval():
    s = result([1, 2, 3, 4, 5]).summary()
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)  # t(0.975, 4) * s / sqrt(n)
    assert (s.n, s.mean, s.min, s.max) == (5, 3.0, 1.0, 5.0) and s.std == pytest.approx(math.sqrt(2.5))
    assert s.ci_low == pytest.approx(3 - half) and s.ci_high == pytest.approx(3 + half)
    one = result([0.5]).summary()
    assert one.ci_low is None and one.std == 0.0


def test_failed_seeds_are_kept_but_not_counted():
    sweep = SweepResult("loss", [SeedRun(2, 0.3), SeedRun(0, 0.1), SeedRun(1, None, "failed", "exit code 1")])
    assert [run.seed for run in sweep.runs] == [0, 1, 2] and sweep.values.tolist() == [0.1, 0.3]
    assert [run.seed for run in sweep.failed] == [1] and "failed: exit code 1" in str(sweep)
    assert SweepResult.from_dict(sweep.to_dict()) == sweep
    assert sweep.to_csv().splitlines()[0] == "seed,loss,status,detail"
    with pytest.raises(ValueError, match="no seed gave a value"):
        SweepResult("loss", [SeedRun(0, None, "failed")]).summary()


def test_a_known_difference_is_found_and_none_is_not_claimed():
    rng = np.random.default_rng(0)
    a = result(rng.normal(0.80, 0.01, 12))
    better = compare_sweeps(a, result(rng.normal(0.83, 0.01, 12)), goal="max")
    assert better.distinguishable and better.p_value < 0.001 and better.ci_low > 0
    assert better.verdict.startswith("B's accuracy is higher than A's (better) beyond seed noise")
    same = compare_sweeps(a, result(rng.normal(0.80, 0.01, 12)), goal="max")
    assert not same.distinguishable and same.ci_low <= 0 <= same.ci_high
    assert "not distinguishable from A beyond seed noise" in same.verdict
    worse = compare_sweeps(a, result(rng.normal(0.75, 0.01, 12)), goal="max")
    assert worse.distinguishable and "(worse)" in worse.verdict


def test_false_positives_stay_near_the_nominal_rate():
    """Pairs drawn from one distribution: 'distinguishable' about 5% of the time, not more."""
    rng = np.random.default_rng(1)
    hits = sum(compare_sweeps(rng.normal(0, 1, 10), rng.normal(0, 1, 10)).distinguishable for _ in range(200))
    assert hits <= 20  # 10%: a 5% test with a little slack for 200 draws


def test_the_comparison_is_reproducible_and_rejects_what_it_cannot_compare():
    a, b = [0.1, 0.2, 0.15, 0.12], [0.3, 0.25, 0.28, 0.31]
    assert compare_sweeps(a, b) == compare_sweeps(a, b)
    with pytest.raises(ValueError, match="sweep B holds a value that is not finite"):
        compare_sweeps(a, [0.1, float("nan")])
    with pytest.raises(ValueError, match="goal"):
        compare_sweeps(a, b, goal="lower")
    assert result([0.9] * 3).summary().ci_low == 0.9  # no spread: the interval is the mean
    with pytest.raises(ValueError, match="different metrics"):
        compare_sweeps(result(a), result(b, metric="loss"))
    with pytest.raises(TypeError, match="SweepResult or a sequence of numbers"):
        compare_sweeps(a, ["x", "y"])
    with pytest.raises(TypeError, match="SweepResult.of"):
        SweepResult("m", [1.0, 2.0])
    with pytest.raises(ValueError, match="between 0 and 1"):
        result(a).summary(95)


def test_large_sweeps_compare_in_bounded_memory():
    rng = np.random.default_rng(2)
    assert not compare_sweeps(rng.normal(0, 1, 50_000), rng.normal(0, 1, 50_000)).distinguishable


def coverage(interval, n, trials=1000, seed=0):
    """The share of ``trials`` simulated comparisons, ``n`` seeds per arm, whose interval holds the
    true difference (A ~ N(0.80, 0.01), B ~ N(0.82, 0.02): unequal spreads, as configurations have)."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0.80, 0.01, (trials, n)), rng.normal(0.82, 0.02, (trials, n))
    return np.mean([low <= 0.02 <= high for low, high in (interval(x, y) for x, y in zip(a, b))])


def compared_interval(a, b):
    comparison = compare_sweeps(a, b)
    excludes_zero = not comparison.ci_low <= 0 <= comparison.ci_high
    assert comparison.distinguishable == (comparison.p_value < 0.05) == excludes_zero  # test and interval agree
    return comparison.ci_low, comparison.ci_high


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_the_95_percent_interval_covers_the_true_difference_95_percent_of_the_time(n):
    """1,000 simulated comparisons per n: the binomial band of a true 95% is 93.6-96.4% (3 sigma)."""
    assert 0.936 <= coverage(compared_interval, n) <= 0.975  # Welch is a little conservative at n=2


def test_the_coverage_check_catches_an_interval_that_is_too_narrow():
    """Negative control: the normal-quantile interval (z = 1.96 instead of Student's t) is the kind
    of small-n under-coverage the check exists for, and it fails it."""
    def z_interval(a, b):
        difference = np.mean(b) - np.mean(a)
        half = 1.959964 * math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))
        return difference - half, difference + half
    assert coverage(z_interval, 2) < 0.85 and coverage(z_interval, 3) < 0.93


def test_the_interval_is_welchs_and_agrees_with_its_p_value():
    a, b = [0.1, 0.2, 0.15, 0.12], [0.3, 0.25, 0.28, 0.31, 0.2]
    comparison = compare_sweeps(a, b)
    from scipy import stats

    assert comparison.p_value == pytest.approx(stats.ttest_ind(b, a, equal_var=False).pvalue, rel=1e-12)
    # scipy 1.17: ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    assert (comparison.ci_low, comparison.ci_high) == pytest.approx((0.0550813362, 0.1959186638), rel=1e-9)
    assert "95% CI (Welch t) [+0.05508, +0.1959]" in comparison.verdict


def test_arms_that_did_not_vary_across_seeds_get_no_verdict_from_seed_noise():
    shifted = compare_sweeps([0.9] * 3, [0.92] * 3)
    assert shifted.distinguishable is None and shifted.difference == pytest.approx(0.02)
    assert (shifted.ci_low, shifted.ci_high, shifted.p_value, shifted.effect_size) == (None, None, None, None)
    assert shifted.verdict.startswith("neither A nor B varied across seeds "
                                      "(A gave 0.9 in all 3 seeds, B 0.92 in all 3)")
    assert "no interval or p-value" in shifted.verdict and "beyond seed noise" not in shifted.verdict
    same = compare_sweeps([1.0, 1.0], [1.0, 1.0, 1.0])
    assert same.distinguishable is False and same.difference == 0 and same.p_value is None
    assert same.verdict.startswith("A and B are identical: every seed gave 1 in both")
    one_flat = compare_sweeps([0.9] * 3, [0.95, 0.96, 0.97])  # one arm's spread is enough for Welch
    assert one_flat.distinguishable and math.isfinite(one_flat.effect_size)


def test_too_few_seeds_to_tell_is_a_verdict():
    for a, b in (([0.1], [0.2, 0.3]), ([0.1, 0.2], [0.3]), ([0.1], [0.1])):
        few = compare_sweeps(a, b)
        assert few.distinguishable is None and few.ci_low is None and few.p_value is None and few.effect_size is None
        assert few.verdict.startswith(f"too few seeds to tell: A has {len(a)}, B has {len(b)}; at least 2 per arm")
    with pytest.raises(ValueError, match="sweep A has no values"):
        compare_sweeps([], [0.2, 0.3])


def test_save_makes_its_folder(tmp_path):
    sweep = SweepResult.of([0.1, 0.2], "loss")
    sweep.save(tmp_path / "new" / "deeper")
    assert SweepResult.from_dict(json.loads((tmp_path / "new" / "deeper" / "sweep.json").read_text())) == sweep


def test_report_metric_writes_for_a_launcher_and_is_silent_outside_one(tmp_path, monkeypatch):
    import tfrepro
    from tfrepro.launching.config import ENV_NAMES
    from tfrepro.sweeps.metrics import REPORTED

    monkeypatch.delenv(ENV_NAMES["trace_dir"], raising=False)
    tfrepro.report_metric("accuracy", 0.5)  # outside a launcher: nothing, anywhere
    assert not (tmp_path / REPORTED).exists()
    monkeypatch.setenv(ENV_NAMES["trace_dir"], str(tmp_path))
    tfrepro.report_metric("accuracy", 0.5)
    tfrepro.report_metric("loss", float("nan"))
    assert json.loads((tmp_path / REPORTED).read_text()) == {"accuracy": 0.5, "loss": "nan"}
    with pytest.raises(ValueError, match="non-empty string"):
        tfrepro.report_metric("", 1.0)


def test_sweep_in_process_seeds_each_run_and_records_a_failing_seed():
    import random

    import tfrepro

    def train(seed):
        if seed == 2:
            raise RuntimeError("diverged to nan")
        return random.random()

    result = tfrepro.sweep(train, seeds=[0, 1, 2], metric="score")
    assert [run.seed for run in result.runs] == [0, 1, 2] and result.metric == "score"
    assert [run.value for run in result.runs[:2]] == [random.Random(0).random(), random.Random(1).random()]
    assert result.runs[2].status == "failed" and "diverged to nan" in result.runs[2].detail
    assert list(result.values) == [run.value for run in result.runs[:2]]
