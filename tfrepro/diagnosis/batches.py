"""The one batch a diagnosis runs on, taken from whatever ``Model.fit`` accepts, and the model made
ready for it as ``fit`` would (built, optimizer and metrics created)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tfrepro import _tf

DEFAULT_BATCH_SIZE = 32  # Keras's default for fit


@dataclass
class Batch:
    """One batch ``(x, y, sample_weight)`` as tensors, and the ``tf.data.Dataset`` it came from (if any)."""

    x: Any
    y: Any = None
    sample_weight: Any = None
    dataset: Any = None

    def data(self) -> tuple[Any, ...]:
        """The batch as ``train_step`` receives it: ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)``."""
        if self.sample_weight is not None:
            return self.x, self.y, self.sample_weight
        return (self.x,) if self.y is None else (self.x, self.y)


def _unpack(element: Any) -> tuple[Any, Any, Any]:
    if isinstance(element, tuple) and 1 <= len(element) <= 3:
        return (*element, *(None,) * (3 - len(element)))  # type: ignore[return-value]
    return element, None, None


def first_batch(x: Any, y: Any = None, sample_weight: Any = None, batch_size: int | None = None) -> Batch:
    """The first batch of ``x`` (and ``y``, ``sample_weight``) as ``fit`` would see it.

    ``x`` may be arrays or tensors (a dict or list of them too), a ``tf.data.Dataset`` (its first
    element), a ``keras.utils.Sequence``/``PyDataset`` (item 0), or an iterator (one element is
    consumed). Arrays are cut to ``batch_size`` rows (default 32, as ``fit``); a dataset's element is
    already a batch. Raises ``ValueError`` for empty data or mismatched arguments.
    """
    tf = _tf.import_tf()
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
    if x is None:
        raise ValueError("x is None: pass the inputs of one batch (arrays, tensors, a tf.data.Dataset, a Sequence)")
    dataset = None
    if isinstance(x, tf.data.Dataset):
        dataset = x
        element = next(iter(x.take(1)), None)
        if element is None:
            raise ValueError("the dataset is empty: there is no batch to diagnose")
        x, y2, w2 = _unpack(element)
    elif hasattr(x, "__getitem__") and hasattr(x, "__len__") and type(x).__name__ != "ndarray" and \
            any(cls.__name__ in ("Sequence", "PyDataset") for cls in type(x).__mro__):
        if len(x) == 0:
            raise ValueError(f"the {type(x).__name__} is empty: there is no batch to diagnose")
        x, y2, w2 = _unpack(x[0])
    elif hasattr(x, "__next__"):
        try:
            x, y2, w2 = _unpack(next(x))
        except StopIteration:
            raise ValueError("the iterator is exhausted: there is no batch to diagnose") from None
    else:
        size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        rows = tf.nest.flatten(x)
        if not rows or not all(getattr(a, "shape", None) and len(a.shape) for a in rows):
            raise ValueError(f"x must be arrays or tensors with a batch dimension (a dict or list of them too), a "
                             f"tf.data.Dataset, a Sequence or an iterator; got {type(x).__name__} "
                             f"{str(x)[:60]!r}")
        if len(rows[0]) == 0:
            raise ValueError("x is empty: there is no batch to diagnose")
        take = lambda structure: None if structure is None else tf.nest.map_structure(  # noqa: E731
            lambda a: tf.convert_to_tensor(a[:size]), structure)
        return Batch(take(x), take(y), take(sample_weight))
    if (y is not None or sample_weight is not None) and (y2 is not None or w2 is not None):
        raise ValueError("y/sample_weight given twice: the dataset or Sequence already yields (x, y) pairs")
    convert = lambda structure: None if structure is None else tf.nest.map_structure(  # noqa: E731
        tf.convert_to_tensor, structure)
    return Batch(convert(x), convert(y2 if y2 is not None else y), convert(w2 if w2 is not None else sample_weight),
                 dataset)


def prepare(model: Any, batch: Batch) -> None:
    """Build what ``fit`` builds before its first step, the way ``fit`` builds it: Keras 3 builds
    the model, its metrics and its optimizer symbolically (so initial weights come out as in
    ``fit``); Keras 2 builds them when the train step is first traced, which the scan does."""
    if getattr(model, "optimizer", None) is None:
        raise ValueError("the model is not compiled: call model.compile(optimizer, loss) first, as fit needs")
    # Keras 3's own pre-fit build (no public name; `_maybe_symbolic_build` from 3.4, under a strategy too).
    build = getattr(model, "_maybe_symbolic_build", None) or getattr(model, "_symbolic_build", None)
    if build is not None:
        build(data_batch=(batch.x, batch.y, batch.sample_weight))
