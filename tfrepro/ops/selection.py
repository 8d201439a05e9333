"""Which ops ``patch(ops=...)`` can replace, and the selection it was given. TF-free, so that
``patch()`` can check its arguments before TensorFlow loads (``rebinding.TABLE`` has the targets).

``ops="auto"`` (the default) selects what the installed TensorFlow cannot run deterministically on a
GPU, read from ``kernel_facts``, and replaces it with versions built on TF's own sums, which TF runs
deterministically under op determinism ("tf" summation: fast, deterministic, not order-invariant);
``ops=True`` or a list selects tfrepro's order-invariant versions ("exact" summation).
``ops="exact"`` selects the exact tier (``tfrepro.ops.exact``): all of those, plus exact matrix
products, convolutions, pooling, dropout, reductions, cross-entropies and optimizer updates, and
refusals for what it does not cover ("exact_tier" summation).
"""

from __future__ import annotations

from tfrepro.ops import exact, kernel_facts
from tfrepro.ops.exact import refusals

REPLACEABLE_OPS = (
    "unsorted_segment_sum", "unsorted_segment_mean", "unsorted_segment_sqrt_n", "segment_sum", "segment_mean",
    "bias_add", "softmax_cross_entropy_with_logits", "sparse_softmax_cross_entropy_with_logits", "bincount",
    "sparse_dense_matmul", "gather", "embedding_lookup", "resize_nearest_neighbor", "crop_and_resize",
    "fused_batch_norm", "adjust_contrast",
)


def auto_ops(tf_version: str | kernel_facts.Version | None = None) -> dict[str, str]:
    """What ``ops="auto"`` replaces in ``tf_version`` (default: the installed TensorFlow): each op
    that has no deterministic GPU kernel there and that tfrepro can replace, with why."""
    version = kernel_facts.resolve_version(tf_version)
    chosen: dict[str, str] = {}
    for fact in kernel_facts.FACTS:
        behaviour = fact.behaviour(version)
        if fact.replacement and behaviour and fact.replacement not in chosen:
            chosen[fact.replacement] = f"{fact.api} {behaviour} on a GPU in TF {version[0]}.{version[1]}"
    return {name: chosen[name] for name in REPLACEABLE_OPS if name in chosen}


def select_ops(ops: object, tf_version: str | None = None) -> tuple[str, ...]:
    """The op names selected by ``patch(ops=...)``: "auto" what ``auto_ops`` names, True all,
    False none, else a list of names."""
    if ops == "auto":
        return tuple(auto_ops(tf_version)) if (tf_version or kernel_facts.installed_version()) else ()
    if ops == "exact":
        exact_tier = exact.EXACT_OPS + tuple(f"refused {api}" for api in refusals.REFUSED)
        return tuple(name for name in REPLACEABLE_OPS if name not in exact_tier) + exact_tier
    if ops is True:
        return REPLACEABLE_OPS
    if ops is False or ops is None:
        return ()
    if isinstance(ops, str) or not isinstance(ops, (list, tuple, set, frozenset)):
        raise TypeError(f"ops must be 'auto', 'exact', True, False or a list of op names; got {ops!r}")
    unknown = [name for name in ops if name not in REPLACEABLE_OPS]
    if unknown:
        raise ValueError(f"unknown op(s) {unknown}; tfrepro.ops replaces: {', '.join(REPLACEABLE_OPS)}")
    return tuple(name for name in REPLACEABLE_OPS if name in ops)


ON_UNCOVERED = ("raise", "warn")  # patch(on_uncovered=...): what the exact tier's audit does with what it names


def check_on_uncovered(value: object) -> None:
    """Raise ValueError unless ``value`` is one of ``ON_UNCOVERED``."""
    if value not in ON_UNCOVERED:
        raise ValueError(f"on_uncovered must be one of {', '.join(map(repr, ON_UNCOVERED))}; got {value!r}")


def summation_of(ops: object) -> str:
    """How the ops selected by ``ops`` sum: "tf" for "auto", "exact_tier" for "exact", "exact"
    (order-invariant) otherwise."""
    return {"auto": "tf", "exact": "exact_tier"}.get(ops, "exact") if isinstance(ops, str) else "exact"
