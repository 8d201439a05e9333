"""``tfrepro.verify``: run a training function several times in this process and compare the runs."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

from tfrepro import _tf
from tfrepro.determinism import patching, seeding
from tfrepro.proof.fit_recording import record_fits
from tfrepro.proof.runs import RunsComparison, compare_runs
from tfrepro.proof.traces import Trace, read_trace


class Verification(RunsComparison):
    """The outcome of `tfrepro.verify`: each later run's `Model.fit` calls compared with run 0's.

    `print()` it for the verdict: "identical: ..." or who differs from whom, where first, and in
    which layer, then that comparison. `identical` is the verdict; `first_failure` the first
    `Comparison` that is not identical; `comparisons` all of them.

    Attributes:
        fits_per_run: How many times each run called `Model.fit`, run 0 first. Runs that called it a
            different number of times have diverged.
        fits: One `FitComparison` per later run and fit call (run k's i-th fit against run 0's),
            in run order.
        workers: The number of workers per run: 1 for `verify`.
        count_mismatch: Why the workers of a run disagree on their number of fit calls; empty for
            `verify`.
        communicated: False when the workers of `tfrepro check --workers` built no
            `MultiWorkerMirroredStrategy` (each trained alone); True for `verify`.
    """


def verify(train_fn: Callable[[], Any], runs: int = 2, *, seed: int = 0, patch: bool = True,
           gradients: bool = False) -> Verification:
    """Calls `train_fn()` several times and compares every `Model.fit` it makes, exactly.

    Before each run the Keras session is cleared (so layer names repeat) and every RNG is reseeded
    with `seed`; with `patch=True`, `tfrepro.patch(seed)` is applied first (and stays applied).
    `train_fn` builds, compiles and fits its model(s); nothing needs to be passed to `fit`: every
    `Model.fit` call is recorded as `ReproducibilityCallback` records it, to temporary files.
    Run k's i-th fit is compared with run 0's i-th, record by record (see `tfrepro.compare`).

    Limits: in-process runs share one TF runtime, thread pools and hash seed, so this proves less
    than separate processes do; use `tfrepro check` for cross-process proof.

    Args:
        train_fn: A function of no arguments that builds, compiles and fits the model(s); its
            return value is ignored.
        runs: How many times to call it, an int >= 2. Defaults to 2.
        seed: The seed for `patch` and for reseeding before each run, an int in [0, 2**32 - 1].
            Defaults to 0.
        patch: Whether to apply `tfrepro.patch(seed)` first. Defaults to True; False checks the
            training as it is, with only the RNGs reseeded.
        gradients: Also fingerprint and compare every gradient the optimizer applies, which sees a
            nondeterministic gradient even when the update it causes is too small to change the
            weights' bits. Defaults to False.

    Returns:
        A `tfrepro.Verification`: `identical`, and the first divergence when there is one.

    Raises:
        ValueError: `runs` is not an int >= 2, `seed` is not a valid seed, or `train_fn` never
            called `Model.fit`.
        TypeError: `train_fn` is not callable.
    """
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"runs must be an int >= 2; got {runs!r}")
    if not callable(train_fn):
        raise TypeError("train_fn must be callable: a function that builds and fits a model")
    seed = seeding.validate_seed(seed)
    keras = _tf.keras_module()
    if patch:  # each run below starts from a cleared session and fresh seeds: earlier objects cannot matter
        patching.apply_patch(seed, warn_late_seeding=False)
    traces: list[list[Trace]] = []
    with tempfile.TemporaryDirectory(prefix="tfrepro-verify-") as tmp:
        for run in range(runs):
            keras.backend.clear_session()
            seeding.seed_everything(seed)
            with record_fits(tmp, prefix=f"run{run}", gradients=gradients) as paths:
                train_fn()
            if not paths:
                raise ValueError("train_fn never called Model.fit: there is nothing to compare")
            run_traces = [read_trace(p, strict=False) for p in paths]
            for index, trace in enumerate(run_traces):
                trace.path = f"run {run}, fit {index}"  # the files live in a temporary folder only
            traces.append(run_traces)
    compared = compare_runs(traces)
    return Verification(compared.fits_per_run, compared.fits)
