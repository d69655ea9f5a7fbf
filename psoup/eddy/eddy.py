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
probes are skipped. The joins issue extends the routes and the policy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from psoup.query.model import Query
from psoup.results.base import ResultsStructure
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
                 results: ResultsStructure):
        self.data_stems = data_stems
        self.query_stem = query_stem
        self.results = results
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

    def _route_query(self, entry: QueryEntry) -> None:
        self.query_stem.insert(entry.query, entry.slot)
        for source, dest in zip(entry.query.sources, entry.interest.probes):
            stem = self.data_stems[dest]
            positions = stem.probe(source, stem.horizon, stem.n)
            self.ttp.append(Matches(
                lambda p=positions, s=source.stream: self.results.on_register(entry.slot, s, p)))

    def _remove(self, entry: RemovalEntry) -> None:
        query = self.query_stem.remove(entry.slot)
        for source in query.sources:
            self.results.on_unregister(entry.slot, source.stream)
