"""The figures: training curves with each run's first divergence marked, and seed distributions."""

import pytest

import tfrepro
from tfrepro.proof.traces import VERSION, TraceWriter, float_bits

pytest.importorskip("matplotlib")


def _trace(path, losses):
    header = {"type": "header", "format": "tfrepro-trace", "version": VERSION, "environment": {},
              "model": {"layers": ["d"], "variables": [{"name": "d/kernel", "layer": "d", "shape": [2, 1],
                                                        "dtype": "float32"}]}}
    with TraceWriter(path) as writer:
        writer.write(header)
        for step, loss in enumerate(losses):
            writer.write({"type": "batch", "epoch": 0, "batch": step, "step": step, "logs": {"loss": loss},
                          "bits": {"loss": float_bits(loss)}, "weights": ["0" * 32]})
    return str(path)


def test_plot_runs_overlays_the_runs_and_marks_where_each_diverges(tmp_path):
    first = _trace(tmp_path / "a.jsonl", [1.0, 0.5, 0.25, 0.125])
    second = _trace(tmp_path / "b.jsonl", [1.0, 0.5, 0.3, 0.2])
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
