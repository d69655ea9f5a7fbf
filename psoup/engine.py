"""The public, in-process psoup API (docs/api.md, "Python, embedded").

`Engine` is a facade: each method checks its input, takes the lock, logs the change and
hands it to the service that does it. The rules it keeps:

* every public method holds the engine's one lock for its whole effect, so each call is
  atomic with respect to the others (stream-prefix consistency across threads as well);
  a history job and an invocation reading archive files are the exceptions, holding it
  to start and to finish, never while Spark runs or the disk is read, and so is an
  invocation of a selection, which holds it to take a cut and then finds and fetches
  its answer off it, on the snapshot of that moment (psoup.results.reads);
* a change is checked first, then logged, then applied (psoup.journal.durable): a call
  that raises has changed nothing, and one that failed part way stops the engine.

The services:

* `psoup.query` compiles statements; `psoup.stems.batch` checks tuples; `psoup.limits`
  refuses what would pass a limit;
* `psoup.core.Core` holds the paper's objects and applies each change;
* `psoup.results.reads` answers invocations (the archive's files read off the lock),
  `psoup.results.cursors` the `since` changes, `psoup.catalog` SHOW and DESCRIBE;
* `psoup.journal.durable` logs, checkpoints and recovers;
* `psoup.spark.jobs` runs history jobs.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np
from numpy.typing import NDArray

from psoup.archive.policy import Budget, Exact, Policy
from psoup.catalog import answer_catalog, describe_stream
from psoup.core import Ahead, Core
from psoup.entropy import token_hex
from psoup.errors import PSoupError, QueryError, SequenceError
from psoup.journal.checkpoint import Cut
from psoup.journal.durable import Durability
from psoup.limits import MAX_TS, Limits
from psoup.locks import FairLock, Holding
from psoup.options import (
    MODE_NAMES,
    ROUTING_NAMES,
    SYNC_NAMES,
    ModeName,
    RoutingName,
    SyncName,
    choose,
)
from psoup.plans import Plan, SelectionPlan
from psoup.producers import ProducerTable
from psoup.query import compile_statement, create_stream_sql
from psoup.query.model import DROP_STREAM, Catalog, Query, StreamSchema
from psoup.results.cursors import CursorStore, cursor_secret
from psoup.results.reads import Reads
from psoup.results.result import Changes, Result
from psoup.spark.jobs import HistoryJobs
from psoup.spark.live import LiveSources
from psoup.stems.batch import make_batch
from psoup.workers import check_threads, default_threads

#: The engine modes of PSoup Sect. 5: PSoup-P (default), PSoup-C and NoMat.
MODES = MODE_NAMES

#: The default memory for the queries' last answers (Engine's answer_cache_bytes).
DEFAULT_ANSWER_CACHE = 64 << 20


#: What `Engine._when_no_cut` returns: its `take`'s value (a checkpoint's or a snapshot's
#: cut).
_C = TypeVar("_C")

class Engine:
    """An embedded psoup engine: register standing queries, insert data, invoke handles.

    Args (docs/api.md, "Engine", has each in full):
        path: the directory of the durable state (log, archive); None: in memory.
        mode: "partial" (PSoup-P, the default), "complete" (PSoup-C) or "nomat".
        clock: seconds since the epoch, for a batch's ts and an invocation's NOW.
        chunk_rows: tuples per storage chunk (the unit of expiry).
        shared_index, shared_joins: False evaluates each query (each join) on its own.
        sync: with a path, when the log reaches the disk: "always", "group", "off".
        checkpoint_bytes, checkpoint_seconds: with a path, when the log is compacted.
        progress: with a path, progress(bytes replayed, log bytes) during recovery.
        routing: the order of a join's probes: "adaptive" or "fixed" (FROM order).
        max_factors, max_queries, max_stream_bytes, max_ts, max_results_bytes: the
            limits (psoup.limits); None lifts one.
        spark_master, spark_conf: where history jobs and the streams FROM a Spark
            source run (psoup.spark.live), and their Spark settings.
        archive_budget, archive_policy: how much of the archive history jobs and
            invocations read (psoup.archive.policy).
        max_producers: idempotent producers remembered (psoup.producers).
        answer_cache_bytes: memory for the queries' last answers (psoup.results.recent).
        threads: the threads a large batch's probe is split over (psoup.workers);
            None: the cores this process may run on. 1 splits nothing.

    Example:
        >>> eng = Engine(clock=lambda: 100.0)
        >>> eng.execute("CREATE STREAM R (a INT, b INT)")
        >>> h = eng.register("SELECT a FROM R WHERE b > 1 BEGIN NOW - 10 END NOW")
        >>> _ = eng.insert("R", [(1, 2), (3, 0)], ts=95.0)
        >>> eng.invoke(h).rows
        [(1,)]
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, mode: ModeName = "partial",
                 clock: Callable[[], float] = time.time, chunk_rows: int = 8192,
                 shared_index: bool = True, sync: SyncName = "always",
                 checkpoint_bytes: int = 64 << 20, checkpoint_seconds: float | None = 3600.0,
                 progress: Callable[[int, int], None] | None = None,
                 routing: RoutingName = "adaptive",
                 shared_joins: bool = True, max_factors: int | None = None,
                 max_queries: int | None = None, max_stream_bytes: int | None = None,
                 max_results_bytes: int | None = None, max_ts: float | None = MAX_TS,
                 spark_master: str | None = None, max_producers: int = 10_000,
                 spark_conf: Mapping[str, str] | None = None,
                 archive_budget: float | None = None, archive_policy: Policy | None = None,
                 answer_cache_bytes: int = DEFAULT_ANSWER_CACHE, threads: int | None = None):
        self.mode = choose("mode", mode, MODE_NAMES)
        # what a read replica of this engine is made with (`replica_settings`)
        self._settings: dict[str, Any] = {
            "mode": self.mode, "chunk_rows": chunk_rows, "shared_index": shared_index,
            "routing": routing, "shared_joins": shared_joins, "max_ts": max_ts,
            "answer_cache_bytes": answer_cache_bytes}
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be positive")
        #: What one query, stream or registration may cost (psoup.limits).
        self.limits = Limits(max_factors, max_queries, max_stream_bytes, max_results_bytes,
                              max_ts)
        #: How much of the archive a history job reads, and of a query's archive tier
        #: an invocation reads from disk (psoup.archive.policy).
        self.archive_policy = _archive_policy(archive_budget, archive_policy)
        self._core = Core(self.mode, chunk_rows, shared_index,
                          choose("routing", routing, ROUTING_NAMES), shared_joins,
                          _cache_bytes(answer_cache_bytes),
                          default_threads() if threads is None else check_threads(threads))
        #: The threads this engine works on: a large batch's probe is split over them
        #: (psoup.workers), and a server runs as many invocations at once.
        self.threads = self._core.query_stem.workers.threads
        self._clock = clock
        self._lock = FairLock()
        self._producers = ProducerTable(max_producers)
        self._closed = False
        self.path = None if path is None else Path(path)
        self._durability = Durability(path, choose("sync", sync, SYNC_NAMES),
                                      checkpoint_bytes, checkpoint_seconds)
        self._durability.attach(self._core)
        self._cursors = CursorStore(self._core.answers,
                                    None if path is None else cursor_secret(path))
        self._reads = Reads(self._lock, self._core.answers, self._core.tiers,
                            self.archive_policy, self._cursors,
                            lambda handle: handle in self._core.handles)
        self._history = HistoryJobs(self._lock, self._core, self._durability.journal,
                                    self.archive_policy, clock, spark_master,
                                    spark_conf or {}, self._check_open, lambda: self._closed)
        self._effects = _Effects(self._core, self._durability, self._reads, self._cursors,
                                 self._history)
        self._durability.recover(self._core, self._producers, self._effects, progress)
        self._started = clock()
        self._history.reevaluate(self.history)
        self._sources = LiveSources(self, spark_master, spark_conf or {}, clock)
        self._sources.resume(self._core.schemas())
        self._reads.live = self._sources.store

    # ------------------------------------------------------------------ statements

    def execute(self, sql: str) -> str | Result | None:
        """Run one statement: CREATE STREAM and DROP STREAM return None, SELECT registers
        it and returns its handle, SHOW and DESCRIBE return a Result (a table: its
        `rows`, `to_dicts()`; docs/language.md, "The catalog").

        Example:
            >>> eng = Engine()
            >>> eng.execute("CREATE STREAM R (a INT) RETAIN 2 HOURS")
            >>> eng.execute("SHOW STREAMS").rows
            [('R', 'a INT', '2 HOURS', 0, 0, None, 0, None, None, None)]
        """
        with self._lock:
            self._check_open()
            stmt = self._compile(sql)
            if isinstance(stmt, StreamSchema):
                self._sources.check(stmt)
                self._durability.log_create(sql)
                self._effects.create(stmt, sql)
                self._sources.start(stmt)
                return None
            if isinstance(stmt, Query):
                ahead = self._ahead(stmt)
                if ahead is None:
                    return self._register(stmt)
            else:
                if stmt.action != DROP_STREAM:
                    return answer_catalog(self._core, stmt, self._sources.state,
                                          self._sources.stored)
                assert stmt.stream is not None, "DROP STREAM names a stream"
                self._drop(stmt.stream, stmt.cascade)
                return None
        return self._register_ahead(sql, stmt, ahead)

    def create_stream(self, name: str, columns: Mapping[str, str] | Sequence[tuple[str, str]],
                      retain: str | None = None) -> None:
        """Declare a stream from Python values; the same as CREATE STREAM.

        Args:
            name: the stream's name (an identifier).
            columns: column name -> type ("int", "float", "text", "bool"; any name
                CREATE STREAM takes), in order.
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
            ahead = self._ahead(stmt)
            if ahead is None:
                return self._register(stmt)
        return self._register_ahead(sql, stmt, ahead)

    def prepare_register(self, sql: str) -> PreparedRegistration | None:
        """The long part of registering SELECT `sql` over a large store, done on the
        caller's thread: compile it and take a copy of its stream (a short hold of the
        lock), then scan the copy off the lock; `finish_register` ends it. For a server
        that scans on a thread of its own and ends the registration where it applies
        writes. None when a registration of `sql` is best done whole in one hold
        (`register` or `execute`: a small store, a join, NoMat), or `sql` is not a
        SELECT. Changes nothing: an error (the compiler's, a limit's, the scan's) is
        raised here and nothing is registered.

        Example:
            >>> eng = Engine()
            >>> eng.execute("CREATE STREAM R (a INT)")
            >>> eng.prepare_register("SELECT a FROM R") is None      # a small store
            True
        """
        with self._lock:
            self._check_open()
            stmt = self._compile(sql)
            if not isinstance(stmt, Query):
                return None
            ahead = self._ahead(stmt)
            if ahead is None:
                return None
        ahead.run()
        return PreparedRegistration(sql, stmt, ahead)

    def finish_register(self, prepared: PreparedRegistration) -> str:
        """End a registration `prepare_register` scanned for: in one short hold of the
        lock, check it again, log it and apply it with the rows that arrived since its
        copy; returns its handle, as `register` does. Raises what `register` raises
        (the stream dropped meanwhile, a limit reached meanwhile)."""
        with self._lock:
            self._check_open()
            query, ahead = prepared.query, prepared.ahead
            if self._core.stems.get(query.sources[0].stream) is not ahead.stem:
                stmt = self._compile(prepared.sql)
                if not isinstance(stmt, Query):
                    raise QueryError("register() takes a SELECT statement")
                return self._register(stmt)
            return self._register(query, ahead)

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
            return describe_stream(self._core, name, self._sources.state,
                                   self._sources.stored)

    def latest_ts(self, name: str) -> float | None:
        """Stream `name`'s latest ts, None before its first tuple (DESCRIBE's
        `latest_ts`, without counting the queries that read the stream; for a stream
        probed in Spark's executors, the latest committed in its batch store). O(1).

        Raises:
            QueryError: no stream has that name.
        """
        with self._lock:
            stem = self._core.stem(name)
            store = self._sources.store(name)
            if store is not None:
                return store.latest_ts
            return stem.last_ts if stem.n else None

    def probe_set(self, name: str) -> tuple[str, dict[str, Query]]:
        """Under the lock: stream `name`'s CREATE STREAM statement and its query set,
        handle -> each selection query reading it (what a micro-batch probed in
        Spark's executors is probed with). O(queries)."""
        return self._core.ddl[name], {
            h: plan.query for h, plan in self._core.handles.items()
            if isinstance(plan, SelectionPlan) and plan.query.sources[0].stream == name}

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
            self._drop(name, cascade, f"drop_stream({name!r}, cascade=True)")

    # ------------------------------------------------------------------ data

    def insert(self, stream: str, rows: Any, ts: Any = None, *, producer: str | None = None,
               seq: int | None = None) -> NDArray[np.int64]:
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
        key = _key(producer, seq)
        with self._lock:
            self._check_open()
            done = None if key is None else self._producers.check(*key)
            if done is not None:
                return done
            stem = self._core.stem(stream)
            self._sources.check_insert(stream)
            batch = make_batch(stem.schema, rows, ts, self._clock(), stem.last_ts)
            first = self._core.next_tid
            tuple_ids = np.arange(first, first + batch.n, dtype=np.int64)
            if batch.n == 0 and key is None:
                return tuple_ids
            if batch.n:
                self.limits.check_ts(stream, batch.ts)
                self.limits.admit_batch(stem, batch.ts)
            self._durability.log_insert(stream, first, batch.ts, batch.columns, producer, seq)
            if batch.n:
                self._durability.apply(f"the batch of {batch.n} rows into '{stream}'",
                                       partial(self._core.append, stream, batch, tuple_ids))
            if key is not None:
                self._producers.record(*key, first, batch.n)
            self._after_write()
            return tuple_ids

    def last_seq(self, producer: str) -> int:
        """The seq of `producer`'s last applied batch; -1 if none (or forgotten). A
        producer resuming after a crash continues at last_seq + 1."""
        self._before_read()
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

        An answer (or Changes) over streams fed by a Spark source says up to which ts
        it is complete (`fresh_to`: docs/language.md, "Freshness"); None otherwise.
        """
        self._before_read()
        return self._reads.invoke(handle, partial(self._begin_read, handle, now), since)

    def _before_read(self) -> None:
        """What a read does first, outside the lock: nothing here; a read replica waits
        until it has applied its primary's committed changes
        (psoup.server.replica_engine)."""

    def _begin_read(self, handle: str, now: float | None) -> tuple[Plan, float]:
        """Under the lock, before an invocation reads: its plan and NOW."""
        self._durability.check_running()
        at = _now(self._clock, now)
        self._history.check_pending(handle)
        return self._core.plan(handle), at

    def unregister(self, handle: str) -> None:
        """Remove a standing query; its handle stops working and its slot is reused."""
        with self._lock:
            self._check_open()
            self._core.plan(handle)
            self._durability.log_unregister(handle)
            self._durability.apply("the unregistration",
                                   partial(self._effects.unregistered, handle))
            self._after_write()

    def queries(self) -> list[tuple[str, str]]:
        """[(handle, sql), ...] in registration order."""
        self._before_read()
        with self._lock:
            return [(h, plan.query.sql) for h, plan in self._core.handles.items()]

    # ------------------------------------------------------------------ history

    def history(self, handles: Sequence[str] | None = None,
                progress: Callable[[str], None] | None = None) -> str:
        """Start evaluating standing queries over the archive, so that their windows
        reach back past memory (hybrid queries), and return the job's id at once; the
        job runs beside ingest, invocations and registrations, and installs each
        query's archive tier when it ends (psoup.spark.jobs.HistoryJobs.start). One job
        runs at a time; a failed or cancelled one changes nothing.

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
            return self._history.start(handles, progress)

    def history_status(self, job: str | None = None) -> dict[str, Any]:
        """A history job's state ("running", "done", "failed", "cancelled"), progress,
        error and result (handle -> archived matches); default: the latest job.

        Raises:
            PSoupError: no such job (the engine remembers its 8 latest).
        """
        return self._history.job(job).status()

    def history_cancel(self, job: str) -> dict[str, Any]:
        """Cancel a running history job (its Spark jobs are cancelled; what it found is
        discarded, nothing changes); nothing for one that has ended. Returns its status,
        still "running" until its thread has stopped."""
        found = self._history.job(job)
        found.cancel()
        return found.status()

    def history_wait(self, job: str, timeout: float | None = None) -> dict[str, Any]:
        """Wait up to `timeout` seconds (None: until it ends) for a history job; returns
        its status."""
        found = self._history.job(job)
        found.wait(timeout)
        return found.status()

    def evaluate_history(self, handles: Sequence[str] | None = None,
                         progress: Callable[[str], None] | None = None) -> dict[str, int]:
        """`history` and wait for the job: returns handle -> archived matches, or raises
        what made it fail (PSoupError naming the file, for a bad archive)."""
        job = self._history.job(self.history(handles, progress))
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
            out["limits"] = self.limits.stats(self._core)
            durability = self._durability.stats()
            if durability is not None:
                out["durability"] = durability
                out["archive_reads"] = (self._history.stats()
                                        | self._reads.stats(self._core.handles))
                if sources := self._sources.stats():
                    out["sources"] = sources
            return out

    def _check(self) -> None:
        """Assert the invariants of every structure and between them (for tests)."""
        with self._lock:
            self._core._check()
            self._cursors._check()
            self._producers._check()

    # ------------------------------------------------------------------ durability

    def locked(self, wait: bool | float = True) -> Holding:
        """Hold the engine's lock for a block, so that several calls run as one (each
        takes the lock again at once): yields True. With `wait=False` the lock is taken
        only if no call holds it or waits for it, and the block gets False otherwise,
        at once; with `wait` a number of seconds, it is waited for in turn for that
        long at most (False after that). For a server that runs reads on its own
        thread when nothing else would wait for them, and the rest together
        (psoup.server).

        Example:
            >>> eng = Engine()
            >>> with eng.locked(wait=False) as held:
            ...     held
            True
        """
        return self._lock.holding(wait)

    def commit(self) -> None:
        """Force the log to disk (what sync="group" defers); a no-op in memory (which
        takes no lock, so a group of in-memory writes never waits for it)."""
        if self.path is None:
            return
        with self._lock:
            if not self._closed:
                self._durability.commit()

    def checkpoint(self) -> None:
        """Write the whole state as a checkpoint, and drop the log before it; returns
        once the checkpoint is valid (a background one that runs is waited for first).
        Automatic checkpoints (when the log outgrows `checkpoint_bytes`) run in the
        background instead. Either kind holds the lock only to take its cut (O(chunks +
        queries)) and to end; other calls go on while its files are written. O(state).

        Raises:
            OSError: a file could not be written (the previous checkpoint stays valid).
            PSoupError: called inside `locked()` while a background checkpoint is being
                written (it needs the lock to end).
        """
        durability = self._durability
        cut = self._when_no_cut(partial(durability.cut, self._core, self._producers,
                                        self._history.pending))
        if cut is not None:
            durability.checkpoint(cut, self._lock)

    def snapshot(self, folder: str | os.PathLike[str],
                 joined: Callable[[], None]) -> dict[str, Any]:
        """Write the whole state into `folder` as checkpoint files, for a read replica
        to start from (psoup.server.replica): its cut is taken under the lock, where
        `joined()` is called, so that the replica's feed (`set_feed`) carries exactly
        the changes after it; the files are written off the lock, no checkpoint of the
        engine's own running meanwhile. Returns the manifest, with "primary" the
        handles a replica must leave to this engine (those with an archive tier,
        whose history is due, or over a stream probed in Spark's executors). Works in
        memory too. O(state); the lock is held O(chunks + queries).

        Raises:
            OSError: a file could not be written (nothing changed).
            PSoupError: called inside `locked()` while a checkpoint is being written.
        """
        durability = self._durability

        def take() -> Cut:
            tiered = [h for h, plan in self._core.handles.items()
                      if plan.id in self._core.tiers
                      or any(self._sources.store(s.stream) is not None
                             for s in plan.query.sources)]
            due = [h for h in self._core.handles if self._history.pending(h)]
            cut = durability.snapshot_cut(self._core, self._producers, tiered + due)
            joined()
            return cut

        cut = self._when_no_cut(take)
        try:
            manifest = durability.snapshot_write(cut, Path(folder))
        finally:
            with self._lock:
                durability.snapshot_end(cut)
        return {**manifest, "primary": cut.history}

    def _when_no_cut(self, take: Callable[[], _C]) -> _C:
        """`take()` under the lock once no checkpoint or snapshot has a cut out (one
        written in the background is waited for off the lock first); its value.

        Raises:
            PSoupError: called inside `locked()` while one is being written (it needs
                the lock to end).
        """
        durability = self._durability
        outer = self._lock.held()       # inside locked(): a background one cannot end
        while True:
            if not outer:
                durability.wait_checkpoint()
            with self._lock:
                self._check_open()
                if not durability.checkpointing:
                    return take()
                if outer:
                    raise PSoupError("a checkpoint is being written in the background; "
                                     "call checkpoint() or snapshot() outside locked() to "
                                     "wait for it")
            # a background checkpoint began meanwhile, or a replica's snapshot is written
            time.sleep(0.01)

    def replica_settings(self) -> dict[str, Any]:
        """The settings an in-memory Engine needs to hold this one's state as a read
        replica (the shape of its structures; one thread of its own)."""
        return {**self._settings, "threads": 1}

    @property
    def cursor_secret(self) -> bytes:
        """The key this engine signs cursors with (a read replica signs with it too)."""
        return self._cursors.secret

    def set_feed(self, feed: Callable[[dict[str, Any]], None] | None) -> None:
        """Give the record of every change from now on to `feed` (under the lock, in the
        order of the log, once logged), or stop (None): read replicas apply them."""
        with self._lock:
            self._durability.set_feed(feed)

    def close(self) -> None:
        """Flush the log and the archive; later writes raise PSoupError. A running
        history job is cancelled (and waited for, up to a minute), a checkpoint being
        written is finished, the Spark sources' queries are stopped. Idempotent."""
        self._sources.close(wait=not self._lock.held())
        with self._lock:
            self._durability.stop()
        if not self._lock.held():       # inside locked(), a background one ends later
            self._durability.wait_checkpoint()
        with self._lock:
            try:
                if not self._closed:
                    self._durability.close()    # a failure (a full disk) closes it too
            finally:
                self._closed = True
                self._core.query_stem.workers.close()
        for job in self._history.jobs():
            job.cancel()
            job.wait(60.0)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers

    def _compile(self, sql: str) -> StreamSchema | Query | Catalog:
        return compile_statement(sql, self._core.schemas(),
                                 max_factors=self.limits.max_factors)

    def _register(self, query: Query, ahead: Ahead | None = None) -> str:
        self._sources.admit(query)
        self.limits.admit(self._core, query)
        handle = token_hex(20)      # 160 bits; hex never looks like an option
        self._durability.log_register(handle, query.sql)
        self._durability.apply("the registration",
                               partial(self._core.register, query, handle, ahead))
        self._after_write()
        self._sources.registered(query)
        return handle

    def _ahead(self, query: Query) -> Ahead | None:
        """Under the lock: the part of registering `query` to run off it (None: all of
        it in this hold), the limits checked now, so that a refusal costs no scan."""
        ahead = self._core.ahead(query)
        if ahead is not None:
            self._sources.admit(query)
            self.limits.admit(self._core, query)
        return ahead

    def _register_ahead(self, sql: str, query: Query, ahead: Ahead) -> str:
        """Register `query` (compiled from `sql`) holding the lock only at both ends:
        `ahead` scans the copy of its stream off the lock, then under it the
        registration is checked again, logged and applied with the rows that arrived
        meanwhile (Core.register). A stream dropped or made anew meanwhile is no longer
        the one copied: then the statement is compiled and registered afresh in this
        hold, as if it had come now (refused if the stream is gone)."""
        ahead.run()
        return self.finish_register(PreparedRegistration(sql, query, ahead))

    def _drop(self, name: str, cascade: bool, how: str | None = None) -> None:
        """Refuse, or log and apply, the drop of an existing stream; a refusal suggests
        `how` to drop it with its queries (by default the statement that does)."""
        users = self._core.users(name)
        if users and not cascade:
            raise QueryError(_read_by(name, users, self._core.handles,
                                      how or f"DROP STREAM {name} CASCADE"))
        bound = self._core.next_tid
        self._durability.log_drop(name, users, bound)
        self._durability.apply(f"the drop of stream '{name}'",
                               partial(self._effects.dropped, name, users, bound))
        self._sources.drop(name)
        self._after_write()

    def _after_write(self) -> None:
        self._durability.after_write(self._cut, self._lock)

    def _cut(self) -> Cut | None:
        """An automatic checkpoint's cut (under the lock)."""
        return self._durability.cut(self._core, self._producers, self._history.pending)

    def _check_open(self) -> None:
        self._durability.check_running()
        if self._closed:
            raise PSoupError("this engine is closed; open a new Engine on its path")


@dataclass(frozen=True)
class PreparedRegistration:
    """A registration scanned off the engine's lock (`Engine.prepare_register`), to be
    ended by `Engine.finish_register`: its statement, compiled, and its scan."""

    sql: str
    query: Query
    ahead: Ahead


class _Effects:
    """The changes that reach past the core (cursors, history, reads, the archive),
    shared by the live calls and recovery (psoup.journal.durable.Effects)."""

    def __init__(self, core: Core, durability: Durability, reads: Reads,
                 cursors: CursorStore, history: HistoryJobs):
        self.core, self.durability, self.reads = core, durability, reads
        self.cursors, self.history = cursors, history

    def create(self, schema: StreamSchema, sql: str) -> None:
        self.core.create(schema, sql, self.durability.expiry(schema))

    def unregistered(self, handle: str) -> None:
        self.reads.forget(self.core.plan(handle))
        self.core.unregister(handle)
        self.cursors.forget(handle)
        self.history.forget(handle)

    def dropped(self, name: str, handles: Sequence[str], bound: int) -> None:
        """Unregister `handles`, forget the stream, and remove its archived tuples (those
        numbered below `bound`: not those of a stream created again under the name)."""
        for handle in handles:
            self.unregistered(handle)
        self.core.drop(name)
        self.durability.drop_archive(name, bound)

    def history_due(self, handles: Sequence[str]) -> None:
        self.history.due.update(handles)


def _archive_policy(budget: float | None, policy: Policy | None) -> Policy:
    """Engine's archive_budget / archive_policy as one policy (Exact by default)."""
    if budget is not None and policy is not None:
        raise ValueError("give archive_budget or archive_policy, not both")
    if policy is not None and not callable(getattr(policy, "schedule", None)):
        raise ValueError(f"archive_policy {policy!r} has no schedule(read) method "
                         "(see psoup.archive.policy)")
    return Budget(budget) if budget is not None else policy or Exact()


def _cache_bytes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("answer_cache_bytes must be a whole number of bytes >= 0 (0 "
                         f"keeps no answers), got {value!r}")
    return value


def _read_by(name: str, users: list[str], plans: Mapping[str, Plan], how: str) -> str:
    """Why stream `name` cannot be dropped: the standing queries reading it."""
    shown = "; ".join(f"{h} ({plans[h].query.sql})" for h in users[:5])
    more = f"; and {len(users) - 5} more" if len(users) > 5 else ""
    return (f"stream '{name}' is read by {len(users)} standing "
            f"quer{'y' if len(users) == 1 else 'ies'}: {shown}{more}. "
            f"Unregister them first, or use {how} to unregister them with it")


def _now(clock: Callable[[], float], now: float | None) -> float:
    """An invocation's NOW: the engine clock's, or `now` as a finite float."""
    if now is None:
        return float(clock())
    try:
        value = float(now)
    except (TypeError, ValueError):
        raise QueryError(f"now must be a number of seconds, got {now!r}") from None
    if not math.isfinite(value):
        raise QueryError(f"now must be finite, got {now!r}")
    return value


def _key(producer: str | None, seq: int | None) -> tuple[str, int] | None:
    """An insert's idempotency key, or None; raises on half a key or a bad one."""
    if producer is None and seq is None:
        return None
    if not isinstance(producer, str) or not producer:
        raise SequenceError(f"producer must be a non-empty string, got {producer!r}")
    if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or seq < 0:
        raise SequenceError(f"producer {producer!r}: seq must be an integer >= 0, "
                            f"got {seq!r}")
    return producer, int(seq)
