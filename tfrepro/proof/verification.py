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
    """The outcome of ``verify``: each later run's fit calls compared with run 0's.

    ``identical``, ``first_failure`` (a ``Comparison``), ``comparisons``, ``fits_per_run``;
    ``print()`` it for the verdict.
    """


def verify(train_fn: Callable[[], Any], runs: int = 2, *, seed: int = 0, patch: bool = True,
           gradients: bool = False) -> Verification:
    """Call ``train_fn()`` ``runs`` times and compare every ``Model.fit`` it makes, exactly.

    Before each run the Keras session is cleared (so layer names repeat) and every RNG is reseeded
    with ``seed``; with ``patch=True`` (default) ``tfrepro.patch(seed)`` is applied first.
    ``train_fn`` builds, compiles and fits its model(s); nothing needs to be passed to ``fit``.
    ``gradients=True`` also compares every applied gradient (see ``ReproducibilityCallback``).
    In-process runs share one TF runtime: use ``tfrepro check`` for cross-process proof.
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
