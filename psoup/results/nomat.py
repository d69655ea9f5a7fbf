"""NoMat: no materialization; each invocation runs the query (PSoup Sect. 5).

The baseline the paper measures PSoup against: ingest only stores data, registration
only stores the query, and an invocation probes the Data SteM with the query's factors
over the window, using the same value indices as a new query does.
"""

from __future__ import annotations

import numpy as np

from psoup.query.model import Source
from psoup.results.base import ResultsStructure, Snapshot
from psoup.stems.data_stem import DataSteM
from psoup.stems.span import Span


class NoMatResults(ResultsStructure):
    """Keeps nothing; `matches` evaluates the query over the window.

    Example:
        >>> from psoup.query.model import StreamSchema, Window
        >>> stem = DataSteM(StreamSchema("R", (("a", "int"),)))
        >>> NoMatResults().matches(0, Source("R", "R", Window()), stem, Span.range(0, 0))
        array([], dtype=int64)
    """

    def matches(self, slot: int, source: Source, stem: DataSteM, span: Span) -> np.ndarray:
        return stem.probe(source, span)

    def snapshot(self, slot: int, source: Source, span: Span) -> Snapshot | None:
        """Nothing to hold: the probe reads the Data SteM's snapshot."""
        return _Probe()

    def nbytes(self) -> int:
        return 0


class _Probe(Snapshot):
    """NoMat's find at a cut: the query evaluated over the snapshot's window."""

    __slots__ = ()

    def matches(self, slot: int, source: Source, stem: DataSteM, span: Span) -> np.ndarray:
        return stem.probe(source, span)
