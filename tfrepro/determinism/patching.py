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

from tfrepro import _tf
from tfrepro.determinism import distribution, fit_shuffling, initialisers, reporting, seeding, state, switches
from tfrepro.errors import warn
from tfrepro.ops.selection import select_ops, summation_of

log = logging.getLogger("tfrepro")


def patch(seed: int = 0, *, threads: int | None = None, onednn: bool | None = None,
          ops: bool | str | Sequence[str] = "auto", init: str = "order") -> reporting.Report:
    """Make TensorFlow and Keras training deterministic and seed every RNG. Call before building the model.

    - Turns on op determinism the way the installed TF version reads it: ``TF_DETERMINISTIC_OPS=1``
      and ``TF_CUDNN_DETERMINISTIC=1`` always (subprocesses agree too), plus
      ``tf.config.experimental.enable_op_determinism()`` on TF >= 2.8 and
      ``TF_CUDNN_USE_FRONTEND=1`` on TF 2.5-2.7.
    - Seeds Python, NumPy, TF (global seed and global ``tf.random.Generator``) and Keras
      (see ``seed_everything``), and sets ``PYTHONHASHSEED`` for subprocesses.
    - On Keras 3 < 3.7, keeps ``compile(jit_compile="auto")`` from choosing XLA, as Keras >= 3.7 does.
    - ``threads=N`` pins TF's intra- and inter-op thread pools (CPU results depend on them);
      ``onednn=False``/``True`` sets ``TF_ENABLE_ONEDNN_OPTS``. Both act only before TF initialises.
    - ``ops="auto"`` (the default) replaces exactly the ops the installed TF cannot run
      deterministically on a GPU (they raise ``UnimplementedError`` there: nearest resize and
      ``crop_and_resize`` backprop, ``sparse_dense_matmul``, ``bincount``, fused batch norm's
      backprop in fine-tuning, ``adjust_contrast``; read from ``tfrepro.ops.kernel_facts``), on
      every device, with versions built on TF's own sums (deterministic under op determinism), so
      ``patch()`` never leaves an op that throws. ``ops=True`` (or a list of names, see
      ``tfrepro.ops.selection.REPLACEABLE_OPS``) rebinds every op tfrepro has to its bitwise
      order-invariant version (segment sums, bias_add, softmax xent, gather too); ``ops=False`` none.
      ``ops="exact"`` is the exact tier (``tfrepro.ops.exact``): also exact matrix products,
      convolutions, pooling, dropout, reductions, cross-entropies and Adam/SGD updates, the rest
      refused by name, so that training gives the same bits across thread counts, oneDNN, XLA and
      replica counts. Each rebinds TF's names and the internal call sites Keras and TF's gradients use.
    - ``fit(shuffle=True)`` on arrays shuffles each epoch by the seed and the epoch
      (``fit_shuffling``): every epoch another order, the same in every run.
    - ``tf.distribute.MultiWorkerMirroredStrategy`` all-reduces with RING, not AUTO (which may pick
      NCCL), and Keras 3 can ``fit`` under it (``distribution``).
    - ``init="keyed"`` keys each weight's initial value by the seed and the weight's layer name and
      weight name, so adding or removing other layers leaves it unchanged (``initialisers``);
      ``init="order"`` (the default) draws in creation order, as earlier releases did.

    Warns (``ReproducibilityWarning``) about whatever cannot apply: called after TF's runtime
    started or after Keras layers were built, ``PYTHONHASHSEED`` not equal to the seed at interpreter
    start (use ``tfrepro run``), ``TF_CUDNN_USE_AUTOTUNE=0``, or determinism variables set to off.
    Idempotent; ``unpatch()`` restores what can be restored. Returns ``status()``.

    Guarantee: same seed, same hardware, same software stack and same thread counts give
    bit-identical training for models whose ops TF can run deterministically (others raise).
    """
    return apply_patch(seed, threads=threads, onednn=onednn, ops=ops, init=init)


def apply_patch(seed: int = 0, *, threads: int | None = None, onednn: bool | None = None,
                ops: bool | str | Sequence[str] = "auto", init: str = "order", warn_late_seeding: bool = True,
                host_rngs: bool = True) -> reporting.Report:
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
    if _tf.installed_tf_version() is None:
        _tf.import_tf()  # raises ImportError with the install command

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
        late += _apply(seed, env, (op_names, summation), threads, init)
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
           init: str = "order") -> list[str]:
    """Apply a patch configuration to the active state (which ``unpatch`` can undo at any point)."""
    applied = state.active()
    applied.seed, applied.init = seed, init
    for name, value in env.items():
        applied.saved_env.setdefault(name, os.environ.get(name))
        os.environ[name] = applied.env[name] = value
    tf = _tf.import_tf()
    late = [] if threads is None else _set_threads(tf, threads)
    if switches.plan_for(_tf.installed_tf_version()).call_enable_op_determinism and not _tf.op_determinism_enabled():
        tf.config.experimental.enable_op_determinism()
    _replace_ops(applied, *ops)
    fit_shuffling.follow_the_seed()
    initialisers.follow_the_scheme()
    distribution.follow_the_patch()
    if applied.undo_keras_jit is None:
        applied.undo_keras_jit = _guard_keras_auto_jit()
    return late


_Config = tuple[int, dict[str, str], tuple[tuple[str, ...], str], str]  # (seed, env, (ops, summation), init)


def _active_config() -> _Config | None:
    active = state.active()
    return None if active is None else (active.seed, dict(active.env), (active.ops, active.summation), active.init)


def _restore(config: _Config | None) -> None:
    """Return to the patch configuration ``(seed, env, ops)`` of an earlier ``state.active()``, or to
    unpatched for None, without reseeding anything."""
    unpatch()
    if config is not None:
        seed, env, ops, init = config
        state.set_active(state.PatchState(seed, enabled_op_determinism=not _op_determinism_was_on()))
        _apply(seed, env, ops, init=init)


def enable_determinism(seed: int = 0, *, threads: int | None = None, onednn: bool | None = None,
                       ops: bool | str | Sequence[str] = "auto") -> reporting.Report:
    """Alias of ``patch``, for users of ``fwr13y.d9m.tensorflow.enable_determinism()``."""
    return patch(seed, threads=threads, onednn=onednn, ops=ops)


def unpatch() -> reporting.Report:
    """Undo ``patch`` where possible: restore environment variables, turn op determinism back off
    if ``patch`` turned it on, remove the Keras XLA guard. RNG states stay as seeded, and thread
    pools cannot change once TF has started. Returns ``status()``."""
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
            ops: bool | str | Sequence[str] = "auto", init: str = "order") -> Iterator[reporting.Report]:
    """``patch`` for the duration of a ``with`` block (for tests), then back to what was there before:
    unpatched, or the earlier patch with its seed, environment and replaced ops; and every generator
    that ``rng_state()`` captures where it was on entry. TensorFlow's global op seed
    (``tf.random.set_seed``) stays the block's: TensorFlow does not expose it to restore."""
    outer_config = _active_config()
    rngs = seeding.rng_state()
    try:
        yield patch(seed, threads=threads, onednn=onednn, ops=ops, init=init)
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
    tf_version = _tf.parse_version(_tf.installed_tf_version())
    if tf_version is not None and tf_version < (2, 8) and not _tf.op_determinism_enabled():
        findings.append(
            "TensorFlow was imported first; before TF 2.8 TF_DETERMINISTIC_OPS is read once, so ops "
            "that already ran keep their nondeterministic kernels"
        )
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
    try:
        trainer = importlib.import_module("keras.src.trainers.trainer")
        original = trainer.model_supports_jit
    except (ImportError, AttributeError):
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
