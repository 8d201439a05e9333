"""``tfrepro.diagnose``: the static scan and the dynamic bisection of one model on one batch."""

from __future__ import annotations

import time
from typing import Any

from tfrepro import _tf
from tfrepro.diagnosis import batches, bisection, scanning
from tfrepro.diagnosis.findings import Diagnosis, Finding, ordered
from tfrepro.diagnosis.layer_calls import LayerCalls


def diagnose(model: Any, x: Any, y: Any = None, repeats: int = 3, *, sample_weight: Any = None,
             batch_size: int | None = None, tf_version: str | None = None) -> Diagnosis:
    """Find what makes this model's training differ between runs, and name the layer.

    Two parts, on the first batch of ``x`` (and ``y``) as ``fit`` would see it (arrays are cut to
    ``batch_size`` rows, default 32; a ``tf.data.Dataset`` gives its first element, and its own
    graph is checked too):

    - **static scan** (no GPU needed, nothing run): the model's train step is traced and its ops,
      nested functions included, are matched against the table of ops without deterministic GPU
      kernels for ``tf_version`` (default: the installed TensorFlow), each named by its layer with
      the fix; plus batch-norm fine-tuning, the configuration and the input pipeline.
    - **dynamic bisection** (``repeats`` >= 2; 0 skips it): the step is run ``repeats`` times from
      the same weights, optimizer state and RNG states, and every layer's output, the gradients
      through it and every update are compared bit for bit; the first layer in execution order that
      varied by itself is reported with how many repeats differed and by how much, the layers it
      affected as ``downstream``.

    Afterwards the model's variables, the optimizer's and every RNG are as they were (an unbuilt
    model, optimizer or metric is built, as ``fit`` would build it). Works with Sequential,
    functional and subclassed models, nested layers included, on Keras 3 and Keras 2. Limits: the
    dynamic part runs on this machine's devices, so a GPU-only nondeterminism shows only on a GPU
    (the static scan names it anywhere); a custom ``train_step`` is scanned as written, while the
    repeats run the standard step (forward, ``compute_loss``, gradients, ``apply_gradients``);
    under a ``tf.distribute`` strategy (Keras 3 only) they run it once in the strategy's
    cross-replica context (mirrored variables included), not once per replica.

    >>> import numpy as np, tensorflow as tf, tfrepro
    >>> model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    >>> model.compile("sgd", "mse")
    >>> tfrepro.diagnose(model, np.ones((8, 4), "float32"), np.ones((8, 2), "float32")).clean  # doctest: +SKIP
    True
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats == 1 or repeats < 0:
        raise ValueError(f"repeats must be 0 (static scan only) or an int >= 2; got {repeats!r}")
    tf = _tf.import_tf()
    keras = _tf.keras_module()
    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a {keras.__name__}.Model (the Keras that tf.keras is here); "
                        f"got {type(model).__name__}")
    if _tf.keras_major(keras) < 3 and scanning.distributed(model):
        raise ValueError("diagnose under a tf.distribute strategy needs Keras 3 (Keras 2's metrics cannot update "
                         "outside the replicas); build and compile the model without the strategy to diagnose it: "
                         "its layers and ops are the same")
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    batch = batches.first_batch(x, y, sample_weight, batch_size)
    batches.prepare(model, batch)
    spy = LayerCalls(model)
    found = scanning.scan(model, batch, spy, tf_version)
    seconds["scan"] = time.perf_counter() - start
    if repeats:
        start = time.perf_counter()
        dynamic = bisection.bisect(model, batch, spy, repeats)
        seconds["bisection"] = time.perf_counter() - start
        found = _with_fixes(dynamic, found) + found
    return Diagnosis(_unique(ordered(found)), model=f"{type(model).__name__} {model.name!r}",
                     tf_version=tf_version or tf.__version__, keras_version=getattr(keras, "__version__", ""),
                     repeats=repeats, seconds=seconds)


def _with_fixes(dynamic: list[Finding], static: list[Finding]) -> list[Finding]:
    """A layer that varied by itself gets the static fix found for it, or the general advice."""
    fixes = {f.where: f.fix for f in static if f.fix and f.check == "ops"}
    general = ("find what varies in this layer: an order-dependent sum (atomics, unsorted_segment_sum, scatter-add: "
               "tfrepro.ops has order-invariant ones, tfrepro.patch(ops=True)) or randomness no seed reaches "
               "(numpy_function, OS entropy, an unseeded generator); then `tfrepro.diagnose` again")
    result = []
    for finding in dynamic:
        if finding.severity == "nondeterministic" and not finding.fix:
            fix = fixes.get(finding.where, general if finding.where not in ("optimizer", "loss") else
                            "the optimizer's or loss's ops sum in thread order; use tfrepro.patch(ops=True), or "
                            "report it with this diagnosis")
            finding = Finding(finding.severity, finding.where, finding.finding, fix, finding.check, finding.details)
        result.append(finding)
    return result


def _unique(findings: list[Finding]) -> list[Finding]:
    """One finding per (severity, where, finding text): a layer called twice is reported once."""
    seen: set[tuple[str, str, str]] = set()
    kept = []
    for f in findings:
        key = (f.severity, f.where, f.finding.split(" (")[0])
        if key not in seen:
            seen.add(key)
            kept.append(f)
    return kept
