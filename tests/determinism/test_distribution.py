"""What ``patch`` pins under ``tf.distribute``: the collective implementation, recorded. (Training
on several workers, randomness per replica and Keras 3's repairs: tests/launching/test_workers.py
and the zoo's workers column.)"""

import json
import sys

import pytest

from conftest import run_python

pytestmark = pytest.mark.core

_BUILD = """
import json, warnings
import tensorflow as tf
import tfrepro
from tfrepro.determinism import distribution

{patch}
implementation = tf.distribute.experimental.CommunicationImplementation.{implementation}
options = tf.distribute.experimental.CommunicationOptions(implementation=implementation, bytes_per_pack={pack})
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
print(json.dumps({{"chosen": distribution.chosen(), "used": strategy.extended._communication_options.implementation.name,
                  "warnings": [str(w.message) for w in caught if w.category is tfrepro.ReproducibilityWarning]}}))
"""


def built(implementation: str, patched: bool = True, pack: int = 0) -> dict:
    code = _BUILD.format(patch="tfrepro.patch(0)" if patched else "", implementation=implementation, pack=pack)
    proc = run_python("-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_auto_becomes_ring_and_is_recorded_with_the_packing_left_as_given():
    result = built("AUTO", pack=4096)
    assert result["used"] == "RING"
    assert result["chosen"] == [{"implementation": "RING", "bytes_per_pack": 4096, "pinned": True}]
    assert result["warnings"] == []


def test_an_explicit_nccl_is_kept_with_a_warning():
    result = built("NCCL")
    assert result["used"] == "NCCL"
    assert result["chosen"] == [{"implementation": "NCCL", "bytes_per_pack": 0, "pinned": False}]
    assert len(result["warnings"]) == 1 and "NCCL's reduction order" in result["warnings"][0]


def test_without_the_patch_auto_stays_auto_and_nothing_is_recorded():
    result = built("AUTO", patched=False)
    assert result["used"] == "AUTO" and result["chosen"] == []
