"""``tfrepro.diagnose``: the static scan and the dynamic bisection of one model on one batch."""

from __future__ import annotations

import time
from typing import Any

from tfrepro import _tf
from tfrepro.diagnosis import batches, bisection, restoring, scanning
from tfrepro.diagnosis.findings import Diagnosis, Finding, ordered
from tfrepro.diagnosis.layer_calls import LayerCalls


def diagnose(model: Any, x: Any, y: Any = None, repeats: int = 3, *, sample_weight: Any = None,
             batch_size: int | None = None, tf_version: str | None = None) -> Diagnosis:
    """Finds what makes this model's training differ between runs, and names the layer.

    Two parts, on the first batch of `x` (and `y`) as `fit` hands it to `train_step` (arrays
    are cut to `batch_size` rows, default 32; a `tf.data.Dataset` gives the first element of a
    fresh iteration, read from a copy so the dataset's own shuffle and random counters stay put,
    and its graph is checked too):

    - **static scan** (no GPU needed, nothing run): the model's own `train_step` is traced and its
      ops, nested functions included, are matched against the table of ops without deterministic
      GPU kernels for `tf_version` (default: the installed TensorFlow; a version outside the
      table's range raises `ValueError`), each named by its layer with the fix; Python run by
      `tf.numpy_function`/`tf.py_function` is a risk; plus batch-norm fine-tuning, the
      configuration and the input pipeline.
    - **dynamic bisection** (`repeats` >= 2; 0 skips it): the model's own `train_step` (a custom
      one as written: its losses, metrics and updates) runs `repeats` times from the same state,
      and every layer's tensors (integer and boolean ones too), the gradients through it, the
      gradients off the tape and into the optimizer, what each metric receives, the logs and every
      variable the step can change are compared bit for bit; the first layer (or the loss, the
      step's own code, the optimizer, a metric) in execution order that varied by itself is reported
      with how many repeats differed and by how much, the layers it affected as `downstream`.
      What could not be compared is reported as "not examined", and the diagnosis is then not clean.

    Afterwards every variable the step can change (the model's, its optimizers' and metrics', and
    whatever else its object graph reaches, a layer's `tf.random.Generator` or plain
    `tf.Variable` included) and every RNG are as they were, bit for bit (an unbuilt model,
    optimizer or metric is built, as `fit` would build it). Works with Sequential, functional and
    subclassed models, nested layers included, on Keras 3 and Keras 2. Limits: the dynamic part
    runs on this machine's devices, so a GPU-only nondeterminism shows only on a GPU (the static
    scan names it anywhere); under a `tf.distribute` strategy (Keras 3 only) the step runs once in
    the strategy's cross-replica context (mirrored variables included), not once per replica.

    Args:
        model: The compiled Keras model (the Keras that `tf.keras` is here), as it would train.
        x: The input, as `Model.fit` takes it: arrays or tensors (a dict or list of them too), a
            `tf.data.Dataset`, a `keras.utils.PyDataset`/`Sequence`, or an iterator (one element
            is consumed).
        y: The targets, for arrays or tensors, as `fit` takes them (`None` for a dataset, or a
            model without targets).
        repeats: How many times the dynamic bisection runs the step, an int >= 2; 0 runs the
            static scan only.
        sample_weight: Per-sample weights, for arrays or tensors, as `fit` takes them.
        batch_size: The rows of the batch cut from arrays, a positive int; `None`: 32, as `fit`.
            Ignored for a dataset, whose element is already a batch.
        tf_version: The TensorFlow version to scan the ops against (`"2.15"`, say), for a run on
            another version; `None`: the installed one.

    Returns:
        A `tfrepro.Diagnosis`: the findings, most serious first, each naming where (a layer, the
            optimizer, the loss, the input pipeline, the configuration), what was found and the fix.

    Raises:
        ValueError: `repeats` is 1, negative or not an int; `batch_size` is not a positive int;
            `tf_version` is outside the range the kernel table covers; the data is empty or its
            arguments do not match (`y` given with a dataset that yields pairs, say); the model is
            not compiled; or (Keras 2) it was built under a `tf.distribute` strategy.
        TypeError: `model` is not a Keras `Model` of the Keras that `tf.keras` is here.

    Examples:
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
    if tf_version is not None:
        scanning.check_tf_version(tf_version)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    batch = batches.first_batch(x, y, sample_weight, batch_size)
    batches.prepare(model, batch)
    spy = LayerCalls(model)
    snapshot = restoring.Snapshot([layer.obj for layer in spy.layers])  # before the scan's trace moves seeds
    snapshot.add(restoring.model_variables(model))
    try:
        found, variables = scanning.scan(model, batch, spy, tf_version)
        snapshot.add(restoring.model_variables(model))  # what the trace created (optimizer slots, metrics), in order
        snapshot.add(variables)  # and what no object holds
        found += batch.findings
        seconds["scan"] = time.perf_counter() - start
        if repeats:
            start = time.perf_counter()
            dynamic = bisection.bisect(model, batch, spy, repeats, snapshot)
            seconds["bisection"] = time.perf_counter() - start
            found = _with_fixes(dynamic, found) + found
    finally:
        snapshot.restore()
    return Diagnosis(_unique(ordered(found)), model=f"{type(model).__name__} {model.name!r}",
                     tf_version=tf_version or tf.__version__, keras_version=getattr(keras, "__version__", ""),
                     repeats=repeats, seconds=seconds)


def _with_fixes(dynamic: list[Finding], static: list[Finding]) -> list[Finding]:
    """A layer that varied by itself gets the static fix found for it, or the general advice."""
    fixes = {f.where: f.fix for f in static if f.fix and f.check == "ops" and "fact" in f.details}
    causes = ("an order-dependent sum (atomics, unsorted_segment_sum, scatter-add: tfrepro.ops has order-invariant "
              "ones, tfrepro.patch(ops=True)) or randomness no seed reaches (numpy_function, OS entropy, an unseeded "
              "generator); then `tfrepro.diagnose` again")
    result = []
    for finding in dynamic:
        if finding.severity == "nondeterministic" and not finding.fix:
            place = "the train step's own code" if finding.where == "train step" else \
                "this metric's update_state" if finding.where.startswith("metric: ") else "this layer"
            fix = fixes.get(finding.where, f"find what varies in {place}: {causes}"
                            if finding.where not in ("optimizer", "loss") else
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
