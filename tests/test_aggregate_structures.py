"""The aggregate structures of PSoup Sect. 6 (psoup/results/aggregates.py): Fig. 14's ranked
tree, prefix sums, and AggregateIndex checked against direct evaluation
(Aggregator.compute) and a brute force in plain Python.

Integers, NULLs (None), MIN, MAX, group order and the Python types of every value must match
exactly. SUM and AVG over FLOAT are compared with math.fsum of the same rows under the
module's stated tolerance: 1e-12 relative plus 1e-15 * sum(|x|) over the rows the group's
structure may still store (its live rows and at most as many expired ones before them);
AVG's absolute part is divided by COUNT.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeAlias

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings
from numpy.typing import NDArray

from psoup.query.model import INT64_MAX, INT64_MIN, Query, SelectItem, Source, Window
from psoup.results.aggregates import AggregateIndex, Aggregator, PrefixSums, RankedTree
from psoup.results.result import Result

#: One row of the brute force: its columns by name, "pos" its position.
Row: TypeAlias = dict[str, Any]

# Fig. 14: leaves t1..t24 in insertion order. [t8, t20] holds 20, 15, 19, 22 and 21 (its
# max is 22, its min 2); just outside it sit 26 (t7) and 24 (t21), further out 30 (t3),
# 25 (t22) and the overall min 1 (t23).
FIG14 = [5, 12, 30, 7, 9, 11, 26, 20, 3, 15, 8, 19, 6, 22, 10, 21, 4, 13, 2, 17, 24, 25, 1, 14]

INT_COLUMNS = {"k", "i", "tupleID"}
FLOAT_COLUMNS = {"f", "ts"}
DTYPES = {"k": np.int64, "i": np.int64, "tupleID": np.int64, "f": np.float64,
          "ts": np.float64, "t": object, "b": bool}
TEXTS = ["", "a", "ab", "b", "é", "Z"]


def leaf(t: int) -> int:
    """The index of leaf t_i (t1 is index 0)."""
    return t - 1


@pytest.mark.parametrize("branching", [2, 3, 4, 32])
def test_fig14_range_t8_t20_has_max_22(branching: int) -> None:
    tree = RankedTree(np.dtype(np.int64), branching=branching)
    tree.append(np.array(FIG14))
    assert tree.range_max(leaf(8), leaf(20) + 1) == 22
    assert tree.range_min(leaf(8), leaf(20) + 1) == 2
    assert tree.range_max(0, 24) == 30 and tree.range_min(0, 24) == 1


def test_fig14_tree_built_leaf_by_leaf_answers_the_same() -> None:
    tree = RankedTree(np.dtype(np.int64), branching=3)
    for value in FIG14:
        tree.append(np.array([value]))
    assert tree.range_max(leaf(8), leaf(20) + 1) == 22
    assert type(tree.range_max(leaf(8), leaf(20) + 1)) is int


def test_ranked_tree_refuses_an_empty_range() -> None:
    tree = RankedTree(np.dtype(np.int64))
    tree.append(np.array([1, 2]))
    with pytest.raises(IndexError):
        tree.range_max(1, 1)


@settings(max_examples=max(20, settings().max_examples // 5), deadline=None)
@given(st.sampled_from([2, 3, 5, 32]), st.sampled_from([np.int64, np.float64]), st.data())
def test_ranked_tree_matches_brute_force(branching: int, dtype: type[np.generic],
                                         data: st.DataObject) -> None:
    tree = RankedTree(np.dtype(dtype), branching=branching)
    live: list[Any] = []
    values = (st.integers(INT64_MIN, INT64_MAX) if dtype is np.int64
              else st.floats(-1e300, 1e300, allow_nan=False))
    for _ in range(data.draw(st.integers(1, 12))):
        batch = data.draw(st.lists(values, max_size=80))
        tree.append(np.array(batch, dtype=dtype))
        live += batch
        if bool(live) and data.draw(st.booleans()):     # bool(): draw's type is not live's
            k = data.draw(st.integers(0, len(live)))
            tree.drop(k)
            live = live[k:]
        assert len(tree) == len(live)
        for _ in range(3):
            if not live:
                break
            i = data.draw(st.integers(0, len(live) - 1))
            j = data.draw(st.integers(i + 1, len(live)))
            assert tree.range_max(i, j) == max(live[i:j])
            assert tree.range_min(i, j) == min(live[i:j])


def test_ranked_tree_memory_follows_the_live_leaves() -> None:
    tree = RankedTree(np.dtype(np.int64), branching=4)
    tree.append(np.arange(100_000))
    big = tree.nbytes()
    tree.drop(99_990)
    assert len(tree) == 10 and tree.nbytes() < big / 1000
    assert tree.range_min(0, 10) == 99_990


def test_int_sums_are_exact_beyond_int64() -> None:
    sums = PrefixSums(np.dtype(np.int64))
    sums.append(np.array([INT64_MAX] * 5 + [INT64_MIN] * 3))
    assert sums.range_sum(0, 5) == 5 * INT64_MAX
    assert sums.range_sum(3, 8) == 2 * INT64_MAX + 3 * INT64_MIN
    assert type(sums.range_sum(0, 5)) is int


def test_int_sums_stay_exact_when_the_prefixes_wrap_around() -> None:
    sums = PrefixSums(np.dtype(np.int64))
    sums._prefix.data[0] = INT64_MAX - 1     # as if 2**31 rows had gone before
    sums.append(np.array([INT64_MAX, INT64_MAX, -1, INT64_MIN]))
    assert sums.range_sum(0, 4) == 2 * INT64_MAX - 1 + INT64_MIN
    assert sums.range_sum(1, 3) == INT64_MAX - 1


def test_float_sums_do_not_inherit_the_rounding_of_earlier_values() -> None:
    sums = PrefixSums(np.dtype(np.float64))
    sums.append(np.array([1e17] + [0.1] * 10))
    assert math.isclose(sums.range_sum(1, 11), math.fsum([0.1] * 10), rel_tol=1e-15)
    sums.drop(1)
    assert math.isclose(sums.range_sum(0, 10), math.fsum([0.1] * 10), rel_tol=1e-15)


def test_float_sums_survive_infinite_values_and_overflow() -> None:
    sums = PrefixSums(np.dtype(np.float64))
    sums.append(np.array([1.0, np.inf, 2.0, 1e308, 1e308, 3.0]))
    assert sums.range_sum(0, 2) == math.inf
    assert sums.range_sum(2, 3) == 2.0
    assert sums.range_sum(3, 4) == 1e308
    assert sums.range_sum(5, 6) == 3.0


# ---- AggregateIndex and Aggregator.compute against a brute force ----------------------

def make_query(group_by: list[str], items: list[tuple[str | None, str]]) -> Query:
    """A single-source query over R; items are (agg, column), agg None for a key column."""
    select = tuple(SelectItem(0, column, f"{agg}({column})#{n}" if agg else column, agg)
                   for n, (agg, column) in enumerate(items))
    return Query(sql="", sources=(Source("R", "R", Window()),), select=select,
                 group_by=tuple((0, c) for c in group_by))


@st.composite
def queries(draw: st.DrawFn) -> Query:
    group_by = draw(st.lists(st.sampled_from(["k", "t", "b", "i"]), unique=True, max_size=2))
    aggregate = st.one_of(
        st.tuples(st.just("count"), st.sampled_from(["*", "i", "t", "b"])),
        st.tuples(st.sampled_from(["sum", "avg", "min", "max"]),
                  st.sampled_from(["i", "f", "k", "ts", "tupleID"])))
    keys = draw(st.lists(st.sampled_from(group_by), unique=True)) if group_by else []
    items = [(None, c) for c in keys] + draw(
        st.lists(aggregate, min_size=0 if keys else 1, max_size=5))
    return make_query(group_by, draw(st.permutations(items)))


INTS = st.one_of(st.integers(-5, 5), st.integers(INT64_MIN, INT64_MIN + 5),
                 st.integers(INT64_MAX - 5, INT64_MAX), st.integers(INT64_MIN, INT64_MAX))
FLOATS = st.one_of(st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([0.1, -0.0, 1e17]),
                   st.floats(-1e15, 1e15, allow_nan=False))
ROWS = st.fixed_dictionaries({"k": st.integers(0, 3), "i": INTS, "f": FLOATS,
                              "t": st.sampled_from(TEXTS), "b": st.booleans()})


class History:
    """Every row appended to an AggregateIndex, with the horizon expired so far."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.horizon = 0

    def append(self, rows: list[Row], gaps: list[int], steps: list[float]) -> list[Row]:
        position = self.rows[-1]["pos"] if self.rows else -1
        ts = self.rows[-1]["ts"] if self.rows else 1000.0
        new = []
        for row, gap, step in zip(rows, gaps, steps, strict=True):
            position, ts = position + 1 + gap, ts + step
            new.append({**row, "pos": position, "ts": ts, "tupleID": position + 7})
        self.rows += new
        return new

    def live(self, p0: int, p1: int) -> list[Row]:
        return [r for r in self.rows if max(p0, self.horizon) <= r["pos"] < p1]

    def stored_abs(self, query: Query, key: tuple[Any, ...], column: str) -> float:
        """sum(|x|) over the rows the group's structure may store: its last 2 * live rows."""
        group = [r for r in self.rows if group_key(query, r) == key]
        live = sum(r["pos"] >= self.horizon for r in group)
        return math.fsum(abs(r[column]) for r in group[max(0, len(group) - 2 * live):])


def group_key(query: Query, row: Row) -> tuple[Any, ...]:
    return tuple(row[c] for _, c in query.group_by)


def columns_of(rows: list[Row], names: Iterable[str]) -> dict[str, NDArray[Any]]:
    return {c: np.array([r[c] for r in rows], dtype=DTYPES[c]) for c in names}


def brute_force(query: Query,
                rows: list[Row]) -> tuple[list[tuple[Any, ...]], list[float], list[list[Row]]]:
    """The expected rows, each group's latest ts, and each group's rows, in key order."""
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        groups.setdefault(group_key(query, r), []).append(r)
    if not groups and not query.group_by:
        groups[()] = []
    keys = [c for _, c in query.group_by]
    out: list[tuple[Any, ...]] = []
    latest: list[float] = []
    members: list[list[Row]] = []
    for key in sorted(groups):
        g = groups[key]
        row: list[Any] = []
        for item in query.select:
            values = [r[item.column] for r in g] if item.column != "*" else []
            if item.agg is None:
                row.append(key[keys.index(item.column)])
            elif item.agg == "count":
                row.append(len(g))
            elif not g:
                row.append(None)
            elif item.agg in ("sum", "avg"):
                total = sum(values) if item.column in INT_COLUMNS else math.fsum(values)
                row.append(total if item.agg == "sum" else total / len(g))
            else:
                row.append(min(values) if item.agg == "min" else max(values))
        out.append(tuple(row))
        latest.append(max((r["ts"] for r in g), default=math.nan))
        members.append(g)
    return out, latest, members


def check(query: Query, got: Result, rows: list[Row],
          abs_of: Callable[[tuple[Any, ...], str], float]) -> None:
    """`got` equals the brute force over `rows`; abs_of(key, column) bounds a float SUM's
    absolute error (before the division of AVG)."""
    want, latest, members = brute_force(query, rows)
    assert got.columns == query.columns
    assert len(got.rows) == len(want)
    np.testing.assert_array_equal(got.ts, np.array(latest))
    assert got.tuple_ids.tolist() == [-1] * len(want)
    for got_row, want_row, group in zip(got.rows, want, members, strict=True):
        key = group_key(query, group[0]) if group else ()
        for item, g, w in zip(query.select, got_row, want_row, strict=True):
            assert type(g) is type(w), (item, g, w)
            if item.agg in ("sum", "avg") and item.column in FLOAT_COLUMNS and w is not None:
                bound = abs_of(key, item.column) / (len(group) if item.agg == "avg" else 1)
                assert math.isclose(g, w, rel_tol=1e-12, abs_tol=bound), (item, g, w)
            else:
                assert g == w, (item, g, w)


def abs_bound(rows: list[Row], key: tuple[Any, ...], column: str) -> float:
    """The absolute error bound of a float SUM over exactly `rows`."""
    return 1e-15 * math.fsum(abs(r[column]) for r in rows)


def compute_over(query: Query, rows: list[Row]) -> Result:
    aggregator = Aggregator(query)
    values = {(0, c): columns_of(rows, [c])[c] for _, c in aggregator.needed}
    return aggregator.compute(values, np.array([r["ts"] for r in rows], dtype=np.float64))


@settings(max_examples=max(30, settings().max_examples // 2), deadline=None)
@given(queries(), st.data())
def test_index_answers_any_range_like_direct_evaluation(query: Query,
                                                        data: st.DataObject) -> None:
    index = AggregateIndex(Aggregator(query))
    needed = [c for _, c in index.aggregator.needed]
    history = History()
    for _ in range(data.draw(st.integers(1, 8))):
        rows = data.draw(st.lists(ROWS, max_size=25))
        gaps = data.draw(st.lists(st.integers(0, 2), min_size=len(rows), max_size=len(rows)))
        steps = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=len(rows),
                                   max_size=len(rows)))
        new = history.append(rows, gaps, steps)
        index.append(np.array([r["pos"] for r in new], dtype=np.int64), columns_of(new, needed),
                     np.array([r["ts"] for r in new], dtype=np.float64))
        end = history.rows[-1]["pos"] + 1 if history.rows else 0
        if data.draw(st.booleans()):
            horizon = data.draw(st.integers(0, end))
            index.expire(horizon)
            history.horizon = max(history.horizon, horizon)
        for _ in range(2):
            p0 = data.draw(st.integers(-1, end + 1))
            p1 = data.draw(st.integers(p0, end + 2))
            rows_in = history.live(p0, p1)
            check(query, index.answer(p0, p1), rows_in,
                  lambda key, column: 1e-15 * history.stored_abs(query, key, column))
            check(query, compute_over(query, rows_in), rows_in,
                  partial(abs_bound, rows_in))
        assert len(index) == len(history.live(0, end))


def test_index_with_many_rows_per_group_matches_direct_evaluation() -> None:
    """Groups of thousands of rows, so that the ranked trees have several levels."""
    rng = np.random.default_rng(7)
    query = make_query(["k"], [(None, "k"), ("count", "*"), ("sum", "i"), ("avg", "f"),
                               ("min", "f"), ("max", "i"), ("max", "ts"), ("sum", "f")])
    index = AggregateIndex(Aggregator(query))
    rows, position, horizon = [], 0, 0
    for _ in range(40):
        n = int(rng.integers(1, 2000))
        positions = position + np.cumsum(rng.integers(1, 3, n))
        position = int(positions[-1])
        batch = {"k": rng.integers(0, 3, n), "i": rng.integers(INT64_MIN, INT64_MAX, n),
                 "f": rng.normal(0, 1e6, n), "ts": positions / 10.0}
        index.append(positions, batch, batch["ts"])
        rows += [{"pos": p, "k": k, "i": i, "f": f, "ts": t} for p, k, i, f, t in zip(
            positions.tolist(), *(batch[c].tolist() for c in ("k", "i", "f", "ts")),
            strict=True)]
        horizon = max(horizon, int(rng.integers(0, position)))
        index.expire(horizon)
        p0 = int(rng.integers(0, position))
        p1 = int(rng.integers(p0, position + 2))
        rows_in = [r for r in rows if max(p0, horizon) <= r["pos"] < p1]
        got, want = index.answer(p0, p1), compute_over(query, rows_in)
        exact = [0, 1, 2, 4, 5, 6]
        assert [[row[c] for c in exact] for row in got.rows] == [
            [row[c] for c in exact] for row in want.rows]
        for g, w in zip(got.rows, want.rows, strict=True):
            assert g[3] == pytest.approx(w[3], rel=1e-12, abs=1e-3)
            assert g[7] == pytest.approx(w[7], rel=1e-12, abs=1e-3)
        np.testing.assert_array_equal(got.ts, want.ts)


def test_empty_range_without_group_by_is_one_sql_row() -> None:
    query = make_query([], [("count", "*"), ("sum", "i"), ("avg", "f"), ("min", "f"),
                            ("max", "i")])
    index = AggregateIndex(Aggregator(query))
    got = index.answer(0, 10)
    assert got.rows == [(0, None, None, None, None)]
    assert np.isnan(got.ts).tolist() == [True] and got.tuple_ids.tolist() == [-1]
    index.append(np.array([5]), {"i": np.array([3]), "f": np.array([1.5])}, np.array([1.0]))
    assert index.answer(0, 5).rows == [(0, None, None, None, None)]
    assert index.answer(5, 6).rows == [(1, 3, 1.5, 1.5, 3)]


def test_empty_range_with_group_by_has_no_rows() -> None:
    query = make_query(["t"], [(None, "t"), ("count", "*")])
    index = AggregateIndex(Aggregator(query))
    assert index.answer(0, 10).rows == []
    assert compute_over(query, []).rows == []


def test_groups_come_in_key_order_across_batches() -> None:
    query = make_query(["b", "t"], [("count", "*"), (None, "t"), (None, "b")])
    index = AggregateIndex(Aggregator(query))
    index.append(np.array([0, 1, 2]), {"t": np.array(["b", "a", "é"], dtype=object),
                                       "b": np.array([True, True, False])}, np.zeros(3))
    index.append(np.array([3, 4]), {"t": np.array(["Z", "a"], dtype=object),
                                    "b": np.array([True, True])}, np.ones(2))
    assert index.answer(0, 5).rows == [(1, "é", False), (1, "Z", True), (2, "a", True),
                                       (1, "b", True)]
    assert index.answer(0, 5).ts.tolist() == [0.0, 1.0, 1.0, 0.0]


def test_output_types_follow_the_column_types() -> None:
    query = make_query([], [("count", "*"), ("sum", "i"), ("avg", "i"), ("sum", "f"),
                            ("min", "i"), ("max", "f"), ("max", "tupleID")])
    index = AggregateIndex(Aggregator(query))
    index.append(np.array([0, 1]), {"i": np.array([INT64_MAX, INT64_MAX]),
                                    "f": np.array([1.0, 2.0]), "tupleID": np.array([4, 9])},
                 np.array([1.0, 2.0]))
    row = index.answer(0, 2).rows[0]
    assert row == (2, 2 * INT64_MAX, float(INT64_MAX), 3.0, INT64_MAX, 2.0, 9)
    assert [type(v) for v in row] == [int, int, float, float, int, float, int]


def test_needed_lists_group_by_columns_then_aggregated_ones_once() -> None:
    query = make_query(["t"], [("max", "f"), ("count", "i"), ("sum", "f"), (None, "t"),
                               ("min", "ts"), ("avg", "i")])
    assert Aggregator(query).needed == [(0, "t"), (0, "f"), (0, "ts"), (0, "i")]


def test_expired_groups_leave_the_index() -> None:
    query = make_query(["i"], [(None, "i"), ("sum", "f")])
    index = AggregateIndex(Aggregator(query))
    n = 10_000
    index.append(np.arange(n), {"i": np.arange(n), "f": np.ones(n)}, np.zeros(n))
    big = index.nbytes()
    index.expire(n - 3)
    assert len(index) == 3 and index.nbytes() < big / 1000
    assert index.answer(0, n).rows == [(n - 3, 1.0), (n - 2, 1.0), (n - 1, 1.0)]


def test_a_sliding_window_keeps_memory_proportional_to_the_window() -> None:
    query = make_query([], [("count", "*"), ("max", "i")])
    index = AggregateIndex(Aggregator(query))
    sizes = []
    for p in range(0, 200_000, 1000):
        index.append(np.arange(p, p + 1000), {"i": np.arange(p, p + 1000)}, np.zeros(1000))
        index.expire(p - 4000)
        sizes.append(index.nbytes())
    assert max(sizes[20:]) < 4 * min(sizes[20:])
    assert index.answer(0, 10**9).rows == [(5000, 199_999)]


@settings(max_examples=max(20, settings().max_examples // 5), deadline=None)
@given(st.sampled_from(["min", "max"]), st.sampled_from([np.int64, np.float64]),
       st.lists(st.tuples(st.lists(st.integers(-2**63, 2**63 - 1) | st.integers(-3, 3),
                                   max_size=12), st.integers(0, 6)), min_size=1, max_size=8),
       st.data())
def test_suffix_extremes_answer_every_suffix_like_brute_force(
        op: str, dtype: type[np.generic], steps: list[tuple[list[int], int]],
        data: st.DataObject) -> None:
    """Windows ending at the newest result: SuffixExtremes against min/max of the slice,
    through appends (ties, int64 limits) and expiries."""
    from psoup.results.aggregates import SuffixExtremes
    s = SuffixExtremes(np.dtype(dtype), op)
    live: list[Any] = []
    for batch, drop in steps:
        values = np.array(batch, dtype=dtype)
        s.append(values)
        live += values.tolist()
        drop = min(drop, len(live))
        s.drop(drop)
        live = live[drop:]
        if live:
            i = data.draw(st.integers(0, len(live) - 1))
            assert s.reduce(i) == (max if op == "max" else min)(live[i:])
