"""The public, in-process psoup API (API.md, "Python, embedded").

`Engine` wires the pieces of ARCHITECTURE.md together and adds no logic of its own:
statements are compiled by `psoup.query`, tuples are checked by `psoup.stems.batch`,
the Eddy routes both through the SteMs into the Results Structure, and an invocation
resolves the query's window from the WindowsTable and reads the Results Structure.
Every public method holds one lock for its whole effect, so each call is atomic with
respect to the others (stream-prefix consistency across threads as well).
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from psoup.eddy.eddy import Eddy
from psoup.errors import PSoupError, QueryError, UnknownHandle
from psoup.query import compile_statement, parse_type
from psoup.query.model import TS, TUPLE_ID, Query, StreamSchema
from psoup.results.complete import CompleteResults
from psoup.results.nomat import NoMatResults
from psoup.results.partial import PartialResults
from psoup.results.result import Result
from psoup.results.windows_table import WindowsTable
from psoup.stems.batch import make_batch
from psoup.stems.data_stem import DataSteM
from psoup.stems.query_stem import QuerySteM

#: The engine modes of PSoup Sect. 5: PSoup-P (default), PSoup-C and NoMat.
MODES = ("partial", "complete", "nomat")

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class Engine:
    """An embedded psoup engine: register standing queries, insert data, invoke handles.

    Args:
        path: a directory for durable state; durability arrives with the psoup service,
            so this must be None for now.
        mode: "partial" (PSoup-P: WHERE materialized as a bitmap, windows at invocation),
            "complete" (PSoup-C: per-query result lists), or "nomat" (run at invocation).
        clock: seconds since the epoch; used for `ts` when a producer gives none and for
            NOW when an invocation gives none.
        chunk_rows: tuples per storage chunk (the unit of expiry).
        shared_index: False evaluates every query on its own for each batch instead of
            probing the shared predicate index (the paper's "Unshrd" variant, for
            benchmarks; answers are identical).

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
                 shared_index: bool = True):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
        if path is not None:
            raise PSoupError("durable state (Engine(path=...)) is not supported yet: it "
                             "arrives with the psoup service; use Engine() for now")
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be positive")
        self.mode = mode
        self._clock = clock
        self._chunk_rows = chunk_rows
        self._lock = threading.RLock()
        self._stems: dict[str, DataSteM] = {}
        self._query_stem = QuerySteM(shared=shared_index)
        if mode == "partial":
            self._results = PartialResults(chunk_rows)
        elif mode == "complete":
            self._results = CompleteResults()
        else:
            self._results = NoMatResults()
        self._windows = WindowsTable()
        self._eddy = Eddy(self._stems, self._query_stem, self._results)
        self._handles: dict[str, int] = {}     # handle -> slot, in registration order
        self._next_tid = 0
        self._started = clock()

    # ------------------------------------------------------------------ statements

    def execute(self, sql: str) -> str | None:
        """Run one statement: CREATE STREAM returns None, SELECT registers it and returns
        its handle."""
        with self._lock:
            stmt = compile_statement(sql, self._schemas())
            if isinstance(stmt, StreamSchema):
                self._stems[stmt.name] = DataSteM(stmt, self._chunk_rows)
                return None
            return self._register(stmt)

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
            stmt = compile_statement(sql, self._schemas())
            if not isinstance(stmt, Query):
                raise QueryError("register() takes a SELECT statement; use execute() for "
                                 "CREATE STREAM")
            return self._register(stmt)

    def _register(self, query: Query) -> str:
        slot = self._query_stem.allocate()
        handle = secrets.token_urlsafe(24)
        self._windows.add(slot, tuple(s.window for s in query.sources))
        self._eddy.submit_query(slot, query)
        self._eddy.run()
        self._handles[handle] = slot
        return handle

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
            stem = self._stem(stream)
            batch = make_batch(stem.schema, rows, ts, self._clock(), stem.last_ts)
            tuple_ids = np.arange(self._next_tid, self._next_tid + batch.n, dtype=np.int64)
            if batch.n == 0:
                return tuple_ids
            self._next_tid += batch.n
            self._eddy.submit_data(stream, batch, tuple_ids)
            self._eddy.run()
            return tuple_ids

    # ------------------------------------------------------------------ handles

    def invoke(self, handle: str, now: float | None = None) -> Result:
        """The query's current answer: its window resolved at `now` (default: the engine
        clock), applied to the materialized results, projected and de-duplicated."""
        with self._lock:
            slot = self._slot(handle)
            now = self._now(now)
            query = self._query_stem.queries[slot]
            source = query.sources[0]
            stem = self._stems[source.stream]
            if query.contradiction:
                positions = np.empty(0, np.int64)
            else:
                span = self._windows.spans(slot, [stem], now)[0]
                positions = self._results.matches(slot, source, stem, span)
            names = [item.column for item in query.select]
            got = stem.take_columns(list(dict.fromkeys(names + [TS, TUPLE_ID])), positions)
            return Result.build(query.columns, [got[name] for name in names], got[TS],
                                got[TUPLE_ID], query.distinct)

    def unregister(self, handle: str) -> None:
        """Remove a standing query; its handle stops working and its slot is reused."""
        with self._lock:
            slot = self._slot(handle)
            self._eddy.submit_removal(slot)
            self._eddy.run()
            self._windows.remove(slot)
            del self._handles[handle]

    def queries(self) -> list[tuple[str, str]]:
        """[(handle, sql), ...] in registration order."""
        with self._lock:
            return [(h, self._query_stem.queries[s].sql) for h, s in self._handles.items()]

    def stats(self) -> dict[str, Any]:
        """Per stream rows, bytes and rates; per query result counts; memory use."""
        with self._lock:
            elapsed = max(self._clock() - self._started, 1e-9)
            streams = {}
            for name, stem in self._stems.items():
                streams[name] = {
                    "rows": stem.retained,
                    "rows_total": stem.rows_total,
                    "bytes": stem.nbytes(),
                    "latest_ts": stem.last_ts if stem.n else None,
                    "rows_per_s": stem.rows_total / elapsed,
                }
            queries = {}
            for handle, slot in self._handles.items():
                query = self._query_stem.queries[slot]
                source = query.sources[0]
                stem = self._stems[source.stream]
                count = 0 if query.contradiction else len(
                    self._results.matches(slot, source, stem, (stem.horizon, stem.n)))
                queries[handle] = {"sql": query.sql, "slot": slot, "results": count}
            data = sum(s["bytes"] for s in streams.values())
            memory = {"data": data, "results": self._results.nbytes(),
                      "queries": self._query_stem.nbytes()}
            memory["total"] = sum(memory.values())
            return {"mode": self.mode, "streams": streams, "queries": queries,
                    "memory": memory}

    # ------------------------------------------------------------------ helpers

    def _schemas(self) -> dict[str, StreamSchema]:
        return {name: stem.schema for name, stem in self._stems.items()}

    def _stem(self, stream: str) -> DataSteM:
        stem = self._stems.get(stream)
        if stem is None:
            known = ", ".join(self._stems) or "none"
            raise QueryError(f"unknown stream '{stream}' (streams: {known})")
        return stem

    def _slot(self, handle: str) -> int:
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
        if not np.isfinite(value):
            raise QueryError(f"now must be finite, got {now!r}")
        return value
