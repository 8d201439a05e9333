"""The dynamic bisection: one training step, repeated from the same state, compared bit for bit.

Each repeat restores the model's variables, the optimizer's, the metrics', Keras's seed generator
states and every RNG (``rng_state``), traces the step afresh (so stateful random kernels restart
from their seeds too), and runs forward, loss, backward and the optimizer update on the same
batch. Every layer call's inputs, outputs, the gradients arriving at its outputs and leaving at its
inputs, each weight's gradient, the loss and each updated variable are fingerprinted on the device
(``tfrepro.proof.fingerprints``: 8 bytes each leave it). A layer *varied by itself* when something
it produced varied while everything it received was identical: its output in the forward pass, or
its gradients (to its inputs or its own weights) in the backward pass. Layers that varied because
what they received varied are *downstream*. Findings come in execution order: forward (by
completion), the loss, backward (reverse), the optimizer. Afterwards every variable and RNG is
back where it was.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfrepro import _tf
from tfrepro.determinism.seeding import rng_state, set_rng_state
from tfrepro.diagnosis.batches import Batch
from tfrepro.diagnosis.findings import Finding
from tfrepro.diagnosis.layer_calls import Layer, LayerCall, LayerCalls, floating
from tfrepro.diagnosis.scanning import xla_compiled
from tfrepro.ops import kernel_facts
from tfrepro.proof.fingerprints import gradient_fingerprints


_SUFFIX = re.compile(r"_\d+$")


@dataclass(frozen=True)
class Item:
    """One fingerprinted tensor: ``kind`` is "input", "output", "input gradient", "output gradient"
    (of call ``call``), "gradient" or "update" (of variable ``variable``), or "loss"."""

    kind: str
    call: int | None = None
    variable: str | None = None


def _plain(tf: Any, variable: Any) -> Any:
    """The ``tf.Variable`` behind a Keras 3 variable (Keras 2's are ``tf.Variable``s already)."""
    return variable if isinstance(variable, tf.Variable) else getattr(variable, "value", variable)


def _listed(value: Any) -> list[Any]:
    return list(value() if callable(value) else value or [])


def state_variables(model: Any) -> list[Any]:
    """Every variable a training step can change: the model's (weights, batch-norm statistics, Keras
    3 seed generator states), the optimizer's and the metrics', each once."""
    tf = _tf.import_tf()
    candidates = [*_listed(model.variables), *_listed(getattr(model.optimizer, "variables", []))]
    for metric in _listed(getattr(model, "metrics", [])):
        candidates += _listed(getattr(metric, "variables", []))
    unique: dict[int, Any] = {}
    for variable in candidates:
        unique.setdefault(id(_plain(tf, variable)), variable)
    return list(unique.values())


def _legacy_seed_holders(layers: Sequence[Layer]) -> list[Any]:
    """Keras 2's per-layer seed counters (``layer._random_generator._seed``, advanced on each trace)."""
    holders = []
    for layer in layers:
        generator = getattr(layer.obj, "_random_generator", None)
        if generator is not None and isinstance(getattr(generator, "_seed", None), int):
            holders.append(generator)
    return holders


def _loss(model: Any, batch_x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
    parameters = inspect.signature(model.compute_loss).parameters
    kwargs = {"x": batch_x, "y": y, "y_pred": y_pred, "sample_weight": sample_weight}
    if "training" in parameters:
        kwargs["training"] = True
    return model.compute_loss(**kwargs)


class _Step:
    """One repeat's traced step. ``items`` describe the fingerprinted tensors, in order; the values
    of the items numbered in ``keep`` are returned too (to measure by how much they differ)."""

    def __init__(self, model: Any, spy: LayerCalls, keep: Sequence[int] = ()):
        self.model = model
        self.spy = spy
        self.keep = tuple(keep)
        self.items: list[Item] = []
        self.calls: list[LayerCall] = []

    def __call__(self, x: Any, y: Any, sample_weight: Any) -> tuple[Any, list[Any]]:
        tf = _tf.import_tf()
        model, optimizer = self.model, self.model.optimizer
        with tf.GradientTape() as tape:
            for tensor in floating(tf, x):
                tape.watch(tensor)
            with self.spy.recording() as calls:
                y_pred = model(x, training=True)
            loss = _loss(model, x, y, y_pred, sample_weight)
            scaled = optimizer.scale_loss(loss) if hasattr(optimizer, "scale_loss") else loss
        self.calls = list(calls)
        variables = list(model.trainable_variables)
        names = [_name(v) for v in variables]
        inputs = [(c.start, t) for c in calls for t in c.inputs]
        outputs = [(c.start, t) for c in calls for t in c.outputs]
        gradients = tape.gradient(scaled, [*variables, *(t for _, t in inputs), *(t for _, t in outputs)])
        weight_gradients = gradients[:len(variables)]
        optimizer.apply_gradients([(g, v) for g, v in zip(weight_gradients, variables) if g is not None])
        updated = [tf.convert_to_tensor(_plain(tf, v)) for v in variables]

        tensors: list[Any] = []
        self.items = []

        def add(item: Item, tensor: Any) -> None:
            self.items.append(item)
            tensors.append(tensor)

        for start, tensor in inputs:
            add(Item("input", start), tensor)
        for start, tensor in outputs:
            add(Item("output", start), tensor)
        add(Item("loss"), loss)
        for (start, _), gradient in zip(inputs, gradients[len(variables):len(variables) + len(inputs)]):
            add(Item("input gradient", start), gradient)
        for (start, _), gradient in zip(outputs, gradients[len(variables) + len(inputs):]):
            add(Item("output gradient", start), gradient)
        for name, gradient in zip(names, weight_gradients):
            add(Item("gradient", variable=name), gradient)
        for name, value in zip(names, updated):
            add(Item("update", variable=name), value)
        kept = [tf.zeros([0]) if tensors[i] is None else tf.convert_to_tensor(tensors[i]) for i in self.keep]
        return gradient_fingerprints(tf, tensors), kept


def _name(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name


def _max_abs_diff(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("nan")
    if not a.size:
        return 0.0
    with np.errstate(invalid="ignore"):
        return float(np.max(np.abs(a - b)))


@dataclass
class _Variation:
    differing: int = 0  # repeats that differ from the first
    max_abs_diff: float | None = None  # None: the runs that kept values happened to agree


class _TracingVaries(Exception):
    """The step traced to different graphs in two repeats."""


def run_repeats(model: Any, batch: Batch, spy: LayerCalls, repeats: int) -> tuple[_Step, dict[int, _Variation]]:
    """Run the step ``repeats`` times from the same state and say which items varied (how many
    repeats differ from the first). Only fingerprints leave the device; when something varied,
    ``repeats`` more runs keep the values of just those items, to measure by how much. Every
    variable and RNG is restored afterwards, also when a repeat fails."""
    tf = _tf.import_tf()
    variables = state_variables(model)
    saved = [np.array(v.numpy(), copy=True) for v in variables]
    saved_rng = rng_state()
    holders = _legacy_seed_holders(spy.layers)
    saved_seeds = [holder._seed for holder in holders]

    def restore() -> None:
        for variable, value in zip(variables, saved):
            variable.assign(value)
        set_rng_state(saved_rng)
        for holder, seed in zip(holders, saved_seeds):
            holder._seed = seed

    def run(keep: Sequence[int]) -> tuple[_Step, Any, list[Any]]:
        restore()
        step = _Step(model, spy, keep)
        prints, values = tf.function(step, jit_compile=xla_compiled(model) or None)(batch.x, batch.y,
                                                                                   batch.sample_weight)
        return step, prints.numpy(), values

    try:
        first, reference, _ = run(())
        variation: dict[int, _Variation] = {}
        for repeat in range(1, repeats):
            step, prints, _ = run(())
            if step.items != first.items:
                raise _TracingVaries(f"the traced step differs between repeats ({len(first.items)} tensors in the "
                                     f"first, {len(step.items)} in repeat {repeat}): tracing itself is not "
                                     "reproducible (Python-side randomness or set order while the step is built?)")
            for index in np.flatnonzero(np.any(prints != reference, axis=1)):
                variation.setdefault(int(index), _Variation()).differing += 1
        if variation:
            keep = sorted(variation)
            _, kept_prints, kept_reference = run(keep)
            for _ in range(1, repeats):
                _, prints, values = run(keep)
                for position, index in enumerate(keep):
                    if np.any(prints[index] != kept_prints[index]):
                        diff = _max_abs_diff(values[position].numpy(), kept_reference[position].numpy())
                        entry = variation[index]
                        entry.max_abs_diff = diff if entry.max_abs_diff is None or np.isnan(diff) else \
                            max(entry.max_abs_diff, diff)
    finally:
        restore()
    return first, variation


def _owners(layers: Sequence[Layer]) -> dict[str, Layer]:
    """Each trainable weight's innermost owning layer (the model for its own weights), by name."""
    owner: dict[str, Layer] = {}
    for layer in layers:
        for weight in layer.obj.trainable_weights:
            current = owner.get(_name(weight))
            if current is None or _depth(layer, layers) > _depth(current, layers):
                owner[_name(weight)] = layer
    return owner


def _depth(layer: Layer, layers: Sequence[Layer]) -> int:
    return -1 if layer is layers[-1] else layer.path.count("/")  # the model (last) holds every weight


def _describe(kinds: Sequence[str]) -> str:
    order = ("output", "input gradient", "gradient")
    words = {"output": "its output", "input gradient": "the gradient it passes back",
             "gradient": "its weights' gradients"}
    return " and ".join(words[k] for k in order if k in kinds)


def _by_itself(kinds: set[str]) -> bool:
    """Whether a call that varied in ``kinds`` produced a difference from identical input: its output
    with identical inputs, or its backward results with identical inputs, outputs and incoming gradients."""
    if "input" in kinds:
        return False
    if "output" in kinds:
        return True
    return "output gradient" not in kinds and bool({"input gradient", "gradient"} & kinds)


def _raised(error: Any, spy: LayerCalls) -> Finding:
    """The finding for a step that raised ``UnimplementedError``: the layer of the node TF names."""
    node = re.search(r"\{\{node ([^}]+)\}\}", error.message or "")
    layer = spy.layer_of(node.group(1)) if node else None
    op = node.group(1).rsplit("/", 1)[-1] if node else ""
    fact = next((f for f in kernel_facts.FACTS if _SUFFIX.sub("", op) in f.op_types), None)  # names are op types
    first_line = (error.message or "").strip().splitlines()[0]
    return Finding("raises", layer.path if layer else "train step", f"the step raised UnimplementedError when it "
                   f"ran: {first_line}", fact.fix if fact else "", "dynamic",
                   {"op": op, "node": node.group(1) if node else None})


def _amount(entry: _Variation, later: int) -> str:
    size = "not measured: the runs that kept values agreed" if entry.max_abs_diff is None else \
        f"{entry.max_abs_diff:.3g}"
    return f"{entry.differing} of {later} later repeat(s) differ from the first; max |difference| {size}"


def bisect(model: Any, batch: Batch, spy: LayerCalls, repeats: int) -> list[Finding]:
    """The dynamic findings (see the module doc): what varied by itself, then what varied downstream;
    or, when the step itself raised ``UnimplementedError`` under op determinism, that."""
    tf = _tf.import_tf()
    try:
        step, variation = run_repeats(model, batch, spy, repeats)
    except tf.errors.UnimplementedError as error:
        return [_raised(error, spy)]
    except _TracingVaries as error:
        return [Finding("nondeterministic", "train step", str(error), "make the code that builds the step "
                        "deterministic: seed Python's random, fix PYTHONHASHSEED (`tfrepro run`)", "dynamic")]
    if not variation:
        return []
    later = repeats - 1
    model_layer = spy.layers[-1]
    calls = {call.start: call for call in step.calls}
    varied: dict[int, dict[str, _Variation]] = {}  # call start -> kind -> variation
    weights_varied: dict[str, _Variation] = {}
    updates_varied: dict[str, _Variation] = {}
    loss_varied = None
    for index, entry in variation.items():
        item = step.items[index]
        if item.call is not None:
            kinds = varied.setdefault(item.call, {})
            kinds[item.kind] = max(kinds.get(item.kind, entry), entry, key=lambda v: v.max_abs_diff or 0.0)
        elif item.kind == "gradient":
            weights_varied[item.variable] = entry
        elif item.kind == "update":
            updates_varied[item.variable] = entry
        else:
            loss_varied = entry
    owners = _owners(spy.layers)
    for name, entry in weights_varied.items():  # a weight's gradient belongs to its layer's backward pass
        layer_calls = [call for call in step.calls if call.layer is owners.get(name)]
        receiving = [c for c in layer_calls if {"input", "output", "output gradient"} & set(varied.get(c.start, {}))]
        for call in receiving or layer_calls[:1]:  # a shared layer varies by itself only if no call received it
            varied.setdefault(call.start, {}).setdefault("gradient", entry)

    origins = [calls[start] for start, kinds in varied.items() if _by_itself(set(kinds))]
    inner = {id(c) for c in origins if not any(o is not c and o.within(c) for o in origins)}
    events: list[tuple[tuple[int, int], Finding]] = []
    for start, kinds in varied.items():
        call = calls[start]
        forward = bool({"input", "output"} & set(kinds))
        worst = max(kinds.values(), key=lambda v: v.max_abs_diff or 0.0)
        details = {"layer": call.layer.kind, "varied": sorted(kinds), "repeats_differing": worst.differing,
                   "repeats": repeats, "max_abs_diff": worst.max_abs_diff,
                   "phase": "forward" if forward else "backward"}
        amount = _amount(worst, later)
        if id(call) in inner:
            own = [k for k in ("output", "input gradient", "gradient") if k in kinds]
            what = ("the model's own code between its layers: " if call.layer is model_layer else "") + _describe(own)
            finding = Finding("nondeterministic", call.layer.path, f"{what} varied between repeats of the same step "
                              f"from the same state and inputs ({amount})", "", "dynamic", details)
        elif call.layer is model_layer:
            continue  # the whole model varied because something in it did: says nothing new
        elif any(o.within(call) for o in origins):
            finding = Finding("downstream", call.layer.path, f"varied because a layer inside it did ({amount})", "",
                              "dynamic", details)
        else:
            finding = Finding("downstream", call.layer.path, f"varied because what it received varied ({amount})",
                              "", "dynamic", details)
        events.append(((0, call.end) if forward else (2, -start), finding))
    forward_varied = any({"input", "output"} & set(k) for k in varied.values())
    if loss_varied is not None:
        severity = "downstream" if forward_varied else "nondeterministic"
        events.append(((1, 0), Finding(severity, "loss", f"the loss varied ({_amount(loss_varied, later)})", "",
                                       "dynamic", {"max_abs_diff": loss_varied.max_abs_diff})))
    unexplained = sorted(name for name in updates_varied if name not in weights_varied)
    if unexplained:
        worst = max((updates_varied[n] for n in unexplained), key=lambda v: v.max_abs_diff or 0.0)
        events.append(((3, 0), Finding(
            "nondeterministic", "optimizer", f"the update of {', '.join(unexplained)} varied although its gradient "
            f"did not ({_amount(worst, later)})", "", "dynamic",
            {"variables": unexplained, "optimizer": type(model.optimizer).__name__})))
    findings = [finding for _, finding in sorted(events, key=lambda event: event[0])]
    if not any(f.severity == "nondeterministic" for f in findings):  # varied, but no origin could be placed
        findings.insert(0, Finding("nondeterministic", "train step", "the step varied between repeats but no layer, "
                                   "loss or optimizer update varied by itself: see the downstream findings for "
                                   "where it shows first", "", "dynamic"))
    return findings
