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
