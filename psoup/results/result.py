"""The answer of one invocation: projected, optionally DISTINCT rows (PSoup Sect. 3.3).

Projection and duplicate elimination happen here, just in time, on the tuples fetched
from the Data SteMs; rows are in physicalID (ts) order, then tupleID.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np


class Result:
    """Rows of one invocation.

    Attributes:
        columns: the output column names.
        rows: one tuple per result row, values as Python scalars.
        ts: one timestamp per row (numpy float64).
        tuple_ids: the tupleID of each row (numpy int64).

    Example:
        >>> r = Result(["a"], [(1,), (2,)], np.array([5.0, 6.0]), np.array([1, 2]))
        >>> len(r), r.to_dicts()
        (2, [{'a': 1}, {'a': 2}])
    """

    def __init__(self, columns: list[str], rows: list[tuple], ts: np.ndarray,
                 tuple_ids: np.ndarray):
        self.columns = columns
        self.rows = rows
        self.ts = ts
        self.tuple_ids = tuple_ids

    @classmethod
    def build(cls, columns: list[str], values: list[np.ndarray], ts: np.ndarray,
              tuple_ids: np.ndarray, distinct: bool) -> "Result":
        """Assemble rows from projected column arrays; DISTINCT keeps each row's first
        occurrence (and its ts)."""
        rows = list(zip(*(v.tolist() for v in values))) if values else []
        if distinct and rows:
            seen: dict[tuple, int] = {}
            for i, row in enumerate(rows):
                seen.setdefault(row, i)
            keep = np.fromiter(seen.values(), dtype=np.int64, count=len(seen))
            rows = list(seen.keys())
            ts, tuple_ids = ts[keep], tuple_ids[keep]
        return cls(columns, rows, ts, tuple_ids)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[tuple]:
        return iter(self.rows)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def __repr__(self) -> str:
        return f"Result(columns={self.columns}, rows={len(self.rows)})"
