"""PSoup-C's Results Structure: each query's own ordered list of results (Sect. 4.3, 5).

PSoup-C maintains results eagerly per query, as the linked lists of the paper: every
batch's matches are appended to the list of every query they satisfy, so an invocation
is two binary searches and a slice, independent of the window's size, while ingest pays
for the per-query maintenance (Fig. 9). The list holds the query's results over the whole
retention, not only its window at the last invocation, so that invoking at any `now`,
including one in the past, stays exact; positions below the retention horizon are
trimmed the next time the list is read.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from psoup.query.model import Source
from psoup.results.base import ResultsStructure, Snapshot
from psoup.stems.data_stem import DataSteM
from psoup.stems.span import Span


class CompleteResults(ResultsStructure):
    """Per-query sorted position lists.

    Example:
        >>> rs = CompleteResults()
        >>> rs.on_insert("R", 10, np.array([[1], [2], [3]], dtype="<u8"), {})
        >>> rs.positions(1, "R").tolist()
        [11, 12]
    """

    def __init__(self) -> None:
        self._lists: dict[int, list[np.ndarray]] = {}
        self._horizons: dict[str, int] = {}

    def on_insert(self, stream: str, p0: int, bits: np.ndarray,
                  batch: Mapping[str, np.ndarray]) -> None:
        """Append each row's position to the lists of the slots it matched.
        O(n * words + matches + slots matched)."""
        live = np.flatnonzero(bits.any(axis=0))
        if len(live) == 0:
            return
        flags = np.unpackbits(np.ascontiguousarray(bits[:, live]).view(np.uint8),
                              axis=1, bitorder="little")
        cols, rows = np.nonzero(flags.T)
        if len(cols) == 0:
            return
        starts = np.flatnonzero(np.r_[True, cols[1:] != cols[:-1]])
        slot_of_col = (live[:, None] * 64 + np.arange(64)).ravel()
        for start, end in zip(starts, np.r_[starts[1:], len(cols)], strict=True):
            slot = int(slot_of_col[cols[start]])
            self._lists.setdefault(slot, []).append(rows[start:end].astype(np.int64) + p0)

    def on_register(self, slot: int, stream: str, positions: np.ndarray) -> None:
        self._lists[slot] = [positions.astype(np.int64, copy=False)]

    def on_unregister(self, slot: int) -> None:
        self._lists.pop(slot, None)

    def on_expire(self, stream: str, horizon: int) -> None:
        self._horizons[stream] = horizon

    def on_drop(self, stream: str) -> None:
        self._horizons.pop(stream, None)

    def streams(self) -> set[str]:
        return set(self._horizons)

    def positions(self, slot: int, stream: str) -> np.ndarray:
        """The query's retained results, consolidated into one sorted array."""
        pieces = self._lists.get(slot)
        if not pieces:
            return np.empty(0, np.int64)
        arr = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        horizon = self._horizons.get(stream, 0)
        if len(arr) and arr[0] < horizon:
            arr = arr[np.searchsorted(arr, horizon):]
        self._lists[slot] = [arr]
        return arr

    def matches(self, slot: int, source: Source, stem: DataSteM, span: Span) -> np.ndarray:
        return span.pick(self.positions(slot, source.stream))

    def snapshot(self, slot: int, source: Source, span: Span) -> Snapshot | None:
        """The query's list as it is now (consolidated here, under the lock): a batch
        later appends a new piece, never changes this one. O(1), or O(list) to
        consolidate the pieces since the last read (as `positions`)."""
        return _ListCut(self.positions(slot, source.stream))

    def image(self) -> tuple[dict[int, list[np.ndarray]], dict[str, int]]:
        """(slot -> its list's pieces, stream -> horizon), copies of the containers only:
        the pieces are never written once appended. A checkpoint's cut, O(slots)."""
        return {slot: list(pieces) for slot, pieces in self._lists.items()}, dict(self._horizons)

    def restore(self, lists: Mapping[int, np.ndarray], horizons: Mapping[str, int]) -> None:
        """Take back the lists and horizons of a checkpoint. O(slots)."""
        self._lists.update({slot: [positions] for slot, positions in lists.items()})
        self._horizons.update(horizons)

    def admission_bytes(self, words: int, rows: int) -> int:
        """A position (8 bytes) per retained tuple the new query may match."""
        return 8 * rows

    def nbytes(self) -> int:
        return sum(p.nbytes for pieces in self._lists.values() for p in pieces)

    def _check(self) -> None:
        """Assert the structure's invariants (for tests): each list is increasing."""
        for pieces in self._lists.values():
            arr = np.concatenate(pieces) if pieces else np.empty(0, np.int64)
            assert (np.diff(arr) > 0).all(), "a query's results are in position order"


class _ListCut(Snapshot):
    """A query's positions at a cut (`CompleteResults.snapshot`)."""

    __slots__ = ("positions",)

    def __init__(self, positions: np.ndarray):
        self.positions = positions

    def matches(self, slot: int, source: Source, stem: DataSteM, span: Span) -> np.ndarray:
        return span.pick(self.positions)
