"""The epoch clock: which training epoch keyed random draws belong to.

Keyed draws (``fit``'s shuffle of arrays under ``patch``, ``tfrepro.data.shuffle``,
``tfrepro.data.map_with_seed``) are stateless functions of a seed, what the draw is for, the epoch
and the element. The epoch is read from one process-wide ``int64`` variable, never from a count of
iterators: ``Model.fit`` sets it at the start of each epoch (``CallbackList.on_epoch_begin``, with
``tfrepro``'s hook, so every Keras callback list sets it, whether or not the model was built under
``patch``); a custom training loop calls ``set_epoch(e)``, as with PyTorch's
``DistributedSampler.set_epoch``. Reading it is free of races because tf.data iterators start
lazily: a pass over a dataset reads the clock when its first element is pulled, which under ``fit``
is in that epoch's first step (validation reads the same epoch). Nothing is created until a keyed
draw asks for the clock.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tfrepro import _tf
from tfrepro._import_hooks import call_after_import

_clock: Any = None
# Where each Keras defines CallbackList: Keras 3, tf_keras, and the Keras 2 of TF 2.12.
_CALLBACK_LISTS = ("keras.src.callbacks.callback_list", "tf_keras.src.callbacks", "keras.callbacks")
_hooked = False


def clock() -> Any:
    """The epoch variable (created on first use, outside any ``tf.function`` or strategy)."""
    global _clock
    if _clock is None:
        tf = _tf.import_tf()
        with tf.init_scope():
            _clock = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfrepro_epoch")
        _follow_fit_epochs()
    return _clock


def set_epoch(epoch: int) -> None:
    """Set the epoch that keyed draws belong to (``Model.fit`` sets it itself). Call it before the
    first batch of each epoch of a custom training loop, before pulling from a keyed dataset.

    >>> import tfrepro.data
    >>> tfrepro.data.set_epoch(3)
    >>> tfrepro.data.current_epoch()
    3
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative int; got {epoch!r}")
    clock().assign(epoch)


def current_epoch() -> int:
    """The epoch keyed draws now belong to."""
    return int(clock().numpy())


def _follow_fit_epochs() -> None:
    """Make every Keras ``CallbackList.on_epoch_begin`` set the clock: now for a Keras loaded, when
    it loads for one that is not (once per process)."""
    global _hooked
    if not _hooked:
        _hooked = True
        call_after_import({name: _hook_callback_list for name in _CALLBACK_LISTS})


def _hook_callback_list(module: ModuleType) -> None:
    callback_list = getattr(module, "CallbackList", None)
    if callback_list is None or getattr(callback_list.on_epoch_begin, "_tfrepro_sets_epoch", False):
        return
    original = callback_list.on_epoch_begin

    def on_epoch_begin(self: Any, epoch: int, logs: Any = None) -> Any:
        clock().assign(int(epoch))
        return original(self, epoch, logs)

    on_epoch_begin._tfrepro_sets_epoch = True  # type: ignore[attr-defined]
    on_epoch_begin.__wrapped__ = original  # type: ignore[attr-defined]
    callback_list.on_epoch_begin = on_epoch_begin
