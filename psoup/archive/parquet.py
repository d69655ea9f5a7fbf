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
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
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
from psoup.errors import SchemaError, disk_full, is_disk_full
from psoup.fsync import fsync_dir, make_dir, prune_dir, write_whole
from psoup.query.model import TS, TUPLE_ID, ColumnType
from psoup.stems.batch import DTYPES

log = logging.getLogger("psoup.archive")

#: Seconds between attempts of the automatic flush after one failed (a full disk): each
#: attempt writes up to a buffer's worth of Parquet before it fails.
RETRY_SECONDS = 1.0

#: Full buffers handed to the background flusher and not archived yet, at most: a writer
#: that fills one more waits until the flusher has written one (backpressure), so an
#: engine holds at most (PENDING_RUNS + 1) x flush_rows expired rows per stream in the
#: archive's memory. While the flusher fails (a full disk) the writer never waits: the
#: rows stay buffered, as the disk-full rules say.
PENDING_RUNS = 2


class _Buffer:
    """A stream's rows waiting for a flush: Arrow tables of one schema, in tupleID order."""

    __slots__ = ("schema", "parts", "rows")

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.parts: list[pa.Table] = []
        self.rows = 0


class _Run:
    """A full buffer handed to the flusher: its rows in tupleID order (what a failed
    attempt left of them), and the part files written and published so far."""

    __slots__ = ("stream", "table", "written")

    def __init__(self, stream: str, table: pa.Table):
        self.stream = stream
        self.table = table
        self.written: list[Path] = []

    @property
    def rows(self) -> int:
        return int(self.table.num_rows)


class Archive:
    """Buffers expired tuples per stream and writes them as day-partitioned Parquet files.

    A stream's buffer that reaches `flush_rows` becomes a *run*, written by `add` itself
    or, with `background`, by a flusher thread of the archive's own while the writer goes
    on: the rows are already copied into Arrow tables the archive owns. The flusher writes
    the runs in the order they were handed over (so each stream's in tupleID order), and
    publishes each under a small lock of the archive's: the high water mark, the part
    files a read lists and the aggregate copies' index change at once, so a reader sees a
    run whole or not at all; until then its rows count as buffered (`buffered_rows`,
    `streams`, the replay's skip). At most PENDING_RUNS runs wait: a writer that fills
    one more waits for the flusher. The public calls are for one writer thread (the
    engine serializes them under its lock); `flush`, `wait_flushed` and `drop` wait for
    the flusher, which never takes the caller's locks.

    Args:
        root: the archive directory; created if missing. Existing part files set the high
            water marks; leftover ``*.tmp`` files (a flush cut short) are removed.
        flush_rows: a stream is flushed once this many of its rows are buffered.
        private: directories and files owner-only (an engine's data directory).
        seed: the seed of the sampled layout's draws (psoup.archive.sampling); None:
            fresh entropy.
        aggregates: where to keep the windowed-aggregate copies of the part files
            (psoup.archive.rollups), outside `root`; None: none are kept.
        background: flush full buffers on a thread of the archive's (an engine's), not
            inside the `add` that fills them; `close` stops it.

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
                 seed: int | None = None, aggregates: str | Path | None = None,
                 background: bool = False):
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
        # The flusher's state, under _cond (its lock is the archive's small lock):
        self._cond = threading.Condition()
        self._runs: deque[_Run] = deque()          # handed over, not archived, in order
        self._active: _Run | None = None           # the run being written (the first)
        self._hidden: set[Path] = set()            # part files written, not published
        self._kick = False                         # retry a failed run now
        self._failure: Exception | None = None     # what the last failed attempt raised
        self._failures = 0                         # attempts failed so far
        self._closing = False
        for tmp in self.root.rglob("*.tmp"):
            tmp.unlink()
        for stream, _, last, _ in self._part_files():
            self._high[stream] = max(self._high.get(stream, -1), last)
        # the largest tupleID given, archived or not (the writer's alone)
        self._last: dict[str, int] = dict(self._high)
        #: the windowed-aggregate copies, written with each part file
        self.rollups = None if aggregates is None else Rollups(self.root, aggregates, private)
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._flusher, name="psoup-archive-flush",
                                            daemon=True)
            self._thread.start()

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
        """Rows added but not archived (published) yet, over all streams: buffered, or
        handed to the flusher. O(streams + pending runs).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     arc = Archive(d)
            ...     arc.add("R", [], {"ts": np.array([0.0]), "tupleID": np.array([4])})
            ...     arc.buffered_rows
            1
        """
        with self._cond:
            return (sum(buf.rows for buf in self._buffers.values())
                    + sum(run.rows for run in self._runs))

    def streams(self) -> list[str]:
        """The streams with archived, buffered or pending rows, sorted.
        O(streams log streams + pending runs).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     arc = Archive(d)
            ...     arc.add("S", [], {"ts": np.array([0.0]), "tupleID": np.array([0])})
            ...     arc.streams()
            ['S']
        """
        with self._cond:
            return sorted(self._high.keys() | self._buffers.keys()
                          | {run.stream for run in self._runs})

    # ------------------------------------------------------------------ write

    def add(self, stream: str, columns: Sequence[tuple[str, str]],
            data: Mapping[str, ArrayLike]) -> None:
        """Buffer the rows of `data` not archived yet; flush the stream when its buffer
        reaches `flush_rows`, here or on the flusher (a flush that fails keeps the rows
        buffered and sets `error` instead of raising: `_hand_off`). O(rows), copying,
        so the caller may reuse its arrays; with a flusher it waits only when
        PENDING_RUNS full buffers wait for it.

        Rows whose tupleID is at most the stream's high water mark or the highest
        buffered or pending tupleID are skipped, so replaying a log after a crash archives nothing
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
        start = int(np.searchsorted(tids, self._last.get(stream, -1), side="right"))
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
            self._hand_off(stream, force=True)
            buf = None
        if buf is None:
            buf = self._buffers[stream] = _Buffer(schema)
        buf.parts.append(pa.Table.from_arrays(arrays, schema=schema))
        buf.rows += len(tids) - start
        self._last[stream] = int(tids[-1])
        if buf.rows >= self.flush_rows:
            self._hand_off(stream)
        elif self.error is not None and self._runs and time.monotonic() >= self._retry_at:
            self._retry()

    def _hand_off(self, stream: str, force: bool = False) -> None:
        """`add`'s flush of a full buffer (`force`: of one that must be written before
        the next rows, under another schema): the buffer becomes a run for the flusher,
        after the runs before it, and the writer goes on. It runs inside a write that
        is already logged, so a failure (a full disk) must not fail that write: the rows
        stay buffered, in memory (and in the log, which no checkpoint drops before they
        are archived), the failure is kept in `error` and logged, and a later `add`
        (after RETRY_SECONDS) or `flush` tries again. Waits while PENDING_RUNS runs
        wait (not while the flusher fails)."""
        with self._cond:
            if self.error is not None:
                if not force and time.monotonic() < self._retry_at:
                    return          # a retry is not due: the rows wait in the buffer
                self._kick = True
            while (len(self._runs) >= PENDING_RUNS and self.error is None
                   and self._background):
                self._cond.wait()       # backpressure: the flusher is behind
            if len(self._runs) >= PENDING_RUNS and not force:
                # failing: the retry takes these rows too when they can join the last
                # run (as one buffer grew before there was a flusher), else they wait
                tail = self._runs[-1]
                if (tail.stream == stream and tail is not self._active
                        and tail.table.schema.equals(self._buffers[stream].schema)):
                    tail.table = pa.concat_tables([tail.table, self._take(stream).table])
                self._cond.notify_all()
                return
            self._runs.append(self._take(stream))
            self._cond.notify_all()
        if not self._background:
            self._drain(raise_errors=False)

    def _retry(self) -> None:
        """Try the failed runs again (RETRY_SECONDS after the last attempt)."""
        with self._cond:
            self._kick = True
            self._cond.notify_all()
        if not self._background:
            self._drain(raise_errors=False)

    def _take(self, stream: str) -> _Run:
        """Under the lock: `stream`'s buffer, as a run."""
        buf = self._buffers.pop(stream)
        return _Run(stream, pa.concat_tables(buf.parts))

    @property
    def _background(self) -> bool:
        """Whether the flusher thread writes the runs (not the caller)."""
        return self._thread is not None and not self._closing

    def flush(self) -> list[Path]:
        """Write every buffered row: one file per stream and UTC day. O(buffered rows).
        With a flusher, hands every buffer to it and waits for it to write them and
        the runs before them.

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
        with self._cond:
            for stream in sorted(self._buffers):
                self._runs.append(self._take(stream))
            runs = list(self._runs)
            self._cond.notify_all()
        self.wait_flushed()
        return sorted(path for run in runs for path in run.written)

    def wait_flushed(self) -> None:
        """Wait until every run handed to the flusher so far is archived (what a
        checkpoint needs before it drops the log that holds them); a run that failed
        is tried again at once. O(the pending runs' rows) of waiting.

        Raises:
            DiskFull: the file system is full; OSError (or what else writing raised):
                another failure, of an attempt made meanwhile. The rows not written stay
                pending (those written are archived), for a later flush.
        """
        if not self._background:
            self._drain(raise_errors=True)
            return
        with self._cond:
            seen = self._failures
            self._kick = True
            self._cond.notify_all()
            while self._runs and self._failures == seen:
                self._cond.wait()
            if self._runs:
                assert self._failure is not None
                raise self._failure

    def close(self) -> None:
        """Stop the flusher once it has written the runs it may (not those waiting for
        a retry: `flush` first, which raises if rows are left). Later calls write on the
        caller's thread. O(pending runs) of waiting."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    # ------------------------------------------------------------------ the flusher

    def _flusher(self) -> None:
        """The flusher thread: the runs in order, each written off the lock and then
        published; after a failure it waits for a retry (`_kick`)."""
        while True:
            with self._cond:
                while not self._due() and not self._closing:
                    self._cond.wait()
                if not self._due():
                    return
                run = self._active = self._runs[0]
            self._attempt(run)

    def _due(self) -> bool:
        """Under the lock: whether the first run is to be written now."""
        return bool(self._runs) and (self.error is None or self._kick)

    def _drain(self, raise_errors: bool) -> None:
        """Write the runs on the caller's thread (no flusher), up to the first that
        fails; its failure raised when `raise_errors`."""
        while True:
            with self._cond:
                if not self._runs:
                    return
                run = self._active = self._runs[0]
                seen = self._failures
            self._attempt(run)
            if self._failures != seen:
                if raise_errors:
                    assert self._failure is not None
                    raise self._failure
                return

    def _attempt(self, run: _Run) -> None:
        """Write `run` (`_active`) off the lock, then publish what was written. A run
        that fails keeps its unwritten rows, first in line, and sets `error`."""
        done: list[tuple[Path, int, int, int, int | None]] = []
        failure: Exception | None = None
        try:
            self._write(run, done)
        except Exception as exc:    # whatever it is, the rows stay pending
            failure = exc
        with self._cond:
            self._publish(run, done)
            self._active = None
            if failure is None:
                if self._runs and self._runs[0] is run:
                    self._runs.popleft()
                self.error, self._retry_at = None, 0.0
            else:
                self.error, self._failure = str(failure), failure
                self._failures += 1
                self._kick = False
                self._retry_at = time.monotonic() + RETRY_SECONDS
                log.warning("archiving expired rows failed; they stay in memory and are "
                            "archived later: %s", self.error)
            self._cond.notify_all()

    def _write(self, run: _Run, done: list[tuple[Path, int, int, int, int | None]]
               ) -> None:
        """Write `run`'s part files, one per UTC day, and their aggregate copies, each
        durable, appending (path, first, last tupleID, end row, copies' day) to `done`;
        nothing is published. Off the lock."""
        stream, table = run.stream, run.table
        ts = table.column(TS_COLUMN).to_numpy()
        days = np.floor_divide(ts, SECONDS_PER_DAY).astype(np.int64)
        cuts = [0, *(np.flatnonzero(days[1:] != days[:-1]) + 1).tolist(), len(days)]
        tids = table.column(TUPLE_ID_COLUMN)
        stream_dir = self.root / f"stream={stream}"
        for a, b in zip(cuts, cuts[1:], strict=False):
            first, last = tids[a].as_py(), tids[b - 1].as_py()
            path = part_path(self.root, stream, float(ts[a]), first, last)
            date_dir = path.parent
            with self._cond:
                self._hidden.add(path)      # a read lists it once it is published
            day = None
            try:
                make_dir(stream_dir, self.private)
                make_dir(date_dir, self.private)
                write_whole(path, partial(write_runs, table.slice(a, b - a), self._rng),
                            self.private)
                for directory in (date_dir, stream_dir, self.root):
                    fsync_dir(directory)
                if self.rollups is not None:
                    _, day = self.rollups.write(stream, table.slice(a, b - a), first, last)
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                raise disk_full(exc, path, f"{len(days) - a} rows of stream "
                                f"'{stream}' that left memory wait to be archived "
                                "(meanwhile they stay in memory, and in the log)") from exc
            done.append((path, first, last, b, day))

    def _publish(self, run: _Run, done: list[tuple[Path, int, int, int, int | None]]
                 ) -> None:
        """Under the lock: make the part files in `done` archived, at once: the high
        water mark, the files a read lists, the copies' index. After a failure the
        written days are archived (and past the high water mark); only the rest stays
        pending, so a retry writes no file twice."""
        for path, first, last, _, day in done:
            self._high[run.stream] = last
            self._hidden.discard(path)
            if self.rollups is not None:
                self.rollups.publish(run.stream, first, last, day)
            run.written.append(path)
        if done:
            run.table = run.table.slice(done[-1][3])

    def drop(self, stream: str, below: int) -> None:
        """Forget a dropped stream: its buffered rows, and its part files of tupleIDs
        below `below` (the engine's next tupleID when it was dropped), so that replaying
        the drop leaves the files of a stream created again under the name alone. Its
        runs waiting for the flusher are discarded; one being written is waited for.
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
        with self._cond:
            self._runs = deque(r for r in self._runs if r.stream != stream or r is self._active)
            while self._active is not None and self._active.stream == stream:
                self._cond.wait()
            self._runs = deque(r for r in self._runs if r.stream != stream)
            self._buffers.pop(stream, None)
            stream_dir = self.root / f"stream={stream}"
            self._hidden = {p for p in self._hidden if p.parent.parent != stream_dir}
            if self.rollups is not None:
                self.rollups.drop(stream, below)
            kept = -1
            for _, _, last, path in self._part_files(stream, published=False):
                if last < below:
                    path.unlink()
                else:
                    kept = max(kept, last)
            prune_dir(stream_dir, self.root)
            if kept < 0:
                self._high.pop(stream, None)
                self._last.pop(stream, None)
            else:
                self._high[stream] = self._last[stream] = kept

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

    def _part_files(self, stream: str = "*", published: bool = True
                    ) -> list[tuple[str, int, int, Path]]:
        """(stream, first tupleID, last tupleID, path) of every part file; with
        `published`, not those of a run being flushed (listed under the lock: a run's
        files all or none)."""
        found = []
        with self._cond:
            for path in self.root.glob(f"stream={stream}/date=*/part-*.parquet"):
                m = PART_NAME.match(path.name)
                if m and not (published and path in self._hidden):
                    found.append((path.parent.parent.name[len("stream="):], int(m.group(1)),
                                  int(m.group(2)), path))
        return found


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

