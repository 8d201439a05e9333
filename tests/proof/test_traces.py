"""Trace files: exact encoding, incremental writes, corruption named by file and line."""

import json
import math

import numpy as np
import pandas as pd
import pytest

import tfrepro
from tfrepro.proof.traces import FORMAT, VERSION, TraceWriter, bits_float, encode_logs, float_bits, read_trace

from conftest import write_trace

HEADER = {"type": "header", "format": FORMAT, "version": VERSION, "model": {"layers": ["d"], "variables": [
    {"name": "d/kernel", "layer": "d", "shape": [2, 1], "dtype": "float32"}]}, "environment": {}}


def batch(step, loss=0.5, weights="00" * 16):
    return {"type": "batch", "epoch": 0, "batch": step, "step": step, "logs": {"loss": loss},
            "bits": {"loss": float_bits(loss)}, "weights": [weights]}


def write(path, records):
    with TraceWriter(path) as writer:
        for record in [HEADER, *records]:
            writer.write(record)
    return path


def test_float_bits_are_lossless():
    for value in (0.1, -0.0, 1e-310, float(np.float32(1 / 3)), math.inf, float("nan")):
        assert float_bits(bits_float(float_bits(value))) == float_bits(value)
    values, bits = encode_logs({"loss": np.float32(0.1), "acc": 1, "nan": float("nan"), "vec": np.ones(3), "s": "x"})
    assert set(values) == {"loss", "acc", "nan"} and values["nan"] is None
    assert bits_float(bits["loss"]) == float(np.float32(0.1))


def test_each_record_is_on_disk_as_soon_as_it_is_written(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path)
    writer.write(HEADER)
    writer.write(batch(0))
    assert len(path.read_text().splitlines()) == 2  # flushed without closing: a crash loses nothing
    writer.close()


def test_read_trace_and_pandas_agree(tmp_path):
    path = write(tmp_path / "t.jsonl", [batch(0), batch(1, 0.25), {"type": "end", "weights": ["00" * 16]}])
    trace = read_trace(path)
    assert trace.complete and len(trace) == 3 and trace.layers == ["d"]
    frame = pd.read_json(path, lines=True)
    assert list(frame["type"]) == ["header", "batch", "batch", "end"]


def test_truncated_trace_names_file_and_line_and_compare_uses_what_came_before(tmp_path):
    good = write(tmp_path / "good.jsonl", [batch(0), batch(1), batch(2)])
    text = good.read_text()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) - 20])  # the run crashed while writing its last record
    with pytest.raises(tfrepro.TraceError, match=r"cut\.jsonl, line 4"):
        read_trace(cut)
    lenient = read_trace(cut, strict=False)
    assert len(lenient) == 2 and lenient.error.line == 4
    comparison = tfrepro.compare(good, cut)
    assert not comparison.identical and comparison.records_compared == 2
    assert any("line 4" in note for note in comparison.notes)
    assert comparison.divergence.kind == "length"


def test_corrupt_middle_line_and_foreign_files(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(HEADER) + "\n{not json\n")
    with pytest.raises(tfrepro.TraceError, match=r"bad\.jsonl, line 2: not valid JSON"):
        read_trace(bad)
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"type": "header", "format": "other"}\n')
    with pytest.raises(tfrepro.TraceError, match="not a tfrepro-trace file"):
        read_trace(foreign)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(tfrepro.TraceError, match="empty"):
        read_trace(tmp_path / "empty.jsonl")
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "missing.jsonl")


def test_compare_names_quantity_layer_and_loss_difference(tmp_path):
    a = write(tmp_path / "a.jsonl", [batch(0), batch(1, 0.5), {"type": "end", "weights": ["00" * 16]}])
    b = write(tmp_path / "b.jsonl", [batch(0), batch(1, 0.5000001, "11" * 16), {"type": "end", "weights": ["00" * 16]}])
    comparison = tfrepro.compare(a, b)
    assert comparison.comparable and not comparison.identical
    d = comparison.divergence
    assert (d.epoch, d.batch, d.quantities, d.layers) == (0, 1, ("loss", "weights"), ("d",))
    assert d.loss_delta == pytest.approx(1e-7)
    assert tfrepro.compare(a, a).identical


def test_traces_of_different_models_are_not_comparable(tmp_path):
    a = write(tmp_path / "a.jsonl", [batch(0)])
    other = json.loads(json.dumps(HEADER))
    other["model"]["variables"][0]["shape"] = [3, 1]
    b = tmp_path / "b.jsonl"
    with TraceWriter(b) as writer:
        writer.write(other)
    comparison = tfrepro.compare(a, b)
    assert not comparison.comparable and comparison.verdict == "not comparable"
    assert "shape [2, 1] vs [3, 1]" in comparison.mismatch[0]


def _with_seed(path, seed, records):
    header = dict(HEADER, seed=seed)
    with TraceWriter(path) as writer:
        for record in [header, *records]:
            writer.write(record)
    return path


def test_different_seeds_are_said_plainly_and_make_a_difference_expected(tmp_path):
    end = {"type": "end", "weights": ["00" * 16]}
    a = _with_seed(tmp_path / "a.jsonl", 42, [batch(0, 0.5), end])
    b = _with_seed(tmp_path / "b.jsonl", 43, [batch(0, 0.25), end])
    comparison = tfrepro.compare(a, b)
    assert comparison.different_seeds == "A ran with seed 42, B with seed 43" and comparison.expected
    assert "different seeds: A ran with seed 42, B with seed 43" in str(comparison)
    assert not tfrepro.compare(a, _with_seed(tmp_path / "c.jsonl", 42, [batch(0, 0.25), end])).expected  # control


def test_a_cut_trace_is_named_as_cut_not_as_a_length_difference(tmp_path):
    full = write(tmp_path / "full.jsonl", [batch(step) for step in range(12)] + [{"type": "end", "weights": ["00" * 16]}])
    cut = write(tmp_path / "cut.jsonl", [batch(step) for step in range(9)])  # no end record: the run stopped
    divergence = tfrepro.compare(full, cut).divergence
    assert divergence.kind == "length"
    assert divergence.detail == ("trace B ends after step 8 (the run crashed or the file was cut); identical up to "
                                 "there")
    shorter = write(tmp_path / "shorter.jsonl", [batch(0), {"type": "end", "weights": ["00" * 16]}])
    longer = write(tmp_path / "longer.jsonl", [batch(0), batch(1), {"type": "end", "weights": ["00" * 16]}])
    assert "ended here" in tfrepro.compare(shorter, longer).divergence.detail  # a complete run that stopped early


def test_a_folder_given_as_a_trace_is_named_as_a_folder(tmp_path):
    (tmp_path / "run-0").mkdir()
    write(tmp_path / "run-0" / "fit-0.jsonl", [batch(0)])
    with pytest.raises(IsADirectoryError, match=r"is a directory, not a trace file; the traces in it include "
                                                r"run-0/fit-0\.jsonl"):
        read_trace(tmp_path)


def test_a_corrupt_record_before_the_last_line_makes_the_trace_unusable(tmp_path):
    """Records are flushed whole, so only the last line can be cut by a crash: a bad line before it is
    corruption, an error naming its line, never "the run crashed or the file was cut"."""
    good = write(tmp_path / "good.jsonl", [batch(0), batch(1), batch(2)])
    lines = good.read_text().splitlines(keepends=True)
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text("".join(lines[:2] + ['{"type": "batch", "epoch": 0, "ba\n'] + lines[3:]))
    for strict in (True, False):
        with pytest.raises(tfrepro.TraceError, match=r"corrupt\.jsonl, line 3: not valid JSON \("):
            read_trace(corrupt, strict=strict)
    with pytest.raises(tfrepro.TraceError, match=r"line 3: not valid JSON"):
        tfrepro.compare(good, corrupt)
    foreign = tmp_path / "foreign_record.jsonl"
    foreign.write_text("".join(lines[:2] + ['{"type": "mystery"}\n'] + lines[3:]))
    with pytest.raises(tfrepro.TraceError, match=r"line 3: not a tfrepro trace record"):
        read_trace(foreign, strict=False)
    cut = tmp_path / "cut.jsonl"  # the control: the same bad text as the last line is a cut record
    cut.write_text("".join(lines[:3] + ['{"type": "batch", "epoch": 0, "ba\n']))
    assert len(read_trace(cut, strict=False)) == 2
    assert "the run crashed or the file was cut" in tfrepro.compare(good, cut).divergence.detail


def _renamed(prefix, layer):
    header = json.loads(json.dumps(HEADER))
    header["model"].update(name=prefix, layers=[layer])
    header["model"]["variables"][0].update(name=f"{prefix}/{layer}/kernel", layer=layer)
    return header


def test_traces_of_a_rebuilt_model_compare_despite_kerass_automatic_names(tmp_path):
    """Keras numbers automatic names per process: the same model built again is `sequential_1/dense_1`."""
    end = {"type": "end", "layers": {}, "weights": ["00" * 16]}
    paths = []
    for prefix, layer in (("sequential", "dense"), ("sequential_1", "dense_1")):
        path = tmp_path / f"{prefix}.jsonl"
        epoch = {"type": "epoch", "epoch": 0, "step": 1, "logs": {}, "bits": {}, "layers": {layer: "ab" * 16},
                 "weights": ["00" * 16]}
        with TraceWriter(path) as writer:
            for record in [_renamed(prefix, layer), batch(0), epoch, dict(end, layers={layer: "ab" * 16})]:
                writer.write(record)
        paths.append(path)
    comparison = tfrepro.compare(*paths)
    assert comparison.comparable and comparison.identical, str(comparison)
    other = write(tmp_path / "other.jsonl", [batch(0)])  # the control: a different variable is still told apart
    renamed = json.loads(json.dumps(HEADER))
    renamed["model"]["variables"][0]["name"] = "d/bias"
    with TraceWriter(tmp_path / "bias.jsonl") as writer:
        writer.write(renamed)
    assert not tfrepro.compare(other, tmp_path / "bias.jsonl").comparable


def test_not_comparable_is_said_in_one_line(tmp_path):
    a = write(tmp_path / "a.jsonl", [batch(0)])
    wider = json.loads(json.dumps(HEADER))
    wider["model"]["variables"] += [{"name": "e/kernel", "layer": "e", "shape": [1, 1], "dtype": "float32"}]
    wider["model"]["variables"][0]["shape"] = [3, 1]
    with TraceWriter(tmp_path / "b.jsonl") as writer:
        writer.write(wider)
    comparison = tfrepro.compare(a, tmp_path / "b.jsonl")
    assert comparison.mismatch_summary == ("A has 1 variable, B has 2; first difference: variable 0 (d/kernel): "
                                           "shape [2, 1] vs [3, 1]")


def test_assert_traces_identical_returns_the_comparison_or_fails_with_the_divergence(tmp_path):
    from tfrepro.testing import assert_traces_identical

    end = {"type": "end", "weights": ["00" * 16]}
    a = write(tmp_path / "a.jsonl", [batch(0), batch(1), end])
    same = write(tmp_path / "same.jsonl", [batch(0), batch(1), end])
    other = write(tmp_path / "other.jsonl", [batch(0), batch(1, loss=0.25), end])
    comparison = assert_traces_identical(a, same)
    assert comparison.identical and comparison.records_compared >= 3
    with pytest.raises(AssertionError, match="traces differ") as raised:
        assert_traces_identical(a, other)
    assert "batch 1" in str(raised.value)


@pytest.mark.parametrize("collectives, alone", [([], True), ([{"implementation": "RING"}], False)])
def test_workers_that_never_built_a_strategy_are_said_to_have_trained_alone(tmp_path, collectives, alone):
    from tfrepro.proof.runs import ALONE, compare_workers

    distribution = {"cluster": {"workers": 2, "task": "worker:0"}, **({"collectives": collectives} if collectives else {})}
    traces = [[[write_trace(tmp_path / f"r{run}w{worker}.jsonl", [0.5], seed=3,
                            environment={"distribution": distribution})] for worker in range(2)] for run in range(2)]
    comparison = compare_workers(traces)
    assert comparison.identical and comparison.communicated is not alone
    assert (ALONE in str(comparison)) is alone
