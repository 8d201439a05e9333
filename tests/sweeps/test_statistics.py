"""Seed statistics: the interval, the comparison of two sweeps (known difference, none), and its
false-positive rate on sweeps that differ only by chance."""

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
    with pytest.raises(ValueError, match="at least two values to compare, all finite"):
        compare_sweeps([0.1], b)
    with pytest.raises(ValueError, match="goal"):
        compare_sweeps(a, b, goal="lower")
    constant = compare_sweeps([1.0, 1.0], [1.0, 1.0])
    assert not constant.distinguishable and constant.difference == 0
    shifted = compare_sweeps([0.9] * 3, [0.92] * 3)  # no seed noise at all: the difference is real
    assert shifted.distinguishable and shifted.ci_low == shifted.ci_high == pytest.approx(0.02)
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
    assert not compare_sweeps(rng.normal(0, 1, 5000), rng.normal(0, 1, 5000), resamples=999).distinguishable
