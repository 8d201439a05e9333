"""Attach a ``ReproducibilityCallback`` to every ``Model.fit`` call, for scripts that know nothing of it.

Used by ``tfrepro check`` (through the launcher's bootstrap) and by ``tfrepro.verify``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tfrepro import _tf


@contextlib.contextmanager
def record_fits(directory: str | Path, prefix: str = "fit", **callback_options: Any) -> Iterator[list[Path]]:
    """While active, every ``Model.fit`` of the Keras in use writes a trace ``DIRECTORY/PREFIX-K.jsonl``
    (K = 0, 1, ... per fit call). Yields the list of trace paths, which grows as fits run."""
    from tfrepro.proof.callback import ReproducibilityCallback  # imports Keras: only when recording

    model_class = _tf.keras_module().Model
    original = model_class.fit
    signature = inspect.signature(original)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        path = directory / f"{prefix}-{len(paths)}.jsonl"
        paths.append(path)
        callbacks = list(bound.arguments.get("callbacks") or [])
        bound.arguments["callbacks"] = [*callbacks, ReproducibilityCallback(trace=path, **callback_options)]
        return original(*bound.args, **bound.kwargs)

    model_class.fit = fit
    try:
        yield paths
    finally:
        model_class.fit = original
