"""`since` cursors: what a disconnected client saw last, so its next poll gets only the
changes (the STREAM paper's Istream and Dstream of a query's answer).

An invocation's answer is remembered under a fresh cursor (a random prefix drawn once
per store, so cursors from before a restart never match, and a counter); invoking with
`since=cursor` compares the new answer with the remembered one. Each row has an
identity, and the changes are the multiset difference of the two answers' identities:

* a selection row is its tupleID, a join row the tupleIDs of its tuples, so two equal
  rows from different tuples are different rows (bag semantics);
* an aggregated row is its group key (`Result.keys`) with its values, so a group whose
  values changed is deleted (old row) and inserted (new row), and two groups showing
  equal rows (GROUP BY columns not selected) stay two rows;
* a DISTINCT answer is a set, so its rows are their values, and a row whose first
  occurrence expired while a later duplicate remains has not changed.

Applying a poll's `deleted` and then its `inserted` rows to the previous answer, as
multisets, gives the new answer.

Identities that are numbers (tupleIDs, and the rows of a DISTINCT answer over numeric
columns) are compared as numpy columns (`row_codes`), so a poll builds no Python tuple
for them; group keys and text rows are compared as tuples.

Cursors live in memory: each handle keeps its `per_handle` most recently used ones, so a
retried poll (the reply was lost) and a few concurrent pollers of one handle all work.
A cursor older than that, or issued before a restart, raises CursorExpired.
"""

from __future__ import annotations

import secrets
from collections import Counter, OrderedDict

import numpy as np

from psoup.errors import CursorExpired
from psoup.results.result import Changes, Result, row_codes


class CursorStore:
    """Remembered answers by (handle, cursor).

    Example:
        >>> store = CursorStore()
        >>> old = Result(["a"], [(1,), (2,)], np.array([1.0, 2.0]), np.array([10, 11]))
        >>> c = store.issue("h", old)
        >>> new = Result(["a"], [(2,), (3,)], np.array([2.0, 3.0]), np.array([11, 12]))
        >>> ch = store.changes("h", c, new, distinct=False)
        >>> ch.inserted.rows, ch.deleted.rows
        ([(3,)], [(1,)])
    """

    def __init__(self, per_handle: int = 8):
        self.per_handle = per_handle
        self._by_handle: dict[str, OrderedDict[str, Result]] = {}
        self._prefix = secrets.token_urlsafe(9)
        self._issued = 0

    def issue(self, handle: str, answer: Result) -> str:
        """Remember `answer` under a new cursor, set it on the answer and return it. O(1)."""
        self._issued += 1
        cursor = f"{self._prefix}{self._issued:x}"
        kept = self._by_handle.setdefault(handle, OrderedDict())
        kept[cursor] = answer
        while len(kept) > self.per_handle:
            kept.popitem(last=False)
        answer.cursor = cursor
        return cursor

    def changes(self, handle: str, since: str, answer: Result, distinct: bool) -> Changes:
        """The difference from the answer remembered under `since` to `answer`; `answer`
        is remembered under a new cursor. O(n log n) in the two answers' sizes.

        Raises:
            CursorExpired: `since` is unknown for this handle.
        """
        kept = self._by_handle.get(handle)
        old = kept.get(since) if kept is not None and isinstance(since, str) else None
        if kept is None or old is None:
            raise CursorExpired(f"cursor {str(since)[:16]!r} is unknown or expired for this "
                                "handle (cursors do not survive a restart, and each handle "
                                f"keeps its last {self.per_handle}); invoke without since "
                                "to get the whole answer and a new cursor")
        kept.move_to_end(since)
        if distinct:
            entered, left = _differ_columns(answer.values, old.values) or _differ(
                answer.rows, old.rows)
        elif answer.keys is not None:            # an aggregated answer: by group and row
            entered, left = _differ(list(zip(answer.keys, answer.rows)),
                                    list(zip(old.keys or [], old.rows)))
        elif answer.tuple_ids.ndim == 2:         # a join: one tupleID per FROM item
            differed = _differ_columns(list(answer.tuple_ids.T), list(old.tuple_ids.T))
            assert differed is not None, "tupleIDs are int64 columns"
            entered, left = differed
        else:                                    # tupleIDs are unique in an answer
            entered = ~np.isin(answer.tuple_ids, old.tuple_ids)
            left = ~np.isin(old.tuple_ids, answer.tuple_ids)
        cursor = self.issue(handle, answer)
        return Changes(answer.columns, answer.take(entered), old.take(left), cursor)

    def forget(self, handle: str) -> None:
        """Drop every cursor of an unregistered handle. O(1)."""
        self._by_handle.pop(handle, None)


def _differ(new: list, old: list) -> tuple[np.ndarray, np.ndarray]:
    """The multiset difference of two lists of row identities, as masks: of the rows of
    `new` beyond their identity's count in `old` (the last ones of each identity), and of
    the rows of `old` beyond its count in `new`. O(n + m).

    Example:
        >>> [m.tolist() for m in _differ(["a", "b", "a"], ["a", "c"])]
        [[False, True, True], [False, True]]
    """
    def beyond(rows: list, other: list) -> np.ndarray:
        budget = Counter(other)
        mask = np.empty(len(rows), dtype=bool)
        for i, key in enumerate(rows):
            left = budget[key]
            mask[i] = not left
            budget[key] = left - 1 if left else 0
        return mask
    return beyond(new, old), beyond(old, new)


def _differ_columns(new: list[np.ndarray] | None,
                    old: list[np.ndarray] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """`_differ` for identities that are rows of numeric columns, without a Python object
    per row; None when either side has a column that is not numeric. O((n + m) log(n + m)).

    Example:
        >>> [m.tolist() for m in _differ_columns([np.array([1, 2, 1])], [np.array([1, 3])])]
        [[False, True, True], [False, True]]
    """
    if new is None or old is None or len(new) != len(old) or any(
            a.dtype != b.dtype for a, b in zip(new, old)):
        return None
    grouped = row_codes([np.concatenate([a, b]) for a, b in zip(new, old)])
    if grouped is None:
        return None
    first, codes = grouped
    n = len(new[0]) if new else 0
    return _beyond(codes[:n], codes[n:], len(first)), _beyond(codes[n:], codes[:n], len(first))


def _beyond(rows: np.ndarray, other: np.ndarray, ncodes: int) -> np.ndarray:
    """The rows (codes) beyond their code's count in `other`: the k-th occurrence of a code
    (from 0, in row order) is beyond when k >= its count in `other`, as in `_differ`."""
    budget = np.bincount(other, minlength=ncodes)
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    rank = np.arange(len(rows)) - np.searchsorted(ordered, ordered, side="left")
    mask = np.empty(len(rows), dtype=bool)
    mask[order] = rank >= budget[ordered]
    return mask
