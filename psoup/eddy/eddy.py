"""The PSoup Eddy: routes data and queries through the SteMs (PSoup Sect. 4.1).

Data batches, new queries and query removals all enter one *new tuple pool* (NTP) in
arrival order. Each entry carries an Interest List, the SteMs it has yet to visit; the
Eddy picks its next destination from that list alone, oblivious of what the entry is.
Whatever a visit emits (a probe's matches, a join's combinations) goes to the
*temporary tuple pool* (TTP), which is drained completely before the next NTP entry is
taken. That serializes each entry's whole effect on the Results Structure in arrival
order: *stream-prefix consistency*. An invocation, which holds the engine's lock between
entries, never sees half a batch or half a registration.

The routes are short. A data batch is inserted into its Data SteM, then probes the
Query SteM once for every standing query (Fig. 3); a new query is inserted into the
Query SteM, then probes its streams' Data SteMs (Fig. 2). A join query is filed as one
*local* query per FROM item (the factors on that item alone), so a batch's single probe
serves selections and joins alike. The probes' matches are delivered to the sinks that
keep each slot's results (psoup.results.base): the Eddy stores nothing itself. When the
engine materializes nothing (NoMat) the probes are skipped.

Joining is routing too: the Eddy is the `Joiner` of the join groups, sending hybrid
structs (psoup.eddy.hybrid) through the FROM items in the order its routing policy
(psoup.eddy.routing) picks and learning each step's fan-out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from psoup.eddy.hybrid import Step, join
from psoup.eddy.routing import AdaptiveOrder, FixedOrder
from psoup.plans import JoinPlan, Plan, filed
from psoup.query.model import TS, TUPLE_ID, Query
from psoup.results.base import SinkTable
from psoup.stems.batch import Batch
from psoup.stems.data_stem import DataSteM
from psoup.stems.query_stem import QuerySteM
from psoup.stems.span import Span

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


@dataclass
class QueryEntry:
    """A new query: (slot, query) pairs to file, one per FROM item for a join.
    `found`: per stream, (n0, the sorted matches below position n0) found ahead, off
    the engine's lock, over a copy of the stream; the probe then covers positions from
    n0 on."""

    plan: Plan
    interest: InterestList
    found: Mapping[str, tuple[int, np.ndarray]] | None = None


@dataclass
class RemovalEntry:
    plan: Plan


class Eddy:
    """Single-threaded router with a new and a temporary tuple pool.

    Args:
        data_stems: the Data SteMs by stream.
        query_stem: the Query SteM.
        sinks: where each slot's matches are delivered.
        materializes: False (NoMat) stores data and queries and probes nothing.
        policy: the routing policy of joins.

    Example:
        >>> eddy = Eddy({}, QuerySteM(), SinkTable())
        >>> eddy.run()
        0
    """

    def __init__(self, data_stems: Mapping[str, DataSteM], query_stem: QuerySteM,
                 sinks: SinkTable, materializes: bool = True,
                 policy: FixedOrder | None = None):
        self.data_stems = data_stems
        self.query_stem = query_stem
        self.sinks = sinks
        self.materializes = materializes
        self.policy = policy if policy is not None else AdaptiveOrder()
        self._buffer: np.ndarray | None = None
        self.ntp: deque[DataEntry | QueryEntry | RemovalEntry] = deque()
        self.ttp: deque[Callable[[], None]] = deque()
        self._routes: dict[type, Callable[[Any], None]] = {DataEntry: self._route_data,
                                              QueryEntry: self._route_query,
                                              RemovalEntry: self._remove}

    # -------------------------------------------------------------- entering the NTP

    def submit_data(self, stream: str, batch: Batch, tuple_ids: np.ndarray) -> DataEntry:
        probes = [QUERY_STEM] if self.materializes else []
        entry = DataEntry(stream, batch, tuple_ids, InterestList(stream, probes))
        self.ntp.append(entry)
        return entry

    def submit_query(self, plan: Plan,
                     found: Mapping[str, tuple[int, np.ndarray]] | None = None) -> QueryEntry:
        probes = ([s.stream for s in plan.query.sources]
                  if self.materializes and not plan.query.contradiction else [])
        entry = QueryEntry(plan, InterestList(QUERY_STEM, probes), found)
        self.ntp.append(entry)
        return entry

    def submit_removal(self, plan: Plan) -> RemovalEntry:
        entry = RemovalEntry(plan)
        self.ntp.append(entry)
        return entry

    # -------------------------------------------------------------- routing

    def run(self) -> int:
        """Process every NTP entry, draining the TTP after each. Returns entries done."""
        done = 0
        while self.ntp:
            entry = self.ntp.popleft()
            route = self._routes.get(type(entry))
            if route is None:
                raise TypeError(f"the eddy has no route for {type(entry).__name__}")
            route(entry)
            while self.ttp:
                self.ttp.popleft()()
            done += 1
        return done

    def _route_data(self, entry: DataEntry) -> None:
        """Fig. 3: store the batch, then probe the Query SteM with all of it at once.
        What the stores leave for later (the copies of the batch's values into the
        chunks, which the probe does not read) runs among the probe's shares when it is
        split over threads (QuerySteM.probe_into); before the sinks get the batch."""
        # (a probe on one thread gains nothing from it: the copies are made as before)
        later: list[Callable[[], None]] | None = \
            [] if self.query_stem.splits(entry.batch.n) else None
        stem = self.data_stems[entry.interest.home]
        position = stem.append(entry.batch, entry.tuple_ids, later)
        try:
            self._probe_data(entry, stem, position, later)
        finally:
            for task in later or ():
                task()

    def _probe_data(self, entry: DataEntry, stem: DataSteM, position: int,
                    later: list[Callable[[], None]] | None) -> None:
        stream = entry.stream
        sinks = self.sinks.of_stream(stream)
        for sink in sinks:
            sink.on_expire(stream, stem.horizon)
        if QUERY_STEM not in entry.interest.probes or not self.query_stem.interested(stream):
            return
        columns = dict(entry.batch.columns)
        columns[TS] = entry.batch.ts
        columns[TUPLE_ID] = entry.tuple_ids
        n, words = entry.batch.n, self.query_stem.words
        direct = self.sinks.probe_target(stream)
        others = [sink for sink in sinks if sink is not direct]
        if direct is not None:          # PSoup-P: the probe is written into its chunks
            pieces = direct.destination(stream, position, n, words, later)
            self.query_stem.probe_into(stream, columns, pieces, later)
            if not others:
                return
            bits = self._scratch(n, words)  # one row per tuple, for the other sinks
            for a, b, out in pieces:
                np.copyto(bits[a:b], out.T)
        else:
            bits = self._scratch(n, words)
            self.query_stem.probe_into(stream, columns, [(0, n, bits.T)], later)
        for sink in others:
            self.ttp.append(partial(sink.on_insert, stream, position,
                                    self.sinks.rows_for(sink, stream, bits), columns))

    def _scratch(self, n: int, words: int) -> np.ndarray:
        """An (n, words) buffer for a batch's bits, reused from batch to batch (fresh
        memory costs a page fault per 4 KiB on first write, as much as the probe
        itself). Valid until the next batch is routed: every sink copies what it keeps,
        and the TTP is drained before the next batch."""
        buf = self._buffer
        if buf is None or buf.shape[1] != words or buf.shape[0] < n:
            rows = n if buf is None or buf.shape[1] != words else max(n, buf.shape[0])
            buf = self._buffer = np.empty((rows, words), dtype="<u8")
        return buf[:n]

    def _route_query(self, entry: QueryEntry) -> None:
        """Fig. 2: file the query, then probe each of its streams' Data SteMs."""
        pairs = filed(entry.plan)
        for slot, query in pairs:
            self.query_stem.insert(query, slot)
        if not entry.interest.probes:
            return
        for (slot, query), dest in zip(pairs, entry.interest.probes, strict=False):
            ahead = None if entry.found is None else entry.found.get(dest)
            positions = self._probe(dest, query, ahead)
            for sink in self.sinks.of_slot(slot):
                self.ttp.append(partial(sink.on_register, slot, dest, positions))

    def _probe(self, stream: str, query: Query, ahead: tuple[int, np.ndarray] | None
               ) -> np.ndarray:
        """The matches of `query` among `stream`'s retained tuples: `ahead`'s (the
        matches below n0, found over a copy of the stream) still retained, and the probe's of the
        positions from n0 on, which arrived since (a registration off the lock)."""
        stem = self.data_stems[stream]
        if ahead is None:
            return stem.probe(query.sources[0])
        n0, below = ahead
        kept = below[np.searchsorted(below, stem.horizon):]
        after = stem.probe(query.sources[0], Span.range(n0, stem.n))
        return np.concatenate((kept, after)) if len(after) else kept

    def _remove(self, entry: RemovalEntry) -> None:
        for slot, _ in filed(entry.plan):
            self.query_stem.remove(slot)
            for sink in self.sinks.detach(slot):
                sink.on_unregister(slot)
        if isinstance(entry.plan, JoinPlan):
            self.policy.forget(entry.plan.jid)

    # -------------------------------------------------------------- joining

    def join(self, key: Hashable, query: Query, stems: Sequence[DataSteM],
             candidates: Mapping[int, np.ndarray], first: int | None) -> np.ndarray:
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

    def forget(self, key: Hashable) -> None:
        """Forget what the policy learned under `key` (a query or group that left)."""
        self.policy.forget(key)
