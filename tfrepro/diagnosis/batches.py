"""The one batch a diagnosis runs on, taken from whatever ``Model.fit`` accepts and handed to
``train_step`` as ``fit`` hands it, and the model made ready for it as ``fit`` would (built,
optimizer and metrics created)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tfrepro import _tf
from tfrepro.diagnosis import pipelines
from tfrepro.diagnosis.findings import Finding

DEFAULT_BATCH_SIZE = 32  # Keras's default for fit


@dataclass
class Batch:
    """One batch ``(x, y, sample_weight)`` as tensors, ``element`` as ``train_step`` receives it, the
    ``tf.data.Dataset`` it came from (if any) with its graph, and what reading it could not leave as
    it was (``findings``)."""

    x: Any
    y: Any = None
    sample_weight: Any = None
    dataset: Any = None
    element: Any = None
    dataset_graph: Any = None
    findings: list[Finding] = field(default_factory=list)

    def data(self) -> Any:
        """The batch as ``fit`` hands it to ``train_step``: a dataset's or Sequence's element as it is;
        for arrays ``x`` alone when there is no ``y`` (a tuple ``(x,)`` when ``x`` is one), else
        ``(x, y)`` or ``(x, y, sample_weight)``."""
        if self.element is not None:
            return self.element
        if self.y is None:  # what keras.utils.pack_x_y_sample_weight does (not in Keras 2.12's keras.utils)
            return (self.x,) if isinstance(self.x, (list, tuple)) else self.x
        return (self.x, self.y) if self.sample_weight is None else (self.x, self.y, self.sample_weight)


def _unpack(element: Any) -> tuple[Any, Any, Any]:
    if isinstance(element, tuple) and 1 <= len(element) <= 3:
        return (*element, *(None,) * (3 - len(element)))  # type: ignore[return-value]
    return element, None, None


def first_batch(x: Any, y: Any = None, sample_weight: Any = None, batch_size: int | None = None) -> Batch:
    """The first batch of ``x`` (and ``y``, ``sample_weight``) as ``fit`` would see it.

    ``x`` may be arrays or tensors (a dict or list of them too), a ``tf.data.Dataset`` (its first
    element), a ``keras.utils.Sequence``/``PyDataset`` (item 0), or an iterator (one element is
    consumed). Arrays are cut to ``batch_size`` rows (default 32, as ``fit``); a dataset's element is
    already a batch. A dataset is read through a copy of its graph with seed generators of its own
    (``pipelines.detached_copy``), so its reshuffle and ``Dataset.random`` counters stay where they
    were and the training that follows sees what it would have seen; where that cannot hold (no
    copy, or functions that change state outside the dataset) ``findings`` say so. Raises
    ``ValueError`` for empty data or mismatched arguments.
    """
    tf = _tf.import_tf()
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
    if x is None:
        raise ValueError("x is None: pass the inputs of one batch (arrays, tensors, a tf.data.Dataset, a Sequence)")
    dataset = graph = None
    findings: list[Finding] = []
    if isinstance(x, tf.data.Dataset):
        dataset = x
        reader, graph, findings = pipelines.detached_copy(x)
        element = next(iter(reader.take(1)), None)
        if element is None:
            raise ValueError("the dataset is empty: there is no batch to diagnose")
        x, y2, w2 = _unpack(element)
    elif hasattr(x, "__getitem__") and hasattr(x, "__len__") and type(x).__name__ != "ndarray" and \
            any(cls.__name__ in ("Sequence", "PyDataset") for cls in type(x).__mro__):
        if len(x) == 0:
            raise ValueError(f"the {type(x).__name__} is empty: there is no batch to diagnose")
        element = x[0]
        x, y2, w2 = _unpack(element)
    elif hasattr(x, "__next__"):
        try:
            element = next(x)
            x, y2, w2 = _unpack(element)
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
    batch = Batch(convert(x), convert(y2 if y2 is not None else y), convert(w2 if w2 is not None else sample_weight),
                  dataset, dataset_graph=graph, findings=findings)
    if y is None and sample_weight is None:
        batch.element = convert(element)  # as fit hands it over, structure and all
    return batch


def prepare(model: Any, batch: Batch) -> None:
    """Build what ``fit`` builds before its first step, the way ``fit`` builds it: Keras 3 builds
    the model, its metrics and its optimizer symbolically (so initial weights come out as in
    ``fit``); Keras 2 builds them when the train step is first traced, which the scan does."""
    if getattr(model, "optimizer", None) is None:
        raise ValueError("the model is not compiled: call model.compile(optimizer, loss) first, as fit needs")
    # Keras 3's own pre-fit build (no public name; `_maybe_symbolic_build` from 3.4, under a strategy too).
    build = getattr(model, "_maybe_symbolic_build", None) or getattr(model, "_symbolic_build", None)
    if build is not None:
        build(data_batch=batch.data())
