"""``patch(seed, init="keyed")``: each weight's initial value is keyed by the seed and the weight's
place in its layer, not by the order in which weights are created.

Keras's random initialisers draw from a stream (Keras 3: a seed taken from Python's ``random`` per
initialiser; Keras 2: the global generator), so adding one layer changes every later layer's
initial weights (TF #54442), and ablations compare different initialisations. Keyed, a weight made
by ``Layer.add_weight`` with a random Keras initialiser (given as an instance or by name; the
default ``glorot_uniform`` of a float weight too) gets a copy of it seeded with
``derive_seed(seed, "init", layer path, weight name)`` (the weight's creation index within its
layer when it has no name). The layer path is Keras 3's name scope without its outermost model
(``lstm/lstm_cell``, ``bidirectional/forward_lstm/lstm_cell``: cells and sublayers that share a name
are told apart by their parents); on Keras 2, TF's name scope, which has the same parents.

What is stable: every weight of a layer whose name is the same in both models; give layers names
(``Dense(64, name="encoder_1")``) to keep their initial weights when layers are added, removed or
reordered. Keras's automatic names (``dense_3``) count the layers of a class made before, so a
layer of the same class added earlier renames, and re-initialises, the ones after it. Initialisers
that are plain functions, and variables made without ``add_weight``, are not keyed. ``init="order"``
(the default) is the scheme of earlier releases, so old runs keep their initial values.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import weakref
from types import ModuleType
from typing import Any

from tfrepro import _targets, _tf
from tfrepro._import_hooks import call_after_import
from tfrepro.determinism import seeding, state
from tfrepro.errors import warn

SCHEMES = ("order", "keyed")
_hooked = False


def check_scheme(init: object) -> str:
    if init not in SCHEMES:
        raise ValueError(f'init must be "order" or "keyed"; got {init!r}')
    return init  # type: ignore[return-value]


def follow_the_scheme() -> None:
    """Put the ``add_weight`` rebinding in place for every Keras, loaded now or later (once per
    process). It keys initialisers only while a ``patch(init="keyed")`` is active."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    call_after_import({entry.module: functools.partial(_rebind, key=entry.key)
                       for entry in _targets.for_role("add_weight")})
    call_after_import({entry.module: functools.partial(_check_at_train_begin, key=entry.key)
                       for entry in _targets.for_role("epochs")})


def _check_at_train_begin(module: ModuleType, key: str) -> None:
    """``fit``'s callback list names the weights that started identical (``warn_about_shared_keys``)
    as training begins, and, under the exact tier, a ``fit`` whose ops run eagerly, out of its
    audit's sight (``tfrepro.ops.exact.coverage.check_fit``)."""
    if _targets.find(module, key) is None:
        return
    callback_list = module.CallbackList
    original = callback_list.on_train_begin
    if getattr(original, "_tfrepro_checks_keys", False):
        return

    @functools.wraps(original)
    def on_train_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = getattr(self, "model", None)
        if model is not None:
            warn_about_shared_keys(model)
            if state.active_summation() == "exact_tier":
                from tfrepro.ops.exact import coverage  # TensorFlow is loaded: Keras is training

                coverage.check_fit(model)
        return original(self, *args, **kwargs)

    on_train_begin._tfrepro_checks_keys = True  # type: ignore[attr-defined]
    callback_list.on_train_begin = on_train_begin


def _rebind(module: ModuleType, key: str) -> None:
    original = _targets.find(module, key)
    if original is None or getattr(original, "_tfrepro_keyed", False):
        return
    layer_class = module.Layer
    signature = inspect.signature(original)
    root = importlib.import_module(module.__name__.split(".")[0])
    initializers = importlib.import_module(f"{root.__name__}.initializers")

    @functools.wraps(original)
    def add_weight(self: Any, *args: Any, **kwargs: Any) -> Any:
        active = state.active()
        if active is None or active.init != "keyed":
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        arguments = dict(bound.arguments)
        positional = list(arguments.pop("args", ()))  # Keras 3: add_weight(shape, initializer, dtype) by position
        arguments.update(zip(("shape", "initializer", "dtype"), positional))
        count = self.__dict__.get("_tfrepro_weights_added", 0)
        self.__dict__["_tfrepro_weights_added"] = count + 1
        path, weight = _layer_path(root, self), arguments.get("name") or f"#{count}"
        keyed = _keyed_initializer(initializers, arguments, seeding.derive_seed(active.seed, "init", path, weight))
        if keyed is None:
            return original(self, *args, **kwargs)
        if len(positional) > 1:
            positional[1] = keyed
            bound.arguments["args"] = tuple(positional)
        else:
            bound.arguments["initializer"] = keyed
        variable = original(*bound.args, **bound.kwargs)
        _KEYS[id(variable)] = (f"{path}/{weight}", weakref.ref(variable))
        return variable

    add_weight._tfrepro_keyed = True  # type: ignore[attr-defined]
    layer_class.add_weight = add_weight


# id(variable) -> (its key, a weak reference to it): the keys given by add_weight, for
# ``shared_keys``. An entry whose variable is gone is dropped as it is found.
_KEYS: dict[int, tuple[str, Any]] = {}


def shared_keys(model: Any) -> list[tuple[str, list[str]]]:
    """The keys that two or more distinct variables of ``model`` got from ``init="keyed"``, with
    their paths: such weights started with the same values (two towers built by one function with
    the same layer names, say). Empty when every key is its own."""
    by_key: dict[str, list[str]] = {}
    for variable in getattr(model, "weights", []):
        entry = _KEYS.get(id(variable))
        if entry is None or entry[1]() is not variable:
            continue
        by_key.setdefault(entry[0], []).append(getattr(variable, "path", None) or variable.name)
    return [(key, paths) for key, paths in by_key.items() if len(paths) > 1]


def warn_about_shared_keys(model: Any) -> None:
    """Under ``init="keyed"``, name the weights of ``model`` that started identical (``shared_keys``)."""
    active = state.active()
    if active is None or active.init != "keyed":
        return
    shared = shared_keys(model)
    if shared:
        key, paths = shared[0]
        warn(f'init="keyed": {len(paths)} weights of this model ({", ".join(paths)}) have one key ({key!r}: the same '
             "layer path and weight name), so they started with the same values; give their layers distinct names"
             + (f" ({len(shared) - 1} more key(s) shared)" if len(shared) > 1 else ""))


def _layer_path(keras: ModuleType, layer: Any) -> str:
    """The names of the layers whose scope the weight is made in, less an outermost model (whose
    automatic name counts the models made before)."""
    try:
        state = importlib.import_module(f"{keras.__name__}.src.backend.common.global_state")
    except ImportError:  # Keras 2 builds a layer in TF's name scope of its parents, no model's among them
        return _tf.import_tf().get_current_name_scope() or layer.name
    stack = state.get_global_attribute("name_scope_stack") or []
    if stack and isinstance(getattr(stack[0], "caller", None), keras.Model):
        stack = stack[1:]
    return "/".join(scope.name for scope in stack) or layer.name


def _keyed_initializer(initializers: ModuleType, arguments: dict[str, Any], seed: int) -> Any:
    """A copy of the weight's random Keras initialiser seeded with ``seed``; None to leave it."""
    given = arguments.get("initializer")
    if given is None:
        dtype = str(arguments.get("dtype") or "float")
        if "float" not in dtype:
            return None
        given = "glorot_uniform"  # Keras's default for a float weight, in Keras 2 and 3
    try:
        initializer = initializers.get(given)
        config = initializer.get_config()
    except (ValueError, TypeError, AttributeError):
        return None
    if "seed" not in config:
        return None  # not random (zeros, ones, constant) or not Keras's
    return type(initializer).from_config({**config, "seed": seed})
