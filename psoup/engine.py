"""The public, in-process psoup API (docs/api.md, "Python, embedded").

`Engine` is a facade: every method checks its input and delegates.

* Statements are compiled by `psoup.query`; tuples are checked by `psoup.stems.batch`.
* A registration gets its Query SteM slots (`psoup.stems.query_stem`), its windows in
  the WindowsTable, and the sinks that will keep its matches (`psoup.results
  .materialized`); the Eddy (`psoup.eddy`) then routes the query through the SteMs.
* A batch is routed by the Eddy into its Data SteM and through the Query SteM.
* An invocation is answered by `psoup.results.answers` from what the mode keeps; `since`
  cursors by `psoup.results.cursors`; archive tiers (history) by `psoup.results.tiers`
  with a Spark pass from `psoup.spark.history`.

Every public method holds one lock for its whole effect, so each call is atomic with
respect to the others (stream-prefix consistency across threads as well).

With a `path`, the engine is durable (psoup.journal.journal): each change is logged
before it is applied and before the call returns, and a new Engine on the same path
replays the log, so streams, retained tuples, handles and results all come back.
"""

from __future__ import annotations

import math
import re
import secrets
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from psoup.journal.wal import SYNC_MODES
from psoup.eddy.eddy import Eddy
from psoup.eddy.routing import POLICIES
from psoup.errors import PSoupError, QueryError, UnknownHandle
from psoup.locks import FairLock
from psoup.query import compile_statement, parse_type
from psoup.query.model import Query, StreamSchema
from psoup.results.answers import Answers
from psoup.results.base import SinkTable
from psoup.results.cursors import CursorStore
from psoup.results.materialized import Materialized
from psoup.results.modes import MODES as MODE_TABLE
from psoup.results.result import Changes, Result
from psoup.results.tiers import ArchiveTiers
from psoup.results.windows_table import WindowsTable
from psoup.stems.batch import make_batch
from psoup.stems.data_stem import DataSteM
from psoup.stems.query_stem import JoinPlan, Plan, QuerySteM, SelectionPlan
from psoup.stems.span import Span

if TYPE_CHECKING:
    from psoup.journal.journal import Journal, Record

#: The engine modes of PSoup Sect. 5: PSoup-P (default), PSoup-C and NoMat.
MODES = tuple(MODE_TABLE)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


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
        routing: the order of a join's probes: "adaptive" (learned from the observed
            fan-out of each step) or "fixed" (FROM order).
        shared_joins: False joins each new batch once per join query instead of once
            per group of join queries sharing streams and join factors (composite
            tuples across queries, Sect. 5.4); for benchmarks, answers are identical.
        max_factors: the most AND-ed factors a WHERE clause may have (None: no limit);
            each is a row of the predicate index, so this bounds what one query costs
            every later batch.

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
                 checkpoint_bytes: int = 64 << 20, routing: str = "adaptive",
                 shared_joins: bool = True, max_factors: int | None = None):
        if mode not in MODE_TABLE:
            raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
        if sync not in SYNC_MODES:
            raise ValueError(f"unknown sync {sync!r} (choose from {', '.join(SYNC_MODES)})")
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be positive")
        if routing not in POLICIES:
            raise ValueError(f"unknown routing {routing!r} (choose from {', '.join(POLICIES)})")
        self.mode = mode
        self.max_factors = max_factors
        self._clock = clock
        self._chunk_rows = chunk_rows
        self._lock = FairLock()
        self._stems: dict[str, DataSteM] = {}
        self._query_stem = QuerySteM(shared=shared_index)
        sinks = SinkTable()
        self._eddy = Eddy(self._stems, self._query_stem, sinks,
                          MODE_TABLE[mode].materializes, POLICIES[routing]())
        self._kept = Materialized(MODE_TABLE[mode], self._stems, sinks, self._eddy,
                                  chunk_rows, shared_joins)
        self._windows = WindowsTable()
        self._tiers = ArchiveTiers(self._stems, self._query_stem.probe)
        self._answers = Answers(self._stems, self._windows, self._kept, self._tiers)
        self._handles: dict[str, Plan] = {}     # in registration order
        self._ddl: dict[str, str] = {}          # stream -> its CREATE STREAM statement
        self._cursors = CursorStore()
        self._next_tid = 0
        self._started = clock()
        self.path = None if path is None else Path(path)
        self._journal: Journal | None = None
        self._closed = False
        if path is not None:
            from psoup.journal.journal import Journal   # pyarrow loads only when durable
            self._journal = Journal(path, sync, checkpoint_bytes)
            for record in self._journal.replay():
                self._apply(record)

    # ------------------------------------------------------------------ statements

    def execute(self, sql: str) -> str | None:
        """Run one statement: CREATE STREAM returns None, SELECT registers it and returns
        its handle."""
        with self._lock:
            self._check_open()
            stmt = self._compile(sql)
            if isinstance(stmt, StreamSchema):
                if self._journal is not None:
                    self._journal.create(sql)
                self._create(stmt, sql)
                return None
            return self._register_new(stmt)

    def create_stream(self, name: str, columns: Mapping[str, str] | Sequence[tuple[str, str]],
                      retain: str | None = None) -> None:
        """Declare a stream from Python values; the same as CREATE STREAM.

        Args:
            name: the stream's name (an identifier).
            columns: column name -> type ("int", "float", "text", "bool"), in order.
            retain: e.g. "1 hour" or "100000 rows"; None keeps everything.
        """
        pairs = list(columns.items()) if isinstance(columns, Mapping) else list(columns)
        for ident in [name] + [c for c, _ in pairs]:
            if not isinstance(ident, str) or not _IDENTIFIER.match(ident):
                raise QueryError(f"{ident!r} is not a valid name (letters, digits, _)")
        cols = ", ".join(f"{c} {parse_type(t).upper()}" for c, t in pairs)
        self.execute(f"CREATE STREAM {name} ({cols})" + (f" RETAIN {retain}" if retain else ""))

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
            return self._register_new(stmt)

    def _compile(self, sql: str) -> StreamSchema | Query:
        return compile_statement(sql, self._schemas(), max_factors=self.max_factors)

    def _create(self, schema: StreamSchema, sql: str) -> None:
        stem = DataSteM(schema, self._chunk_rows)
        if self._journal is not None:
            stem.on_expire = partial(self._journal.expired, schema.name, schema.columns)
        self._stems[schema.name] = stem
        self._ddl[schema.name] = sql

    def _register_new(self, query: Query) -> str:
        handle = secrets.token_hex(20)      # 160 bits; hex never looks like an option
        if self._journal is not None:
            self._journal.register(handle, query.sql)
        self._register(query, handle)
        self._after_write()
        return handle

    def _register(self, query: Query, handle: str) -> None:
        allocate = self._query_stem.allocate
        plan: Plan
        if len(query.sources) > 1:
            slots = tuple(allocate() for _ in query.sources)
            plan = JoinPlan(slots[0], query, slots,
                            tuple(query.local(i) for i in range(len(query.sources))))
        else:
            plan = SelectionPlan(allocate(), query)
        self._windows.add(plan.id, tuple(s.window for s in query.sources))
        self._kept.add(plan)
        self._eddy.submit_query(plan)
        self._eddy.run()
        self._handles[handle] = plan

    # ------------------------------------------------------------------ data

    def insert(self, stream: str, rows: Any, ts: Any = None) -> np.ndarray:
        """Insert a batch into `stream`; returns the tupleIDs (numpy int64 array).

        Args:
            rows: a list of tuples in schema order, a list of dicts, or a dict of
                column -> sequence or numpy array (the fast path).
            ts: None (the engine clock), one number for all rows, or one per row.

        The whole batch is checked first; a bad one raises SchemaError and changes nothing.
        """
        with self._lock:
            self._check_open()
            stem = self._stem(stream)
            batch = make_batch(stem.schema, rows, ts, self._clock(), stem.last_ts)
            tuple_ids = np.arange(self._next_tid, self._next_tid + batch.n, dtype=np.int64)
            if batch.n == 0:
                return tuple_ids
            if self._journal is not None:
                self._journal.insert(stream, self._next_tid, batch.ts, batch.columns)
            self._append(stream, batch, tuple_ids)
            self._after_write()
            return tuple_ids

    def _append(self, stream: str, batch: Any, tuple_ids: np.ndarray) -> None:
        self._next_tid = max(self._next_tid, int(tuple_ids[-1]) + 1)
        self._eddy.submit_data(stream, batch, tuple_ids)
        self._eddy.run()

    # ------------------------------------------------------------------ handles

    def invoke(self, handle: str, now: float | None = None,
               since: str | None = None) -> Result | Changes:
        """The query's current answer: its window resolved at `now` (default: the engine
        clock), applied to the materialized results, projected and de-duplicated.

        The answer carries a `cursor`. Given `since=cursor`, the result is instead the
        Changes from that earlier answer to this one: rows that entered and rows that
        left (psoup.results.cursors); a forgotten cursor raises CursorExpired.
        """
        with self._lock:
            plan = self._plan(handle)
            answer = self._answers.answer(plan, self._now(now))
            if since is None:
                self._cursors.issue(handle, answer)
                return answer
            return self._cursors.changes(handle, since, answer, plan.query.distinct)

    def unregister(self, handle: str) -> None:
        """Remove a standing query; its handle stops working and its slot is reused."""
        with self._lock:
            self._check_open()
            self._plan(handle)
            if self._journal is not None:
                self._journal.unregister(handle)
            self._unregister(handle)
            self._after_write()

    def _unregister(self, handle: str) -> None:
        plan = self._handles.pop(handle)
        self._tiers.forget(plan.id)
        self._eddy.submit_removal(plan)
        self._eddy.run()
        self._kept.forget(plan)
        self._windows.remove(plan.id)
        self._cursors.forget(handle)

    def queries(self) -> list[tuple[str, str]]:
        """[(handle, sql), ...] in registration order."""
        with self._lock:
            return [(h, plan.query.sql) for h, plan in self._handles.items()]

    # ------------------------------------------------------------------ history

    def evaluate_history(self, handles: Sequence[str] | None = None,
                         master: str | None = None,
                         progress: Callable[[str], None] | None = None) -> dict[str, int]:
        """Evaluate standing queries over the archive, so that their windows reach back
        past memory (hybrid queries): one Spark pass per stream for all the queries,
        run with psoup's Query SteM inside the executors (psoup.spark.history). From
        then on each query's archive tier grows as tuples leave retention, so its
        answers join archive and memory exactly. Returns handle -> archived matches.

        Args:
            handles: the selection queries to evaluate (default: every selection query
                without history yet).
            master: the Spark master (default local[*]).

        Raises:
            PSoupError: the engine keeps no archive (it has no path), or a handle names
                a join query (joins are not evaluated over the archive).

        Ingest and invocations wait while it runs (it holds the engine's lock).
        """
        with self._lock:
            self._check_open()
            if self._journal is None:
                raise PSoupError("history needs a durable engine: Engine(path=DIR) archives "
                                 "what leaves memory under DIR/archive")
            chosen = list(handles) if handles is not None else [
                h for h, p in self._handles.items()
                if isinstance(p, SelectionPlan) and p.slot not in self._tiers]
            jobs: dict[str, list[SelectionPlan]] = {}
            for handle in chosen:
                plan = self._plan(handle)
                if isinstance(plan, JoinPlan):
                    raise QueryError("history is evaluated for selection queries only; "
                                     f"{handle[:12]}... is a join")
                if plan.slot not in self._tiers:
                    jobs.setdefault(plan.query.sources[0].stream, []).append(plan)
            if jobs:
                from psoup.spark.history import Job, evaluate_jobs
                found = evaluate_jobs(self._journal.archive, [
                    Job(self._ddl[stream], self._stems[stream].schema,
                        [(p.slot, p.query.sql) for p in plans],
                        self._stems[stream].oldest_tuple_id(self._next_tid))
                    for stream, plans in jobs.items()], master, progress)
                for stream, tiers in found.items():
                    self._tiers.install(stream, tiers)
            return {h: self._tiers.count(self._plan(h).id) for h in chosen}

    # ------------------------------------------------------------------ introspection

    def stats(self) -> dict[str, Any]:
        """Per stream rows, bytes and rates; per query result counts; memory use."""
        with self._lock:
            elapsed = max(self._clock() - self._started, 1e-9)
            streams = {name: {"columns": dict(stem.schema.columns), "rows": stem.retained,
                              "rows_total": stem.rows_total, "bytes": stem.nbytes(),
                              "latest_ts": stem.last_ts if stem.n else None,
                              "rows_per_s": stem.rows_total / elapsed}
                       for name, stem in self._stems.items()}
            queries = {handle: {"sql": plan.query.sql, "slot": plan.id,
                                "results": self._retained_matches(plan),
                                "history": plan.id in self._tiers,
                                "archived": self._tiers.count(plan.id)}
                       for handle, plan in self._handles.items()}
            groups = self._kept.groups
            for handle, plan in self._handles.items():
                if isinstance(plan, JoinPlan) and plan.jid in groups:
                    group = groups.of(plan.jid)
                    queries[handle].update(group=group.gid, member=group.members[plan.jid])
            memory = {"data": sum(s["bytes"] for s in streams.values()),
                      "results": self._kept.nbytes(), "history": self._tiers.nbytes(),
                      "queries": self._query_stem.nbytes()}
            memory["total"] = sum(memory.values())
            out = {"mode": self.mode, "streams": streams, "queries": queries,
                   "join_groups": {group.gid: group.stats() for group in groups},
                   "memory": memory}
            if self._journal is not None:
                out["durability"] = {"path": str(self.path), "sync": self._journal.wal.sync,
                                     "log_bytes": self._journal.wal.size,
                                     "archive_buffered_rows": self._journal.archive.buffered_rows}
            return out

    def _check(self) -> None:
        """Assert the invariants of every structure and between them (for tests)."""
        with self._lock:
            plans = list(self._handles.values())
            for stem in self._stems.values():
                stem._check()
            self._query_stem._check()
            slots = [slot for p in plans for slot in
                     ((p.slot,) if isinstance(p, SelectionPlan) else p.slots)]
            assert len(slots) == len(set(slots)) and set(slots) == set(
                self._query_stem.queries), "the handles' slots are the Query SteM's"
            self._kept._check(plans)
            self._tiers._check([p.slot for p in plans if isinstance(p, SelectionPlan)])

    def _retained_matches(self, plan: Plan) -> int:
        """How many retained tuples (or combinations) match the query's WHERE clause."""
        stems = self._kept.stems_of(plan)
        spans = [Span.range(stem.horizon, stem.n) for stem in stems]
        if isinstance(plan, JoinPlan):
            return len(self._kept.join(plan, spans))
        return len(self._kept.selection(plan, spans[0]))

    # ------------------------------------------------------------------ durability

    def commit(self) -> None:
        """Force the log to disk (what sync="group" defers); a no-op in memory."""
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
            images = {name: StreamImage(self._ddl[name], stem.schema.columns,
                                        stem.rows(stem.horizon, stem.n),
                                        stem.rows(0, stem.horizon, expired=True))
                      for name, stem in self._stems.items()}
            handles = [(h, plan.query.sql) for h, plan in self._handles.items()]
            self._journal.checkpoint(images, self._next_tid, handles)

    def close(self) -> None:
        """Flush the log and the archive; later writes raise PSoupError. Idempotent."""
        with self._lock:
            if self._journal is not None and not self._closed:
                self._journal.close()
            self._closed = True

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _after_write(self) -> None:
        if self._journal is not None and self._journal.checkpoint_due:
            self.checkpoint()

    def _check_open(self) -> None:
        if self._closed:
            raise PSoupError("this engine is closed; open a new Engine on its path")

    def _apply(self, record: Record) -> None:
        """Redo one log record through the ordinary paths (recovery)."""
        if record.op == "create":
            stmt = compile_statement(record.sql, self._schemas())
            assert isinstance(stmt, StreamSchema)
            self._create(stmt, record.sql)
        elif record.op == "insert":
            stem = self._stem(record.stream)
            batch = make_batch(stem.schema, record.columns, record.ts, 0.0, stem.last_ts)
            self._append(record.stream, batch, record.tuple_ids)
        elif record.op == "register":
            query = compile_statement(record.sql, self._schemas())
            assert isinstance(query, Query)
            self._register(query, record.handle)
        elif record.op == "unregister":
            self._unregister(record.handle)
        elif record.op == "state":
            self._next_tid = max(self._next_tid, record.next_tid)

    # ------------------------------------------------------------------ helpers

    def _schemas(self) -> dict[str, StreamSchema]:
        return {name: stem.schema for name, stem in self._stems.items()}

    def _stem(self, stream: str) -> DataSteM:
        stem = self._stems.get(stream)
        if stem is None:
            known = ", ".join(self._stems) or "none"
            raise QueryError(f"unknown stream '{stream}' (streams: {known})")
        return stem

    def _plan(self, handle: str) -> Plan:
        plan = self._handles.get(handle) if isinstance(handle, str) else None
        if plan is None:
            raise UnknownHandle(f"unknown handle {str(handle)[:12]!r}: not issued by this "
                                "engine, or unregistered")
        return plan

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
