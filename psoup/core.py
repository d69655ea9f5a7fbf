"""The in-memory PSoup engine, wired together: the paper's objects and nothing else.

`Core` owns the Data SteMs, the Query SteM, the Eddy, what the mode materializes, the
WindowsTable, the archive tiers and the handles. Its methods are the engine's effects
with no locking, no logging and no input checking beyond what the structures do:
`psoup.engine.Engine` adds those (a lock per call, the journal before each change,
cursors for `since`), and recovery replays the journal straight into a Core.

* create: a stream gets its Data SteM.
* register: a query gets Query SteM slots, its windows, its sinks; the eddy then joins
  it with the retained data (new query over old data).
* append: the eddy stores a batch and routes it through the standing queries.
* answer: psoup.results.answers reads what the mode keeps over the resolved windows.
* unregister: the reverse of register; the slots are reused.
* drop: the reverse of create, once no query reads the stream.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from psoup.archive.tiers import ArchiveTiers, Sampled
from psoup.bits import words_for
from psoup.eddy.eddy import Eddy
from psoup.eddy.routing import POLICIES
from psoup.errors import QueryError, UnknownHandle
from psoup.plans import JoinPlan, Plan, SelectionPlan
from psoup.query.model import Query, StreamSchema
from psoup.results.aggregates import AggregateIndex, index_over, scanned_index
from psoup.results.answers import Answers
from psoup.results.base import SinkTable
from psoup.results.blocks import BlockIndex
from psoup.results.materialized import Materialized
from psoup.results.modes import MODES
from psoup.results.result import Result
from psoup.results.windows_table import WindowsTable
from psoup.stems.batch import Batch
from psoup.stems.data_stem import DataSteM
from psoup.stems.query_stem import QuerySteM
from psoup.stems.span import Span
from psoup.workers import Workers


class Core:
    """The engine's state and its effects (see the module docstring).

    Costs: `register` O(retained tuples) for the query over old data plus the Query SteM
    insertion; `append` O(batch x factors probed); `answer` O(answer) in PSoup-P and
    PSoup-C, O(retained) in NoMat; `unregister` O(the query's factors).
    """

    def __init__(self, mode: str, chunk_rows: int, shared_index: bool, routing: str,
                 shared_joins: bool, answer_cache_bytes: int = 0, threads: int = 1):
        self.mode = mode
        self.chunk_rows = chunk_rows
        self.stems: dict[str, DataSteM] = {}
        self.ddl: dict[str, str] = {}           # stream -> its CREATE STREAM statement
        self.handles: dict[str, Plan] = {}      # in registration order
        self.next_tid = 0
        # rows each stream held when recovery ended: a restart's replay of the log is
        # no ingest, so stats' rates count only what came after it
        self.recovered: dict[str, int] = {}
        self.query_stem = QuerySteM(shared=shared_index, workers=Workers(threads))
        sinks = SinkTable()
        self.eddy = Eddy(self.stems, self.query_stem, sinks, MODES[mode].materializes,
                         POLICIES[routing]())
        self.kept = Materialized(MODES[mode], self.stems, sinks, self.eddy, chunk_rows,
                                 shared_joins)
        self.kept.selections.threads = threads
        self.windows = WindowsTable()
        self.tiers = ArchiveTiers(self.stems, self.query_stem.probe)
        self.answers = Answers(self.stems, self.windows, self.kept, self.tiers,
                               recent_bytes=answer_cache_bytes)

    # ------------------------------------------------------------------ effects

    def create(self, schema: StreamSchema, sql: str,
               on_expire: Callable[..., None] | None = None) -> None:
        stem = DataSteM(schema, self.chunk_rows)
        stem.threads = self.query_stem.workers.threads
        if on_expire is not None:
            stem.on_expire = on_expire
        self.stems[schema.name] = stem
        self.ddl[schema.name] = sql

    def ahead(self, query: Query) -> Ahead | None:
        """What a registration of `query` can do off the engine's lock (`Ahead`), or None
        when it is all done in one hold: a join, NoMat (nothing is probed), a
        contradiction, or fewer than OFF_LOCK_ROWS retained tuples. Under the lock;
        O(chunks)."""
        if len(query.sources) != 1 or not self.kept.materializes or query.contradiction:
            return None
        stem = self.stems[query.sources[0].stream]
        if stem.retained < OFF_LOCK_ROWS:
            return None
        return Ahead(query, stem, stem.copy_for_scan())

    def register(self, query: Query, handle: str, ahead: Ahead | None = None,
                 in_slots: tuple[int, ...] = ()) -> None:
        """File `query` under `handle` and join it with the retained data; with `ahead`
        (run off the lock, its stream still the one it read), only the tuples that
        arrived since it read are probed, and what left retention since is dropped. The
        slots are the Query SteM's next, or `in_slots` (a checkpoint's restore:
        QuerySteM.restore_slots follows)."""
        allocate = self.query_stem.allocate if not in_slots else partial(
            _take, list(in_slots), self.query_stem.reserve)
        plan: Plan
        if len(query.sources) > 1:
            slots = tuple(allocate() for _ in query.sources)
            plan = JoinPlan(slots[0], query, slots,
                            tuple(query.local(i) for i in range(len(query.sources))))
        else:
            plan = SelectionPlan(allocate(), query)
        self.windows.add(plan.id, tuple(s.window for s in query.sources))
        self.kept.add(plan)
        found = None
        if ahead is not None and ahead.positions is not None:
            assert self.stems[ahead.stem.schema.name] is ahead.stem, "revalidated by the caller"
            found = {ahead.stem.schema.name: (ahead.n0, ahead.positions)}
            if ahead.index is not None:
                self.kept.aggregates[plan.id].adopt(ahead.index, ahead.n0)
        self.eddy.submit_query(plan, found)
        self.eddy.run()
        self.handles[handle] = plan

    def admission_bytes(self, query: Query) -> int:
        """The most results memory registering `query` adds at once (see
        ResultsStructure.admission_bytes). O(chunks)."""
        slots = self.query_stem.peek(len(query.sources))
        rows = sum(self.stems[s.stream].retained for s in query.sources)
        return self.kept.selections.admission_bytes(words_for(max(slots) + 1), rows)

    def append(self, stream: str, batch: Batch, tuple_ids: np.ndarray) -> None:
        self.next_tid = max(self.next_tid, int(tuple_ids[-1]) + 1)
        self.eddy.submit_data(stream, batch, tuple_ids)
        self.eddy.run()

    def unregister(self, handle: str) -> None:
        plan = self.handles.pop(handle)
        self.tiers.forget(plan.id)
        self.eddy.submit_removal(plan)
        self.eddy.run()
        self.kept.forget(plan)
        self.answers.forget(plan)
        self.windows.remove(plan.id)

    def drop(self, stream: str) -> None:
        """Forget a stream that no standing query reads (unregister its `users` first):
        its Data SteM and everything the Query SteM, the sinks and the selection
        structure keep of it, so that a stream created again under its name starts
        empty. O(1) beyond the structures freed."""
        assert not self.users(stream), "the queries reading a stream go before it"
        del self.stems[stream]
        del self.ddl[stream]
        self.recovered.pop(stream, None)
        self.query_stem.drop_stream(stream)
        self.kept.drop_stream(stream)

    def users(self, stream: str) -> list[str]:
        """The handles of the standing queries reading `stream`, in registration order."""
        return [h for h, plan in self.handles.items()
                if any(s.stream == stream for s in plan.query.sources)]

    def answer(self, handle: str, now: float) -> Result:
        return self.answers.answer(self.plan(handle), now)


    # ------------------------------------------------------------------ lookups

    def schemas(self) -> dict[str, StreamSchema]:
        return {name: stem.schema for name, stem in self.stems.items()}

    def stem(self, stream: str) -> DataSteM:
        if not isinstance(stream, str):
            raise QueryError(f"a stream is named by a string, not {type(stream).__name__}")
        stem = self.stems.get(stream)
        if stem is None:
            known = ", ".join(self.stems) or "none"
            raise QueryError(f"unknown stream '{stream}' (streams: {known})")
        return stem

    def plan(self, handle: str) -> Plan:
        plan = self.handles.get(handle) if isinstance(handle, str) else None
        if plan is None:
            # whole, as the caller passed it (handles are 40 characters); only text far
            # longer than any handle is cut
            shown = repr(str(handle))
            shown = shown if len(shown) <= 100 else shown[:97] + "..."
            raise UnknownHandle(f"unknown handle {shown}: not issued by this engine, or "
                                "unregistered")
        return plan

    # ------------------------------------------------------------------ introspection

    def stats(self, elapsed: float) -> dict[str, Any]:
        streams: dict[str, dict[str, Any]] = {
            name: {"columns": dict(stem.schema.columns), "rows": stem.retained,
                   "rows_total": stem.rows_total, "bytes": stem.nbytes(),
                   "latest_ts": stem.last_ts if stem.n else None,
                   "rows_at_latest_ts": stem.at_last_ts,
                   "rows_per_s": (stem.rows_total - self.recovered.get(name, 0)) / elapsed}
            for name, stem in self.stems.items()}
        queries: dict[str, dict[str, Any]] = {
            handle: {"sql": plan.query.sql, "slot": plan.id,
                     "results": self._retained_matches(plan),
                     "history": plan.id in self.tiers, "archived": self.tiers.count(plan.id),
                     "tier_files": self.tiers.files(plan.id),
                     "sampled_below": _below(self.tiers.sampled(plan.id))}
            for handle, plan in self.handles.items()}
        groups = self.kept.groups
        for handle, plan in self.handles.items():
            if isinstance(plan, JoinPlan) and plan.jid in groups:
                group = groups.of(plan.jid)
                queries[handle].update(group=group.gid, member=group.members[plan.jid])
        rollups = self.answers.rollups           # the aggregate copies' decoded buckets
        memory = {"data": sum(s["bytes"] for s in streams.values()),
                  "results": self.kept.nbytes(),
                  "history": self.tiers.nbytes() + (rollups.nbytes() if rollups else 0),
                  "queries": self.query_stem.nbytes(),
                  "answers": self.answers.recent.nbytes}
        memory["total"] = sum(memory.values())
        return {"mode": self.mode, "streams": streams, "queries": queries,
                "join_groups": {group.gid: group.stats() for group in groups},
                "memory": memory}

    def _retained_matches(self, plan: Plan) -> int:
        """How many retained tuples (or combinations) match the query's WHERE clause."""
        spans = [Span.range(stem.horizon, stem.n) for stem in self.kept.stems_of(plan)]
        if isinstance(plan, JoinPlan):
            return len(self.kept.join(plan, spans))
        return len(self.kept.selection(plan, spans[0]))

    def _check(self) -> None:
        """Assert the invariants of every structure and between them (for tests)."""
        plans = list(self.handles.values())
        for stem in self.stems.values():
            stem._check()
        self.query_stem._check()
        slots = [slot for p in plans for slot in
                 ((p.slot,) if isinstance(p, SelectionPlan) else p.slots)]
        assert len(slots) == len(set(slots)) and set(slots) == set(
            self.query_stem.queries), "the handles' slots are the Query SteM's"
        self.kept._check(plans)
        self.answers.recent._check({p.slot: p.query for p in plans
                                    if isinstance(p, SelectionPlan)})
        self.tiers._check([p.slot for p in plans if isinstance(p, SelectionPlan)])
        streams = set(self.stems)
        assert set(self.ddl) == streams, "every stream has its CREATE STREAM"
        assert self.query_stem.streams() <= streams, "no index of a dropped stream"
        assert self.kept.streams() <= streams, "nothing kept of a dropped stream"
        assert not self.eddy.ntp and not self.eddy.ttp, "the eddy's pools are drained"


#: Retained tuples from which a registration scans them off the engine's lock (`Ahead`);
#: below it the one hold is short enough (measured, 64K tuples: a selection registered
#: in 0.14 ms, a GROUP BY in 0.9 ms; the copy and the second hold add 0.03-0.1 ms).
OFF_LOCK_ROWS = 1 << 16


class Ahead:
    """The long part of registering a single-stream query over a large store, done off
    the engine's lock (`run`): the query's matches among the positions [horizon, n0)
    that a copy of its stream made under the lock holds (`DataSteM.copy_for_scan`), and
    for an aggregated query its AggregateIndex over them. Core.register then
    applies it under the lock, probing only the positions from n0 on.

    Attributes:
        stem: the stream's Data SteM when it was copied (the caller checks it is
            still the stream's before applying).
        n0: the positions below it were read.
        positions: the matches below n0 (None until `run`).
        index: the aggregated query's index over them (None otherwise).
    """

    def __init__(self, query: Query, stem: DataSteM, copy: DataSteM):
        self.query, self.stem, self.n0 = query, stem, copy.n
        self._copy: DataSteM | None = copy
        self.positions: np.ndarray | None = None
        self.index: AggregateIndex | BlockIndex | None = None

    def run(self) -> None:
        """Probe the copy and build the index: O(retained), touching nothing shared but
        the copy's chunks; lets the copy go after."""
        copy = self._copy
        assert copy is not None, "an Ahead runs once"
        self._copy = None
        if self.query.aggregated:
            scanned = scanned_index(self.query, copy)
            if scanned is not None:
                self.positions, self.index = scanned
                return
        self.positions = copy.probe(self.query.sources[0])
        if self.query.aggregated:
            self.index = index_over(self.query, copy, self.positions)


def _take(slots: list[int], reserve: Callable[[int], None]) -> int:
    """The next of `slots`, reserved in the Query SteM (Core.register's given slots)."""
    slot = slots.pop(0)
    reserve(slot)
    return slot


def _below(sampled: Sampled | None) -> int | None:
    """The tupleID below which a tier's archived matches come from a sample (stats)."""
    return None if sampled is None else sampled.below
