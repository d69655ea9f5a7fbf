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
import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from psoup.archive.policy import step_ranges
from psoup.archive.rates import SAMPLE_SPACE
from psoup.archive.tiers import ALL, READ_RATE, ArchiveTiers, Limits, Reach, Sampled
from psoup.errors import ArchiveError
from psoup.plans import JoinPlan, Plan, SelectionPlan
from psoup.query.model import TS, TUPLE_ID, ColumnType, Query, WindowType
from psoup.results.aggregates import Aggregator
from psoup.results.materialized import Materialized, SelectionCut
from psoup.results.recent import Recent, RecentAnswers
from psoup.results.result import EXACT, Result
from psoup.results.windows_table import WindowsTable, archive_reach
from psoup.stems.data_stem import DataSteM
from psoup.stems.span import Span

if TYPE_CHECKING:
    from psoup.archive.batches import BatchStore
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
        recent_bytes: the budget of the queries' last answers kept for their next
            invocation (psoup.results.recent; 0 keeps none).

    Attributes:
        defer_identity: whether a selection's answer over a position range takes its ts
            and tupleIDs only when they are first read (`Result`'s identity): True, for
            callers that mostly read the columns; a server, which sends every answer's
            ts and tupleIDs, sets it False and has them taken in the find's pass
            (deferred, they cost a second compiled call, about 6 us, when read).
    """

    def __init__(self, stems: Mapping[str, DataSteM], windows: WindowsTable,
                 kept: Materialized, tiers: ArchiveTiers, rollups: Rollups | None = None,
                 recent_bytes: int = 0):
        self.stems = stems
        self.windows = windows
        self.kept = kept
        self.tiers = tiers
        self.rollups = rollups
        # the latest substitute, by (query, now, copies' version): an invocation asks
        # for it twice, for the segments to read off the lock and for the answer
        self._substituted: tuple[tuple[Query, float, int], Substitute | None] | None = None
        self.defer_identity = True
        self.recent = RecentAnswers(recent_bytes)
        #: queries that began to leave (`depart`): an answer read off the lock while
        #: this changed may mix a slot's bits before and after (psoup.results.reads)
        self.departures = 0

    def depart(self) -> None:
        """A query is about to leave (before anything of it changes)."""
        self.departures += 1

    def forget(self, plan: Plan) -> None:
        """Drop what is kept of a query that left (its slot may be reused)."""
        if isinstance(plan, SelectionPlan):
            self.recent.forget(plan.slot)

    def answer(self, plan: Plan, now: float) -> Result:
        """The query's current answer at `now`."""
        return self.answer_and_window(plan, now)[0]

    def answer_and_window(self, plan: Plan, now: float,
                          reads: Mapping[str, Limits] | None = None
                          ) -> tuple[Result, tuple[int, int] | None]:
        """The query's current answer at `now`, and where it comes from as a tupleID
        range [lo, hi) of its stream: for a selection query without aggregates or
        history whose window is a position range, the answer is its matches in that
        range, so `recompute` can build it again later (a `since` cursor holds the range
        instead of the answer). The range is None for every other query; O(log n) on
        top of the answer's cost. `reads`: the tier's segments to read as samples,
        name -> draw limit (ArchiveTiers.part).
        """
        if isinstance(plan, JoinPlan):
            answer, window = self._join(plan, now), None
        else:
            answer, window = self._selection(plan, now, reads)
        if plan.query.aggregated and plan.query.distinct:
            answer = answer.distinct()
        return answer, window

    def snapshot(self, plan: Plan, now: float
                 ) -> Callable[[], tuple[Result, tuple[int, int] | None]] | None:
        """Under the lock, the short step of an invocation whose find and fetch run off
        it: the window resolved at `now`, and the query's matches and stream's tuples
        as they are now (`Materialized.snapshot`); returns the rest of
        `answer_and_window`, to call off the lock: what it reads stays as it was here,
        whatever writers do meanwhile, but an answer read while a query left (the
        `departures` changed) is to be thrown away. None for the queries answered
        under the lock: joins, aggregates kept in an aggregate structure (their
        structures change in place), queries with history, and windows the mode's
        structure reads only under the lock (PSoup-P's PARTITION BY). O(log n)."""
        if not isinstance(plan, SelectionPlan) or plan.slot in self.tiers or \
                plan.slot in self.kept.aggregates:
            return None
        window = plan.query.sources[0].window
        if window.kind is WindowType.PARTITION and not self.kept.selections.snapshots_arrays:
            return None
        span = self.windows.span(plan.slot, self.stems[plan.query.sources[0].stream], now)
        cut = self.kept.snapshot(plan, span)
        if cut is None:
            return None
        return partial(self._read_cut, plan, cut, span, self.departures)

    def _read_cut(self, plan: SelectionPlan, cut: SelectionCut, span: Span,
                  departures: int) -> tuple[Result, tuple[int, int] | None]:
        """Off the lock, `_selection`'s answer of a query without history from a cut."""
        try:
            if plan.query.aggregated:           # (NoMat's: aggregated from the matches)
                answer = self._aggregate(plan, span, _IN_MEMORY, cut)
                return (answer.distinct() if plan.query.distinct else answer), None
            if span.is_range:
                return self._in_range(plan, cut.stem, span, cut, departures)
            return self._rows(plan, cut.stem, span, _IN_MEMORY, cut), None
        finally:
            cut.release()

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
        window with a whole minute in its archived part, and a tier not built from a
        sample. Reading the copies fails over to the tier's tuples, with a warning.
        O(log part files) plus the copies of the parts of the days the window meets
        (cached by psoup.archive.rollups)."""
        if self.rollups is None or not isinstance(plan, SelectionPlan):
            return None
        query = plan.query
        source = query.sources[0]
        if (plan.slot not in self.tiers or not query.aggregated or query.group_by
                or query.contradiction or source.predicates or source.column_factors
                or self.tiers.sampled(plan.slot) is not None):
            return None                 # (a sample's estimate is of the sampled tuples)
        reach = archive_reach(source.window, now)
        if reach is None:
            return None
        key = (query, now, self.rollups.version)
        if self._substituted is not None and all(
                a is b or a == b for a, b in zip(self._substituted[0], key, strict=True)):
            return self._substituted[1]
        types = dict(self.stems[source.stream].schema.columns)
        needed = [(c, types.get(c)) for _, c in Aggregator(query).needed]
        columns = [(c, t) for c, t in needed
                   if t is not None and t in (ColumnType.INT, ColumnType.FLOAT)]
        if len(columns) < len(needed):
            return None                 # ts, tupleID: the copies have no SUM of them
        try:
            got = self.rollups.substitute(source.stream, *reach, columns)
        except ArchiveError as exc:
            log.warning("answering %s from tuples: %s", query.sql, exc)
            got = None
        self._substituted = (key, got)
        return got

    def _selection(self, plan: SelectionPlan, now: float,
                   reads: Mapping[str, Limits] | None = None
                   ) -> tuple[Result, tuple[int, int] | None]:
        """A selection query's answer in stages: the window (its span in memory and its
        tier's part), then the find and the fetch; each shortcut a named step."""
        stem = self.stems[plan.query.sources[0].stream]
        span = self.windows.span(plan.slot, stem, now)
        tier = self._tier_part(plan, now, reads)
        if tier.empty:
            indexed = self._indexed(plan, span)
            if indexed is not None:
                return indexed, None
        if plan.query.aggregated:
            return self._aggregate(plan, span, tier), None
        if span.is_range and plan.slot not in self.tiers:
            return self._in_range(plan, stem, span)
        return self._rows(plan, stem, span, tier), None

    def _tier_part(self, plan: SelectionPlan, now: float,
                   reads: Mapping[str, Limits] | None) -> _TierPart:
        """What the archive adds to the window at `now`: its matches there (`reads`:
        the segments read as samples), the part the aggregate copies answer, the tier's
        sample and the answer's fidelity; `_IN_MEMORY` for a query without a tier."""
        if plan.slot not in self.tiers:
            return _IN_MEMORY
        reach = archive_reach(plan.query.sources[0].window, now)
        substitute = self.substitute(plan, now)
        archived = self.tiers.part(plan.slot, reach, reads, substitute)
        sample = self.tiers.sampled(plan.slot)
        fidelity = _fidelity(reach, _sample_layer(sample) + self._read_layer(plan, reach, reads))
        return _TierPart(archived, substitute, sample, fidelity)

    def _indexed(self, plan: SelectionPlan, span: Span) -> Result | None:
        """An aggregate answered from its aggregate structure over a position range,
        without a scan (Sect. 6); None when the query keeps none or the span is no
        range."""
        kept = self.kept.aggregates.get(plan.slot)
        if kept is None or not span.is_range:
            return None
        return kept.index.answer(*span.bounds())

    def _aggregate(self, plan: SelectionPlan, span: Span, tier: _TierPart,
                   kept: Kept | None = None) -> Result:
        """An aggregate over the matches in `span` (in `kept`, as in `_rows`) after the
        tier's (weighted by their inclusion rates when read from a sample; the copies'
        totals added)."""
        query = plan.query
        aggregator = Aggregator(query)
        needed = list(dict.fromkeys([c for _, c in aggregator.needed] + [TS, TUPLE_ID]))
        got = _fetch((self.kept if kept is None else kept).fetch(plan, span, needed),
                     tier.archived)
        values = {(0, c): got[c] for _, c in aggregator.needed}
        weights = (None if tier.fidelity == EXACT
                   else 1.0 / _inclusion(got, tier.sample, tier.archived))
        if tier.substitute is not None:
            answer = aggregator.with_totals(values, got[TS], tier.substitute.totals, weights)
        else:
            answer = aggregator.compute(values, got[TS], weights)
        answer.fidelity = tier.fidelity
        return answer

    def _in_range(self, plan: SelectionPlan, stem: DataSteM, span: Span,
                  kept: Kept | None = None, departures: int | None = None
                  ) -> tuple[Result, tuple[int, int]]:
        """The rows of a window of memory only that is a position range, and that range
        as tupleIDs; made from the query's last answer where that pays (`_reused`).
        `kept`, `departures`: a snapshot's read (`_read_cut`)."""
        p0, p1 = _held(span, stem)
        # (a window too small for reuse to pay even for an empty answer: read whole)
        query = plan.query
        reusable = (self.recent.enabled and not query.distinct and not query.contradiction
                    and self.recent.worth_reusing(p1 - p0, 0))
        window = (stem.tid_bound(p0), stem.tid_bound(p1))
        kept = self.kept if kept is None else kept
        reused = self._reused(plan, stem, p0, p1, kept, departures) if reusable else None
        if reused is not None:
            return reused, window
        answer = self._rows(plan, stem, span, _IN_MEMORY, kept)
        if reusable:
            self._remember(plan, stem, p0, p1, answer, departures)
        return answer, window

    def _rows(self, plan: SelectionPlan, stem: DataSteM, span: Span, tier: _TierPart,
              kept: Kept | None = None) -> Result:
        """Find the matches in `span` (in `kept`: the mode's structure, or a snapshot
        of it), fetch their columns after the tier's rows, and project: ts and tupleIDs
        taken when first read where nothing needs them now."""
        query = plan.query
        kept = self.kept if kept is None else kept
        if (not self.defer_identity or tier.archived or query.distinct or TS in plan.shown
                or TUPLE_ID in plan.shown):
            got = _fetch(kept.fetch(plan, span, plan.fetched), tier.archived)
            answer = Result.build(query.columns, [got[name] for name in plan.selected],
                                  got[TS], got[TUPLE_ID], query.distinct)
        else:
            got, rest = kept.fetch_deferred(plan, span, plan.shown, _IDENTITY)
            answer = Result.build(query.columns, [got[name] for name in plan.selected],
                                  None, None, False, identity=partial(_identity, rest))
            stem.defer(answer)
        answer.fidelity = tier.fidelity
        return answer

    def _reused(self, plan: SelectionPlan, stem: DataSteM, p0: int, p1: int, kept: Kept,
                departures: int | None) -> Result | None:
        """The answer over positions [p0, p1) made from the query's last one, where the
        window moved forward over it and that is cheaper than reading it whole
        (`RecentAnswers.worth_reusing`): its rows still inside, then the matches
        among the tuples that arrived since. O(log answer) plus a find over the new
        tuples and O(answer) to join them; None when it does not apply."""
        query = plan.query
        recent = self.recent.get(plan.slot, query, stem.origin)
        cut = recent.cut(p0, p1, stem) if recent is not None else None
        if recent is None or cut is None:
            return None
        since = recent.p1
        if cut == 0 and since == p1:        # nothing new: the same read-only columns
            values, ts, tuple_ids = recent.values, recent.ts, recent.tuple_ids
        else:
            copied = (len(recent.tuple_ids) - cut) * (len(recent.values) + 2)
            if not self.recent.worth_reusing(since - p0, copied):
                return None
            new = kept.fetch(plan, Span.range(since, p1), plan.fetched)
            values = {name: _joined(recent.values[name], cut, new[name])
                      for name in plan.shown}
            ts = _joined(recent.ts, cut, new[TS])
            tuple_ids = _joined(recent.tuple_ids, cut, new[TUPLE_ID])
        answer = Result.build(query.columns, [values[name] for name in plan.selected], ts,
                              tuple_ids, False)     # (makes the arrays read-only)
        self._remember(plan, stem, p0, p1, answer, departures, values)
        return answer

    def _remember(self, plan: SelectionPlan, stem: DataSteM, p0: int, p1: int,
                  answer: Result, departures: int | None,
                  values: dict[str, np.ndarray] | None = None) -> None:
        """Keep `answer` (over positions [p0, p1)) for the query's next invocation if
        making that one from it could pay: an answer that is a large part of its window
        is read whole each time (its ts and tupleIDs then stay deferred). One read off
        the lock (`departures` given) keeps it only if no query left since its cut:
        the slot may be another query's by now."""
        if not self.recent.worth_reusing(p1 - p0, len(answer) * (len(plan.shown) + 2)):
            self.recent.forget(plan.slot)
            return
        if values is None:
            assert answer.values is not None
            values = dict(zip(plan.selected, answer.values, strict=True))
        still = None if departures is None else (lambda: departures == self.departures)
        self.recent.put(plan.slot, Recent(plan.query, stem.origin, p0, p1, values, answer.ts,
                                          answer.tuple_ids), still)

    def _read_layer(self, plan: SelectionPlan, reach: Reach,
                    reads: Mapping[str, Limits] | None) -> list[tuple[float, float, float]]:
        """The rates the tier's segments were read at (`reads`), as ts ranges: each
        segment's from its first match to the next segment's (the first one's from
        -inf, the last one's to the first tuple in memory): the tier has no match in
        between; a segment read in parts (several limits) gives a range a part."""
        if not reads:
            return []
        stem = self.stems[plan.query.sources[0].stream]
        segments = self.tiers.meeting(plan.slot, reach)
        horizon = stem.ts_at(stem.horizon) if stem.horizon < stem.n else math.inf
        starts = [-math.inf] + [seg.lo for seg in segments[1:]]
        ends = starts[1:] + [horizon]
        return [(max(start, a), min(end, b), limit / SAMPLE_SPACE)
                for seg, start, end in zip(segments, starts, ends, strict=True)
                for a, b, limit in step_ranges(reads.get(seg.name, ALL))
                if max(start, a) < min(end, b)]

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


#: Where a selection's matches are read: the mode's structure, or a snapshot of it.
Kept = Materialized | SelectionCut


class _TierPart(NamedTuple):
    """What an archive tier adds to a selection's answer at some NOW."""

    archived: dict[str, np.ndarray] | None      # its matches in the window, oldest first
    substitute: Substitute | None               # what the aggregate copies answer
    sample: Sampled | None                      # the sample it was built from
    fidelity: tuple[tuple[float, float, float], ...]

    @property
    def empty(self) -> bool:
        """Nothing from the archive: the answer is the matches in memory, exactly."""
        return not self.archived and self.substitute is None and self.fidelity == EXACT


#: The tier part of a query without a tier.
_IN_MEMORY = _TierPart(None, None, None, EXACT)


def _sample_layer(sample: Sampled | None) -> list[tuple[float, float, float]]:
    """A tier's sample (psoup.archive.tiers.Sampled) as ts ranges and rates: its steps,
    up to where it ends."""
    if sample is None:
        return []
    return [(a, min(b, sample.until), rate) for a, b, rate in step_ranges(sample.steps)
            if a < min(b, sample.until)]


def _fidelity(reach: tuple[float, float] | None,
              layers: list[tuple[float, float, float]]
              ) -> tuple[tuple[float, float, float], ...]:
    """Result.fidelity of an answer over the ts range `reach` of its window (None: the
    window counts tuples in memory only) when `layers` give the rates the archived
    part was read at, as (from, to, rate) ranges (rate 1 outside them): each range of
    the window with the lowest rate there, neighbours of one rate merged; EXACT when
    every rate is 1. O(layers log layers)."""
    if reach is None or reach[0] > reach[1] or all(r == 1.0 for _, _, r in layers):
        return EXACT
    begin, end = reach
    cuts = sorted({begin, end} | {x for a, b, _ in layers for x in (a, b) if begin < x < end})
    out: list[tuple[float, float, float]] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        rate = min([r for lo, hi, r in layers if lo <= a and b <= hi] + [1.0])
        if out and out[-1][2] == rate:
            out[-1] = (out[-1][0], b, rate)
        else:
            out.append((a, b, rate))
    if all(rate == 1.0 for _, _, rate in out):
        return EXACT
    return tuple(out)


def _inclusion(got: Mapping[str, np.ndarray], sample: Sampled | None,
               archived: Mapping[str, np.ndarray] | None) -> np.ndarray:
    """Each answer row's probability of having been read: for the archived rows (they
    come first in `got`), the tier's sample rate below its end (the tuples it was
    built from) and the rate its part of its segment was read at (READ_RATE),
    whichever is lower (the draws are the same, so the samples nest); 1 for the rows
    from memory."""
    n = len(got[TS])
    rate = np.ones(n)
    k = 0 if not archived else len(archived[TS])
    if sample is not None and k:
        ids, ts = got[TUPLE_ID][:k], got[TS][:k]
        rate[:k] = np.where(ids < sample.below, sample.rates(ts), 1.0)
    if archived and READ_RATE in archived:
        rate[:k] = np.minimum(rate[:k], archived[READ_RATE])
    return rate


#: The columns identifying an answer's rows, taken when first read (`Result.identity`).
_IDENTITY = (TS, TUPLE_ID)


def _identity(rest: Callable[[], dict[str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    got = rest()
    return got[TS], got[TUPLE_ID]


def _held(span: Span, stem: DataSteM) -> tuple[int, int]:
    """The positions [p0, p1) of a range span that `stem` holds (retained ones)."""
    lo, hi = span.bounds()
    p0 = min(max(lo, stem.horizon), stem.n)
    return p0, max(p0, min(hi, stem.n))


def _joined(old: np.ndarray, cut: int, new: np.ndarray) -> np.ndarray:
    """old[cut:] then new, as one new array."""
    return np.concatenate((old[cut:], new)) if len(new) or cut else old


def _fetch(got: dict[str, np.ndarray], archived: Mapping[str, np.ndarray] | None
           ) -> dict[str, np.ndarray]:
    """The columns of the matches in memory (`got`), after the archived matches (older)."""
    if archived:
        got = {name: np.concatenate([archived[name], got[name]]) for name in got}
    return got


def answer_from_batches(plan: SelectionPlan, handle: str, store: BatchStore,
                        now: float) -> Result:
    """The answer at `now` of `handle`, a selection query over a stream probed in
    Spark's executors: its matches in the committed batches its window's reach
    meets (psoup.archive.batches), projected or aggregated (an aggregate without
    GROUP BY from the totals of the part files wholly in the window, and the rows
    of the others). Reads no engine state but the plan, so it runs off the lock.
    O(rows of the batches read).

    Raises:
        HistoryPending: a batch the window meets lacks the query yet.
    """
    query = plan.query
    reach = archive_reach(query.sources[0].window, now)
    assert reach is not None, "a window counting tuples is refused on such a stream"
    if query.aggregated:
        aggregator = Aggregator(query)
        names = [c for _, c in aggregator.needed]
        if query.group_by:
            got, totals = store.part(handle, reach, names), None
        else:                   # the part files wholly in the window: their totals
            got, totals = store.summarized(handle, reach, names)
        values = {(0, c): got[c] for c in names}
        answer = (aggregator.compute(values, got[TS], None) if totals is None
                  else aggregator.with_totals(values, got[TS], totals))
        return answer.distinct() if query.distinct else answer
    got = store.part(handle, reach, plan.fetched)
    return Result.build(query.columns, [got[name] for name in plan.selected], got[TS],
                        got[TUPLE_ID], query.distinct)
