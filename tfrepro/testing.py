"""Assertions for users' own test suites (pytest or unittest).

    def test_training_is_reproducible():
        tfrepro.testing.assert_reproducible(train, runs=2)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def assert_batch_invariant(predict_fn: Callable[[Any], Any], inputs: Any,
                           batch_sizes: Sequence[int] = (1, 7, 64)) -> None:
    """Asserts that `predict_fn` gives every sample the same bits whatever batch it arrives in.

    Splits `inputs` into consecutive batches of each size in `batch_sizes` (the last one shorter
    where the size does not divide the samples), calls `predict_fn` on each batch, and compares each
    sample's output, raw bytes, with its output in the first batching. Under
    `tfrepro.patch(ops="exact")` a model's predictions hold this (the exact tier's products and sums
    are formed per sample; see the exact tier's explanation); TF's own kernels may not, since their
    blocking and summation order can change with the batch size.

    ```python
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(3)])
    tfrepro.testing.assert_batch_invariant(model, np.ones((20, 8), "float32"), batch_sizes=(1, 20))
    ```

    Args:
        predict_fn: A function of one batch, returning its outputs with the batch on the first axis:
            a Keras model, its `predict_on_batch`, a SavedModel's serving function. Outputs may be
            an array or tensor, or a list, tuple or dict of them.
        inputs: The samples: an array or tensor with the samples on the first axis, or a list, tuple
            or dict of them (a model with several inputs), all with the same number of samples.
        batch_sizes: The batchings to compare, positive ints. Defaults to (1, 7, 64).

    Raises:
        AssertionError: A sample's output differs between two batchings; the message names the batch
            size, how many samples differ, and the first one with its largest difference.
        ValueError: `batch_sizes` is empty or holds a size that is not a positive int, or `inputs`
            holds no sample or parts with different numbers of samples.
    """
    import numpy as np

    sizes = list(batch_sizes)
    if not sizes or any(isinstance(size, bool) or not isinstance(size, int) or size < 1 for size in sizes):
        raise ValueError(f"batch_sizes must be positive ints, at least one; got {batch_sizes!r}")
    parts = _flatten(inputs)
    counts = {len(part) for part in parts}
    if len(counts) != 1 or counts == {0}:
        raise ValueError(f"inputs must hold at least one sample, the same number in every part; got {sorted(counts)}")
    samples = counts.pop()

    def batched(size: int) -> list[np.ndarray]:
        outputs = []
        for start in range(0, samples, size):
            batch = _map(lambda part: part[start:start + size], inputs)
            outputs.append([np.asarray(out) for out in _flatten(predict_fn(batch))])
        return [np.concatenate(pieces) for pieces in zip(*outputs)]

    reference = batched(sizes[0])
    for size in sizes[1:]:
        for ours, theirs in zip(batched(size), reference):
            differing = [i for i in range(samples) if ours[i].tobytes() != theirs[i].tobytes()]
            if differing:
                first = differing[0]
                gap = np.max(np.abs(ours[first].astype(np.float64) - theirs[first].astype(np.float64)))
                raise AssertionError(
                    f"not batch-invariant: in batches of {size}, {len(differing)} of {samples} samples' outputs "
                    f"differ from batches of {sizes[0]}; the first, sample {first}, by up to {gap:.3g}")


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _flatten(value[key])]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    return [value]


def _map(function: Callable[[Any], Any], value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _map(function, item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map(function, item) for item in value)
    return function(value)
