"""Invocation: a query's answer from the materialized results (PSoup Sect. 3.3).

When a handle is invoked, its window is resolved against NOW (the WindowsTable), the
matches inside it are read from what its mode keeps, and only then are the selected
columns fetched from the Data SteMs, projected, de-duplicated or aggregated:

* a selection query reads its slot's matches in its span, after its archive tier's part
  of the window when it has history; an aggregated one is answered from its aggregate
  structure without a scan whenever the window is a position range (Sect. 6), and one
  with history, no WHERE and no GROUP BY answers the whole minutes, hours and days of
  its window's archived part from the archive's aggregate copies
  (psoup.archive.rollups), reading only the tier's other matches;
* a join query reads its group's combinations whose every tuple lies in its item's span
  (or, in NoMat, joins the spans now).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Mapping

import numpy as np

from psoup.errors import ArchiveError
from psoup.query.model import TS, TUPLE_ID, Query
from psoup.results.aggregates import Aggregator
from psoup.results.materialized import Materialized
from psoup.results.result import Result
from psoup.results.tiers import ArchiveTiers
from psoup.results.windows_table import WindowsTable, archive_reach
from psoup.stems.data_stem import DataSteM
from psoup.stems.query_stem import JoinPlan, Plan, SelectionPlan
from psoup.stems.span import Span

if TYPE_CHECKING:
    from psoup.archive.rollups import Rollups, Substitute

log = logging.getLogger("psoup.results")


class Answers:
    """Answers invocations of one engine's queries. Cost: O(window) to find a PSoup-P
    query's matches (O(log n) for PSoup-C, O(groups) for an aggregate structure), plus
    O(answer) to fetch and project them.

    Args:
        stems: the Data SteMs by stream.
        windows: each query's windows, by query id.
        kept: what the engine mode keeps.
        tiers: the archive tiers of queries with history.
        rollups: the archive's aggregate copies (None: an engine without an archive,
            or one that keeps none); set by the engine.
    """

    def __init__(self, stems: Mapping[str, DataSteM], windows: WindowsTable,
                 kept: Materialized, tiers: ArchiveTiers, rollups: Rollups | None = None):
        self.stems = stems
        self.windows = windows
        self.kept = kept
        self.tiers = tiers
        self.rollups = rollups
        # the latest substitute, by (query, now, copies' version): an invocation asks
        # for it twice, for the segments to read off the lock and for the answer
        self._substituted: tuple[tuple[Query, float, int], Substitute | None] | None = None

    def answer(self, plan: Plan, now: float) -> Result:
        """The query's current answer at `now`."""
        return self.answer_and_window(plan, now)[0]

    def answer_and_window(self, plan: Plan, now: float
                          ) -> tuple[Result, tuple[int, int] | None]:
        """The query's current answer at `now`, and where it comes from as a tupleID
        range [lo, hi) of its stream: for a selection query without aggregates or
        history whose window is a position range, the answer is its matches in that
        range, so `recompute` can build it again later (a `since` cursor holds the range
        instead of the answer). The range is None for every other query; O(log n) on
        top of the answer's cost.
        """
        if isinstance(plan, JoinPlan):
            answer, window = self._join(plan, now), None
        else:
            answer, window = self._selection(plan, now)
        if plan.query.aggregated and plan.query.distinct:
            answer = answer.distinct()
        return answer, window

    def recompute(self, plan: Plan, lo: int, hi: int) -> Result | None:
        """The answer `answer_and_window` described by [lo, hi), from the tuples memory still
        holds (retained or passed by retention but not yet dropped); None when some may
        have been dropped since. O(hi - lo) for the part retention has passed, plus
        O(answer).
        """
        query = plan.query
        assert isinstance(plan, SelectionPlan) and not query.aggregated
        stem = self.stems[query.sources[0].stream]
        p0, p1 = stem.position_of(lo), stem.position_of(hi)
        if lo < hi and p0 == stem.oldest > 0 and stem.tid_bound(p0) != lo:
            return None                 # tuples between lo and the oldest held are gone
        names = [item.column for item in query.select]
        wanted = list(dict.fromkeys(names + [TS, TUPLE_ID]))
        positions = np.empty(0, np.int64)
        if p0 < p1 and not query.contradiction:
            passed = stem.probe_held(query.sources[0], p0, min(p1, stem.horizon))
            kept = self.kept.selection(plan, Span.range(max(p0, stem.horizon), p1))
            positions = np.concatenate([passed, kept])
        got = stem.take(wanted, positions)
        return Result.build(query.columns, [got[name] for name in names], got[TS],
                            got[TUPLE_ID], query.distinct)

    def substitute(self, plan: Plan, now: float) -> Substitute | None:
        """What the archive's aggregate copies answer of `plan`'s archived part at
        `now`, or None when they answer nothing: the query must have an archive tier,
        aggregates of INT and FLOAT columns (or COUNT), no WHERE, no GROUP BY, and a
        window with a whole minute in its archived part. Reading the copies fails over
        to the tier's tuples, with a warning. O(log part files) plus the copies of the
        parts of the days the window meets (cached by psoup.archive.rollups)."""
        if self.rollups is None or not isinstance(plan, SelectionPlan):
            return None
        query = plan.query
        source = query.sources[0]
        if (plan.slot not in self.tiers or not query.aggregated or query.group_by
                or query.contradiction or source.predicates or source.column_factors):
            return None
        reach = archive_reach(source.window, now)
        if reach is None:
            return None
        key = (query, now, self.rollups.version)
        if self._substituted is not None and all(
                a is b or a == b for a, b in zip(self._substituted[0], key)):
            return self._substituted[1]
        types = dict(self.stems[source.stream].schema.columns)
        columns = [(c, types.get(c)) for _, c in Aggregator(query).needed]
        if any(ctype not in ("int", "float") for _, ctype in columns):
            return None                 # ts, tupleID: the copies have no SUM of them
        try:
            got = self.rollups.substitute(source.stream, *reach,
                                          [(c, str(t)) for c, t in columns])
        except ArchiveError as exc:
            log.warning("answering %s from tuples: %s", query.sql, exc)
            got = None
        self._substituted = (key, got)
        return got

    def _selection(self, plan: SelectionPlan, now: float
                   ) -> tuple[Result, tuple[int, int] | None]:
        query = plan.query
        source = query.sources[0]
        stem = self.stems[source.stream]
        substitute = self.substitute(plan, now)
        archived = self.tiers.part(plan.slot, source.window, now, substitute)
        span = self.windows.spans(plan.slot, [stem], now)[0]
        kept = self.kept.aggregates.get(plan.slot)
        if kept is not None and span.is_range and not archived and substitute is None:
            return kept.index.answer(*span.bounds()), None      # Sect. 6: no scan
        if query.aggregated:
            aggregator = Aggregator(query)
            needed = list(dict.fromkeys([c for _, c in aggregator.needed] + [TS]))
            got = _fetch(self.kept.fetch(plan, span, needed), archived)
            values = {(0, c): got[c] for _, c in aggregator.needed}
            if substitute is not None:
                return aggregator.with_totals(values, got[TS], substitute.totals), None
            return aggregator.compute(values, got[TS]), None
        got = _fetch(self.kept.fetch(plan, span, plan.fetched), archived)
        answer = Result.build(query.columns, [got[name] for name in plan.selected], got[TS],
                              got[TUPLE_ID], query.distinct)
        if not span.is_range or plan.slot in self.tiers:
            return answer, None
        lo, hi = span.bounds()
        lo = min(max(lo, stem.horizon), stem.n)
        return answer, (stem.tid_bound(lo), stem.tid_bound(max(lo, min(hi, stem.n))))

    def _join(self, plan: JoinPlan, now: float) -> Result:
        query = plan.query
        stems = self.kept.stems_of(plan)
        entries = self.kept.join(plan, self.windows.spans(plan.jid, stems, now))
        if query.aggregated:
            aggregator = Aggregator(query)
            values = {(i, column): stems[i].column(column, entries.positions[:, i],
                                                   any_order=True)
                      for i, column in aggregator.needed}
            return aggregator.compute(values, entries.earliest)
        got = [stem.take(list(dict.fromkeys([it.column for it in query.select
                                             if it.source == i] + [TUPLE_ID])),
                         entries.positions[:, i], any_order=True)
               for i, stem in enumerate(stems)]
        projected = [got[item.source][item.column] for item in query.select]
        tuple_ids = np.column_stack([g[TUPLE_ID] for g in got])
        return Result.build(query.columns, projected, entries.earliest, tuple_ids,
                            query.distinct)


def _fetch(got: dict[str, np.ndarray], archived: Mapping[str, np.ndarray] | None
           ) -> dict[str, np.ndarray]:
    """The columns of the matches in memory (`got`), after the archived matches (older)."""
    if archived:
        got = {name: np.concatenate([archived[name], got[name]]) for name in got}
    return got
