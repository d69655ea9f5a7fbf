"""An invocation from start to answer, its find and fetch off the engine's lock.

An invocation of a selection query without history (nor aggregates, but in NoMat, which
has no aggregate structure), without `since`, holds the lock for a short step only: its
plan and NOW, its window resolved, and a cut, the query's matches and its stream's
tuples as they are now (`Answers.snapshot`). Its find and fetch then run off the lock,
on the caller's thread, beside the writer and other readers, and see exactly what was
committed before the cut: writers append past it and replace, never change in place,
what a cut holds (psoup.stems.data_stem, psoup.results.partial). Should a query leave
meanwhile (`Answers.departures`), its slot may have been cleared and taken under the
read: the answer is thrown away and the invocation begins again (it raises
UnknownHandle if it was its own query), once more off the lock, then under it.

Every other invocation is one step under the lock: resolve the window, find the
matches, fetch their columns (psoup.results.answers). A query with history whose
window reaches into its archive tier needs segment files that are not in the tier's
cache; those are read here between two holds of the lock, so that writers and other
readers are not held up by the disk (segment files never change once written):

1. under the lock: how to read the tier (whole, or sampled at the rates the archive
   policy gives, `_sampled_reads`) and which segment files are not cached;
2. off the lock: read them (`load_segments`), measuring the read rate;
3. under the lock again: put them in the cache and answer (a file missed meanwhile is
   read there).

The rates learnt in step 2 feed a Budget policy's next decision. The answer then gets
its cursor, or is turned into the changes since a cursor (psoup.results.cursors).

Every answer also says how fresh it is (`Result.fresh_to`), taken in the hold of the
lock its answer is read in (or cut in): for a query over streams fed by a Spark source
(psoup.spark.live), the least of their latest ts. A source's rows are applied under
the lock, and none later can have a smaller ts (late rows are raised to the latest),
so the answer holds every tuple those streams will ever have below it. A lookup per
invocation: the fed streams of each plan are found once (`Reads.fresh_to`).

A query over a stream probed in Spark's executors (psoup.archive.batches) holds nothing
in memory: under the lock only its plan and NOW are taken; its matches are read from
the stream's committed batches off the lock (`Reads.live`), and its freshness is the
latest ts committed there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from psoup.archive.policy import (
    DEFAULT_TIER_ROWS_PER_SECOND,
    WHOLE,
    ArchiveRead,
    Exact,
    Policy,
    ask,
    step_ranges,
)
from psoup.archive.rates import SAMPLE_SPACE, threshold
from psoup.archive.tiers import ArchiveTiers, Limits, Segment, load_segments
from psoup.locks import FairLock
from psoup.plans import Plan, SelectionPlan
from psoup.query.model import ColumnType
from psoup.results.answers import answer_from_batches
from psoup.results.windows_table import archive_reach

if TYPE_CHECKING:
    from psoup.archive.batches import BatchStore
    from psoup.results.answers import Answers
    from psoup.results.cursors import CursorStore
    from psoup.results.result import Changes, Result
    from psoup.stems.data_stem import DataSteM

T = TypeVar("T")

#: How many times an invocation reads off the lock before it reads under it, each
#: thrown away when a query left meanwhile (`Reads._read_off_lock`).
_OFF_LOCK_TRIES = 2
_AGAIN = object()
_LOCKED = object()

#: What `Reads.read`'s caller gets under the lock before a read: the plan and NOW.
Begin = Callable[[], "tuple[Plan, float]"]
#: What it does with the answer, still under the lock (after it, for one read off the
#: lock): the plan, the answer, its window.
Finish = Callable[["Plan", "Result", "tuple[int, int] | None"], T]

Wanted = list[tuple[Segment, dict[str, ColumnType], Limits]]


class Reads:
    """The invocations of one engine (see the module docstring).

    Args:
        lock: the engine's lock.
        answers: the engine's answers (psoup.results.answers).
        tiers: the engine's archive tiers.
        policy: how much of a tier an invocation reads (psoup.archive.policy).
        cursors: the engine's cursor store.
        registered: whether a handle is still registered (its cursors are kept).

    Costs: O(segments the window meets) to plan a read, plus the answer's cost; the
    files not cached are read off the lock.
    """

    def __init__(self, lock: FairLock, answers: Answers, tiers: ArchiveTiers,
                 policy: Policy, cursors: CursorStore, registered: Callable[[str], bool]):
        self._lock, self.answers, self.tiers, self.policy = lock, answers, tiers, policy
        self._cursors, self._registered = cursors, registered
        self.rate = DEFAULT_TIER_ROWS_PER_SECOND     # measured by reads of tier files
        self._rates: dict[Plan, float] = {}          # a query's last tier read rate
        self._fed: dict[Plan, tuple[DataSteM, ...]] = {}    # `fresh_to`'s streams
        #: The batch store of a stream probed in the executors (None for the others).
        self.live: Callable[[str], BatchStore | None] = lambda stream: None

    def invoke(self, handle: str, begin: Begin, since: str | None) -> Result | Changes:
        """`handle`'s answer at the (plan, NOW) `begin` gives under the lock, with its
        cursor; or, given `since`, the changes from that cursor's answer to this one
        (under the lock: the cursor store is engine state)."""
        finish = partial(self._answered, handle, since)
        if since is None:
            for _ in range(_OFF_LOCK_TRIES):
                done = self._read_off_lock(handle, begin, finish)
                if done is _LOCKED:
                    break
                if done is not _AGAIN:
                    return cast("Result | Changes", done)
        return self.read(begin, finish, handle)

    def _live_read(self, handle: str, plan: Plan, at: float
                   ) -> Callable[[], tuple[Result, None]] | None:
        """Under the lock: for a query over a stream probed in the executors, its
        answer to read off the lock (`answer_from_batches`); None for the others."""
        if not isinstance(plan, SelectionPlan):
            return None
        store = self.live(plan.query.sources[0].stream)
        if store is None:
            return None
        return lambda: (answer_from_batches(plan, handle, store, at), None)

    def _read_off_lock(self, handle: str, begin: Begin, finish: Finish[T]) -> T | object:
        """`read`, the find and fetch off the lock where the query allows (see the
        module docstring); `_AGAIN` when a query left during the read, `_LOCKED` for a
        query with history (`read` reads its tier's files off the lock)."""
        with self._lock:
            plan, at = begin()
            off = self._live_read(handle, plan, at) or self.answers.snapshot(plan, at)
            if off is None:
                if isinstance(plan, SelectionPlan) and plan.slot in self.tiers:
                    return _LOCKED
                answer, window = self.answers.answer_and_window(plan, at)
                answer.fresh_to = self.fresh_to(plan)
                return finish(plan, answer, window)
            departures = self.answers.departures
            fresh = self.fresh_to(plan)             # as of the cut
        answer, window = off()
        if self.answers.departures != departures:
            return _AGAIN
        answer.fresh_to = fresh
        return finish(plan, answer, window)

    def _answered(self, handle: str, since: str | None, plan: Plan, answer: Result,
                  window: tuple[int, int] | None) -> Result | Changes:
        """An invocation's answer: with its cursor (made later, under the lock), or as
        changes (under the lock)."""
        if since is not None:
            return self._cursors.changes(handle, plan, since, answer, window)
        # made when first read (Result.defer_cursor): an invocation whose caller never
        # polls with since does not pay for it
        answer.defer_cursor(partial(self._issue_cursor, handle, window))
        return answer

    def _issue_cursor(self, handle: str, window: tuple[int, int] | None,
                      answer: Result) -> None:
        """Set the cursor of an answer `invoke` returned (on its first read), under the
        lock: the cursor store is engine state. Its content depends only on the answer,
        the window it came from and the engine's secret, so it is the cursor `invoke`
        would have issued at once, even after the engine closed (a range cursor is valid
        for the reopened engine). O(answer) the first time, O(1) after."""
        with self._lock:
            if not answer.cursor_issued:
                self._cursors.issue(handle, answer, window,
                                    remember=self._registered(handle))

    def read(self, begin: Begin, finish: Finish[T], handle: str | None = None) -> T:
        """`finish(plan, answer, window)` of the answer at the (plan, NOW) `begin` gives,
        each called under the lock; the tier's files it needs are read off it (and a
        query over a stream probed in the executors, `handle`'s, off it whole)."""
        loaded: dict[str, dict[str, np.ndarray]] | None = None
        reads: dict[str, Limits] | None = None
        measured = 0.0
        while True:
            with self._lock:
                plan, at = begin()
                live = None if handle is None else self._live_read(handle, plan, at)
                if live is not None:
                    fresh = self.fresh_to(plan)
                else:
                    if loaded is None:
                        reads = self._sampled_reads(plan, at)
                        wanted = self._unread(plan, at, reads)
                    else:
                        self.tiers.prime(loaded)
                        wanted = []
                        if measured:
                            self.rate = 0.5 * self.rate + 0.5 * measured
                    if not wanted:
                        answer, window = self.answers.answer_and_window(plan, at, reads)
                        answer.fresh_to = self.fresh_to(plan)
                        return finish(plan, answer, window)
                    folder = self.tiers.folder
            if live is not None:
                answer, _ = live()
                answer.fresh_to = fresh
                with self._lock:
                    return finish(plan, answer, None)
            assert folder is not None
            began = time.perf_counter()
            loaded = load_segments(folder, wanted)
            rows = sum(len(got["tupleID"]) for got in loaded.values())
            if rows:
                measured = rows / max(time.perf_counter() - began, 1e-4)

    def stats(self, handles: Mapping[str, Plan]) -> dict[str, Any]:
        """The tier read rate and each query's last (stats()["archive_reads"])."""
        return {"tier_rows_per_second": self.rate,
                "tier_reads": {h: self._rates[p] for h, p in handles.items()
                               if p in self._rates}}

    def _sampled_reads(self, plan: Plan, at: float) -> dict[str, Limits] | None:
        """How to read `plan`'s tier for an answer at `at` (`read_plan`), and its rate
        remembered for stats; None under the Exact policy."""
        if isinstance(self.policy, Exact):
            return None
        reads = self.read_plan(plan, at)
        self._rates[plan] = 1.0 if not reads else min(
            limit for limits in reads.values() for _, limit in limits) / SAMPLE_SPACE
        return reads

    def forget(self, plan: Plan) -> None:
        """A query leaves (called before anything of it changes)."""
        self.answers.depart()
        self._rates.pop(plan, None)
        self._fed.pop(plan, None)

    def fresh_to(self, plan: Plan) -> float | None:
        """Under the lock: `Result.fresh_to` of an answer of `plan` read now, the least
        latest ts of the streams fed by a Spark source it reads (-inf while one has no
        tuple); None when it reads none. O(1): a plan's fed streams are found on its
        first invocation (a stream is dropped only after the queries reading it).

        Example:
            >>> from psoup import Engine
            >>> eng = Engine()
            >>> eng.execute("CREATE STREAM R (a INT)")
            >>> eng.invoke(eng.register("SELECT a FROM R")).fresh_to is None
            True
        """
        fed = self._fed.get(plan)
        if fed is None:
            stems = self.answers.stems
            fed = self._fed[plan] = tuple(stems[s.stream] for s in plan.query.sources
                                          if stems[s.stream].schema.source is not None)
        if not fed:
            return None
        return min(self._latest(stem) for stem in fed) if len(fed) > 1 \
            else self._latest(fed[0])

    def _latest(self, stem: DataSteM) -> float:
        """A fed stream's latest ts: in memory, or committed in its batch store."""
        store = self.live(stem.schema.name)
        if store is None:
            return stem.last_ts
        latest = store.latest_ts
        return -math.inf if latest is None else latest

    def read_plan(self, plan: Plan, now: float) -> dict[str, Limits] | None:
        """How to read the archive tier of `plan` for an answer at `now`: None to read
        its segments whole, or segment name -> the draw limits of a sampled read, the
        policy's steps over its ts range (a segment across a step's boundary read in
        parts, each at its own rate: `segment_limits`), asked about the segments
        the aggregate copies do not answer and the cache does not hold (ArchiveRead:
        their matches, bytes and ts range, at the measured rate). O(segments) (a stat a
        segment not in the cache).

        Raises:
            PSoupError: the policy failed or gave a schedule that is not one.
        """
        if not isinstance(plan, SelectionPlan) or plan.slot not in self.tiers:
            return None
        source = plan.query.sources[0]
        segments = self.tiers.meeting(plan.slot, archive_reach(source.window, now),
                                      self.answers.substitute(plan, now))
        unread = [seg for seg in segments if not self.tiers.cached(seg.name)]
        if not unread:
            return None
        folder = self.tiers.folder
        size = sum((folder / seg.name).stat().st_size for seg in unread
                   if folder is not None and (folder / seg.name).is_file())
        read = ArchiveRead(source.stream, sum(seg.rows for seg in unread), size,
                           min(seg.lo for seg in unread), max(seg.hi for seg in unread),
                           now, self.rate)
        steps = ask(self.policy, read)
        if steps == WHOLE:
            return None
        ranges = step_ranges(steps)
        return {seg.name: segment_limits(ranges, seg.lo, seg.hi) for seg in segments}

    def _unread(self, plan: Plan, now: float, reads: Mapping[str, Limits] | None
                ) -> Wanted:
        """The tier's segment files an answer of `plan` at `now` would read (none in
        the cache), those in `reads` as samples: ArchiveTiers.unread. O(segments)."""
        if not isinstance(plan, SelectionPlan) or plan.slot not in self.tiers:
            return []
        return self.tiers.unread(plan.slot, archive_reach(plan.query.sources[0].window, now),
                                 reads, self.answers.substitute(plan, now))



def segment_limits(ranges: list[tuple[float, float, float]], lo: float, hi: float
                   ) -> Limits:
    """The draw limits of a read of a segment whose matches' ts are in [lo, hi] at the
    rates of `ranges` (a schedule's `step_ranges`): the steps that meet [lo, hi], the
    first from -inf, neighbours of one limit merged. O(steps).

    Example:
        >>> segment_limits([(-math.inf, 100.0, 0.25), (100.0, math.inf, 1.0)], 0.0, 50.0)
        ((-inf, 256),)
        >>> segment_limits([(-math.inf, 100.0, 0.25), (100.0, math.inf, 1.0)], 0.0, 150.0)
        ((-inf, 256), (100.0, 1024))
    """
    out: list[tuple[float, int]] = []
    for a, b, rate in ranges:
        if a <= hi and lo < b:
            limit = threshold(rate)
            if not out:
                out.append((-math.inf, limit))
            elif out[-1][1] != limit:
                out.append((a, limit))
    return tuple(out)
