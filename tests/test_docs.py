"""The runnable examples in the public docstrings run and show what they claim."""

import doctest

import pytest


@pytest.mark.parametrize("module_name", ["tfrepro.determinism.seeding", "tfrepro.proof.callback", "tfrepro.proof.fingerprints",
                                         "tfrepro.ops.kernel_facts", "tfrepro.data.seeded_maps"])
def test_docstring_examples(module_name, keras):
    import importlib

    module = importlib.import_module(module_name)
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0
