"""The Results Structure of join queries (PSoup Sect. 4.3).

An entry is a combination of tuples, one per FROM item, kept as their positions in
their streams, together with the earliest and the latest of their timestamps; entries
are ordered by the earliest, which is the one a window's lower edge tests (the paper's
argument: END is usually NOW and filters nothing). An invocation keeps the entries whose
every tuple lies in its item's window.

As in the paper, there is one structure per FROM list, not per query: join queries over
the same streams with the same join factors form a *group* (psoup.results.join_groups),
and an entry carries a bitmap row with a bit per member query (those whose local factors
all its tuples satisfy). A combination is stored once however many members it satisfies;
a query's view is the entries with its bit set, cached until the structure changes.

Expiry is lazy: an entry whose tuple of some stream fell below that stream's retention
horizon is dropped the next time the group's entries are read. Materializing modes
differ in when entries are ordered: `eager=True` (PSoup-C) merges new entries into
order as they arrive, `eager=False` (PSoup-P) appends them and orders them at the next
invocation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from psoup.bits import bit_of, set_bit, widened
from psoup.stems.data_stem import DataSteM
from psoup.stems.span import Span


class Combinations:
    """Join entries: positions (m, k) with earliest and latest ts, and optionally the
    members' bits (m, words) of a group's structure."""

    __slots__ = ("positions", "earliest", "latest", "ordered", "bits")

    def __init__(self, positions: np.ndarray, earliest: np.ndarray, latest: np.ndarray,
                 ordered: bool = False, bits: np.ndarray | None = None):
        self.positions = positions
        self.earliest = earliest
        self.latest = latest
        self.ordered = ordered
        self.bits = bits

    def __len__(self) -> int:
        return len(self.earliest)

    @classmethod
    def empty(cls, k: int) -> Combinations:
        return cls(np.empty((0, k), np.int64), np.empty(0), np.empty(0), True)

    def take(self, keep: np.ndarray | slice) -> Combinations:
        return Combinations(self.positions[keep], self.earliest[keep], self.latest[keep],
                            self.ordered, None if self.bits is None else self.bits[keep])


def stamped(positions: np.ndarray, stems: Sequence[DataSteM]) -> Combinations:
    """Entries for combinations, with their earliest and latest ts looked up."""
    if positions.shape[0] == 0:
        return Combinations.empty(len(stems))
    ts = np.column_stack([stem.column("ts", positions[:, i], any_order=True)
                          for i, stem in enumerate(stems)])
    return Combinations(positions, ts.min(axis=1), ts.max(axis=1))


def in_windows(entries: Combinations, spans: Sequence[Span],
               stems: Sequence[DataSteM] = ()) -> Combinations:
    """The entries whose every tuple lies in its FROM item's span.

    With the stems and entries in order, the entries older than every window are skipped
    by one binary search first: an entry inside the windows has its earliest ts at or
    after the oldest ts any window starts at (Sect. 4.3's reason to order by it).
    """
    if stems and entries.ordered and len(entries):
        starts: list[int] = []
        for span, stem in zip(spans, stems, strict=True):
            p = span.first()
            if p is None or p >= stem.n:
                return Combinations.empty(len(spans))
            starts.append(p)
        oldest = min(stem.ts_at(max(p, stem.horizon))
                     for p, stem in zip(starts, stems, strict=True))
        cut = int(np.searchsorted(entries.earliest, oldest, "left"))
        if cut:
            entries = entries.take(slice(cut, None))
    keep = np.ones(len(entries), dtype=bool)
    for i, span in enumerate(spans):
        keep &= span.contains(entries.positions[:, i])
    return entries.take(keep)


def ordered(entries: Combinations) -> Combinations:
    """The entries sorted by earliest ts, then by the tuples' positions in FROM order
    (tupleIDs grow with positions), which is the order of a join's answer. Entries with
    bits that name the same combination are merged into one, their bits OR-ed."""
    if entries.ordered or len(entries) < 2:
        entries.ordered = True
        return entries
    keys = [entries.positions[:, i] for i in reversed(range(entries.positions.shape[1]))]
    by = np.lexsort(keys + [entries.earliest])
    out = entries.take(by)
    out.ordered = True
    if out.bits is not None:
        same = (out.positions[1:] == out.positions[:-1]).all(axis=1)
        if same.any():
            starts = np.flatnonzero(np.r_[True, ~same])
            out = Combinations(out.positions[starts], out.earliest[starts],
                               out.latest[starts], True,
                               np.bitwise_or.reduceat(out.bits, starts, axis=0))
    return out


class JoinEntries:
    """One group's materialized entries (PSoup-P and PSoup-C): blocks of combinations as
    they arrive, consolidated, ordered and trimmed at the next read.

    Example:
        >>> je = JoinEntries()
        >>> bits = np.array([[0b11], [0b10]], dtype="<u8")
        >>> je.add(Combinations(np.array([[0, 1], [0, 2]]), np.array([1.0, 1.0]),
        ...                     np.array([2.0, 3.0]), bits=bits))
        >>> len(je.entries([])), len(je.member(0, [])), len(je.member(1, []))
        (2, 1, 2)
    """

    def __init__(self, eager: bool = False):
        self.eager = eager
        self._blocks: list[Combinations] = []
        self._checked: tuple[int, ...] | None = None    # horizons at the last read
        self._views: dict[int, Combinations] = {}

    def add(self, entries: Combinations, stems: Sequence[DataSteM] = ()) -> None:
        """Entries with their members' bits: a new batch's (Fig. 5) or a new member's
        over the retained data (Fig. 4). PSoup-C merges them into order now."""
        if not len(entries):
            return
        self._blocks.append(entries)
        self._changed()
        if self.eager and stems:
            self._blocks = [ordered(_concat(self._blocks))]

    def clear(self, index: int) -> None:
        """A member left: clear its bit everywhere, so its index can be reused."""
        word, _ = bit_of(index)
        for block in self._blocks:
            if block.bits is not None and block.bits.shape[1] > word:
                set_bit(block.bits, index, False)
        self._changed()

    def _changed(self) -> None:
        self._checked = None
        self._views = {}

    def entries(self, stems: Sequence[DataSteM]) -> Combinations:
        """The live entries in answer order (expired ones and ones no member wants
        dropped). O(m log m) when entries arrived since the last read, O(k) when nothing
        arrived or expired."""
        if not self._blocks:
            return Combinations.empty(len(stems))
        horizons = tuple(stem.horizon for stem in stems)
        if len(self._blocks) == 1 and self._checked == horizons:
            return self._blocks[0]                     # nothing arrived or expired since
        entries = self._blocks[0] if len(self._blocks) == 1 else _concat(self._blocks)
        # (numpy's stubs type any(axis=1) as bool | array: of 2-d bits it is an array)
        live = cast(np.ndarray, _bits(entries).any(axis=1))
        if stems:
            live &= (entries.positions >= np.array(horizons)).all(axis=1)
        if not live.all():
            entries = entries.take(live)
        entries = ordered(entries)
        self._checked = horizons
        self._views = {}
        self._blocks = [entries]
        return entries

    def member(self, index: int, stems: Sequence[DataSteM]) -> Combinations:
        """The entries of one member query, in answer order."""
        entries = self.entries(stems)
        view = self._views.get(index)
        if view is None:
            word, mask = bit_of(index)
            if entries.bits is None or word >= entries.bits.shape[1]:
                view = Combinations.empty(entries.positions.shape[1])
            else:
                mine = (entries.bits[:, word] & mask) != 0
                view = entries if mine.all() else entries.take(mine)
            self._views[index] = view
        return view

    def __len__(self) -> int:
        return sum(len(b) for b in self._blocks)

    def nbytes(self) -> int:
        return sum(b.positions.nbytes + b.earliest.nbytes + b.latest.nbytes + _bits(b).nbytes
                   for b in self._blocks)


def _concat(blocks: list[Combinations]) -> Combinations:
    words = max(_bits(b).shape[1] for b in blocks)
    bits = [widened(_bits(b), words) for b in blocks]
    return Combinations(np.concatenate([b.positions for b in blocks]),
                        np.concatenate([b.earliest for b in blocks]),
                        np.concatenate([b.latest for b in blocks]), bits=np.concatenate(bits))


def _bits(entries: Combinations) -> np.ndarray:
    """The members' bits of a group's entries (JoinEntries holds only entries with bits)."""
    assert entries.bits is not None, "a group's entries carry their members' bits"
    return entries.bits
