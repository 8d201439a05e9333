"""Under ``patch``, ``Dataset.shuffle`` orders each pass by the seed, the call and the epoch.

TF's ``Dataset.shuffle`` (``reshuffle_each_iteration`` on, its default) draws each pass's order from
a seed generator that every new iterator moves on: epoch E's order depends on how many iterators
were made before it (Keras's, a ``take(1)`` to peek, an evaluation), so a resume at epoch E has to
replay the E epochs before it to reach E's order. Under ``patch`` it is ``tfrepro.data.shuffle``
instead: each pass's order is a keyed function of the patch seed, the ``seed`` argument where one
is given (else the place of the call: module, function and line), and the epoch (``fit``'s, or
``tfrepro.data.set_epoch``'s). So every epoch has another order, every run the same, and a resume
draws epoch E's order directly. As with TF, one ``seed`` gives one order: two datasets of one
length shuffled with ``seed=7`` stay paired; and a ``seed`` keeps the order when the code around
the call moves (a key from the place changes with the line, the module's import name, a notebook
cell's position; one line called for several datasets of one length gives them one permutation).
``repeat()`` after it keys each pass anew (``repeats``); a custom loop that never sets the epoch
draws anew with each pass over the same draws (``pipeline_checks``).

Left as TF's: ``reshuffle_each_iteration=False`` (each pass restarts the one order: addressable as
it is), a buffer size not known as the pipeline is built, a dataset whose auto-shard policy is
``FILE`` (a keyed pass cannot be sharded by file), a shuffle built inside a ``tf.function`` or a
tf.data function (an ``interleave``'s sub-datasets start while training runs, and would read a
racing epoch), and the shuffles TF and Keras make themselves (``Dataset.list_files``, whose files a
multi-worker strategy shards; Keras's data adapters); Keras's ``image_dataset_from_directory`` and
the other dataset utilities are keyed. Without ``patch``, ``Dataset.shuffle`` is TF's.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

from tfrepro import _tf
from tfrepro.data import shuffling
from tfrepro.determinism import state

log = logging.getLogger("tfrepro")
PURPOSE = "Dataset.shuffle"
# Callers whose shuffles stay TF's: TF itself (``Dataset.list_files``), Keras's fit adapters.
_LEFT_TO_TF = "tensorflow."
_hooked = False


def follow_the_seed() -> None:
    """Key ``tf.data.Dataset.shuffle`` (once per process). It acts only while a ``patch`` is
    active; ``patch`` calls this as it applies."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    dataset = _tf.import_tf().data.Dataset
    original = dataset.shuffle

    @functools.wraps(original)
    def shuffle(self: Any, buffer_size: Any, seed: Any = None, reshuffle_each_iteration: Any = None,
                name: Any = None) -> Any:
        keyed = _keyed(self, buffer_size, seed, reshuffle_each_iteration)
        if keyed is not None:
            return keyed
        return original(self, buffer_size, seed=seed, reshuffle_each_iteration=reshuffle_each_iteration, name=name)

    dataset.shuffle = shuffle


def _keyed(dataset: Any, buffer_size: Any, seed: Any, reshuffle: Any) -> Any:
    """The keyed shuffle that ``Dataset.shuffle`` is under the active patch, or None where it stays TF's."""
    patch_seed = state.active_seed()
    if patch_seed is None or (reshuffle is not None and not reshuffle):
        return None
    tf = _tf.import_tf()
    if getattr(tf.compat.v1.get_default_graph(), "building_function", False):
        return None
    buffer = tf.get_static_value(buffer_size)
    user_seed = tf.get_static_value(seed) if seed is not None else None
    if buffer is None or int(buffer) < 1 or (seed is not None and user_seed is None):
        return None
    if dataset.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.FILE:
        return None
    site = _call_site()
    if site is None:
        return None
    purpose = (PURPOSE, site) if user_seed is None else (PURPOSE, "seed", int(user_seed))
    log.debug("tfrepro: Dataset.shuffle at %s keyed by (seed, call, epoch)", site)
    return shuffling.keyed_shuffle(dataset, int(buffer), patch_seed, purpose, None, f"Dataset.shuffle at {site}")


def _call_site() -> str | None:
    """Where ``Dataset.shuffle`` was called from, as ``module.function:line`` (past tfrepro's own
    wrappers and TF's V1 ``Dataset.shuffle``); None where TF or Keras's fit adapters called it."""
    frame = sys._getframe(3)
    while frame is not None and (frame.f_globals.get("__name__", "").startswith("tfrepro.data.") or (
            frame.f_code.co_name == "shuffle" and frame.f_globals.get("__name__", "").startswith("tensorflow."))):
        frame = frame.f_back
    if frame is None:
        return None
    module = frame.f_globals.get("__name__", "")
    if module.startswith(_LEFT_TO_TF) or "data_adapter" in module:  # Keras's fit adapters, each Keras's name
        return None
    code = frame.f_code
    return f"{module}.{getattr(code, 'co_qualname', code.co_name)}:{frame.f_lineno}"
