"""The live-comparison piece of ``ReproducibilityCallback``: each new record against the
reference trace's record at the same position."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfrepro.errors import NotComparableError, warn
from tfrepro.proof.comparison import Divergence, find_difference, model_mismatch
from tfrepro.proof.traces import Trace


class LiveComparator:
    """Compares a run's records, as they come, with ``reference``'s. Raises NotComparableError
    for a model whose variables differ from the reference's. A reference or run that ends first
    is not a divergence: it is noted (``notes``, with a ``ReproducibilityWarning``) and comparing stops."""

    def __init__(self, reference: Trace, variables: Sequence[dict[str, Any]]):
        mismatch = model_mismatch(reference.variables, variables)
        if mismatch:
            raise NotComparableError(mismatch)
        self.reference = reference
        self.variables = variables
        self.notes: list[str] = []
        self._index = 0
        self._done = False

    def check(self, record: dict[str, Any]) -> Divergence | None:
        """The divergence of ``record`` from the reference, or None."""
        if self._done:
            return None
        if self._index >= len(self.reference):
            self._note(f"the reference ends after {len(self.reference)} records; the rest of this run is not "
                       "compared")
            return None
        expected = self.reference.records[self._index]
        self._index += 1
        divergence = find_difference(self.variables, record, expected)
        if divergence is not None and divergence.kind == "length":
            first = "run" if record["type"] == "end" else "reference"
            self._note(f"the {first} ended first, after {self._index - 1} identical records; the rest was not "
                       "compared")
            return None
        return divergence

    def _note(self, message: str) -> None:
        self._done = True
        self.notes.append(message)
        warn(message)
