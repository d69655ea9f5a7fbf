"""What every Results Structure implementation offers the eddy and the engine.

PSoup materializes the query-data join so that an invocation is a lookup (Sect. 3.3).
The three engine modes differ only in what they keep here (Sect. 5):

* PSoup-P (`partial.py`): a bitmap per FROM list, rows by physicalID, columns by query;
* PSoup-C (`complete.py`): each query's own ordered list of the tuples that satisfied it;
* NoMat (`nomat.py`): nothing; the query runs over the Data SteM at invocation.

A *span* is what a resolved window selects in one stream: either a position range
`(p0, p1)` or a sorted array of positions (PARTITION BY windows).
"""

from __future__ import annotations

from typing import Union

import numpy as np

from psoup.query.model import Source
from psoup.stems.data_stem import DataSteM

Span = Union[tuple, np.ndarray]


class ResultsStructure:
    """The interface; the default methods are those of a structure that keeps nothing."""

    #: Whether the eddy must join new data with the queries and new queries with the data.
    materializes = True

    def on_insert(self, stream: str, p0: int, bits: np.ndarray) -> None:
        """Record a batch's Query SteM probe: bit q of bits[i] set = tuple p0+i matches q."""

    def on_register(self, slot: int, stream: str, positions: np.ndarray) -> None:
        """Record a new query's Data SteM probe: the retained positions it matches."""

    def on_unregister(self, slot: int, stream: str) -> None:
        """Forget everything about `slot`; the slot may be reused."""

    def expire(self, stream: str, horizon: int) -> None:
        """Positions below `horizon` left retention (whole chunks may be released)."""

    def matches(self, slot: int, source: Source, stem: DataSteM, span: Span) -> np.ndarray:
        """Sorted positions within `span` of the tuples that satisfy query `slot`."""
        raise NotImplementedError

    def nbytes(self) -> int:
        return 0


def span_bounds(span: Span) -> tuple[int, int]:
    """The smallest position range covering `span`."""
    if isinstance(span, tuple):
        return span
    return (int(span[0]), int(span[-1]) + 1) if len(span) else (0, 0)
