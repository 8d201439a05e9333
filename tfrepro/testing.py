"""Assertions for users' own test suites (pytest or unittest).

    def test_training_is_reproducible():
        tfrepro.testing.assert_reproducible(train, runs=2)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfrepro.proof.comparison import Comparison, compare
from tfrepro.proof.traces import PathLike, Trace
from tfrepro.proof.verification import verify


def assert_reproducible(train_fn: Callable[[], Any], runs: int = 2, *, seed: int = 0, patch: bool = True,
                        gradients: bool = False) -> None:
    """Fail with the first divergence unless ``train_fn`` trains identically in every run
    (see ``tfrepro.verify``)."""
    result = verify(train_fn, runs, seed=seed, patch=patch, gradients=gradients)
    if not result.identical:
        raise AssertionError(f"training is not reproducible: {result}")


def assert_traces_identical(a: PathLike | Trace, b: PathLike | Trace) -> Comparison:
    """Fail with the first divergence unless the two traces are identical; returns the comparison."""
    comparison = compare(a, b)
    if not comparison.identical:
        raise AssertionError(f"traces differ:\n{comparison}")
    return comparison
