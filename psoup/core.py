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

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from psoup.archive.policy import (WHOLE, ArchiveRead, Policy, Schedule, ask, capped,
                                  step_ranges)
from psoup.archive.rates import sample_rate, threshold
from psoup.bits import words_for
from psoup.eddy.eddy import Eddy
from psoup.eddy.routing import POLICIES
from psoup.errors import QueryError, UnknownHandle
from psoup.query.model import Query, StreamSchema
from psoup.results.answers import Answers
from psoup.results.base import SinkTable
from psoup.results.materialized import Materialized
from psoup.results.modes import MODES
from psoup.results.result import Result
from psoup.results.tiers import ArchiveTiers, Segment
from psoup.results.windows_table import WindowsTable
from psoup.stems.batch import Batch
from psoup.stems.data_stem import DataSteM
from psoup.stems.query_stem import JoinPlan, Plan, QuerySteM, SelectionPlan
from psoup.stems.span import Span

if TYPE_CHECKING:
    from psoup.spark.history import Job


class Core:
    """The engine's state and its effects (see the module docstring).

    Costs: `register` O(retained tuples) for the query over old data plus the Query SteM
    insertion; `append` O(batch x factors probed); `answer` O(answer) in PSoup-P and
    PSoup-C, O(retained) in NoMat; `unregister` O(the query's factors).
    """

    def __init__(self, mode: str, chunk_rows: int, shared_index: bool, routing: str,
                 shared_joins: bool, answer_cache_bytes: int = 0):
        self.mode = mode
        self.chunk_rows = chunk_rows
        self.stems: dict[str, DataSteM] = {}
        self.ddl: dict[str, str] = {}           # stream -> its CREATE STREAM statement
        self.handles: dict[str, Plan] = {}      # in registration order
        self.next_tid = 0
        # rows each stream held when recovery ended: a restart's replay of the log is
        # no ingest, so stats' rates count only what came after it
        self.recovered: dict[str, int] = {}
        self.query_stem = QuerySteM(shared=shared_index)
        sinks = SinkTable()
        self.eddy = Eddy(self.stems, self.query_stem, sinks, MODES[mode].materializes,
                         POLICIES[routing]())
        self.kept = Materialized(MODES[mode], self.stems, sinks, self.eddy, chunk_rows,
                                 shared_joins)
        self.windows = WindowsTable()
        self.tiers = ArchiveTiers(self.stems, self.query_stem.probe)
        self.answers = Answers(self.stems, self.windows, self.kept, self.tiers,
                               recent_bytes=answer_cache_bytes)

    # ------------------------------------------------------------------ effects

    def create(self, schema: StreamSchema, sql: str,
               on_expire: Callable[..., None] | None = None) -> None:
        stem = DataSteM(schema, self.chunk_rows)
        if on_expire is not None:
            stem.on_expire = on_expire
        self.stems[schema.name] = stem
        self.ddl[schema.name] = sql

    def register(self, query: Query, handle: str) -> None:
        allocate = self.query_stem.allocate
        plan: Plan
        if len(query.sources) > 1:
            slots = tuple(allocate() for _ in query.sources)
            plan = JoinPlan(slots[0], query, slots,
                            tuple(query.local(i) for i in range(len(query.sources))))
        else:
            plan = SelectionPlan(allocate(), query)
        self.windows.add(plan.id, tuple(s.window for s in query.sources))
        self.kept.add(plan)
        self.eddy.submit_query(plan)
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

    def unread_segments(self, handle: str, now: float, reads: Mapping[str, int] | None = None
                        ) -> list[tuple[Segment, dict[str, str], int]]:
        """The archive tier's segment files an answer of `handle` at `now` would read
        (none in the cache), those in `reads` as samples: ArchiveTiers.unread.
        O(segments)."""
        plan = self.plan(handle)
        if not isinstance(plan, SelectionPlan) or plan.slot not in self.tiers:
            return []
        return self.tiers.unread(plan.slot, plan.query.sources[0].window, now, reads,
                                 self.answers.substitute(plan, now))

    def read_plan(self, handle: str, now: float, policy: Policy, rows_per_second: float
                  ) -> dict[str, int] | None:
        """How to read the archive tier of `handle` for an answer at `now`: None to read
        its segments whole, or segment name -> the draw limit of a sampled read, each
        at the lowest rate `policy` gives over its ts range, asked about the segments
        the aggregate copies do not answer and the cache does not hold (ArchiveRead:
        their matches, bytes and ts range, at `rows_per_second`). O(segments) (a stat a
        segment not in the cache).

        Raises:
            PSoupError: the policy failed or gave a schedule that is not one.
        """
        plan = self.plan(handle)
        if not isinstance(plan, SelectionPlan) or plan.slot not in self.tiers:
            return None
        source = plan.query.sources[0]
        segments = self.tiers.meeting(plan.slot, source.window, now,
                                      self.answers.substitute(plan, now))
        unread = [seg for seg in segments if not self.tiers.cached(seg.name)]
        if not unread:
            return None
        folder = self.tiers.folder
        size = sum((folder / seg.name).stat().st_size for seg in unread
                   if folder is not None and (folder / seg.name).is_file())
        read = ArchiveRead(source.stream, sum(seg.rows for seg in unread), size,
                           min(seg.lo for seg in unread), max(seg.hi for seg in unread),
                           now, rows_per_second)
        steps = ask(policy, read)
        if steps == WHOLE:
            return None
        ranges = step_ranges(steps)       # each segment at the lowest rate over its ts
        return {seg.name: threshold(min(rate for a, b, rate in ranges
                                        if a <= seg.hi and seg.lo < b))
                for seg in segments}

    def answer_and_window(self, handle: str, now: float,
                          reads: Mapping[str, int] | None = None
                          ) -> tuple[Result, tuple[int, int] | None]:
        return self.answers.answer_and_window(self.plan(handle), now, reads)

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
            raise UnknownHandle(f"unknown handle {str(handle)[:12]!r}: not issued by this "
                                "engine, or unregistered")
        return plan

    # ------------------------------------------------------------------ history

    def history_jobs(self, handles: Sequence[str] | None,
                     schedules: Callable[[str, int], Schedule] = lambda stream, below: WHOLE
                     ) -> tuple[list[str], list[Job]]:
        """The handles to evaluate over the archive (default: every selection query
        without a tier) and one Spark job per stream for those still without one.
        `schedules(stream, below)`: the overload policy's sample rates for reading the
        stream's archive below tupleID `below` (psoup.archive.policy), capped by each
        query's own TABLESAMPLE."""
        from psoup.spark.history import Job
        chosen = list(handles) if handles is not None else [
            h for h, p in self.handles.items()
            if isinstance(p, SelectionPlan) and p.slot not in self.tiers]
        by_stream: dict[str, list[SelectionPlan]] = {}
        for handle in chosen:
            plan = self.plan(handle)
            if isinstance(plan, JoinPlan):
                raise QueryError("history is evaluated for selection queries only; "
                                 f"{handle[:12]}... is a join")
            if plan.slot not in self.tiers:
                by_stream.setdefault(plan.query.sources[0].stream, []).append(plan)
        jobs = []
        for stream, plans in by_stream.items():
            stem = self.stems[stream]
            until = stem.ts_at(stem.oldest) if stem.oldest < stem.n else math.inf
            below = stem.oldest_tuple_id(self.next_tid)
            schedule = schedules(stream, below)
            samples = {p.slot: capped(schedule, None if s is None else
                                      sample_rate(s.method, s.fraction))
                       for p in plans for s in [p.query.sources[0].sample]}
            jobs.append(Job(self.ddl[stream], stem.schema, [(p.slot, p.query.sql)
                                                             for p in plans],
                            below, {slot: steps for slot, steps in samples.items()
                                    if steps != WHOLE}, until))
        return chosen, jobs

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
                     "history": plan.id in self.tiers, "archived": self.tiers.count(plan.id)}
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
