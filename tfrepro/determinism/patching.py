"""``tfrepro.patch``: one call that makes TF/Keras training deterministic, and its undo.

Call it before the model is built, ideally before TensorFlow is imported. It never does nothing
silently: whatever it cannot apply, it names in a ``ReproducibilityWarning``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence

from tfrepro import _import_hooks, _targets, _tf
from tfrepro.determinism import distribution, fit_shuffling, initialisers, reporting, seeding, state, switches
from tfrepro.errors import warn
from tfrepro.ops.selection import check_on_uncovered, select_ops, summation_of

log = logging.getLogger("tfrepro")


# Modules of the floors above this one whose ``follow_the_seed()`` puts a hook in place as a patch
# applies (each acts only while a patch is active); ``tfrepro/__init__`` names them.
FOLLOWERS: list[str] = []


def patch(seed: int = 0, *, threads: int | None = None, onednn: bool | None = None,
          ops: bool | str | Sequence[str] = "auto", init: str = "order",
          on_uncovered: str = "raise") -> reporting.Report:
    """Makes TensorFlow and Keras training deterministic and seeds every RNG.

    Call it before the model is built, ideally as the script's first line, before TensorFlow is
    imported. It:

    - Turns on op determinism: `tf.config.experimental.enable_op_determinism()`, and
      `TF_DETERMINISTIC_OPS=1` and `TF_CUDNN_DETERMINISTIC=1` in the environment (subprocesses agree
      too).
    - Seeds Python, NumPy, TF (global seed and global `tf.random.Generator`) and Keras (see
      `seed_everything`), and sets `PYTHONHASHSEED` for subprocesses.
    - On Keras 3 < 3.7, keeps `compile(jit_compile="auto")` from choosing XLA, as Keras >= 3.7 does.
    - Replaces the TF ops that `ops` selects (by default exactly those that would raise under op
      determinism on a GPU), so that `patch()` never leaves an op that throws.
    - Makes `fit(shuffle=True)` on arrays, and `tf.data.Dataset.shuffle` (reshuffling, its
      default), shuffle each epoch by the seed and the epoch: every epoch another order, the same
      in every run, and epoch E's order drawn without the epochs before it (a resume replays
      nothing). `Dataset.shuffle` is keyed by the place of its call too (see
      `tfrepro.data.dataset_shuffling`).
    - Makes `tf.distribute.MultiWorkerMirroredStrategy` all-reduce with RING, not AUTO (which may
      pick NCCL), and lets Keras 3 `fit` under it.

    It never does nothing silently: it warns (`ReproducibilityWarning`) about whatever cannot apply:
    called after TF's runtime started or after Keras layers were built, `PYTHONHASHSEED` not equal to
    the seed at interpreter start (use `tfrepro run`), `TF_CUDNN_USE_AUTOTUNE=0`, or determinism
    variables set to off. It is idempotent, and all or nothing: when it raises (a warning turned into
    an error by a filter included), what the call changed is undone. `unpatch()` restores what can
    be restored; `patched()` is the same as a context manager.

    Guarantee: the same seed, the same hardware, the same software stack and the same thread counts
    give bit-identical training for models whose ops TF can run deterministically (others raise).
    Not covered: generators you create yourself (`numpy.random.default_rng()`).

    Args:
        seed: The seed of every RNG, an int in [0, 2**32 - 1]. Defaults to 0. The same seed means
            the same thing at every entry point (`tfrepro run --seed`, `tfrepro check`, sweeps);
            see `tfrepro.determinism.seeding`.
        threads: A positive int pins TF's intra- and inter-op thread pools to that many threads
            (CPU results depend on them). None (the default) leaves TF's pools as they are (one
            thread per core). Acts only before TF's runtime initialises; later it warns.
        onednn: True or False sets `TF_ENABLE_ONEDNN_OPTS` to `1` or `0` (oneDNN changes CPU
            numerics). None (the default) leaves it as it is. Acts in this process only before
            TensorFlow is imported; later it is set for subprocesses only, with a warning.
        ops: Which TF ops to replace with tfrepro's deterministic versions, on every device.
            `"auto"` (the default): exactly the ops the installed TF cannot run deterministically on
            a GPU (they raise `UnimplementedError` there: nearest resize and `crop_and_resize`
            backprop, `sparse_dense_matmul`, `bincount`, fused batch norm's backprop in fine-tuning,
            `adjust_contrast`; read from `tfrepro.ops.kernel_facts`), with versions built on TF's own
            sums, deterministic under op determinism. `True`, or a list of names from
            `tfrepro.ops.selection.REPLACEABLE_OPS`: those ops (all of them for `True`: segment sums,
            `bias_add`, softmax cross-entropy and gather too) in their bitwise order-invariant
            versions. `"exact"`: the exact tier (`tfrepro.ops.exact`), also exact matrix products,
            convolutions, pooling, dropout, reductions, cross-entropies and Adam/SGD updates, the rest
            refused by name, so that training gives the same bits across thread counts, oneDNN, XLA
            and replica counts. `False` (or None): none. Each rebinds TF's names and the internal call
            sites that Keras and TF's gradients use.
        init: How Keras's random initialisers draw each weight's initial value. `"order"` (the
            default) draws in creation order, as earlier releases did. `"keyed"` keys it by the seed
            and the weight's layer name and weight name, so that adding or removing other layers
            leaves it unchanged (see `tfrepro.determinism.initialisers`).
        on_uncovered: Under `ops="exact"`, what happens when a function that will run (`fit`'s
            step, a `tf.function`) is traced with ops the exact tier does not cover, whose bits can
            differ across threads, oneDNN, XLA or replicas. `"raise"` (the default) raises
            `tfrepro.UncoveredOpError` before the function first runs, naming each op, its layer
            and those axes; `"warn"` names them in a `ReproducibilityWarning` and goes on. See
            `tfrepro.ops.exact.coverage`. Other `ops` values ignore it.

    Returns:
        The `tfrepro.Report` of `tfrepro.status()` after patching.

    Raises:
        ValueError: `seed` is not an int in [0, 2**32 - 1], `threads` not a positive int or None,
            `onednn` not True, False or None, `ops` a list naming an op tfrepro does not replace,
            `init` neither `"order"` nor `"keyed"`, `on_uncovered` neither `"raise"` nor
            `"warn"`, or, with `ops="exact"`, `TFREPRO_EXACT_PRODUCTS` none of `auto`, `float64`,
            `float32` (`tfrepro.ops.exact.slices`).
        TypeError: `ops` is none of `"auto"`, `"exact"`, a bool, None or a list (tuple, set) of
            op names.
        ImportError: TensorFlow is not installed, or is older than 2.12, the oldest tfrepro
            supports (the message says what to install).
    """
    return apply_patch(seed, threads=threads, onednn=onednn, ops=ops, init=init, on_uncovered=on_uncovered)


def apply_patch(seed: int = 0, *, threads: int | None = None, onednn: bool | None = None,
                ops: bool | str | Sequence[str] = "auto", init: str = "order", on_uncovered: str = "raise",
                warn_late_seeding: bool = True, host_rngs: bool = True) -> reporting.Report:
    """``patch``, for tfrepro's own callers. ``warn_late_seeding=False``: the caller clears the Keras
    session and reseeds before building anything (``verify``), so what ran before cannot matter.
    ``host_rngs=False``: Python's and NumPy's RNGs are left as they are (the launcher seeded them
    before the script's first line, and applies the rest when the script imports TensorFlow)."""
    seed = seeding.validate_seed(seed)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None; got {threads!r}")
    if onednn is not None and not isinstance(onednn, bool):
        raise ValueError(f"onednn must be True, False or None; got {onednn!r}")
    op_names = select_ops(ops)
    summation = summation_of(ops)
    initialisers.check_scheme(init)
    check_on_uncovered(on_uncovered)
    if _tf.installed_tf_version() is None:
        _tf.import_tf()  # raises ImportError with the install command
    plan = switches.plan_for(_tf.installed_tf_version())
    if plan.mechanism == "unsupported":
        raise ImportError(plan.limits[0])

    outer_config = _active_config()
    # Under an active patch, what ran since was seeded by it, and the hash-seed warning was given then.
    first = outer_config is None
    late = _late_findings(onednn=onednn, ops=bool(op_names) and (ops != "auto" or _auto_runs_tfrepro_ops()),
                          seeding_too=warn_late_seeding and first)
    _warn_about_user_env()

    if outer_config is None:
        state.set_active(state.PatchState(seed, enabled_op_determinism=not _op_determinism_was_on()))
    env = dict(switches.plan_for(_tf.installed_tf_version()).env, PYTHONHASHSEED=str(seed))
    if onednn is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn else "0"
    try:  # all or nothing: on any error (a warning turned into one too), what this call changed is undone
        late += _apply(seed, env, (op_names, summation), threads, init, on_uncovered)
        if host_rngs:
            seeding.seed_everything(seed)
        else:
            seeding.seed_frameworks(seed)
        if first and state.STARTUP_HASHSEED != str(seed):
            was = f"{state.STARTUP_HASHSEED!r}" if state.STARTUP_HASHSEED is not None else (
                "ignored (python -E or -I)" if state.HASHSEED_IGNORED else "not set")
            warn(f"PYTHONHASHSEED was {was} when this interpreter started, not {seed}: the iteration order of "
                 "sets of strings may differ between runs. It cannot change inside a running interpreter; "
                 f"launch with `tfrepro run --seed {seed} -- python your_script.py`.")
        if late:
            warn("tfrepro.patch() was called late; these may not apply:\n  - " + "\n  - ".join(late))
    except BaseException:
        _restore(outer_config)
        raise
    return reporting.status()


def _apply(seed: int, env: dict[str, str], ops: tuple[tuple[str, ...], str], threads: int | None = None,
           init: str = "order", on_uncovered: str = "raise") -> list[str]:
    """Apply a patch configuration to the active state (which ``unpatch`` can undo at any point)."""
    applied = state.active()
    applied.seed, applied.init, applied.on_uncovered = seed, init, on_uncovered
    for name, value in env.items():
        applied.saved_env.setdefault(name, os.environ.get(name))
        os.environ[name] = applied.env[name] = value
    tf = _tf.import_tf()
    late = [] if threads is None else _set_threads(tf, threads)
    if switches.plan_for(_tf.installed_tf_version()).call_enable_op_determinism and not _tf.op_determinism_enabled():
        tf.config.experimental.enable_op_determinism()
    _replace_ops(applied, *ops)
    if applied.summation == "exact_tier":
        from tfrepro.ops.exact import coverage, slices  # TensorFlow is loaded: rebinding imported it

        coverage.set_policy(on_uncovered)
        slices.path()  # a bad TFREPRO_EXACT_PRODUCTS is named now, not inside the first traced step
    _import_hooks.run_deferred()
    _targets.watch()
    fit_shuffling.follow_the_seed()
    for follower in FOLLOWERS:
        importlib.import_module(follower).follow_the_seed()
    initialisers.follow_the_scheme()
    distribution.follow_the_patch()
    if applied.undo_keras_jit is None:
        applied.undo_keras_jit = _guard_keras_auto_jit()
    return late


_Config = tuple[int, dict[str, str], tuple[tuple[str, ...], str], str, str]  # (seed, env, (ops, summation), init,
# on_uncovered)


def _active_config() -> _Config | None:
    active = state.active()
    return None if active is None else (active.seed, dict(active.env), (active.ops, active.summation), active.init,
                                        active.on_uncovered)


def _restore(config: _Config | None) -> None:
    """Return to the patch configuration ``(seed, env, ops)`` of an earlier ``state.active()``, or to
    unpatched for None, without reseeding anything."""
    unpatch()
    if config is not None:
        seed, env, ops, init, on_uncovered = config
        state.set_active(state.PatchState(seed, enabled_op_determinism=not _op_determinism_was_on()))
        _apply(seed, env, ops, init=init, on_uncovered=on_uncovered)


def enable_determinism(seed: int = 0, *, threads: int | None = None, onednn: bool | None = None,
                       ops: bool | str | Sequence[str] = "auto", init: str = "order",
                       on_uncovered: str = "raise") -> reporting.Report:
    """Makes TensorFlow and Keras training deterministic: `patch`, under NVIDIA's name.

    The name that users of NVIDIA's framework-reproducibility package know: a script that calls
    `fwr13y.d9m.tensorflow.enable_determinism()` can call `tfrepro.enable_determinism()` in its
    place. It takes exactly what `patch` takes and does exactly what `patch` does: with no arguments
    it is `patch(0)`, which turns op determinism on and also seeds every RNG with 0.

    Args:
        seed: The seed of every RNG, an int in [0, 2**32 - 1]. Defaults to 0. See `patch`.
        threads: A positive int pins TF's intra- and inter-op thread pools; None (the default)
            leaves them. See `patch`.
        onednn: True or False sets `TF_ENABLE_ONEDNN_OPTS`; None (the default) leaves it. See
            `patch`.
        ops: Which TF ops to replace with deterministic versions: `"auto"` (the default), `True`,
            a list of names, `"exact"` or `False`. See `patch`.
        init: `"order"` (the default) or `"keyed"` initial weights. See `patch`.
        on_uncovered: Under `ops="exact"`, `"raise"` (the default) or `"warn"` for ops the exact
            tier does not cover. See `patch`.

    Returns:
        The `tfrepro.Report` of `tfrepro.status()` after patching.

    Raises:
        ValueError: An argument is out of range (see `patch`).
        TypeError: `ops` is of the wrong type (see `patch`).
        ImportError: TensorFlow is not installed, or is older than 2.12.
    """
    return patch(seed, threads=threads, onednn=onednn, ops=ops, init=init, on_uncovered=on_uncovered)


def unpatch() -> reporting.Report:
    """Undoes `patch` where possible.

    Restores the environment variables `patch` set, turns op determinism back off if `patch` turned
    it on, puts TF's ops back and removes the Keras XLA guard. Not undone: RNG states stay as
    seeded (`patched()` restores them), and thread pools cannot change once TF has started. Without
    an active patch it does nothing; calling it twice is harmless.

    Returns:
        The `tfrepro.Report` of `tfrepro.status()` after undoing.
    """
    applied = state.active()
    if applied is None:
        log.debug("tfrepro.unpatch(): not patched; nothing to undo")
        return reporting.status()
    for name, value in applied.saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if applied.enabled_op_determinism:
        from tensorflow.python.framework import config

        disable = getattr(config, "disable_op_determinism", None)
        if disable is None:
            warn("this TensorFlow cannot turn op determinism off again")
        else:
            disable()
    if applied.undo_keras_jit is not None:
        applied.undo_keras_jit()
    if applied.undo_ops is not None:
        applied.undo_ops()
    state.set_active(None)
    return reporting.status()


@contextlib.contextmanager
def patched(seed: int = 0, *, threads: int | None = None, onednn: bool | None = None,
            ops: bool | str | Sequence[str] = "auto", init: str = "order",
            on_uncovered: str = "raise") -> Iterator[reporting.Report]:
    """Applies `patch` for the duration of a `with` block, then returns to what was there before.

    On exit, also when the block raises, the process goes back to being unpatched, or to the earlier
    patch with its seed, environment and replaced ops; and every generator that `rng_state()`
    captures goes back to where it was on entry. Meant for tests and sweeps. Not restored:
    TensorFlow's global op seed (`tf.random.set_seed`) stays the block's, because TensorFlow does
    not expose it to restore.

    ```python
    with tfrepro.patched(3, init="keyed") as report:
        model = build_model()
    ```

    Args:
        seed: The seed of every RNG, an int in [0, 2**32 - 1]. Defaults to 0. See `patch`.
        threads: A positive int pins TF's intra- and inter-op thread pools; None (the default)
            leaves them. See `patch`.
        onednn: True or False sets `TF_ENABLE_ONEDNN_OPTS`; None (the default) leaves it. See
            `patch`.
        ops: Which TF ops to replace with deterministic versions: `"auto"` (the default), `True`,
            a list of names, `"exact"` or `False`. See `patch`.
        init: `"order"` (the default) or `"keyed"` initial weights. See `patch`.
        on_uncovered: Under `ops="exact"`, `"raise"` (the default) or `"warn"` for ops the exact
            tier does not cover. See `patch`.

    Yields:
        The `tfrepro.Report` of `tfrepro.status()` after patching.

    Raises:
        ValueError: An argument is out of range (see `patch`).
        TypeError: `ops` is of the wrong type (see `patch`).
        ImportError: TensorFlow is not installed, or is older than 2.12.
    """
    outer_config = _active_config()
    rngs = seeding.rng_state()
    try:
        yield patch(seed, threads=threads, onednn=onednn, ops=ops, init=init, on_uncovered=on_uncovered)
    finally:
        _restore(outer_config)
        seeding.set_rng_state(rngs)


def _replace_ops(applied: state.PatchState, op_names: tuple[str, ...], summation: str) -> None:
    """Make ``op_names`` (summing the ``summation`` way) the replaced ops: undo a different earlier
    selection, then rebind."""
    if (applied.ops, applied.summation) == (op_names, summation):
        return
    if applied.undo_ops is not None:
        applied.undo_ops()
    applied.undo_ops, applied.ops = None, ()
    if op_names:
        from tfrepro.ops import rebinding  # imports TensorFlow: only now, after the environment is set

        applied.undo_ops, applied.ops = rebinding.rebind(op_names, summation), op_names
    applied.summation = summation


def _op_determinism_was_on() -> bool:
    """Op determinism before patch(): TF's state if loaded, else what TF would read at import."""
    enabled = _tf.op_determinism_enabled()
    if enabled is None:
        return _tf.env_flag("TF_DETERMINISTIC_OPS") == "on"
    return enabled


def _warn_about_user_env() -> None:
    contradicting = switches.contradicting_env()
    if contradicting:
        named = ", ".join(f"{k}={v}" for k, v in contradicting.items())
        warn(f"{named} turned determinism off; tfrepro.patch() overrides it with 1. Remove it from your environment.")
    if _tf.env_flag("TF_CUDNN_USE_AUTOTUNE") == "off":
        warn("TF_CUDNN_USE_AUTOTUNE=0 is set. Leave it unset: deterministic mode picks among deterministic "
             "cuDNN algorithms through the autotuner, and disabling it can select a nondeterministic or slow "
             "one. tfrepro does not change it.")


def _auto_runs_tfrepro_ops() -> bool:
    """Whether ``ops="auto"`` runs tfrepro's versions here (a GPU is visible): only then does a late
    patch leave already-traced functions with TF's ops that raise."""
    if not _tf.runtime_initialized():
        return False
    from tfrepro.ops import _exact_sum  # imports TensorFlow, which is loaded already

    return _exact_sum.gpus_visible()


def _late_findings(*, onednn: bool | None, ops: bool, seeding_too: bool) -> list[str]:
    """What has already happened in this process that patch() can no longer fully control."""
    if not _tf.tf_imported():
        return []
    findings = []
    if onednn is not None:
        findings.append(
            "TensorFlow was imported first, so onednn= cannot change oneDNN in this process (set only "
            "for subprocesses); use `tfrepro run --onednn off|on`"
        )
    if _tf.runtime_initialized() and ops:
        findings.append("ops=...: functions TensorFlow already traced (tf.function, Keras train steps) keep "
                        "TF's own ops; build and compile the model after patch()")
    if not seeding_too:
        return findings
    if _tf.runtime_initialized():
        findings.append(
            "TensorFlow's runtime is already initialised: random ops that ran before patch() were not "
            "seeded"
        )
    built = _keras_objects_built()
    if built:
        findings.append(
            f"{built} Keras object(s) (layers, models) were built before patch(): their initial "
            "weights and seeds were drawn unseeded; build the model after patch()"
        )
    return findings


def _set_threads(tf, threads: int) -> list[str]:
    threading = tf.config.threading
    try:
        threading.set_intra_op_parallelism_threads(threads)
        threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        current = (threading.get_intra_op_parallelism_threads(), threading.get_inter_op_parallelism_threads())
        if current != (threads, threads):
            return [
                f"threads={threads}: TensorFlow's thread pools were already created with intra={current[0]}, "
                f"inter={current[1]} (0 = one per core); call patch() before any op, or use "
                f"`tfrepro run --threads {threads}`"
            ]
    return []


def _keras_objects_built() -> int:
    """How many Keras layers/models (named objects) exist already, in any loaded Keras."""
    count = 0
    for keras in _tf.loaded_kerases():
        if _tf.keras_major(keras) >= 3:
            global_state = seeding._keras3_global_state(keras)
            uids = global_state.get_global_attribute("object_name_uids") if global_state else None
            count += sum(uids.values()) if uids else 0
            continue
        for name in (f"{keras.__name__}.src.backend", f"{keras.__name__}.backend"):
            try:
                per_graph = getattr(importlib.import_module(name), "PER_GRAPH_OBJECT_NAME_UIDS", None)
            except ImportError:
                continue
            if per_graph is not None:
                count += sum(sum(uids.values()) for uids in per_graph.values())
                break
    return count


def _guard_keras_auto_jit() -> Callable[[], None] | None:
    """On Keras 3 < 3.7 with TF, make ``jit_compile="auto"`` choose no XLA under op determinism
    (XLA has ops without deterministic GPU kernels, e.g. MaxPool's gradient, TF #69417).
    Returns the undo, or None when nothing needed patching."""
    info = _tf.keras_info()
    version = _tf.parse_version(_tf.distribution_version("keras"))
    if version is None or not ((3, 0) <= version < (3, 7)) or (info.module == "tf_keras"):
        return None
    entry = _targets.target("keras3:model_supports_jit")
    try:
        trainer = importlib.import_module(entry.module)
    except ImportError:
        trainer = None
    original = None if trainer is None else _targets.find(trainer, entry.key)
    if original is None:
        warn("could not keep Keras from choosing XLA under determinism on this Keras version; "
             "pass compile(jit_compile=False)")
        return None

    def model_supports_jit(model):
        if _tf.op_determinism_enabled():
            return False
        return original(model)

    trainer.model_supports_jit = model_supports_jit

    def undo() -> None:
        trainer.model_supports_jit = original

    return undo
