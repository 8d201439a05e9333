"""Attach a callback to every ``Model.fit`` call, for scripts that know nothing of it: a
``ReproducibilityCallback`` for ``tfrepro check`` (through the launcher's bootstrap) and
``tfrepro.verify``, a ``ReproCheckpoint`` for ``tfrepro run --checkpoint``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tfrepro import _tf


@contextlib.contextmanager
def record_fits(directory: str | Path, prefix: str = "fit", **callback_options: Any) -> Iterator[list[Path]]:
    """While active, every ``Model.fit`` of the Keras in use writes a trace ``DIRECTORY/PREFIX-K.jsonl``
    (K = 0, 1, ... per fit call). Yields the list of trace paths, which grows as fits run."""
    from tfrepro.proof.callback import ReproducibilityCallback  # imports Keras: only when recording

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    def add(callbacks: list[Any]) -> Any:
        paths.append(directory / f"{prefix}-{len(paths)}.jsonl")
        return ReproducibilityCallback(trace=paths[-1], **callback_options)

    with each_fit(add):
        yield paths


@contextlib.contextmanager
def each_fit(add: Callable[[list[Any]], Any | None]) -> Iterator[None]:
    """While active, every ``Model.fit`` of the Keras in use calls ``add(callbacks)`` with the
    callbacks it was given, and appends the callback ``add`` returns (None: none)."""

    def handle(original: Callable[..., Any], bound: inspect.BoundArguments) -> Any:
        callbacks = list(bound.arguments.get("callbacks") or [])
        extra = add(callbacks)
        if extra is not None:
            bound.arguments["callbacks"] = [*callbacks, extra]
        return original(*bound.args, **bound.kwargs)

    with intercept_fits(handle):
        yield


@contextlib.contextmanager
def intercept_fits(handle: Callable[[Callable[..., Any], inspect.BoundArguments], Any]) -> Iterator[None]:
    """While active, a ``Model.fit`` call of the Keras in use returns ``handle(original, bound)``:
    ``bound`` holds the call's arguments by name (the model as ``self``), and
    ``original(*bound.args, **bound.kwargs)`` trains."""
    model_class = _tf.keras_module().Model
    original = model_class.fit
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(*args: Any, **kwargs: Any) -> Any:
        return handle(original, signature.bind(*args, **kwargs))

    model_class.fit = fit
    try:
        yield
    finally:
        model_class.fit = original
