"""The dynamic bisection: the model's own training step, repeated from the same state, compared bit
for bit.

Each repeat restores every variable the step can change and every RNG (``restoring.Snapshot``),
traces ``model.train_step`` afresh (so stateful random kernels restart from their seeds too; a custom
step runs as written, with its own losses, metrics and updates) and runs it on the same batch, as
``fit`` hands it over. Fingerprinted on the device (``tfrepro.proof.fingerprints``: 8 bytes each
leave it): every layer call's tensor inputs and outputs (integer and boolean ones too), the gradients
arriving at its outputs and leaving at its inputs (``layer_calls``), each loss a tape
differentiates, each variable's gradient from the tape and as handed to an optimizer, what each
metric receives (``recording``), the logs the step returns, and every variable's value after the
step. Something *varied by itself* when it produced a difference from identical input: a layer's
output or variable update in the forward pass, its gradients with identical inputs and incoming
gradient in the backward pass; the step's own code when the gradients it hands the optimizer
differ from identical ones off the tape; the optimizer when an update differs from identical
gradients; a metric when its state differs from identical input. What varied because what it
received varied is *downstream*. Findings come in execution order: forward (by completion), the
loss, backward (reverse), the step's own code, the optimizer, the metrics. Afterwards every
variable and RNG is back where it was.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfrepro import _tf
from tfrepro.diagnosis import recording, restoring
from tfrepro.diagnosis.batches import Batch
from tfrepro.diagnosis.findings import Finding
from tfrepro.diagnosis.layer_calls import Layer, LayerCall, LayerCalls, fingerprintable
from tfrepro.diagnosis.scanning import xla_compiled
from tfrepro.ops import kernel_facts
from tfrepro.proof.fingerprints import gradient_fingerprints

_SUFFIX = re.compile(r"_\d+$")
_CALL_KINDS = ("input", "output", "input gradient", "output gradient")


@dataclass(frozen=True)
class Item:
    """One fingerprinted tensor: ``kind`` is one of ``_CALL_KINDS`` (of layer call ``call``),
    "gradient" (from a tape), "applied gradient" (given to an optimizer) or "state" (after the step)
    of variable ``key`` (its ``tf.Variable``'s id), "metric input" (of metric ``key``), "loss" or
    "log" (``name``)."""

    kind: str
    call: int | None = None
    key: int | None = None
    name: str | None = None


@dataclass(frozen=True)
class Owner:
    """Who changes a variable: "layer" (``layer``), "metric" (number ``metric``), "optimizer" or "step"
    (the train step's own code: a variable no layer, metric or optimizer holds)."""

    kind: str
    layer: Layer | None = None
    metric: int | None = None


class _Variables:
    """The variables a step can change (``restoring.Snapshot``'s), each with a name and an owner."""

    def __init__(self, model: Any, spy: LayerCalls, variables: Sequence[Any], metrics: Sequence[Any],
                 optimizers: Sequence[Any]):
        tf = _tf.import_tf()
        self.variables = list(variables)
        self.metrics = list(metrics)
        keras_names: dict[int, str] = {}
        for group in [model.variables, *(m.variables for m in metrics), *(o.variables for o in optimizers)]:
            for variable in restoring.listed(group):
                inner = restoring.plain(tf, variable)
                if inner is not None:
                    keras_names.setdefault(id(inner), _name(variable))
        metric_of: dict[int, int] = {}
        for number, metric in sorted(enumerate(metrics), key=lambda m: -len(restoring.listed(m[1].variables))):
            for variable in restoring.listed(metric.variables):  # the innermost (fewest variables) wins
                metric_of[id(restoring.plain(tf, variable))] = number
        optimized = {id(restoring.plain(tf, v)) for o in optimizers for v in restoring.listed(o.variables)}
        layer_of: dict[int, Layer] = {}
        for layer in spy.layers:  # the innermost layer holding it (the model, last, holds every weight)
            for variable in restoring.listed(getattr(layer.obj, "variables", None) or layer.obj.weights):
                key = id(restoring.plain(tf, variable))
                if key not in layer_of or _depth(layer, spy.layers) > _depth(layer_of[key], spy.layers):
                    layer_of[key] = layer
        by_object = {id(layer.obj): layer for layer in spy.layers}
        walked = {id(t.variable): t for t in restoring.object_graph([model])}
        self.owner: dict[int, Owner] = {}
        self.name: dict[int, str] = {}
        for variable in self.variables:
            key = id(variable)
            short = _name(variable).split(":")[0]
            tracked = walked.get(key)
            holders = [(i, by_object[id(o)]) for i, o in enumerate(tracked.ancestors) if id(o) in by_object] \
                if tracked else []
            if key in metric_of:
                number = metric_of[key]
                self.owner[key] = Owner("metric", metric=number)
                self.name[key] = f"{metrics[number].name}/{short.rsplit('/', 1)[-1]}"
                continue
            if key in optimized:
                self.owner[key] = Owner("optimizer")
            elif key in layer_of:
                self.owner[key] = Owner("layer", layer_of[key])
            elif holders:
                self.owner[key] = Owner("layer", holders[-1][1])
            else:
                self.owner[key] = Owner("step")
            if key in keras_names:
                self.name[key] = keras_names[key].split(":")[0]
            elif holders:  # e.g. a layer's tf.random.Generator: "jitter/generator"
                index, layer = holders[-1]
                rest = [n for n in tracked.names[index:] if not n.startswith("_")]
                self.name[key] = "/".join([layer.path, *rest])
            else:
                self.name[key] = short

    def names(self, keys: Sequence[int]) -> str:
        return ", ".join(sorted(self.name.get(k, "?") for k in keys))


def _name(variable: Any) -> str:
    return str(getattr(variable, "path", None) or variable.name)


class _Step:
    """One repeat's traced step. ``items`` describe the fingerprinted tensors, in order; the values
    of the items numbered in ``keep`` are returned too (to measure by how much they differ)."""

    def __init__(self, model: Any, spy: LayerCalls, state: _Variables, optimizers: Sequence[Any],
                 keep: Sequence[int] = ()):
        self.model, self.spy, self.state, self.optimizers = model, spy, state, list(optimizers)
        self.keep = tuple(keep)
        self.items: list[Item] = []
        self.calls: list[LayerCall] = []
        self.unexamined: set[int] = set()  # calls whose tensors live in a loop or function of their own
        self.applied_as_computed: set[int] = set()  # variables whose tape gradient went to the optimizer as it was

    def __call__(self, data: Any) -> tuple[Any, list[Any]]:
        tf = _tf.import_tf()
        graph = tf.compat.v1.get_default_graph()
        with self.spy.recording(gradients=True) as calls, \
                recording.recording(self.optimizers, self.state.metrics) as record:
            logs = self.model.train_step(data)
        self.calls = list(calls)
        after = [tf.convert_to_tensor(v) for v in self.state.variables]

        tensors: list[Any] = []
        self.items = []

        def here(tensor: Any) -> bool:
            return getattr(getattr(tensor, "values", tensor), "graph", None) is graph

        def add(item: Item, tensor: Any) -> None:
            self.items.append(item)
            tensors.append(tensor)

        for call in self.calls:
            own = [*call.inputs, *call.outputs]
            if own and not any(here(t) for t in own):
                self.unexamined.add(call.start)
        for kind, attribute in zip(_CALL_KINDS, ("inputs", "outputs", "input_gradients", "output_gradients")):
            for call in self.calls:
                for tensor in getattr(call, attribute):
                    if here(tensor):
                        add(Item(kind, call.start), tensor)
        for tensor in record.targets:
            if here(tensor):
                add(Item("loss"), tensor)
        for key, gradient in record.gradients:
            if here(gradient):
                add(Item("gradient", key=key), gradient)
        from_tape = {(key, id(gradient)) for key, gradient in record.gradients}
        for key, gradient in record.applied:
            if (key, id(gradient)) in from_tape:  # the same tensor: compared once, as the tape's
                self.applied_as_computed.add(key)
            elif here(gradient):
                add(Item("applied gradient", key=key), gradient)
        for number, tensor in record.metric_inputs:
            if here(tensor):
                add(Item("metric input", key=number), tensor)
        named_logs = sorted(logs.items()) if isinstance(logs, dict) else [("logs", logs)]
        for name, value in named_logs:
            for tensor in fingerprintable(tf, value):
                if here(tensor):
                    add(Item("log", name=str(name)), tensor)
        for variable, value in zip(self.state.variables, after):
            if value.dtype.is_floating or value.dtype.is_integer or value.dtype == tf.bool:
                add(Item("state", key=id(variable)), value)
        kept = [tf.convert_to_tensor(getattr(tensors[i], "values", tensors[i])) for i in self.keep]
        return gradient_fingerprints(tf, tensors), kept


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


def run_repeats(model: Any, batch: Batch, spy: LayerCalls, repeats: int,
                snapshot: restoring.Snapshot) -> tuple[_Step, dict[int, _Variation]]:
    """Run the step ``repeats`` times from the state in ``snapshot`` and say which items varied (how
    many repeats differ from the first). Only fingerprints leave the device; when something varied,
    ``repeats`` more runs keep the values of just those items, to measure by how much. The snapshot
    is restored before each run and afterwards, also when a run fails."""
    tf = _tf.import_tf()
    optimizers = restoring.optimizers(model)
    state = _Variables(model, spy, snapshot.variables, restoring.metrics(model), optimizers)

    def run(keep: Sequence[int]) -> tuple[_Step, Any, list[Any]]:
        snapshot.restore()
        step = _Step(model, spy, state, optimizers, keep)
        function = tf.function(step, jit_compile=xla_compiled(model) or None)
        snapshot.add(function.get_concrete_function(batch.data()).graph.variables)  # any the scan did not see
        prints, values = function(batch.data())
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
        snapshot.restore()
    return first, variation


def _depth(layer: Layer, layers: Sequence[Layer]) -> int:
    return -1 if layer is layers[-1] else layer.path.count("/")  # the model (last) holds every weight


def _describe(kinds: Sequence[str], updated: str = "") -> str:
    words = {"output": "its output", "update": f"its update of {updated}", "input gradient":
             "the gradient it passes back", "gradient": "its weights' gradients"}
    return " and ".join(words[k] for k in ("output", "update", "input gradient", "gradient") if k in kinds)


def _by_itself(kinds: set[str]) -> bool:
    """Whether a call that varied in ``kinds`` produced a difference from identical input: its output
    or a variable update with identical inputs, or its backward results with identical inputs,
    outputs and incoming gradients."""
    if "input" in kinds:
        return False
    if {"output", "update"} & kinds:
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


def _worst(entries: Sequence[_Variation]) -> _Variation:
    return max(entries, key=lambda v: v.max_abs_diff or 0.0)


def bisect(model: Any, batch: Batch, spy: LayerCalls, repeats: int, snapshot: restoring.Snapshot) -> list[Finding]:
    """The dynamic findings (see the module doc): what varied by itself, then what varied downstream;
    or, when the step itself raised ``UnimplementedError`` under op determinism, that."""
    tf = _tf.import_tf()
    try:
        step, variation = run_repeats(model, batch, spy, repeats, snapshot)
    except tf.errors.UnimplementedError as error:
        return [_raised(error, spy)]
    except _TracingVaries as error:
        return [Finding("nondeterministic", "train step", str(error), "make the code that builds the step "
                        "deterministic: seed Python's random, fix PYTHONHASHSEED (`tfrepro run`)", "dynamic")]
    return _unexamined(step, spy) + _attribute(model, step, variation, spy, repeats - 1)


def _examined(call: LayerCall | None, step: _Step) -> LayerCall | None:
    """The call itself if its tensors were compared, else its nearest enclosing call whose were."""
    while call is not None and call.start in step.unexamined:
        call = call.parent
    return call


def _unexamined(step: _Step, spy: LayerCalls) -> list[Finding]:
    """Layers whose calls happened in a loop or function of their own with no compared call around them."""
    compared = "every variable and the step's results were"
    if not step.calls and len(spy.layers) > 1:
        return [Finding("not examined", "train step", "no layer call was seen while the step was traced (a "
                        "train_step that is a tf.function of its own, traced before, runs its layers out of reach), "
                        f"so no layer's tensors or gradients were compared; {compared}", "", "dynamic")]
    paths = sorted({c.layer.path for c in step.calls if c.start in step.unexamined and _examined(c, step) is None})
    return [Finding("not examined", path, "its calls run inside a loop or a function of their own, so its "
                    f"tensors and gradients were not compared; {compared}", "", "dynamic") for path in paths]


def _attribute(model: Any, step: _Step, variation: dict[int, _Variation], spy: LayerCalls,
               later: int) -> list[Finding]:
    """The findings for the items that varied (see the module doc)."""
    if not variation:
        return []
    state = step.state
    model_layer = spy.layers[-1]
    calls = {call.start: call for call in step.calls}
    by_kind: dict[str, dict[Any, _Variation]] = {}
    varied: dict[int, dict[str, _Variation]] = {}  # call start -> kind -> variation

    def mark(call: LayerCall, kind: str, entry: _Variation) -> None:
        kinds = varied.setdefault(call.start, {})
        kinds[kind] = _worst([kinds.get(kind, entry), entry])

    for index, entry in variation.items():
        item = step.items[index]
        if item.call is not None:
            mark(calls[item.call], item.kind, entry)
        else:
            group = by_kind.setdefault(item.kind, {})
            key = item.key if item.key is not None else item.name
            group[key] = _worst([group.get(key, entry), entry])
    tape_gradients = by_kind.get("gradient", {})
    applied = {item.key for item in step.items if item.kind == "applied gradient"} | step.applied_as_computed
    metrics_called = {item.key for item in step.items if item.kind == "metric input"}

    def layer_calls(layer: Layer, what: set[str]) -> list[LayerCall]:
        """The examined calls of ``layer`` (or around it); those that received a difference if any did (a
        shared layer varies by itself only if none of its calls received it)."""
        found = {id(c): c for c in (_examined(c, step) for c in step.calls if c.layer is layer) if c is not None}
        receiving = [c for c in found.values() if what & set(varied.get(c.start, {}))]
        return receiving or list(found.values())[:1]

    for key, entry in tape_gradients.items():  # a weight's gradient belongs to its layer's backward pass
        owner = state.owner.get(key)
        if owner is not None and owner.kind == "layer":
            for call in layer_calls(owner.layer, {"input", "output", "output gradient"}):
                mark(call, "gradient", entry)
    step_changes: list[str] = []
    step_entries: list[_Variation] = []
    optimizer_changes: list[int] = []
    metric_changes: dict[int, list[int]] = {}
    changed_by_step = sorted(by_kind.get("applied gradient", {}).keys() - tape_gradients.keys())
    applied_varied = {**{k: tape_gradients[k] for k in step.applied_as_computed if k in tape_gradients},
                      **by_kind.get("applied gradient", {})}
    for key, entry in by_kind.get("state", {}).items():
        owner = state.owner[key]
        if key in applied_varied or (owner.kind == "optimizer" and applied_varied):
            continue  # the optimizer applied what varied
        if owner.kind == "metric":
            metric_changes.setdefault(owner.metric, []).append(key)
        elif owner.kind == "optimizer" or key in applied:
            optimizer_changes.append(key)
        elif owner.kind == "layer" and layer_calls(owner.layer, {"input"}):
            for call in layer_calls(owner.layer, {"input"}):
                mark(call, "update", entry)
        else:
            step_changes.append(state.name[key])
            step_entries.append(entry)

    origins = [calls[start] for start, kinds in varied.items() if _by_itself(set(kinds))]
    inner = {id(c) for c in origins if not any(o is not c and o.within(c) for o in origins)}
    events: list[tuple[tuple[int, int], Finding]] = []
    for start, kinds in varied.items():
        call = calls[start]
        forward = bool({"input", "output", "update"} & set(kinds))
        worst = _worst(list(kinds.values()))
        details = {"layer": call.layer.kind, "varied": sorted(kinds), "repeats_differing": worst.differing,
                   "repeats": later + 1, "max_abs_diff": worst.max_abs_diff,
                   "phase": "forward" if forward else "backward"}
        amount = _amount(worst, later)
        if id(call) in inner:
            own = [k for k in ("output", "update", "input gradient", "gradient") if k in kinds]
            updated = state.names([k for k, e in by_kind.get("state", {}).items()
                                   if state.owner[k].layer is call.layer and k not in applied_varied])
            what = ("the model's own code between its layers: " if call.layer is model_layer else "") + \
                _describe(own, updated)
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
    forward_varied = any({"input", "output", "update"} & set(k) for k in varied.values())
    losses = list(by_kind.get("loss", {}).values())
    if losses:
        severity = "downstream" if forward_varied else "nondeterministic"
        events.append(((1, 0), Finding(severity, "loss", f"the loss varied ({_amount(_worst(losses), later)})", "",
                                       "dynamic", {"max_abs_diff": _worst(losses).max_abs_diff})))
    if changed_by_step:
        worst = _worst([applied_varied[k] for k in changed_by_step])
        events.append(((3, 0), Finding(
            "nondeterministic", "train step", f"the gradients the train step passed to the optimizer for "
            f"{state.names(changed_by_step)} varied although the tape computed them identically: its own code "
            f"between tape.gradient and the optimizer ({_amount(worst, later)})", "", "dynamic",
            {"variables": [state.name.get(k, "?") for k in changed_by_step]})))
    if optimizer_changes:
        worst = _worst([by_kind["state"][k] for k in optimizer_changes])
        events.append(((3, 1), Finding(
            "nondeterministic", "optimizer", f"the update of {state.names(optimizer_changes)} varied although its "
            f"gradient did not ({_amount(worst, later)})", "", "dynamic",
            {"variables": [state.name[k] for k in optimizer_changes], "optimizer": type(model.optimizer).__name__})))
    received = by_kind.get("metric input", {})
    for number, keys in sorted(metric_changes.items()):
        if number in received or (number not in metrics_called and (forward_varied or losses)):
            continue  # it varied because what it received did: the cause is reported where it happened
        metric = state.metrics[number]
        worst = _worst([by_kind["state"][k] for k in keys])
        events.append(((4, number), Finding(
            "nondeterministic", f"metric: {metric.name}", f"its state ({state.names(keys)}) varied although what it "
            f"received was identical ({_amount(worst, later)})", "", "dynamic", {"metric": type(metric).__name__})))
    if step_changes:
        events.append(((5, 0), Finding(
            "nondeterministic", "train step", f"its own code (no layer, metric or optimizer holds them) updated "
            f"{', '.join(sorted(step_changes))} differently ({_amount(_worst(step_entries), later)})", "",
            "dynamic", {"variables": sorted(step_changes)})))
    findings = [finding for _, finding in sorted(events, key=lambda event: event[0])]
    if not any(f.severity == "nondeterministic" for f in findings):  # varied, but no origin could be placed
        shown = sorted(by_kind.get("log", {}))
        what = f"the logs it returned ({', '.join(shown)}) varied" if shown and not findings else "the step varied"
        findings.insert(0, Finding("nondeterministic", "train step", f"{what} between repeats but no layer, loss, "
                                   "metric or optimizer update varied by itself" + (": see the downstream findings "
                                   "for where it shows first" if findings else ""), "", "dynamic"))
    return findings
