"""The public, in-process psoup API (docs/api.md, "Python, embedded").

`Engine` is a facade: every method checks its input, takes the lock, logs the change
and delegates.

* Statements are compiled by `psoup.query`; tuples are checked by `psoup.stems.batch`.
* The effects (a stream, a registration, a batch, an answer, an unregistration, a
  dropped stream) are `psoup.core.Core`'s: the SteMs, the Eddy, the Results Structure
  and the windows.
* `since` cursors are `psoup.results.cursors`'; history is a background job
  (`psoup.spark.jobs`) running a Spark pass from `psoup.spark.history` whose matches
  fill `psoup.results.tiers`.

Every public method holds one lock for its whole effect, so each call is atomic with
respect to the others (stream-prefix consistency across threads as well). A history
job is the exception: it holds the lock to start and to install its result, never while
Spark runs.

With a `path`, the engine is durable (psoup.journal.journal): each change is logged
before it is applied and before the call returns, and a new Engine on the same path
replays the log, so streams, retained tuples, handles and results all come back.
"""

from __future__ import annotations

import logging
import math
import secrets
import shutil
import threading
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence, overload

import numpy as np

from psoup.archive.policy import (DEFAULT_ROWS_PER_SECOND, DEFAULT_TIER_ROWS_PER_SECOND,
                                  ArchiveRead, Budget, Exact, Policy, Schedule, ask)
from psoup.archive.rates import SAMPLE_SPACE
from psoup.core import Core
from psoup.entropy import token_hex
from psoup.eddy.routing import POLICIES
from psoup.errors import (ApplyFailed, HistoryPending, LimitError, PSoupError, QueryError,
                          SchemaError, SequenceError)
from psoup.journal.wal import SYNC_MODES
from psoup.locks import FairLock
from psoup.producers import ProducerTable
from psoup.query import compile_statement, create_stream_sql
from psoup.query.model import (DESCRIBE, SHOW_QUERIES, SHOW_STREAMS, Catalog, Query,
                               StreamSchema)
from psoup.results.cursors import CursorStore, cursor_secret
from psoup.results.modes import MODES as MODE_TABLE
from psoup.results.result import Changes, Result
from psoup.results.tiers import INCOMING, load_segments
from psoup.spark.jobs import HistoryJob
from psoup.stems.batch import make_batch
from psoup.stems.query_stem import SelectionPlan

if TYPE_CHECKING:
    from psoup.journal.journal import Journal, Record
    from psoup.spark.history import Job

log = logging.getLogger("psoup.engine")

#: The engine modes of PSoup Sect. 5: PSoup-P (default), PSoup-C and NoMat.
MODES = tuple(MODE_TABLE)

#: The latest ts accepted by default: 10^11 seconds is the year 5138, and a clock in
#: milliseconds (1.8e12 in 2026) passes it by far. Engine(max_ts=None) lifts it.
MAX_TS = 1e11

#: The default memory for the queries' last answers (Engine's answer_cache_bytes).
DEFAULT_ANSWER_CACHE = 64 << 20


def _ts_unit_hint(value: float) -> str:
    """What a ts past MAX_TS probably is, as advice.

    Example:
        >>> _ts_unit_hint(1795353067184.0)[:62]
        'it looks like milliseconds since the epoch (2026-11-22): psoup'
    """
    for unit, scale in (("milliseconds", 1e3), ("microseconds", 1e6), ("nanoseconds", 1e9)):
        seconds = value / scale
        if 0 <= seconds <= MAX_TS and seconds < 4102444800:        # before 2100
            day = time.strftime("%Y-%m-%d", time.gmtime(seconds))
            flag = {"milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns"}[unit]
            return (f"it looks like {unit} since the epoch ({day}): psoup takes seconds, "
                    f"so divide by {scale:,.0f} (psoup ingest --ts-unit {flag})")
    return "psoup takes seconds since the epoch (or any clock of seconds)"


#: The columns of SHOW STREAMS and DESCRIBE (and the keys of Engine.describe).
CATALOG_COLUMNS = ["stream", "columns", "retain", "rows", "rows_total", "latest_ts",
                   "queries"]

_RETAIN_UNITS = (("DAY", 86400.0), ("HOUR", 3600.0), ("MINUTE", 60.0), ("SECOND", 1.0))


def _retention(schema: StreamSchema) -> str | None:
    """A stream's RETAIN clause as CREATE STREAM takes it, in its largest exact unit.

    Example:
        >>> _retention(StreamSchema("R", (), retain_seconds=7200.0))
        '2 HOURS'
        >>> _retention(StreamSchema("R", (), retain_rows=1)), _retention(StreamSchema("R", ()))
        ('1 ROW', None)
    """
    amount: int | float
    if schema.retain_rows is not None:
        amount, unit = schema.retain_rows, "ROW"
    elif schema.retain_seconds is not None:
        seconds = schema.retain_seconds
        unit, size = next((u, s) for u, s in _RETAIN_UNITS if (seconds / s).is_integer()
                          or u == "SECOND")
        amount = int(seconds // size) if (seconds / size).is_integer() else seconds
    else:
        return None
    return f"{amount} {unit}" + ("" if amount == 1 else "S")


def _table(columns: list[str], rows: list[tuple]) -> Result:
    """A catalog answer: `rows` under `columns`, with no ts or tupleIDs of its own."""
    return Result(columns, rows, np.full(len(rows), np.nan), np.full(len(rows), -1, np.int64))


class Engine:
    """An embedded psoup engine: register standing queries, insert data, invoke handles.

    Args:
        path: a directory for durable state (write-ahead log and Parquet archive);
            None keeps everything in memory only. An existing directory is recovered.
        mode: "partial" (PSoup-P: WHERE materialized as a bitmap, windows at invocation),
            "complete" (PSoup-C: per-query result lists), or "nomat" (run at invocation).
        clock: seconds since the epoch; used for `ts` when a producer gives none and for
            NOW when an invocation gives none.
        chunk_rows: tuples per storage chunk (the unit of expiry).
        shared_index: False evaluates every query on its own for each batch instead of
            probing the shared predicate index (the paper's "Unshrd" variant, for
            benchmarks; answers are identical).
        sync: with a path, when the log is forced to disk: "always" (before each call
            returns), "group" (at commit(); the server commits once per group of
            requests before replying to any) or "off" (survives a killed process, not a
            power loss).
        checkpoint_bytes: with a path, the log size at which the retained state is
            written as a fresh log and the old one dropped.
        checkpoint_seconds: with a path, the time after which the log is checkpointed
            too once it has grown by 1 MiB since the last checkpoint (None: by size only).
        progress: with a path, called as progress(bytes replayed, log bytes) about
            every half second while the log is replayed at start, and once at its end.
        routing: the order of a join's probes: "adaptive" (learned from the observed
            fan-out of each step) or "fixed" (FROM order).
        shared_joins: False joins each new batch once per join query instead of once
            per group of join queries sharing streams and join factors (composite
            tuples across queries, Sect. 5.4); for benchmarks, answers are identical.
        max_factors: the most AND-ed factors a WHERE clause may have (None: no limit);
            each is a row of the predicate index, so this bounds what one query costs
            every later batch.
        max_queries: the most standing queries at once (None: no limit); one more
            register raises LimitError and changes nothing. `stats()["limits"]` shows
            the count against it.
        max_stream_bytes: the most bytes a stream retains (None: no limit), counted as
            retained tuples x `row_bytes` (8 per INT, FLOAT, ts and tupleID, 1 per BOOL,
            58 per TEXT); a batch that would pass it, after its RETAIN rule has expired
            what it expires, raises LimitError and changes nothing.
        max_ts: the latest ts a batch may carry (default MAX_TS, the year 5138; None: no
            limit): a ts in milliseconds would otherwise be taken as seconds thousands
            of years ahead, and every correct ts after it refused as decreasing.
        max_results_bytes: the most memory of the results structures (None: no
            limit; `stats()["memory"]["results"]`); a registration that could take them
            past it (PSoup-P: the bitmap widened for its slot; PSoup-C: a position per
            retained tuple) raises LimitError and changes nothing. Inserts are never
            refused for it: bound the data with RETAIN and max_stream_bytes.
        spark_master: the Spark master of history jobs (default local[*]).
        spark_conf: Spark settings of history jobs ({"spark.executor.memory": "2g"}, ...),
            over spark-defaults.conf and $PSOUP_SPARK_CONF (docs/durability.md).
        max_producers: idempotent producers remembered (insert's `producer`); beyond
            it the one idle longest is forgotten (psoup.producers).
        answer_cache_bytes: the memory for the last answer of each selection query
            whose window is large compared with it (least recently invoked dropped
            first; 0 keeps none): the next invocation of a window that moved forward
            then reads only the tuples that arrived since (psoup.results.recent).
            `stats()["memory"]["answers"]` shows what it holds.

    Example:
        >>> eng = Engine(clock=lambda: 100.0)
        >>> eng.execute("CREATE STREAM R (a INT, b INT)")
        >>> h = eng.register("SELECT a FROM R WHERE b > 1 BEGIN NOW - 10 END NOW")
        >>> _ = eng.insert("R", [(1, 2), (3, 0)], ts=95.0)
        >>> eng.invoke(h).rows
        [(1,)]
    """

    def __init__(self, path: str | None = None, mode: str = "partial",
                 clock: Callable[[], float] = time.time, chunk_rows: int = 8192,
                 shared_index: bool = True, sync: str = "always",
                 checkpoint_bytes: int = 64 << 20, checkpoint_seconds: float | None = 3600.0,
                 progress: Callable[[int, int], None] | None = None,
                 routing: str = "adaptive",
                 shared_joins: bool = True, max_factors: int | None = None,
                 max_queries: int | None = None, max_stream_bytes: int | None = None,
                 max_results_bytes: int | None = None, max_ts: float | None = MAX_TS,
                 spark_master: str | None = None, max_producers: int = 10_000,
                 spark_conf: Mapping[str, str] | None = None,
                 archive_budget: float | None = None, archive_policy: Policy | None = None,
                 answer_cache_bytes: int = DEFAULT_ANSWER_CACHE):
        if mode not in MODE_TABLE:
            raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
        if sync not in SYNC_MODES:
            raise ValueError(f"unknown sync {sync!r} (choose from {', '.join(SYNC_MODES)})")
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be positive")
        if routing not in POLICIES:
            raise ValueError(f"unknown routing {routing!r} (choose from {', '.join(POLICIES)})")
        for name, limit in (("max_queries", max_queries), ("max_stream_bytes", max_stream_bytes),
                            ("max_results_bytes", max_results_bytes)):
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                      or limit < 1):
                raise ValueError(f"{name} must be a positive integer (or None: no limit), "
                                 f"got {limit!r}")
        if (isinstance(answer_cache_bytes, bool) or not isinstance(answer_cache_bytes, int)
                or answer_cache_bytes < 0):
            raise ValueError("answer_cache_bytes must be a whole number of bytes >= 0 (0 "
                             f"keeps no answers), got {answer_cache_bytes!r}")
        if archive_budget is not None and archive_policy is not None:
            raise ValueError("give archive_budget or archive_policy, not both")
        if archive_policy is not None and not callable(getattr(archive_policy, "schedule",
                                                               None)):
            raise ValueError(f"archive_policy {archive_policy!r} has no schedule(read) method "
                             "(see psoup.archive.policy)")
        #: How much of the archive a history job reads, and of a query's archive tier
        #: an invocation reads from disk (psoup.archive.policy).
        self.archive_policy: Policy = (Budget(archive_budget) if archive_budget is not None
                                       else archive_policy or Exact())
        self._archive_rate = DEFAULT_ROWS_PER_SECOND    # measured by each history pass
        self._tier_rate = DEFAULT_TIER_ROWS_PER_SECOND  # measured by reads of tier files
        self._reductions: dict[str, Schedule] = {}       # of the latest job, by stream
        self._read_rows: dict[str, int] = {}             # the archived rows it covers
        self._tier_reads: dict[str, float] = {}          # handle -> its last tier read rate
        self.mode = mode
        self.max_factors = max_factors
        self.max_queries = max_queries
        self.max_stream_bytes = max_stream_bytes
        self.max_results_bytes = max_results_bytes
        self.max_ts = max_ts
        self.spark_master = spark_master
        self.spark_conf = dict(spark_conf or {})
        self._clock = clock
        self._lock = FairLock()
        self._core = Core(mode, chunk_rows, shared_index, routing, shared_joins,
                          answer_cache_bytes)
        self._producers = ProducerTable(max_producers)
        self._started = clock()
        self.path = None if path is None else Path(path)
        self._journal: Journal | None = None
        self._closed = False
        self._failure: str | None = None            # why the engine stopped (ApplyFailed)
        self._checkpoint_error: str | None = None   # of the last automatic checkpoint
        self._jobs: dict[str, HistoryJob] = {}      # the latest history jobs, by id
        self._history_due: set[str] = set()         # logged as evaluated, for recovery
        self._history_pending: dict[str, str] = {}  # handle -> job evaluating it again
        if path is not None:
            from psoup.journal.journal import Journal   # pyarrow loads only when durable
            self._journal = Journal(path, sync, checkpoint_bytes, checkpoint_seconds)
            self._core.tiers.folder = self._journal.tiers_path
            self._core.answers.rollups = self._journal.archive.rollups
        self._cursors = CursorStore(self._core.answers,
                                    None if path is None else cursor_secret(path))
        if self._journal is not None:
            self._recover(progress)
            self._reevaluate_history()

    # ------------------------------------------------------------------ statements

    def execute(self, sql: str) -> str | Result | None:
        """Run one statement: CREATE STREAM and DROP STREAM return None, SELECT registers
        it and returns its handle, SHOW and DESCRIBE return a Result (a table: its
        `rows`, `to_dicts()`; docs/language.md, "The catalog").

        Example:
            >>> eng = Engine()
            >>> eng.execute("CREATE STREAM R (a INT) RETAIN 2 HOURS")
            >>> eng.execute("SHOW STREAMS").rows
            [('R', 'a INT', '2 HOURS', 0, 0, None, 0)]
        """
        with self._lock:
            self._check_open()
            stmt = self._compile(sql)
            if isinstance(stmt, Catalog):
                return self._catalog(stmt)
            if isinstance(stmt, StreamSchema):
                if self._journal is not None:
                    self._journal.create(sql)
                self._create(stmt, sql)
                return None
            self._admit(stmt)
            return self._register(stmt)

    def create_stream(self, name: str, columns: Mapping[str, str] | Sequence[tuple[str, str]],
                      retain: str | None = None) -> None:
        """Declare a stream from Python values; the same as CREATE STREAM.

        Args:
            name: the stream's name (an identifier).
            columns: column name -> type ("int", "float", "text", "bool"), in order.
            retain: e.g. "1 hour" or "100000 rows"; None keeps everything.
        """
        self.execute(create_stream_sql(name, columns, retain))

    def register(self, sql: str) -> str:
        """Register a standing query and return its handle (>= 128 random bits).

        The query is joined with the retained data at once (new query over old data) and
        with every later batch (new data over old queries).
        """
        with self._lock:
            self._check_open()
            stmt = self._compile(sql)
            if not isinstance(stmt, Query):
                raise QueryError("register() takes a SELECT statement; use execute() for "
                                 "CREATE STREAM")
            self._admit(stmt)
            return self._register(stmt)

    def streams(self) -> list[str]:
        """The streams' names, in creation order."""
        with self._lock:
            return list(self._core.stems)

    def describe(self, name: str) -> dict[str, Any]:
        """What DESCRIBE shows of stream `name`, as a dict: `stream`, `columns` (as in
        CREATE STREAM), `retain` (None: everything is kept), `rows` (retained),
        `rows_total` (ever inserted), `latest_ts` (None before the first tuple) and
        `queries` (how many standing queries read it).

        Raises:
            QueryError: no stream has that name.
        """
        with self._lock:
            self._core.stem(name)
            return self._describe(name)

    def drop_stream(self, name: str, cascade: bool = False) -> None:
        """Drop stream `name` and everything kept of it (DROP STREAM): its tuples in
        memory and in the archive (docs/durability.md). A stream created again under the
        name starts empty.

        Args:
            cascade: also unregister the standing queries that read the stream; without
                it a stream that some query reads is refused (QueryError naming them)
                and nothing changes.
        """
        with self._lock:
            self._check_open()
            self._core.stem(name)
            self._drop(name, cascade)

    # ------------------------------------------------------------------ data

    def insert(self, stream: str, rows: Any, ts: Any = None, *, producer: str | None = None,
               seq: int | None = None) -> np.ndarray:
        """Insert a batch into `stream`; returns the tupleIDs (numpy int64 array).

        Args:
            rows: a list of tuples in schema order, a list of dicts, or a dict of
                column -> sequence or numpy array (the fast path).
            ts: None (the engine clock), one number for all rows, or one per row.
            producer, seq: the batch's idempotency key, both or neither: a producer id
                and the batch's number, 0, 1, 2, ... per producer. A batch sent again
                with the same key is not applied again; it returns the tupleIDs it got
                the first time (psoup.producers has the rule; SequenceError otherwise).

        The whole batch is checked first; a bad one raises SchemaError and changes nothing.
        """
        keyed = _key(producer, seq)
        with self._lock:
            self._check_open()
            if keyed:
                assert producer is not None and seq is not None
                done = self._producers.check(producer, seq)
                if done is not None:
                    return done
            stem = self._core.stem(stream)
            batch = make_batch(stem.schema, rows, ts, self._clock(), stem.last_ts)
            first = self._core.next_tid
            tuple_ids = np.arange(first, first + batch.n, dtype=np.int64)
            if batch.n == 0 and not keyed:
                return tuple_ids
            if batch.n:
                self._check_ts(stream, batch.ts)
                self._admit_batch(stem, batch.ts)
            if self._journal is not None:
                self._journal.insert(stream, first, batch.ts, batch.columns, producer, seq)
            if batch.n:
                self._apply_logged(f"the batch of {batch.n} rows into '{stream}'",
                                   partial(self._core.append, stream, batch, tuple_ids))
            if keyed:
                self._producers.record(producer, seq, first, batch.n)   # type: ignore[arg-type]
            self._after_write()
            return tuple_ids

    def last_seq(self, producer: str) -> int:
        """The seq of `producer`'s last applied batch; -1 if none (or forgotten). A
        producer resuming after a crash continues at last_seq + 1."""
        with self._lock:
            return self._producers.last(producer)

    # ------------------------------------------------------------------ handles

    @overload
    def invoke(self, handle: str, now: float | None = None, since: None = None) -> Result: ...

    @overload
    def invoke(self, handle: str, now: float | None = None, *, since: str) -> Changes: ...

    @overload
    def invoke(self, handle: str, now: float | None = None,
               since: str | None = None) -> Result | Changes: ...

    def invoke(self, handle: str, now: float | None = None,
               since: str | None = None) -> Result | Changes:
        """The query's current answer: its window resolved at `now` (default: the engine
        clock), applied to the materialized results, projected and de-duplicated.

        The answer carries a `cursor`. Given `since=cursor`, the result is instead the
        Changes from that earlier answer to this one: rows that entered and rows that
        left (psoup.results.cursors). A cursor survives a restart of a durable engine;
        one whose answer can no longer be rebuilt raises CursorExpired, and one this
        engine did not issue for this handle CursorInvalid.
        """
        loaded: dict[str, dict[str, np.ndarray]] | None = None
        reads: dict[str, int] | None = None
        measured = 0.0
        while True:
            with self._lock:
                if self._failure is not None:
                    raise ApplyFailed(f"this engine stopped: {self._failure}")
                at = self._now(now)
                self._check_history(handle)
                core = self._core
                if loaded is None:
                    if not isinstance(self.archive_policy, Exact):
                        reads = core.read_plan(handle, at, self.archive_policy,
                                               self._tier_rate)
                        self._tier_reads[handle] = 1.0 if not reads else \
                            min(reads.values()) / SAMPLE_SPACE
                        if len(self._tier_reads) > 2 * len(core.handles) + 64:
                            self._tier_reads = {h: r for h, r in self._tier_reads.items()
                                                if h in core.handles}
                    wanted = core.unread_segments(handle, at, reads)
                else:
                    core.tiers.prime(loaded)
                    wanted = []
                    if measured:
                        self._tier_rate = 0.5 * self._tier_rate + 0.5 * measured
                if not wanted:
                    answer, window = core.answer_and_window(handle, at, reads)
                    if since is None:
                        # the cursor is made when first read (Result.defer_cursor), so
                        # an invocation whose caller never polls with since does not
                        # pay for it
                        answer.defer_cursor(partial(self._issue_cursor, handle, window))
                        return answer
                    return self._cursors.changes(handle, core.plan(handle), since, answer,
                                                 window)
                folder = core.tiers.folder
            # a window reaching into the archive: the segment files it needs are read
            # here, off the lock (they never change once written), so writers and other
            # readers are not held up by the disk; then the answer, under the lock, from
            # the cache (a file missed meanwhile is read there)
            assert folder is not None
            began = time.perf_counter()
            loaded = load_segments(folder, wanted)
            rows = sum(len(got["tupleID"]) for got in loaded.values())
            if rows:                    # the tier read rate, for Budget policies
                measured = rows / max(time.perf_counter() - began, 1e-4)

    def _issue_cursor(self, handle: str, window: tuple[int, int] | None,
                      answer: Result) -> None:
        """Set the cursor of an answer `invoke` returned (on its first read), under the
        lock: the cursor store is engine state. Its content depends only on the answer,
        the window it came from and the engine's secret, so it is the cursor `invoke`
        would have issued at once, even after `close` (a range cursor is valid for the
        reopened engine). The answer is stored for `since` then, as `invoke` stored it,
        unless its handle was unregistered since (`forget` dropped its answers; nothing
        would read this one). O(answer) the first time, O(1) after."""
        with self._lock:
            if answer.cursor_issued:
                return
            self._cursors.issue(handle, answer, window,
                                remember=handle in self._core.handles)

    def unregister(self, handle: str) -> None:
        """Remove a standing query; its handle stops working and its slot is reused."""
        with self._lock:
            self._check_open()
            self._core.plan(handle)
            if self._journal is not None:
                self._journal.unregister(handle)
            self._apply_logged("the unregistration", partial(self._unregister, handle))
            self._after_write()

    def queries(self) -> list[tuple[str, str]]:
        """[(handle, sql), ...] in registration order."""
        with self._lock:
            return [(h, plan.query.sql) for h, plan in self._core.handles.items()]

    # ------------------------------------------------------------------ history

    def history(self, handles: Sequence[str] | None = None,
                progress: Callable[[str], None] | None = None) -> str:
        """Start evaluating standing queries over the archive, so that their windows
        reach back past memory (hybrid queries), and return the job's id at once: one
        Spark pass per stream for all the queries, run with psoup's Query SteM inside
        the executors (psoup.spark.history), on a thread of its own. Ingest,
        invocations and registrations go on meanwhile; when the pass ends, each query
        gets its archive tier at once, holding its matches among every tuple that left
        memory, those that left while the job ran included. From then on the tier
        grows as tuples leave retention, so answers join archive and memory exactly.

        One job runs at a time per engine. A query unregistered meanwhile gets nothing;
        a failed or cancelled job changes nothing.

        Args:
            handles: the selection queries to evaluate (default: every selection query
                without history yet).
            progress: called with a line of text as the job advances (on its thread).

        Raises:
            PSoupError: the engine keeps no archive (it has no path), or a job runs.
            QueryError: a handle names a join query (not evaluated over the archive).
            UnknownHandle: a handle is not registered.
        """
        with self._lock:
            self._check_open()
            if self._journal is None:
                raise PSoupError("history needs a durable engine: Engine(path=DIR) archives "
                                 "what leaves memory under DIR/archive")
            running = [job for job in self._jobs.values() if job.state == "running"]
            if running:
                raise PSoupError(f"history job {running[0].id} is still running (one job at "
                                 "a time per engine): wait for it or cancel it")
            self._journal.archive.flush()
            chosen, jobs = self._core.history_jobs(handles, self._schedule)
            job = HistoryJob(secrets.token_hex(8), chosen, [j.schema.name for j in jobs],
                             progress)
            for j in jobs:
                j.archived_rows = self._read_rows.get(j.schema.name, 0)
            self._jobs = {k: v for k, v in list(self._jobs.items())[-7:]} | {job.id: job}
            if not jobs:
                job.end("done", self._archived(chosen))
                return job.id
            try:
                for j in jobs:
                    self._core.tiers.begin(j.schema.name, [slot for slot, _ in j.queries])
                job.thread = threading.Thread(target=self._history_pass, args=(job, jobs),
                                              name=f"psoup-history-{job.id}", daemon=True)
                job.thread.start()
            except BaseException:
                self._core.tiers.abort()
                del self._jobs[job.id]
                raise
            return job.id

    def _schedule(self, stream: str, below: int) -> Schedule:
        """Under the lock: the archive policy's sample rates for a history job reading
        `stream`'s archive below tupleID `below`, from the part files' footers.

        Raises:
            PSoupError: the policy failed or gave a schedule that is not one.
        """
        assert self._journal is not None
        rows, size, first, last = self._journal.archive.extent(stream, below)
        read = ArchiveRead(stream, rows, size, first, last, self._clock(), self._archive_rate)
        self._read_rows[stream] = rows
        schedule = self._reductions[stream] = ask(self.archive_policy, read)
        return schedule

    def history_status(self, job: str | None = None) -> dict[str, Any]:
        """A history job's state ("running", "done", "failed", "cancelled"), progress,
        error and result (handle -> archived matches); default: the latest job.

        Raises:
            PSoupError: no such job (the engine remembers its 8 latest).
        """
        return self._job(job).status()

    def history_cancel(self, job: str) -> dict[str, Any]:
        """Cancel a running history job (its Spark jobs are cancelled; what it found is
        discarded, nothing changes); nothing for one that has ended. Returns its status,
        still "running" until its thread has stopped."""
        found = self._job(job)
        found.cancel()
        return found.status()

    def history_wait(self, job: str, timeout: float | None = None) -> dict[str, Any]:
        """Wait up to `timeout` seconds (None: until it ends) for a history job; returns
        its status."""
        found = self._job(job)
        found.wait(timeout)
        return found.status()

    def evaluate_history(self, handles: Sequence[str] | None = None,
                         progress: Callable[[str], None] | None = None) -> dict[str, int]:
        """`history` and wait for the job: returns handle -> archived matches, or raises
        what made it fail (PSoupError naming the file, for a bad archive)."""
        job = self._job(self.history(handles, progress))
        job.wait()
        if job.error is not None:
            raise job.error
        if job.result is None:
            from psoup.spark.history import JobCancelled
            raise JobCancelled(f"history job {job.id} was cancelled; nothing changed")
        return job.result

    # ------------------------------------------------------------------ introspection

    def stats(self) -> dict[str, Any]:
        """Per stream rows, bytes and rates; per query result counts; memory use."""
        with self._lock:
            out = self._core.stats(max(self._clock() - self._started, 1e-9))
            out["limits"] = {
                "queries": len(self._core.handles), "max_queries": self.max_queries,
                "max_factors": self.max_factors,
                "results_bytes": self._core.kept.nbytes(),
                "max_results_bytes": self.max_results_bytes,
                "stream_bytes": {name: stem.retained * stem.row_bytes
                                 for name, stem in self._core.stems.items()},
                "max_stream_bytes": self.max_stream_bytes}
            if self._journal is not None:
                out["durability"] = {"path": str(self.path), "sync": self._journal.wal.sync,
                                     "log_bytes": self._journal.wal.size,
                                     "checkpoint_error": self._checkpoint_error,
                                     "archive_buffered_rows": self._journal.archive.buffered_rows}
                out["archive_reads"] = {
                    "policy": repr(self.archive_policy),
                    "rows_per_second": self._archive_rate,
                    "tier_rows_per_second": self._tier_rate,
                    "reduction": {stream: [list(step) for step in steps]
                                  for stream, steps in self._reductions.items()},
                    "tier_reads": {h: rate for h, rate in self._tier_reads.items()
                                   if h in self._core.handles}}
                rollups = self._journal.archive.rollups
                if rollups is not None:
                    out["durability"]["aggregates"] = rollups.stats()
            return out

    def _check(self) -> None:
        """Assert the invariants of every structure and between them (for tests)."""
        with self._lock:
            self._core._check()
            self._cursors._check()
            self._producers._check()

    # ------------------------------------------------------------------ durability

    @contextmanager
    def locked(self, wait: bool = True) -> Iterator[bool]:
        """Hold the engine's lock for a block, so that several calls run as one (each
        takes the lock again at once): yields True. With `wait=False` the lock is taken
        only if no call holds it or waits for it, and the block gets False otherwise,
        at once. For a server that runs reads on its own thread when nothing else would
        wait for them, and the rest together (psoup.server).

        Example:
            >>> eng = Engine()
            >>> with eng.locked(wait=False) as held:
            ...     held
            True
        """
        if wait:
            self._lock.__enter__()
        held = wait or self._lock.acquire_if_free()
        try:
            yield held
        finally:
            if held:
                self._lock.__exit__()

    def commit(self) -> None:
        """Force the log to disk (what sync="group" defers); a no-op in memory (which
        takes no lock, so a group of in-memory writes never waits for it)."""
        if self._journal is None:
            return
        with self._lock:
            if self._journal is not None and not self._closed:
                self._journal.commit()

    def checkpoint(self) -> None:
        """Write the retained state as a fresh log and drop the old one (done on its own
        when the log outgrows `checkpoint_bytes`). O(retained tuples)."""
        with self._lock:
            self._check_open()
            if self._journal is None:
                return
            from psoup.journal.journal import StreamImage
            core = self._core
            images = {name: StreamImage(core.ddl[name], stem.schema.columns,
                                        stem.rows(stem.horizon, stem.n),
                                        stem.rows(0, stem.horizon, expired=True),
                                        stem.at_last_ts)
                      for name, stem in core.stems.items()}
            handles = [(h, plan.query.sql) for h, plan in core.handles.items()]
            # visible tiers are saved (and restored at the next start); the handles a
            # running job evaluates are evaluated again after a restart
            saved = core.tiers.save(self._journal.tiers_path,
                                    {plan.id: h for h, plan in core.handles.items()
                                     if plan.id in core.tiers})
            history = [h for h in core.handles if h in self._history_pending]
            self._journal.checkpoint(images, core.next_tid, handles, self._producers.image(),
                                     history, saved)

    def close(self) -> None:
        """Flush the log and the archive; later writes raise PSoupError. A running
        history job is cancelled (and waited for, up to a minute). Idempotent."""
        with self._lock:
            if self._journal is not None and not self._closed:
                self._journal.close()
            self._closed = True
        for job in list(self._jobs.values()):
            job.cancel()
            job.wait(60.0)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers

    def _compile(self, sql: str) -> StreamSchema | Query | Catalog:
        return compile_statement(sql, self._core.schemas(), max_factors=self.max_factors)

    def _create(self, schema: StreamSchema, sql: str) -> None:
        expired = None if self._journal is None else \
            partial(self._journal.expired, schema.name, schema.columns)
        self._core.create(schema, sql, expired)

    def _catalog(self, stmt: Catalog) -> Result | None:
        if stmt.action == SHOW_STREAMS:
            return _table(CATALOG_COLUMNS, [tuple(self._describe(name).values())
                                            for name in self._core.stems])
        if stmt.action == DESCRIBE:
            assert stmt.stream is not None, "DESCRIBE names a stream"
            return _table(CATALOG_COLUMNS, [tuple(self._describe(stmt.stream).values())])
        if stmt.action == SHOW_QUERIES:
            return _table(["handle", "sql"], [(h, plan.query.sql)
                                              for h, plan in self._core.handles.items()])
        assert stmt.stream is not None, "DROP STREAM names a stream"
        self._drop(stmt.stream, stmt.cascade)
        return None

    def _describe(self, name: str) -> dict[str, Any]:
        stem = self._core.stems[name]
        schema = stem.schema
        return dict(zip(CATALOG_COLUMNS, (
            name, ", ".join(f"{c} {t.upper()}" for c, t in schema.columns),
            _retention(schema), stem.retained, stem.rows_total,
            stem.last_ts if stem.n else None, len(self._core.users(name)))))

    def _drop(self, name: str, cascade: bool) -> None:
        """Refuse, or log and apply, the drop of an existing stream."""
        users = self._core.users(name)
        if users and not cascade:
            shown = "; ".join(f"{h} ({self._core.handles[h].query.sql})" for h in users[:5])
            more = f"; and {len(users) - 5} more" if len(users) > 5 else ""
            raise QueryError(f"stream '{name}' is read by {len(users)} standing "
                             f"quer{'y' if len(users) == 1 else 'ies'}: {shown}{more}. "
                             f"Unregister them first, or DROP STREAM {name} CASCADE to "
                             "unregister them with it")
        bound = self._core.next_tid
        if self._journal is not None:
            self._journal.drop(name, users, bound)
        self._apply_logged(f"the drop of stream '{name}'",
                           partial(self._dropped, name, users, bound))
        self._after_write()

    def _dropped(self, name: str, handles: Sequence[str], bound: int) -> None:
        """Unregister `handles`, forget the stream, and remove its archived tuples (those
        numbered below `bound`: not those of a stream created again under the name)."""
        for handle in handles:
            self._unregister(handle)
        self._core.drop(name)
        if self._journal is not None:
            self._journal.archive.drop(name, bound)

    def _admit(self, query: Query) -> None:
        """Refuse a new standing query beyond max_queries or max_results_bytes (before
        anything is applied; recovery replays what was admitted, whatever the limits
        are now)."""
        held = len(self._core.handles)
        if self.max_queries is not None and held >= self.max_queries:
            raise LimitError(f"the engine holds {held} standing queries, its limit "
                             f"(max_queries={self.max_queries}); unregister one first")
        if self.max_results_bytes is not None:
            used = self._core.kept.nbytes()
            grows = self._core.admission_bytes(query)
            if used + grows > self.max_results_bytes:
                raise LimitError(
                    f"registering this query could take the results memory from {used:,} "
                    f"to {used + grows:,} bytes, past its limit (max_results_bytes="
                    f"{self.max_results_bytes:,}); unregister queries, retain less data "
                    "(RETAIN), or raise the limit")

    def _check_ts(self, stream: str, ts: np.ndarray) -> None:
        """Refuse a batch with a ts past max_ts (ts never decrease: the last is the
        largest)."""
        if self.max_ts is None or not ts[-1] > self.max_ts:
            return
        row = int(np.searchsorted(ts, self.max_ts, side="right"))
        raise SchemaError(f"stream '{stream}', row {row}: ts {float(ts[row])!r} is past "
                          f"max_ts ({self.max_ts:g} s): "
                          f"{_ts_unit_hint(float(ts[row]))}; nothing was stored")

    def _admit_batch(self, stem: Any, ts: np.ndarray) -> None:
        """Refuse a batch that would take its stream past max_stream_bytes."""
        if self.max_stream_bytes is None:
            return
        rows = stem.retained_after(ts)
        if rows * stem.row_bytes > self.max_stream_bytes:
            raise LimitError(
                f"stream '{stem.schema.name}': this batch of {len(ts):,} rows would retain "
                f"{rows:,} rows = {rows * stem.row_bytes:,} bytes ({stem.row_bytes} per row), "
                f"past its limit (max_stream_bytes={self.max_stream_bytes:,}); nothing was "
                "stored. Retain less (RETAIN n ROWS or a time), or raise the limit")

    def _register(self, query: Query) -> str:
        handle = token_hex(20)      # 160 bits; hex never looks like an option
        if self._journal is not None:
            self._journal.register(handle, query.sql)
        self._apply_logged("the registration", partial(self._core.register, query, handle))
        self._after_write()
        return handle

    def _unregister(self, handle: str) -> None:
        self._core.unregister(handle)
        self._cursors.forget(handle)
        self._history_due.discard(handle)
        self._history_pending.pop(handle, None)

    def _recover(self, progress: Callable[[int, int], None] | None) -> None:
        """Replay the log (O(its size): a checkpointed log is the retained state with the
        queries first, so each batch probes them all at once)."""
        assert self._journal is not None
        wal, shown = self._journal.wal, time.monotonic()
        for record in self._journal.replay():
            self._apply(record)
            if progress is not None and time.monotonic() - shown >= 0.5:
                progress(*wal.replayed)
                shown = time.monotonic()
        if progress is not None:
            progress(wal.size, wal.size)
        self._core.recovered = {name: stem.rows_total
                                for name, stem in self._core.stems.items()}
        self._started = self._clock()

    def _apply(self, record: Record) -> None:
        """Redo one log record through the ordinary paths (recovery)."""
        core = self._core
        if record.op == "create":
            stmt = compile_statement(record.sql, core.schemas())
            assert isinstance(stmt, StreamSchema)
            self._create(stmt, record.sql)
        elif record.op == "insert":
            assert record.tuple_ids is not None, "an insert record carries its tupleIDs"
            stem = core.stem(record.stream)
            n = len(record.tuple_ids)
            if n:
                batch = make_batch(stem.schema, record.columns, record.ts, 0.0, stem.last_ts)
                core.append(record.stream, batch, record.tuple_ids)
            if record.producer is not None:
                first = int(record.tuple_ids[0]) if n else 0
                self._producers.record(record.producer, record.seq, first, n)
        elif record.op == "register":
            query = compile_statement(record.sql, core.schemas())
            assert isinstance(query, Query)
            core.register(query, record.handle)
        elif record.op == "unregister":
            self._unregister(record.handle)
        elif record.op == "drop":
            self._dropped(record.stream, record.handles, record.next_tid)
        elif record.op == "history":
            self._history_due.update(record.handles)
        elif record.op == "state":
            core.next_tid = max(core.next_tid, record.next_tid)
        elif record.op == "producers":
            self._producers.restore(record.producers or [])
        elif record.op == "tiers":
            assert self._journal is not None and record.tiers is not None
            for handle, files in record.tiers.items():
                plan = core.plan(handle)
                assert isinstance(plan, SelectionPlan), "tiers are of selection queries"
                try:
                    core.tiers.restore(plan.query.sources[0].stream, plan.slot,
                                       self._journal.tiers_path, files)
                except (OSError, ValueError) as exc:   # a file gone or damaged
                    core.tiers.forget(plan.slot)
                    self._history_due.add(handle)
                    log.warning("the archive tier of %s could not be read back (%s); its "
                                "history is evaluated again", handle, exc)
        elif record.op == "latest":
            core.stem(record.stream).at_last_ts = record.count

    def _after_write(self) -> None:
        """The automatic checkpoint after a write. The write is applied and in the log
        by now, so it stands whatever happens here: a failed checkpoint (a full disk,
        say) is logged and shown in stats()["durability"], never raised as if the write
        had failed (a caller would retry it and duplicate it); the next write tries
        again."""
        if self._journal is None or not self._journal.checkpoint_due:
            return
        try:
            self.checkpoint()
        except Exception as exc:    # the write stands, whatever the cause
            self._checkpoint_error = f"{type(exc).__name__}: {exc}"
            log.warning("automatic checkpoint failed (the write before it is applied and "
                        "logged): %s", self._checkpoint_error)
        else:
            self._checkpoint_error = None

    def _apply_logged(self, what: str, apply: Callable[[], None]) -> None:
        """Apply a change that is already in the log (or, in memory, checked). Nothing
        checkable fails here; if something does all the same, part of the change may be
        in memory, so the engine stops (ApplyFailed now and on every later call) rather
        than answer from a state that is neither before nor after: reopened on its
        path, it applies the logged change whole."""
        try:
            apply()
        except Exception as exc:
            cause = f"{type(exc).__name__}: {exc}"
            if self._journal is not None:
                self._failure = (f"applying {what} failed after it was logged ({cause}); "
                                 "it is durable and is applied when the engine is "
                                 "reopened on its path: do not send it again")
            else:
                self._failure = (f"applying {what} failed part way ({cause}); the "
                                 "engine's state is unknown and it keeps no log: start "
                                 "a new Engine")
            log.error("engine stopped: %s", self._failure)
            raise ApplyFailed(self._failure) from exc

    def _reevaluate_history(self) -> None:
        """After recovery: the queries whose history was evaluated before but whose
        tiers the log could not bring back (never saved, or a file unreadable) get it
        evaluated again by a background job; until it is done, invoking one raises
        HistoryPending instead of answering short."""
        core = self._core
        due = [h for h in self._history_due
               if h in core.handles and core.handles[h].id not in core.tiers]
        self._history_due.clear()
        if not due:
            return
        try:
            job = self.history(due)
        except PSoupError as exc:
            job = f"not started: {exc}"
        self._history_pending = {h: job for h in due}
        log.info("evaluating the history of %d queries again after the restart (job %s)",
                 len(due), job)

    def _check_history(self, handle: str) -> None:
        """Refuse to answer a query whose history is being evaluated again."""
        job = self._history_pending.get(handle)
        if job is None:
            return
        found = self._jobs.get(job)
        if found is None:
            state = job
        else:
            status = found.status()
            state = f"job {job} {status['state']}"
            if status.get("error"):
                state += f": {status['error']}"
        raise HistoryPending(
            f"query {handle}: its history was evaluated before the engine restarted and is "
            f"being evaluated again ({state}); its answer would lack the archived part "
            "until then. Try again when the job is done (psoup history status), or "
            "evaluate it again (psoup history HANDLE)")

    def _history_pass(self, job: HistoryJob, jobs: list[Job]) -> None:
        """A history job's thread: the Spark pass off the lock, then, under it, its
        matches installed in front of the pending tiers, or the pending tiers dropped
        (failed, cancelled, or the engine closed meanwhile)."""
        from psoup.spark.history import evaluate_jobs
        assert self._journal is not None, "history runs on durable engines only"
        found, error = None, None
        done: list[str] = []
        incoming = self._journal.tiers_path / INCOMING / job.id
        began = time.perf_counter()
        try:
            found = evaluate_jobs(self._journal.archive.root, jobs, self.spark_master,
                                  job.note, job.id, job.cancelled, self.spark_conf,
                                  into=incoming)
        except BaseException as exc:     # anything: the job must end, nothing applied
            error = exc
        else:                            # the archive read rate, for Budget policies
            read = sum(j.rows_read for j in jobs)
            if read:
                rate = read / max(time.perf_counter() - began, 1e-3)
                with self._lock:
                    self._archive_rate = 0.5 * self._archive_rate + 0.5 * rate
        with self._lock:
            if found is not None and not job.cancelled() and not self._closed:
                error, done = self._install(job, found)
            if not done:
                self._core.tiers.abort()
        shutil.rmtree(incoming, ignore_errors=True)     # what no tier took
        try:
            incoming.parent.rmdir()                     # empty once no job uses it
        except OSError:
            pass
        if done:
            self._save_tiers(job, done)     # before "done": a job done is a job saved
        with self._lock:
            if done:
                job.end("done", self._archived(job.handles))
            else:
                stopped = job.cancelled() or self._closed
                job.end("cancelled" if stopped else "failed",
                        error=None if stopped else error)

    def _install(self, job: HistoryJob, found: dict) -> tuple[Exception | None, list[str]]:
        """Under the lock: a job's segments moved into place in front of the pending
        tiers, which become visible, and the job's queries logged as evaluated; (the
        error, []) and nothing changed if the files could not be moved."""
        core, journal = self._core, self._journal
        assert journal is not None, "history runs on durable engines only"
        handle_of = {core.handles[h].id: h for h in job.handles if h in core.handles}
        try:
            core.tiers.finish(found, handle_of)
        except OSError as exc:          # all or nothing: the tiers made visible go too
            for slot in handle_of:
                core.tiers.forget(slot)
            return exc, []
        done = list(handle_of.values())
        for h in done:
            self._history_pending.pop(h, None)
        try:                            # so that a restart evaluates them again
            journal.history(done)
        except Exception as exc:        # the tiers stand; only the restart forgets
            log.warning("history job %s: could not log its queries (%s); after a "
                        "restart their history must be evaluated again by hand",
                        job.id, exc)
        return None, done

    def _save_tiers(self, job: HistoryJob, handles: list[str]) -> None:
        """After a job: its tiers written to tiers/ off the lock, then, under it, what
        they gained meanwhile and a log record naming their files, so a restart restores
        them there instead of evaluating them again. If that fails, the restart
        evaluates them again (the `history` record), and the next checkpoint saves them."""
        assert self._journal is not None
        core, folder = self._core, self._journal.tiers_path
        try:
            with self._lock:
                handle_of = {core.handles[h].id: h for h in handles
                             if h in core.handles and core.handles[h].id in core.tiers}
                parts = core.tiers.unsaved(handle_of)
            core.tiers.sync(list(handle_of))    # the job's segments, moved into place
            written = core.tiers.write(folder, parts)
            with self._lock:
                self._check_open()
                # a checkpoint meanwhile removed the files no log named yet: those are
                # written again below, with what the tiers gained since
                core.tiers.mark_saved([w for w in written
                                       if (folder / w.segment.name).is_file()])
                handle_of = {slot: h for slot, h in handle_of.items()
                             if h in core.handles and core.handles[h].id == slot}
                self._journal.tiers(core.tiers.save(folder, handle_of))
        except Exception as exc:    # the tiers stand; a restart evaluates them again
            log.warning("history job %s: its tiers were not saved (%s); after a restart "
                        "its queries are evaluated again", job.id, exc)

    def _archived(self, handles: list[str]) -> dict[str, int]:
        """handle -> archived matches, for the handles still registered."""
        core = self._core
        return {h: core.tiers.count(core.handles[h].id) for h in handles if h in core.handles}

    def _job(self, job: str | None) -> HistoryJob:
        if job is None and self._jobs:
            return list(self._jobs.values())[-1]
        found = self._jobs.get(job) if job is not None else None
        if found is None:
            known = ", ".join(self._jobs) or "none yet"
            raise PSoupError(f"no history job {job!r} on this engine (its latest: {known})")
        return found

    def _check_open(self) -> None:
        if self._failure is not None:
            raise ApplyFailed(f"this engine stopped: {self._failure}")
        if self._closed:
            raise PSoupError("this engine is closed; open a new Engine on its path")

    def _now(self, now: float | None) -> float:
        if now is None:
            return float(self._clock())
        try:
            value = float(now)
        except (TypeError, ValueError):
            raise QueryError(f"now must be a number of seconds, got {now!r}") from None
        if not math.isfinite(value):
            raise QueryError(f"now must be finite, got {now!r}")
        return value


def _key(producer: str | None, seq: int | None) -> bool:
    """Whether an insert carries an idempotency key; raises on half a key or a bad one."""
    if producer is None and seq is None:
        return False
    if not isinstance(producer, str) or not producer:
        raise SequenceError(f"producer must be a non-empty string, got {producer!r}")
    if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or seq < 0:
        raise SequenceError(f"producer {producer!r}: seq must be an integer >= 0, "
                            f"got {seq!r}")
    return True
