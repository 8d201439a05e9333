"""TensorFlow's own kernel tests of the replaced ops, from the test bases TF's wheel ships
(``tensorflow/python/kernel_tests``), run against tfrepro's ops under ``patch(ops=True)``: each
test method runs unchanged, in its own ``setUp``/``tearDown`` (eagerly, or in the TF1 graph and
Session of ``run_deprecated_v1``), and the calls that reach tfrepro's op are counted per method, so
that a pass is evidence: every method that calls TF's op must have reached tfrepro's."""

from __future__ import annotations

import importlib
import unittest

import pytest

import tfrepro
from tfrepro import _tf
from tfrepro.ops import rebinding

pytestmark = pytest.mark.core  # TF 2.12's wheel ships these bases too

tf = _tf.import_tf()

# op -> (module, class, test methods left out and why). The bases call ``nn_ops.<op>``, which
# patch(ops=True) rebinds.
BASES = {
    "softmax_cross_entropy_with_logits": ("tensorflow.python.kernel_tests.nn_ops.xent_op_test_base",
                                          "XentOpTestBase", {}),
    "sparse_softmax_cross_entropy_with_logits": ("tensorflow.python.kernel_tests.sparse_ops.sparse_xent_op_test_base",
                                                 "SparseXentOpTestBase", {}),
    "bias_add": ("tensorflow.python.kernel_tests.nn_ops.bias_op_base", "BiasAddTestBase", {
        # Numerical gradient checks in 4 dtypes and 2-4 layouts, each 6-70 s here (TF's eager
        # gradient checker calls the op hundreds of times): beyond this suite's time. The 2-D one
        # runs, on the same code.
        "testGradientTensor3D": "18 s", "testGradientTensor4D": "70 s", "testGradientTensor5D": "33 s",
        "testEmptyGradient": "6 s"}),
}
# Methods that compute only NumPy references (they never call the op, TF's or tfrepro's).
NUMPY_ONLY = {"testNpXent", "testNpBias"}


def _methods(base: type) -> list[str]:
    """The test methods the kernel test module defines (not tf.test.TestCase's own ``test_session``)."""
    return sorted(name for klass in base.__mro__ if klass.__module__ == base.__module__
                  for name, value in vars(klass).items() if name.startswith("test") and callable(value))


@pytest.mark.parametrize("op", [pytest.param(op, marks=pytest.mark.slow) if op == "bias_add" else op for op in BASES])
def test_tf_kernel_test_base_passes_on_tfrepro_ops(op, monkeypatch):
    module_name, class_name, left_out = BASES[op]
    base = getattr(pytest.importorskip(module_name), class_name)
    replacement, targets = rebinding.TABLE[op]
    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return replacement(*args, **kwargs)

    monkeypatch.setitem(rebinding.TABLE, op, (spy, targets))

    class OnTfrepro(base):
        def setUp(self):
            super().setUp()
            tfrepro.patch(0, ops=True)

        def tearDown(self):
            tfrepro.unpatch()
            super().tearDown()

    reached, skipped, problems = {}, set(), []
    for name in _methods(base):
        if name in left_out:
            continue
        before = len(calls)
        result = unittest.TestResult()
        OnTfrepro(name).run(result)
        problems += [f"{name}: {trace.splitlines()[-1]}" for _, trace in result.errors + result.failures]
        skipped |= {name for _, _ in result.skipped}  # GPU-only methods, on a CPU
        reached[name] = len(calls) - before
    assert not problems, problems
    assert {name for name, count in reached.items() if not count} <= NUMPY_ONLY | skipped, reached
    assert len(reached) - len(skipped) >= 10
