"""The Data SteM: one per stream, storing and indexing its tuples (PSoup Sect. 4.2.1).

Storage is columnar and chunked in the manner of the Streaming Tables paper's block lists:
each chunk holds `chunk_rows` consecutive tuples as one numpy array per column plus `ts`
(the physicalID) and `tupleID`. Every tuple has a *position*, its arrival rank within the
stream; positions are what the Results Structure indexes, so a window becomes a range of
positions. Because timestamps never decrease within a stream, the ts column is already
sorted: the time index is a binary search over chunk heads and then within one chunk.

Retention (PSoup's maximum window, footnote 3): the *horizon* is the first retained
position. It moves as data arrives (RETAIN n ROWS keeps the last n tuples; RETAIN t keeps
the tuples with ts >= latest ts - t, in the stream's own time, so replayed history is not
dropped on arrival). Memory is released only in whole chunks (Golab Ch. 3); a tuple below
the horizon in a chunk not yet dropped is invisible to every read.

Value indices: a sealed (full) chunk lazily gets, per column, the permutation that sorts
it, so a selective new query (or a NoMat invocation) finds its candidates with binary
searches instead of a scan, as the paper's per-attribute trees do.
"""

from __future__ import annotations

import copy
import math
import sys
import threading
import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal

import numpy as np

from psoup import kernels
from psoup.query.model import (
    INT64_MAX,
    INT64_MIN,
    TS,
    TUPLE_ID,
    AttrPredicate,
    Source,
    StreamSchema,
)
from psoup.stems import halves
from psoup.stems.batch import DTYPES, Batch
from psoup.stems.predicates import attr_mask, source_mask
from psoup.stems.span import Span

#: Dropped chunks kept for the next ones to reuse: a batch's chunks, usually.
SPARE_CHUNKS = 2

#: Below this fraction of the rows in range, a value index beats a scan.
INDEX_SELECTIVITY = 0.125


def _copy_values(columns: dict[str, np.ndarray], tuple_ids: np.ndarray,
                 copies: Sequence[tuple[dict[str, np.ndarray], int, int, int]]) -> None:
    """A batch's values (its ts excepted) and tupleIDs into chunks: per (a chunk's
    columns, its first row r, the batch's first tuple, how many), the tuples from that
    one into rows r, r + 1, ..."""
    for cols, r, done, take in copies:
        here = slice(done, done + take)
        for name, values in columns.items():
            cols[name][r:r + take] = values[here]
        cols[TUPLE_ID][r:r + take] = tuple_ids[here]


class _Chunk:
    """`cap` rows of every column. The 8-byte columns (INT, FLOAT, ts, tupleID) are the
    rows of one (wide columns, cap) uint64 `block`, `cols` holding typed views of them,
    so a compiled gather reads any subset of them in one call (`DataSteM.take`)."""

    __slots__ = ("cols", "block", "n", "index")

    def __init__(self, dtypes: dict[str, np.dtype], wide: dict[str, int], cap: int,
                 block: np.ndarray | None = None):
        self.block = np.empty((len(wide), cap), dtype=np.uint64) if block is None else block
        self.cols = {name: self.block[wide[name]].view(dt) if name in wide
                     else np.empty(cap, dtype=dt) for name, dt in dtypes.items()}
        self.n = 0
        self.index: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def unshared(self) -> bool:
        """Whether nothing outside the chunk holds its memory (a view handed out, say,
        or a column kept by the archive), so that it can be reused. O(columns)."""
        refs, cols = sys.getrefcount, self.cols
        # the block: this chunk's reference, one per wide column's view, getrefcount's
        # argument; a column: the chunk's dict's reference, getrefcount's argument
        return (refs(self.block) == 2 + len(self.block) and
                all(refs(cols[name]) == 2 for name in cols))

    def sorted_view(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """(permutation, sorted values) of a sealed chunk's column, built on first use."""
        got = self.index.get(column)
        if got is None:
            values = self.cols[column]
            order = np.argsort(values, kind="stable").astype(np.int32)
            got = self.index[column] = (order, values[order])
        return got


@dataclass
class StemImage:
    """A Data SteM's chunks and counters as of a checkpoint's cut (`DataSteM.image`), or
    as read back for `DataSteM.restore`. It holds the chunks' arrays themselves: full
    chunks never change, the last one only past `rows`, and a chunk referenced here is
    never reused for new rows (`_Chunk.unshared`)."""

    chunk0: int                                 # chunk number of blocks[0]
    n: int
    horizon: int
    last_ts: float
    at_last_ts: int
    rows_total: int
    blocks: list[np.ndarray]                    # each chunk's (wide columns, cap) block
    narrow: list[dict[str, np.ndarray]]         # each chunk's TEXT and BOOL columns
    rows: list[int]                             # rows each chunk held at the cut


class DataSteM:
    """Columnar, chunked, time-indexed storage of one stream's retained tuples.

    Example:
        >>> from psoup.query.model import StreamSchema
        >>> from psoup.stems.batch import make_batch
        >>> stem = DataSteM(StreamSchema("R", (("a", "int"),)), chunk_rows=4)
        >>> b = make_batch(stem.schema, [(1,), (2,), (3,)], [10.0, 11.0, 12.0], 0, stem.last_ts)
        >>> stem.append(b, np.array([7, 8, 9]))
        0
        >>> stem.time_range(11.0, 12.0)
        (1, 3)
    """

    def __init__(self, schema: StreamSchema, chunk_rows: int = 8192):
        self.schema = schema
        self.chunk_rows = chunk_rows
        self._dtypes = {name: DTYPES[t] for name, t in schema.columns}
        self._dtypes[TS] = np.dtype(np.float64)
        self._dtypes[TUPLE_ID] = np.dtype(np.int64)
        #: the 8-byte columns, by their row in each chunk's block
        self._wide = {name: i for i, name in enumerate(
            n for n, dt in self._dtypes.items() if dt.itemsize == 8 and dt.kind in "if")}
        self._chunks: list[_Chunk] = []
        #: dropped chunks nothing else references, reused by the next chunks (a fresh
        #: one costs an allocation and a page fault per 4 KiB on first write)
        self._spare: list[_Chunk] = []
        #: answers that will still read columns from the chunks (`defer`); the lock
        #: because reader threads add to it while the writer settles them
        self._readers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._readers_lock = threading.Lock()
        #: the stem a `snapshot` was taken of (None: this is the stem itself)
        self._origin: DataSteM | None = None
        # the chunks' blocks as (a kernels.address_table, the blocks), or None
        self._blocks: tuple[kernels.AddressTable, list[np.ndarray]] | None = None
        #: names asked of `take` -> (its 8-byte columns, their block rows, their dtypes)
        self._gathers: dict[tuple[str, ...],
                            tuple[list[str], np.ndarray, list[np.dtype[Any]]]] = {}
        self._heads: list[float] = []     # first ts of each chunk, for the time index
        self._tid_heads: list[int] = []   # first tupleID of each chunk, for lookups
        self._chunk0 = 0                  # chunk number of self._chunks[0]
        self.n = 0                        # positions handed out so far
        self.horizon = 0                  # first retained position
        self.last_ts = float("-inf")
        #: rows ever appended with ts equal to last_ts (retention does not lower it): a
        #: replay that stopped part way resumes after them (`psoup replay --resume`)
        self.at_last_ts = 0
        self.rows_total = 0
        #: Called with each chunk's columns ({name: array}, ts and tupleID included) as
        #: the chunk is dropped, so durable engines can archive what leaves retention.
        self.on_expire: Callable[[dict[str, np.ndarray]], None] | None = None
        #: Called with (old, new) horizon when retention passes positions [old, new),
        #: while they are still readable (`rows(old, new, expired=True)`): the archive
        #: tier of queries with history takes their matches from them.
        self.on_horizon: Callable[[int, int], None] | None = None
        #: a copy for a scan: its references to its chunks' columns (`copy_for_scan`)
        self._held: list[dict[str, np.ndarray]] = []
        #: the threads a long scan of it is split over (psoup.stems.halves); None: the
        #: cores this process may use. The engine sets its own (`Engine(threads=)`).
        self.threads: int | None = None

    # ----------------------------------------------------------------- insert, expire

    def append(self, batch: Batch, tuple_ids: np.ndarray,
               later: list[Callable[[], None]] | None = None) -> int:
        """Store a checked batch; returns the position of its first tuple. O(n) copying.

        Moves the horizon and drops chunks that fell wholly below it. With `later`, the
        copies of the batch's values into the chunks (its ts excepted, which retention
        reads) may be left to a callable appended to it, when no position of the batch
        leaves retention at once (nothing reads them before the caller runs it, on
        whatever thread, before anything reads the new positions: the Eddy runs it
        beside the batch's probe, which reads the batch itself).
        """
        p0 = self.n
        cap = self.chunk_rows
        done = 0
        copies: list[tuple[dict[str, np.ndarray], int, int, int]] | None = \
            [] if later is not None and self._keeps(batch) else None
        while done < batch.n:
            if not self._chunks or self._chunks[-1].n == cap:
                # new lists, never changed in place: a snapshot shares the old ones
                self._chunks = [*self._chunks, self._spare.pop() if self._spare
                                else _Chunk(self._dtypes, self._wide, cap)]
                self._blocks = None
                self._heads = [*self._heads, float(batch.ts[done])]
                self._tid_heads = [*self._tid_heads, int(tuple_ids[done])]
            chunk = self._chunks[-1]
            take = min(cap - chunk.n, batch.n - done)
            r, cols = chunk.n, chunk.cols
            cols[TS][r:r + take] = batch.ts[done:done + take]
            if copies is None:
                _copy_values(batch.columns, tuple_ids, [(cols, r, done, take)])
            else:
                copies.append((cols, r, done, take))
            chunk.n += take
            done += take
        self.n += batch.n
        self.rows_total += batch.n
        if batch.n:
            last = float(batch.ts[-1])
            same = batch.n - int(batch.ts.searchsorted(last, "left"))
            self.at_last_ts = same + (self.at_last_ts if last == self.last_ts else 0)
            self.last_ts = last
        self._retain()
        if copies and later is not None:
            later.append(partial(_copy_values, batch.columns, tuple_ids, copies))
        return p0

    def _keeps(self, batch: Batch) -> bool:
        """Whether the batch's first position is still retained once it is appended
        (`_retain`: RETAIN n ROWS keeps the last n, RETAIN t what is at most t older
        than the batch's last ts)."""
        schema = self.schema
        if schema.retain_rows is not None:
            return batch.n <= schema.retain_rows
        if schema.retain_seconds is not None and batch.n:
            return bool(batch.ts[0] >= batch.ts[-1] - schema.retain_seconds)
        return True

    def _retain(self) -> None:
        schema = self.schema
        old = self.horizon
        if schema.retain_rows is not None:
            self.horizon = max(self.horizon, self.n - schema.retain_rows)
        elif schema.retain_seconds is not None and self.n:
            self.horizon = self.ts_search(self.last_ts - schema.retain_seconds, "left")
        if self.on_horizon is not None and self.horizon > old:
            self.on_horizon(old, self.horizon)
        cap = self.chunk_rows
        drop = 0
        while drop < len(self._chunks) - 1 and (self._chunk0 + drop + 1) * cap <= self.horizon:
            drop += 1
        if drop:
            if self._readers:
                self._settle_readers()
            if self.on_expire is not None:
                for chunk in self._chunks[:drop]:
                    self.on_expire({name: arr[:chunk.n] for name, arr in chunk.cols.items()})
            for chunk in self._chunks[:drop]:
                if len(self._spare) < SPARE_CHUNKS and chunk.unshared():
                    chunk.n = 0
                    chunk.index.clear()
                    self._spare.append(chunk)
            self._chunks = self._chunks[drop:]
            self._blocks = None
            self._heads = self._heads[drop:]
            self._tid_heads = self._tid_heads[drop:]
            self._chunk0 += drop

    def copy_for_scan(self) -> DataSteM:
        """A copy of this stem as it is now, to read off the engine's lock while the
        original goes on taking batches: its own lists of the chunks that hold positions
        [horizon, n) now, sharing their memory (below n it is never written again), and
        a reference to every chunk's columns, so that retention, should it drop a chunk
        meanwhile, cannot reuse its memory under a reader (`_Chunk.unshared`); dropping
        the snapshot lets them go. Its own reads only (probe, take, scatter): it takes no
        batches and calls no callbacks. O(chunks)."""
        snap = copy.copy(self)
        snap._chunks = list(self._chunks)
        snap._heads = list(self._heads)
        snap._tid_heads = list(self._tid_heads)
        snap._spare = []
        snap._readers = weakref.WeakSet()
        snap._gathers = {}
        # the same chunks: the address table, when built, serves it too (3 ms at 16M)
        snap._blocks = self._blocks
        snap.on_expire = snap.on_horizon = None
        snap._held = [dict(chunk.cols) for chunk in snap._chunks]
        return snap

    # ------------------------------------------------------------------ time index

    def ts_search(self, t: float, side: Literal["left", "right"] = "left") -> int:
        """First position whose ts is >= t ('left') or > t ('right'), within
        [horizon, n]. O(log n).
        """
        heads = self._heads
        if not heads:
            return self.n
        k = (bisect_left if side == "left" else bisect_right)(heads, t) - 1
        if k < 0:
            return self.horizon
        chunk = self._chunks[k]
        # (the method, not np.searchsorted: its wrapper costs as much as the search)
        i = int(chunk.cols[TS][:chunk.n].searchsorted(t, side))
        return max(self.horizon, (self._chunk0 + k) * self.chunk_rows + i)

    def time_range(self, begin: float, end: float) -> tuple[int, int]:
        """Positions [p0, p1) of the retained tuples with begin <= ts <= end."""
        p0 = self.ts_search(begin, "left")
        p1 = self.ts_search(end, "right")
        return p0, max(p0, p1)

    def last_rows(self, k: int) -> tuple[int, int]:
        """Positions [p0, p1) of the k most recent retained tuples."""
        return max(self.horizon, self.n - k), self.n

    @property
    def retained(self) -> int:
        return self.n - self.horizon

    @property
    def row_bytes(self) -> int:
        """What a retained tuple counts against a stream's byte limit: 8 bytes per INT,
        FLOAT, ts and tupleID, 1 per BOOL, 58 per TEXT (a reference and a short string)."""
        return sum(58 if dt.kind == "O" else dt.itemsize for dt in self._dtypes.values())

    def retained_after(self, ts: np.ndarray) -> int:
        """How many tuples are retained once a batch with these (checked) timestamps is
        appended, by the stream's RETAIN rule. O(log n)."""
        n, schema = len(ts), self.schema
        if schema.retain_rows is not None:
            return min(schema.retain_rows, self.retained + n)
        if schema.retain_seconds is not None and n:
            cutoff = float(ts[-1]) - schema.retain_seconds
            old = self.n - max(self.horizon, self.ts_search(cutoff, "left"))
            return old + n - int(np.searchsorted(ts, cutoff, side="left"))
        return self.retained + n

    # ------------------------------------------------------------------ reads

    def _pieces(self, p0: int, p1: int, lowest: int | None = None
                ) -> Iterator[tuple[_Chunk, int, int, int]]:
        """(chunk, first row, end row, position of row 0) for each chunk meeting [p0, p1),
        reading nothing below `lowest` (default: the horizon)."""
        cap = self.chunk_rows
        p0 = max(p0, self.horizon if lowest is None else lowest)
        if p1 <= p0:
            return
        for k in range(p0 // cap, (p1 - 1) // cap + 1):
            chunk = self._chunks[k - self._chunk0]
            base = k * cap
            yield chunk, max(p0, base) - base, min(p1, base + chunk.n) - base, base

    def slice(self, column: str, p0: int, p1: int) -> np.ndarray:
        """One column's values at positions [p0, p1), as one array."""
        parts = [c.cols[column][r0:r1] for c, r0, r1, _ in self._pieces(p0, p1)]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, self._dtypes[column])

    def rows(self, p0: int, p1: int, expired: bool = False) -> dict[str, np.ndarray]:
        """Every column (ts and tupleID included) at positions [p0, p1) as arrays.

        With `expired`, positions below the horizon that are still held in memory (the
        part of the oldest chunk that retention has passed) are readable too; durable
        engines archive them at a checkpoint. O(p1 - p0).
        """
        lowest = self._chunk0 * self.chunk_rows if expired else self.horizon
        pieces = list(self._pieces(p0, p1, lowest))
        return {name: np.concatenate([c.cols[name][r0:r1] for c, r0, r1, _ in pieces]
                                     or [np.empty(0, dtype)])
                for name, dtype in self._dtypes.items()}

    @property
    def oldest(self) -> int:
        """The first position still held in memory (at or below the horizon)."""
        return self._chunk0 * self.chunk_rows

    def oldest_tuple_id(self, default: int) -> int:
        """The tupleID of the oldest tuple still held in memory (retained or not), or
        `default` when the stream holds none: every tuple before it is archived."""
        if self.oldest >= self.n:
            return default
        return int(self._chunks[0].cols[TUPLE_ID][0])

    def tid_bound(self, position: int) -> int:
        """A tupleID bound for `position` (held, or n): the tupleID there, or one past the
        newest tuple's at n. Tuples arrive later with larger tupleIDs, so the held
        positions [p0, p1) are exactly those with tupleIDs in [tid_bound(p0),
        tid_bound(p1)), and stay so across a restart (positions restart, tupleIDs do not).
        O(1).
        """
        if position >= self.n:
            if not self._chunks:
                return 0
            # the newest tuple by n, not by the last chunk's count: a snapshot's chunk
            # goes on filling after it was taken
            k, row = divmod(self.n - 1, self.chunk_rows)
            return int(self._chunks[k - self._chunk0].cols[TUPLE_ID][row]) + 1
        k, row = divmod(position, self.chunk_rows)
        return int(self._chunks[k - self._chunk0].cols[TUPLE_ID][row])

    def position_of(self, tuple_id: int) -> int:
        """The first held position whose tupleID is >= `tuple_id` (n when none is),
        `tid_bound`'s inverse. O(log n).

        Example:
            >>> from psoup.query.model import StreamSchema
            >>> from psoup.stems.batch import make_batch
            >>> stem = DataSteM(StreamSchema("R", (("a", "int"),)), chunk_rows=2)
            >>> b = make_batch(stem.schema, [(1,), (2,), (3,)], 5.0, 0, stem.last_ts)
            >>> _ = stem.append(b, np.array([4, 6, 8]))
            >>> stem.position_of(5), stem.position_of(9), stem.tid_bound(3)
            (1, 3, 9)
        """
        k = bisect_right(self._tid_heads, tuple_id) - 1
        if k < 0:
            return self.oldest
        chunk = self._chunks[k]
        i = int(np.searchsorted(chunk.cols[TUPLE_ID][:chunk.n], tuple_id))
        return (self._chunk0 + k) * self.chunk_rows + i

    def ts_at(self, position: int) -> float:
        """The ts of one retained position. O(1)."""
        k, row = divmod(position, self.chunk_rows)
        return float(self._chunks[k - self._chunk0].cols[TS][row])

    def column(self, name: str, positions: np.ndarray, any_order: bool = False) -> np.ndarray:
        """One column's values at retained positions (see `take`)."""
        return self.take([name], positions, any_order)[name]

    def take(self, names: Sequence[str], positions: np.ndarray, any_order: bool = False
             ) -> dict[str, np.ndarray]:
        """Several columns' values at retained `positions`, split into chunks once for all
        of them. Positions are sorted unless `any_order` (a join's combinations: any
        order, repeats allowed).

        O(len(names) * n) for sorted positions; in any order O(n) when they lie in a few
        chunks (a join's window usually does), O(n log n) otherwise.
        """
        cap = self.chunk_rows
        if len(positions) == 0:
            return {name: np.empty(0, self._dtypes[name]) for name in names}
        if any_order:
            ks = positions // cap
            first, last = int(ks.min()), int(ks.max())
            if last - first > 3:
                uniq, inverse = np.unique(positions, return_inverse=True)
                once = self.take(names, uniq)
                return {name: values[inverse] for name, values in once.items()}
            if first != last:
                out = {name: np.empty(len(positions), self._dtypes[name]) for name in names}
                for k in range(first, last + 1):
                    here = ks == k
                    cols, rows = self._chunks[k - self._chunk0].cols, positions[here] - k * cap
                    for name in names:
                        out[name][here] = cols[name][rows]
                return out
        wide, rows_of, dtypes = self._gather(names)
        got: dict[str, np.ndarray] = {}
        if wide:                    # one compiled pass over every chunk, 8-byte columns
            words = np.empty((len(wide), len(positions)), dtype=np.uint64)
            kernels.chunk_gather(self._block_list()[0].handle, self._chunk0, cap, rows_of,
                                 np.ascontiguousarray(positions, np.int64), words)
            got = _typed(words, wide, dtypes)
        return self._narrow(names, positions, got)

    def wide_dtypes(self, names: Sequence[str]) -> list[np.dtype[Any]] | None:
        """The dtypes of `names` when every one is an 8-byte column (INT, FLOAT, ts,
        tupleID), else None."""
        wide, _, dtypes = self._gather(names)
        return dtypes if len(wide) == len(names) else None

    def key_range(self, name: str, positions: np.ndarray) -> tuple[int, int]:
        """(min, max) of INT column `name` at the sorted retained `positions`, read in
        place. O(n)."""
        return kernels.chunk_key_range(self._block_list()[0].handle, self._chunk0,
                                       self.chunk_rows, self._wide[name], positions)

    def key_counts(self, name: str, positions: np.ndarray, lo: int,
                   counts: np.ndarray) -> int:
        """counts[v - lo] += 1 for the value v of INT column `name` at each sorted
        retained position within [lo, lo + len(counts)), read in place; returns how
        many values lay outside. O(n)."""
        return kernels.chunk_key_counts(self._block_list()[0].handle, self._chunk0, self.chunk_rows,
                                 self._wide[name], positions, lo, counts)

    @property
    def log_block(self) -> int:
        """log2 of the blocks an aggregate index by blocks keeps for this stem: up to
        1,024 positions, and a block always lies within one chunk (the largest power
        of two dividing chunk_rows, at most 2**10)."""
        return min(10, (self.chunk_rows & -self.chunk_rows).bit_length() - 1)

    def fold_blocks(self, positions: np.ndarray, key: str | None, lo: int, groups: int,
                    column: str | None, log_b: int, b_first: int, cells: Sequence[Any]
                    ) -> int:
        """`kernels.block_fold` of the sorted retained `positions` into `cells`
        (counts, last, sums, mins, maxs), grouped by INT column `key` (less `lo`; none:
        one group), the values those of `column`, read in place; returns how many had
        a key outside lo .. lo + groups - 1 (left out). O(len(positions))."""
        return kernels.block_fold(self._block_list()[0].handle, self._chunk0, self.chunk_rows,
                           np.ascontiguousarray(positions, np.int64),
                           -1 if key is None else self._wide[key], lo,
                           -1 if column is None else self._wide[column], log_b, b_first,
                           groups, *cells)

    def scatter(self, names: Sequence[str], positions: np.ndarray, cursors: np.ndarray,
                dst: np.ndarray, *, key: str | None, keys: np.ndarray, lo: int,
                remap: np.ndarray) -> None:
        """The sorted retained `positions` and the 8-byte columns `names` at them into
        the rows of `dst`, grouped (`kernels.chunk_scatter`): the group of a tuple is
        remap[k - lo], k its value of INT column `key`, else keys[i] (all in group 0
        when `keys` is empty too), its column the group's next from `cursors`.
        O((1 + len(names)) x len(positions))."""
        wide, rows_of, _ = self._gather(names)
        assert len(wide) == len(names), "only 8-byte columns are scattered"
        kernels.chunk_scatter(self._block_list()[0].handle, self._chunk0, self.chunk_rows,
                              rows_of, np.ascontiguousarray(positions, np.int64),
                              -1 if key is None else self._wide[key], keys, lo, remap,
                              cursors, dst)

    def take_marked(self, names: Sequence[str], bitmap: tuple[int, Any, int], p0: int,
                    p1: int, word: int, mask: np.uint64, later: Sequence[str] = ()
                    ) -> tuple[dict[str, np.ndarray], Callable[[], dict[str, np.ndarray]]]:
        """Several columns' values at the positions p0 <= p < p1 whose bit (`word`,
        `mask`) is set in a chunked bitmap of this stem's chunk size (`bitmap`: its first
        chunk number, its chunks as a kernels.address_table and the end of its sealed
        positions, PSoup-P's `_bitmap`): an
        invocation's find and fetch in one compiled pass (`chunk_select`), without a
        position array unless a column is not 8 bytes wide. Returns (those columns, a
        function returning the 8-byte columns `later` of the same tuples): it copies
        them through the find's match masks when called (`marked_copy`); the chunks'
        blocks it reads stay referenced until then, so retention never reuses their
        memory under it (`_Chunk.unshared`), and an answer holding it should be passed
        to `defer`, so that it lets them go when retention drops one.

        O(p1 - p0) bit tests plus O(len(names) x matches) (dense runs of matches
        copied 8 values at a time); the function O(len(later) x matches)."""
        wide, rows_of, dtypes = self._gather(names)
        narrow = len(wide) < len(names)
        positions = np.empty(p1 - p0, np.int64) if narrow else _NO_POSITIONS
        first, listed, sealed = bitmap
        held = self._block_list()   # (table, blocks): `rest` keeps the blocks referenced
        words, masks = kernels.chunk_select(listed.handle, first, p0, p1, word, mask, sealed,
                                            held[0].handle, self._chunk0, self.chunk_rows,
                                            rows_of, positions)
        got = _typed(words, wide, dtypes)
        if narrow:
            got = self._narrow(names, positions[:words.shape[1]], got)
        later_wide, later_rows, later_dtypes = self._gather(later)
        assert len(later_wide) == len(later), "deferred columns are 8 bytes wide"
        b_first, cap = self._chunk0, self.chunk_rows

        def rest() -> dict[str, np.ndarray]:
            return _typed(kernels.marked_copy(masks, p0, p1, held[0].handle, b_first, cap,
                                              later_rows), later_wide, later_dtypes)
        return got, rest

    def snapshot(self) -> DataSteM:
        """The stem as it is now, for an invocation that reads off the engine's lock
        (psoup.results.reads): its reads (`take`, `take_marked`, `probe`, `tid_bound`)
        see positions [horizon, n) of now, whatever is appended or expired meanwhile.
        The writer never changes a chunk list in place (it makes a new one), writes
        only rows past n, and reuses a dropped chunk only when nothing references its
        block (`_Chunk.unshared`): the snapshot holds every block it may read. O(1),
        plus O(chunks) once per chunk_rows tuples to list the blocks."""
        view = DataSteM.__new__(DataSteM)
        view.__dict__.update(self.__dict__)         # (copy.copy takes twice as long)
        view._blocks = self._block_list()
        view._origin = self
        return view

    @property
    def origin(self) -> DataSteM:
        """The stem a snapshot was taken of (the stem itself when it is none)."""
        return self if self._origin is None else self._origin

    def defer(self, reader: Any) -> None:
        """Note that `reader` (an answer whose `take_marked` columns are still to be
        taken, with a `settle()` that takes them) holds this stem's chunks: the next time
        retention drops a chunk, every such reader still alive settles first, so
        retention frees the chunks' memory as it always would, however long the answers
        live. O(1); O(readers alive) at that drop."""
        with self._readers_lock:
            self._readers.add(reader)

    def _settle_readers(self) -> None:
        with self._readers_lock:
            readers = list(self._readers)
            self._readers.clear()
        for reader in readers:
            reader.settle()

    def _gather(self, names: Sequence[str]
                ) -> tuple[list[str], np.ndarray, list[np.dtype[Any]]]:
        """(the 8-byte columns among `names`, their rows in a chunk's block, their
        dtypes), kept per tuple of names: O(1) after the first time."""
        key = tuple(names)
        gather = self._gathers.get(key)
        if gather is None:
            wide = [name for name in names if name in self._wide]
            gather = self._gathers[key] = (
                wide, np.array([self._wide[name] for name in wide], dtype=np.int64),
                [self._dtypes[name] for name in wide])
        return gather

    def _narrow(self, names: Sequence[str], positions: np.ndarray,
                got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`got` (the 8-byte columns) with the other columns of `names` (TEXT, BOOL) at
        sorted `positions` added, chunk run by chunk run, in the order of `names`.
        O(len(names) x len(positions))."""
        if len(got) < len(names):
            runs = list(chunk_runs(positions, self.chunk_rows))
        for name in names:
            if name not in got:                         # TEXT and BOOL columns
                values = got[name] = np.empty(len(positions), self._dtypes[name])
                for k, a, b in runs:
                    values[a:b] = self._chunks[k - self._chunk0].cols[name][
                        positions[a:b] - k * self.chunk_rows]
        return {name: got[name] for name in names}

    def _block_list(self) -> tuple[kernels.AddressTable, list[np.ndarray]]:
        """The chunks' blocks (from chunk number _chunk0 on) as a kernels.address_table
        for the compiled gathers, with the blocks themselves (what keeps them alive and
        referenced while a reader holds the table); rebuilt after a chunk came or left:
        O(chunks), about once per chunk_rows tuples."""
        if self._blocks is None:
            blocks = [chunk.block for chunk in self._chunks]
            self._blocks = (kernels.address_table(blocks), blocks)
        return self._blocks

    def lookup(self, tuple_id: int) -> int | None:
        """The position of a retained tuple by its tupleID, or None. O(log n).

        tupleIDs increase with position, so this is the time index's twin.
        """
        k = bisect_right(self._tid_heads, tuple_id) - 1
        if k < 0:
            return None
        chunk = self._chunks[k]
        ids = chunk.cols[TUPLE_ID][:chunk.n]
        i = int(np.searchsorted(ids, tuple_id))
        p = (self._chunk0 + k) * self.chunk_rows + i
        return p if i < chunk.n and ids[i] == tuple_id and p >= self.horizon else None

    # ------------------------------------------------------------------ probes

    def probe(self, source: Source, span: Span | None = None) -> np.ndarray:
        """Sorted positions in `span` (default: everything retained) of the tuples that
        satisfy `source`'s factors (PSoup Fig. 2c: a query probing the Data SteM).

        Over a range, uses a value index when some predicate is estimated to keep under
        INDEX_SELECTIVITY of it, else scans chunk by chunk; over an array of positions,
        evaluates the factors on those tuples only.
        """
        if span is not None and not span.is_range:
            positions = span.array()   # the span's own array: O(1)
            return self._filter(source, positions[positions >= self.horizon])
        p0, p1 = (self.horizon, self.n) if span is None else span.bounds()
        p0 = max(p0, self.horizon)
        p1 = min(p1, self.n)
        if p1 <= p0:
            return np.empty(0, np.int64)
        if not source.predicates and not source.column_factors:
            return np.arange(p0, p1, dtype=np.int64)
        intervals, rest = self._intervals(source)
        # factors that are all intervals are one compiled scan, which beats the value
        # index's Python loop over the chunks (measured, 1M tuples: 1-2 ms where the
        # index's estimate alone took 1.5 ms)
        best = (None if intervals is not None and not rest and not source.column_factors
                else self._most_selective(source.predicates, p0, p1))
        if best is not None:
            candidates = self._index_positions(best, p0, p1)
            return self._filter(source, candidates)
        if intervals is None:
            parts = []
            names = _columns_used(source)
            for chunk, r0, r1, base in self._pieces(p0, p1):
                cols = {name: chunk.cols[name][r0:r1] for name in names}
                parts.append(np.flatnonzero(source_mask(source, cols, r1 - r0)) + (base + r0))
            return np.concatenate(parts) if parts else np.empty(0, np.int64)
        out = self._interval_scan(p0, p1, intervals)
        if not rest and not source.column_factors:
            return out
        return self._filter(replace(source, predicates=rest), out)

    def _interval_scan(self, p0: int, p1: int,
                       intervals: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """`kernels.interval_scan` over [p0, p1), a long range in parts on the cores
        (psoup.stems.halves), each part's matches written at its own offset and then
        moved up behind the parts before it. O(p1 - p0)."""
        out = np.empty(p1 - p0, np.int64)
        parts = halves.ranges(p0, p1, self.chunk_rows, self.threads)
        found = halves.each(lambda ab: self.scan_intervals(intervals, ab[0], ab[1],
                                                           out[ab[0] - p0:]), parts)
        k = found[0]
        for (a, _), count in zip(parts[1:], found[1:], strict=True):
            out[k:k + count] = out[a - p0:a - p0 + count]
            k += count
        return out[:k]

    def probe_gather(self, source: Source, names: Sequence[str]
                     ) -> tuple[np.ndarray, int] | None:
        """`probe` over everything retained and `take` of the 8-byte columns `names` at
        the matches, in one compiled pass (`kernels.interval_gather`, the columns read
        while each chunk is in the cache from its tests; a long range in parts on the
        cores): (a uint64 array whose row 0 holds the matches' positions and rows 1..
        the columns' values, with room for every retained tuple; the number of
        matches). None when a factor is not an interval (or a single `=`) on an 8-byte
        column, or a column is not 8 bytes wide: then `probe`, then `take`.
        O(retained x factors + matches x columns)."""
        wide, rows_of, _ = self._gather(names)
        intervals, rest = self._intervals(source)
        if len(wide) < len(names) or intervals is None or rest or source.column_factors:
            return None
        p0, p1 = self.horizon, self.n
        out = np.empty((1 + len(names), max(p1 - p0, 0)), np.uint64)
        if p1 <= p0:
            return out, 0
        table = self._block_list()[0].handle
        parts = halves.ranges(p0, p1, self.chunk_rows, self.threads)
        found = halves.each(lambda ab: kernels.interval_gather(
            table, self._chunk0, self.chunk_rows, ab[0], ab[1], *intervals, rows_of,
            out[:, ab[0] - p0:]), parts)
        k = found[0]
        for (a, _), count in zip(parts[1:], found[1:], strict=True):
            out[:, k:k + count] = out[:, a - p0:a - p0 + count]
            k += count
        return out, k

    def _intervals(self, source: Source) -> tuple[tuple[np.ndarray, np.ndarray] | None,
                                                  tuple[AttrPredicate, ...]]:
        """`source`'s interval factors on 8-byte columns as `interval_scan`'s arguments
        (per interval: block row, float flag and closed int bounds; closed float bounds),
        and the predicates they leave to check (`=`/IN sets, `!=` lists, other columns;
        the multi-column factors are left too); None for the arguments when there is no
        such interval. O(factors)."""
        ints: list[tuple[int, int, int, int]] = []
        floats: list[tuple[float, float]] = []
        rest = []
        for pred in source.predicates:
            row = self._wide.get(pred.column)
            is_float = self._dtypes[pred.column].kind == "f"
            point = _point(pred, is_float)
            if row is not None and point is not None:     # `= v`: the interval [v, v]
                ints.append((row, 1, 0, 0) if is_float else (row, 0, int(point), int(point)))
                floats.append((float(point), float(point)) if is_float else (0.0, 0.0))
                continue
            if (row is None or pred.empty or pred.eq is not None
                    or (pred.lo is None and pred.hi is None)
                    or (not is_float and (pred.lo_open or pred.hi_open))):
                rest.append(pred)
                continue
            if is_float:
                lo = -math.inf if pred.lo is None else float(pred.lo)
                hi = math.inf if pred.hi is None else float(pred.hi)
                ints.append((row, 1, 0, 0))
                floats.append((math.nextafter(lo, math.inf) if pred.lo_open else lo,
                               math.nextafter(hi, -math.inf) if pred.hi_open else hi))
            else:
                ints.append((row, 0, INT64_MIN if pred.lo is None else int(pred.lo),
                             INT64_MAX if pred.hi is None else int(pred.hi)))
                floats.append((0.0, 0.0))
            if pred.ne:
                rest.append(pred)       # the interval is tested twice, the list once
        if not ints:
            return None, tuple(rest)
        return ((np.array(ints, np.int64).T.copy(), np.array(floats, np.float64).T.copy()),
                tuple(rest))

    def interval_args(self, source: Source
                      ) -> tuple[np.ndarray, np.ndarray] | tuple[()] | None:
        """`source`'s factors as `scan_intervals`' arguments when they are all intervals
        (or single `=`) on 8-byte columns; () when it has no factors; None otherwise
        (then `probe`). O(factors)."""
        if not source.predicates and not source.column_factors:
            return ()
        intervals, rest = self._intervals(source)
        if intervals is None or rest or source.column_factors:
            return None
        return intervals

    def scan_intervals(self, intervals: tuple[np.ndarray, np.ndarray], p0: int, p1: int,
                       out: np.ndarray) -> int:
        """The positions in [p0, p1) (retained) whose values lie in `intervals`
        (`interval_args`) into `out`, in one compiled call on this thread; how many.
        O(p1 - p0)."""
        return kernels.interval_scan(self._block_list()[0].handle, self._chunk0,
                                     self.chunk_rows, p0, p1, *intervals, out)

    def scan_fold(self, intervals: tuple[np.ndarray, np.ndarray], p0: int, p1: int,
                  out: np.ndarray, key: str | None, lo: int, groups: int,
                  column: str | None, log_b: int, b_first: int, cells: Sequence[Any]
                  ) -> tuple[int, int]:
        """`scan_intervals` of [p0, p1) into `out` and `fold_blocks` of the matches in
        the same compiled pass (`kernels.interval_fold`): (matches, those left out).
        O(p1 - p0)."""
        return kernels.interval_fold(self._block_list()[0].handle, self._chunk0,
                                     self.chunk_rows, p0, p1, *intervals, out,
                                     -1 if key is None else self._wide[key], lo,
                                     -1 if column is None else self._wide[column], log_b,
                                     b_first, groups, *cells)

    def probe_held(self, source: Source, p0: int, p1: int) -> np.ndarray:
        """`probe` over positions [p0, p1) that retention has passed but memory still
        holds (from `oldest` up): what a window saw before the horizon moved. A scan,
        O(p1 - p0)."""
        parts = []
        names = _columns_used(source)
        for chunk, r0, r1, base in self._pieces(p0, min(p1, self.n), max(p0, self.oldest)):
            cols = {name: chunk.cols[name][r0:r1] for name in names}
            parts.append(np.flatnonzero(source_mask(source, cols, r1 - r0)) + (base + r0))
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def _filter(self, source: Source, positions: np.ndarray) -> np.ndarray:
        """The subset of sorted `positions` whose tuples satisfy `source`'s factors."""
        if len(positions) == 0 or (not source.predicates and not source.column_factors):
            return positions
        cols = self.take(_columns_used(source), positions)
        kept: np.ndarray = positions[source_mask(source, cols, len(positions))]
        return kept

    def _most_selective(self, preds: Sequence[AttrPredicate], p0: int, p1: int
                        ) -> AttrPredicate | None:
        if not preds or p1 - p0 < 2 * self.chunk_rows:
            return None
        limit = INDEX_SELECTIVITY * (p1 - p0)
        best, best_count = None, limit
        for pred in preds:
            count = sum(_count(chunk.sorted_view(pred.column)[1], pred)
                        for chunk, _, _, _ in self._pieces(p0, p1) if chunk.n == self.chunk_rows)
            if count < best_count:
                best, best_count = pred, count
        return best

    def _index_positions(self, pred: AttrPredicate, p0: int, p1: int) -> np.ndarray:
        parts = []
        for chunk, r0, r1, base in self._pieces(p0, p1):
            if chunk.n == self.chunk_rows:
                order, values = chunk.sorted_view(pred.column)
                rows = np.sort(np.concatenate(
                    [order[a:b] for a, b in _ranges(values, pred)] or [np.empty(0, np.int32)]))
                rows = rows[(rows >= r0) & (rows < r1)]
            else:
                rows = np.flatnonzero(attr_mask(pred, chunk.cols[pred.column][r0:r1])) + r0
            parts.append(rows.astype(np.int64) + base)
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def partition_window(self, columns: Sequence[str], k: int) -> np.ndarray:
        """Sorted positions of the k most recent retained tuples of each distinct value of
        `columns` (CQL's [PARTITION BY columns ROWS k]). O(n log n) over the retained rows.
        """
        p0, p1 = self.horizon, self.n
        if p1 <= p0:
            return np.empty(0, np.int64)
        code = np.zeros(p1 - p0, dtype=np.int64)
        for name in columns:
            uniq, inverse = np.unique(self.slice(name, p0, p1), return_inverse=True)
            code = code * len(uniq) + inverse
        code = code[::-1]
        order = np.argsort(code, kind="stable")
        sorted_code = code[order]
        starts = np.flatnonzero(np.r_[True, sorted_code[1:] != sorted_code[:-1]])
        rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        newest_first = order[rank < k]
        return np.sort(p1 - 1 - newest_first).astype(np.int64)

    # ------------------------------------------------------------------ checkpoints

    def dtype(self, column: str) -> np.dtype[Any]:
        """The storage dtype of a column (ts and tupleID included)."""
        return self._dtypes[column]

    @property
    def wide(self) -> list[str]:
        """The 8-byte columns, in the order of their rows in a chunk's block."""
        return list(self._wide)

    def image(self) -> StemImage:
        """The stream's held chunks and counters, by reference (a checkpoint's cut, under
        the engine's lock). O(chunks)."""
        narrow = [name for name in self._dtypes if name not in self._wide]
        chunks = self._chunks
        return StemImage(self._chunk0, self.n, self.horizon, self.last_ts, self.at_last_ts,
                         self.rows_total, [c.block for c in chunks],
                         [{name: c.cols[name] for name in narrow} for c in chunks],
                         [c.n for c in chunks])

    def restore(self, image: StemImage) -> None:
        """Take back an empty stem's chunks from a checkpoint: `image.blocks` become the
        chunks' blocks as they are (each (wide columns, chunk_rows), rows past its count
        unused), the other columns are copied. No callback runs (what they did was done
        before the checkpoint). O(chunks) plus the TEXT and BOOL values."""
        assert not self._chunks and self.n == 0, "a checkpoint restores an empty stem"
        cap = self.chunk_rows
        for block, narrow, rows in zip(image.blocks, image.narrow, image.rows, strict=True):
            assert block.shape == (len(self._wide), cap) and block.dtype == np.uint64
            chunk = _Chunk(self._dtypes, self._wide, cap, block)
            for name, values in narrow.items():
                chunk.cols[name][:rows] = values[:rows]
            chunk.n = rows
            self._chunks.append(chunk)
            self._heads.append(float(chunk.cols[TS][0]))
            self._tid_heads.append(int(chunk.cols[TUPLE_ID][0]))
        self._blocks = None
        self._chunk0, self.n, self.horizon = image.chunk0, image.n, image.horizon
        self.last_ts, self.at_last_ts = image.last_ts, image.at_last_ts
        self.rows_total = image.rows_total

    def _check(self) -> None:
        """Assert the structure's invariants (for tests). O(retained)."""
        cap = self.chunk_rows
        assert 0 <= self.horizon <= self.n, (self.horizon, self.n)
        assert self.oldest <= self.horizon or not self._chunks
        assert len(self._chunks) == len(self._heads) == len(self._tid_heads)
        if self._blocks is not None:
            table, blocks = self._blocks
            assert table.table[:, 0].tolist() == [c.block.ctypes.data for c in self._chunks] and \
                all(b is c.block for b, c in zip(blocks, self._chunks, strict=True)), \
                "stale block list"
        assert len(self._spare) <= SPARE_CHUNKS and all(
            c.n == 0 and not c.index and all(c is not k for k in self._chunks)
            for c in self._spare), "a spare chunk is empty and not in use"
        held = sum(chunk.n for chunk in self._chunks)
        assert self.oldest + held == self.n, "chunks hold every position from oldest to n"
        for i, chunk in enumerate(self._chunks):
            assert chunk.n == cap or i == len(self._chunks) - 1, "only the last chunk fills"
            assert chunk.n > 0
            assert self._heads[i] == chunk.cols[TS][0] and \
                self._tid_heads[i] == chunk.cols[TUPLE_ID][0], "chunk heads index the chunk"
            assert all(chunk.cols[name].base is chunk.block for name in self._wide), \
                "the 8-byte columns are rows of the chunk's block"
        if self._chunks:
            assert (self._chunk0 + 1) * cap > self.horizon or len(self._chunks) == 1, \
                "a chunk wholly below the horizon is dropped"
            ts = self.rows(self.oldest, self.n, expired=True)[TS]
            ids = self.rows(self.oldest, self.n, expired=True)[TUPLE_ID]
            assert (np.diff(ts) >= 0).all(), "ts never decreases"
            assert (np.diff(ids) > 0).all(), "tupleIDs increase"
            assert ts[-1] == self.last_ts
            assert self.at_last_ts >= int((ts == self.last_ts).sum()) > 0, \
                "at_last_ts counts at least the retained rows at the latest ts"
        for chunk in self._chunks:
            for column, (order, values) in chunk.index.items():
                assert chunk.n == cap and (values == chunk.cols[column][order]).all()

    def nbytes(self) -> int:
        total = 0
        for chunk in self._chunks:
            for arr in chunk.cols.values():
                total += arr.nbytes if arr.dtype != object else arr.nbytes + 50 * chunk.n
            for order, values in chunk.index.values():
                total += order.nbytes + values.nbytes
        return total


#: `chunk_select`'s positions when none are wanted (it writes none into an empty array;
#: writable, as the positions it fills are, so that both calls share one compilation).
_NO_POSITIONS = np.empty(0, np.int64)


def _typed(words: np.ndarray, names: Sequence[str], dtypes: Sequence[np.dtype]
           ) -> dict[str, np.ndarray]:
    """name -> row i of a compiled gather's (columns, values) uint64 array, viewed as
    column i's dtype (no copy): the array viewed once per dtype, then a row of that view
    per column (an invocation's fixed cost: a view per column costs twice as much)."""
    if len(set(dtypes)) == 1:           # the common case: rows of one view
        return dict(zip(names, words.view(dtypes[0]), strict=True))
    views: dict[np.dtype, np.ndarray] = {}
    out = {}
    for i, (name, dt) in enumerate(zip(names, dtypes, strict=True)):
        view = views.get(dt)
        if view is None:
            view = views[dt] = words.view(dt)
        out[name] = view[i]
    return out


def chunk_runs(positions: np.ndarray, cap: int) -> Iterator[tuple[int, int, int]]:
    """(chunk number k, a, b) for each run positions[a:b] of sorted positions that lies in
    chunk k (positions k * cap to (k + 1) * cap - 1).

    Example:
        >>> list(chunk_runs(np.array([1, 2, 5, 9]), 4))
        [(0, 0, 2), (1, 2, 3), (2, 3, 4)]
    """
    if len(positions) == 0:
        return
    first, last = int(positions[0]) // cap, int(positions[-1]) // cap
    if first == last:                           # the common case, on every invocation
        yield first, 0, len(positions)
        return
    # one binary search per chunk boundary: O(chunks log n), not a pass over positions
    cuts = [0, *np.searchsorted(positions, np.arange(first + 1, last + 1) * cap).tolist(),
            len(positions)]
    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True), start=first):
        if b > a:
            yield k, a, b


def _columns_used(source: Source) -> list[str]:
    names = {p.column for p in source.predicates}
    for f in source.column_factors:
        names.update((f.left, f.right))
    return sorted(names)


def _point(pred: AttrPredicate, is_float: bool) -> int | float | None:
    """The one value an `=` factor accepts, as the column's type compares it (None when
    it accepts none or several, or an INT beyond int64)."""
    if pred.empty or pred.eq is None or len(pred.eq) != 1:
        return None
    (value,) = pred.eq
    if is_float:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or \
            not INT64_MIN <= int(value) <= INT64_MAX:
        return None
    return int(value)


def _ranges(sorted_values: np.ndarray, pred: AttrPredicate) -> list[tuple[int, int]]:
    """Index ranges of `sorted_values` that may satisfy `pred` (ne is applied later)."""
    if pred.empty or (pred.eq is not None and not pred.eq):
        return []
    if pred.eq is not None:
        keys = sorted(pred.eq)
        lo = np.searchsorted(sorted_values, keys, side="left")
        hi = np.searchsorted(sorted_values, keys, side="right")
        return [(int(a), int(b)) for a, b in zip(lo, hi, strict=True) if a < b]
    a = 0 if pred.lo is None else int(np.searchsorted(
        sorted_values, pred.lo, side="right" if pred.lo_open else "left"))
    b = len(sorted_values) if pred.hi is None else int(np.searchsorted(
        sorted_values, pred.hi, side="left" if pred.hi_open else "right"))
    return [(a, b)] if a < b else []


def _count(sorted_values: np.ndarray, pred: AttrPredicate) -> int:
    return sum(b - a for a, b in _ranges(sorted_values, pred))
