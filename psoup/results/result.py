"""The answer of one invocation: projected, optionally DISTINCT rows (PSoup Sect. 3.3).

Projection and duplicate elimination happen here, just in time, on the tuples fetched
from the Data SteMs; rows are in physicalID (ts) order, then tupleID.

An answer keeps the numpy columns it was projected from: `to_numpy()`, `to_arrow()` and
`to_pandas()` hand them over without building a Python object per value, and `rows`
(tuples of Python scalars) is built on first use, O(rows x columns), then kept. DISTINCT
over numeric columns is a sort of the columns (`row_codes`), not a dict of tuples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

#: The fidelity of an exact answer: the whole time line read at rate 1.
EXACT = ((-math.inf, math.inf, 1.0),)


class Result:
    """Rows of one invocation.

    Attributes:
        columns: the output column names.
        rows: one tuple per result row, values as Python scalars.
        values: the output columns as numpy arrays (None for an answer made of rows).
        ts: one timestamp per row (numpy float64).
        tuple_ids: the tupleID of each row (numpy int64). An invocation's answer may
            take these two from the stream when first read (`identity`), not with its
            columns: an answer read only through its columns never copies them.
        cursor: pass it as `since` to the next invocation to get only what changed
            (None when the Result was not produced by an invocation). An invocation's
            cursor is made on first use (`defer_cursor`): O(answer) then, nothing for a
            caller that never reads it.
        keys: for an aggregated answer, each row's group key (the values of its GROUP BY
            columns, `()` without GROUP BY): what identifies a row from one answer to the
            next, since two groups may show equal rows; None otherwise.
        fidelity: the sample rate that answered each time range, as (begin ts, end ts,
            rate) in time order: `EXACT` (everything at rate 1) unless the query reads a
            TABLESAMPLE of its stream's archive.
        error: for an answer over a sample, output column -> one number per row: the
            half-width of the 95% confidence interval of that row's COUNT or SUM
            estimate (psoup.results.aggregates.Aggregator.compute); empty when exact.
        fresh_to: for an answer over streams fed by a Spark source (docs/language.md,
            "Freshness"), the ts up to which it is complete: no tuple with a smaller ts
            can still arrive in any of them. It is the least of those streams' latest
            ts (-inf while one of them has no tuple yet). None for an answer over no
            such stream, whose tuples are all inserted by callers.

    Example:
        >>> r = Result(["a"], [(1,), (2,)], np.array([5.0, 6.0]), np.array([1, 2]))
        >>> len(r), r.to_dicts()
        (2, [{'a': 1}, {'a': 2}])
    """

    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]] | None,
                 ts: np.ndarray | None, tuple_ids: np.ndarray | None, cursor: str | None = None,
                 keys: list[tuple[Any, ...]] | None = None,
                 values: list[np.ndarray] | None = None,
                 fidelity: Sequence[tuple[float, float, float]] = EXACT,
                 error: dict[str, np.ndarray] | None = None,
                 identity: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None,
                 fresh_to: float | None = None):
        """`identity`, when ts and tuple_ids are None: returns them, called once, when
        either is first read (it must keep what it reads from changing meanwhile)."""
        assert rows is not None or values is not None, "rows or column values"
        assert (ts is None) == (tuple_ids is None) == (identity is not None), \
            "ts and tupleIDs, or a function returning them"
        for array in (ts, tuple_ids, *(values or ())):
            if isinstance(array, np.ndarray):       # the answer may be kept for `since`
                array.setflags(write=False)
        self.columns = columns
        self._rows = rows
        self._values = values
        self._ts = ts
        self._tuple_ids = tuple_ids
        self._identity = identity
        self._cursor = cursor
        self._issue: Callable[[Result], None] | None = None
        self.keys = keys
        self.fidelity = EXACT if fidelity is EXACT else tuple(tuple(map(float, f))
                                                              for f in fidelity)
        self.error = error or {}
        self.fresh_to = fresh_to

    @property
    def ts(self) -> np.ndarray:
        """One timestamp per row (see Attributes)."""
        if self._ts is None:
            self._identify()
        assert self._ts is not None
        return self._ts

    @property
    def tuple_ids(self) -> np.ndarray:
        """The tupleID of each row (see Attributes)."""
        if self._tuple_ids is None:
            self._identify()
        assert self._tuple_ids is not None
        return self._tuple_ids

    def settle(self) -> None:
        """Take now whatever the answer would read from the engine later (its ts and
        tupleIDs): the engine calls it before retention drops the memory they are in."""
        self._identify()

    def _identify(self) -> None:
        """Take ts and tupleIDs from `identity`. Threads reading them at once may both
        call it: each sets the same values, both before `identity` is let go."""
        identity = self._identity
        if identity is None:
            return                      # another thread has just set them
        ts, tuple_ids = identity()
        ts.setflags(write=False)
        tuple_ids.setflags(write=False)
        self._ts, self._tuple_ids = ts, tuple_ids
        self._identity = None

    @property
    def exact(self) -> bool:
        """True when every time range was read whole (no TABLESAMPLE applied)."""
        return all(rate == 1.0 for _, _, rate in self.fidelity)

    @classmethod
    def build(cls, columns: list[str], values: list[np.ndarray], ts: np.ndarray | None,
              tuple_ids: np.ndarray | None, distinct: bool,
              identity: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None
              ) -> Result:
        """An answer over projected column arrays (rows built when first asked for);
        DISTINCT keeps each row's first occurrence (and its ts). `identity`: as in
        `Result`."""
        result = cls(columns, None, ts, tuple_ids, values=list(values), identity=identity)
        return result.distinct() if distinct else result

    @property
    def cursor(self) -> str | None:
        """The answer's `since` cursor (see Attributes), issued on first use."""
        issue = self._issue
        if self._cursor is None and issue is not None:
            issue(self)                 # sets the cursor, once even if threads race
            self._issue = None
        return self._cursor

    @cursor.setter
    def cursor(self, cursor: str | None) -> None:
        self._cursor = cursor

    def __getstate__(self) -> dict[str, Any]:
        """For pickle: the cursor issued now, the engine not carried along."""
        self._identify()
        state = dict(self.__dict__)
        state.update(_cursor=self.cursor, _issue=None, _identity=None)
        return state

    @property
    def cursor_issued(self) -> bool:
        """Whether the cursor is set (reading `cursor` would issue a deferred one)."""
        return self._cursor is not None

    def defer_cursor(self, issue: Callable[[Result], None]) -> None:
        """Have `issue(self)` set the cursor when it is first read, instead of now: the
        digest and MAC of a cursor cost 10-20 us of a 50-180 us invocation (measured,
        2,240-15,764 rows), wasted on a caller that never polls with `since`. `issue`
        must be idempotent (threads reading the cursor at once may both call it)."""
        self._issue = issue

    @property
    def values(self) -> list[np.ndarray] | None:
        """The output columns as numpy arrays, in output order; None for an answer made
        of rows (an aggregated one)."""
        return self._values

    @property
    def rows(self) -> list[tuple[Any, ...]]:
        """One tuple per row, values as Python scalars (built on first use)."""
        if self._rows is None:
            values = self._values or []
            self._rows = list(zip(*(v.tolist() for v in values), strict=True)) if values else []
        return self._rows

    def to_numpy(self) -> dict[str, np.ndarray]:
        """column name -> numpy array (TEXT as object arrays); no copy when the answer
        was projected from columns, so the arrays are read-only (the engine keeps the
        answer for `invoke(since=...)`): copy one to change it."""
        if self._values is not None:
            return dict(zip(self.columns, self._values, strict=True))
        rows = self.rows
        out = {}
        for i, name in enumerate(self.columns):
            column = [row[i] for row in rows]
            out[name] = np.array(column) if column and not any(
                v is None or isinstance(v, str) for v in column) else np.array(column, object)
        return out

    def to_arrow(self) -> Any:
        """The answer as a `pyarrow.Table` (one column per output column)."""
        import pyarrow as pa
        return pa.table({name: pa.array(values) for name, values in self.to_numpy().items()})

    def to_pandas(self) -> Any:
        """The answer as a `pandas.DataFrame` (pandas must be installed)."""
        return self.to_arrow().to_pandas()

    def distinct(self) -> Result:
        """The rows with duplicates dropped, each kept where it first occurs (a set of
        rows: the group keys of an aggregated answer no longer identify them). Numeric
        columns are compared as columns, O(n log n) in C; other answers build their rows.

        Example:
            >>> r = Result(["a"], None, np.arange(3.0), np.arange(3), values=[np.array([4, 2, 4])])
            >>> d = r.distinct()
            >>> d.rows, d.tuple_ids.tolist()
            ([(4,), (2,)], [0, 1])
        """
        grouped = row_codes(self._values) if self._values is not None else None
        if grouped is not None:
            first = np.sort(grouped[0])
            if len(first) == len(self):
                return self._carried(Result(self.columns, self._rows, self.ts,
                                            self.tuple_ids, self.cursor, values=self._values))
            return self._carried(Result(self.columns, None, self.ts[first],
                                        self.tuple_ids[first], self.cursor,
                                        values=[v[first] for v in self._values or []]), first)
        seen: dict[tuple[Any, ...], int] = {}
        for i, row in enumerate(self.rows):
            seen.setdefault(row, i)
        if len(seen) == len(self.rows):
            return self._carried(Result(self.columns, self.rows, self.ts, self.tuple_ids,
                                        self.cursor))
        keep = np.fromiter(seen.values(), dtype=np.int64, count=len(seen))
        return self._carried(Result(self.columns, list(seen), self.ts[keep],
                                    self.tuple_ids[keep], self.cursor), keep)

    def take(self, keep: np.ndarray) -> Result:
        """The rows selected by a boolean mask (or positions), with their ts, tupleIDs and
        group keys; columns stay columns. O(kept rows) (O(rows) to read a mask).

        Example:
            >>> r = Result(["a"], [(1,), (2,)], np.array([5.0, 6.0]), np.array([1, 2]))
            >>> r.take(np.array([False, True])).rows
            [(2,)]
        """
        if self._values is not None:
            return self._carried(Result(self.columns, None, self.ts[keep],
                                        self.tuple_ids[keep],
                                        values=[v[keep] for v in self._values]), keep)
        at = np.flatnonzero(keep) if keep.dtype == np.bool_ else keep
        rows = self.rows
        keys = self.keys
        return self._carried(Result(
            self.columns, [rows[i] for i in at.tolist()], self.ts[keep], self.tuple_ids[keep],
            keys=None if keys is None else [keys[i] for i in at.tolist()]), keep)

    def _carried(self, result: Result, keep: np.ndarray | None = None) -> Result:
        """`result` (this answer's rows `keep`, all when None) with this answer's
        fidelity and freshness and the errors of those rows."""
        result.fidelity = self.fidelity
        result.fresh_to = self.fresh_to
        result.error = {name: (e if keep is None else e[keep]) for name, e in self.error.items()}
        return result

    def __len__(self) -> int:
        if self._rows is None and self._values:
            return len(self._values[0])
        return len(self.rows)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def __repr__(self) -> str:
        return f"Result(columns={self.columns}, rows={len(self)})"


def row_codes(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """Rows of aligned numeric columns as (first, codes): `first[c]` is where the rows of
    code `c` first occur, `codes[i]` the code of row i; two rows share a code exactly when
    their tuples of Python values are equal (so NaN equals nothing, and -0.0 equals 0.0).
    None when there is no column or one is not int, float or bool. O(n log n).

    Example:
        >>> first, codes = row_codes([np.array([3, 1, 3]), np.array([0.5, 0.5, 0.5])])
        >>> first.tolist(), codes.tolist()
        ([1, 0], [1, 0, 1])
    """
    if not columns or any(c.dtype.kind not in "biuf" or c.ndim != 1 for c in columns):
        return None
    if len(columns) == 1:
        _, first, codes = np.unique(columns[0], return_index=True, return_inverse=True,
                                    equal_nan=False)
        return first, codes
    # A record per row: the sort compares field by field with each dtype's own equality.
    rows = np.empty(len(columns[0]), dtype=[(f"f{i}", c.dtype) for i, c in enumerate(columns)])
    for i, c in enumerate(columns):
        rows[f"f{i}"] = c
    _, first, codes = np.unique(rows, return_index=True, return_inverse=True)
    return first, codes


class Changes:
    """What changed in a query's answer between two invocations (`invoke(since=...)`):
    the STREAM paper's Istream (rows that entered) and Dstream (rows that left).

    Attributes:
        columns: the output column names.
        inserted: a Result of the rows now in the answer that were not in it at the cursor.
        deleted: a Result of the rows that were in the answer at the cursor and are gone.
        cursor: the cursor of the new answer, for the next poll.
        fresh_to: the new answer's `Result.fresh_to`.

    Example:
        >>> empty = Result(["a"], [], np.empty(0), np.empty(0, np.int64))
        >>> c = Changes(["a"], Result(["a"], [(1,)], np.array([5.0]), np.array([3])), empty, "c1")
        >>> len(c), c.inserted.rows
        (1, [(1,)])
    """

    def __init__(self, columns: list[str], inserted: Result, deleted: Result, cursor: str,
                 fresh_to: float | None = None):
        self.columns = columns
        self.inserted = inserted
        self.deleted = deleted
        self.cursor = cursor
        self.fresh_to = fresh_to

    def __len__(self) -> int:
        return len(self.inserted) + len(self.deleted)

    def __repr__(self) -> str:
        return f"Changes(inserted={len(self.inserted)}, deleted={len(self.deleted)})"
