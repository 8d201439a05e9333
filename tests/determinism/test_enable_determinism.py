"""``tfrepro.enable_determinism``: NVIDIA's name for ``tfrepro.patch``, taking and forwarding exactly
what ``patch`` takes."""

import inspect

import pytest

import tfrepro
from tfrepro.determinism import patching

pytestmark = pytest.mark.core


def test_enable_determinism_takes_exactly_what_patch_takes():
    assert inspect.signature(tfrepro.enable_determinism) == inspect.signature(tfrepro.patch)


def test_enable_determinism_forwards_every_argument(monkeypatch):
    calls = []
    monkeypatch.setattr(patching, "patch", lambda *args, **kwargs: calls.append((args, kwargs)) or "report")
    given = dict(threads=2, onednn=False, ops=["bincount"], init="keyed", on_uncovered="warn")
    assert tfrepro.enable_determinism(9, **given) == "report"
    assert calls == [((9,), given)]


def test_enable_determinism_init_keyed_reaches_the_report():
    report = tfrepro.enable_determinism(4, ops=False, init="keyed")
    assert report["randomness"].value.endswith("(init='keyed')")
    assert report["seeds"].value == "seeded with 4" and report["op replacements"].value == "off"
    tfrepro.unpatch()
    assert tfrepro.status()["randomness"].value == "not keyed by tfrepro"  # negative control
