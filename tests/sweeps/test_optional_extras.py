"""The optional extras: without matplotlib the figures, without SciPy the seed statistics, and
without KerasTuner the tuner search, raise an ImportError that names the extra to install. A missing package is simulated by a None in
``sys.modules``, which makes importing it (or any of its submodules) fail."""

import sys

import pytest

import tfrepro
from tfrepro.sweeps.statistics import SweepResult


def make_missing(monkeypatch, package: str, *submodules: str) -> None:
    """``package`` and every submodule of it, loaded or named, cannot be imported until the test ends."""
    loaded = [name for name in sys.modules if name == package or name.startswith(package + ".")]
    for name in {package, *(f"{package}.{sub}" for sub in submodules), *loaded}:
        monkeypatch.setitem(sys.modules, name, None)


def test_the_figures_name_the_plot_extra_when_matplotlib_is_missing(monkeypatch, tmp_path):
    make_missing(monkeypatch, "matplotlib", "figure", "pyplot")
    with pytest.raises(ImportError, match=r"pip install 'tfrepro\[plot\]'"):
        tfrepro.plot_runs([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    with pytest.raises(ImportError, match=r"pip install 'tfrepro\[plot\]'"):
        tfrepro.plot_sweeps([0.91, 0.93, 0.92], [0.95, 0.94, 0.96])


def test_the_seed_statistics_name_the_sweep_extra_when_scipy_is_missing(monkeypatch):
    make_missing(monkeypatch, "scipy", "stats")
    with pytest.raises(ImportError, match=r"pip install 'tfrepro\[sweep\]'"):
        tfrepro.compare_sweeps([0.91, 0.93, 0.92], [0.95, 0.94, 0.96])
    with pytest.raises(ImportError, match=r"pip install 'tfrepro\[sweep\]'"):
        SweepResult.of([0.91, 0.93, 0.92]).summary()
    # What needs no SciPy still answers: arms without spread, a single value.
    assert tfrepro.compare_sweeps([0.5, 0.5], [0.5, 0.5]).distinguishable is False
    assert SweepResult.of([0.5]).summary().ci_low is None


def test_the_keras_tuner_search_names_the_tuner_extra_when_keras_tuner_is_missing(monkeypatch):
    make_missing(monkeypatch, "keras_tuner")
    with pytest.raises(ImportError, match=r"pip install 'tfrepro\[tuner\]'"):
        tfrepro.tuning.RacingSearch(object(), budget=4)
    assert tfrepro.tuning.race(lambda config, seed: 1.0, [0], budget=2).best.config == 0  # needs no KerasTuner
