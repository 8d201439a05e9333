"""``tfrepro.verify``: run a training function several times in this process and compare the runs."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tfrepro import _tf, patching, seeding
from tfrepro.comparison import Comparison, compare
from tfrepro.recording import record_fits
from tfrepro.traces import Trace, read_trace


@dataclass
class Verification:
    """The outcome of ``verify``: one comparison per later run and fit call, each against run 0."""

    runs: int
    fits_per_run: list[int]
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return len(set(self.fits_per_run)) == 1 and all(c.identical for c in self.comparisons)

    @property
    def first_failure(self) -> Comparison | None:
        return next((c for c in self.comparisons if not c.identical), None)

    def __str__(self) -> str:
        if len(set(self.fits_per_run)) != 1:
            return f"diverged: the runs called Model.fit a different number of times: {self.fits_per_run}"
        if self.identical:
            return f"identical: {self.runs} runs x {self.fits_per_run[0]} fit call(s)"
        return str(self.first_failure)


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
    if patch:
        patching.patch(seed)
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
    result = Verification(runs, [len(t) for t in traces])
    for later in traces[1:]:
        result.comparisons += [compare(a, b) for a, b in zip(traces[0], later)]
    return result
