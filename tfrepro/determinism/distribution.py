"""Under ``patch``, ``tf.distribute`` training all-reduces one fixed way, draws its randomness keyed
by replica, and Keras 3 can train under ``MultiWorkerMirroredStrategy``.

- **The collective implementation is pinned to RING.** ``CommunicationImplementation.AUTO`` (the
  default) lets TF pick NCCL on GPUs, whose reduction order follows the algorithm NCCL chooses for
  the message size and topology (TF #121429: RING and AUTO give different results). RING is TF's
  own ring all-reduce: a fixed order for a fixed cluster, and the same bits on every worker (each
  chunk is reduced once and then broadcast). A strategy the user built with NCCL explicitly keeps
  it, with a ``ReproducibilityWarning``. ``bytes_per_pack`` (gradient packing) is left as given: it
  packs by the variables' sizes, which are the same in every run. What each strategy used is
  recorded (``chosen()``) and goes into ``tfrepro.environment()``, so ``tfrepro compare`` names a
  difference in it.
- **Keras 3's ``fit`` under MultiWorkerMirroredStrategy** fails in its first step on every Keras 3
  release up to 3.15 (keras-team/keras#20585): the symbolic build all-reduces the structure of the
  first batch, and the logs are mean-reduced along an axis that scalars lack. While patched, the
  build takes the local replica's batch (it needs shapes only, and an all-reduce of a string batch
  could not work anyway), and scalar logs are mean-reduced whole. Other strategies are untouched.
- **Randomness is keyed by replica.** A ``tf.random.Generator`` made in a strategy's scope gives
  replica R the stream of (its seed, R) under ``MirroredStrategy`` and ``MultiWorkerMirroredStrategy``
  alike (TensorFlow's own rule); so do Keras 2's random layers, which draw from such generators
  under ``patch``. Keras 3's random layers draw from a mirrored ``SeedGenerator``: every replica
  would drop the same units of its examples. While patched, inside a replica context of more than
  one replica, each seed Keras 3 draws (an integer seed given to a layer included) is folded with
  the replica's id (``tf.random.experimental.stateless_fold_in``, Philox), so replica R's masks are
  a function of the drawn seed and R: different on each replica, the same in every run, and the same
  for replica R of 2 workers and of 2 devices in one process.
- **Keras 3's BatchNormalization keeps one set of moving statistics.** Its moving mean and variance
  are mirrored variables without aggregation, each replica updating its copy from its own part of
  the batch: the copies drift apart (``tfrepro check --workers`` shows worker 1's
  ``batch_normalization`` differing from worker 0's after the first step), inference depends on
  the worker, and a checkpoint can hold one copy only. While patched, under a strategy of more than
  one replica, a BatchNormalization built in its scope makes them ``aggregation="mean"``: every
  step writes the mean of the replicas' updates to every copy (one small all-reduce per variable),
  so the copies stay the same bits; a ``synchronized=True`` one, whose statistics every replica
  shares, makes them ``"only_first_replica"`` under the exact tier (the first replica's update,
  copied: a float mean of 3 identical copies can round). (Keras 2 keeps per-replica copies and averages them when they
  are read; either way the statistic is the mean over replicas of each replica's own batch
  statistics, which for the variance is not the variance of the global batch.)

Without ``patch`` all of this is left as Keras and TensorFlow have it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
from types import ModuleType
from typing import Any

from tfrepro import _targets
from tfrepro._import_hooks import call_after_import
from tfrepro.determinism import state
from tfrepro.errors import warn

_chosen: list[dict[str, Any]] = []  # one entry per strategy built in this process
_hooked = False


def follow_the_patch() -> None:
    """Put the hooks in place for TensorFlow's strategy and Keras 3's trainer, loaded now or later
    (once per process). They act only while a ``patch`` is active."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    call_after_import({_targets.target(key).module: hook for key, hook in (
        ("tf:strategy_base", _seeded_generator_before_any_scope), ("tf:collective_strategy", _pin_ring),
        ("keras3:trainer_build", _repair_keras3), ("keras3:draw_seed", _key_keras3_seeds_by_replica),
        ("keras3:batch_norm", _average_keras3_moving_statistics))})


def chosen() -> list[dict[str, Any]]:
    """How each MultiWorkerMirroredStrategy built in this process all-reduces: ``implementation``,
    ``bytes_per_pack`` and ``pinned`` (whether ``patch`` chose the implementation)."""
    return [dict(entry) for entry in _chosen]


def cluster() -> dict[str, Any] | None:
    """This process's place in the ``TF_CONFIG`` cluster: ``{"workers": N, "task": "worker:K"}``
    (workers counts every task that trains, chief included), or None without a cluster."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        config = json.loads(raw)
        jobs = config.get("cluster", {})
        task = config.get("task", {})
        return {"workers": sum(len(jobs.get(job, [])) for job in ("chief", "worker")),
                "task": f"{task.get('type')}:{task.get('index')}"}
    except (ValueError, AttributeError, TypeError):
        return {"workers": None, "task": "TF_CONFIG is not valid JSON"}


def _original(module: ModuleType, key: str) -> Any:
    """The target ``key`` names in ``module`` (``_targets``), or None when it is missing (warned
    about by name where expected) or tfrepro replaced it already (hooks run once)."""
    found = _targets.find(module, key)
    return None if found is None or getattr(found, "_tfrepro", False) else found


def _install(owner: Any, name: str, original: Any, replacement: Any) -> None:
    """Put ``replacement`` (which calls ``original`` when unpatched) in place of ``owner.name``."""
    functools.update_wrapper(replacement, original)
    replacement._tfrepro = True
    setattr(owner, name, replacement)


def _seeded_generator_before_any_scope(module: ModuleType) -> None:
    """``patch`` leaves TF's global Generator to its first use while TF's runtime has not started
    (``seeding``). Made first inside a strategy's scope, it would be a distributed generator of that
    strategy: so it is made as soon as a strategy exists (its runtime and collectives set up), outside
    any scope."""
    original = _original(module, "tf:strategy_base")
    if original is None:
        return
    strategy_base = module.StrategyBase
    from tfrepro.determinism import seeding

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if state.active() is not None and not type(self).__name__.startswith("_Default"):
            seeding.make_due_global_generator()

    _install(strategy_base, "__init__", original, __init__)


def _pin_ring(module: ModuleType) -> None:
    original = _original(module, "tf:collective_strategy")
    if original is None:
        return
    strategy_class = module.CollectiveAllReduceStrategy
    from tensorflow.python.distribute import collective_util

    implementation = collective_util.CommunicationImplementation

    def __init__(self: Any, cluster_resolver: Any = None, communication_options: Any = None) -> None:
        if state.active() is None:
            return original(self, cluster_resolver, communication_options)
        options = communication_options or collective_util.Options()
        pinned = options.implementation == implementation.AUTO
        if pinned:
            options = options.merge(collective_util.Options(implementation=implementation.RING))
        elif options.implementation == implementation.NCCL:
            warn("MultiWorkerMirroredStrategy was given CommunicationImplementation.NCCL: NCCL's reduction order "
                 "follows the algorithm it picks for the message size and topology, so results can change with "
                 "the cluster. tfrepro.patch pins RING when the implementation is left to AUTO.")
        _chosen.append({"implementation": options.implementation.name, "bytes_per_pack": options.bytes_per_pack,
                        "pinned": pinned})
        return original(self, cluster_resolver, options)

    _install(strategy_class, "__init__", original, __init__)


def _repair_keras3(module: ModuleType) -> None:
    build_key = _targets.key_for("trainer_build")  # TensorFlowTrainer, renamed Trainer in Keras 3.16
    build, reduce_per_replica = _original(module, build_key), _original(module, "keras3:trainer_reduce")
    multi_worker = _targets.find(module, "keras3:trainer_multi_worker")
    if build is None or reduce_per_replica is None or multi_worker is None:
        return
    try:
        tree = importlib.import_module(_targets.target("keras3:tree").module)
    except ImportError:  # a Keras 3 without keras.src.tree predates this code path: left as it is
        return
    if _targets.find(tree, "keras3:tree") is None:
        return
    import tensorflow as tf

    trainer_class = getattr(module, _targets.target(build_key).attribute.split(".")[0])

    def repaired(strategy: Any) -> bool:
        return state.active() is not None and strategy is not None and multi_worker(strategy)

    def local(value: Any) -> Any:
        if isinstance(value, tf.distribute.DistributedValues):
            return value.values[0]
        return value

    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        if not repaired(self._distribute_strategy) or iterator is None:
            return build(self, iterator=iterator, data_batch=data_batch)
        epochs = iterator.enumerate_epoch() if hasattr(iterator, "enumerate_epoch") else iterator
        for item in epochs:  # (epoch, step, iterator) or, in earlier Keras 3, (step, iterator)
            data_batch = tree.map_structure(local, next(item[-1]))
            break
        with self.distribute_strategy.scope():
            try:
                self._symbolic_build(data_batch=data_batch)
            except RuntimeError as exc:
                if "does not have a `call()` method" not in str(exc):
                    raise
                raise RuntimeError(
                    f"Keras 3 cannot train {type(self).__name__} under MultiWorkerMirroredStrategy: under a "
                    "tf.distribute strategy Keras builds the model by calling it on a batch before the first step, "
                    f"and {type(self).__name__} has no call() (its train_step calls its parts); give it a call() "
                    "that runs every part once, or build its parts' variables before fit") from exc

    def reduce(values: Any, strategy: Any, reduction: str) -> Any:
        if reduction not in ("auto", "mean") or not repaired(strategy) or isinstance(strategy, tf.distribute.TPUStrategy):
            return reduce_per_replica(values, strategy, reduction)

        def mean(value: Any) -> Any:
            if not isinstance(value, (tf.distribute.DistributedValues, tf.Tensor)):
                return value
            rank = local(value).shape.rank
            return strategy.reduce("MEAN", value, axis=0 if rank else None)

        return tree.map_structure(mean, values)

    _install(trainer_class, "_maybe_symbolic_build", build, _maybe_symbolic_build)
    _install(module, "reduce_per_replica", reduce_per_replica, reduce)


def _key_keras3_seeds_by_replica(module: ModuleType) -> None:
    draw_seed = _original(module, "keras3:draw_seed")
    if draw_seed is None:
        return
    import tensorflow as tf

    def keyed(seed: Any) -> Any:
        drawn = draw_seed(seed)
        context = tf.distribute.get_replica_context()
        if state.active() is None or context is None or context.num_replicas_in_sync == 1:
            return drawn
        replica = tf.cast(context.replica_id_in_sync_group, tf.int64)
        folded = tf.random.experimental.stateless_fold_in(tf.cast(drawn, tf.int64), replica, alg="philox")
        return tf.cast(folded, drawn.dtype)

    _install(module, "draw_seed", draw_seed, keyed)


def _average_keras3_moving_statistics(module: ModuleType) -> None:
    build = _original(module, "keras3:batch_norm")
    if build is None:
        return
    layer_class = module.BatchNormalization
    import tensorflow as tf

    if "aggregation" not in inspect.signature(module.BatchNormalization.add_weight).parameters:
        return  # a Keras 3 whose variables take no aggregation

    def averaged_build(self: Any, *args: Any, **kwargs: Any) -> Any:
        if state.active() is None or not tf.distribute.has_strategy() or (
                tf.distribute.get_strategy().num_replicas_in_sync == 1):
            return build(self, *args, **kwargs)
        add_weight = self.add_weight

        def add_averaged_weight(*weight_args: Any, **weight_kwargs: Any) -> Any:
            if not weight_kwargs.get("trainable", True) and weight_kwargs.get("aggregation", "none") == "none":
                # synchronized statistics are the same on every replica: the first replica's, not a float mean
                exact = state.active_summation() == "exact_tier"  # (the exact tier needs no float mean)
                weight_kwargs["aggregation"] = ("only_first_replica" if exact and getattr(self, "synchronized", False)
                                                else "mean")
            return add_weight(*weight_args, **weight_kwargs)

        object.__setattr__(self, "add_weight", add_averaged_weight)  # past Keras's attribute tracking
        try:
            return build(self, *args, **kwargs)
        finally:
            object.__delattr__(self, "add_weight")

    _install(layer_class, "build", build, averaged_build)
