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

Only selection queries without aggregates (those have their own structures, Sect. 6),
DISTINCT or history, over position-range windows, are kept; each entry is checked
against the query and the Data SteM it was read from, so a slot reused by another
query, or a stream dropped and created again, never meets an old answer.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from psoup.query.model import Query
from psoup.stems.data_stem import DataSteM


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

    def moved(self, q0: int, q1: int) -> tuple[int, int] | None:
        """For a window now at [q0, q1): (how many leading rows left it, the position
        the new matches start at), or None when the old answer is no part of the new
        one (the window moved back, or past it entirely). O(log answer)."""
        if not self.p0 <= q0 <= self.p1 <= q1:
            return None
        if q0 == self.p0:
            return 0, self.p1
        first = self.stem.tid_bound(q0)
        return int(np.searchsorted(self.tuple_ids, first, side="left")), self.p1


class RecentAnswers:
    """slot -> its query's last answer (`Recent`), most recently used last, within a
    byte budget: putting one past it drops the least recently used first, and an answer
    larger than the whole budget is not kept. A budget of 0 keeps nothing.

    Costs: `get`, `forget` O(1); `put` O(1) plus O(1) per entry dropped; memory at most
    `budget` bytes of answers (shared with the Results handed out while both live).

    Example:
        >>> kept = RecentAnswers(budget=0)
        >>> kept.enabled
        False
    """

    def __init__(self, budget: int):
        self.budget = budget
        self._kept: OrderedDict[int, Recent] = OrderedDict()
        self.nbytes = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def get(self, slot: int, query: Query, stem: DataSteM) -> Recent | None:
        """The last answer kept for `slot`, if it was `query`'s over `stem`."""
        recent = self._kept.get(slot)
        if recent is None or recent.query is not query or recent.stem is not stem:
            return None
        self._kept.move_to_end(slot)
        return recent

    def put(self, slot: int, recent: Recent) -> None:
        """Keep `recent` as `slot`'s last answer (replacing the one before)."""
        self.forget(slot)
        size = recent.nbytes
        if size > self.budget:
            return
        while self._kept and self.nbytes + size > self.budget:
            _, old = self._kept.popitem(last=False)
            self.nbytes -= old.nbytes
        self._kept[slot] = recent
        self.nbytes += size

    def forget(self, slot: int) -> None:
        """Drop `slot`'s answer (its query left; the slot may be reused)."""
        old = self._kept.pop(slot, None)
        if old is not None:
            self.nbytes -= old.nbytes

    def slots(self) -> list[int]:
        return list(self._kept)

    def _check(self, queries: dict[int, Query]) -> None:
        """Assert the invariants (for tests); `queries`: the standing selection queries
        by slot."""
        assert self.nbytes == sum(r.nbytes for r in self._kept.values()) <= max(self.budget, 0)
        for slot, recent in self._kept.items():
            assert queries.get(slot) is recent.query, ("an answer of a query gone", slot)
            assert 0 <= recent.p0 <= recent.p1 <= recent.stem.n
            n = len(recent.tuple_ids)
            assert len(recent.ts) == n and all(len(v) == n for v in recent.values.values())
            assert (np.diff(recent.tuple_ids) > 0).all(), "rows in tupleID order"
            for array in (recent.ts, recent.tuple_ids, *recent.values.values()):
                assert not array.flags.writeable, "shared with answers handed out"
