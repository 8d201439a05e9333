"""Which ops ``patch(ops=...)`` can replace, and the selection it was given. TF-free, so that
``patch()`` can check its arguments before TensorFlow loads (``rebinding.TABLE`` has the targets)."""

from __future__ import annotations

REPLACEABLE_OPS = (
    "unsorted_segment_sum", "unsorted_segment_mean", "unsorted_segment_sqrt_n", "segment_sum", "segment_mean",
    "bias_add", "softmax_cross_entropy_with_logits", "sparse_softmax_cross_entropy_with_logits", "bincount",
    "sparse_dense_matmul", "gather", "embedding_lookup", "resize_nearest_neighbor", "crop_and_resize",
)


def select_ops(ops: object) -> tuple[str, ...]:
    """The op names selected by ``patch(ops=...)``: True means all, False none, else a list of names."""
    if ops is True:
        return REPLACEABLE_OPS
    if ops is False or ops is None:
        return ()
    if isinstance(ops, str) or not isinstance(ops, (list, tuple, set, frozenset)):
        raise TypeError(f"ops must be True, False or a list of op names; got {ops!r}")
    unknown = [name for name in ops if name not in REPLACEABLE_OPS]
    if unknown:
        raise ValueError(f"unknown op(s) {unknown}; tfrepro.ops replaces: {', '.join(REPLACEABLE_OPS)}")
    return tuple(name for name in REPLACEABLE_OPS if name in ops)
