"""One inventory of the TF and Keras internals that tfrepro hooks (``tfrepro._targets``): every
target expected on the installed releases is there (run on every CI leg: latest TF with Keras 3,
tf_keras, TF 2.12, keras-nightly, tf-nightly), and one that is missing is named, not skipped."""

import types
import warnings

import pytest

from tfrepro import _targets
from tfrepro.errors import ReproducibilityWarning

pytestmark = [pytest.mark.core, pytest.mark.keras]


def test_every_target_expected_on_the_installed_releases_resolves():
    assert _targets.audit() == []
    assert any(_targets.expected(entry) for entry in _targets.INVENTORY if entry.distribution == "tensorflow")
    assert any(_targets.expected(entry) for entry in _targets.INVENTORY if entry.distribution != "tensorflow")


def test_the_inventory_is_well_formed():
    assert len({entry.key for entry in _targets.INVENTORY}) == len(_targets.INVENTORY)
    for entry in _targets.INVENTORY:
        assert entry.distribution in ("tensorflow", "keras", "tf_keras") and entry.breaks, entry
        first, stop = entry.versions
        assert stop is None or first < stop, entry
    for role in ("seed_state", "fit_shuffle", "add_weight", "epochs", "adam", "sgd"):  # every Keras has each
        assert {entry.key.split(":")[0] for entry in _targets.for_role(role)} >= {"keras3", "tf_keras", "keras2.12"}


@pytest.fixture
def fresh_record(monkeypatch):
    monkeypatch.setattr(_targets, "_missing", {})


def test_a_missing_target_is_warned_about_by_name_once_and_reported_by_status(fresh_record):
    expected = next(entry for entry in _targets.INVENTORY if _targets.expected(entry) and "." in entry.attribute)
    stand_in = types.ModuleType(expected.module)  # the module as a release without the name would have it
    with pytest.warns(ReproducibilityWarning) as caught:
        assert _targets.find(stand_in, expected.key) is None
    message = str(caught[0].message)
    assert expected.name in message and expected.breaks in message and "pin a" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _targets.find(stand_in, expected.key) is None  # once
    import tfrepro

    hooks = tfrepro.status()["hooks"]
    assert hooks.ok is False and expected.name in hooks.value


def test_a_target_outside_the_installed_releases_is_looked_up_silently(fresh_record):
    other = next(entry for entry in _targets.INVENTORY if not _targets.expected(entry))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _targets.find(types.ModuleType(other.module), other.key) is None
    assert _targets.missing() == {}


def test_a_renamed_module_is_named_when_its_distribution_has_loaded(fresh_record, monkeypatch):
    entry = next(entry for entry in _targets.INVENTORY if _targets.expected(entry) and entry.distribution != "tensorflow")
    moved = _targets.Target(entry.key, entry.module + "_renamed_in_a_later_release", entry.attribute,
                            entry.distribution, entry.versions, entry.breaks)
    monkeypatch.setattr(_targets, "INVENTORY", (moved,))
    monkeypatch.setitem(_targets._BY_KEY, entry.key, moved)
    with pytest.warns(ReproducibilityWarning, match="renamed_in_a_later_release"):
        _targets.check_modules(entry.distribution)
    assert list(_targets.missing()) == [moved.name]


def test_every_internal_call_site_that_patch_ops_rebinds_resolves_where_expected():
    from tfrepro.ops import exact, rebinding

    unresolved = []
    for op, (_, targets) in {**rebinding.TABLE, **exact.table()}.items():
        for target in (t for t in targets if ":" in t):
            entry = rebinding.internal_target(op, target)
            if not _targets.expected(entry):
                continue
            try:
                owner, attribute = rebinding._owner(target)
                for part in attribute.split("."):
                    owner = getattr(owner, part)
            except (AttributeError, ImportError) as exc:
                unresolved.append(f"{target}: {exc}")
    assert unresolved == []


def test_a_missing_internal_call_site_is_named(fresh_record, monkeypatch):
    from tensorflow.python.ops import math_ops

    import tfrepro
    from tfrepro.ops import rebinding

    monkeypatch.delattr(math_ops, "segment_mean")  # as a release without that call site would be
    with pytest.warns(ReproducibilityWarning, match="math_ops.segment_mean is missing"):
        undo = rebinding.rebind(["segment_mean"])
    undo()
    assert "tensorflow.python.ops.math_ops.segment_mean" in tfrepro.status()["hooks"].value
