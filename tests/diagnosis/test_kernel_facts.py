"""The table of ops without deterministic GPU kernels: data, by TensorFlow version (TF-free)."""

import sys

import pytest

from tfrepro.ops import kernel_facts
from tfrepro.ops.kernel_facts import match, ops_without_deterministic_kernel, silently_nondeterministic_ops
from tfrepro.ops.selection import REPLACEABLE_OPS

pytestmark = [pytest.mark.core]


def _keys(facts):
    return {fact.key for fact in facts}


def test_depthwise_conv_backprop_raises_in_2_9_but_not_in_2_10():
    assert "depthwise_conv_filter_backprop" in _keys(ops_without_deterministic_kernel("2.9"))
    assert "depthwise_conv_filter_backprop" in _keys(ops_without_deterministic_kernel("2.9.3"))
    assert "depthwise_conv_filter_backprop" not in _keys(ops_without_deterministic_kernel("2.10"))
    assert match("DepthwiseConv2dNativeBackpropFilter", tf_version="2.9")[1] == "raises"
    assert match("DepthwiseConv2dNativeBackpropFilter", tf_version="2.10.0") is None
    assert match("DepthwiseConv2dNativeBackpropFilter", tf_version="2.6")[1] == "nondeterministic"


def test_the_facts_file_table_for_a_current_version():
    """Section 3 of the facts: what raises on TF 2.16+ (XLA max-pool included, under XLA only)."""
    assert _keys(ops_without_deterministic_kernel("2.16")) == {
        "resize_nearest_backprop", "crop_and_resize_backprop", "sparse_dense_matmul", "bincount",
        "fused_batch_norm_backprop_inference", "adjust_contrast", "debug_numeric_summary", "xla_max_pool_backprop"}
    assert "xla_max_pool_backprop" not in _keys(ops_without_deterministic_kernel("2.15"))
    assert not silently_nondeterministic_ops("2.16")
    assert {"segment_reduction", "softmax_cross_entropy", "bias_add_backprop"} <= _keys(silently_nondeterministic_ops("2.0"))
    assert "segment_reduction" in _keys(ops_without_deterministic_kernel("2.6"))  # the 2.5/2.6 exceptions


def test_conditions_on_attributes_and_xla():
    assert match("FusedBatchNormGradV3", {"is_training": False}, tf_version="2.15")[0].key == \
        "fused_batch_norm_backprop_inference"
    assert match("FusedBatchNormGradV3", {"is_training": True}, tf_version="2.15") is None
    assert match("MaxPoolGrad", tf_version="2.16") is None
    assert match("MaxPoolGrad", tf_version="2.16", xla=True)[1] == "raises"
    assert match("DebugNumericSummaryV2", {"tensor_debug_mode": 4}, tf_version="2.12")[1] == "raises"
    assert match("DebugNumericSummaryV2", {"tensor_debug_mode": 2}, tf_version="2.12") is None
    assert match("MatMul", tf_version="2.12") is None


def test_every_fact_is_complete_and_its_replacement_exists():
    for fact in kernel_facts.FACTS:
        assert fact.op_types and fact.api and fact.fix and fact.source and fact.spans, fact.key
        assert fact.replacement is None or fact.replacement in REPLACEABLE_OPS, fact.key
        for a, b in zip(fact.spans, fact.spans[1:]):  # ordered, not overlapping
            assert a.until is not None and b.since is not None and a.until <= b.since, fact.key
        assert fact.to_dict()["history"].endswith("deterministic otherwise")
    with pytest.raises(KeyError, match="known: resize_nearest_backprop"):
        kernel_facts.fact("nope")


def test_bad_versions_say_what_is_expected():
    with pytest.raises(ValueError, match="expected e.g. '2.15'"):
        ops_without_deterministic_kernel("latest")
    assert ops_without_deterministic_kernel((2, 7)) == ops_without_deterministic_kernel("2.7")


def test_reading_the_table_never_imports_tensorflow():
    import subprocess

    code = ("import sys; from tfrepro.ops.kernel_facts import ops_without_deterministic_kernel as f; "
            "f('2.12'); f(); print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
