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
    """Asserts that `train_fn` trains identically, bit for bit, in every run.

    Runs `tfrepro.verify(train_fn, runs, seed=seed, patch=patch, gradients=gradients)` and fails
    with its verdict (who differs from whom, where first, in which layer) unless every run is
    identical. The runs share this process; see `tfrepro.verify` for what that leaves out.

    ```python
    def test_training_is_reproducible():
        tfrepro.testing.assert_reproducible(train, runs=2)
    ```

    Args:
        train_fn: A function of no arguments that builds, compiles and fits the model(s).
        runs: How many times to call it, an int >= 2. Defaults to 2.
        seed: The seed for `patch` and for reseeding before each run, an int in [0, 2**32 - 1].
            Defaults to 0.
        patch: Whether to apply `tfrepro.patch(seed)` first. Defaults to True. The patch stays applied
            after the call, as with `verify`: wrap the call in `with tfrepro.patched(seed):` to leave
            the process as it was (for the tests that follow in the same process).
        gradients: Also compare every gradient the optimizer applies. Defaults to False.

    Raises:
        AssertionError: The runs are not identical (or called `Model.fit` a different number of
            times); the message holds the verdict.
        ValueError: The arguments are invalid, or `train_fn` never called `Model.fit`.
        TypeError: `train_fn` is not callable.
    """
    result = verify(train_fn, runs, seed=seed, patch=patch, gradients=gradients)
    if not result.identical:
        raise AssertionError(f"training is not reproducible: {result}")


def assert_traces_identical(a: PathLike | Trace, b: PathLike | Trace) -> Comparison:
    """Asserts that two traces are identical, bit for bit.

    Compares them with `tfrepro.compare` and fails with the comparison (the first divergence, or
    how the models differ) unless they are identical: comparable, complete and equal in every
    record.

    Args:
        a: Trace A: a path to a trace file or a `tfrepro.Trace`.
        b: Trace B, the same.

    Returns:
        The `tfrepro.Comparison`, identical.

    Raises:
        AssertionError: The traces are not identical; the message holds the comparison.
        FileNotFoundError: A path does not exist.
        IsADirectoryError: A path is a folder, not a trace.
        TraceError: A file is not a tfrepro trace, or is corrupt before its last line.
    """
    comparison = compare(a, b)
    if not comparison.identical:
        raise AssertionError(f"traces differ:\n{comparison}")
    return comparison
