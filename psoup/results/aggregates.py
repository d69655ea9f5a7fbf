"""Aggregates over a standing query's results, kept as they arrive (PSoup Sect. 6, Fig. 14).

An aggregated query (COUNT, SUM, AVG, MIN, MAX, GROUP BY) answers one row per group over
the results of its SELECT-FROM-WHERE clause that fall in the invocation's window. A
single-stream window is a range of positions [p0, p1), so PSoup-P and PSoup-C keep, per
query, an `AggregateIndex` that answers the aggregates of *any* position range without
scanning it:

* COUNT is two binary searches on the group's sorted positions; SUM and AVG are
  differences of prefix sums (`PrefixSums`), O(log n) per group in all.
* MIN and MAX come from Fig. 14's ranked n-ary tree (`RankedTree`): the leaves are the
  results in insertion order and every node is annotated with the MIN and MAX of its
  subtree. The tree is stored as B-ary levels of numpy arrays (level L+1 entry k reduces
  level L entries [kB, (k+1)B)); a range reads the partial children at both ends and the
  annotations of the whole children between them, level by level up to the common
  ancestor -- the thick edges of Fig. 14 -- so fewer than 2B entries per level,
  O(B log_B n), each level one vectorized slice.
* GROUP BY keeps one such structure per group (`_Group`), in key order.

Results arrive in increasing position order and leave from the left when they fall below
the retention horizon. Every array grows at the right and is consumed from the left
(`_Buffer`): an offset marks the first live entry, and the storage is compacted once the
dead prefix outnumbers the live entries (a group's tree is rebuilt and its prefix sums
re-summed then), so expiry is amortized O(1) per result and memory stays proportional to
what is live. Groups whose latest result expired are dropped at once; a live group trims
its dead prefix when next touched.

Sharing (Sect. 6): the leaves are the results of one SELECT-FROM-WHERE clause, so a
structure serves exactly one query -- the paper's query B, with another WHERE clause,
cannot use query A's tree -- but it serves *all* invocations of that query, over every
window, sliding or landmark, at any NOW: the structure is maintained once per result, not
once per invocation or per window.

Exactness. COUNT, MIN, MAX and SUM over INT are exact. An INT is summed as its two 32-bit
halves (v >> 32 and v & (2**32 - 1)), each with an int64 prefix sum: the difference of two
prefixes is exact modulo 2**64 even after wraparound, and each half's true range sum fits
int64 for any range of fewer than 2**31 rows, so SUM is an exact Python int, which may
exceed the int64 range (DuckDB returns a HUGEINT there). AVG over INT is that exact sum
divided by COUNT, rounded once to float.

Float tolerance. SUM over FLOAT is a difference of prefixes too, but compensated: each
prefix is the pair of the running sum as float64 rounds it and the running sum of every
step's exact rounding error (Knuth's TwoSum), so a range does not inherit the rounding of
the values before it -- an expired 1e17 does not blur a window of small values. The error
of a range's SUM is a few units in the last place of the sum plus about
n**2 * 2**-106 * sum(|x|) over the n rows the group's structure stores: its live rows and
at most as many expired ones before them, since compaction (once the dead prefix outnumbers
the live rows) re-sums the prefix from zero over the live rows. The tests accept
|got - math.fsum(range)| <= 1e-12 * |fsum| + 1e-15 * sum(|x|) over those stored rows (for
AVG, the same divided by COUNT), well inside the 1e-9 relative tolerance used against
DuckDB. `Aggregator.compute` sums its groups the same way, from one prefix over the rows
sorted by group. An infinite value, or a prefix that overflows, makes the affected range
be summed directly, O(range).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Literal, Protocol

import numpy as np
from sortedcontainers import SortedDict

from psoup import kernels
from psoup.bits import slot_rows
from psoup.query.model import AGGREGATES, TS, AggregateFunction, Query
from psoup.results.base import Sink
from psoup.results.blocks import BlockIndex, Column, SpanExceeded, wrap_int64
from psoup.results.result import Result
from psoup.stems import halves
from psoup.stems.data_stem import DataSteM

#: The ranked tree's fan-out: a range reads fewer than 2B entries per level and an append
#: rewrites at most one block per level besides the new entries.
BRANCHING = 32

_UFUNCS = {"min": np.minimum, "max": np.maximum}
_MIN_CAPACITY = 4
#: An INT is summed as (v >> _LOW) and (v & _LOW_MASK), see the module docstring.
_LOW = 32
_LOW_MASK = (1 << _LOW) - 1

#: An output column of an aggregated query: ("key", index in group_by) or (function, column).
Output = tuple[Literal["key"], int] | tuple[AggregateFunction, Column]


class _Buffer:
    """A numpy array that grows at the right and is consumed from the left.

    `data[start:stop]` is live. Growth doubles the capacity; `drop` advances `start` and
    compacts into a fresh array once the dead prefix outnumbers the live entries, so both
    are amortized O(1) per entry and the storage stays within a constant factor of the
    live entries. Both report whether the storage moved, for structures indexed by it.
    """

    __slots__ = ("data", "start", "stop")

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...] = ()):
        self.data = np.empty((_MIN_CAPACITY, *shape), dtype)
        self.start = self.stop = 0

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def live(self) -> np.ndarray:
        return self.data[self.start:self.stop]

    def append(self, values: np.ndarray) -> bool:
        k = len(values)
        moved = self.stop + k > len(self.data)
        if moved:
            self._reallocate(2 * (len(self) + k))
        self.data[self.stop:self.stop + k] = values
        self.stop += k
        return moved

    def drop(self, k: int) -> bool:
        self.start += k
        moved = self.start > len(self)
        if moved:
            self._reallocate(2 * len(self))
        return moved

    @classmethod
    def of(cls, data: np.ndarray, n: int) -> _Buffer:
        """A buffer on `data` (not copied), its first n entries live: what a bulk load
        wrote, room to grow included."""
        buffer = cls.__new__(cls)
        buffer.data, buffer.start, buffer.stop = data, 0, n
        return buffer

    def _reallocate(self, capacity: int) -> None:
        data = np.empty((max(capacity, _MIN_CAPACITY), *self.data.shape[1:]), self.data.dtype)
        n = len(self)
        data[:n] = self.live
        self.data, self.start, self.stop = data, 0, n


class PrefixSums:
    """Range sums of one column as differences of prefix sums (SUM and AVG).

    Each prefix is a pair: for INT the running sums of the high and low 32-bit halves
    (exact), for FLOAT the rounded running sum and the running sum of its rounding errors
    (compensated). Indices are relative to the oldest live row.

    Example:
        >>> s = PrefixSums(np.dtype(np.int64))
        >>> s.append(np.array([2**62, 2**62, 2**62, 5]))
        >>> s.range_sum(0, 3), s.range_sum(1, 4)
        (13835058055282163712, 9223372036854775813)
        >>> s.drop(2); s.range_sum(0, 2)
        4611686018427387909
        >>> f = PrefixSums(np.dtype(np.float64))
        >>> f.append(np.array([1e17, 1.0, 1.0, 1.0]))
        >>> f.range_sum(1, 4)
        3.0
    """

    def __init__(self, dtype: np.dtype):
        exact = dtype.kind in "iu"
        # FLOAT keeps its values, to re-sum the prefix at compaction and to sum a range
        # directly when the prefix is not finite; INT needs neither.
        self._values = None if exact else _Buffer(np.dtype(np.float64))
        self._prefix = _Buffer(np.dtype(np.int64 if exact else np.float64), (2,))
        self._prefix.append(np.zeros((1, 2), self._prefix.data.dtype))

    def __len__(self) -> int:
        return len(self._prefix) - 1

    def append(self, values: np.ndarray) -> None:
        """Add values at the right. Amortized O(k) for k values."""
        if self._values is not None and self._values.append(values):
            self._rebase()
        else:
            self._prefix.append(_extend_prefix(self._prefix.live[-1], values))

    @classmethod
    def of(cls, storage: np.ndarray, n: int) -> PrefixSums:
        """The sums of the first n of `storage` (values, with room to grow after them; a
        FLOAT column keeps it as its values, not copied). O(n): the prefix is summed
        once, as `append` would sum it."""
        sums = cls.__new__(cls)
        exact = storage.dtype.kind in "iu"
        prefix = np.empty((len(storage) + 1, 2), np.int64 if exact else np.float64)
        prefix[0] = 0
        _extend_prefix(prefix[0], storage[:n], prefix[1:n + 1])
        sums._values = None if exact else _Buffer.of(storage, n)
        sums._prefix = _Buffer.of(prefix, n + 1)
        return sums

    def drop(self, k: int) -> None:
        """Forget the k oldest values. Amortized O(k)."""
        if self._values is not None and self._values.drop(k):
            self._rebase()
        else:
            self._prefix.drop(k)

    def range_sum(self, i: int, j: int) -> int | float:
        """The sum of live values [i, j): a Python int for INT, a float for FLOAT. O(1)."""
        prefix = self._prefix.live
        values = None if self._values is None else self._values.live
        return _range_sum(prefix[j].tolist(), prefix[i].tolist(), values, i, j)

    def nbytes(self) -> int:
        return self._prefix.data.nbytes + (0 if self._values is None else self._values.data.nbytes)

    def _rebase(self) -> None:
        """Re-sum the prefix from zero over the live values, so that its rounding is that
        of live data only."""
        assert self._values is not None, "only a FLOAT column's sums keep values to rebase"
        self._prefix = _Buffer(np.dtype(np.float64), (2,))
        self._prefix.append(_prefix_of(self._values.live))


class RankedTree:
    """Fig. 14's ranked n-ary tree: values in insertion order, each node annotated with the
    MIN and MAX of its subtree, as B-ary levels of numpy arrays.

    Indices are relative to the oldest live leaf. `ops` chooses which annotations to keep.

    Example (the leaves t1..t6 of a binary tree):
        >>> t = RankedTree(np.dtype(np.int64), branching=2)
        >>> t.append(np.array([5, 1, 4, 9, 2, 7]))
        >>> t.range_max(1, 4), t.range_min(2, 6)
        (9, 2)
        >>> t.drop(3); len(t), t.range_max(1, 3)
        (3, 7)
    """

    def __init__(self, dtype: np.dtype, ops: tuple[str, ...] = ("min", "max"),
                 branching: int = BRANCHING):
        if branching < 2:
            raise ValueError(f"a ranked tree needs a fan-out of at least 2, not {branching}")
        self._b = branching
        self._leaves = _Buffer(dtype)
        self._ufuncs = {op: _UFUNCS[op] for op in ops}
        self._levels: dict[str, list[np.ndarray]] = {}
        self._rebuild()

    def __len__(self) -> int:
        return len(self._leaves)

    def append(self, values: np.ndarray) -> None:
        """Add leaves at the right and update the annotations above them: O(k + B log_B n)
        for k values, vectorized per level (amortized: growth rebuilds, O(n))."""
        if not len(values):
            return
        first = self._leaves.stop
        if self._leaves.append(values):
            self._rebuild()
        else:
            self._update(first)

    def drop(self, k: int) -> None:
        """Expire the k oldest leaves: amortized O(k) (compaction rebuilds, O(n))."""
        if k and self._leaves.drop(k):
            self._rebuild()

    def reduce(self, op: str, i: int, j: int) -> int | float:
        """The `op` ("min" or "max") of live leaves [i, j), as a Python scalar.
        O(B log_B n): the partial blocks at both ends of each level, then up one level."""
        if not 0 <= i < j <= len(self):
            raise IndexError(f"range [{i}, {j}) is empty or outside the {len(self)} leaves")
        b, start = self._b, self._leaves.start
        lo, hi, below = start + i, start + j, self._leaves.data
        parts: list[np.ndarray] = []
        levels = iter(self._levels[op])
        while hi - lo > 2 * b:
            whole_lo, whole_hi = -(-lo // b), hi // b      # the parents wholly inside
            parts += (below[lo:whole_lo * b], below[whole_hi * b:hi])
            lo, hi, below = whole_lo, whole_hi, next(levels)
        parts.append(below[lo:hi])
        value: int | float = self._ufuncs[op].reduce(
            np.concatenate(parts) if len(parts) > 1 else parts[0]).item()
        return value

    def range_min(self, i: int, j: int) -> int | float:
        return self.reduce("min", i, j)

    def range_max(self, i: int, j: int) -> int | float:
        return self.reduce("max", i, j)

    def nbytes(self) -> int:
        return self._leaves.data.nbytes + sum(
            level.nbytes for levels in self._levels.values() for level in levels)

    def _rebuild(self) -> None:
        """Allocate levels for the leaves' capacity, up to one of at most 2B entries, and
        annotate every stored leaf."""
        data, b = self._leaves.data, self._b
        for op in self._ufuncs:
            levels, size = [], len(data)
            while size > 2 * b:
                size = -(-size // b)
                levels.append(np.empty(size, data.dtype))
            self._levels[op] = levels
        if self._leaves.stop:
            self._update(0)

    def _update(self, first: int) -> None:
        """Recompute the annotations above stored leaves [first, stop)."""
        b = self._b
        for op, ufunc in self._ufuncs.items():
            below, lo, hi = self._leaves.data, first, self._leaves.stop
            for level in self._levels[op]:
                base = lo // b * b
                level[lo // b:-(-hi // b)] = ufunc.reduceat(below[base:hi],
                                                           np.arange(0, hi - base, b))
                below, lo, hi = level, lo // b, -(-hi // b)


class SuffixExtremes:
    """MIN or MAX of every suffix [i, end) of a column, from the values that no later
    value beats: for MAX, a value with a larger (or equal) one after it can never be the
    answer of a window that ends at the newest result (Golab, Sect. 2.3). Those left form
    a strictly decreasing run (increasing for MIN); the answer for [i, end) is the first
    of them at or after i, found by one binary search. Windows ending at NOW, the usual
    case, are answered this way; others use the RankedTree. Appends are amortized O(1)
    per value (vectorized per batch); expiry drops a prefix.

    Example:
        >>> s = SuffixExtremes(np.dtype(np.int64), "max")
        >>> s.append(np.array([5, 1, 4, 9, 2, 7, 3]))
        >>> [s.reduce(i) for i in range(7)]
        [9, 9, 9, 9, 7, 7, 3]
        >>> s.drop(4); s.reduce(0), s.reduce(2)
        (7, 3)
    """

    def __init__(self, dtype: np.dtype, op: str):
        self._op = op
        self._values = _Buffer(dtype)
        self._where = _Buffer(np.dtype(np.int64))      # their indices, counted from 0
        self._seen = 0                                  # values appended so far
        self._gone = 0                                  # values dropped so far

    def append(self, values: np.ndarray) -> None:
        """Add values at the right. O(k + values it outlives) for k values."""
        k = len(values)
        if not k:
            return
        better = np.greater if self._op == "max" else np.less
        ufunc = _UFUNCS[self._op]
        after = ufunc.accumulate(values[::-1])[::-1]            # extreme of v[t:]
        keep = np.ones(k, dtype=bool)
        keep[:-1] = better(values[:-1], after[1:])              # beats all after it
        best = after[0]
        kept = self._values.live
        # the stored ones stay only while they beat the whole batch (a prefix)
        if self._op == "max":      # strictly decreasing: those above `best` lead
            stay = len(kept) - int(np.searchsorted(kept[::-1], best, "right"))
        else:                      # strictly increasing: those below `best` lead
            stay = int(np.searchsorted(kept, best, "left"))
        self._values.stop = self._values.start + stay
        self._where.stop = self._where.start + stay
        self._values.append(values[keep])
        self._where.append(np.flatnonzero(keep) + self._seen)
        self._seen += k

    def drop(self, k: int) -> None:
        """Forget the k oldest values."""
        self._gone += k
        cut = int(np.searchsorted(self._where.live, self._gone))
        if cut:
            self._values.drop(cut)
            self._where.drop(cut)

    def reduce(self, i: int) -> int | float:
        """The extreme of the live values [i, end). O(log n)."""
        at = int(self._where.live.searchsorted(i + self._gone))
        value: int | float = self._values.data[self._values.start + at].item()
        return value

    def nbytes(self) -> int:
        return self._values.data.nbytes + self._where.data.nbytes


class Aggregator:
    """An aggregated Query compiled into what to fetch and how to fold it into rows.

    Attributes:
        query: the query (query.aggregated is True).
        group_by: its GROUP BY columns.
        sums: the distinct arguments of SUM and AVG (each gets one PrefixSums per group).
        extremes: the arguments of MIN and MAX, with the annotations each needs ("min",
            "max"; each gets one RankedTree per group).
        needed: the distinct columns whose values are needed, the GROUP BY columns then
            the SUM, AVG, MIN and MAX arguments, in first-use order (COUNT needs none:
            psoup has no NULLs).

    Example:
        >>> from psoup.query.model import SelectItem, Source, Window
        >>> q = Query("", (Source("R", "R", Window()),),
        ...           (SelectItem(0, "g", "g"), SelectItem(0, "*", "count(*)", "count"),
        ...            SelectItem(0, "a", "max(a)", "max")), group_by=((0, "g"),))
        >>> agg = Aggregator(q)
        >>> agg.needed
        [(0, 'g'), (0, 'a')]
        >>> agg.compute({(0, "g"): np.array(["y", "x", "y"], dtype=object),
        ...              (0, "a"): np.array([4, 7, 9])}, np.array([1.0, 2.0, 3.0])).rows
        [('x', 1, 7), ('y', 2, 9)]
    """

    def __init__(self, query: Query):
        self.query = query
        self.group_by: list[Column] = list(query.group_by)
        self.sums: list[Column] = []
        self.extremes: dict[Column, tuple[str, ...]] = {}
        self._outputs: list[Output] = []      # per output column
        for item in query.select:
            column = (item.source, item.column)
            if item.agg is None:
                self._outputs.append(("key", self.group_by.index(column)))
                continue
            function = AGGREGATES[item.agg]
            self._outputs.append((function, column))
            if function.keeps == "sum" and column not in self.sums:
                self.sums.append(column)
            elif function.keeps in _UFUNCS and function.keeps not in self.extremes.get(column, ()):
                self.extremes[column] = self.extremes.get(column, ()) + (function.keeps,)
        aggregated = [output[1] for output in self._outputs
                      if output[0] != "key" and output[0].keeps is not None]
        self.needed: list[Column] = list(dict.fromkeys(self.group_by + aggregated))

    def kept(self, function: AggregateFunction, column: Column, group: int,
             sums: Mapping[Column, list[Any]],
             extremes: Mapping[tuple[Column, str], list[Any]]) -> Any:
        """What `function` of `column` keeps for group number `group` (None if nothing)."""
        if function.keeps is None:
            return None
        if function.keeps == "sum":
            return sums[column][group]
        return extremes[(column, function.keeps)][group]

    def compute(self, values: Mapping[Column, np.ndarray], ts: np.ndarray,
                weights: np.ndarray | None = None) -> Result:
        """The answer over the given rows, evaluated directly (NoMat, joins, PARTITION BY
        windows, archive tiers). `values[column]` are aligned arrays for every column of
        `needed`; `ts` the rows' timestamps (a group's row gets the latest). O(n log n).

        `weights`: rows read from a sample, each weighted by the inverse of the rate it
        was sampled at (1 for rows read whole). COUNT and SUM are then the
        Horvitz-Thompson estimates sum(w) and sum(w x), each with the half-width of its
        95% normal confidence interval in `Result.error`, 1.96 sqrt(sum((w^2 - w) y^2))
        (the unbiased variance estimate of a Poisson sample, y = 1 for COUNT); AVG is
        their ratio, MIN and MAX the sample's (no error given for those three).
        """
        ts = np.asarray(ts, dtype=np.float64)
        n = len(ts)
        if n == 0:
            return self._result([], [], {}, {}, ts)
        columns = {c: _numeric(values[c]) for c in self.needed}
        codes, keys = _group_codes([columns[c] for c in self.group_by], n)
        if weights is not None:
            return self._estimate(columns, codes, keys, ts, np.asarray(weights, np.float64))
        order = np.argsort(codes, kind="stable")
        counts = np.bincount(codes, minlength=len(keys))
        ends = np.cumsum(counts)
        starts = ends - counts
        sums = {}
        for c in self.sums:
            ordered = columns[c][order]
            if ordered.dtype.kind in "iu":      # exact: differences of one INT prefix
                prefix = _prefix_of(ordered)
                sums[c] = [_range_sum(later, earlier, ordered, i, j) for later, earlier, i, j
                           in zip(prefix[ends].tolist(), prefix[starts].tolist(),
                                  starts.tolist(), ends.tolist(), strict=True)]
            else:   # a FLOAT group is summed from zero, rounding only its own values (a
                # difference of one prefix over all groups carries the rounding of the
                # groups before it: 4 x 0.5 came out 1.9999999999999998)
                sums[c] = [exact_sum(ordered[i:j]) for i, j in zip(starts.tolist(),
                                                                    ends.tolist(), strict=True)]
        extremes = {(c, op): _UFUNCS[op].reduceat(columns[c][order], starts).tolist()
                    for c, ops in self.extremes.items() for op in ops}
        return self._result(keys, counts.tolist(), sums, extremes,
                            np.maximum.reduceat(ts[order], starts))

    def _estimate(self, columns: Mapping[Column, np.ndarray], codes: np.ndarray,
                  keys: list[tuple[Any, ...]], ts: np.ndarray, w: np.ndarray) -> Result:
        """`compute` over weighted rows (a sample): see there. O(n log n)."""
        k = len(keys)
        order = np.argsort(codes, kind="stable")
        ends = np.cumsum(np.bincount(codes, minlength=k))
        starts = ends - np.bincount(codes, minlength=k)
        spread = w * w - w                      # 0 for the rows read whole
        counts = np.bincount(codes, weights=w, minlength=k)
        variance: dict[Column | None, np.ndarray] = {
            None: np.bincount(codes, weights=spread, minlength=k)}
        sums = {}
        for c in self.sums:
            x = columns[c].astype(np.float64)
            sums[c] = np.bincount(codes, weights=w * x, minlength=k).tolist()
            variance[c] = np.bincount(codes, weights=spread * x * x, minlength=k)
        extremes = {(c, op): _UFUNCS[op].reduceat(columns[c][order], starts).tolist()
                    for c, ops in self.extremes.items() for op in ops}
        result = self._result(keys, counts.tolist(), sums, extremes,
                              np.maximum.reduceat(ts[order], starts))
        for name, output in zip(self.query.columns, self._outputs, strict=True):
            if output[0] != "key" and output[0].name in ("count", "sum"):
                at = None if output[0].name == "count" else output[1]
                result.error[name] = 1.96 * np.sqrt(variance[at])
        return result

    def with_totals(self, values: Mapping[Column, np.ndarray], ts: np.ndarray,
                    totals: Mapping[str, Any], weights: np.ndarray | None = None
                    ) -> Result:
        """The answer of a query without GROUP BY over the given rows (as `compute`
        takes them) and rows summarized by `totals` (psoup.archive.rollups
        `Rollups.totals`: their count, latest ts, and per column name its SUM, MIN and
        MAX, None without rows), each counted once. O(n). `weights`: the rows are a
        sample, weighted as in `compute` (the totals are exact: they add to the
        estimates, not to their error).

        Example:
            >>> from psoup.query.model import SelectItem, Source, Window
            >>> q = Query("", (Source("R", "R", Window()),),
            ...           (SelectItem(0, "*", "count(*)", "count"),
            ...            SelectItem(0, "a", "avg(a)", "avg")))
            >>> Aggregator(q).with_totals({(0, "a"): np.array([4])}, np.array([9.0]),
            ...     {"count": 3, "ts_max": 5.0, "sum": {"a": 8}, "min": {"a": 1},
            ...      "max": {"a": 5}}).rows
            [(4, 3.0)]
        """
        assert not self.group_by, "totals have no groups"
        ts = np.asarray(ts, dtype=np.float64)
        w = None if weights is None else np.asarray(weights, np.float64)
        n = (len(ts) if w is None else float(w.sum())) + totals["count"]
        if n == 0:
            return self._result([], [], {}, {}, ts)
        columns = {c: _numeric(values[c]) for c in self.needed}
        sums = {c: [totals["sum"][c[1]] + (
            0 if not len(ts) else exact_sum(columns[c]) if w is None
            else float(np.dot(w, columns[c].astype(np.float64))))] for c in self.sums}
        extremes = {}
        for c, ops in self.extremes.items():
            for op in ops:
                found = [totals[op][c[1]]] if totals["count"] else []
                if len(ts):
                    found.append(getattr(columns[c], op)().item())
                extremes[(c, op)] = [min(found) if op == "min" else max(found)]
        latest = max(([totals["ts_max"]] if totals["count"] else [])
                     + ([float(ts.max())] if len(ts) else []))
        result = self._result([()], [n], sums, extremes, np.array([latest]))
        if w is not None:
            spread = w * w - w
            for name, output in zip(self.query.columns, self._outputs, strict=True):
                if output[0] != "key" and output[0].name in ("count", "sum"):
                    y2 = 1.0 if output[0].name == "count" else \
                        columns[output[1]].astype(np.float64) ** 2
                    result.error[name] = np.array([1.96 * math.sqrt(float(np.sum(spread * y2)))])
        return result

    def _result(self, keys: list[tuple[Any, ...]], counts: list[int],
                sums: dict[Column, list[Any]], extremes: dict[tuple[Column, str], list[Any]],
                ts: np.ndarray) -> Result:
        """Rows from per-group columns (groups in key order). Without GROUP BY and without
        rows, SQL's single row: COUNT 0, the other aggregates None."""
        if not keys:
            if self.group_by:
                return Result(self.query.columns, [], np.empty(0), np.empty(0, np.int64),
                              keys=[])
            keys, counts, ts = [()], [0], np.array([np.nan])
            sums = {c: [None] for c in self.sums}
            extremes = {(c, op): [None] for c, ops in self.extremes.items() for op in ops}
        columns = []
        for output in self._outputs:
            if output[0] == "key":
                columns.append([key[output[1]] for key in keys])
            else:
                function, arg = output
                columns.append([function.fold(n, self.kept(function, arg, g, sums, extremes))
                                for g, n in enumerate(counts)])
        rows = list(zip(*columns, strict=True))
        no_ids = np.empty(len(rows), np.int64)
        no_ids.fill(-1)
        return Result(self.query.columns, rows, np.asarray(ts, dtype=np.float64), no_ids,
                      keys=keys)


class _Part(Protocol):
    """What a group keeps per column, indexed like its results (PrefixSums, RankedTree,
    SuffixExtremes)."""

    def drop(self, k: int) -> None: ...

    def nbytes(self) -> int: ...


class _Group:
    """One group's results: positions and ts, a PrefixSums per SUM/AVG column and a
    RankedTree per MIN/MAX column, all indexed alike (relative to the oldest live row).
    `ts` is None in an index that reads ts from its stream by position
    (`AggregateIndex.ts_at`)."""

    def __init__(self, aggregator: Aggregator, values: Mapping[Column, np.ndarray],
                 keep_ts: bool = True):
        self.last = -1                      # the position of the group's latest result
        self.last_ts = math.nan             # its ts, when `ts` is None
        self.horizon = 0                    # the horizon it was last trimmed to
        self.positions = _Buffer(np.dtype(np.int64))
        self.ts: _Buffer | None = _Buffer(np.dtype(np.float64)) if keep_ts else None
        self.sums = {c: PrefixSums(values[c].dtype) for c in aggregator.sums}
        self.trees = {c: RankedTree(values[c].dtype, ops)
                      for c, ops in aggregator.extremes.items()}
        self.suffixes = {(c, op): SuffixExtremes(values[c].dtype, op)
                         for c, ops in aggregator.extremes.items() for op in ops}

    def append(self, positions: np.ndarray, ts: np.ndarray | None,
               values: Mapping[Column, np.ndarray]) -> None:
        self.last = int(positions[-1])
        self.positions.append(positions)
        if self.ts is not None:
            assert ts is not None, "a group that keeps ts is given them"
            self.ts.append(ts)
        for c, sums in self.sums.items():
            sums.append(values[c])
        for c, tree in self.trees.items():
            tree.append(values[c])
        for (c, _), suffix in self.suffixes.items():
            suffix.append(values[c])

    @classmethod
    def of(cls, aggregator: Aggregator, storage: Mapping[Column | str, np.ndarray],
           n: int) -> _Group:
        """A group of the first n entries of each of `storage`'s arrays (positions and
        ts under those names, ts only if the group keeps them, then the columns it keeps;
        room to grow after them), kept, not copied: a bulk load's group
        (`AggregateIndex.load`)."""
        group = cls.__new__(cls)
        positions = storage["positions"]
        group.last = int(positions[n - 1])
        group.last_ts = math.nan
        group.horizon = 0
        group.positions = _Buffer.of(positions, n)
        group.ts = _Buffer.of(storage[TS], n) if TS in storage else None
        group.sums = {c: PrefixSums.of(storage[c], n) for c in aggregator.sums}
        group.trees = {c: RankedTree(storage[c].dtype, ops)
                       for c, ops in aggregator.extremes.items()}
        group.suffixes = {(c, op): SuffixExtremes(storage[c].dtype, op)
                          for c, ops in aggregator.extremes.items() for op in ops}
        for c, tree in group.trees.items():
            tree.append(storage[c][:n])
        for (c, _), suffix in group.suffixes.items():
            suffix.append(storage[c][:n])
        return group

    def ts_of(self, j: int) -> float:
        """The ts of live result j (a group that keeps them)."""
        assert self.ts is not None, "the index reads ts by position"
        value: float = self.ts.data[self.ts.start + j].item()
        return value

    def extreme(self, column: Column, op: str, i: int, j: int) -> int | float:
        """MIN or MAX of results [i, j): from the suffix run when j is the newest."""
        if j == len(self.positions):
            return self.suffixes[(column, op)].reduce(i)
        return self.trees[column].reduce(op, i, j)

    def expire(self, horizon: int) -> None:
        """Drop the results below `horizon`: O(log n), plus amortized O(1) per result."""
        if horizon <= self.horizon:
            return
        self.horizon = horizon
        k = int(np.searchsorted(self.positions.live, horizon))
        if k:
            self.positions.drop(k)
            if self.ts is not None:
                self.ts.drop(k)
            for part in self._parts():
                part.drop(k)

    def nbytes(self) -> int:
        parts = self._parts()
        return (self.positions.data.nbytes + (0 if self.ts is None else self.ts.data.nbytes)
                + sum(part.nbytes() for part in parts))

    def _parts(self) -> tuple[_Part, ...]:
        return (*self.sums.values(), *self.trees.values(), *self.suffixes.values())


class AggregateIndex:
    """The aggregate structure of one single-source aggregated query (Sect. 6): its
    results, grouped, with prefix sums and ranked trees, answering any position range.

    Example:
        >>> from psoup.query.model import SelectItem, Source, Window
        >>> q = Query("", (Source("R", "R", Window()),),
        ...           (SelectItem(0, "*", "count(*)", "count"),
        ...            SelectItem(0, "a", "sum(a)", "sum"), SelectItem(0, "a", "max(a)", "max")))
        >>> index = AggregateIndex(Aggregator(q))
        >>> index.append(np.array([3, 5, 8]), {"a": np.array([10, 30, 20])},
        ...              np.array([1.0, 2.0, 3.0]))
        >>> index.answer(4, 9).rows, index.answer(0, 4).rows
        ([(2, 50, 30)], [(1, 10, 10)])
        >>> index.expire(6); index.answer(0, 9).rows, index.answer(0, 6).rows
        ([(1, 20, 20)], [(0, None, None)])
    """

    def __init__(self, aggregator: Aggregator,
                 ts_at: Callable[[np.ndarray], np.ndarray] | None = None):
        self.aggregator = aggregator
        # the ts of retained positions, read from the stream (ts never decrease along
        # it, so a range's latest ts is its last result's): then the groups keep no ts,
        # 8 bytes a result less to copy at registration and per batch. None: they do.
        self.ts_at = ts_at
        self._groups: SortedDict[tuple[Any, ...], _Group] = SortedDict()  # by key tuple
        # the keys by increasing position of their group's latest result, for expiry
        self._recent: OrderedDict[tuple[Any, ...], None] = OrderedDict()
        self._horizon = 0

    def append(self, positions: np.ndarray, values: Mapping[str, np.ndarray],
               ts: np.ndarray | None) -> None:
        """Add results. `positions` are increasing and above every earlier one; `values`
        holds the needed columns by name, aligned with them, and `ts` their ts (unread,
        may be None, with `ts_at`). O(k log k) to group k results, then amortized
        O(k + G' B log_B n) for the G' groups they touch."""
        k = len(positions)
        if k == 0:
            return
        agg = self.aggregator
        keep_ts = self.ts_at is None
        positions = np.asarray(positions, dtype=np.int64)
        ts = np.asarray(ts, dtype=np.float64) if keep_ts else None
        columns = {c: _numeric(values[c[1]]) for c in agg.needed}
        codes, keys = _group_codes([columns[c] for c in agg.group_by], k)
        bounds = [0, k]
        if len(keys) > 1:
            order = np.argsort(codes, kind="stable")
            positions = positions[order]
            ts = None if ts is None else ts[order]
            columns = {c: v[order] for c, v in columns.items()}
            bounds = np.r_[0, np.cumsum(np.bincount(codes))].tolist()
        groups = self._groups
        for g, key in enumerate(keys):
            a, b = bounds[g], bounds[g + 1]
            group = groups.get(key)
            if group is None:
                group = groups[key] = _Group(agg, columns, keep_ts)
            else:
                group.expire(self._horizon)
            group.append(positions[a:b], None if ts is None else ts[a:b],
                         {c: v[a:b] for c, v in columns.items()})
        ends = positions[np.asarray(bounds[1:]) - 1]
        if not keep_ts:             # each touched group's newest ts, read once per batch
            for key, latest in zip(keys, self._ts(ends).tolist(), strict=True):
                groups[key].last_ts = latest
        for g in np.argsort(ends).tolist():
            self._recent[keys[g]] = None
            self._recent.move_to_end(keys[g])

    def load(self, sizes: np.ndarray, keys: list[tuple[Any, ...]], dtypes: list[np.dtype],
             scatter: Callable[[np.ndarray, np.ndarray], None]) -> None:
        """`append` into an empty index of results in groups of `sizes` under `keys` (in
        ascending key order); `scatter(cursors, dst)` writes them grouped into the rows
        of `dst` (`DataSteM.scatter`: the positions, then ts and the `stored` columns,
        of `dtypes`, all 8 bytes wide; no ts with `ts_at`), group g's from column
        cursors[g] on. A new
        query's matches over the retained tuples, grouped and copied in one compiled
        pass into storage each group then keeps, with half as much room again to grow.
        O(k + G) for k results in G groups."""
        assert not self._groups, "a bulk load starts an index"
        if not len(sizes) or not sizes.sum():
            return
        room = sizes + sizes // 2 + _MIN_CAPACITY
        ends = np.cumsum(room)
        offsets = ends - room
        storage = np.empty((len(self.rows), int(ends[-1])), np.uint64)
        scatter(offsets.copy(), storage)
        self._adopt(storage, offsets, ends, sizes, keys, dtypes)

    def load_one(self, storage: np.ndarray, n: int, dtypes: list[np.dtype]) -> None:
        """`load` of results already in one group's order in the first n columns of
        `storage` (rows as `load` writes them; the columns after them are room to grow):
        a query without GROUP BY, its matches found and taken in one pass
        (`DataSteM.probe_gather`). O(n)."""
        assert not self._groups and not self.aggregator.group_by, "one group, from empty"
        if n:
            self._adopt(storage, np.zeros(1, np.int64), np.array([storage.shape[1]]),
                        np.array([n]), [()], dtypes)

    def _adopt(self, storage: np.ndarray, offsets: np.ndarray, ends: np.ndarray,
               sizes: np.ndarray, keys: list[tuple[Any, ...]], dtypes: list[np.dtype]
               ) -> None:
        """The groups of `load`: group g on columns offsets[g] to ends[g] of `storage`,
        its first sizes[g] live."""
        agg = self.aggregator
        names: list[Column | str] = ["positions", *self.rows[1:]]
        typed = [storage[0].view(np.int64),
                 *(storage[r + 1].view(dt) for r, dt in enumerate(dtypes))]
        bounds = list(zip(offsets.tolist(), ends.tolist(), sizes.tolist(), strict=True))

        def build(at: tuple[int, int, int]) -> _Group:
            a, b, n = at            # the prefix sums: a compiled pass per group
            return _Group.of(agg, {name: typed[r][a:b] for r, name in enumerate(names)}, n)
        threads = halves.THREADS if int(sizes.sum()) >= halves.PARALLEL_ROWS else 1
        batches = [bounds[i::threads] for i in range(threads)]      # groups dealt round
        built = halves.each(lambda batch: [build(at) for at in batch], batches)
        groups = [built[g % threads][g // threads] for g in range(len(bounds))]
        if self.ts_at is not None:
            lasts = self._ts(np.array([group.last for group in groups], np.int64))
            for group, latest in zip(groups, lasts.tolist(), strict=True):
                group.last_ts = latest
        self._groups.update(zip(keys, groups, strict=True))     # one sort, not G inserts
        for g in np.argsort([group.last for group in groups]).tolist():
            self._recent[keys[g]] = None

    @property
    def rows(self) -> list[Column | str]:
        """What a bulk load's storage holds per result, row by row: "positions", then
        TS unless the index reads ts by position (`ts_at`), then the `stored` columns."""
        return ["positions", *([TS] if self.ts_at is None else []), *self.stored]

    @property
    def stored(self) -> list[Column]:
        """The columns whose values the groups keep per result (the arguments of SUM,
        AVG, MIN and MAX; a GROUP BY column only when it is one), in `needed` order."""
        agg = self.aggregator
        return [c for c in agg.needed if c in agg.sums or c in agg.extremes]

    def expire(self, horizon: int) -> None:
        """Drop the results below `horizon`: groups left empty go now, O(log G) each; the
        others trim when next touched, amortized O(1) per result."""
        if horizon <= self._horizon:
            return
        self._horizon = horizon
        recent, groups = self._recent, self._groups
        while recent:
            key = next(iter(recent))
            if groups[key].last >= horizon:
                break
            del recent[key], groups[key]

    def answer(self, p0: int, p1: int) -> Result:
        """The aggregates over the results with p0 <= position < p1, one row per group in
        key order. O(G (log n + B log_B n)) for G groups, independent of the range's size."""
        agg = self.aggregator
        if not agg.group_by:
            return self._single(p0, p1)
        keys, counts, last = [], [], []
        sums: dict[Column, list[Any]] = {c: [] for c in agg.sums}
        extremes: dict[tuple[Column, str], list[Any]] = {
            (c, op): [] for c, ops in agg.extremes.items() for op in ops}
        for key, group in self._groups.items():
            group.expire(self._horizon)
            live = group.positions.live
            i, j = int(live.searchsorted(p0)), int(live.searchsorted(p1))
            if i >= j:
                continue
            keys.append(key)
            counts.append(j - i)
            last.append(self._latest(group, live, j))
            for c, prefix in group.sums.items():
                sums[c].append(prefix.range_sum(i, j))
            for c in group.trees:
                for op in agg.extremes[c]:
                    extremes[(c, op)].append(group.extreme(c, op, i, j))
        return agg._result(keys, counts, sums, extremes, np.array(last, dtype=np.float64))

    def _single(self, p0: int, p1: int) -> Result:
        """`answer` without GROUP BY: one row, built straight from the one group."""
        agg = self.aggregator
        group = self._groups.get(())
        if group is not None:
            group.expire(self._horizon)
            live = group.positions.live
            i, j = int(live.searchsorted(p0)), int(live.searchsorted(p1))
        if group is None or i >= j:
            return agg._result([], [], {}, {}, np.empty(0))
        row = []
        for output in agg._outputs:
            # without GROUP BY every output is an aggregate (a bare column must be grouped)
            assert output[0] != "key", "an output without GROUP BY is an aggregate"
            function, arg = output
            if function.keeps is None:
                kept = None
            elif function.keeps == "sum":
                kept = group.sums[arg].range_sum(i, j)
            else:
                kept = group.extreme(arg, function.keeps, i, j)
            row.append(function.fold(j - i, kept))
        return Result(agg.query.columns, [tuple(row)],
                      np.array([self._latest(group, live, j)]), np.array([-1]), keys=[()])

    def _latest(self, group: _Group, live: np.ndarray, j: int) -> float:
        """The ts of `group`'s live result j - 1 (`live`: its positions): kept, or the
        group's newest (known), or read by position."""
        if self.ts_at is None:
            return group.ts_of(j - 1)
        if j == len(live):
            return group.last_ts
        return float(self._ts(live[j - 1:j])[0])

    def _ts(self, positions: np.ndarray) -> np.ndarray:
        """`ts_at` of live positions, as float64."""
        assert self.ts_at is not None, "read by position only with ts_at"
        return np.asarray(self.ts_at(positions), dtype=np.float64)

    def nbytes(self) -> int:
        return sum(group.nbytes() for group in self._groups.values())

    def __len__(self) -> int:
        """The live results stored (trims every group: O(G log n))."""
        for group in self._groups.values():
            group.expire(self._horizon)
        return sum(len(group.positions) for group in self._groups.values())


def _numeric(values: np.ndarray) -> np.ndarray:
    """INT columns as int64 and FLOAT as float64 (prefix sums and trees rely on them)."""
    values = np.asarray(values)
    kind = values.dtype.kind
    if kind in "iu":
        return values.astype(np.int64, copy=False)
    if kind == "f":
        return values.astype(np.float64, copy=False)
    return values


def _prefix_of(values: np.ndarray) -> np.ndarray:
    """The len(values) + 1 prefix rows of `values`, from a zero row (see _extend_prefix)."""
    prefix = np.empty((len(values) + 1, 2), np.int64 if values.dtype.kind in "iu" else np.float64)
    prefix[0] = 0
    _extend_prefix(prefix[0], values, prefix[1:])
    return prefix


def _extend_prefix(last: np.ndarray, values: np.ndarray,
                   out: np.ndarray | None = None) -> np.ndarray:
    """The prefix rows that follow the row `last` over `values`, one per value (written
    into `out`, a (len(values), 2) array of last's dtype, when given).

    INT: (sum of v >> 32, sum of v & (2**32 - 1)), in int64; wraparound is harmless since
    only differences are read (see _range_sum). FLOAT: (s, e) where s is the running sum
    as float64 rounds it, sequentially, and e the running sum of each step's exact
    rounding error (Knuth's TwoSum), so s + e carries the prefix to about 2**-106 (one
    compiled pass, `kernels.float_prefix`).
    """
    steps = np.empty((len(values), 2), last.dtype) if out is None else out
    if last.dtype.kind == "i":
        values = values.astype(np.int64, copy=False)
        np.right_shift(values, _LOW, out=steps[:, 0])
        np.bitwise_and(values, _LOW_MASK, out=steps[:, 1])
        steps[:1] += last
        return np.cumsum(steps, axis=0, out=steps)
    kernels.float_prefix(values.astype(np.float64, copy=False), float(last[0]),
                         float(last[1]), steps)
    return steps


def _range_sum(later: list[Any], earlier: list[Any], values: np.ndarray | None, i: int,
               j: int) -> int | float:
    """The sum of rows [i, j) from their prefix rows j (`later`) and i (`earlier`), as
    Python lists: an exact int for an INT prefix, the difference of two compensated pairs
    for a FLOAT one, summed directly over values[i:j] when that is not finite (an infinite
    value, or a prefix that overflowed)."""
    (high, low), (high0, low0) = later, earlier
    if isinstance(high, int):
        # each half's true sum fits int64 for fewer than 2**31 rows, so the difference of
        # the wrapped prefixes, wrapped again, is that sum
        return (wrap_int64(high - high0) << _LOW) + wrap_int64(low - low0)
    total: float = (high - high0) + (low - low0)
    if math.isfinite(total):
        return total
    assert values is not None, "a FLOAT prefix comes with its values"
    with np.errstate(invalid="ignore"):
        return float(np.sum(values[i:j]))


def exact_sum(values: np.ndarray) -> int | float:
    """The sum of `values` from zero, as a prefix over them alone would give it."""
    prefix = _prefix_of(values)
    return _range_sum(prefix[-1].tolist(), prefix[0].tolist(), values, 0, len(values))


def _group_codes(columns: list[np.ndarray], n: int) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    """Number n rows' key tuples 0..G-1 in ascending key order; return each row's number
    and the G keys as tuples of Python scalars. O(n log n)."""
    if not columns:
        return np.zeros(n, np.int64), [()]
    codes = np.zeros(n, np.int64)
    for column in columns:
        uniques, inverse = np.unique(column, return_inverse=True)
        # re-rank after each column so the combined codes stay below n * n
        _, codes = np.unique(codes * len(uniques) + inverse.reshape(-1), return_inverse=True)
    codes = codes.reshape(-1)
    first = np.unique(codes, return_index=True)[1]
    return codes, list(zip(*(column[first].tolist() for column in columns), strict=True))


#: A GROUP BY on one INT column whose keys span at most this many values (or as many as
#: the rows grouped) numbers its groups by key - min, with no sort.
_DIRECT_SPAN = 1 << 16


def _bulk_groups(stem: DataSteM, names: list[str], positions: np.ndarray,
                 parts: list[tuple[int, int]]
                 ) -> tuple[list[np.ndarray], list[tuple[Any, ...]], dict[str, Any]]:
    """How `DataSteM.scatter` groups the tuples at `positions` by the columns `names`
    (none: one group), each of `parts` (bounds in `positions`) on a thread of its own:
    (per part, each group's size in it; the groups' keys as tuples in ascending order;
    scatter's grouping arguments, `keys` aligned with `positions`). One INT column of a
    small range is read in place and numbered by key - min, O(n); other keys are
    gathered and sorted (`_group_codes`), O(n log n)."""
    n = len(positions)
    if not names:
        return ([np.array([b - a], np.int64) for a, b in parts], [()],
                {"key": None, "keys": np.empty(0, np.int64), "lo": 0,
                 "remap": np.zeros(1, np.int64)})
    direct = _direct_counts(stem, names[0], positions, parts) \
        if len(names) == 1 and stem.wide_dtypes(names) == [np.dtype(np.int64)] else None
    if direct is not None:
        lo, counted = direct
        present = np.flatnonzero(sum(counted))
        remap = np.zeros(len(counted[0]), np.int64)
        remap[present] = np.arange(len(present))
        return ([c[present] for c in counted], [(v,) for v in (present + lo).tolist()],
                {"key": names[0], "keys": np.empty(0, np.int64), "lo": lo, "remap": remap})
    columns = stem.take(names, positions)
    codes, keys = _group_codes([_numeric(columns[name]) for name in names], n)
    return ([np.bincount(codes[a:b], minlength=len(keys)).astype(np.int64) for a, b in parts],
            keys, {"key": None, "keys": codes, "lo": 0,
                   "remap": np.arange(len(keys), dtype=np.int64)})


#: The keys at this many first positions place a guessed table (`_direct_counts`).
_SAMPLE = 4096


def _direct_counts(stem: DataSteM, name: str, positions: np.ndarray,
                   parts: list[tuple[int, int]]) -> tuple[int, list[np.ndarray]] | None:
    """(lo, per part the count of each value lo + k of INT column `name` at
    `positions`) when the values span less than max(_DIRECT_SPAN, n), else None. When
    the first _SAMPLE keys span little, a table of _DIRECT_SPAN around them is counted
    at once, one pass over the keys; only if a key falls outside it is their range
    found first (`DataSteM.key_range`), then counted: two passes."""
    n = len(positions)

    def count(lo: int, size: int) -> tuple[list[np.ndarray], int]:
        def one(ab: tuple[int, int]) -> tuple[np.ndarray, int]:
            counts = np.zeros(size, np.int64)
            return counts, stem.key_counts(name, positions[ab[0]:ab[1]], lo, counts)
        counted = halves.each(one, parts)
        return [c for c, _ in counted], sum(missed for _, missed in counted)

    low, high = stem.key_range(name, positions[:_SAMPLE])
    if n > _SAMPLE and high - low < _DIRECT_SPAN // 4 and abs(low) < 1 << 62:
        lo = low - (_DIRECT_SPAN - (high - low)) // 2
        counted, missed = count(lo, _DIRECT_SPAN)
        if not missed:
            return lo, counted
    if n > _SAMPLE:
        ranges = [r for r in halves.each(
            lambda ab: stem.key_range(name, positions[ab[0]:ab[1]]), parts) if r[0] <= r[1]]
        low, high = min(r[0] for r in ranges), max(r[1] for r in ranges)
    if high - low >= max(_DIRECT_SPAN, n):
        return None
    return low, count(low, high - low + 1)[0]


def _scatter_parts(stem: DataSteM, names: list[str], positions: np.ndarray,
                   parts: list[tuple[int, int]], sizes: list[np.ndarray],
                   grouping: dict[str, Any], cursors: np.ndarray, dst: np.ndarray) -> None:
    """`DataSteM.scatter` of each part of `positions` on a thread of its own, a part's
    groups starting where the earlier parts' end."""
    starts = [cursors + sum(sizes[:i], np.zeros_like(cursors)) for i in range(len(parts))]
    keys = grouping["keys"]

    def one(i: int) -> None:
        a, b = parts[i]
        stem.scatter(names, positions[a:b], starts[i], dst, key=grouping["key"],
                     keys=keys[a:b] if len(keys) else keys, lo=grouping["lo"],
                     remap=grouping["remap"])
    halves.each(one, range(len(parts)))


#: Up to this many ts are read by position one at a time (`_stem_ts`).
_FEW_TS = 16


def _stem_ts(stem: DataSteM, positions: np.ndarray) -> np.ndarray:
    """The ts of retained `positions` of `stem` (in any order: the groups' newest in key
    order): an AggregateIndex's `ts_at`, bound to the stem alone (bound to its sink, it
    would make a cycle, sink to index to sink, and the index's arrays would outlive an
    unregister until the garbage collector's next pass). A few are read one by one
    (O(1) each, cheaper than a gather's set-up on an invocation's path)."""
    if len(positions) > _FEW_TS:
        return stem.take([TS], positions, any_order=True)[TS]
    return np.array([stem.ts_at(p) for p in positions.tolist()], np.float64)


#: Whether aggregated queries that fit (`BlockIndex.fits`) are kept by blocks; False
#: keeps every one per result (AggregateIndex), as the tests that compare the two set it.
BLOCKS = True


class AggregateSink(Sink):
    """The Sink of one aggregated selection query: its matches, as the eddy finds them,
    added to its index (Sect. 6: kept as results arrive, read at invocation). The index
    is a BlockIndex (counts, sums and extremes per block of positions, read in place
    from the stream) for a query that fits one, else an AggregateIndex (every result,
    with the columns it reads); a BlockIndex whose GROUP BY keys outgrow it is replaced
    by an AggregateIndex rebuilt from the stream, once. O(matches + groups touched) per
    event.

    Example:
        >>> from psoup.query.model import SelectItem, Source, StreamSchema, Window
        >>> from psoup.stems.batch import make_batch
        >>> from psoup.stems.data_stem import DataSteM
        >>> q = Query("", (Source("R", "R", Window()),), (SelectItem(0, "a", "sum(a)", "sum"),))
        >>> stem = DataSteM(StreamSchema("R", (("a", "int"),)))
        >>> sink = AggregateSink(q, 0, stem)
        >>> batch = make_batch(stem.schema, [(4,), (5,)], [1.0, 2.0], 0, stem.last_ts)
        >>> stem.append(batch, np.array([0, 1]))
        0
        >>> sink.on_insert("R", 0, np.array([[1], [1]], dtype="<u8"), batch.columns)
        >>> sink.index.answer(0, 2).rows
        [(9,)]
    """

    def __init__(self, query: Query, slot: int, stem: DataSteM, blocks: bool | None = None):
        self.query = query
        aggregator = Aggregator(query)
        self.index: AggregateIndex | BlockIndex
        if (BLOCKS if blocks is None else blocks) and BlockIndex.fits(aggregator, stem):
            self.index = BlockIndex(aggregator, stem, query.sources[0])
        else:
            self.index = AggregateIndex(aggregator, partial(_stem_ts, stem))
        self.slot = slot
        self.stem = stem
        self.columns = [column for _, column in aggregator.needed]
        # an index built ahead, off the engine's lock, from the matches below a position
        # (`adopt`), which `on_register` completes
        self._ahead: tuple[AggregateIndex | BlockIndex, int] | None = None

    def adopt(self, index: AggregateIndex | BlockIndex, below: int) -> None:
        """Take `index`, built by `index_over` from the matches below position `below`,
        as what `on_register` completes with the later matches."""
        self._ahead = (index, below)

    def on_register(self, slot: int, stream: str, positions: np.ndarray) -> None:
        if self._ahead is not None:
            (self.index, below), self._ahead = self._ahead, None
            positions = positions[np.searchsorted(positions, below):]
            if isinstance(self.index, BlockIndex):
                self.index.stem = self.stem                     # it read the copy
                self.index.expire(self.stem.horizon)
                self._fold(positions)
                return
            self.index.ts_at = partial(_stem_ts, self.stem)     # it read the copy's
            self.index.expire(self.stem.horizon)
            if len(positions):
                values = self.stem.take(self.columns, positions)
                self.index.append(positions, values, None)
            return
        if isinstance(self.index, BlockIndex):
            self._fold(positions)
            return
        self._load(positions)

    def _load(self, positions: np.ndarray) -> None:
        """The matches at `positions` into the AggregateIndex: in bulk into an empty
        one (grouped and copied in compiled passes), else appended."""
        assert isinstance(self.index, AggregateIndex), "per result"
        names = [c if isinstance(c, str) else c[1] for c in self.index.rows[1:]]
        dtypes = self.stem.wide_dtypes(names)
        if dtypes is not None and not len(self.index) and len(positions):
            parts = halves.split(positions, self.stem.threads)
            sizes, keys, grouping = _bulk_groups(
                self.stem, [c for _, c in self.index.aggregator.group_by], positions, parts)
            self.index.load(np.sum(sizes, axis=0), keys, dtypes,
                            partial(_scatter_parts, self.stem, names, positions, parts,
                                    sizes, grouping))
            return
        self.index.append(positions, self.stem.take(self.columns, positions), None)

    def _fold(self, positions: np.ndarray) -> None:
        """`BlockIndex.fold`; when the keys outgrow it, the query moves to an
        AggregateIndex of every retained match, probed again. O(retained) then, once."""
        assert isinstance(self.index, BlockIndex), "by blocks"
        try:
            self.index.fold(positions)
        except SpanExceeded:
            self.index = AggregateIndex(Aggregator(self.query), partial(_stem_ts, self.stem))
            self._load(self.stem.probe(self.query.sources[0]))

    def on_insert(self, stream: str, p0: int, bits: np.ndarray,
                  batch: Mapping[str, np.ndarray]) -> None:
        rows = slot_rows(bits, self.slot)
        positions = p0 + rows
        keep = positions >= self.stem.horizon           # a batch longer than retention
        rows, positions = rows[keep], positions[keep]
        self.index.expire(self.stem.horizon)
        if isinstance(self.index, BlockIndex):
            self._fold(positions)
            return
        self.index.append(positions, {c: batch[c][rows] for c in self.columns}, None)

    def on_expire(self, stream: str, horizon: int) -> None:
        self.index.expire(horizon)

    def nbytes(self) -> int:
        return self.index.nbytes()


def index_over(query: Query, stem: DataSteM, positions: np.ndarray
               ) -> AggregateIndex | BlockIndex:
    """The AggregateIndex of aggregated `query` over its matches at `positions` of
    `stem` (a copy of the stream, read off the engine's lock), built as
    `AggregateSink.on_register` builds it. O(matches), a sort for other than one
    small-range INT key."""
    sink = AggregateSink(query, -1, stem)
    sink.on_register(-1, stem.schema.name, positions)
    return sink.index


def scanned_index(query: Query, stem: DataSteM
                  ) -> tuple[np.ndarray, AggregateIndex | BlockIndex] | None:
    """The matches of aggregated `query` among `stem`'s retained tuples and its index
    over them, both from one pass over the chunks: a BlockIndex's `scan` when the
    query is kept by blocks, else (without GROUP BY) `DataSteM.probe_gather`, the
    positions and summed columns taken as the factors are tested, into the storage the
    AggregateIndex then keeps (the positions are its row 0). None when that pass does
    not apply (a factor that is not an interval, a grouped query not kept by blocks,
    keys too wide for blocks): then `probe` and `index_over`. O(retained + matches)."""
    aggregator = Aggregator(query)
    if BLOCKS and BlockIndex.fits(aggregator, stem):
        blocks = BlockIndex(aggregator, stem, query.sources[0])
        try:
            found = blocks.scan()
        except SpanExceeded:
            return None
        return None if found is None else (found, blocks)
    index = AggregateIndex(aggregator, partial(_stem_ts, stem))
    names = [c if isinstance(c, str) else c[1] for c in index.rows[1:]]
    dtypes = stem.wide_dtypes(names)
    if index.aggregator.group_by or dtypes is None:
        return None
    got = stem.probe_gather(query.sources[0], names)
    if got is None:
        return None
    storage, n = got
    if storage.shape[1] > 2 * (n + n // 2 + _MIN_CAPACITY):      # mostly room: trim it
        storage = storage[:, :n + n // 2 + _MIN_CAPACITY].copy()
    index.load_one(storage, n, dtypes)
    return storage[0, :n].view(np.int64), index
