"""What one engine keeps of the query-data join, per slot (PSoup Sect. 4.3, 5.4, 6).

`Materialized` decides which sinks (psoup.results.base) keep a registered query's
matches, attaches them to the query's slots in the `SinkTable` the eddy delivers to,
and reads them back at invocation:

* a selection query's slot: the mode's selection structure (PSoup-P's bitmap, PSoup-C's
  lists, or NoMat's nothing), and for an aggregated query also its `AggregateSink`;
* a join query's local slots: its join group (psoup.results.join_groups), shared with
  the join queries over the same FROM list and join factors.

In NoMat nothing is attached: invocations evaluate the query over the window, joins
through the same hybrid structs the eddy uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from psoup.plans import JoinPlan, Plan, SelectionPlan, filed
from psoup.results.aggregates import AggregateSink
from psoup.results.base import SinkTable, Snapshot, taken_now
from psoup.results.join_groups import Joiner, JoinGroups
from psoup.results.joins import Combinations, ordered, stamped
from psoup.results.modes import Mode
from psoup.stems.data_stem import DataSteM
from psoup.stems.span import Span


class Materialized:
    """The sinks of one engine.

    Args:
        mode: the engine mode.
        stems: the Data SteMs by stream.
        sinks: the table the eddy delivers events through.
        joiner: the router's join (hybrid structs in its routing order).
        chunk_rows: the Data SteMs' chunk size (PSoup-P's bitmap chunks follow it).
        shared_joins: False gives every join query its own group.
    """

    def __init__(self, mode: Mode, stems: Mapping[str, DataSteM], sinks: SinkTable,
                 joiner: Joiner, chunk_rows: int, shared_joins: bool = True):
        self.mode = mode
        self.stems = stems
        self.sinks = sinks
        self.joiner = joiner
        self.selections = mode.selections(chunk_rows)
        self.groups = JoinGroups(joiner, shared_joins, mode.eager_joins)
        self.aggregates: dict[int, AggregateSink] = {}

    @property
    def materializes(self) -> bool:
        """Whether matches are kept (the eddy probes only then)."""
        return self.mode.materializes

    def add(self, plan: Plan) -> None:
        """Attach the sinks of a new query's slots (before the eddy routes it)."""
        query = plan.query
        if not self.materializes or query.contradiction:
            return
        if isinstance(plan, SelectionPlan):
            stream = query.sources[0].stream
            self.sinks.attach(plan.slot, stream, self.selections)
            if query.aggregated:
                sink = self.aggregates[plan.slot] = AggregateSink(query, plan.slot,
                                                                  self.stems[stream])
                self.sinks.attach(plan.slot, stream, sink)
            return
        group = self.groups.add(plan, self.stems_of(plan))
        for slot, source in zip(plan.slots, query.sources, strict=True):
            self.sinks.attach(slot, source.stream, group)

    def forget(self, plan: Plan) -> None:
        """Drop what is kept for a query whose slots the eddy has detached. A join's
        local slots are cleared in the selection structure too: the probe writes every
        filed slot's bits there (PSoup-P writes it in place), joins' included, and a
        slot no query holds must have none, for the next query to take it as it is."""
        if isinstance(plan, SelectionPlan):
            self.aggregates.pop(plan.slot, None)
        else:
            self.groups.remove(plan.jid)
            for slot in plan.slots:
                self.selections.on_unregister(slot)

    def drop_stream(self, stream: str) -> None:
        """Forget a dropped stream (every query on it is forgotten already)."""
        self.sinks.drop_stream(stream)
        self.selections.on_drop(stream)

    def streams(self) -> set[str]:
        """The streams the sinks or the selection structure keep something for."""
        return self.sinks.streams() | self.selections.streams()

    def stems_of(self, plan: Plan) -> list[DataSteM]:
        return [self.stems[source.stream] for source in plan.query.sources]

    # ------------------------------------------------------------------ reads

    def selection(self, plan: SelectionPlan, span: Span) -> np.ndarray:
        """Sorted positions in `span` of the query's matches."""
        source = plan.query.sources[0]
        if plan.query.contradiction:
            return np.empty(0, np.int64)
        return self.selections.matches(plan.slot, source, self.stems[source.stream], span)

    def fetch(self, plan: SelectionPlan, span: Span, names: Sequence[str]
              ) -> dict[str, np.ndarray]:
        """The columns `names` of the query's matches in `span`, in position order (the
        structure's find and fetch: `ResultsStructure.fetch`)."""
        source = plan.query.sources[0]
        stem = self.stems[source.stream]
        if plan.query.contradiction:
            return stem.take(names, np.empty(0, np.int64))
        return self.selections.fetch(plan.slot, source, stem, span, names)

    def fetch_deferred(self, plan: SelectionPlan, span: Span, names: Sequence[str],
                       later: Sequence[str]
                       ) -> tuple[dict[str, np.ndarray], Callable[[], dict[str, np.ndarray]]]:
        """`fetch` of `names` now and of the 8-byte columns `later` when the returned
        function is called (`ResultsStructure.fetch_deferred`)."""
        source = plan.query.sources[0]
        stem = self.stems[source.stream]
        if plan.query.contradiction:
            return taken_now(stem.take([*names, *later], np.empty(0, np.int64)), later)
        return self.selections.fetch_deferred(plan.slot, source, stem, span, names, later)

    def snapshot(self, plan: SelectionPlan, span: Span) -> SelectionCut | None:
        """Under the engine's lock: the query's matches in `span` and its stream's
        tuples as they are now, for its find and fetch off the lock; None when its
        structure reads `span` only under the lock (`ResultsStructure.snapshot`)."""
        source = plan.query.sources[0]
        held = None
        if not plan.query.contradiction:
            held = self.selections.snapshot(plan.slot, source, span)
            if held is None:
                return None
        return SelectionCut(self.stems[source.stream].snapshot(), held)

    def join(self, plan: JoinPlan, spans: Sequence[Span]) -> Combinations:
        """The query's combinations whose every tuple lies in its item's span, in answer
        order: from its group, or (NoMat) joined now over the spans."""
        if plan.query.contradiction:
            return Combinations.empty(len(spans))
        if self.materializes:
            return self.groups.of(plan.jid).matches(plan.jid, spans)
        stems = self.stems_of(plan)
        candidates = {i: stems[i].probe(local.sources[0], span)
                      for i, (span, local) in enumerate(zip(spans, plan.locals, strict=True))}
        return ordered(stamped(self.joiner.join(plan.jid, plan.query, stems, candidates,
                                                None), stems))

    def nbytes(self) -> int:
        return (self.selections.nbytes() + self.groups.nbytes()
                + sum(sink.nbytes() for sink in self.aggregates.values()))

    def _check(self, plans: Sequence[Plan]) -> None:
        """Assert the invariants (for tests): sinks are kept for the live `plans` only,
        each attached to exactly its slots; an aggregate index by blocks holds its own."""
        self.sinks._check()
        live = {p.id: p for p in plans}
        assert set(self.aggregates) == {p.slot for p in plans if isinstance(p, SelectionPlan)
                                        and p.query.aggregated and self.materializes
                                        and not p.query.contradiction}, "aggregate sinks"
        joins = [p for p in plans if isinstance(p, JoinPlan) and self.materializes
                 and not p.query.contradiction]
        assert len(self.groups) == len({id(self.groups.of(p.jid)) for p in joins}), "groups"
        slots = {slot for p in live.values() for slot, _ in filed(p)}
        assert self.sinks.attached() <= slots, "no sink keeps a slot no query has"
        for p in joins:
            group = self.groups.of(p.jid)
            group._check()
            assert p.jid in group.members
        for sink in self.aggregates.values():
            check_index = getattr(sink.index, "_check", None)
            if check_index is not None:
                check_index()
        check = getattr(self.selections, "_check", None)
        if check is not None:
            check()
        free = getattr(self.selections, "_check_free", None)
        if free is not None:
            free(slots)


class SelectionCut:
    """A selection query's matches and its stream's tuples at an invocation's cut
    (`Materialized.snapshot`): `fetch` and `fetch_deferred` as `Materialized`'s, read
    off the engine's lock; `release` once read.

    Attributes:
        stem: the snapshot of the query's Data SteM (`DataSteM.snapshot`).
    """

    def __init__(self, stem: DataSteM, held: Snapshot | None):
        self.stem, self._held = stem, held

    def fetch(self, plan: SelectionPlan, span: Span, names: Sequence[str]
              ) -> dict[str, np.ndarray]:
        if self._held is None:                  # a contradiction matches nothing
            return self.stem.take(names, np.empty(0, np.int64))
        return self._held.fetch(plan.slot, plan.query.sources[0], self.stem, span, names)

    def fetch_deferred(self, plan: SelectionPlan, span: Span, names: Sequence[str],
                       later: Sequence[str]
                       ) -> tuple[dict[str, np.ndarray], Callable[[], dict[str, np.ndarray]]]:
        if self._held is None:
            return taken_now(self.stem.take([*names, *later], np.empty(0, np.int64)), later)
        return self._held.fetch_deferred(plan.slot, plan.query.sources[0], self.stem, span,
                                         names, later)

    def release(self) -> None:
        if self._held is not None:
            self._held.release()
