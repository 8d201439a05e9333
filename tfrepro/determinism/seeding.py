"""Seeds and RNG state for Python, NumPy, TensorFlow and Keras.

``seed_everything`` seeds every generator a TF/Keras training run draws from, without touching the
determinism switches (``tfrepro.patch`` does both). ``rng_state``/``set_rng_state`` capture and
restore those generators exactly, as JSON-serialisable data. ``derive_seed`` makes stable
per-worker / per-epoch seeds.

What seed S means. Every entry point applies this one definition: ``tfrepro.patch(S)`` as the
script's first line, ``tfrepro run --seed S``, each run of ``tfrepro check --seed S``, seed S of
``tfrepro sweep``, ``tfrepro doctor --seed S`` and ``tfrepro run --checkpoint``. So a script and a
seed make one computation, whichever of them runs it:

- Python's ``random`` and NumPy's global RNG start from S, as if seeded on the script's first line.
  Importing TensorFlow never moves them (TF's import draws from Python's ``random``: the launcher
  puts it back, and ``patch`` seeds after importing TF).
- TensorFlow: global seed S (``tf.random.set_seed``), a global ``tf.random.Generator`` from S (made
  on first use when TF's runtime has not started, so that devices and collectives can still be set up).
- Keras, whenever it is imported: Keras 3's global ``SeedGenerator`` starts afresh; Keras 2's
  internal seed generator is cleared, so layer seeds come from Python's ``random`` as in Keras 3,
  and Keras 2's random layers draw from ``tf.random.Generator``s (``enable_tf_random_generator``),
  whose state a checkpoint can hold.
- ``PYTHONHASHSEED=S`` (set before the interpreter starts by the launcher; ``patch`` sets it for
  subprocesses).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import numbers
import random
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from tfrepro import _targets, _tf
from tfrepro._import_hooks import call_after_import

MAX_SEED = 2**32 - 1
RngState = dict[str, Any]


def validate_seed(seed: object, name: str = "seed") -> int:
    """Return ``seed`` as an int, or raise ValueError unless it is an integer in [0, 2**32 - 1]."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"{name} must be an int in [0, 2**32 - 1]; got {seed!r} ({type(seed).__name__})")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{name} must be an int in [0, 2**32 - 1] = [0, {MAX_SEED}]; got {seed}")
    return int(seed)


def derive_seed(seed: int, *keys: int | str) -> int:
    """Derives a seed from `seed` and `keys`, e.g. one per worker or per epoch.

    The same inputs give the same seed in every process, Python version and platform: it is a
    BLAKE2b hash of a canonical JSON encoding, never Python's salted `hash()`. Different inputs give
    unrelated seeds (barring a 32-bit hash collision); `1` and `"1"` are different keys.

    Args:
        seed: The base seed, an int in [0, 2**32 - 1].
        *keys: What the derived seed is for, ints or strings, in order (`"worker", 3`). With no
            keys, a seed derived from `seed` alone.

    Returns:
        An int in [0, 2**32 - 1], a valid seed for `tfrepro.patch`.

    Raises:
        ValueError: `seed` is not an int in [0, 2**32 - 1].
        TypeError: A key is neither an int nor a string (a bool included).

    Examples:
        >>> derive_seed(42, "worker", 0)
        621714141
        >>> derive_seed(42, "worker", 1)
        336846034
    """
    seed = validate_seed(seed)
    for key in keys:
        if isinstance(key, bool) or not isinstance(key, (numbers.Integral, str)):
            raise TypeError(f"derive_seed keys must be ints or strings; got {key!r} ({type(key).__name__})")
    payload = json.dumps([seed, *[int(k) if isinstance(k, numbers.Integral) else k for k in keys]])
    digest = hashlib.blake2b(payload.encode("utf-8"), digest_size=4, person=b"tfrepro.seed").digest()
    return int.from_bytes(digest, "big")


def seed_python(seed: int) -> None:
    """Seed Python's global ``random``."""
    random.seed(validate_seed(seed))


def seed_numpy(seed: int) -> None:
    """Seed NumPy's legacy global RNG (``np.random.*``)."""
    import numpy as np

    np.random.seed(validate_seed(seed))


def seed_everything(seed: int) -> int:
    """Seeds Python's `random`, NumPy's global RNG, TensorFlow and every Keras, loaded now or later.

    TensorFlow (if installed) gets its global seed (`tf.random.set_seed`) and a fresh global
    `tf.random.Generator` from `seed`; Keras, loaded now or later, what the module doc says seed S
    means. Importing TensorFlow here does not move Python's or NumPy's RNGs.

    Does not touch the determinism switches or `PYTHONHASHSEED` (`tfrepro.patch` does both). Not
    covered: generators you create yourself, such as `numpy.random.default_rng()`.

    Args:
        seed: The seed, an int in [0, 2**32 - 1].

    Returns:
        The seed, as an int.

    Raises:
        ValueError: `seed` is not an int in [0, 2**32 - 1].
    """
    seed = validate_seed(seed)
    seed_python(seed)
    seed_numpy(seed)
    seed_frameworks(seed)
    return seed


def seed_frameworks(seed: int) -> None:
    """The TensorFlow and Keras part of ``seed_everything`` (imports TensorFlow if installed, with
    Python's and NumPy's RNGs kept where they were). A Keras imported later is seeded when it loads
    (see the module doc), so the moment of its import does not matter."""
    if _tf.installed_tf_version() is not None:
        with preserving_host_rngs():
            tf = _tf.import_tf()
        tf.random.set_seed(seed)
        _seed_tf_global_generator(tf, seed)
    _seed_keras_whenever_it_loads()


_generator_seed: int | None = None  # the seed of TF's global Generator until it is made
_generator_hooked = False
_generator_lock = threading.Lock()  # replicas trace in threads


def _seed_tf_global_generator(tf: ModuleType, seed: int) -> None:
    """Make TF's global ``tf.random.Generator`` start from ``seed``. Before TF's runtime has started,
    it is made on first use (``tf.random.get_global_generator()``): a Generator's state is a
    variable, and making one starts the runtime, after which TF can no longer set up devices, thread
    pools or collective ops (``MultiWorkerMirroredStrategy`` raises "Collective ops must be configured
    at program startup")."""
    global _generator_seed, _generator_hooked
    from tensorflow.python.ops import stateful_random_ops

    if _tf.runtime_initialized():
        _generator_seed = None
        tf.random.set_global_generator(tf.random.Generator.from_seed(seed))
        return
    stateful_random_ops.global_generator = None
    _generator_seed = seed
    if _generator_hooked:
        return
    _generator_hooked = True
    original = stateful_random_ops.get_global_generator

    @functools.wraps(original)
    def get_global_generator() -> Any:
        _made_global_generator()
        return original()

    compat = getattr(tf, "compat", None)
    for namespace in (stateful_random_ops, tf.random, getattr(tf.random, "experimental", None),
                      *(getattr(getattr(getattr(compat, version, None), "random", None), "experimental", None)
                        for version in ("v1", "v2")),
                      getattr(getattr(compat, "v2", None), "random", None)):
        if namespace is not None and getattr(namespace, "get_global_generator", None) is original:
            namespace.get_global_generator = get_global_generator


def make_due_global_generator() -> None:
    """Make the global Generator that ``_seed_tf_global_generator`` left to its first use, if due
    (``tfrepro.determinism.distribution`` calls it once a strategy exists, outside its scope)."""
    _made_global_generator()


def _made_global_generator() -> None:
    global _generator_seed
    if _generator_seed is None:
        return
    from tensorflow.python.ops import stateful_random_ops

    with _generator_lock:
        if _generator_seed is None or stateful_random_ops.global_generator is not None:
            return
        import tensorflow as tf

        with tf.init_scope():
            tf.random.set_global_generator(tf.random.Generator.from_seed(_generator_seed))
        _generator_seed = None


def _seed_keras_whenever_it_loads() -> None:
    """Keras's part of seed S (it does not depend on S) on every Keras loaded now, and on one loaded
    later, through the module where each Keras keeps its seed state (``_targets``, role
    "seed_state": Keras 3's global state, Keras 2's backend). The hooks for what is not loaded yet
    are put in place once per process."""
    global _keras_hooked
    targets = _targets.for_role("seed_state")
    call_after_import({entry.module: functools.partial(_seed_keras, key=entry.key) for entry in targets
                       if entry.module in sys.modules})
    if not _keras_hooked:
        _keras_hooked = True
        call_after_import({entry.module: functools.partial(_seed_keras, key=entry.key) for entry in targets
                           if entry.module not in sys.modules
                           and importlib.util.find_spec(entry.module.split(".")[0]) is not None})


_keras_hooked = False


def _seed_keras(module: ModuleType, key: str) -> None:
    """Keras's part of seed S (see the module doc), given the module of its seed state: Keras 3's
    global SeedGenerator is dropped (the next one is made from Python's ``random``); Keras 2 draws
    from TF's generator, and its own holder is cleared."""
    found = _targets.find(module, key)
    if found is None:
        return
    if key.startswith("keras3"):
        found("global_seed_generator", None)  # global_state.set_global_attribute
        return
    found()  # backend.enable_tf_random_generator
    holder = getattr(module, "_SEED_GENERATOR", None)
    if holder is not None:  # keras.utils.set_random_seed sets it; cleared, seeds come from Python's random
        holder.generator = None


@contextlib.contextmanager
def preserving_host_rngs() -> Iterator[None]:
    """Python's ``random`` (and NumPy's global RNG, if NumPy is loaded) come back to where they were
    on entry: TensorFlow's import draws from Python's ``random``."""
    python = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        random.setstate(python)
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)


def _keras3_global_state(keras: ModuleType) -> ModuleType | None:
    return _keras3_global_state_of(keras.__name__)


def _keras3_global_state_of(keras_name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"{keras_name}.src.backend.common.global_state")
    except ImportError:
        return None


def _keras2_seed_holder(keras: ModuleType) -> Any:
    """Keras 2's thread-local holder of its internal ``random.Random`` (``backend._SEED_GENERATOR``)."""
    for name in (f"{keras.__name__}.src.backend", f"{keras.__name__}.backend"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        holder = getattr(module, "_SEED_GENERATOR", None)
        if holder is not None:
            return holder
    return None


def _python_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _set_python_state(rng: random.Random, state: list[Any]) -> None:
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


def _tf_global_generator() -> Any:
    """TF's global Generator if one exists (or a seeded one is due: it is made now); never creates an
    unseeded one (that would raise under determinism)."""
    if not _tf.tf_imported():
        return None
    from tensorflow.python.ops import stateful_random_ops

    _made_global_generator()
    return getattr(stateful_random_ops, "global_generator", None)


def _keras3_global_seed_generator(keras: ModuleType) -> Any:
    global_state = _keras3_global_state(keras)
    return None if global_state is None else global_state.get_global_attribute("global_seed_generator")


def rng_state() -> RngState:
    """Captures the state of every RNG that `seed_everything` seeds, as JSON-serialisable data.

    Captured: Python's `random`; NumPy's legacy global RNG; TensorFlow's global
    `tf.random.Generator` (if one exists); Keras 3's global `SeedGenerator` (if one exists);
    Keras 2's internal generator (if set). Not captured: TF's stateful op-level RNG kernels
    (`tf.random.uniform` without a generator), whose state TF does not expose. Never imports
    TensorFlow or Keras.

    Returns:
        A dict of plain lists and numbers (it survives a JSON round trip) to pass to
        `set_rng_state`.
    """
    import numpy as np

    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: RngState = {
        "python": _python_state(random._inst),  # type: ignore[attr-defined]
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    generator = _tf_global_generator()
    if generator is not None:
        state["tensorflow_generator"] = {
            "algorithm": int(generator.algorithm),
            "state": generator.state.numpy().tolist(),
        }
    for keras in _tf.loaded_kerases():
        if _tf.keras_major(keras) >= 3:
            seed_generator = _keras3_global_seed_generator(keras)
            if seed_generator is not None:
                value = keras.ops.convert_to_numpy(seed_generator.state.value)
                state["keras_seed_generator"] = {"state": value.tolist(), "dtype": str(value.dtype)}
        else:
            holder = _keras2_seed_holder(keras)
            internal = getattr(holder, "generator", None)
            if internal is not None:
                state["keras2_generator"] = _python_state(internal)
    return state


def set_rng_state(state: RngState) -> None:
    """Restores every RNG to a state captured by `rng_state`.

    The generators then draw exactly what they drew after the capture. A TensorFlow part imports
    TensorFlow and replaces (or resets) its global `tf.random.Generator`.

    Args:
        state: What `rng_state()` returned, or a JSON round trip of it.

    Raises:
        ValueError: `state` is not such a dict, or it holds a Keras part that this process cannot
            take (a Keras 3 part while no Keras 3 is loaded, a Keras 2 part while no Keras 2 is).
    """
    import numpy as np

    if not isinstance(state, dict) or "python" not in state or "numpy" not in state:
        raise ValueError("set_rng_state expects the dict returned by tfrepro.rng_state()")
    _set_python_state(random._inst, state["python"])  # type: ignore[attr-defined]
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))

    if "tensorflow_generator" in state:
        tf = _tf.import_tf()
        part = state["tensorflow_generator"]
        values = np.asarray(part["state"], dtype=np.int64)
        generator = _tf_global_generator()
        if generator is not None and int(generator.algorithm) == part["algorithm"]:
            generator.reset(values)
        else:
            tf.random.set_global_generator(tf.random.Generator(state=values, alg=part["algorithm"]))

    kerases = _tf.loaded_kerases()
    if "keras_seed_generator" in state:
        keras3 = [k for k in kerases if _tf.keras_major(k) >= 3]
        if not keras3:
            raise ValueError("the state holds a Keras 3 SeedGenerator part, but Keras 3 is not loaded")
        part = state["keras_seed_generator"]
        generator = _keras3_global_seed_generator(keras3[0])
        if generator is None:  # created on first use; create it now to receive the state
            module = importlib.import_module(f"{keras3[0].__name__}.src.random.seed_generator")
            generator = module.global_seed_generator()
        generator.state.assign(np.asarray(part["state"], dtype=part["dtype"]))
    if "keras2_generator" in state:
        keras2 = [k for k in kerases if _tf.keras_major(k) < 3]
        holder = _keras2_seed_holder(keras2[0]) if keras2 else None
        if holder is None:
            raise ValueError("the state holds a Keras 2 generator part, but Keras 2 is not loaded")
        holder.generator = random.Random()
        _set_python_state(holder.generator, state["keras2_generator"])
