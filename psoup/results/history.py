"""The archive tier of the Results Structure: a query's matches among tuples that left
memory ("Remembrance of Streams Past", hybrid queries over archived and live data).

A query gets a tier when its history is evaluated (`Engine.evaluate_history`): a Spark
pass over the archive (psoup.spark.history) finds its matches among archived tuples,
and the tuples between the oldest one still held in memory and the retention horizon
are probed on the spot. From then on the tier grows with the horizon: the tuples that
leave retention are probed before they can be dropped, and the query's matches among
them are appended. So at every moment the tier holds exactly the query's matches with
tupleID below the stream's horizon, and memory the ones at or above it: an answer that
joins the two counts no tuple twice and misses none.

Matches are kept in tupleID (hence ts) order as column arrays, appended in blocks and
consolidated at the next read; a window selects a ts range of them by binary search.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from psoup.query.model import TS, TUPLE_ID


class Tier:
    """One query's archived matches: `columns` (every stream column, ts and tupleID
    included) in tupleID order.

    Example:
        >>> t = Tier()
        >>> t.append({"ts": np.array([1.0, 2.0]), "tupleID": np.array([4, 9]),
        ...           "a": np.array([7, 8])})
        >>> t.between(1.5, 3.0)["a"].tolist(), len(t)
        ([8], 2)
    """

    def __init__(self):
        self._blocks: list[dict[str, np.ndarray]] = []
        self._merged: dict[str, np.ndarray] | None = None

    def append(self, columns: Mapping[str, np.ndarray]) -> None:
        """Matches with tupleIDs above every stored one."""
        if len(columns[TUPLE_ID]):
            self._blocks.append(dict(columns))
            self._merged = None

    @property
    def columns(self) -> dict[str, np.ndarray]:
        if self._merged is None:
            if len(self._blocks) == 1:
                self._merged = self._blocks[0]
            elif self._blocks:
                self._merged = {name: np.concatenate([b[name] for b in self._blocks])
                                for name in self._blocks[0]}
                self._blocks = [self._merged]
            else:
                self._merged = {}
        return self._merged

    def between(self, begin: float, end: float) -> dict[str, np.ndarray]:
        """The matches with begin <= ts <= end. O(log n) plus the copy-free slice."""
        columns = self.columns
        if not columns:
            return {}
        a = int(np.searchsorted(columns[TS], begin, side="left"))
        b = int(np.searchsorted(columns[TS], end, side="right"))
        return {name: values[a:b] for name, values in columns.items()}

    def __len__(self) -> int:
        return sum(len(b[TUPLE_ID]) for b in self._blocks)

    def nbytes(self) -> int:
        return sum(v.nbytes for b in self._blocks for v in b.values())
