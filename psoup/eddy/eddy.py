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
join Results Structure (Figs. 4 and 5). Join queries that share their streams and join
factors form a group (psoup.eddy.groups): a new batch is joined once per group, not once
per query, and the group's combinations carry a bit per member. The join work of an
entry is a TTP entry queued behind its selection matches, so it too completes before the
next NTP entry.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from psoup.eddy.groups import JoinGroup, group_key
from psoup.eddy.hybrid import Step, join
from psoup.eddy.routing import AdaptiveOrder, FixedOrder
from psoup.query.model import TS, TUPLE_ID, Query
from psoup.results.aggregates import AggregateIndex
from psoup.results.base import ResultsStructure, Span
from psoup.results.joins import Combinations, JoinResults, in_windows, ordered, stamped
from psoup.stems.batch import Batch
from psoup.stems.data_stem import DataSteM
from psoup.stems.query_stem import QuerySteM, slot_rows

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
                 policy: FixedOrder | None = None, shared_joins: bool = True):
        self.data_stems = data_stems
        self.query_stem = query_stem
        self.results = results
        self.join_results = join_results if join_results is not None else JoinResults()
        self.policy = policy if policy is not None else AdaptiveOrder()
        self.shared_joins = shared_joins
        self.joins: dict[int, JoinPlan] = {}
        self.groups: dict[object, JoinGroup] = {}      # group_key -> group
        self.group_of: dict[int, JoinGroup] = {}       # jid -> its group
        self._next_gid = 0
        self._local_mask = np.zeros(0, dtype="<u8")     # the join queries' local slots
        # selection slot -> (its stream, the aggregate structure kept over its results,
        # the columns that structure reads)
        self.aggregates: dict[int, tuple[str, AggregateIndex, list[str]]] = {}
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
                    lambda b=self._selections(bits):
                        self.results.on_insert(entry.stream, entry.position, b)))
                if self.aggregates:
                    self.ttp.append(Matches(lambda b=bits: self._aggregate_new(entry, b)))
                for group in self.groups.values():
                    if any(s.stream == entry.stream for s in group.query.sources):
                        self.ttp.append(Matches(
                            lambda g=group, b=bits: self._join_new_data(g, entry, b)))

    def _aggregate_new(self, entry: DataEntry, bits: np.ndarray) -> None:
        """Append a batch's matches to the aggregate structure of each aggregate query
        on its stream (Sect. 6: kept as results arrive, read at invocation)."""
        stem = self.data_stems[entry.stream]
        for slot, (stream, index, columns) in self.aggregates.items():
            if stream != entry.stream:
                continue
            rows = slot_rows(bits, slot)
            positions = entry.position + rows
            keep = positions >= stem.horizon           # a batch longer than retention
            rows, positions = rows[keep], positions[keep]
            values = {column: (entry.batch.ts if column == TS else entry.tuple_ids
                               if column == TUPLE_ID else entry.batch.columns[column])[rows]
                      for column in columns}
            index.expire(stem.horizon)
            index.append(positions, values, entry.batch.ts[rows])

    def _register_aggregate(self, slot: int, stream: str, positions: np.ndarray) -> None:
        entry = self.aggregates.get(slot)
        if entry is not None:
            _, index, columns = entry
            values = self.data_stems[stream].take_columns(columns + [TS], positions)
            index.append(positions, {c: values[c] for c in columns}, values[TS])

    def _selections(self, bits: np.ndarray) -> np.ndarray:
        """A probe's bits without the join queries' local slots: the Results Structure
        keeps selection matches only (joins keep theirs in their groups)."""
        mask = self._local_mask
        if not mask.any():
            return bits
        words = min(len(mask), bits.shape[1])
        out = bits.copy()
        out[:, :words] &= ~mask[:words]
        return out

    def _mark_local(self, slots: tuple[int, ...], on: bool) -> None:
        for slot in slots:
            word, bit = divmod(slot, 64)
            if word >= len(self._local_mask):
                self._local_mask = np.pad(self._local_mask, (0, word + 1 - len(self._local_mask)))
            if on:
                self._local_mask[word] |= np.uint64(1) << np.uint64(bit)
            else:
                self._local_mask[word] &= ~(np.uint64(1) << np.uint64(bit))

    def _route_query(self, entry: QueryEntry) -> None:
        self.query_stem.insert(entry.query, entry.slot)
        for source, dest in zip(entry.query.sources, entry.interest.probes):
            stem = self.data_stems[dest]
            positions = stem.probe(source, stem.horizon, stem.n)
            self.ttp.append(Matches(
                lambda p=positions, s=source.stream: self.results.on_register(entry.slot, s, p)))
            self.ttp.append(Matches(
                lambda p=positions, s=source.stream: self._register_aggregate(entry.slot, s, p)))

    def _route_join(self, entry: JoinEntry) -> None:
        """A new join query (Fig. 4): file each item's local query, probe each item's
        Data SteM with it, then send the survivors through the other SteMs as hybrid
        structs. The query joins its group, whose candidates learn its local matches."""
        plan = entry.plan
        for slot, local in zip(plan.slots, plan.locals):
            self.query_stem.insert(local, slot)
        self.joins[plan.jid] = plan
        if not entry.interest.probes:
            return
        self._mark_local(plan.slots, True)
        key = group_key(plan.query) if self.shared_joins else plan.jid
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = JoinGroup(self._next_gid, plan.query)
            self._next_gid += 1
        index = group.join(plan.jid, plan.slots)
        self.group_of[plan.jid] = group
        stems = self.stems_of(plan.query)
        candidates = {}
        for i, local in enumerate(plan.locals):
            stem = stems[i]
            candidates[i] = stem.probe(local.sources[0], stem.horizon, stem.n)
            group.candidates[i].expire(stem.horizon)
            group.candidates[i].merge(candidates[i], index)
        combos = stamped(self._join(plan.jid, plan.query, stems, candidates, None), stems)
        word, bit = divmod(index, 64)
        combos.bits = np.zeros((len(combos), word + 1), dtype="<u8")
        combos.bits[:, word] = np.uint64(1) << np.uint64(bit)
        self.ttp.append(Matches(lambda: self.join_results.add(group.gid, combos, stems)))

    def _join_new_data(self, group: JoinGroup, entry: DataEntry, bits: np.ndarray) -> None:
        """New tuples of one stream joined with the stored data (Fig. 5), once for every
        member of the group: the new tuples that pass some member's local factors probe
        the other items' candidates together, and each combination keeps the members
        all its tuples pass. For a stream that several FROM items read (a self-join),
        each combination with at least one new tuple is produced once: when item i
        takes a new tuple, the items before it on the same stream take only old ones."""
        stems = self.stems_of(group.query)
        sources = group.query.sources
        p0 = entry.position
        new = {}
        for i, source in enumerate(sources):
            if source.stream != entry.stream:
                continue
            item_bits = group.item_bits(bits, i)
            rows = np.flatnonzero(item_bits.any(axis=1))
            positions = p0 + rows
            keep = positions >= stems[i].horizon       # a batch longer than retention
            new[i] = (positions[keep], item_bits[rows[keep]])
            group.candidates[i].expire(stems[i].horizon)
            group.candidates[i].append(*new[i])
        found, found_bits = [], []
        for i, (positions, item_bits) in new.items():
            if not len(positions):
                continue
            candidates, members = {i: positions}, {i: item_bits}
            for j, other in enumerate(sources):
                if j != i:
                    end = p0 if (other.stream == entry.stream and j < i) else stems[j].n
                    candidates[j], members[j] = group.candidates[j].between(
                        stems[j].horizon, end)
            combos = self._join(("group", group.gid), group.query, stems, candidates, i)
            if not len(combos):
                continue
            words = min(b.shape[1] for b in members.values())
            wanted = np.full((len(combos), words), ~np.uint64(0), dtype="<u8")
            for j, cands in candidates.items():
                wanted &= members[j][np.searchsorted(cands, combos[:, j]), :words]
            keep = wanted.any(axis=1)
            found.append(combos[keep])
            found_bits.append(wanted[keep])
        if found:
            entries = stamped(np.concatenate(found), stems)
            if len(entries):
                entries.bits = np.concatenate(found_bits)
                self.join_results.add(group.gid, entries, stems)

    def evaluate_join(self, plan: JoinPlan, spans: list[Span]) -> Combinations:
        """NoMat: the join over the windows, computed at invocation."""
        stems = self.stems_of(plan.query)
        candidates = {}
        for i, (span, local) in enumerate(zip(spans, plan.locals)):
            source = local.sources[0]
            candidates[i] = (stems[i].probe(source, *span) if isinstance(span, tuple)
                             else stems[i].filter(source, span))
        return ordered(stamped(self._join(plan.jid, plan.query, stems, candidates, None),
                               stems))

    def join_matches(self, plan: JoinPlan, spans: list[Span]) -> Combinations:
        """The query's combinations whose every tuple lies in its item's span."""
        if plan.query.contradiction:
            return Combinations.empty(len(spans))
        if not self.results.materializes:
            return self.evaluate_join(plan, spans)
        stems = self.stems_of(plan.query)
        group = self.group_of[plan.jid]
        entries = self.join_results.member(group.gid, group.members[plan.jid], stems)
        return in_windows(entries, spans, stems)

    def _join(self, key: object, query: Query, stems: list[DataSteM],
              candidates: dict[int, np.ndarray], first: int | None) -> np.ndarray:
        """Join candidates through hybrid structs in the policy's order; `key` names
        whose fan-outs the policy learns (a query's, or a group's)."""
        sizes = {i: len(c) for i, c in candidates.items()}
        if first is None:
            first = self.policy.start(key, query, sizes)
        steps: list[Step] = []
        combos = join(query, stems, candidates, self.policy.order(key, query, first, sizes),
                      steps)
        self.policy.observe(key, steps)
        return combos

    def _remove_join(self, entry: JoinRemovalEntry) -> None:
        plan = entry.plan
        for slot in plan.slots:
            self.query_stem.remove(slot)
        self._mark_local(plan.slots, False)
        self.joins.pop(plan.jid, None)
        self.policy.forget(plan.jid)
        group = self.group_of.pop(plan.jid, None)
        if group is None:
            return
        index = group.leave(plan.jid)
        if group.members:
            self.join_results.clear(group.gid, index)
        else:
            del self.groups[group_key(group.query) if self.shared_joins else plan.jid]
            self.join_results.drop(group.gid)
            self.policy.forget(("group", group.gid))

    def join_nbytes(self) -> int:
        """Memory of the join Results Structures and the groups' candidates."""
        return self.join_results.nbytes() + sum(g.nbytes() for g in self.groups.values())

    def stems_of(self, query: Query) -> list[DataSteM]:
        return [self.data_stems[s.stream] for s in query.sources]

    def _remove(self, entry: RemovalEntry) -> None:
        self.aggregates.pop(entry.slot, None)
        query = self.query_stem.remove(entry.slot)
        for source in query.sources:
            self.results.on_unregister(entry.slot, source.stream)
