"""The public, in-process psoup API (API.md, "Python, embedded").

`Engine` wires the pieces of ARCHITECTURE.md together and adds no logic of its own:
statements are compiled by `psoup.query`, tuples are checked by `psoup.stems.batch`,
the Eddy routes both through the SteMs into the Results Structure, and an invocation
resolves the query's window from the WindowsTable and reads the Results Structure.
Every public method holds one lock for its whole effect, so each call is atomic with
respect to the others (stream-prefix consistency across threads as well).

With a `path`, the engine is durable (psoup.archive.journal): each change is logged
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

from psoup.archive.wal import SYNC_MODES
from psoup.eddy.eddy import Eddy, JoinPlan
from psoup.eddy.routing import POLICIES
from psoup.errors import PSoupError, QueryError, UnknownHandle
from psoup.locks import FairLock
from psoup.query import compile_statement, parse_type
from psoup.query.model import TS, TUPLE_ID, Query, Source, StreamSchema, Window
from psoup.results.aggregates import AggregateIndex, Aggregator
from psoup.results.complete import CompleteResults
from psoup.results.cursors import CursorStore
from psoup.results.history import Tier
from psoup.results.joins import JoinResults
from psoup.results.nomat import NoMatResults
from psoup.results.partial import PartialResults
from psoup.results.result import Changes, Result
from psoup.results.windows_table import WindowsTable
from psoup.stems.batch import make_batch
from psoup.stems.data_stem import DataSteM
from psoup.stems.query_stem import QuerySteM, slot_rows

if TYPE_CHECKING:
    from psoup.archive.journal import Journal, Record

#: The engine modes of PSoup Sect. 5: PSoup-P (default), PSoup-C and NoMat.
MODES = ("partial", "complete", "nomat")

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
                 shared_joins: bool = True):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
        if sync not in SYNC_MODES:
            raise ValueError(f"unknown sync {sync!r} (choose from {', '.join(SYNC_MODES)})")
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be positive")
        if routing not in POLICIES:
            raise ValueError(f"unknown routing {routing!r} (choose from {', '.join(POLICIES)})")
        self.mode = mode
        self._clock = clock
        self._chunk_rows = chunk_rows
        self._lock = FairLock()
        self._stems: dict[str, DataSteM] = {}
        self._query_stem = QuerySteM(shared=shared_index)
        if mode == "partial":
            self._results = PartialResults(chunk_rows)
        elif mode == "complete":
            self._results = CompleteResults()
        else:
            self._results = NoMatResults()
        self._windows = WindowsTable()
        self._eddy = Eddy(self._stems, self._query_stem, self._results,
                          JoinResults(eager=mode == "complete"), POLICIES[routing](),
                          shared_joins=shared_joins)
        # handle -> the slot of a selection query, or the plan of a join query, in
        # registration order
        self._handles: dict[str, int | JoinPlan] = {}
        self._ddl: dict[str, str] = {}          # stream -> its CREATE STREAM statement
        self._cursors = CursorStore()
        self._tiers: dict[int, Tier] = {}       # slot -> its archive tier (history)
        self._next_tid = 0
        self._started = clock()
        self.path = None if path is None else Path(path)
        self._journal: Journal | None = None
        self._closed = False
        if path is not None:
            from psoup.archive.journal import Journal   # pyarrow loads only when durable
            self._journal = Journal(path, sync, checkpoint_bytes)
            self._recover()

    # ------------------------------------------------------------------ statements

    def execute(self, sql: str) -> str | None:
        """Run one statement: CREATE STREAM returns None, SELECT registers it and returns
        its handle."""
        with self._lock:
            self._check_open()
            stmt = compile_statement(sql, self._schemas())
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
            stmt = compile_statement(sql, self._schemas())
            if not isinstance(stmt, Query):
                raise QueryError("register() takes a SELECT statement; use execute() for "
                                 "CREATE STREAM")
            return self._register_new(stmt)

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
        if len(query.sources) > 1:
            self._handles[handle] = self._register_join(query)
            return
        slot = self._query_stem.allocate()
        self._windows.add(slot, tuple(s.window for s in query.sources))
        if query.aggregated and self._results.materializes and not query.contradiction:
            aggregator = Aggregator(query)
            self._eddy.aggregates[slot] = (query.sources[0].stream, AggregateIndex(aggregator),
                                           [column for _, column in aggregator.needed])
        self._eddy.submit_query(slot, query)
        self._eddy.run()
        self._handles[handle] = slot

    def _register_join(self, query: Query) -> JoinPlan:
        """A join query takes one Query SteM slot per FROM item, for that item's local
        factors; its first slot doubles as its id."""
        slots = tuple(self._query_stem.allocate() for _ in query.sources)
        locals_ = tuple(
            Query(f"{query.sql} [local to {source.alias}]",
                  (Source(source.stream, source.alias, Window(), source.predicates,
                          source.column_factors),), (), contradiction=query.contradiction)
            for source in query.sources)
        plan = JoinPlan(slots[0], query, slots, locals_)
        self._windows.add(plan.jid, tuple(s.window for s in query.sources))
        self._eddy.submit_join(plan)
        self._eddy.run()
        return plan

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
            registered = self._slot(handle)
            now = self._now(now)
            if isinstance(registered, JoinPlan):
                answer = self._join_answer(registered, now)
            else:
                answer = self._answer(registered, now)
            query = self._query(registered)
            if query.aggregated and query.distinct:
                answer = answer.distinct()
            if since is None:
                self._cursors.issue(handle, answer)
                return answer
            return self._cursors.changes(handle, since, answer, query.distinct)

    def _join_answer(self, plan: JoinPlan, now: float) -> Result:
        query = plan.query
        stems = self._eddy.stems_of(query)
        entries = self._eddy.join_matches(plan, self._windows.spans(plan.jid, stems, now))
        if query.aggregated:
            aggregator = Aggregator(query)
            values = {(i, column): stems[i].gather(column, entries.positions[:, i])
                      for i, column in aggregator.needed}
            return aggregator.compute(values, entries.earliest)
        got = [stem.gather_columns(
                   list(dict.fromkeys([it.column for it in query.select if it.source == i]
                                      + [TUPLE_ID])), entries.positions[:, i])
               for i, stem in enumerate(stems)]
        values = [got[item.source][item.column] for item in query.select]
        tuple_ids = np.column_stack([g[TUPLE_ID] for g in got])
        return Result.build(query.columns, values, entries.earliest, tuple_ids, query.distinct)

    def _answer(self, slot: int, now: float) -> Result:
        query = self._query_stem.queries[slot]
        source = query.sources[0]
        stem = self._stems[source.stream]
        archived = self._archived(slot, source.window, now)
        if query.contradiction:
            positions = np.empty(0, np.int64)
        else:
            span = self._windows.spans(slot, [stem], now)[0]
            kept = self._eddy.aggregates.get(slot)
            if kept is not None and isinstance(span, tuple) and not archived:
                return kept[1].answer(*span)          # Sect. 6: no scan of the window
            positions = self._results.matches(slot, source, stem, span)
        if query.aggregated:
            aggregator = Aggregator(query)
            got = self._fetch(stem, [c for _, c in aggregator.needed] + [TS], positions, archived)
            return aggregator.compute({(0, c): got[c] for _, c in aggregator.needed}, got[TS])
        names = [item.column for item in query.select]
        got = self._fetch(stem, list(dict.fromkeys(names + [TS, TUPLE_ID])), positions, archived)
        return Result.build(query.columns, [got[name] for name in names], got[TS],
                            got[TUPLE_ID], query.distinct)

    @staticmethod
    def _fetch(stem: DataSteM, names: list[str], positions: np.ndarray,
               archived: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """Columns of the matches at `positions`, after the archived matches (older)."""
        got = stem.take_columns(names, positions)
        if archived:
            got = {name: np.concatenate([archived[name], got[name]]) for name in names}
        return got

    def _archived(self, slot: int, window: Window, now: float) -> dict[str, np.ndarray] | None:
        """The query's archived matches in its window, when it has history: all of them
        for an unbounded window, a ts range for a time window; ROWS and PARTITION BY
        windows count the tuples in memory only (docs/history.md)."""
        tier = self._tiers.get(slot)
        if tier is None or not len(tier):
            return None
        if window.kind == "all":
            got = tier.columns
        elif window.kind == "range":
            got = tier.between(window.begin.resolve(now), window.end.resolve(now))
        else:
            return None
        return got if got and len(got[TUPLE_ID]) else None

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
                h for h, r in self._handles.items()
                if not isinstance(r, JoinPlan) and r not in self._tiers]
            plan: dict[str, list[tuple[str, int]]] = {}
            for handle in chosen:
                registered = self._slot(handle)
                if isinstance(registered, JoinPlan):
                    raise QueryError("history is evaluated for selection queries only; "
                                     f"{handle[:12]}... is a join")
                query = self._query_stem.queries[registered]
                if registered not in self._tiers:
                    plan.setdefault(query.sources[0].stream, []).append((handle, registered))
            if not plan:
                return {h: len(self._tiers.get(self._slot(h), ())) for h in chosen}
            from psoup.results.history import Tier
            from psoup.spark import history
            from psoup.spark.session import spark_session
            self._journal.archive.flush()
            spark = spark_session(master)
            found = {}      # every stream's matches first: a failure installs nothing
            for stream, members in plan.items():
                stem = self._stems[stream]
                below = int(stem.rows(stem.oldest, stem.oldest + 1, expired=True)[TUPLE_ID][0]) \
                    if stem.oldest < stem.n else self._next_tid
                queries = [(slot, self._query_stem.queries[slot].sql) for _, slot in members]
                matches = history.evaluate(spark, self._journal.archive.root, self._ddl[stream],
                                           stem.schema, queries, below, progress)
                found[stream] = _split_matches(matches, stem.schema, [s for _, s in members])
            for stream, tiers in found.items():
                stem = self._stems[stream]
                for slot, columns in tiers.items():
                    self._tiers[slot] = Tier()
                    self._tiers[slot].append(columns)
                self._tier_held(stream, stem.rows(stem.oldest, stem.horizon, expired=True),
                                list(tiers))
                stem.on_horizon = partial(self._horizon_moved, stream)
            return {h: len(self._tiers.get(self._slot(h), ())) for h in chosen}

    def _horizon_moved(self, stream: str, old: int, new: int) -> None:
        """Retention passed [old, new): the matches there move to the archive tiers."""
        slots = [slot for slot in self._tiers
                 if self._query_stem.queries[slot].sources[0].stream == stream]
        if slots:
            self._tier_held(stream, self._stems[stream].rows(old, new, expired=True), slots)

    def _tier_held(self, stream: str, rows: dict[str, np.ndarray], slots: list[int]) -> None:
        """Probe tuples still held in memory but past retention for the tiers' queries."""
        n = len(rows[TS])
        if not n:
            return
        bits = self._query_stem.probe(stream, rows, n)
        for slot in slots:
            hit = slot_rows(bits, slot)
            self._tiers[slot].append({name: values[hit] for name, values in rows.items()})

    def unregister(self, handle: str) -> None:
        """Remove a standing query; its handle stops working and its slot is reused."""
        with self._lock:
            self._check_open()
            self._slot(handle)
            if self._journal is not None:
                self._journal.unregister(handle)
            self._unregister(handle)
            self._after_write()

    def _unregister(self, handle: str) -> None:
        registered = self._slot(handle)
        if not isinstance(registered, JoinPlan) and self._tiers.pop(registered, None):
            stream = self._query_stem.queries[registered].sources[0].stream
            if not any(self._query_stem.queries[s].sources[0].stream == stream
                       for s in self._tiers):
                self._stems[stream].on_horizon = None
        if isinstance(registered, JoinPlan):
            self._eddy.submit_join_removal(registered)
            self._windows.remove(registered.jid)
        else:
            self._eddy.submit_removal(registered)
            self._windows.remove(registered)
        self._eddy.run()
        self._cursors.forget(handle)
        del self._handles[handle]

    def queries(self) -> list[tuple[str, str]]:
        """[(handle, sql), ...] in registration order."""
        with self._lock:
            return [(h, self._query(r).sql) for h, r in self._handles.items()]

    def _query(self, registered: int | JoinPlan) -> Query:
        if isinstance(registered, JoinPlan):
            return registered.query
        return self._query_stem.queries[registered]

    def stats(self) -> dict[str, Any]:
        """Per stream rows, bytes and rates; per query result counts; memory use."""
        with self._lock:
            elapsed = max(self._clock() - self._started, 1e-9)
            streams = {}
            for name, stem in self._stems.items():
                streams[name] = {
                    "columns": dict(stem.schema.columns),
                    "rows": stem.retained,
                    "rows_total": stem.rows_total,
                    "bytes": stem.nbytes(),
                    "latest_ts": stem.last_ts if stem.n else None,
                    "rows_per_s": stem.rows_total / elapsed,
                }
            queries = {}
            for handle, registered in self._handles.items():
                query = self._query(registered)
                if isinstance(registered, JoinPlan):
                    stems = self._eddy.stems_of(query)
                    count = len(self._eddy.join_matches(
                        registered, [(stem.horizon, stem.n) for stem in stems]))
                    slot = registered.jid
                else:
                    source, slot = query.sources[0], registered
                    stem = self._stems[source.stream]
                    count = 0 if query.contradiction else len(
                        self._results.matches(slot, source, stem, (stem.horizon, stem.n)))
                queries[handle] = {"sql": query.sql, "slot": slot, "results": count}
            data = sum(s["bytes"] for s in streams.values())
            memory = {"data": data,
                      "results": self._results.nbytes() + self._eddy.join_nbytes(),
                      "history": sum(t.nbytes() for t in self._tiers.values()),
                      "queries": self._query_stem.nbytes()}
            memory["total"] = sum(memory.values())
            out = {"mode": self.mode, "streams": streams, "queries": queries,
                   "memory": memory}
            if self._journal is not None:
                out["durability"] = {"path": str(self.path), "sync": self._journal.wal.sync,
                                     "log_bytes": self._journal.wal.size,
                                     "archive_buffered_rows": self._journal.archive.buffered_rows}
            return out

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
            from psoup.archive.journal import StreamImage
            images = {name: StreamImage(self._ddl[name], stem.schema.columns,
                                        stem.rows(stem.horizon, stem.n),
                                        stem.rows(0, stem.horizon, expired=True))
                      for name, stem in self._stems.items()}
            handles = [(h, self._query(r).sql) for h, r in self._handles.items()]
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

    def _recover(self) -> None:
        """Rebuild the state the log describes, through the ordinary paths."""
        for record in self._journal.replay():
            self._apply(record)

    def _apply(self, record: Record) -> None:
        if record.op == "create":
            self._create(compile_statement(record.sql, self._schemas()), record.sql)
        elif record.op == "insert":
            stem = self._stem(record.stream)
            batch = make_batch(stem.schema, record.columns, record.ts, 0.0, stem.last_ts)
            self._append(record.stream, batch, record.tuple_ids)
        elif record.op == "register":
            self._register(compile_statement(record.sql, self._schemas()), record.handle)
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

    def _slot(self, handle: str) -> int | JoinPlan:
        slot = self._handles.get(handle) if isinstance(handle, str) else None
        if slot is None:
            raise UnknownHandle(f"unknown handle {str(handle)[:12]!r}: not issued by this "
                                "engine, or unregistered")
        return slot

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


def _split_matches(matches: Any, schema: StreamSchema, slots: list[int]
                   ) -> dict[int, dict[str, np.ndarray]]:
    """Spark's match table (slot, tuple_id, ts, columns; sorted by slot, tupleID) as
    psoup columns per slot."""
    from psoup.archive.parquet import TS_COLUMN, TUPLE_ID_COLUMN
    from psoup.stems.batch import DTYPES
    slot_of = matches.column("slot").to_numpy()
    names = {TS: TS_COLUMN, TUPLE_ID: TUPLE_ID_COLUMN, **{c: c for c, _ in schema.columns}}
    types = {TS: np.dtype(np.float64), TUPLE_ID: np.dtype(np.int64),
             **{c: DTYPES[t] for c, t in schema.columns}}
    columns = {}
    for name, source in names.items():
        column = matches.column(source)
        columns[name] = (np.array(column.to_pylist(), dtype=object) if types[name] == object
                         else column.to_numpy().astype(types[name], copy=False))
    out = {}
    for slot in slots:
        a, b = np.searchsorted(slot_of, [slot, slot + 1])
        out[slot] = {name: values[a:b] for name, values in columns.items()}
    return out
