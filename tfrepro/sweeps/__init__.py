"""Seed sweeps: the same training over many seeds, its spread, and whether two configurations
differ beyond that spread.

- ``statistics``: ``SweepResult`` (per-seed values; mean, std, min, max, a confidence interval)
  and ``compare_sweeps`` (Welch's t interval and test, an effect size, a verdict that says when
  seed noise cannot be measured), on NumPy and SciPy (the ``sweep`` extra).
- ``metrics``: ``report_metric`` for a script to report its result, and reading a run's metric
  from what it reported or from its trace.
- ``running``: ``sweep`` (in-process) and ``run_sweep`` (fresh processes, as ``tfrepro sweep``
  runs them: jobs, shards, resumption), ``merge_sweeps``.

This floor sits on ``launching`` (fresh runs) and ``proof`` (traces); ``plotting`` draws its results.
"""
