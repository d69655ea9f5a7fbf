"""An aggregate index by blocks of positions: what a new aggregated query keeps over its
stream when its groups are few, built at the speed of a scan.

`AggregateIndex` (psoup.results.aggregates) keeps every result: its position, its values
and their prefix sums, so that any position range is answered by binary searches. That
is about 32 bytes written per result, and a registration over millions of retained
tuples is as slow as writing them. `BlockIndex` keeps instead, for each block of 2**k
positions (k = `DataSteM.log_block`, 1,024 positions on the usual chunks) and each
group, the count of its results there, the latest position, the sum of each SUM or AVG
argument and the MIN and MAX of each MIN or MAX argument (`kernels.block_fold`), with
prefix sums of the counts and sums across blocks. A registration scans the matches once
and writes a few cells per block.

A position range [p0, p1) is answered from

* the blocks wholly inside it: counts and sums as differences of two prefix rows, O(G);
  MIN, MAX and the latest position as a reduction over those blocks' cells,
  O(G x blocks), a vectorized pass of 16K cells per group at 16M positions;
* the partial blocks at its two ends: their matches found again by probing the stream
  there (`DataSteM.probe` over at most 2 x 2**k positions) and folded the same way. A
  range that reaches the newest position takes the newest block whole: its cells hold
  every match so far.

So an invocation costs O(G + 2**k) plus the reductions, independent of how many results
the window holds.

Groups: no GROUP BY (one group), or GROUP BY one INT column whose keys span at most
MAX_SPAN values (max - min + 1): group g is the key lo + g, a column of every cell
array. A batch whose keys would widen the span past it raises `SpanExceeded` before
changing anything, and the caller (`AggregateSink`) moves the query to an
AggregateIndex, rebuilt from the stream once. Other queries (several GROUP BY columns,
TEXT, FLOAT or BOOL keys, TEXT or BOOL arguments) use AggregateIndex from the start.

Exactness, as AggregateIndex's. COUNT, MIN, MAX and SUM over INT are exact (SUM from
the 32-bit halves, each an int64 that may wrap, differences taken modulo 2**64). SUM
over FLOAT is compensated: a cell's values are summed with Knuth's TwoSum from zero in
position order, and the blocks' pairs are prefix-summed the same way; the prefix is
re-summed from the oldest live block whenever the storage is compacted. A sum that is
not finite (an infinite value, or an overflow) makes the answer be computed from the
range's rows directly, O(range).

Expiry drops whole blocks from the left (the block the horizon falls in stays: its
retained part is scanned as an edge), amortized O(G) per block: the storage is
compacted once the dead blocks outnumber the live ones.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np

from psoup import kernels
from psoup.query.model import TS, Query, Source
from psoup.results.result import Result
from psoup.stems import halves
from psoup.stems.data_stem import DataSteM
from psoup.stems.span import Span

Column = tuple[int, str]        # (source, column), as Query.group_by and SelectItem name it


class Aggregator(Protocol):
    """What an index by blocks reads of its query's compiled aggregates
    (psoup.results.aggregates.Aggregator, which keeps its indexes and so imports this
    module)."""

    query: Query
    group_by: list[Column]
    sums: list[Column]
    extremes: dict[Column, tuple[str, ...]]
    needed: list[Column]
    _outputs: list[Any]

    def compute(self, values: Mapping[Column, np.ndarray], ts: np.ndarray,
                weights: np.ndarray | None = None) -> Result: ...

    def _result(self, keys: list[tuple[Any, ...]], counts: list[int],
                sums: dict[Column, list[Any]], extremes: dict[tuple[Column, str], list[Any]],
                ts: np.ndarray) -> Result: ...

#: The widest span of GROUP BY keys (max - min + 1) an index by blocks keeps: each key
#: of the span is a column of every block's cells (at 1,024, as many bytes per block as
#: AggregateIndex spends on its 1,024 results), so past it the query moves to an
#: AggregateIndex.
MAX_SPAN = 1024

_MIN_ROWS = 4
#: The first keys' span is guessed from this many first matches (`BlockIndex.fold`).
_SAMPLE = 4096
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
#: An edge scan folds its matches into one block: a shift no position reaches.
_ONE_BLOCK = 62


class _Scratch:
    """One output buffer for registrations' scans, kept between them: a scan writes
    every match's position before it knows how many there are, room for all the
    retained tuples, and faulting in that much fresh memory each time (transparent huge
    pages, compacted on demand) stalled a part of a 16M-tuple scan for 70 ms now and
    then. Taken by one scan at a time; another at once gets a fresh buffer. The
    matches are then copied out, as many as they are."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffer = np.empty(0, np.int64)

    @contextmanager
    def taken(self, size: int) -> Iterator[np.ndarray]:
        """A buffer of at least `size` positions, for the `with` block."""
        if not self._lock.acquire(blocking=False):
            yield np.empty(size, np.int64)
            return
        try:
            if len(self._buffer) < size:
                self._buffer = np.empty(size, np.int64)
            yield self._buffer
        finally:
            self._lock.release()


_SCRATCH = _Scratch()


class SpanExceeded(Exception):
    """New GROUP BY keys would widen an index's span past MAX_SPAN (nothing changed)."""


def wrap_int64(value: int) -> int:
    """`value` wrapped into the int64 range, as numpy's arithmetic would."""
    return (value + 2**63) % 2**64 - 2**63


class _Cells:
    """The cell arrays of one fold: counts and latest positions (blocks x groups),
    then per value column its sums (blocks x groups x 2) and MIN and MAX (blocks x
    groups), an array without rows for what is not kept."""

    def __init__(self, rows: int, width: int, columns: dict[str, tuple[np.dtype, bool,
                                                                       tuple[str, ...]]]):
        self.count = np.zeros((rows, width), np.int64)
        self.last = np.full((rows, width), -1, np.int64)
        self.sums: dict[str, np.ndarray] = {}
        self.mins: dict[str, np.ndarray] = {}
        self.maxs: dict[str, np.ndarray] = {}
        for name, (dtype, summed, ops) in columns.items():
            if summed:
                self.sums[name] = np.zeros((rows, width, 2), dtype)
            if "min" in ops:
                self.mins[name] = np.full((rows, width), _top(dtype), dtype)
            if "max" in ops:
                self.maxs[name] = np.full((rows, width), _bottom(dtype), dtype)
        # the arrays each `fold` pass takes: the counts with the first column only
        none = np.empty((0, 0), np.int64)
        self._calls: list[tuple[str | None, tuple[np.ndarray, ...]]] = []
        for name, (dtype, _, _) in columns.items():
            empty2, empty3 = np.empty((0, 0), dtype), np.empty((0, 0, 2), dtype)
            first = not self._calls
            self._calls.append((name, (self.count if first else none,
                                       self.last if first else none,
                                       self.sums.get(name, empty3),
                                       self.mins.get(name, empty2),
                                       self.maxs.get(name, empty2))))
        if not self._calls:
            self._calls.append((None, (self.count, self.last, np.empty((0, 0, 2)),
                                       np.empty((0, 0)), np.empty((0, 0)))))

    def clear(self) -> None:
        """Every cell back to empty."""
        self.count.fill(0)
        self.last.fill(-1)
        for a in self.sums.values():
            a.fill(0)
        for a in self.mins.values():
            a.fill(_top(a.dtype))
        for a in self.maxs.values():
            a.fill(_bottom(a.dtype))

    def arrays(self) -> list[np.ndarray]:
        return [self.count, self.last, *self.sums.values(), *self.mins.values(),
                *self.maxs.values()]

    def fold(self, stem: DataSteM, positions: np.ndarray, key: str | None, lo: int,
             groups: int, log_b: int, b_first: int) -> int:
        """`DataSteM.fold_blocks` of `positions` into these cells: the counts with the
        first column's values, then one pass per further column. Returns how many
        positions had a key outside the groups lo .. lo + groups - 1 (left out)."""
        outside = 0
        for name, cells in self._calls:
            outside = stem.fold_blocks(positions, key, lo, groups, name, log_b, b_first,
                                       cells)
        return outside


def _scan_cells(cells: _Cells, stem: DataSteM, intervals: tuple[np.ndarray, np.ndarray],
                p0: int, p1: int, out: np.ndarray, key: str | None, lo: int, groups: int,
                log_b: int, b_first: int) -> tuple[int, int]:
    """`DataSteM.scan_fold` of [p0, p1) into `cells` with the first column's values,
    then a `fold` pass per further column: (matches, those left out)."""
    name, arrays = cells._calls[0]
    k, outside = stem.scan_fold(intervals, p0, p1, out, key, lo, groups, name, log_b,
                                b_first, arrays)
    for name, arrays in cells._calls[1:]:
        stem.fold_blocks(out[:k], key, lo, groups, name, log_b, b_first, arrays)
    return k, outside


def _top(dtype: np.dtype) -> int | float:
    return math.inf if dtype.kind == "f" else _INT_MAX


def _bottom(dtype: np.dtype) -> int | float:
    return -math.inf if dtype.kind == "f" else _INT_MIN


class BlockIndex:
    """The aggregates of one single-source aggregated query by blocks of positions
    (see the module docstring): the same `answer(p0, p1)` as AggregateIndex.

    Storage row r holds block b0 + r; rows [first, rows) are live. Memory: O(blocks x
    span) cells; fold O(matches) plus O(span) per block touched; answer O(span x
    (1 + blocks in range)) plus two edge probes of at most a block each.

    Example:
        >>> import psoup
        >>> eng = psoup.Engine(chunk_rows=4)
        >>> eng.execute("CREATE STREAM R (g INT, a INT)")
        >>> _ = eng.insert("R", [(i % 2, i) for i in range(10)], ts=[float(i) for i in range(10)])
        >>> h = eng.register("SELECT g, COUNT(*), SUM(a) FROM R WHERE a > 2 GROUP BY g")
        >>> eng.invoke(h, now=9.0).rows
        [(0, 3, 18), (1, 4, 24)]
    """

    def __init__(self, aggregator: Aggregator, stem: DataSteM, source: Source):
        self.aggregator = aggregator
        #: the stream read for edges and ts (rebound from a scan's copy to the stream)
        self.stem = stem
        self.source = source
        self.key: str | None = aggregator.group_by[0][1] if aggregator.group_by else None
        kept: dict[str, tuple[np.dtype, bool, tuple[str, ...]]] = {}
        for column in aggregator.needed:
            summed = column in aggregator.sums
            ops = aggregator.extremes.get(column, ())
            if summed or ops:
                kept[column[1]] = (stem.dtype(column[1]), summed, tuple(ops))
        self.columns = kept
        self.log_b = stem.log_block
        self.lo = 0                                 # the key of group column 0
        self.width = 0 if self.key is not None else 1   # group columns in use
        self.b0 = 0                                 # the block of storage row 0
        self.rows = 0                               # storage rows in use
        self.first = 0                              # the first live storage row
        self.horizon = 0
        self._cells = _Cells(_MIN_ROWS, max(self.width, 1), kept)
        #: one block of cells an edge folds into (as wide as the storage)
        self._scratch = _Cells(1, max(self.width, 1), kept)
        #: the factors as one compiled scan's arguments (empty: none, None: a probe)
        self._scan = stem.interval_args(source)
        self._found = np.empty(2 << self.log_b, np.int64)
        # the output columns of a query without GROUP BY, by value column name
        self._outputs = [(function, c[1]) for function, c in
                         (o for o in aggregator._outputs if o[0] != "key")]
        self._pcount = np.zeros((_MIN_ROWS + 1, max(self.width, 1)), np.int64)
        self._psums = {name: np.zeros((_MIN_ROWS + 1, max(self.width, 1), 2), a.dtype)
                       for name, a in self._cells.sums.items()}

    @staticmethod
    def fits(aggregator: Aggregator, stem: DataSteM) -> bool:
        """Whether an aggregated query can be kept by blocks over `stem`: at most one
        GROUP BY column, an INT one, and SUM, AVG, MIN and MAX over 8-byte INT or FLOAT
        columns."""
        if len(aggregator.group_by) > 1:
            return False
        names = [c[1] for c in aggregator.group_by]
        if names and stem.dtype(names[0]).kind != "i":
            return False
        names += [c[1] for c in aggregator.needed if c in aggregator.sums
                  or c in aggregator.extremes]
        return stem.wide_dtypes(names) is not None

    # ------------------------------------------------------------------ writes

    def fold(self, positions: np.ndarray) -> None:
        """Add the matches at sorted `positions` (retained, above every earlier one).
        O(n) for n matches, in parts on the cores for a long run (psoup.stems.halves),
        plus O(span) per block touched. The first keys' span is guessed from the first
        _SAMPLE matches; keys outside the span widen it (a second pass over just
        those). Raises SpanExceeded when the keys would span more than MAX_SPAN: the
        index is then left part-way, for the caller to drop."""
        n = len(positions)
        if not n:
            return
        if self.key is not None and not self.width:
            low, high = self.stem.key_range(self.key, positions[:_SAMPLE])
            lo, width = self._within(low, high)
        else:
            lo, width = self.lo, self.width
        first_block = int(positions[0]) >> self.log_b
        last_block = int(positions[-1]) >> self.log_b
        if self.rows == 0:
            self.b0, self.first = first_block, 0
        end = self.b0 + self.rows               # the first block not stored before
        self._make_room(last_block - self.b0 + 1, lo, width)
        self.rows = max(self.rows, last_block - self.b0 + 1)
        if self._fold_parts(positions):
            self._widen(positions)
        self._prefix_from(max(min(first_block, end) - self.b0, self.first))

    def _widen(self, positions: np.ndarray) -> None:
        """Widen the span to the keys at `positions` that lay outside it and fold those
        (they were left out). O(n) to find them."""
        assert self.key is not None, "only keys fall outside"
        keys = self.stem.take([self.key], positions)[self.key]
        out = (keys < self.lo) | (keys >= self.lo + self.width)
        low = min(self.lo, int(keys[out].min()))
        high = max(self.lo + self.width - 1, int(keys[out].max()))
        lo, width = self._within(low, high)
        self._make_room(self.rows, lo, width)
        left = self._fold_parts(positions[out])
        assert not left, "every key is inside the widened span"

    def scan(self) -> np.ndarray | None:
        """Find every retained match of the query and fold it into this empty index in
        one compiled pass over the stream (in parts on the cores, `halves`): the
        matches' positions; None when its factors are not all intervals on 8-byte
        columns (then `probe`, then `fold`). The keys' span is guessed from the first
        _SAMPLE tuples, widened on a miss. O(retained x factors)."""
        scan, stem = self._scan, self.stem
        if not scan:
            return None
        assert not self.rows, "a scan starts an index"
        p0, p1 = stem.horizon, stem.n
        if p1 <= p0:
            return np.empty(0, np.int64)
        if self.key is None:
            lo, width = 0, 1
        else:
            lo, width = self._within(*stem.key_range(
                self.key, np.arange(p0, min(p1, p0 + _SAMPLE), dtype=np.int64)))
        self.b0, self.first = p0 >> self.log_b, 0
        rows = ((p1 - 1) >> self.log_b) - self.b0 + 1
        self._make_room(rows, lo, width)
        self.rows = rows
        # chunks: no block in two parts
        parts = halves.ranges(p0, p1, stem.chunk_rows, stem.threads)
        cells = self._cells
        with _SCRATCH.taken(p1 - p0) as out:
            found = halves.each(lambda ab: _scan_cells(
                cells, stem, scan, ab[0], ab[1], out[ab[0] - p0:], self.key, self.lo,
                self.width, self.log_b, self.b0), parts)
            positions = np.concatenate([out[a - p0:a - p0 + count]
                                        for (a, _), (count, _) in zip(parts, found,
                                                                      strict=True)])
        if any(left for _, left in found):
            self._widen(positions)
        self._prefix_from(0)
        return positions

    def _fold_parts(self, positions: np.ndarray) -> int:
        """`_Cells.fold` of `positions` in parts, each on a thread; the number of them
        whose key lay outside the span (left out)."""
        cells = self._cells
        return sum(halves.each(lambda ab: cells.fold(
            self.stem, positions[ab[0]:ab[1]], self.key, self.lo, self.width, self.log_b,
            self.b0), halves.split_aligned(positions, 1 << self.log_b, self.stem.threads)))

    def _within(self, low: int, high: int) -> tuple[int, int]:
        """(lo, width) of keys low..high, or SpanExceeded past MAX_SPAN."""
        if high - low + 1 > MAX_SPAN:
            raise SpanExceeded(f"GROUP BY {self.key} keys span {low}..{high}, more than "
                               f"{MAX_SPAN} values")
        return low, high - low + 1

    def expire(self, horizon: int) -> None:
        """Forget the blocks wholly below `horizon`: O(1), and a compaction, O(live
        blocks x span), once the dead blocks outnumber the live ones."""
        if horizon <= self.horizon:
            return
        self.horizon = horizon
        dead = min((horizon >> self.log_b) - self.b0, self.rows)
        if dead <= self.first:
            return
        self.first = dead
        if self.first == self.rows:         # nothing live: start over at the next fold
            self.b0 += self.rows
            self.rows = self.first = 0
            self._reset(len(self._pcount) - 1, self._cells.count.shape[1])
        elif self.first > self.rows - self.first:
            self._relocate(len(self._pcount) - 1, self._cells.count.shape[1], 0)

    def _make_room(self, rows: int, lo: int, width: int) -> None:
        """Storage for `rows` rows (from the current b0) and group columns lo .. lo +
        width - 1: moved to a larger one (twice what is needed) when either does not
        fit or lo moved down; O(1) when both fit."""
        shift = self.lo - lo if self.width else 0          # >= 0: lo only moves down
        capacity, columns = len(self._pcount) - 1, self._cells.count.shape[1]
        if rows <= capacity and width <= columns and not shift:
            self.lo, self.width = lo, width
            return
        live = rows - self.first
        self._relocate(max(2 * live, _MIN_ROWS) if rows > capacity else capacity,
                       max(2 * width, columns) if width > columns else columns, shift)
        self.lo, self.width = lo, width

    def _relocate(self, capacity: int, columns: int, shift: int) -> None:
        """Move the live rows to fresh storage of `capacity` rows and `columns` group
        columns, row `first` to row 0, group column g to g + shift; then re-sum the
        prefixes from zero. O(live rows x columns)."""
        old, first, live = self._cells, self.first, self.rows - self.first
        self._reset(max(capacity, live), columns)
        width = self.width
        new = self._cells
        for a, b in zip(old.arrays(), new.arrays(), strict=True):
            b[:live, shift:shift + width] = a[first:self.rows, :width]
        self.b0 += first
        self.rows, self.first = live, 0
        self._prefix_from(0)

    def _reset(self, capacity: int, columns: int) -> None:
        self._cells = _Cells(capacity, columns, self.columns)
        self._scratch = _Cells(1, columns, self.columns)
        self._pcount = np.zeros((capacity + 1, columns), np.int64)
        self._psums = {name: np.zeros((capacity + 1, columns, 2), a.dtype)
                       for name, a in self._cells.sums.items()}

    def _prefix_from(self, r: int) -> None:
        """Prefix rows r + 1 .. rows from row r (row `first` is zero). O((rows - r) x
        columns)."""
        if r == self.first:
            self._pcount[r] = 0
            for prefix in self._psums.values():
                prefix[r] = 0
        stop = self.rows
        if stop <= r:
            return
        np.cumsum(self._cells.count[r:stop], axis=0, out=self._pcount[r + 1:stop + 1])
        self._pcount[r + 1:stop + 1] += self._pcount[r]
        for name, sums in self._cells.sums.items():
            prefix = self._psums[name]
            if sums.dtype.kind == "f":
                kernels.block_prefix(sums[r:stop], prefix[r], prefix[r + 1:stop + 1])
            else:
                np.cumsum(sums[r:stop], axis=0, out=prefix[r + 1:stop + 1])
                prefix[r + 1:stop + 1] += prefix[r]

    # ------------------------------------------------------------------ reads

    def answer(self, p0: int, p1: int) -> Result:
        """The aggregates over the matches at positions [p0, p1), one row per group in
        key order (as AggregateIndex.answer): the whole blocks' totals put in one
        block of cells, the edges' matches folded on top."""
        stem = self.stem
        p0, p1 = max(p0, self.horizon, stem.horizon), min(p1, stem.n)
        if p1 <= p0 or self.rows <= self.first:     # no match is kept: none is there
            return self.aggregator._result([], [], {}, {}, np.empty(0))
        log_b = self.log_b
        b_lo = -(-p0 >> log_b)
        b_hi = p1 >> log_b if p1 < stem.n else -(-p1 >> log_b)  # the newest block whole
        r_lo, r_hi = b_lo - self.b0, min(b_hi - self.b0, self.rows)
        if r_lo < self.first or r_hi <= r_lo:
            self._scratch.clear()
            edges = [(p0, p1)]
        else:
            self._load_middle(r_lo, r_hi)
            edges = [(p0, (self.b0 + r_lo) << log_b)]
            if b_hi - self.b0 <= self.rows:     # past the last block: no matches
                edges.append(((self.b0 + r_hi) << log_b, p1))
        scan = self._scan
        if scan:        # intervals: each edge found and folded in one compiled call
            for a, b in edges:
                if b > a:
                    out = self._found if b - a <= len(self._found) else \
                        np.empty(b - a, np.int64)
                    _scan_cells(self._scratch, self.stem, scan, a, b, out, self.key,
                                self.lo, self.width, _ONE_BLOCK, 0)
        else:
            self._scratch.fold(self.stem, self._matches(edges), self.key, self.lo,
                               self.width, _ONE_BLOCK, 0)
        return self._result(p0, p1)

    def _load_middle(self, r_lo: int, r_hi: int) -> None:
        """The scratch cells set to the totals of storage rows [r_lo, r_hi): counts and
        sums as differences of prefix rows, O(span); the latest match from the last row
        (or `_last_rows`); MIN, MAX reduced over the rows, O(span x rows)."""
        w, cells, out = self.width, self._cells, self._scratch
        if w == 1 and not cells.mins and not cells.maxs:
            self._load_one(r_lo, r_hi)
            return
        count = out.count[0, :w]
        np.subtract(self._pcount[r_hi, :w], self._pcount[r_lo, :w], out=count)
        last = out.last[0, :w]
        last[:] = cells.last[r_hi - 1, :w]
        missing = np.flatnonzero((last < 0) & (count > 0))
        if len(missing):
            last[missing] = cells.last[self._last_rows(r_lo, r_hi, missing), missing]
        for name, prefix in self._psums.items():    # in Python: inf - inf, no warning
            later, earlier = prefix[r_hi, :w].tolist(), prefix[r_lo, :w].tolist()
            if prefix.dtype.kind == "f":
                out.sums[name][0, :w] = [(a - c, b - d) for (a, b), (c, d)
                                         in zip(later, earlier, strict=True)]
            else:
                out.sums[name][0, :w] = [(wrap_int64(a - c), wrap_int64(b - d)) for (a, b), (c, d)
                                         in zip(later, earlier, strict=True)]
        for name, mins in cells.mins.items():
            np.min(mins[r_lo:r_hi, :w], axis=0, out=out.mins[name][0, :w])
        for name, maxs in cells.maxs.items():
            np.max(maxs[r_lo:r_hi, :w], axis=0, out=out.maxs[name][0, :w])

    def _last_rows(self, r_lo: int, r_hi: int, groups: np.ndarray) -> np.ndarray:
        """For each of `groups` (group columns with a match in storage rows [r_lo,
        r_hi)), the last of those rows holding one: the first prefix row reaching the
        range's count, less one, found by a binary search of every group at once.
        O(log(r_hi - r_lo)) vectorized steps."""
        pcount = self._pcount
        target = pcount[r_hi, groups]
        lo = np.full(len(groups), r_lo + 1)
        hi = np.full(len(groups), r_hi)
        while True:
            open_ = lo < hi
            if not open_.any():
                return lo - 1
            mid = (lo + hi) // 2
            reached = pcount[mid, groups] >= target
            hi = np.where(open_ & reached, mid, hi)
            lo = np.where(open_ & ~reached, mid + 1, lo)

    def _load_one(self, r_lo: int, r_hi: int) -> None:
        """`_load_middle` of one group without MIN or MAX, item by item (an invocation
        of the most common aggregates is a few microseconds of these)."""
        cells, out, pcount = self._cells, self._scratch, self._pcount
        out.count[0, 0] = pcount.item(r_hi, 0) - pcount.item(r_lo, 0)
        latest = cells.last.item(r_hi - 1, 0)
        if latest < 0 and out.count[0, 0]:
            latest = cells.last.item(int(self._last_rows(r_lo, r_hi, np.zeros(1, np.int64))[0]),
                                     0)
        out.last[0, 0] = latest
        for name, prefix in self._psums.items():
            (a, b), (c, d) = prefix[r_hi, 0].tolist(), prefix[r_lo, 0].tolist()
            out.sums[name][0, 0] = (a - c, b - d) if prefix.dtype.kind == "f" else \
                (wrap_int64(a - c), wrap_int64(b - d))

    def _matches(self, ranges: list[tuple[int, int]]) -> np.ndarray:
        """The sorted positions of the query's matches in the increasing ranges
        (retained), for factors that are not all intervals: a probe per range (or every
        position, without factors)."""
        found = [self.stem.probe(self.source, Span.range(a, b)) if self._scan is None
                 else np.arange(a, b, dtype=np.int64) for a, b in ranges if b > a]
        return np.concatenate(found) if len(found) > 1 else \
            found[0] if found else np.empty(0, np.int64)

    def _result(self, p0: int, p1: int) -> Result:
        """Rows from the scratch cells: the groups with matches, in key order; from the
        range's rows when a FLOAT sum is not finite (an infinite value, an overflow)."""
        agg, cells, w = self.aggregator, self._scratch, self.width
        if self.key is None:
            return self._row(p0, p1)
        counts = cells.count[0, :w].tolist()
        present = [g for g, k in enumerate(counts) if k]
        if not present:
            return agg._result([], [], {}, {}, np.empty(0))
        sums: dict[str, list[Any]] = {}
        for name, pairs in cells.sums.items():
            if pairs.dtype.kind == "f":
                total = [s + e for s, e in pairs[0, :w].tolist()]
                if not all(math.isfinite(total[g]) for g in present):
                    return self._from_rows(p0, p1)
            else:
                total = [(h << 32) + low for h, low in pairs[0, :w].tolist()]
            sums[name] = total
        last = cells.last[0, :w].tolist()
        keys = [(self.lo + g,) for g in present]
        extremes = {(c, op): [(cells.mins if op == "min" else cells.maxs)[c[1]][0, g].item()
                              for g in present]
                    for c, ops in agg.extremes.items() for op in ops}
        return agg._result(keys, [counts[g] for g in present],
                           {c: [sums[c[1]][g] for g in present] for c in agg.sums},
                           extremes, self._ts([last[g] for g in present]))

    def _row(self, p0: int, p1: int) -> Result:
        """`_result` without GROUP BY: its one row, built straight from the cells, item
        by item (the most common aggregates: an invocation is a few microseconds)."""
        cells = self._scratch
        count = cells.count.item(0, 0)
        if not count:
            return self.aggregator._result([], [], {}, {}, np.empty(0))
        row = []
        for function, arg in self._outputs:
            keeps = function.keeps
            if keeps is None:
                kept = None
            elif keeps == "sum":
                pairs = cells.sums[arg]
                if pairs.dtype.kind == "f":
                    kept = pairs.item(0, 0, 0) + pairs.item(0, 0, 1)
                    if not math.isfinite(kept):
                        return self._from_rows(p0, p1)
                else:
                    kept = (pairs.item(0, 0, 0) << 32) + pairs.item(0, 0, 1)
            else:
                kept = (cells.mins if keeps == "min" else cells.maxs)[arg].item(0, 0)
            row.append(function.fold(count, kept))
        ts = np.empty(1)
        ts[0] = self.stem.ts_at(cells.last.item(0, 0))
        return Result(self.aggregator.query.columns, [tuple(row)], ts, np.array([-1]),
                      keys=[()])

    def _from_rows(self, p0: int, p1: int) -> Result:
        """The answer computed from the matches' rows in [p0, p1), as NoMat computes it.
        O(p1 - p0)."""
        positions = self.stem.probe(self.source, Span.range(p0, p1))
        names = [c[1] for c in self.aggregator.needed]
        got = self.stem.take([*names, TS], positions)
        return self.aggregator.compute({c: got[c[1]] for c in self.aggregator.needed},
                                       got[TS])

    def _ts(self, latest: list[int]) -> np.ndarray:
        """The ts of the groups' latest matches (read by position)."""
        if len(latest) > 16:
            return np.asarray(self.stem.take([TS], np.array(latest, np.int64),
                                             any_order=True)[TS], np.float64)
        return np.array([self.stem.ts_at(p) for p in latest], np.float64)

    # ------------------------------------------------------------------ accounting

    def __len__(self) -> int:
        """The matches counted in the live blocks (the horizon's block whole)."""
        return int((self._pcount[self.rows] - self._pcount[self.first]).sum()) \
            if self.rows > self.first else 0

    def nbytes(self) -> int:
        return (sum(a.nbytes for a in self._cells.arrays()) + self._pcount.nbytes
                + sum(a.nbytes for a in self._psums.values()))

    def _check(self) -> None:
        """The invariants: bounds, every cell's count and latest position agreeing, and
        the prefix rows the running totals of the live rows."""
        cells, w = self._cells, self.width
        assert 0 <= self.first <= self.rows <= len(self._pcount) - 1
        assert w <= cells.count.shape[1] and (self.key is not None or w == 1)
        assert w <= MAX_SPAN
        live = slice(self.first, self.rows)
        count, last = cells.count[live], cells.last[live]
        assert (count >= 0).all() and ((count == 0) == (last == -1)).all()
        size = 1 << self.log_b
        blocks = (np.arange(self.first, self.rows) + self.b0)[:, None]
        held = last >= 0
        assert ((last >> self.log_b == blocks) | ~held).all(), "a latest outside its block"
        assert not cells.count[:, w:].any(), "counts beyond the span"
        assert size >= 1
        want = np.cumsum(count, axis=0)
        assert np.array_equal(self._pcount[self.first + 1:self.rows + 1] -
                              self._pcount[self.first], want)
        for name, sums in cells.sums.items():
            prefix = self._psums[name][self.first:self.rows + 1]
            if sums.dtype.kind == "i":
                assert np.array_equal(prefix[1:] - prefix[0], np.cumsum(sums[live], axis=0))
            else:
                again = np.empty_like(prefix[1:])
                kernels.block_prefix(np.ascontiguousarray(sums[live]), prefix[0], again)
                assert np.array_equal(again, prefix[1:], equal_nan=True)
