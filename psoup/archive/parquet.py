"""The archive: tuples that left a Data SteM's retention, as Parquet by stream and UTC day.

PSoup's Data SteMs keep only a maximum window (PSoup paper, Sect. 4.2, footnote 3);
"Remembrance of Streams Past" (Sect. 5.1) keeps what falls out of it in an append-only
store clustered by timestamp, so a history scan from a given time is one seek and a
sequential read. Here that store is a Hive-partitioned Parquet tree, the contract with the
Spark jobs (docs/design.md, "History") and any other Parquet reader::

    root/stream=NAME/date=YYYY-MM-DD/part-{first tupleID:020d}-{last tupleID:020d}.parquet

Each file holds ``ts`` (float64), ``tuple_id`` (int64), the stream's columns in schema
order and each row's random draw (``psoup_sample``), in the sampled layout of
psoup.archive.sampling (row groups that are each a uniform sample, each in tupleID
order); the psoup schema rides along in the key-value metadata (``psoup.stream``,
``psoup.columns``). A stream's ts never decreases, so each UTC day of
a flush is one contiguous run of tupleIDs and the files of a stream never overlap.

The archive is idempotent under replay: a stream's *high water mark* (the largest archived
tupleID, read back from the file names on open) lets a restarted engine hand the same
expired rows again without any being archived twice.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import ArrayLike, NDArray

from psoup.archive.layout import (
    ARROW_TYPES,
    PART_NAME,
    SECONDS_PER_DAY,
    TS_COLUMN,
    TUPLE_ID_COLUMN,
    arrow_schema,
    part_path,
)
from psoup.archive.rollups import Rollups
from psoup.archive.sampling import in_order, write_runs
from psoup.errors import DiskFull, SchemaError, disk_full, is_disk_full
from psoup.fsync import fsync_dir, make_dir, prune_dir, write_whole
from psoup.query.model import TS, TUPLE_ID, ColumnType
from psoup.stems.batch import DTYPES

log = logging.getLogger("psoup.archive")

#: Seconds between attempts of the automatic flush after one failed (a full disk): each
#: attempt writes up to a buffer's worth of Parquet before it fails.
RETRY_SECONDS = 1.0


class _Buffer:
    """A stream's rows waiting for a flush: Arrow tables of one schema, in tupleID order."""

    __slots__ = ("schema", "parts", "rows", "last_tid")

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.parts: list[pa.Table] = []
        self.rows = 0
        self.last_tid = -1


class Archive:
    """Buffers expired tuples per stream and writes them as day-partitioned Parquet files.

    Not thread-safe: the engine serializes calls under its own lock.

    Args:
        root: the archive directory; created if missing. Existing part files set the high
            water marks; leftover ``*.tmp`` files (a flush cut short) are removed.
        flush_rows: a stream is flushed once this many of its rows are buffered.
        private: directories and files owner-only (an engine's data directory).
        seed: the seed of the sampled layout's draws (psoup.archive.sampling); None:
            fresh entropy.
        aggregates: where to keep the windowed-aggregate copies of the part files
            (psoup.archive.rollups), outside `root`; None: none are kept.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     arc = Archive(d)
        ...     arc.add("R", [("a", "int")], {"ts": np.array([0.0, 1.0]),
        ...             "tupleID": np.array([0, 1]), "a": np.array([5, 6])})
        ...     [str(p.relative_to(d)) for p in arc.flush()]
        ['stream=R/date=1970-01-01/part-00000000000000000000-00000000000000000001.parquet']
    """

    def __init__(self, root: str | Path, flush_rows: int = 1 << 17, private: bool = False,
                 seed: int | None = None, aggregates: str | Path | None = None):
        if flush_rows < 1:
            raise ValueError(f"flush_rows must be at least 1, not {flush_rows}")
        self.root = Path(root)
        self.flush_rows = flush_rows
        self.private = private
        self._rng = np.random.default_rng(seed)
        make_dir(self.root, private)
        self._high: dict[str, int] = {}
        self._buffers: dict[str, _Buffer] = {}
        self._schemas: dict[str, pa.Schema] = {}   # last schema seen, for an empty read()
        #: why the last flush failed (a full disk), None once one succeeds
        self.error: str | None = None
        self._retry_at = 0.0                       # no automatic flush before (monotonic)
        for tmp in self.root.rglob("*.tmp"):
            tmp.unlink()
        for stream, _, last, _ in self._part_files():
            self._high[stream] = max(self._high.get(stream, -1), last)
        #: the windowed-aggregate copies, written with each part file
        self.rollups = None if aggregates is None else Rollups(self.root, aggregates, private)

    # ------------------------------------------------------------------ state

    def high_water(self, stream: str) -> int:
        """The largest archived (flushed) tupleID of `stream`, -1 if none. O(1).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     Archive(d).high_water("R")
            -1
        """
        return self._high.get(stream, -1)

    def latest_ts(self, stream: str) -> float | None:
        """The ts of the last archived (flushed) row of `stream` (the largest: ts never
        decreases with tupleID), None if none. O(rows of its last part file): only that
        file's ts column is read.

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     arc = Archive(d)
            ...     arc.add("R", [], {"ts": np.array([5.0, 7.5]), "tupleID": np.array([0, 1])})
            ...     _ = arc.flush()
            ...     arc.latest_ts("R")
            7.5
        """
        path = self.last_part(stream)
        if path is None:
            return None
        ts = pq.read_table(path, columns=[TS_COLUMN]).column(0)
        return float(pc.max(ts).as_py()) if len(ts) else None

    def last_part(self, stream: str) -> Path | None:
        """The part file holding the largest archived tupleID of `stream`, None if none.
        O(part files of the stream).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     arc = Archive(d)
            ...     arc.add("R", [], {"ts": np.array([5.0]), "tupleID": np.array([3])})
            ...     _ = arc.flush()
            ...     arc.last_part("R").name
            'part-00000000000000000003-00000000000000000003.parquet'
        """
        last = max(((tid, path) for s, _, tid, path in self._part_files(stream)
                    if s == stream), default=None)
        return None if last is None else last[1]

    @property
    def buffered_rows(self) -> int:
        """Rows added but not flushed yet, over all streams. O(streams).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     arc = Archive(d)
            ...     arc.add("R", [], {"ts": np.array([0.0]), "tupleID": np.array([4])})
            ...     arc.buffered_rows
            1
        """
        return sum(buf.rows for buf in self._buffers.values())

    def streams(self) -> list[str]:
        """The streams with archived or buffered rows, sorted. O(streams log streams).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     arc = Archive(d)
            ...     arc.add("S", [], {"ts": np.array([0.0]), "tupleID": np.array([0])})
            ...     arc.streams()
            ['S']
        """
        return sorted(self._high.keys() | self._buffers.keys())

    # ------------------------------------------------------------------ write

    def add(self, stream: str, columns: Sequence[tuple[str, str]],
            data: Mapping[str, ArrayLike]) -> None:
        """Buffer the rows of `data` not archived yet; flush the stream when its buffer
        reaches `flush_rows` (a flush that fails keeps the rows buffered and sets `error`
        instead of raising: `_flush_due`). O(rows), copying, so the caller may reuse its
        arrays.

        Rows whose tupleID is at most the stream's high water mark or the highest
        buffered tupleID are skipped, so replaying a log after a crash archives nothing
        twice. A new schema for a stream flushes the rows buffered under the old one.

        Args:
            stream: the stream's name (an identifier).
            columns: the stream's schema, (name, type) pairs; each type a ColumnType or
                its name (int, float, text, bool), checked.
            data: "ts", "tupleID" and every schema column, all of one length, tupleIDs
                increasing. Extra keys are ignored.

        Raises:
            SchemaError: a bad name, type, missing column, length, non-finite ts or
                non-increasing tupleIDs (nothing is buffered).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     arc = Archive(d)
            ...     batch = {"ts": np.array([0.0, 1.0]), "tupleID": np.array([0, 1]),
            ...              "on": np.array([True, False])}
            ...     arc.add("R", [("on", "bool")], batch)
            ...     arc.add("R", [("on", "bool")], batch)   # a replay: skipped
            ...     arc.buffered_rows
            2
        """
        schema = arrow_schema(stream, columns)        # checks the types too
        typed = [(name, ColumnType(ctype)) for name, ctype in columns]
        tids, ts, values = _checked(stream, typed, data)
        self._schemas[stream] = schema
        buf = self._buffers.get(stream)
        floor = max(self.high_water(stream), buf.last_tid if buf is not None else -1)
        start = int(np.searchsorted(tids, floor, side="right"))
        if start == len(tids):
            return
        # pa.array shares numeric numpy buffers, so copy the caller's (possibly a Data
        # SteM chunk's) memory before holding on to it.
        arrays = [pa.array(np.array(ts[start:]), pa.float64()),
                  pa.array(np.array(tids[start:]), pa.int64())]
        for (name, ctype), column in zip(typed, values, strict=True):
            part = column[start:]
            try:
                arrays.append(pa.array(part if ctype == ColumnType.TEXT else np.array(part),
                                       ARROW_TYPES[ctype]))
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise SchemaError(f"stream '{stream}', column '{name}': {e}") from None
        if buf is not None and not buf.schema.equals(schema):
            # One file holds one schema; a redeclared stream starts new files.
            self._flush_stream(stream)
            buf = None
        if buf is None:
            buf = self._buffers[stream] = _Buffer(schema)
        buf.parts.append(pa.Table.from_arrays(arrays, schema=schema))
        buf.rows += len(tids) - start
        buf.last_tid = int(tids[-1])
        if buf.rows >= self.flush_rows and time.monotonic() >= self._retry_at:
            self._flush_due(stream)

    def _flush_due(self, stream: str) -> None:
        """The flush `add` makes when a buffer is full. It runs inside a write that is
        already logged, so a failure (a full disk) must not fail that write: the rows
        stay buffered, in memory (and in the log, which no checkpoint drops before they
        are archived), the failure is kept in `error` and logged, and a later `add`
        (after RETRY_SECONDS) or `flush` tries again."""
        try:
            self._flush_stream(stream)
        except (OSError, DiskFull) as exc:
            self.error = str(exc)
            self._retry_at = time.monotonic() + RETRY_SECONDS
            log.warning("archiving expired rows failed; they stay in memory and are "
                        "archived later: %s", self.error)
        else:
            self.error = None

    def flush(self) -> list[Path]:
        """Write every buffered row: one file per stream and UTC day. O(buffered rows).

        Each file is written to a ``.tmp`` beside its final name, fsynced, renamed into
        place, and its directories fsynced, so once this returns the rows are durable and
        the log that held them may be checkpointed away.

        Returns:
            The paths written, by stream and then day.

        Raises:
            DiskFull: the file system is full; OSError: another failure. The rows not
                written stay buffered (those written are archived), for a later flush.

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     arc = Archive(d)
            ...     arc.add("R", [], {"ts": np.array([86399.5, 86400.0]),
            ...                       "tupleID": np.array([7, 8])})
            ...     [p.parent.name for p in arc.flush()]
            ['date=1970-01-01', 'date=1970-01-02']
        """
        written: list[Path] = []
        try:
            for stream in sorted(self._buffers):
                written += self._flush_stream(stream)
        except (OSError, DiskFull) as exc:
            self.error = str(exc)
            raise
        self.error, self._retry_at = None, 0.0
        return written

    def _flush_stream(self, stream: str) -> list[Path]:
        buf = self._buffers[stream]
        table = pa.concat_tables(buf.parts)
        ts = table.column(TS_COLUMN).to_numpy()
        days = np.floor_divide(ts, SECONDS_PER_DAY).astype(np.int64)
        cuts = [0, *(np.flatnonzero(days[1:] != days[:-1]) + 1).tolist(), len(days)]
        tids = table.column(TUPLE_ID_COLUMN)
        stream_dir = self.root / f"stream={stream}"
        written: list[Path] = []
        done = 0
        try:
            for a, b in zip(cuts, cuts[1:], strict=False):
                first, last = tids[a].as_py(), tids[b - 1].as_py()
                path = part_path(self.root, stream, float(ts[a]), first, last)
                date_dir = path.parent
                make_dir(stream_dir, self.private)
                make_dir(date_dir, self.private)
                try:
                    write_whole(path, partial(write_runs, table.slice(a, b - a),
                                              self._rng), self.private)
                    for directory in (date_dir, stream_dir, self.root):
                        fsync_dir(directory)
                    if self.rollups is not None:
                        self.rollups.add(stream, table.slice(a, b - a), first, last)
                except OSError as exc:
                    if not is_disk_full(exc):
                        raise
                    raise disk_full(exc, path, f"{len(days) - done} rows of stream "
                                    f"'{stream}' that left memory wait to be archived "
                                    "(meanwhile they stay in memory, and in the log)") from exc
                written.append(path)
                self._high[stream] = last
                done = b
        finally:
            # After a failure the written days are archived (and past the high water
            # mark); only the rest stays buffered, so a retry writes no file twice.
            if done == len(days):
                del self._buffers[stream]
            else:
                buf.parts, buf.rows = [table.slice(done)], len(days) - done
        return written

    def drop(self, stream: str, below: int) -> None:
        """Forget a dropped stream: its buffered rows, and its part files of tupleIDs
        below `below` (the engine's next tupleID when it was dropped), so that replaying
        the drop leaves the files of a stream created again under the name alone.
        O(part files of the stream).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     arc = Archive(d)
            ...     arc.add("R", [], {"ts": np.array([0.0]), "tupleID": np.array([4])})
            ...     _ = arc.flush()
            ...     arc.drop("R", below=5)
            ...     arc.streams(), arc.read("R").num_rows
            ([], 0)
        """
        self._buffers.pop(stream, None)
        if self.rollups is not None:
            self.rollups.drop(stream, below)
        kept = -1
        for _, _, last, path in list(self._part_files(stream)):
            if last < below:
                path.unlink()
            else:
                kept = max(kept, last)
        prune_dir(self.root / f"stream={stream}", self.root)
        if kept < 0:
            self._high.pop(stream, None)
        else:
            self._high[stream] = kept

    # ------------------------------------------------------------------ read

    def read(self, stream: str) -> pa.Table:
        """All flushed rows of `stream` in tupleID order (empty if none). O(archived rows).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     arc = Archive(d)
            ...     arc.add("R", [("name", "text")], {"ts": np.array([0.0]),
            ...             "tupleID": np.array([3]), "name": ["x"]})
            ...     _ = arc.flush()
            ...     arc.read("R").to_pylist()
            [{'ts': 0.0, 'tuple_id': 3, 'name': 'x'}]
        """
        # File names carry the tupleID range and files never overlap, so ordering by
        # the first tupleID orders the rows.
        paths = sorted((first, path) for s, first, _, path in self._part_files(stream)
                       if s == stream)
        if not paths:
            return self._schemas.get(stream, arrow_schema(stream, ())).empty_table()
        # promote_options: a stream redeclared with other columns reads with nulls.
        return pa.concat_tables([in_order(pq.read_table(path)) for _, path in paths],
                                promote_options="default")

    def extent(self, stream: str, below: int | None = None
               ) -> tuple[int, int, float, float]:
        """(rows, bytes, first ts, last ts) of the flushed rows of `stream` in the part
        files that begin below tupleID `below` (all when None), from their footers:
        O(part files), no row read. The ts range is (inf, -inf) when there are none; a
        file whose footer cannot be read counts for nothing (a reader of it names it)."""
        rows = size = 0
        lo, hi = math.inf, -math.inf
        for s, first, _, path in self._part_files(stream):
            if s != stream or (below is not None and first >= below):
                continue
            try:
                meta = pq.ParquetFile(path).metadata
            except (pa.ArrowException, OSError):
                continue            # damaged: the job that reads it names it
            rows += meta.num_rows
            size += path.stat().st_size
            names = [meta.schema.column(i).name for i in range(meta.num_columns)]
            if TS_COLUMN in names and meta.num_rows:
                j = names.index(TS_COLUMN)
                for g in range(meta.num_row_groups):
                    stats = meta.row_group(g).column(j).statistics
                    if stats is not None and stats.has_min_max:
                        lo, hi = min(lo, float(stats.min)), max(hi, float(stats.max))
        return rows, size, lo, hi

    def _part_files(self, stream: str = "*") -> Iterator[tuple[str, int, int, Path]]:
        """(stream, first tupleID, last tupleID, path) of every part file."""
        for path in self.root.glob(f"stream={stream}/date=*/part-*.parquet"):
            m = PART_NAME.match(path.name)
            if m:
                yield (path.parent.parent.name[len("stream="):], int(m.group(1)),
                       int(m.group(2)), path)


def _checked(stream: str, columns: Sequence[tuple[str, ColumnType]],
             data: Mapping[str, ArrayLike]
             ) -> tuple[NDArray[np.int64], NDArray[np.float64], list[NDArray[Any]]]:
    """(tupleIDs, ts, schema columns) of `data`, as arrays of the archive's types."""
    names = (TUPLE_ID, TS, *(c for c, _ in columns))
    for name in names:
        if name not in data:
            raise SchemaError(f"stream '{stream}': the rows to archive lack column '{name}'")
    arrays = []
    types = (ColumnType.INT, ColumnType.FLOAT, *(t for _, t in columns))
    for name, ctype in zip(names, types, strict=True):
        try:
            arrays.append(np.asarray(data[name], dtype=DTYPES[ctype]))
        except (TypeError, ValueError) as e:
            raise SchemaError(f"stream '{stream}', column '{name}': not {ctype} values "
                              f"({e})") from None
    n = len(arrays[0]) if arrays[0].ndim == 1 else -1
    for name, column in zip(names, arrays, strict=True):
        if column.ndim != 1 or len(column) != n:
            raise SchemaError(f"stream '{stream}': columns to archive must be 1-d and of "
                              f"one length; '{name}' has shape {column.shape}")
    tids, ts, *values = arrays
    if n > 1 and not (tids[1:] > tids[:-1]).all():
        raise SchemaError(f"stream '{stream}': tupleIDs to archive must increase")
    if not np.isfinite(ts).all():
        raise SchemaError(f"stream '{stream}': ts to archive must be finite")
    return tids, ts, values

