"""Windowed-aggregate copies of the archive: COUNT, SUM, MIN and MAX per minute, hour and
day, kept as Parquet beside the archive.

"Remembrance of Streams Past" (Sect. 5.1) keeps summaries of an archived stream beside
its tuples, so that an aggregate over a long past window need not read them. psoup
keeps one kind: per stream, per *grain* (minute, hour, day: tumbling windows aligned to
the epoch in UTC) and per *bucket* (bucket k of grain G holds the rows with
k x G <= ts < (k + 1) x G), the rows' COUNT(*), their lowest and highest ts, and, for
each INT or FLOAT column c, COUNT(c), SUM(c), MIN(c) and MAX(c) (AVG is SUM / COUNT)::

    FOLDER/stream=NAME/grain=minute|hour|day/agg-{first:020d}-{last:020d}.parquet

One *copy* file per part file and grain, named by the part file's tupleID range
(psoup.archive.layout), with columns ``bucket`` (int64, k), ``count``, ``ts_min``,
``ts_max`` and ``{c}_count``, ``{c}_sum``, ``{c}_min``, ``{c}_max`` per numeric column
(an INT column's sum is decimal128(38, 0), exact; a FLOAT one's float64). No two
columns' names collide, as no suffix holds an underscore. FOLDER
is outside the archive (an engine's is DIR/aggregates, beside DIR/archive): a reader
of ``archive/**/*.parquet`` (DuckDB's glob walks every folder, hidden ones too) never
meets a copy.

A part file's copies are derived from it alone, so they are written when the archive
flushes it (`Rollups.add`, from psoup.archive.parquet) or at any later time from the
file (`Rollups.build`, for an archive written by `psoup archive import`, or before
copies existed), and writing them again replaces them: nothing is counted twice. A
bucket that a flush splits in two has a row in each part's copy; a read adds them up.
Each file is written whole (psoup.fsync.write_whole), so a crash leaves a part with all,
some or none of its copies, never half of one, and a read counts a part only when it
has its three copies (a *complete* part): the rest of its rows are answered from tuples.
A copy whose part file is gone (a dropped stream, a rewritten archive) is never read,
and `build` removes it.

`Rollups.substitute` plans an aggregate over a ts window: the largest span
[A, B) of whole minutes inside it, cut into whole days in the middle, whole hours around
them and whole minutes at the ends (`pieces`); the copies answer the rows of complete
parts in [A, B) and tuples the rest (`Substitute`: which tuples those are). A part file
holds one UTC day (its date partition), so only the copies of the parts of the days a
window meets are read, each decoded once into a bounded cache.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from psoup.archive.layout import PART_NAME, SAMPLE_COLUMN, TS_COLUMN, TUPLE_ID_COLUMN
from psoup.errors import ArchiveError
from psoup.fsync import fsync_dir, make_dir, prune_dir, write_whole
from psoup.query.model import ColumnType
from psoup.strenum import StrEnum


class Grain(StrEnum):
    """A bucket length; its value names the copies' folders (grain=minute) and their
    metadata, and a member formats as it."""

    DAY = "day"
    HOUR = "hour"
    MINUTE = "minute"


#: The grains, coarsest first, and their length in seconds.
GRAINS: dict[Grain, int] = {Grain.DAY: 86400, Grain.HOUR: 3600, Grain.MINUTE: 60}
#: A copy's name: the tupleID range of its part file.
COPY_NAME = re.compile(r"agg-(\d{20})-(\d{20})\.parquet\Z")
#: Merged buckets kept decoded for the next reads, at most this many bytes in all.
CACHE_BYTES = 32 << 20

_MINUTE = GRAINS[Grain.MINUTE]
_LOW = 32
_LOW_MASK = (1 << _LOW) - 1
#: An INT bucket's sum is summed as two 32-bit halves in int64: exact below 2**31 rows.
_MAX_BUCKET_ROWS = (1 << 31) - 1
_INT_SUM = pa.decimal128(38, 0)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def folder_for(root: str | Path) -> Path:
    """Where the copies of the archive at `root` are kept by convention: the folder
    `aggregates` beside it (an engine's DIR/archive has DIR/aggregates). For a tool
    that writes an archive (`psoup archive import`) to keep them where an engine on
    that directory reads them. O(1).

    Example:
        >>> folder_for("DIR/archive").as_posix()
        'DIR/aggregates'
    """
    return Path(root).parent / "aggregates"


def copy_path(folder: str | Path, stream: str, grain: Grain, first: int, last: int) -> Path:
    """Where the `grain` copy of `stream`'s part file of tupleIDs `first`..`last` lives
    under the copies' `folder`. O(1).

    Example:
        >>> copy_path("aggregates", "R", Grain.HOUR, 3, 9).as_posix()
        'aggregates/stream=R/grain=hour/agg-00000000000000000003-00000000000000000009.parquet'
    """
    return (Path(folder) / f"stream={stream}" / f"grain={grain}"
            / f"agg-{first:020d}-{last:020d}.parquet")


def numeric_columns(schema: pa.Schema) -> list[tuple[str, ColumnType]]:
    """(name, INT or FLOAT) of the columns of a part file's schema that get
    statistics: the stream's INT and FLOAT columns (not ts, tuple_id or the draws).

    Example:
        >>> numeric_columns(pa.schema([("ts", pa.float64()), ("tuple_id", pa.int64()),
        ...                            ("a", pa.int64()), ("s", pa.string())]))
        [('a', <ColumnType.INT: 'int'>)]
    """
    out: list[tuple[str, ColumnType]] = []
    for field in schema:
        if field.name in (TS_COLUMN, TUPLE_ID_COLUMN, SAMPLE_COLUMN):
            continue
        if pa.types.is_integer(field.type):
            out.append((field.name, ColumnType.INT))
        elif pa.types.is_floating(field.type):
            out.append((field.name, ColumnType.FLOAT))
    return out


def minutes(ts: np.ndarray) -> np.ndarray:
    """The minute bucket of each ts (floor(ts / 60)), int64. Every grain's bucket is
    derived from it by integer division, so a row's buckets agree at every grain and
    with `Substitute.keep`. O(n).

    Example:
        >>> minutes(np.array([-0.5, 0.0, 59.9, 3600.0])).tolist()
        [-1, 0, 0, 60]
    """
    return np.floor_divide(np.asarray(ts, np.float64), float(_MINUTE)).astype(np.int64)


def summarize(table: pa.Table, grain: Grain) -> pa.Table:
    """The `grain` copy of a part file's rows (`table`: ts and the stream's columns, in
    any order): one row per bucket, in bucket order. O(n log n).

    Raises:
        ArchiveError: a numeric column holds nulls, or a bucket has 2**31 rows or more.

    Example:
        >>> t = pa.table({"ts": [0.0, 30.0, 61.0], "a": [2, 5, 7]})
        >>> summarize(t, Grain.MINUTE).to_pydict()["a_sum"]
        [Decimal('7'), Decimal('7')]
    """
    ts = np.asarray(table.column(TS_COLUMN).to_numpy(), np.float64)
    keys = minutes(ts) // (GRAINS[grain] // _MINUTE)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else \
        np.empty(0, np.int64)
    counts = np.diff(np.r_[starts, len(keys)]).astype(np.int64)
    if len(counts) and counts.max() > _MAX_BUCKET_ROWS:
        raise ArchiveError(f"a {grain} bucket of {counts.max()} rows is too large to sum "
                           "exactly (at most 2**31 - 1)")
    ordered_ts = ts[order]
    reduce = partial(_reduce, starts=starts)
    columns: dict[str, Any] = {
        "bucket": pa.array(keys[starts] if len(keys) else keys, pa.int64()),
        "count": pa.array(counts, pa.int64()),
        "ts_min": pa.array(reduce(np.minimum, ordered_ts), pa.float64()),
        "ts_max": pa.array(reduce(np.maximum, ordered_ts), pa.float64())}
    for name, ctype in numeric_columns(table.schema):
        column = table.column(name)
        if column.null_count:
            raise ArchiveError(f"column '{name}' holds {column.null_count} null(s): "
                               "psoup's archive has none")
        values = column.to_numpy(zero_copy_only=False)[order]
        columns[f"{name}_count"] = pa.array(counts, pa.int64())
        if ctype == ColumnType.INT:
            values = values.astype(np.int64, copy=False)
            high = reduce(np.add, values >> _LOW).tolist()
            low = reduce(np.add, values & _LOW_MASK).tolist()
            columns[f"{name}_sum"] = pa.array(
                [(h << _LOW) + lo for h, lo in zip(high, low, strict=True)], _INT_SUM)
            arrow = pa.int64()
        else:
            values = values.astype(np.float64, copy=False)
            columns[f"{name}_sum"] = pa.array(reduce(np.add, values), pa.float64())
            arrow = pa.float64()
        columns[f"{name}_min"] = pa.array(reduce(np.minimum, values), arrow)
        columns[f"{name}_max"] = pa.array(reduce(np.maximum, values), arrow)
    return pa.table(columns, metadata={b"psoup.grain": grain.encode()})


def _reduce(ufunc: np.ufunc, values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """`ufunc` over each run of `values` starting at `starts` (empty when no run)."""
    if not len(starts):
        return values[:0]
    with np.errstate(over="ignore", invalid="ignore"):
        return ufunc.reduceat(values, starts)


def pieces(begin: float, end: float) -> list[tuple[Grain, int, int]]:
    """The whole buckets inside the window begin <= ts <= end, as (grain, first bucket,
    end bucket) runs: the span [A, B) of whole minutes in it (B: the minute holding
    `end` is left out, as rows at `end` itself are in the window but the rest of that
    minute is not), days in the middle, hours around them, minutes at the ends, in ts
    order. Infinite edges are not allowed (the caller clips them). O(1).

    Example:
        >>> [(str(g), first, end) for g, first, end in pieces(3540.0, 2 * 86400.0 + 120.0)]
        [('minute', 59, 60), ('hour', 1, 24), ('day', 1, 2), ('minute', 2880, 2882)]
    """
    a, b = math.ceil(begin / _MINUTE) * _MINUTE, math.floor(end / _MINUTE) * _MINUTE
    out: list[tuple[Grain, int, int]] = []

    def cover(lo: int, hi: int, grains: Sequence[Grain]) -> None:
        if lo >= hi:
            return
        grain, rest = grains[0], grains[1:]
        g = GRAINS[grain]
        first, last = -(-lo // g), hi // g
        if first >= last:
            cover(lo, hi, rest)
            return
        cover(lo, first * g, rest)
        out.append((grain, first, last))
        cover(last * g, hi, rest)

    cover(a, b, list(GRAINS))
    return out


class Coverage(NamedTuple):
    """The tupleIDs a stream's copies hold: runs [firsts[i], lasts[i]] of consecutive
    complete parts (no other part of the stream between them), sorted, disjoint."""

    firsts: np.ndarray
    lasts: np.ndarray

    def covers(self, tids: np.ndarray) -> np.ndarray:
        """Whether each tupleID is in a run. O(n log runs)."""
        i = np.searchsorted(self.firsts, tids, side="right") - 1
        inside = i >= 0
        return inside & (tids <= self.lasts[np.maximum(i, 0)]) if len(self.firsts) else \
            np.zeros(len(tids), bool)

    def covers_range(self, first: int, last: int) -> bool:
        """Whether every tupleID of the stream in [first, last] is in one run. O(log)."""
        i = int(np.searchsorted(self.firsts, first, side="right")) - 1
        return i >= 0 and last <= int(self.lasts[i])


@dataclass(frozen=True)
class Substitute:
    """What the copies answer of an aggregate over begin <= ts <= end: the rows with
    a <= ts < b (whole minutes) of the covered tupleIDs; `totals` are their statistics
    (`Rollups.totals`). The tuples to read are the window's others (`keep`), and a run
    of them need not be read when the copies answer all of it (`whole`).

    Example:
        >>> cov = Coverage(np.array([0]), np.array([9]))
        >>> s = Substitute(0.0, 200.0, 60.0, 180.0, cov, {})
        >>> s.keep(np.array([30.0, 60.0, 100.0, 100.0]), np.array([1, 2, 3, 12])).tolist()
        [True, False, False, True]
    """

    begin: float
    end: float
    a: float
    b: float
    coverage: Coverage
    totals: dict[str, Any]
    before: bool = True
    after: bool = True

    def whole(self, lo: float, hi: float, first: int, last: int) -> bool:
        """Whether the copies answer every row in the window of a run of tuples with ts
        in [lo, hi] and tupleIDs in [first, last] (it need not be read): all covered,
        and none in the window's parts outside [a, b), unless the copies show that no
        covered row lies there (`before`: one with begin <= ts < a may; `after`: one
        with b <= ts <= end may). O(log runs)."""
        lo, hi = max(lo, self.begin), min(hi, self.end)
        if lo > hi:
            return True
        low, high = minutes(np.array([lo, hi])).tolist()
        return ((low >= round(self.a) // _MINUTE or not self.before)
                and (high < round(self.b) // _MINUTE or not self.after)
                and self.coverage.covers_range(first, last))

    def keep(self, ts: np.ndarray, tids: np.ndarray) -> np.ndarray:
        """Which of these tuples (all in the window) the copies do not answer. O(n)."""
        m = minutes(ts)
        inside = (m >= round(self.a) // _MINUTE) & (m < round(self.b) // _MINUTE)
        covered: NDArray[np.bool_] = self.coverage.covers(np.asarray(tids, np.int64))
        return ~(inside & covered)


class Buckets(NamedTuple):
    """The buckets of one copy, or of several merged by bucket, in bucket order:
    `bucket` (int64), `rows` (COUNT(*), int64), `ts_min` and `ts_max` (float64), and
    per numeric column name -> (sums, mins, maxs) (an INT column's sums are Python
    ints). Memory: O(buckets x columns)."""

    bucket: np.ndarray
    rows: np.ndarray
    ts_min: np.ndarray
    ts_max: np.ndarray
    columns: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]

    def nbytes(self) -> int:
        """Bytes held (a Python int counted as its pointer and ~32 bytes of object)."""
        own = (self.bucket.nbytes + self.rows.nbytes + self.ts_min.nbytes
               + self.ts_max.nbytes)
        per = sum(s.nbytes * (5 if s.dtype == object else 1) + lo.nbytes + hi.nbytes
                  for s, lo, hi in self.columns.values())
        return own + per


def _decode(table: pa.Table, columns: Sequence[tuple[str, ColumnType]]) -> Buckets:
    """A copy's buckets (a table of `summarize`'s columns), with the statistics of
    `columns`, as numpy (an INT column's sums as Python ints). O(buckets)."""
    def column(name: str) -> np.ndarray:
        values: np.ndarray = table.column(name).to_numpy(zero_copy_only=False)  # pyarrow: Any
        return values

    stats = {}
    for c, ctype in columns:
        sums = (np.array([int(v) for v in table.column(f"{c}_sum").to_pylist()], dtype=object)
                if ctype == ColumnType.INT else column(f"{c}_sum").astype(np.float64))
        stats[c] = (sums, column(f"{c}_min"), column(f"{c}_max"))
    return Buckets(column("bucket"), column("count"), column("ts_min"), column("ts_max"),
                   stats)


def _combine(parts: Sequence[Buckets],
             columns: Sequence[tuple[str, ColumnType]]) -> Buckets:
    """The buckets of `parts` merged by bucket: counts and sums added, extremes kept.
    O(n log n) over their n buckets."""
    if not parts:
        empty = np.empty(0, np.int64)
        ints = {c: t == ColumnType.INT for c, t in columns}
        return Buckets(empty, empty, np.empty(0), np.empty(0), {
            c: (np.empty(0, object if i else np.float64),
                np.empty(0, np.int64 if i else np.float64),
                np.empty(0, np.int64 if i else np.float64)) for c, i in ints.items()})
    keys = np.concatenate([p.bucket for p in parts])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    reduce = partial(_reduce, starts=starts)

    def merged(ufunc: np.ufunc, arrays: list[np.ndarray]) -> np.ndarray:
        return reduce(ufunc, np.concatenate(arrays)[order])

    stats = {c: (merged(np.add, [p.columns[c][0] for p in parts]),
                 merged(np.minimum, [p.columns[c][1] for p in parts]),
                 merged(np.maximum, [p.columns[c][2] for p in parts])) for c, _ in columns}
    return Buckets(keys[starts], merged(np.add, [p.rows for p in parts]),
                   merged(np.minimum, [p.ts_min for p in parts]),
                   merged(np.maximum, [p.ts_max for p in parts]), stats)


def _locked(method: Callable[Concatenate[Rollups, _P], _R]
            ) -> Callable[Concatenate[Rollups, _P], _R]:
    """`method` under the index's lock (`Rollups._lock`, reentrant)."""
    def locked(self: Rollups, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            return method(self, *args, **kwargs)
    functools.update_wrapper(locked, method)
    return locked


class Rollups:
    """The windowed-aggregate copies of one archive (see the module docstring).

    Keeps an index of the part files (each with its UTC day: a part file holds one day
    of its stream) and their copies, by stream: O(part files) memory; and the decoded
    copies read last (at most CACHE_BYTES). An aggregate over a window reads only the
    copies of the parts of the days the window meets. The index and the cache are
    under a lock of their own: an engine's archive writes copies on its flusher thread
    (`write`, off every lock) and indexes them there (`publish`, a short step), while
    the engine's threads read them; a read sees a part complete or not at all.

    Args:
        root: the archive directory (its part files are read, never written).
        folder: the copies' directory, outside `root`; created when first written.
        private: directories and files owner-only (an engine's data directory).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     r = Rollups(Path(d) / "archive", Path(d) / "aggregates")
        ...     _ = r.add("R", pa.table({"ts": [0.0, 61.0], "a": [2, 5]}), 0, 1)
        ...     r.buckets("R", Grain.MINUTE, [("a", ColumnType.INT)]).rows.tolist()
        [1, 1]
    """

    def __init__(self, root: str | Path, folder: str | Path, private: bool = False):
        self.root = Path(root)
        self.folder = Path(folder)
        self.private = private
        self._parts: dict[str, dict[tuple[int, int], int]] = {}    # part -> its day
        self._copies: dict[str, dict[tuple[int, int], set[Grain]]] = {}
        self._complete: dict[str, list[tuple[int, int]]] = {}
        self._coverage: dict[str, Coverage] = {}
        self._days: dict[str, tuple[np.ndarray, list[tuple[int, int]]]] = {}
        # (stream, grain, part, columns) -> the part's copy, least recently used first
        self._cache: OrderedDict[tuple[str, Grain, tuple[int, int],
                                       tuple[tuple[str, ColumnType], ...]], Buckets] = \
            OrderedDict()
        self._cached = 0
        self._lock = threading.RLock()
        #: bumped at every change of the index: what was derived from it is stale
        self.version = 0
        if self.folder.is_dir():
            for tmp in self.folder.rglob("*.tmp"):          # a write cut short
                tmp.unlink()
        self.refresh()

    # ------------------------------------------------------------------ index

    @_locked
    def refresh(self) -> None:
        """Index the part files and copies on disk again (after another process wrote
        the archive). O(files)."""
        self._parts, self._copies = {}, {}
        for path in self.root.glob("stream=*/date=*/part-*.parquet"):
            m = PART_NAME.match(path.name)
            day = _day_of(path.parent.name)
            if m and day is not None:
                stream = path.parent.parent.name[len("stream="):]
                self._parts.setdefault(stream, {})[(int(m.group(1)), int(m.group(2)))] = day
        for stream, grain, first, last, _ in self._copy_files():
            self._copies.setdefault(stream, {}).setdefault((first, last), set()).add(grain)
        for stream in {k[0] for k in self._cache} | set(self._complete):
            self._changed(stream)

    def _copy_files(self, stream: str = "*") -> Iterator[tuple[str, Grain, int, int, Path]]:
        """(stream, grain, first, last, path) of every copy file of `stream`."""
        for path in self.folder.glob(f"stream={stream}/grain=*/agg-*.parquet"):
            m = COPY_NAME.match(path.name)
            grain = path.parent.name[len("grain="):]
            if m and grain in GRAINS:
                yield (path.parent.parent.name[len("stream="):], Grain(grain), int(m.group(1)),
                       int(m.group(2)), path)

    def _changed(self, stream: str, part: tuple[int, int] | None = None) -> None:
        """The index of `stream` changed: forget what was derived from it, and the
        decoded copies of `part` (default: of every part of the stream). O(cache)."""
        self.version += 1
        self._complete.pop(stream, None)
        self._coverage.pop(stream, None)
        self._days.pop(stream, None)
        for key in [k for k in self._cache
                    if k[0] == stream and (part is None or k[2] == part)]:
            self._cached -= self._cache.pop(key).nbytes()

    @_locked
    def complete(self, stream: str) -> list[tuple[int, int]]:
        """The tupleID ranges of `stream`'s part files that have all their copies,
        sorted. O(parts log parts), then O(1) until the index changes."""
        got = self._complete.get(stream)
        if got is None:
            copies = self._copies.get(stream, {})
            got = self._complete[stream] = sorted(
                r for r in self._parts.get(stream, {}) if len(copies.get(r, ())) == len(GRAINS))
        return got

    @_locked
    def coverage(self, stream: str) -> Coverage:
        """The tupleIDs the copies of `stream` answer: runs of consecutive complete
        parts. O(parts log parts), then O(1) until the index changes."""
        got = self._coverage.get(stream)
        if got is None:
            got = self._coverage[stream] = self._runs(stream)
        return got

    def _runs(self, stream: str) -> Coverage:
        done = set(self.complete(stream))
        firsts: list[int] = []
        lasts: list[int] = []
        joined = False
        for part in sorted(self._parts.get(stream, {})):
            if part not in done:
                joined = False
            elif joined:
                lasts[-1] = part[1]
            else:
                firsts.append(part[0])
                lasts.append(part[1])
                joined = True
        return Coverage(np.array(firsts, np.int64), np.array(lasts, np.int64))

    def _day_index(self, stream: str) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """The complete parts of `stream` ordered by UTC day, and their days.
        O(parts log parts) once a change, then O(1)."""
        got = self._days.get(stream)
        if got is None:
            days = self._parts.get(stream, {})
            ordered = sorted(self.complete(stream), key=lambda r: (days[r], r))
            got = self._days[stream] = (np.array([days[r] for r in ordered], np.int64),
                                        ordered)
        return got

    def _on_days(self, stream: str, first_day: int, last_day: int) -> list[tuple[int, int]]:
        """The complete parts of `stream` whose UTC day is in [first_day, last_day].
        O(log parts + found)."""
        index, parts = self._day_index(stream)
        i = int(np.searchsorted(index, first_day, side="left"))
        j = int(np.searchsorted(index, last_day, side="right"))
        return parts[i:j]

    # ------------------------------------------------------------------ write

    def add(self, stream: str, table: pa.Table, first: int, last: int,
            day: int | None = None) -> list[Path]:
        """Write the copies of `stream`'s part file of tupleIDs first..last, whose rows
        are `table` (ts and the stream's columns): one file per grain, each written
        whole, replacing any earlier copy of that part. The rows must lie in one UTC
        day (`day`, its date partition's, when given: the index finds a part by the
        day of its folder); a part whose rows do not (another tool's file) gets no
        copies, and loses any it had, so its rows are answered from tuples.
        O(rows log rows).

        Returns:
            The copies written.

        Raises:
            ArchiveError: see `summarize`. OSError: a file could not be written (the
            copies written before it stay; the part is not complete).
        """
        written, found = self.write(stream, table, first, last, day)
        self.publish(stream, first, last, found)
        return written

    def write(self, stream: str, table: pa.Table, first: int, last: int,
              day: int | None = None) -> tuple[list[Path], int | None]:
        """The file half of `add`: the copies written (or, for rows not of one day,
        removed) and the part's day (None: it gets no copies), the index untouched, so
        that a flush beside the engine's writer writes them off every lock and makes
        them visible with `publish`, at once. O(rows log rows).

        Raises:
            as `add`.
        """
        summaries = {grain: summarize(table, grain) for grain in GRAINS}
        days = summaries[Grain.DAY].column("bucket").to_pylist()
        if len(days) != 1 or day not in (None, days[0]):
            for grain in GRAINS:
                copy_path(self.folder, stream, grain, first, last).unlink(missing_ok=True)
            return [], None
        written = []
        stream_dir = self.folder / f"stream={stream}"
        make_dir(self.folder, self.private)
        make_dir(stream_dir, self.private)
        for grain, summary in summaries.items():
            path = copy_path(self.folder, stream, grain, first, last)
            make_dir(path.parent, self.private)
            write_whole(path, partial(pq.write_table, summary), self.private)
            fsync_dir(path.parent)
            written.append(path)
        fsync_dir(stream_dir)
        fsync_dir(self.folder)
        return written, int(days[0])

    def publish(self, stream: str, first: int, last: int, day: int | None) -> None:
        """Index the copies `write` wrote of the part first..last (day None: it has
        none). O(cache) under the index's lock: a reader sees the part complete or
        not at all."""
        with self._lock:
            if day is None:
                self._copies.get(stream, {}).pop((first, last), None)
            else:
                self._parts.setdefault(stream, {})[(first, last)] = day
                self._copies.setdefault(stream, {})[(first, last)] = set(GRAINS)
            self._changed(stream, (first, last))

    @_locked
    def build(self, stream: str | None = None, rebuild: bool = False) -> int:
        """Write the copies of the part files of `stream` (default: every stream) that
        lack one (`rebuild`: of every part file), each from the part file alone, and
        remove the copies whose part file is gone. Idempotent; a crash midway leaves
        complete parts and parts answered from tuples, none counted twice. Returns the
        number of part files read. O(rows of those parts).

        Raises:
            ArchiveError: a part file cannot be read or summarized (naming it).
        """
        self.refresh()
        pattern = "*" if stream is None else stream
        built = 0
        done = {name: set(self.complete(name)) for name in self._parts}
        for path in sorted(self.root.glob(f"stream={pattern}/date=*/part-*.parquet")):
            m = PART_NAME.match(path.name)
            day = _day_of(path.parent.name)
            if not m or day is None:
                continue
            name = path.parent.parent.name[len("stream="):]
            first, last = int(m.group(1)), int(m.group(2))
            if not rebuild and (first, last) in done.get(name, ()):
                continue
            try:
                schema = pq.read_schema(path)
                wanted = [TS_COLUMN] + [c for c, _ in numeric_columns(schema)]
                table = pq.read_table(path, columns=wanted)
                self.add(name, table, first, last, day)
            except ArchiveError as exc:
                raise ArchiveError(f"{path}: {exc}") from None
            except (OSError, pa.ArrowException) as exc:
                raise ArchiveError(f"{path} cannot be read ({exc})") from None
            built += 1
        for name, _, first, last, path in list(self._copy_files(pattern)):
            if (first, last) not in self._parts.get(name, {}):
                path.unlink()
                self._copies.get(name, {}).pop((first, last), None)
                self._changed(name, (first, last))
        return built

    @_locked
    def drop(self, stream: str, below: int) -> None:
        """Forget the copies of `stream`'s part files of tupleIDs below `below` (as
        `Archive.drop` forgets the part files; called before it, so that a crash
        between the two leaves parts without copies, never copies without parts).
        O(copies of the stream)."""
        for _, _, _, last, path in list(self._copy_files(stream)):
            if last < below:
                path.unlink()
        if (self.folder / f"stream={stream}").is_dir():
            prune_dir(self.folder / f"stream={stream}", self.folder)
        self._parts[stream] = {r: d for r, d in self._parts.get(stream, {}).items()
                               if r[1] >= below}
        self._copies[stream] = {r: g for r, g in self._copies.get(stream, {}).items()
                                if r[1] >= below}
        self._changed(stream)

    # ------------------------------------------------------------------ read

    def _copy(self, stream: str, grain: Grain, part: tuple[int, int],
              columns: tuple[tuple[str, ColumnType], ...]) -> Buckets:
        """The `grain` copy of `stream`'s complete part `part`, decoded with the
        statistics of `columns`: from the cache, or O(its buckets) from its file.

        Raises:
            ArchiveError: the copy is gone, damaged or lacks one of `columns`.
        """
        key = (stream, grain, part, columns)
        got = self._cache.get(key)
        if got is not None:
            self._cache.move_to_end(key)
            return got
        wanted = ["bucket", "count", "ts_min", "ts_max"] + [
            f"{c}_{stat}" for c, _ in columns for stat in ("sum", "min", "max")]
        path = copy_path(self.folder, stream, grain, *part)
        try:
            got = _decode(pq.read_table(path, columns=wanted), columns)
        except (OSError, pa.ArrowException, KeyError) as exc:
            raise ArchiveError(f"the aggregate copy {path} cannot be read ({exc}); "
                               "build the copies again (Rollups.build with "
                               "rebuild=True)") from None
        size = got.nbytes()
        if size <= CACHE_BYTES:
            self._cache[key] = got
            self._cached += size
            while self._cached > CACHE_BYTES:
                _, old = self._cache.popitem(last=False)
                self._cached -= old.nbytes()
        return got

    @_locked
    def buckets(self, stream: str, grain: Grain, columns: Sequence[tuple[str, ColumnType]]
                ) -> Buckets:
        """The `grain` buckets of all `stream`'s complete parts, merged by bucket (a
        bucket split across flushes is one row), with the statistics of `columns`
        ((name, type) pairs). O(copy rows log copy rows), each copy read or cached.

        Raises:
            ArchiveError: a copy file is gone, damaged or lacks one of `columns`.
        """
        cols = tuple(columns)
        return _combine([self._copy(stream, grain, part, cols)
                         for part in self.complete(stream)], cols)

    @_locked
    def substitute(self, stream: str, begin: float, end: float,
                   columns: Sequence[tuple[str, ColumnType]]) -> Substitute | None:
        """How the copies answer part of an aggregate over `stream`'s rows with
        begin <= ts <= end: a `Substitute` with the statistics of `columns` over the
        whole buckets inside the window (`pieces`, the window first clipped to the
        days of the complete parts, so that infinite or far edges cost nothing) for
        the covered tupleIDs, or None when no whole minute of the window has a
        complete part. Reads the copies of the parts of the days the window meets.

        Raises:
            ArchiveError: a copy file cannot be read.
        """
        days, _ = self._day_index(stream)
        if not len(days):
            return None
        cols = tuple(columns)
        day = GRAINS[Grain.DAY]
        lo = max(begin, float(days[0]) * day)
        hi = min(end, float(days[-1] + 1) * day)
        runs = pieces(lo, hi) if lo <= hi else []
        if not runs:
            return None
        a = runs[0][1] * GRAINS[runs[0][0]]
        b = runs[-1][2] * GRAINS[runs[-1][0]]
        # covered rows in the window's partial minutes: only in the minute before a
        # (ts >= begin) and the one from b (ts <= end), as their ts range shows
        before = self._minute_meets(stream, a // _MINUTE - 1, cols,
                                    lambda got, k: bool(got.ts_max[k] >= begin))
        after = self._minute_meets(stream, b // _MINUTE, cols,
                                   lambda got, k: bool(got.ts_min[k] <= end))
        return Substitute(begin, end, float(a), float(b), self.coverage(stream),
                          self.totals(stream, runs, cols), before, after)

    def _minute_meets(self, stream: str, minute: int,
                      columns: tuple[tuple[str, ColumnType], ...], test: Any) -> bool:
        """Whether some complete part has rows in `minute` for which `test(copy,
        index)` holds."""
        day = minute * _MINUTE // GRAINS[Grain.DAY]
        for part in self._on_days(stream, day, day):
            got = self._copy(stream, Grain.MINUTE, part, columns)
            k = int(np.searchsorted(got.bucket, minute))
            if k < len(got.bucket) and got.bucket[k] == minute and test(got, k):
                return True
        return False

    @_locked
    def totals(self, stream: str, runs: Sequence[tuple[Grain, int, int]],
               columns: Sequence[tuple[str, ColumnType]]) -> dict[str, Any]:
        """COUNT(*), the latest ts, and per column (name, type) of `columns` its SUM,
        MIN and MAX (None without rows) over the buckets `runs` ((grain, first, end)
        from `pieces`) of `stream`'s complete parts: {"count": n, "ts_max": t,
        "sum": {c: s}, "min": {c: m}, "max": {c: m}}. O(parts of the days the runs
        meet x log buckets), plus the copies read."""
        cols = tuple(columns)
        count = 0
        ts_max = -math.inf
        sums: dict[str, Any] = {c: 0 if t == ColumnType.INT else 0.0 for c, t in cols}
        mins: dict[str, Any] = {c: None for c, _ in cols}
        maxs: dict[str, Any] = {c: None for c, _ in cols}
        day = GRAINS[Grain.DAY]
        for grain, first, stop in runs:
            g = GRAINS[grain]
            for part in self._on_days(stream, first * g // day, (stop * g - 1) // day):
                got = self._copy(stream, grain, part, cols)
                i, j = np.searchsorted(got.bucket, [first, stop]).tolist()
                if i == j:
                    continue
                count += int(got.rows[i:j].sum())
                ts_max = max(ts_max, float(got.ts_max[i:j].max()))
                for c, ctype in cols:
                    s, lo, hi = got.columns[c]
                    sums[c] += (sum(s[i:j].tolist()) if ctype == ColumnType.INT
                                else float(np.sum(s[i:j])))
                    low, high = lo[i:j].min().item(), hi[i:j].max().item()
                    mins[c] = low if mins[c] is None else min(mins[c], low)
                    maxs[c] = high if maxs[c] is None else max(maxs[c], high)
        return {"count": count, "ts_max": ts_max if count else None,
                "sum": sums, "min": mins, "max": maxs}

    # ------------------------------------------------------------------ introspection

    def disk_bytes(self, stream: str | None = None) -> int:
        """Bytes of the copy files of `stream` (default: all). O(copy files)."""
        return sum(path.stat().st_size for *_, path in self._copy_files(stream or "*"))

    def nbytes(self) -> int:
        """Bytes of decoded copies held in memory (the cache)."""
        return self._cached

    @_locked
    def stats(self) -> dict[str, dict[str, int]]:
        """Per stream with copies: its complete parts, all its parts, and the copy
        files' bytes. O(copy files)."""
        out: dict[str, dict[str, int]] = {}
        for stream in sorted(set(self._parts) | set(self._copies)):
            if not self._copies.get(stream):
                continue
            out[stream] = {"complete_parts": len(self.complete(stream)),
                           "parts": len(self._parts.get(stream, {})),
                           "bytes": self.disk_bytes(stream)}
        return out

    @_locked
    def _check(self) -> None:
        """Assert the invariants (for tests): the index equals the files on disk; the
        parts of a stream never overlap; a copy's buckets are sorted and unique, its
        counts positive, its ts within its buckets and its part's day; the cache within
        its bytes, each entry equal to its file decoded. Reads every copy."""
        on_disk: dict[str, dict[tuple[int, int], set[str]]] = {}
        for stream, grain, first, last, path in self._copy_files():
            on_disk.setdefault(stream, {}).setdefault((first, last), set()).add(grain)
            table = pq.read_table(path)
            keys = table.column("bucket").to_numpy()
            assert (np.diff(keys) > 0).all(), f"{path}: buckets sorted and unique"
            assert (table.column("count").to_numpy() > 0).all(), f"{path}: no empty bucket"
            g = GRAINS[grain]
            lo, hi = table.column("ts_min").to_numpy(), table.column("ts_max").to_numpy()
            assert (minutes(lo) // (g // _MINUTE) == keys).all(), f"{path}: ts in bucket"
            assert (minutes(hi) // (g // _MINUTE) == keys).all(), f"{path}: ts in bucket"
            day = self._parts.get(stream, {}).get((first, last))
            assert day is None or (minutes(lo) // 1440 == day).all(), f"{path}: its day"
        assert on_disk == {s: c for s, c in self._copies.items() if c}, "index of copies"
        for stream, parts in self._parts.items():
            ranges = sorted(parts)
            assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False)), stream
            cov = self.coverage(stream)
            assert (cov.firsts <= cov.lasts).all() and (cov.lasts[:-1] < cov.firsts[1:]).all()
        assert self._cached == sum(b.nbytes() for b in self._cache.values()) <= CACHE_BYTES
        for (stream, grain, part, columns), got in list(self._cache.items()):
            assert part in self.complete(stream), "only complete parts are read"
            fresh = _decode(pq.read_table(copy_path(self.folder, stream, grain, *part)),
                            columns)
            for a, b in zip(got[:4], fresh[:4], strict=True):
                assert np.array_equal(a, b), "a cached copy equals its file"
            for c, _ in columns:
                for a, b in zip(got.columns[c], fresh.columns[c], strict=True):
                    assert a.tolist() == b.tolist(), c


def _day_of(folder: str) -> int | None:
    """The UTC day number of a date partition's name (date=YYYY-MM-DD), None if it is
    not one."""
    try:
        return int(np.datetime64(folder[len("date="):], "D").astype(np.int64))
    except ValueError:
        return None
