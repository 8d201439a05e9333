"""The figures: training curves with each run's first divergence marked, and seed distributions."""

import pytest

import tfrepro
from conftest import write_trace

pytest.importorskip("matplotlib")


def test_plot_runs_overlays_the_runs_and_marks_where_each_diverges(tmp_path):
    first = write_trace(tmp_path / "a.jsonl", [1.0, 0.5, 0.25, 0.125])
    second = write_trace(tmp_path / "b.jsonl", [1.0, 0.5, 0.3, 0.2])
    figure = tfrepro.plot_runs([first, second], labels=["a", "b"])
    axes = figure.axes[0]
    assert [line.get_label() for line in axes.get_lines()[:2]] == ["a", "b"]
    marks = [line for line in axes.get_lines() if line.get_xdata()[0] == line.get_xdata()[-1]]
    assert [mark.get_xdata()[0] for mark in marks] == [2]  # b's first divergence, at step 2
    with pytest.raises(TypeError, match="list of trace paths"):
        tfrepro.plot_runs(first)
    with pytest.raises(ValueError, match="labels"):
        tfrepro.plot_runs([first, second], labels=["a"])


def test_plot_sweeps_draws_one_distribution_per_sweep():
    figure = tfrepro.plot_sweeps([0.91, 0.93, 0.92], [0.95, 0.94, 0.96], labels=["lr 1e-3", "lr 3e-3"])
    labels = [label.get_text() for label in figure.axes[0].get_xticklabels()]
    assert any("lr 1e-3" in text for text in labels) and any("lr 3e-3" in text for text in labels)


def test_plot_tuning_draws_every_configuration_with_its_standing():
    result = tfrepro.tuning.race(lambda lr, seed: {0.1: 0.5, 0.01: 0.9, 0.001: 0.9}[lr] + (seed % 3) / 1000,
                                 [0.1, 0.01, 0.001], budget=12, metric="val_accuracy")
    figure = tfrepro.plot_tuning(result)
    labels = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert len(labels) == 3 and any("best" in text for text in labels) and any("worse" in text for text in labels)
    assert "val_accuracy (higher is better)" in figure.axes[0].get_xlabel()
    with pytest.raises(TypeError, match="takes a tfrepro.tuning.TuningResult"):
        tfrepro.plot_tuning([0.9, 0.8])
