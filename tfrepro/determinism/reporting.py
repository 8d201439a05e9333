"""``tfrepro.status()``: what is and is not in place for reproducible training, and why."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from tfrepro import _import_hooks, _targets, _tf
from tfrepro.determinism import state, switches
from tfrepro.ops import selection


@dataclass(frozen=True)
class Setting:
    """One line of a `tfrepro.Report`: a determinism-relevant setting, its value, and whether it is good.

    `str(setting)` is the printed line: `[ok]`, `[!!]` or `[--]`, the name, the value and the reason.

    Attributes:
        name: What the setting is, e.g. `"op determinism"`, `"PYTHONHASHSEED"`, `"seeds"`; a report
            can be indexed by it (`report["seeds"]`).
        value: Its current value, in words (`"on (enable_op_determinism)"`, `"not set"`).
        ok: True when it is as reproducible training needs, False when it breaks reproducibility,
            None when it is information only.
        why: The reason or the fix, when there is one; empty otherwise.
    """

    name: str
    value: str
    ok: bool | None
    why: str = ""

    def __str__(self) -> str:
        mark = {True: "ok", False: "!!", None: "--"}[self.ok]
        return f"[{mark}] {self.name}: {self.value}" + (f"; {self.why}" if self.why else "")


@dataclass(frozen=True)
class Report:
    """What is and is not in place for reproducible training, and why: what `tfrepro.status()` returns.

    `print(report)` shows one line per setting; `report["op determinism"]` is one `Setting`, by name
    (a `KeyError` for a name it does not hold), `"op determinism" in report` says whether it holds
    one, and iterating gives the `Setting`s in order; `report.ok` says whether anything breaks
    reproducibility, and `report.to_dict()` is the same as JSON-serialisable data.

    Attributes:
        settings: The settings, in the printed order, as `Setting`s.
    """

    settings: tuple[Setting, ...]

    @property
    def ok(self) -> bool:
        """True when no setting is known to break reproducibility."""
        return all(s.ok is not False for s in self.settings)

    def __getitem__(self, name: str) -> Setting:
        for setting in self.settings:
            if setting.name == name:
                return setting
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return any(setting.name == name for setting in self.settings)

    def __iter__(self) -> Iterator[Setting]:
        return iter(self.settings)

    def problems(self) -> list[Setting]:
        """The settings known to break reproducibility.

        Returns:
            The `Setting`s whose `ok` is False, in report order; empty when `ok` is True.
        """
        return [s for s in self.settings if s.ok is False]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-serialisable data.

        Returns:
            A dict: `"ok"`, the verdict, and `"settings"`, a list of dicts with each setting's
            `name`, `value`, `ok` and `why`.
        """
        return {"ok": self.ok, "settings": [asdict(s) for s in self.settings]}

    def __str__(self) -> str:
        return "\n".join(str(s) for s in self.settings)


def _env(name: str) -> str | None:
    return os.environ.get(name)


def _op_determinism(plan: switches.DeterminismPlan) -> Setting:
    state = _tf.op_determinism_enabled()
    if state is None:  # TF not imported: report what will happen at import.
        on = _tf.env_flag("TF_DETERMINISTIC_OPS") == "on"
        value = "on at TF import (TF_DETERMINISTIC_OPS=1)" if on else "off"
        why = "TensorFlow not imported yet" + ("" if on else "; call tfrepro.patch()")
        return Setting("op determinism", value, on, why)
    if state:
        return Setting("op determinism", f"on ({plan.mechanism})", True)
    return Setting("op determinism", "off", False, "GPU kernels may sum in thread-arrival order; call tfrepro.patch()")


def status() -> Report:
    """Reports each determinism-relevant setting, whether it is as reproducible training needs, and why.

    Covers TensorFlow and Keras versions, op determinism (before TF is imported: what TF will read
    at import), the determinism environment variables, `TF_CUDNN_USE_AUTOTUNE`, `PYTHONHASHSEED`
    at interpreter start, the seed of the active patch, keyed randomness, op replacements, thread
    pools, oneDNN, and the known limits of the installed TF version. Never imports TensorFlow:
    calling it does not change what it reports.

    Returns:
        A `tfrepro.Report`: print it, index it by setting name, or check `report.ok`.
    """
    tf_version = _tf.installed_tf_version()
    plan = switches.plan_for(tf_version)
    seed = state.active_seed()
    settings = [
        Setting("tensorflow", tf_version or "not installed", None if tf_version else False,
                "" if tf_version else f"install it: {_tf.INSTALL_HINT}"),
        Setting("keras", _tf.keras_info().describe(), None),
        _op_determinism(plan),
    ]
    for name in switches.DETERMINISM_ENV:
        value = _env(name)
        wanted = plan.env.get(name)
        if wanted is None and value is None:
            continue  # not read by this TF version and not set
        good = _tf.env_flag(name) == "on" if wanted else None
        why = "" if good is not False else (f"expected {wanted}" + ("" if value is None else f"; {value} turns it off"))
        settings.append(Setting(name, "not set" if value is None else value, good, why))

    autotune = _env("TF_CUDNN_USE_AUTOTUNE")
    autotune_off = _tf.env_flag("TF_CUDNN_USE_AUTOTUNE") == "off"
    settings.append(
        Setting("TF_CUDNN_USE_AUTOTUNE", "not set" if autotune is None else autotune,
                False if autotune_off else None,
                "unset it: deterministic mode selects deterministic cuDNN algorithms through the autotuner"
                if autotune_off else "")
    )

    hashseed = state.STARTUP_HASHSEED
    if hashseed is None:
        value = "ignored (python -E or -I)" if state.HASHSEED_IGNORED else "not set"
        settings.append(Setting("PYTHONHASHSEED", value, False,
                                "the iteration order of sets of strings may differ between runs; use `tfrepro run`"))
    elif seed is not None and hashseed != str(seed):
        settings.append(Setting("PYTHONHASHSEED", hashseed, None,
                                f"differs from the seed {seed}; fixed, so still reproducible"))
    else:
        settings.append(Setting("PYTHONHASHSEED", hashseed, True))

    settings.append(
        Setting("seeds", f"seeded with {seed}" if seed is not None else "not seeded by tfrepro",
                True if seed is not None else None,
                "Python, NumPy, TF global seed and Generator, Keras" if seed is not None
                else "call tfrepro.patch(seed) or tfrepro.seed_everything(seed)")
    )
    init = state.active_init()
    settings.append(Setting("randomness", "not keyed by tfrepro" if init is None else (
        f"keyed: fit's shuffle of arrays by (seed, epoch); initial weights by {'(seed, layer, weight name)' if init == 'keyed' else 'creation order'} (init={init!r})"),
        None))
    settings.append(_replacements_setting(tf_version))
    settings.append(_hooks_setting())
    if state.active_summation() == "exact_tier":
        settings.append(_audit_setting())
    settings.append(_threads_setting())
    onednn = _env("TF_ENABLE_ONEDNN_OPTS")
    settings.append(
        Setting("oneDNN", _tf.onednn().replace("default", "TF default"), None,
                "changes CPU numerics; same setting needed on every run" + (
                    "" if onednn is None else f" (TF_ENABLE_ONEDNN_OPTS={onednn})"))
    )
    for limit in plan.limits:
        settings.append(Setting("limit", limit, None))
    return Report(tuple(settings))


def _replacements_setting(tf_version: str | None) -> Setting:
    replaced = state.active_ops()
    if not replaced:
        return Setting("op replacements", "off", None, "patch() replaces the ops this TensorFlow cannot run "
                       "deterministically on a GPU (ops='auto'); ops=True makes segment sums, bias_add, softmax "
                       "xent, gather too order-invariant")
    if state.active_summation() == "tf":
        reasons = selection.auto_ops(tf_version) if tf_version else {}
        return Setting("op replacements", f"{len(replaced)} ops from tfrepro.ops (ops='auto': what TF {tf_version} "
                       "cannot run deterministically on a GPU; tfrepro's versions where a GPU is visible, TF's own "
                       "kernels on a CPU, deterministic there, except adjust_contrast)", None,
                       "; ".join(f"{name}: {reasons.get(name, 'selected')}" for name in replaced))
    if state.active_summation() == "exact_tier":
        from tfrepro.ops.exact import slices  # TensorFlow is loaded: ops="exact" rebound its ops

        covered = [name for name in replaced if not name.startswith("refused ")]
        refused = [name[len("refused "):] for name in replaced if name.startswith("refused ")]
        try:
            path = "float32 slices" if slices.path() == "float32" else "float64"
            products = f"products in {path} (the same bits either way)"
        except ValueError as exc:
            products = str(exc)
        return Setting("op replacements", f"exact tier (ops='exact'): {len(covered)} ops order-invariant (matmul, convolution, pooling, "
                       "dropout, sums, activations, exp/log and cross-entropies exact), "
                       f"{len(refused)} refused by name, Keras's Adam and SGD updates FMA-proof, its "
                       f"LayerNormalization and BatchNormalization exact; {products}", None,
                       "exact: " + ", ".join(covered) + "; refused: " + ", ".join(refused))
    return Setting("op replacements", f"{len(replaced)} ops from tfrepro.ops", None,
                   "order-invariant: " + ", ".join(replaced))


def _audit_setting() -> Setting:
    """The exact tier's audit of traced functions (``tfrepro.ops.exact.coverage``)."""
    from tfrepro.ops.exact import coverage  # TensorFlow is loaded: ops="exact" rebound its ops

    audited, named = coverage.findings()
    if named:
        return Setting("exact audit", f"{len(named)} uncovered op(s) named in {audited} traced function(s): "
                       + ", ".join(f"{item.op} in {item.layer}" for item in named), False,
                       "; ".join(map(str, named)))
    if not audited:
        return Setting("exact audit", "no function traced yet", None,
                       "each traced step is audited before it first runs")
    return Setting("exact audit", f"{audited} traced function(s) audited: every op covered", True,
                   f"on_uncovered={state.active().on_uncovered!r}")


def _hooks_setting() -> Setting:
    _import_hooks.run_deferred()  # a hook left to the next import statement runs now
    missing = _targets.missing()
    if missing:
        return Setting("hooks", f"{len(missing)} TF/Keras internal(s) missing: " + ", ".join(missing), False,
                       "; ".join(f"{name}: {found}" for name, found in missing.items())
                       + "; the warnings say what each one breaks; pin a TF/Keras release tfrepro supports")
    if state.active_seed() is None:
        return Setting("hooks", "not in place (no patch)", None)
    return Setting("hooks", "every TF/Keras internal that patch hooks was found so far", True,
                   "each is checked as its module loads (tfrepro._targets)")


def _threads_setting() -> Setting:
    if not _tf.tf_imported():
        return Setting("thread pools", "TF default", None, "TensorFlow not imported yet")
    threading = _tf.import_tf().config.threading
    intra = threading.get_intra_op_parallelism_threads()
    inter = threading.get_inter_op_parallelism_threads()
    if intra == 0 or inter == 0:
        return Setting("thread pools", f"intra={intra}, inter={inter} (0 = one per core)", None,
                       "CPU results can differ across machines with other core counts; patch(threads=N)")
    return Setting("thread pools", f"intra={intra}, inter={inter}", True)
