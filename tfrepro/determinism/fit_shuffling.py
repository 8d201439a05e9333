"""Under ``patch``, ``Model.fit(x, y, shuffle=True)`` on arrays draws each epoch's order from the
seed and the epoch.

Keras builds the order of each pass over the arrays with ``tf.random.shuffle`` inside a tf.data
map (Keras 3.16: ``tf.random.experimental.stateless_shuffle``, seeded by an epoch count that it
reads once, when it builds the pipeline). Once TF's global seed is set, Keras 3 starts that op
afresh on every epoch's iterator, so every epoch has the same order (on Keras 3.16 whatever the
seed); Keras 2 draws the epochs' orders one after another from one op, so the order of epoch E
depends on the E orders drawn before it. The rebinding is narrow: while Keras builds that pipeline
(Keras 3's ``ArrayDataAdapter.get_tf_dataset``, Keras 2's ``TensorLikeDataAdapter.__init__``),
both shuffles are a keyed permutation of the key (patch seed, "fit shuffle", epoch), and a pipeline
built without either warns by name. Keras 3 makes one pass (one iterator) per epoch, after
``on_epoch_begin``: its epoch is the epoch clock's (see ``epochs``), read when the pass's order is
drawn. Keras 2 draws every epoch's order from one iterator, ahead of training: pass ``k`` has epoch
``E0 + k``, ``E0`` the clock when the first order is drawn (``fit``'s first epoch; a resume that
skips to epoch E draws it first at E).

``shuffle="batch"`` keeps Keras's own draws. Without ``patch``, Keras is left as it is.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from tfrepro import _targets, _tf
from tfrepro._import_hooks import call_after_import
from tfrepro.determinism import epochs, keys, state
from tfrepro.errors import warn

PURPOSE = "fit shuffle"
_hooked = False


def follow_the_seed() -> None:
    """Put the rebinding in place for every Keras, loaded now or later (once per process). It acts
    only while a ``patch`` is active."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    call_after_import({entry.module: functools.partial(_rebind, key=entry.key)
                       for entry in _targets.for_role("fit_shuffle")})


def _rebind(module: ModuleType, key: str) -> None:
    """Key the shuffle of the pipeline-building method ``key`` names (Keras 3's
    ``ArrayDataAdapter.get_tf_dataset``, Keras 2's ``TensorLikeDataAdapter.__init__``)."""
    original = _targets.find(module, key)
    if original is None or getattr(original, "_tfrepro_keyed", False):
        return
    class_name, method = _targets.target(key).attribute.split(".")
    adapter = getattr(module, class_name)

    @functools.wraps(original)
    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        shuffle = kwargs.get("shuffle", getattr(self, "_shuffle", False)) if method == "__init__" else self._shuffle
        seed = state.active_seed()
        if seed is None or shuffle is not True:
            return original(self, *args, **kwargs)
        if method == "__init__":  # Keras 2: one iterator for all epochs, drawn ahead
            with _keyed_tf_random_shuffle(seed, _counted_passes()):
                return original(self, *args, **kwargs)
        with _epoch_as_the_pass_element() as swapped, _keyed_tf_random_shuffle(seed, lambda: _epoch_argument(swapped)):
            return original(self, *args, **kwargs)

    build._tfrepro_keyed = True  # type: ignore[attr-defined]
    setattr(adapter, method, build)


@contextlib.contextmanager
def _epoch_as_the_pass_element() -> Iterator[list[bool]]:
    """Keras 3 maps its order over ``tf.data.Dataset.range(1)``, one element per pass: meanwhile that
    element is the epoch, read from the clock's ``records`` as the pass begins (a variable read in
    the map would make TF run Keras's parallel map and prefetch sequentially under op determinism;
    see ``epochs``)."""
    tf = _tf.import_tf()
    dataset = tf.data.Dataset
    original = dataset.__dict__["range"]
    swapped: list[bool] = []  # non-empty once Keras's range(1) was the epoch

    def epoch_or_range(*args: Any, **kwargs: Any) -> Any:
        if args == (1,) and not kwargs:
            swapped.append(True)
            return epochs.records()
        return original.__func__(*args, **kwargs)

    dataset.range = staticmethod(epoch_or_range)
    try:
        yield swapped
    finally:
        dataset.range = original


def _epoch_argument(swapped: list[bool]) -> Any:
    """The epoch, where Keras 3 draws its order: the argument of the map function being traced (the
    pass's element, see ``_epoch_as_the_pass_element``); the clock variable where Keras built its
    pass otherwise (slower under op determinism, but right)."""
    tf = _tf.import_tf()
    if not swapped:
        return epochs.clock().read_value()
    graph = tf.compat.v1.get_default_graph()
    captured = {id(t) for t in getattr(graph, "internal_captures", ())}
    arguments = [t for t in getattr(graph, "inputs", ()) if id(t) not in captured and t.dtype == tf.int64
                 and t.shape.rank == 0] if getattr(graph, "building_function", False) else []
    return arguments[0] if len(arguments) == 1 else epochs.clock().read_value()


def _counted_passes() -> Callable[[], Any]:
    """The epoch of each pass of one pipeline whose passes are drawn in order: the clock's when the
    first is drawn, then one more per pass."""
    tf = _tf.import_tf()
    clock = epochs.clock()
    with tf.init_scope():
        passes = tf.Variable(0, dtype=tf.int64, trainable=False)
        first = tf.Variable(0, dtype=tf.int64, trainable=False)

    def epoch_of_pass() -> Any:
        k = passes.assign_add(1) - 1
        return tf.cond(k == 0, lambda: first.assign(clock.read_value()), first.read_value) + k

    return epoch_of_pass


# Where Keras draws its order: ``tf.random.shuffle`` (Keras 2, Keras 3 up to 3.15), and
# ``tf.random.experimental.stateless_shuffle`` (Keras 3.16, seeded by Keras's own epoch count).
_SHUFFLES = (("random", "shuffle"), ("random.experimental", "stateless_shuffle"))


@contextlib.contextmanager
def _keyed_tf_random_shuffle(seed: int, epoch_of_pass: Callable[[], Any]) -> Iterator[None]:
    """Every shuffle Keras draws its order with (under every name Keras reaches it by) is the keyed
    one meanwhile. A pipeline built without calling one of them warns by name: Keras drew its order
    some other way, which ``patch`` does not key."""
    tf = _tf.import_tf()
    base = keys.key(seed, PURPOSE)
    calls = []

    def shuffle(value: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(True)
        value = tf.convert_to_tensor(value)
        order = keys.permutation(tf.shape(value, out_type=tf.int64)[0], keys.fold_in(base, epoch_of_pass()))
        return tf.gather(value, order)

    originals: list[tuple[Any, str, Callable[..., Any]]] = []
    for root in (tf, getattr(tf.compat, "v2", None)):
        for path, name in _SHUFFLES:
            owner = functools.reduce(lambda module, part: getattr(module, part, None), path.split("."), root)
            if getattr(owner, name, None) is not None:
                originals.append((owner, name, getattr(owner, name)))
                setattr(owner, name, functools.wraps(getattr(owner, name))(shuffle))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    if not calls:
        keras = _tf.keras_info()
        warn(f"tfrepro: {keras.module} {keras.version} built fit's shuffled pipeline without tf.random.shuffle or "
             "tf.random.experimental.stateless_shuffle, so its order is not keyed by (seed, epoch) under patch; "
             "pass shuffle=False and shuffle with tfrepro.data.shuffle, or report it")
