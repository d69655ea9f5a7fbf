"""The PSoup Eddy: routes data and queries through the SteMs (PSoup Sect. 4.1).

Data batches, new queries and query removals all enter one *new tuple pool* (NTP) in
arrival order. Each entry carries an Interest List, the SteMs it has yet to visit; the
Eddy picks its next destination from that list alone, oblivious of what the entry is.
Whatever a visit emits (a probe's matches, later a join's hybrid structs) goes to the
*temporary tuple pool* (TTP), which is drained completely before the next NTP entry is
taken. That serializes each entry's whole effect on the Results Structure in arrival
order: *stream-prefix consistency*. An invocation, which holds the engine's lock between
entries, never sees half a batch or half a registration.

For selection queries the routes are short: a data batch is inserted into its Data SteM,
then probes the Query SteM; a new query is inserted into the Query SteM, then probes its
stream's Data SteM (PSoup Figs. 3 and 2). When results are not materialized (NoMat) the
probes are skipped.

A join query is filed in the Query SteM as one *local* query per FROM item (the factors
on that item alone), so a batch's single Query SteM probe also tells, for every join
query, which new tuples pass their item's local factors. The matching tuples then travel
as hybrid structs (psoup.eddy.hybrid) through the other items' Data SteMs, in the order
the routing policy picks (psoup.eddy.routing), and the complete combinations land in the
join Results Structure (Figs. 4 and 5). The join work of an entry is a TTP entry queued
behind its selection matches, so it too completes before the next NTP entry.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from psoup.eddy.hybrid import Step, join
from psoup.eddy.routing import AdaptiveOrder, FixedOrder
from psoup.query.model import Query
from psoup.results.base import ResultsStructure, Span
from psoup.results.joins import Combinations, JoinResults, in_windows, ordered, stamped
from psoup.stems.batch import Batch
from psoup.stems.data_stem import DataSteM
from psoup.stems.query_stem import QuerySteM

QUERY_STEM = "query"


@dataclass
class InterestList:
    """The SteMs an entry still has to visit, and the one it is stored in (visited first)."""

    home: str
    probes: list[str] = field(default_factory=list)


@dataclass
class DataEntry:
    stream: str
    batch: Batch
    tuple_ids: np.ndarray
    interest: InterestList
    position: int = -1


@dataclass
class QueryEntry:
    slot: int
    query: Query
    interest: InterestList


@dataclass
class RemovalEntry:
    slot: int


@dataclass
class JoinPlan:
    """A registered join query: its id, and the Query SteM slot and local query of each
    FROM item (`locals[i]` holds the factors on item i alone)."""

    jid: int
    query: Query
    slots: tuple[int, ...]
    locals: tuple[Query, ...]


@dataclass
class JoinEntry:
    plan: JoinPlan
    interest: InterestList


@dataclass
class JoinRemovalEntry:
    plan: JoinPlan


@dataclass
class Matches:
    """A probe's output bound for the Results Structure (a TTP entry)."""

    apply: Callable[[], None]


class Eddy:
    """Single-threaded router with a new and a temporary tuple pool.

    Example:
        >>> from psoup.results.nomat import NoMatResults
        >>> eddy = Eddy({}, QuerySteM(), NoMatResults())
        >>> eddy.run()
        0
    """

    def __init__(self, data_stems: dict[str, DataSteM], query_stem: QuerySteM,
                 results: ResultsStructure, join_results: JoinResults | None = None,
                 policy: FixedOrder | None = None):
        self.data_stems = data_stems
        self.query_stem = query_stem
        self.results = results
        self.join_results = join_results if join_results is not None else JoinResults()
        self.policy = policy if policy is not None else AdaptiveOrder()
        self.joins: dict[int, JoinPlan] = {}
        self.ntp: deque = deque()
        self.ttp: deque = deque()

    # -------------------------------------------------------------- entering the NTP

    def submit_data(self, stream: str, batch: Batch, tuple_ids: np.ndarray) -> DataEntry:
        probes = [QUERY_STEM] if self.results.materializes else []
        entry = DataEntry(stream, batch, tuple_ids, InterestList(stream, probes))
        self.ntp.append(entry)
        return entry

    def submit_query(self, slot: int, query: Query) -> QueryEntry:
        probes = ([s.stream for s in query.sources]
                  if self.results.materializes and not query.contradiction else [])
        entry = QueryEntry(slot, query, InterestList(QUERY_STEM, probes))
        self.ntp.append(entry)
        return entry

    def submit_removal(self, slot: int) -> RemovalEntry:
        entry = RemovalEntry(slot)
        self.ntp.append(entry)
        return entry

    def submit_join(self, plan: JoinPlan) -> JoinEntry:
        probes = ([s.stream for s in plan.query.sources]
                  if self.results.materializes and not plan.query.contradiction else [])
        entry = JoinEntry(plan, InterestList(QUERY_STEM, probes))
        self.ntp.append(entry)
        return entry

    def submit_join_removal(self, plan: JoinPlan) -> JoinRemovalEntry:
        entry = JoinRemovalEntry(plan)
        self.ntp.append(entry)
        return entry

    # -------------------------------------------------------------- routing

    def run(self) -> int:
        """Process every NTP entry, draining the TTP after each. Returns entries done."""
        done = 0
        while self.ntp:
            entry = self.ntp.popleft()
            if isinstance(entry, DataEntry):
                self._route_data(entry)
            elif isinstance(entry, QueryEntry):
                self._route_query(entry)
            elif isinstance(entry, JoinEntry):
                self._route_join(entry)
            elif isinstance(entry, JoinRemovalEntry):
                self._remove_join(entry)
            else:
                self._remove(entry)
            while self.ttp:
                self.ttp.popleft().apply()
            done += 1
        return done

    def _route_data(self, entry: DataEntry) -> None:
        stem = self.data_stems[entry.interest.home]
        entry.position = stem.append(entry.batch, entry.tuple_ids)
        self.results.expire(entry.stream, stem.horizon)
        for dest in entry.interest.probes:
            if dest == QUERY_STEM and self.query_stem.interested(entry.stream):
                columns = dict(entry.batch.columns)
                columns["ts"] = entry.batch.ts
                columns["tupleID"] = entry.tuple_ids
                bits = self.query_stem.probe(entry.stream, columns, entry.batch.n)
                self.ttp.append(Matches(
                    lambda b=bits: self.results.on_insert(entry.stream, entry.position, b)))
                for plan in self.joins.values():
                    if not plan.query.contradiction and any(
                            s.stream == entry.stream for s in plan.query.sources):
                        self.ttp.append(Matches(
                            lambda p=plan, b=bits: self._join_new_data(p, entry, b)))

    def _route_query(self, entry: QueryEntry) -> None:
        self.query_stem.insert(entry.query, entry.slot)
        for source, dest in zip(entry.query.sources, entry.interest.probes):
            stem = self.data_stems[dest]
            positions = stem.probe(source, stem.horizon, stem.n)
            self.ttp.append(Matches(
                lambda p=positions, s=source.stream: self.results.on_register(entry.slot, s, p)))

    def _route_join(self, entry: JoinEntry) -> None:
        """A new join query (Fig. 4): file each item's local query, probe each item's
        Data SteM with it, then send the survivors through the other SteMs as hybrid
        structs."""
        plan = entry.plan
        for slot, local in zip(plan.slots, plan.locals):
            self.query_stem.insert(local, slot)
        self.joins[plan.jid] = plan
        if not entry.interest.probes:
            return
        stems = self.stems_of(plan.query)
        candidates = {}
        for i, (slot, local) in enumerate(zip(plan.slots, plan.locals)):
            stem = stems[i]
            candidates[i] = stem.probe(local.sources[0], stem.horizon, stem.n)
            self.ttp.append(Matches(
                lambda s=slot, p=candidates[i], st=local.sources[0].stream:
                    self.results.on_register(s, st, p)))
        combos = self._join(plan, stems, candidates, None)
        self.ttp.append(Matches(lambda: self.join_results.set(plan.jid, stamped(combos, stems))))

    def _join_new_data(self, plan: JoinPlan, entry: DataEntry, bits: np.ndarray) -> None:
        """New tuples of one stream joined with the stored data (Fig. 5). For a stream
        that several FROM items read (a self-join), each combination with at least one
        new tuple is produced once: when item i takes a new tuple, the items before it
        on the same stream take only old ones."""
        stems = self.stems_of(plan.query)
        p0 = entry.position
        found = []
        for i, source in enumerate(plan.query.sources):
            if source.stream != entry.stream:
                continue
            word, bit = divmod(plan.slots[i], 64)
            new = p0 + np.flatnonzero((bits[:, word] >> np.uint64(bit)) & np.uint64(1))
            new = new[new >= stems[i].horizon]    # a batch longer than retention
            if len(new) == 0:
                continue
            candidates = {i: new}
            for j, other in enumerate(plan.query.sources):
                if j == i:
                    continue
                stem = stems[j]
                end = p0 if (other.stream == entry.stream and j < i) else stem.n
                candidates[j] = self.results.matches(plan.slots[j], plan.locals[j].sources[0],
                                                     stem, (stem.horizon, end))
            found.append(self._join(plan, stems, candidates, i))
        if found:
            combos = np.concatenate(found) if len(found) > 1 else found[0]
            self.join_results.add(plan.jid, stamped(combos, stems), stems)

    def evaluate_join(self, plan: JoinPlan, spans: list[Span]) -> Combinations:
        """NoMat: the join over the windows, computed at invocation."""
        stems = self.stems_of(plan.query)
        candidates = {}
        for i, (span, local) in enumerate(zip(spans, plan.locals)):
            source = local.sources[0]
            candidates[i] = (stems[i].probe(source, *span) if isinstance(span, tuple)
                             else stems[i].filter(source, span))
        return ordered(stamped(self._join(plan, stems, candidates, None), stems), stems)

    def join_matches(self, plan: JoinPlan, spans: list[Span]) -> Combinations:
        """The query's combinations whose every tuple lies in its item's span."""
        if plan.query.contradiction:
            return Combinations.empty(len(spans))
        if not self.results.materializes:
            return self.evaluate_join(plan, spans)
        stems = self.stems_of(plan.query)
        return in_windows(self.join_results.entries(plan.jid, stems), spans, stems)

    def _join(self, plan: JoinPlan, stems: list[DataSteM], candidates: dict[int, np.ndarray],
              first: int | None) -> np.ndarray:
        sizes = {i: len(c) for i, c in candidates.items()}
        if first is None:
            first = self.policy.start(plan.jid, plan.query, sizes)
        steps: list[Step] = []
        combos = join(plan.query, stems, candidates,
                      self.policy.order(plan.jid, plan.query, first, sizes), steps)
        self.policy.observe(plan.jid, steps)
        return combos

    def _remove_join(self, entry: JoinRemovalEntry) -> None:
        plan = entry.plan
        for slot, local in zip(plan.slots, plan.locals):
            self.query_stem.remove(slot)
            self.results.on_unregister(slot, local.sources[0].stream)
        self.joins.pop(plan.jid, None)
        self.join_results.drop(plan.jid)
        self.policy.forget(plan.jid)

    def stems_of(self, query: Query) -> list[DataSteM]:
        return [self.data_stems[s.stream] for s in query.sources]

    def _remove(self, entry: RemovalEntry) -> None:
        query = self.query_stem.remove(entry.slot)
        for source in query.sources:
            self.results.on_unregister(entry.slot, source.stream)
