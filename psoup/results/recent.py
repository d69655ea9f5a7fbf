"""The last answer of each selection query, so that its next invocation reads only what
changed (the query stream's polls made incremental).

A selection query's answer over a position range [p0, p1) is its matches there, and a
match never changes once its tuple is in: positions are handed out in arrival order and
never reused, tuples are never updated, and a query's bits in the Results Structure are
written once (at its registration for the tuples then retained, at insert for the rest).
So when a window moves forward from [p0, p1) to [q0, q1) with p0 <= q0 <= p1 <= q1, the
new answer is the old one without its rows below q0 (found by one binary search over its
tupleIDs, which grow with position) followed by the matches in [p1, q1): a find over the
tuples that arrived since, not over the window. A client polling a standing query every
few seconds over the last ten minutes then pays for a few seconds of tuples per poll;
polled again with nothing new, the answer is the last one's columns, shared (they are
read-only).

Reusing costs a copy of the rows kept, from memory gone cold since, where reading the
window again costs a find over it: an answer is kept only when its window is large
compared with it (`RecentAnswers.worth_reusing`, from measured costs), and made from the
last one only when that still holds for the rows that moved. Polls of windows of a few
thousand tuples are read whole, as before.

Only selection queries without aggregates (those have their own structures, Sect. 6),
DISTINCT or history, over position-range windows, are kept; each entry is checked
against the query and the Data SteM it was read from, so a slot reused by another
query, or a stream dropped and created again, never meets an old answer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from psoup.query.model import Query
from psoup.stems.data_stem import DataSteM

#: When reusing pays (measured on a 2-core Xeon, 64 handles polled in turn after each
#: batch): the find of a window hot in the cache scans about 3 rows per nanosecond, while
#: the rows kept from the last answer are copied from memory that is cold by then (the
#: window's columns, shared by every query, stay in the cache; each handle's answer does
#: not), about 1 ns per value, after a fixed cost of some 20 us (the find over the new
#: tuples, the old answer's tupleIDs searched, a concatenation per column). So only a
#: window of more than about 60,000 tuples is worth an answer kept: over 32K-row windows
#: slid by 1,000 tuples, reusing answers of 150 to 15,000 rows took 1.1-1.4x as long as
#: reading the window again; over 200K rows slid by about 10,000 with 750 rows per
#: answer, 0.3x.
SKIP_ROWS_PER_NS = 3.0
FIXED_NS = 20_000


class Recent(NamedTuple):
    """One query's last answer: its matches in positions [p0, p1) of `stem`, as the
    columns it shows (by name), their ts and their tupleIDs (all read-only)."""

    query: Query
    stem: DataSteM
    p0: int
    p1: int
    values: dict[str, np.ndarray]
    ts: np.ndarray
    tuple_ids: np.ndarray

    @property
    def nbytes(self) -> int:
        return (sum(v.nbytes for v in self.values.values()) + self.ts.nbytes
                + self.tuple_ids.nbytes)

    def cut(self, q0: int, q1: int, stem: DataSteM | None = None) -> int | None:
        """For a window now at [q0, q1): how many leading rows of this answer left it
        (the new matches start at p1), or None when this answer is no part of the new
        one (the window moved back, or past it entirely). O(log answer). `stem`: the
        Data SteM (or snapshot of it, `DataSteM.snapshot`) the window was resolved in;
        by default this answer's."""
        if not self.p0 <= q0 <= self.p1 <= q1:
            return None
        if q0 == self.p0:
            return 0
        first = (self.stem if stem is None else stem).tid_bound(q0)
        return int(self.tuple_ids.searchsorted(first))


class RecentAnswers:
    """slot -> its query's last answer (`Recent`), most recently used last, within a
    byte budget: putting one past it drops the least recently used first, and an answer
    larger than the whole budget is not kept. A budget of 0 keeps nothing.

    Invocations reading off the engine's lock (psoup.results.reads) use it from their
    threads: a lock of its own guards every change.

    Costs: `get`, `forget` O(1); `put` O(1) plus O(1) per entry dropped; memory at most
    `budget` bytes of answers (shared with the Results handed out while both live).

    Attributes:
        skip_rows_per_ns, fixed_ns: the cost model of `worth_reusing` (SKIP_ROWS_PER_NS
            and FIXED_NS; tests make reuse always pay to reach it with small windows).

    Example:
        >>> kept = RecentAnswers(budget=64 << 20)
        >>> kept.worth_reusing(190_000, 3_000), kept.worth_reusing(31_000, 600)
        (True, False)
    """

    def __init__(self, budget: int):
        self.budget = budget
        # each with its size (Recent.nbytes sums its arrays: asked once, not per change)
        self._kept: OrderedDict[int, tuple[Recent, int]] = OrderedDict()
        self.nbytes = 0
        self.skip_rows_per_ns = SKIP_ROWS_PER_NS
        self.fixed_ns = FIXED_NS
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def worth_reusing(self, skipped_rows: int, copied_values: int) -> bool:
        """Whether an answer made from the last one (copying `copied_values` values of
        its kept rows) beats reading the window again (scanning `skipped_rows` more
        rows)."""
        return skipped_rows / self.skip_rows_per_ns > self.fixed_ns + copied_values

    def get(self, slot: int, query: Query, stem: DataSteM) -> Recent | None:
        """The last answer kept for `slot`, if it was `query`'s over `stem`."""
        with self._lock:
            kept = self._kept.get(slot)
            if kept is None or kept[0].query is not query or kept[0].stem is not stem:
                return None
            self._kept.move_to_end(slot)
            return kept[0]

    def put(self, slot: int, recent: Recent, still: Callable[[], bool] | None = None
            ) -> None:
        """Keep `recent` as `slot`'s last answer (replacing the one before); given
        `still`, only if it holds (checked under the cache's lock, which `forget` takes:
        a slot's query that leaves after the check has it forgotten)."""
        with self._lock:
            if still is None or still():
                self._put(slot, recent)

    def _put(self, slot: int, recent: Recent) -> None:
        self._forget(slot)
        size = recent.nbytes
        if size > self.budget:
            return
        while self._kept and self.nbytes + size > self.budget:
            _, (_, old) = self._kept.popitem(last=False)
            self.nbytes -= old
        self._kept[slot] = (recent, size)
        self.nbytes += size

    def forget(self, slot: int) -> None:
        """Drop `slot`'s answer (its query left; the slot may be reused)."""
        with self._lock:
            self._forget(slot)

    def _forget(self, slot: int) -> None:
        old = self._kept.pop(slot, None)
        if old is not None:
            self.nbytes -= old[1]

    def slots(self) -> list[int]:
        return list(self._kept)

    def _check(self, queries: dict[int, Query]) -> None:
        """Assert the invariants (for tests); `queries`: the standing selection queries
        by slot."""
        assert self.nbytes == sum(r.nbytes for r, _ in self._kept.values()) <= max(self.budget, 0)
        for slot, (recent, size) in self._kept.items():
            assert size == recent.nbytes, ("a size kept wrong", slot)
            assert queries.get(slot) is recent.query, ("an answer of a query gone", slot)
            assert 0 <= recent.p0 <= recent.p1 <= recent.stem.n
            n = len(recent.tuple_ids)
            assert len(recent.ts) == n and all(len(v) == n for v in recent.values.values())
            assert (np.diff(recent.tuple_ids) > 0).all(), "rows in tupleID order"
            for array in (recent.ts, recent.tuple_ids, *recent.values.values()):
                assert not array.flags.writeable, "shared with answers handed out"
