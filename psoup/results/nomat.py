"""NoMat: no materialization; each invocation runs the query (PSoup Sect. 5).

The baseline the paper measures PSoup against: ingest only stores data, registration
only stores the query, and an invocation probes the Data SteM with the query's factors
over the window, using the same value indices as a new query does.
"""

from __future__ import annotations

import numpy as np

from psoup.query.model import Source
from psoup.results.base import ResultsStructure, Span
from psoup.stems.data_stem import DataSteM


class NoMatResults(ResultsStructure):
    """Keeps nothing; `matches` evaluates the query over the window.

    Example:
        >>> NoMatResults().materializes
        False
    """

    materializes = False

    def matches(self, slot: int, source: Source, stem: DataSteM, span: Span) -> np.ndarray:
        if isinstance(span, tuple):
            return stem.probe(source, *span)
        return stem.filter(source, span)
