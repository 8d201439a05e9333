"""Every TensorFlow and Keras internal that tfrepro's hooks reach into, in one inventory.

``patch`` works by putting hooks on names that TF and Keras do not promise to keep: a data
adapter's method, a backend module's seed state, a strategy's constructor. A release that renames
one must not leave the guarantee silently weaker. So each such name is a ``Target`` here, with the
versions it is expected in and what breaks without it, and every hook looks its target up through
``find``: a target that is missing where it is expected is warned about by name, once, and listed
by ``missing()``, which ``tfrepro.status()`` reports. ``audit()`` imports and resolves every target
expected on the installed versions (``tests/test_targets.py`` runs it on every CI leg).

The call sites that ``patch(ops=...)`` rebinds are listed with their ops in
``tfrepro.ops.rebinding.TABLE`` (and the exact tier's table); a missing internal one is reported
here the same way (``report``), and ``tests/test_targets.py`` resolves them too.

Version ranges are ``(first, stop)`` on ``(major, minor)``, ``stop`` exclusive (None: still there).
Where a range starts earlier than the releases CI installs (TF 2.12 and 2.21, Keras 2.12, 3.15 and
3.16.dev, tf_keras 2.21), it is read from the release's source, not run.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from tfrepro import _tf
from tfrepro._import_hooks import call_after_import
from tfrepro.errors import warn

Version = tuple[int, int]


@dataclass(frozen=True)
class Target:
    """One TF or Keras internal that a tfrepro hook needs.

    Attributes:
        key: A short name for it, unique in the inventory.
        module: The module that holds it.
        attribute: The dotted path inside the module (``"ArrayDataAdapter.get_tf_dataset"``).
        distribution: ``"tensorflow"``, ``"keras"`` or ``"tf_keras"``: whose version ``versions`` is.
        versions: ``(first, stop)``: the ``(major, minor)`` versions it is expected in, ``stop``
            exclusive, None for "still there".
        breaks: What goes wrong without it, in words, for the warning.
    """

    key: str
    module: str
    attribute: str
    distribution: str
    versions: tuple[Version, Version | None]
    breaks: str

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}" if self.attribute else self.module


def _family(family: str, distribution: str, versions: tuple[Version, Version | None],
            places: dict[str, tuple[str, str]]) -> tuple[Target, ...]:
    """One Keras's targets: ``places[role] = (module, attribute)``."""
    return tuple(Target(f"{family}:{role}", module, attribute, distribution, versions, _BREAKS[role])
                 for role, (module, attribute) in places.items())


_BREAKS = {
    "seed_state": "Keras's seed state is not reset by patch(seed): initial weights and dropout masks follow "
                  "Keras's own stream",
    "fit_shuffle": "fit(shuffle=True) is not keyed by (seed, epoch): epochs may share one order, or a resume replays",
    "add_weight": 'patch(init="keyed") cannot key initial weights',
    "epochs": "fit's epochs do not reach tfrepro's epoch clock: keyed randomness draws epoch 0's numbers every epoch",
    "adam": "the exact tier's Adam update is not FMA-proof: weights can differ with XLA",
    "sgd": "the exact tier's SGD update is not FMA-proof: weights can differ with XLA",
    "layer_norm": "LayerNormalization runs Keras's own arithmetic under the exact tier: its audit names the "
                  "multiply-add (or fused batch norm) and refuses the model",
    "batch_norm_call": "BatchNormalization runs Keras's own arithmetic under the exact tier: its audit names the "
                       "fused batch norm (or the moments' float sums) and refuses the model",
    "lstm_cell": "LSTMCell's carry runs Keras's own arithmetic under the exact tier: its audit names the "
                 "multiply-add and refuses the model",
    "gru_cell": "GRUCell's step runs Keras's own arithmetic under the exact tier: its audit names the "
                "multiply-adds and refuses the model",
    "lstm_call": "LSTMCell's step runs op by op under the exact tier, not as one kernel: the same bits, slower",
    "model_supports_jit": 'compile(jit_compile="auto") may choose XLA under op determinism',
    "trainer_build": "MultiWorkerMirroredStrategy training is not repaired: workers can diverge",
    "trainer_reduce": "MultiWorkerMirroredStrategy metrics are not averaged across workers",
    "trainer_multi_worker": "MultiWorkerMirroredStrategy training is not repaired: workers can diverge",
    "tree": "MultiWorkerMirroredStrategy training is not repaired: workers can diverge",
    "draw_seed": "replicas draw the same dropout masks under a tf.distribute strategy",
    "batch_norm": "BatchNormalization's moving statistics are not averaged across replicas",
    "global_generator": "tf.random.get_global_generator() is not seeded by patch(seed)",
    "strategy_base": "TF's global Generator can be made inside a strategy's scope, as a distributed one",
    "collective_strategy": "MultiWorkerMirroredStrategy's AUTO all-reduce is not pinned to RING",
    "collective_util": "MultiWorkerMirroredStrategy's AUTO all-reduce is not pinned to RING",
    "func_graph": "the exact tier cannot tell a gradient inside a loop or condition from one outside",
    "control_flow_graphs": "the exact tier cannot tell a gradient inside a loop or condition from one outside",
    "control_flow_util": "the exact sums cannot tell whether XLA compiles them",
    "runtime_context": "tfrepro cannot tell whether TF's runtime has started (thread settings may be refused)",
    "config": "tfrepro.status() cannot read op determinism",
    "trace": "the exact tier cannot audit traced steps: an op it does not cover runs unnamed",
    "dataset_functions": "the exact tier audits tf.data's functions too, and may refuse a pipeline's ops",
    "op_defs": "the exact tier's audit cannot read an op's output types, so it takes every op for a float op",
    "dataset_inputs": "pipelines that undo keyed draws go unnamed (cache() after one, two zipped with one key), and "
                      "repeat() after one does not key its passes by their ordinal (they read a racing clock)",
}
_K3 = "keras.src."
_TRAINER = _K3 + "backend.tensorflow.trainer"
INVENTORY: tuple[Target, ...] = (
    *_family("keras3", "keras", ((3, 0), None), {
        "seed_state": (_K3 + "backend.common.global_state", "set_global_attribute"),
        "fit_shuffle": (_K3 + "trainers.data_adapters.array_data_adapter", "ArrayDataAdapter.get_tf_dataset"),
        "add_weight": (_K3 + "layers.layer", "Layer.add_weight"),
        "epochs": (_K3 + "callbacks.callback_list", "CallbackList.on_epoch_begin"),
        "draw_seed": (_K3 + "backend.tensorflow.random", "draw_seed"),
        "batch_norm": (_K3 + "layers.normalization.batch_normalization", "BatchNormalization.build"),
        "adam": (_K3 + "optimizers.adam", "Adam.update_step"),
        "sgd": (_K3 + "optimizers.sgd", "SGD.update_step"),
        "layer_norm": (_K3 + "layers.normalization.layer_normalization", "LayerNormalization.call"),
        "batch_norm_call": (_K3 + "layers.normalization.batch_normalization", "BatchNormalization.call"),
        "lstm_cell": (_K3 + "layers.rnn.lstm", "LSTMCell._compute_carry_and_output_fused")}),
    # the tier's GRU step is Keras's own, rewritten: only where it was compared with Keras's bit for bit
    *_family("keras3", "keras", ((3, 15), (3, 17)), {"gru_cell": (_K3 + "layers.rnn.gru", "GRUCell.call"),
                                                     "lstm_call": (_K3 + "layers.rnn.lstm", "LSTMCell.call")}),
    *_family("keras3", "keras", ((3, 3), (3, 16)), {
        "trainer_build": (_TRAINER, "TensorFlowTrainer._maybe_symbolic_build")}),
    *_family("keras3.16", "keras", ((3, 16), None), {"trainer_build": (_TRAINER, "Trainer._maybe_symbolic_build")}),
    *_family("keras3", "keras", ((3, 3), None), {
        "trainer_reduce": (_TRAINER, "reduce_per_replica"),
        "trainer_multi_worker": (_TRAINER, "_collective_all_reduce_multi_worker"),
        "tree": (_K3 + "tree", "map_structure")}),
    *_family("keras3", "keras", ((3, 0), (3, 7)), {"model_supports_jit": (_K3 + "trainers.trainer", "model_supports_jit")}),
    *_family("tf_keras", "tf_keras", ((2, 15), None), {
        "seed_state": ("tf_keras.src.backend", "enable_tf_random_generator"),
        "fit_shuffle": ("tf_keras.src.engine.data_adapter", "TensorLikeDataAdapter.__init__"),
        "add_weight": ("tf_keras.src.engine.base_layer", "Layer.add_weight"),
        "epochs": ("tf_keras.src.callbacks", "CallbackList.on_epoch_begin"),
        "adam": ("tf_keras.src.optimizers.adam", "Adam.update_step"),
        "sgd": ("tf_keras.src.optimizers.sgd", "SGD.update_step"),
        "layer_norm": ("tf_keras.src.layers.normalization.layer_normalization", "LayerNormalization.call"),
        "batch_norm_call": ("tf_keras.src.layers.normalization.batch_normalization", "BatchNormalizationBase.call")}),
    *_family("keras2.12", "keras", ((2, 0), (2, 13)), {  # the Keras 2 of TF 2.12
        "seed_state": ("keras.backend", "enable_tf_random_generator"),
        "fit_shuffle": ("keras.engine.data_adapter", "TensorLikeDataAdapter.__init__"),
        "add_weight": ("keras.engine.base_layer", "Layer.add_weight"),
        "epochs": ("keras.callbacks", "CallbackList.on_epoch_begin"),
        "adam": ("keras.optimizers.adam", "Adam.update_step"),
        "sgd": ("keras.optimizers.sgd", "SGD.update_step"),
        "layer_norm": ("keras.layers.normalization.layer_normalization", "LayerNormalization.call"),
        "batch_norm_call": ("keras.layers.normalization.batch_normalization", "BatchNormalizationBase.call")}),
    *_family("keras2.13", "keras", ((2, 13), (3, 0)), {  # the Keras 2 of TF 2.13-2.15
        "seed_state": (_K3 + "backend", "enable_tf_random_generator"),
        "fit_shuffle": (_K3 + "engine.data_adapter", "TensorLikeDataAdapter.__init__"),
        "add_weight": (_K3 + "engine.base_layer", "Layer.add_weight"),
        "epochs": (_K3 + "callbacks", "CallbackList.on_epoch_begin"),
        "layer_norm": (_K3 + "layers.normalization.layer_normalization", "LayerNormalization.call"),
        "batch_norm_call": (_K3 + "layers.normalization.batch_normalization", "BatchNormalizationBase.call")}),
    *_family("tf", "tensorflow", ((2, 12), None), {
        "global_generator": ("tensorflow.python.ops.stateful_random_ops", "get_global_generator"),
        "strategy_base": ("tensorflow.python.distribute.distribute_lib", "StrategyBase.__init__"),
        "collective_strategy": ("tensorflow.python.distribute.collective_all_reduce_strategy",
                                "CollectiveAllReduceStrategy.__init__"),
        "collective_util": ("tensorflow.python.distribute.collective_util", "CommunicationImplementation.RING"),
        "func_graph": ("tensorflow.python.framework.func_graph", "FuncGraph"),
        "control_flow_graphs": ("tensorflow.python.ops.control_flow_v2_func_graphs", "WhileBodyFuncGraph"),
        "control_flow_util": ("tensorflow.python.ops.control_flow_util", "GraphOrParentsInXlaContext"),
        "runtime_context": ("tensorflow.python.eager.context", "context"),
        "config": ("tensorflow.python.framework.config", "is_op_determinism_enabled"),
        "dataset_inputs": ("tensorflow.python.data.ops.dataset_ops", "DatasetV2._inputs"),
        "trace": ("tensorflow.python.framework.func_graph", "func_graph_from_py_func"),
        "dataset_functions": ("tensorflow.python.data.ops.structured_function", "StructuredFunctionWrapper.__init__"),
        "op_defs": ("tensorflow.python.framework.op_def_registry", "get")}),
)

_BY_KEY = {target.key: target for target in INVENTORY}
_missing: dict[str, tuple[str, str]] = {}  # key -> (name, what was found); the process's record, for status()


def target(key: str) -> Target:
    """The inventory's entry for ``key`` (a KeyError names an unknown key: a bug in tfrepro)."""
    return _BY_KEY[key]


def for_role(role: str) -> tuple[Target, ...]:
    """Every Keras's (or TF's) target for one hook (``"fit_shuffle"``, ``"epochs"``, ...)."""
    return tuple(entry for entry in INVENTORY if entry.key.endswith(":" + role))


def key_for(role: str) -> str:
    """The key of ``role``'s target expected on the installed releases (the first one, where none is)."""
    entries = for_role(role)
    return next((entry.key for entry in entries if expected(entry)), entries[0].key)


def installed_version(distribution: str) -> Version | None:
    """``(major, minor)`` of ``distribution`` ("tensorflow", "keras", "tf_keras"): the loaded
    module's own version where it is loaded (keras-nightly installed over keras leaves both
    distributions' metadata), else the installed package's."""
    if distribution == "tensorflow":
        return _tf.parse_version(_tf.installed_tf_version())
    for module in (f"{distribution}.src.version", distribution):
        loaded = getattr(sys.modules.get(module), "__version__", None)
        if isinstance(loaded, str):
            return _tf.parse_version(loaded)
    names = ("keras-nightly", "keras") if distribution == "keras" else ("tf-keras-nightly", "tf-keras", "tf_keras")
    return _tf.parse_version(_tf.distribution_version(*names))


def expected(entry: Target) -> bool:
    """Whether ``entry`` should exist in the installed release of its distribution."""
    version = installed_version(entry.distribution)
    first, stop = entry.versions
    return version is not None and version >= first and (stop is None or version < stop)


def _resolve(owner: Any, path: str) -> Any:
    for part in filter(None, path.split(".")):
        owner = getattr(owner, part)
    return owner


def find(module: ModuleType, key: str) -> Any:
    """``key``'s attribute in ``module`` (its module, loaded), or None when it is missing: then,
    where the installed release should have it, warned about by name once and recorded."""
    entry = target(key)
    try:
        return _resolve(module, entry.attribute)
    except AttributeError:
        _report(entry, f"{module.__name__} has no {entry.attribute}")
        return None


def report(entry: Target, found: str) -> None:
    """Warn about ``entry``, missing (``found`` says what is there instead), once and by name, and
    record it for ``status()``, where the installed release should have it. For the call sites that
    ``patch(ops=...)`` rebinds (``tfrepro.ops.rebinding``), which make their own entries."""
    _report(entry, found)


def _report(entry: Target, found: str) -> None:
    if entry.key in _missing or not expected(entry):
        return
    _missing[entry.key] = (entry.name, found)
    version = ".".join(map(str, installed_version(entry.distribution) or ()))
    warn(f"tfrepro: {entry.name} is missing from {entry.distribution} {version} ({found}), so {entry.breaks}. "
         f"tfrepro expects it in {_range(entry)}; pin a {entry.distribution} release in that range, or report it")


def _range(entry: Target) -> str:
    first, stop = entry.versions
    low = ".".join(map(str, first))
    return f"{entry.distribution} {low} and later" if stop is None else f"{entry.distribution} {low} to {'.'.join(map(str, stop))} (exclusive)"


def check_modules(distribution: str) -> None:
    """Record and warn about every module of ``distribution``'s expected targets that cannot be found
    (a renamed module never triggers its import hook). Run once ``distribution`` is loaded: finding a
    submodule imports its parent packages, which the loaded distribution has imported already."""
    version = installed_version(distribution)
    mine = [entry for entry in INVENTORY if entry.distribution == distribution]
    newest = max((entry.versions[1] or (10**6, 0) for entry in mine), default=None)
    if version is not None and (not any(expected(entry) for entry in mine) or version >= newest):
        if distribution not in _missing:
            _missing[distribution] = (distribution, f"{'.'.join(map(str, version))} is outside every known range")
            warn(f"tfrepro: no hook of tfrepro knows {distribution} {'.'.join(map(str, version))}, so patch() cannot "
                 f"make its training reproducible; install a release tfrepro supports (docs: install)")
        return
    for entry in mine:
        if entry.key in _missing or not expected(entry):
            continue
        try:
            found = entry.module in sys.modules or importlib.util.find_spec(entry.module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            _report(entry, f"no module {entry.module}")


_watching = False


def watch() -> None:
    """Check the modules of the targets of TensorFlow, Keras and tf_keras as each finishes loading
    (``check_modules``), now for those loaded; once per process."""
    global _watching
    if not _watching:
        _watching = True
        call_after_import({name: lambda module: check_modules(module.__name__)
                           for name in ("tensorflow", "keras", "tf_keras")
                           if name in sys.modules or importlib.util.find_spec(name) is not None})


def missing() -> dict[str, str]:
    """The targets found missing in this process so far, ``{name: what was found}``."""
    return dict(_missing.values())


def audit(distributions: Iterable[str] = ("tensorflow", "keras", "tf_keras")) -> list[str]:
    """Import and resolve every target expected on the installed releases of ``distributions``
    (imports TensorFlow and Keras). Returns one line per target that fails; empty when all resolve."""
    problems = []
    for entry in INVENTORY:
        if entry.distribution not in distributions or not expected(entry):
            continue
        try:
            _resolve(importlib.import_module(entry.module), entry.attribute)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{entry.key}: {entry.name} ({type(exc).__name__}: {exc})")
    return problems
