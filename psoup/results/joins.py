"""The Results Structure of join queries (PSoup Sect. 4.3).

An entry is a combination of tuples, one per FROM item, kept as their positions in
their streams, together with the earliest and the latest of their timestamps; entries
are ordered by the earliest, which is the one a window's lower edge tests (the paper's
argument: END is usually NOW and filters nothing). An invocation keeps the entries whose
every tuple lies in its item's window.

Each join query has its own entries. Expiry is lazy: an entry whose tuple of some stream
fell below that stream's retention horizon is dropped the next time the query's entries
are read. Materializing modes differ in when entries are ordered: `eager=True` (PSoup-C)
merges new entries into order as they arrive, `eager=False` (PSoup-P) appends them and
orders them at the next invocation.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from psoup.results.base import Span
from psoup.stems.data_stem import DataSteM


class Combinations:
    """Entries of one join query: positions (m, k) with earliest and latest ts."""

    __slots__ = ("positions", "earliest", "latest", "ordered")

    def __init__(self, positions: np.ndarray, earliest: np.ndarray, latest: np.ndarray,
                 ordered: bool = False):
        self.positions = positions
        self.earliest = earliest
        self.latest = latest
        self.ordered = ordered

    def __len__(self) -> int:
        return len(self.earliest)

    @classmethod
    def empty(cls, k: int) -> "Combinations":
        return cls(np.empty((0, k), np.int64), np.empty(0), np.empty(0), True)

    def take(self, keep: np.ndarray) -> "Combinations":
        return Combinations(self.positions[keep], self.earliest[keep], self.latest[keep],
                            self.ordered)


def stamped(positions: np.ndarray, stems: Sequence[DataSteM]) -> Combinations:
    """Entries for combinations, with their earliest and latest ts looked up."""
    if positions.shape[0] == 0:
        return Combinations.empty(len(stems))
    ts = np.column_stack([stem.gather("ts", positions[:, i]) for i, stem in enumerate(stems)])
    return Combinations(positions, ts.min(axis=1), ts.max(axis=1))


def in_windows(entries: Combinations, spans: Sequence[Span],
               stems: Sequence[DataSteM] = ()) -> Combinations:
    """The entries whose every tuple lies in its FROM item's span.

    With the stems and entries in order, the entries older than every window are skipped
    by one binary search first: an entry inside the windows has its earliest ts at or
    after the oldest ts any window starts at (Sect. 4.3's reason to order by it).
    """
    if stems and entries.ordered and len(entries):
        starts = [(span[0] if span[0] < span[1] else None) if isinstance(span, tuple)
                  else (int(span[0]) if len(span) else None) for span in spans]
        if any(p is None or p >= stem.n for p, stem in zip(starts, stems)):
            return Combinations.empty(len(spans))
        oldest = min(stem.ts_at(max(p, stem.horizon)) for p, stem in zip(starts, stems))
        cut = int(np.searchsorted(entries.earliest, oldest, "left"))
        if cut:
            entries = entries.take(slice(cut, None))
    keep = np.ones(len(entries), dtype=bool)
    for i, span in enumerate(spans):
        column = entries.positions[:, i]
        if isinstance(span, tuple):
            keep &= (column >= span[0]) & (column < span[1])
        else:
            keep &= np.isin(column, span)
    return entries.take(keep)


def ordered(entries: Combinations, stems: Sequence[DataSteM]) -> Combinations:
    """The entries sorted by earliest ts, then by the tuples' positions in FROM order
    (tupleIDs grow with positions), which is the order of a join's answer."""
    if entries.ordered or len(entries) < 2:
        entries.ordered = True
        return entries
    keys = [entries.positions[:, i] for i in reversed(range(entries.positions.shape[1]))]
    by = np.lexsort(keys + [entries.earliest])
    out = entries.take(by)
    out.ordered = True
    return out


class JoinResults:
    """Materialized entries per join query (PSoup-P and PSoup-C).

    Example:
        >>> jr = JoinResults()
        >>> jr.add(7, Combinations(np.array([[0, 1]]), np.array([1.0]), np.array([2.0])))
        >>> len(jr.entries(7, []))
        1
    """

    def __init__(self, eager: bool = False):
        self.eager = eager
        self._blocks: dict[int, list[Combinations]] = {}
        self._checked: dict[int, tuple[int, ...]] = {}   # horizons at the last read

    def set(self, jid: int, entries: Combinations) -> None:
        """A new query's entries over the retained data (Fig. 4, step 6)."""
        self._blocks[jid] = [entries]
        self._checked.pop(jid, None)

    def add(self, jid: int, entries: Combinations, stems: Sequence[DataSteM] = ()) -> None:
        """Entries a new batch produced (Fig. 5). PSoup-C merges them into order now."""
        if not len(entries):
            return
        blocks = self._blocks.setdefault(jid, [])
        blocks.append(entries)
        self._checked.pop(jid, None)
        if self.eager and stems:
            self._blocks[jid] = [ordered(_concat(blocks), stems)]

    def drop(self, jid: int) -> None:
        self._blocks.pop(jid, None)
        self._checked.pop(jid, None)

    def entries(self, jid: int, stems: Sequence[DataSteM]) -> Combinations:
        """The query's live entries in answer order (expired ones dropped). O(m log m)
        when entries arrived since the last read, O(m) otherwise."""
        blocks = self._blocks.get(jid)
        if not blocks:
            return Combinations.empty(len(stems))
        horizons = tuple(stem.horizon for stem in stems)
        if len(blocks) == 1 and self._checked.get(jid) == horizons:
            return blocks[0]                     # nothing arrived or expired since
        entries = blocks[0] if len(blocks) == 1 else _concat(blocks)
        if stems:
            live = (entries.positions >= np.array(horizons)).all(axis=1)
            if not live.all():
                entries = entries.take(live)
            entries = ordered(entries, stems)
            self._checked[jid] = horizons
        self._blocks[jid] = [entries]
        return entries

    def count(self, jid: int) -> int:
        return sum(len(b) for b in self._blocks.get(jid, ()))

    def nbytes(self) -> int:
        return sum(b.positions.nbytes + b.earliest.nbytes + b.latest.nbytes
                   for blocks in self._blocks.values() for b in blocks)


def _concat(blocks: list[Combinations]) -> Combinations:
    return Combinations(np.concatenate([b.positions for b in blocks]),
                        np.concatenate([b.earliest for b in blocks]),
                        np.concatenate([b.latest for b in blocks]))
