"""The epoch clock: which training epoch keyed random draws belong to.

Keyed draws (``fit``'s shuffle of arrays under ``patch``, ``tfrepro.data.shuffle``,
``tfrepro.data.map_with_seed``) are stateless functions of a seed, what the draw is for, the epoch
and the element. The epoch is one process-wide value, never a count of iterators: ``Model.fit`` sets
it (tfrepro hooks Keras's ``CallbackList``: ``initial_epoch`` at ``on_train_begin``, E at
``on_epoch_begin(E)``, E + 1 at ``on_epoch_end(E)``); a custom training loop calls ``set_epoch(e)``,
as with PyTorch's ``DistributedSampler.set_epoch``. A pass over a dataset reads it when its first
element is made: tf.data iterators start when first pulled, which under ``fit`` is in that epoch's
first step. Validation reads the epoch it validates. Each ``fit`` starts the clock at its
``initial_epoch``: fitting one epoch at a time needs ``initial_epoch`` to get a new epoch's draws
each time. Nothing is created until a keyed draw asks for the clock.

tf.data pipelines read it from a file in TF's in-memory file system (``records``), not from a
variable: under op determinism, TF's ``make_deterministic`` rewrite turns every parallel ``map``,
``interleave`` and ``prefetch`` of a pipeline sequential once any of its functions reads a variable
(which another thread could write meanwhile), whereas reading files is deterministic by TF's own
rule. A variable read would make a whole augmentation pipeline serial under ``patch``.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from types import ModuleType
from typing import Any

from tfrepro import _targets, _tf
from tfrepro._import_hooks import call_after_import

_clock: Any = None
_records_path: str | None = None
_moved = False  # whether fit or set_epoch has set the clock in this process
_hooked = False


def clock() -> Any:
    """The epoch variable (created on first use, outside any ``tf.function``, on the CPU)."""
    global _clock
    if _clock is None:
        tf = _tf.import_tf()
        with tf.init_scope(), tf.device("/CPU:0"):  # also when first asked for inside a tf.data function
            _clock = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfrepro_epoch")
            _follow_fit_epochs()
            _set(0, moved=False)
    return _clock


def records() -> Any:
    """A dataset of one element: the epoch (``int64``) when the element is pulled (a pass reads it
    when its first element is made), not when the dataset or its iterator is made."""
    tf = _tf.import_tf()
    clock()
    return tf.data.FixedLengthRecordDataset(_records_path, 8).map(lambda record: tf.io.decode_raw(record, tf.int64)[0])


def _set(epoch: int, moved: bool = True) -> None:
    global _records_path, _moved
    _moved = _moved or moved
    tf = _tf.import_tf()
    clock().assign(epoch)
    if _records_path is None:
        folder = f"ram://tfrepro-epoch-{os.getpid()}-{id(_clock)}"
        tf.io.gfile.makedirs(folder)
        _records_path = f"{folder}/epoch"
    written = f"{_records_path}.{threading.get_ident()}.new"
    with tf.io.gfile.GFile(written, "wb") as f:
        f.write(int(epoch).to_bytes(8, "little", signed=True))
    tf.io.gfile.rename(written, _records_path, overwrite=True)  # a reader sees the old epoch or the new


def was_set() -> bool:
    """Whether ``fit`` or ``set_epoch`` has set the clock in this process (its 0 at creation does not count)."""
    return _moved


def set_epoch(epoch: int) -> None:
    """Sets the epoch that keyed random draws belong to, for a custom training loop.

    Keyed draws (`tfrepro.data.shuffle`, `tfrepro.data.map_with_seed`, `fit`'s shuffle of arrays
    under `patch`) are functions of the seed, the epoch and the element. `Model.fit` sets the epoch
    itself; a custom training loop calls this before the first batch of each epoch, before pulling
    from a keyed dataset, as with PyTorch's `DistributedSampler.set_epoch`. A pass over a dataset
    reads the epoch when its first element is made. The epoch is one value for the whole process.

    Args:
        epoch: The epoch, a non-negative int.

    Raises:
        ValueError: `epoch` is not a non-negative int (a bool included).
        ImportError: TensorFlow is not installed.

    Examples:
        >>> import tfrepro.data
        >>> tfrepro.data.set_epoch(3)
        >>> tfrepro.data.current_epoch()
        3
    """
    _set(check_epoch(epoch))


def check_epoch(epoch: object, alternative: str = "") -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative int{', ' + alternative if alternative else ''}; got {epoch!r}")
    return epoch


def current_epoch() -> int:
    """The epoch that keyed random draws now belong to.

    Returns:
        The epoch last set by `set_epoch` or by `Model.fit`, an int; 0 before either set it.
    """
    return int(clock().numpy())


def _follow_fit_epochs() -> None:
    """Make every Keras ``CallbackList.on_epoch_begin`` set the clock: now for a Keras loaded, when
    it loads for one that is not (once per process)."""
    global _hooked
    if not _hooked:
        _hooked = True
        call_after_import({entry.module: functools.partial(_hook_callback_list, key=entry.key)
                           for entry in _targets.for_role("epochs")})


def _hook_callback_list(module: ModuleType, key: str) -> None:
    """``fit``'s callback list sets the clock: to ``initial_epoch`` as training begins (read from
    ``fit``'s frame), to E as epoch E begins, and to E + 1 as it ends, so that an iterator made
    between two epochs (Keras 2 makes the next one before ``on_epoch_begin``; a distributed one
    starts at once) reads the epoch it is for."""
    on_epoch_begin = _targets.find(module, key)
    if on_epoch_begin is None or getattr(on_epoch_begin, "_tfrepro_sets_epoch", False):
        return
    callback_list = module.CallbackList

    def train_begin(self: Any, logs: Any = None) -> int | None:
        frame = sys._getframe(2)
        for _ in range(6):
            if frame is None:
                return None
            if frame.f_code.co_name == "fit" and "initial_epoch" in frame.f_locals:
                return int(frame.f_locals["initial_epoch"] or 0)
            frame = frame.f_back
        return None

    for name, epoch_of in (("on_train_begin", train_begin), ("on_epoch_begin", lambda self, epoch, logs=None: epoch),
                           ("on_epoch_end", lambda self, epoch, logs=None: epoch + 1)):
        _set_clock_before(callback_list, name, epoch_of)


def _set_clock_before(callback_list: type, name: str, epoch_of: Any) -> None:
    original = getattr(callback_list, name)

    @functools.wraps(original)
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        epoch = epoch_of(self, *args, **kwargs)
        if epoch is not None:
            _set(int(epoch))
        return original(self, *args, **kwargs)

    hook._tfrepro_sets_epoch = True  # type: ignore[attr-defined]
    setattr(callback_list, name, hook)
