"""The query language's joins (docs/language.md, `col op col [+|- number]`;
docs/semantics.md, "Joins"): FROM lists, name resolution, join factors, output names and
windows."""

from __future__ import annotations

import math

import pytest

from psoup.errors import QueryError
from psoup.query import compile_statement
from psoup.query.model import (
    AttrPredicate,
    ColumnFactor,
    ColumnType,
    CompareOp,
    JoinFactor,
    Query,
    SelectItem,
    StreamSchema,
    TimeExpr,
    Window,
    WindowType,
)

R = StreamSchema(
    "R", (("a", "int"), ("b", "int"), ("x", "float"), ("y", "float"), ("name", "text"),
          ("flag", "bool"))
)  # fmt: skip
S = StreamSchema("S", (("a", "int"), ("c", "float"), ("label", "text"), ("ok", "bool")))
TRAFFIC = StreamSchema(
    "traffic", (("lane", "int"), ("stationid", "int"), ("speed", "float"), ("road", "text"))
)
SCHEMAS = {"R": R, "S": S, "traffic": TRAFFIC}


def query(sql: str) -> Query:
    q = compile_statement(sql, SCHEMAS)
    assert isinstance(q, Query)
    return q


def joins(where: str, from_: str = "R, S") -> tuple[JoinFactor, ...]:
    return query(f"SELECT * FROM {from_} WHERE {where}").joins


def error(sql: str) -> QueryError:
    with pytest.raises(QueryError) as info:
        compile_statement(sql, SCHEMAS)
    return info.value


def relative(seconds: float) -> TimeExpr:
    return TimeExpr(True, float(seconds))


# FROM lists


def test_two_item_from_list_gives_one_source_per_item() -> None:
    q = query("SELECT * FROM R, S")
    assert [(s.stream, s.alias) for s in q.sources] == [("R", "R"), ("S", "S")]
    assert q.joins == () and not q.contradiction


def test_three_item_from_list_keeps_from_order_and_aliases() -> None:
    q = query("SELECT * FROM traffic t, R, S AS s")
    assert [(s.stream, s.alias) for s in q.sources] == [("traffic", "t"), ("R", "R"), ("S", "s")]


def test_self_join_names_one_stream_under_two_aliases() -> None:
    q = query("SELECT * FROM R r1, R r2 WHERE r1.a = r2.a")
    assert [(s.stream, s.alias) for s in q.sources] == [("R", "r1"), ("R", "r2")]
    assert q.joins == (JoinFactor(0, "a", CompareOp.EQ, 1, "a"),)


def test_self_join_may_leave_one_item_unaliased() -> None:
    q = query("SELECT * FROM R, R r2 WHERE R.b < r2.b")
    assert [s.alias for s in q.sources] == ["R", "r2"]
    assert q.joins == (JoinFactor(0, "b", CompareOp.LT, 1, "b"),)


def test_same_stream_twice_without_aliases_is_an_error() -> None:
    e = error("SELECT * FROM R, R")
    assert str(e) == (
        "line 1, column 18: duplicate name 'R' in FROM: give each item its own alias "
        "(FROM R r1, R r2)"
    )


def test_duplicate_alias_is_an_error_at_the_second_alias() -> None:
    e = error("SELECT * FROM R x, S x")
    assert str(e) == "line 1, column 22: duplicate alias 'x' in FROM"


def test_alias_equal_to_another_items_stream_name_is_a_duplicate() -> None:
    e = error("SELECT * FROM S R, R")
    assert "duplicate name 'R' in FROM" in str(e)
    assert (e.line, e.column) == (1, 20)


def test_unknown_stream_in_a_join_is_an_error_at_its_item() -> None:
    e = error("SELECT * FROM R, Q")
    assert str(e) == "line 1, column 18: unknown stream 'Q' (streams: R, S, traffic)"


def test_alias_after_the_window_is_an_error() -> None:
    e = error("SELECT * FROM R [ROWS 10] r, S")
    assert str(e) == "line 1, column 27: the alias goes before the window: FROM R alias [...]"


# column references


def test_bare_column_names_the_only_item_that_has_it() -> None:
    q = query("SELECT lane, b FROM traffic, R WHERE speed > 1 AND x < 2")
    assert q.select == (SelectItem(0, "lane", "lane"), SelectItem(1, "b", "b"))
    assert q.sources[0].predicates == (
        AttrPredicate("speed", ColumnType.FLOAT, lo=1.0, lo_open=True),
    )
    assert q.sources[1].predicates == (AttrPredicate("x", ColumnType.FLOAT, hi=2.0, hi_open=True),)


def test_stream_name_qualifies_an_aliased_item_when_the_stream_appears_once() -> None:
    assert query("SELECT R.b FROM R r, S").select == (SelectItem(0, "b", "b"),)


def test_a_qualifier_names_an_alias_before_a_stream() -> None:
    q = query("SELECT R.a FROM S R, R r")
    assert q.select == (SelectItem(0, "a", "a"),)


def test_ambiguous_bare_column_is_an_error() -> None:
    e = error("SELECT * FROM R r1, R r2 WHERE a > 1")
    assert str(e) == "line 1, column 32: ambiguous column 'a' (in r1, r2): qualify it"


def test_bare_ts_and_tupleid_are_ambiguous_in_a_join() -> None:
    assert "ambiguous column 'ts' (in R, S)" in str(error("SELECT ts FROM R, S"))
    assert "ambiguous column 'tupleID' (in R, S)" in str(
        error("SELECT * FROM R, S WHERE tupleID > 3")
    )


def test_ambiguity_lists_only_the_items_that_have_the_column() -> None:
    e = error("SELECT * FROM R, traffic, S WHERE a = 1")
    assert "ambiguous column 'a' (in R, S): qualify it" in str(e)


def test_bare_column_in_no_item_lists_each_stream_once() -> None:
    e = error("SELECT zz FROM R r1, R r2, S")
    assert str(e) == (
        "line 1, column 8: unknown column 'zz' in FROM "
        "(R: a, b, x, y, name, flag; S: a, c, label, ok)"
    )


def test_unknown_qualified_column_names_its_stream_at_the_column() -> None:
    e = error("SELECT r2.zz FROM R r1, R r2")
    assert str(e) == (
        "line 1, column 11: unknown column 'zz' in stream 'R' (columns: a, b, x, y, name, flag)"
    )


def test_unknown_qualifier_lists_the_from_items() -> None:
    e = error("SELECT q.a FROM R r1, S")
    assert str(e) == "line 1, column 8: unknown stream or alias 'q' in 'q.a' (FROM: r1 (R), S)"


def test_qualifier_naming_a_stream_outside_from_is_an_error() -> None:
    e = error("SELECT * FROM R, S WHERE R.a = traffic.lane")
    assert str(e) == (
        "line 1, column 32: stream 'traffic' in 'traffic.lane' is not in FROM (FROM: R, S)"
    )


def test_stream_name_of_a_self_joined_stream_is_an_error() -> None:
    e = error("SELECT R.a FROM R r1, R r2")
    assert str(e) == (
        "line 1, column 8: stream 'R' appears more than once in FROM (as r1, r2): qualify "
        "'R.a' with one of its aliases"
    )


# join factors


def test_comparison_between_items_is_a_join_factor_not_a_local_one() -> None:
    q = query("SELECT * FROM R, S WHERE R.a = S.a")
    assert q.joins == (JoinFactor(0, "a", CompareOp.EQ, 1, "a", 0),)
    assert all(s.predicates == () and s.column_factors == () for s in q.sources)


def test_bare_columns_of_two_items_make_a_join_factor() -> None:
    assert joins("b = lane", "R, traffic") == (JoinFactor(0, "b", CompareOp.EQ, 1, "lane"),)


@pytest.mark.parametrize("op", ["=", "!=", "<", "<=", ">", ">="])
def test_join_factor_in_from_order_keeps_its_operator(op: str) -> None:
    assert joins(f"R.b {op} S.a") == (JoinFactor(0, "b", CompareOp(op), 1, "a"),)


@pytest.mark.parametrize(
    "op, flipped",
    [("<", CompareOp.GT), ("<=", CompareOp.GE), (">", CompareOp.LT), (">=", CompareOp.LE),
     ("=", CompareOp.EQ), ("!=", CompareOp.NE), ("<>", CompareOp.NE)],
)
def test_join_factor_with_the_later_item_on_the_left_swaps_and_flips(
        op: str, flipped: CompareOp) -> None:
    assert joins(f"S.a {op} R.b") == (JoinFactor(0, "b", flipped, 1, "a"),)


def test_diamond_becomes_bang_equal_in_a_join_factor() -> None:
    assert joins("R.b <> S.a") == (JoinFactor(0, "b", CompareOp.NE, 1, "a"),)


@pytest.mark.parametrize(
    "where, expected",
    [("R.a < S.a + 3", JoinFactor(0, "a", CompareOp.LT, 1, "a", 3)),
     ("R.a < S.a - 3", JoinFactor(0, "a", CompareOp.LT, 1, "a", -3)),
     ("S.a < R.a + 3", JoinFactor(0, "a", CompareOp.GT, 1, "a", 0, 3)),
     ("S.a < R.a - 3", JoinFactor(0, "a", CompareOp.GT, 1, "a", 0, -3)),
     ("S.a >= R.b - -2", JoinFactor(0, "b", CompareOp.LE, 1, "a", 0, 2))],
)  # fmt: skip
def test_join_factor_offset_stays_with_its_column_when_the_sides_swap(
        where: str, expected: JoinFactor) -> None:
    (factor,) = joins(where)
    assert factor == expected
    assert type(factor.offset) is int and type(factor.left_offset) is int


@pytest.mark.parametrize(
    "where, expected",
    [("R.x = S.c + 0.5", JoinFactor(0, "x", CompareOp.EQ, 1, "c", 0.5)),
     ("S.c >= R.x + 0.5", JoinFactor(0, "x", CompareOp.LE, 1, "c", 0, 0.5)),
     ("S.c > R.a - 2.5", JoinFactor(0, "a", CompareOp.LT, 1, "c", 0, -2.5))],
)  # fmt: skip
def test_float_offsets_stay_floats_when_a_float_is_compared(
        where: str, expected: JoinFactor) -> None:
    (factor,) = joins(where)
    assert factor == expected
    assert type(factor.offset + factor.left_offset) is float


@pytest.mark.parametrize(
    "where, expected",
    [("R.a = S.a + 2.0", JoinFactor(0, "a", CompareOp.EQ, 1, "a", 2)),
     ("S.a > R.a - 2.5", JoinFactor(0, "a", CompareOp.LT, 1, "a", 0, -3)),   # S.a - R.a > -2.5
     ("R.b < S.a + 0.5", JoinFactor(0, "b", CompareOp.LE, 1, "a", 0)),      # R.b - S.a <= 0
     ("R.b >= S.a - 0.5", JoinFactor(0, "b", CompareOp.GT, 1, "a", -1))],    # R.b - S.a >= 0
)  # fmt: skip
def test_fractional_offsets_between_int_columns_become_integer_ones(
        where: str, expected: JoinFactor) -> None:
    (factor,) = joins(where)
    assert factor == expected
    assert type(factor.offset) is int and type(factor.left_offset) is int


@pytest.mark.parametrize("where", ["R.a = S.a + 0.5", "S.a = R.b - 2.25"])
def test_an_int_join_factor_that_no_integers_satisfy_makes_a_contradiction(where: str) -> None:
    q = query(f"SELECT * FROM R, S WHERE {where}")
    assert q.contradiction and q.joins == ()


@pytest.mark.parametrize("where", ["R.a != S.a + 0.5", "S.a <> R.b - 2.25"])
def test_an_int_join_factor_that_every_pair_satisfies_is_dropped(where: str) -> None:
    q = query(f"SELECT * FROM R, S WHERE {where}")
    assert not q.contradiction and q.joins == ()


def test_swapped_zero_float_offset_is_positive_zero() -> None:
    (factor,) = joins("S.c < R.x + 0.0")
    assert factor == JoinFactor(0, "x", CompareOp.GT, 1, "c", 0, 0.0)
    assert math.copysign(1.0, factor.left_offset) == 1.0


def test_ts_and_tupleid_in_join_factors() -> None:
    assert joins("r2.ts > r1.ts + 10 AND r1.tupleID < r2.tupleID", "R r1, R r2") == (
        JoinFactor(0, "ts", CompareOp.LT, 1, "ts", 0, 10),
        JoinFactor(0, "tupleID", CompareOp.LT, 1, "tupleID"),
    )


def test_join_factor_may_compare_int_with_float() -> None:
    assert joins("S.c <= R.a") == (JoinFactor(0, "a", CompareOp.GE, 1, "c"),)


def test_join_factors_of_a_three_way_join_name_their_items() -> None:
    assert joins("traffic.lane = R.a AND S.a < traffic.stationid", "R, S, traffic") == (
        JoinFactor(0, "a", CompareOp.EQ, 2, "lane"),
        JoinFactor(1, "a", CompareOp.LT, 2, "stationid"),
    )


def test_join_factors_keep_where_order_and_drop_repeats() -> None:
    assert joins("R.b > S.a AND R.a = S.a AND S.a < R.b AND R.a = S.a") == (
        JoinFactor(0, "b", CompareOp.GT, 1, "a"),
        JoinFactor(0, "a", CompareOp.EQ, 1, "a"),
    )


def test_contradictory_join_factors_are_kept_and_not_a_contradiction() -> None:
    q = query("SELECT * FROM R, S WHERE R.a < S.a AND R.a > S.a")
    assert len(q.joins) == 2 and not q.contradiction


# local factors in a join


def test_local_factors_stay_with_their_item() -> None:
    q = query("SELECT * FROM R r1, R r2 WHERE r1.a > 5 AND r2.a < 3 AND r1.a < r1.b")
    first, second = q.sources
    assert first.predicates == (AttrPredicate("a", ColumnType.INT, lo=6),)
    assert first.column_factors == (ColumnFactor("a", CompareOp.LT, "b"),)
    assert second.predicates == (AttrPredicate("a", ColumnType.INT, hi=2),)
    assert second.column_factors == ()
    assert q.joins == ()


def test_column_factor_on_a_later_item_keeps_its_offset() -> None:
    q = query("SELECT * FROM S, R r WHERE r.x <= y - 1")
    assert q.sources[1].column_factors == (ColumnFactor("x", CompareOp.LE, "y", -1),)
    assert q.sources[0].column_factors == ()


def test_between_and_in_go_to_their_item() -> None:
    q = query("SELECT * FROM R, S WHERE S.a BETWEEN 1 AND 3 AND R.name IN ('p', 'q')")
    assert q.sources[0].predicates == (
        AttrPredicate("name", ColumnType.TEXT, eq=frozenset({"p", "q"})),
    )
    assert q.sources[1].predicates == (AttrPredicate("a", ColumnType.INT, lo=1, hi=3),)


def test_constant_on_the_left_goes_to_the_items_column() -> None:
    q = query("SELECT * FROM R, S WHERE 2 < S.c")
    assert q.sources[1].predicates == (AttrPredicate("c", ColumnType.FLOAT, lo=2.0, lo_open=True),)


@pytest.mark.parametrize(
    "where", ["R.a BETWEEN S.a AND 3", "R.a BETWEEN 1 AND S.a", "R.a IN (1, S.a)"]
)
def test_between_and_in_bounds_must_be_constants(where: str) -> None:
    assert "expected a constant" in str(error(f"SELECT * FROM R, S WHERE {where}"))


def test_contradiction_in_any_item_makes_the_query_a_contradiction() -> None:
    assert query("SELECT * FROM R, S WHERE R.a > 1 AND S.a > 5 AND S.a < 3").contradiction
    assert not query("SELECT * FROM R, S WHERE R.a > 1 AND S.a > 1").contradiction


# types across items


def test_text_with_int_across_items_names_both_columns_at_the_right_one() -> None:
    e = error("SELECT * FROM R, S WHERE R.name = S.a")
    assert str(e) == "line 1, column 35: cannot compare TEXT column 'R.name' with INT column 'S.a'"


def test_bool_with_a_number_across_items_is_an_error() -> None:
    assert "cannot compare BOOL column 's.ok' with INT column 'R.a'" in str(
        error("SELECT * FROM R, S s WHERE s.ok = R.a")
    )


def test_offset_on_a_text_column_across_items_is_an_error_at_the_sign() -> None:
    e = error("SELECT * FROM R, S WHERE R.name < S.label + 1")
    assert str(e) == "line 1, column 43: cannot add a number to TEXT column 'S.label'"


def test_offset_on_a_bool_column_across_items_is_an_error() -> None:
    assert "cannot add a number to BOOL column 'S.ok'" in str(
        error("SELECT * FROM R, S WHERE R.flag = S.ok - 1")
    )


def test_text_with_text_across_items_is_a_join_factor() -> None:
    assert joins("S.label >= R.name") == (JoinFactor(0, "name", CompareOp.LE, 1, "label"),)


@pytest.mark.parametrize("op", ["=", "!=", "<"])
def test_bool_with_bool_across_items_allows_what_a_one_stream_column_factor_allows(op: str) -> None:
    assert joins(f"R.flag {op} S.ok") == (JoinFactor(0, "flag", CompareOp(op), 1, "ok"),)


# output names


def test_star_over_a_join_names_every_declared_column_by_item() -> None:
    q = query("SELECT * FROM traffic t, S")
    assert q.columns == ["t.lane", "t.stationid", "t.speed", "t.road",
                         "S.a", "S.c", "S.label", "S.ok"]  # fmt: skip
    assert q.select[0] == SelectItem(0, "lane", "t.lane")
    assert q.select[4] == SelectItem(1, "a", "S.a")


def test_star_over_a_self_join_uses_the_aliases() -> None:
    q = query("SELECT * FROM R r1, R r2")
    assert q.columns == [f"{alias}.{c}" for alias in ("r1", "r2") for c in R.names]


def test_qualified_star_in_a_join_names_its_columns_by_item() -> None:
    q = query("SELECT s.* FROM R, S s")
    assert q.select == tuple(SelectItem(1, c, f"s.{c}") for c in S.names)


def test_explicit_items_keep_bare_names_when_they_are_unique() -> None:
    q = query("SELECT lane, R.b, s.label FROM traffic, R, S s")
    assert q.select == (SelectItem(0, "lane", "lane"), SelectItem(1, "b", "b"),
                        SelectItem(2, "label", "label"))  # fmt: skip


def test_clashing_items_are_all_named_by_item() -> None:
    q = query("SELECT r1.a, r1.b, r2.a FROM R r1, R r2")
    assert q.select == (SelectItem(0, "a", "r1.a"), SelectItem(0, "b", "b"),
                        SelectItem(1, "a", "r2.a"))  # fmt: skip


def test_clash_uses_the_alias_even_when_qualified_by_the_stream() -> None:
    assert query("SELECT R.a, S.a FROM R r, S").columns == ["r.a", "S.a"]


def test_as_name_makes_a_plain_item_with_that_name_clash() -> None:
    assert query("SELECT R.a, S.c AS a FROM R, S").columns == ["R.a", "a"]


def test_as_names_avoid_a_clash() -> None:
    assert query("SELECT R.a AS ra, S.a AS sa FROM R, S").columns == ["ra", "sa"]


def test_star_names_do_not_clash_with_a_bare_name() -> None:
    assert query("SELECT *, S.a FROM R, S").columns[-1] == "a"


def test_implicit_columns_of_two_items_are_named_by_item() -> None:
    q = query("SELECT R.ts, S.ts, S.tupleID FROM R, S")
    assert q.select == (SelectItem(0, "ts", "R.ts"), SelectItem(1, "ts", "S.ts"),
                        SelectItem(1, "tupleID", "tupleID"))  # fmt: skip


def test_duplicate_as_names_in_a_join_are_an_error() -> None:
    e = error("SELECT R.a AS k, S.a AS k FROM R, S")
    assert str(e) == "line 1, column 18: duplicate output column 'k' (rename one with AS)"


def test_same_column_twice_in_a_join_is_a_duplicate_output() -> None:
    e = error("SELECT R.a, R.a FROM R, S")
    assert str(e) == "line 1, column 13: duplicate output column 'R.a' (rename one with AS)"


def test_select_distinct_over_a_join() -> None:
    assert query("SELECT DISTINCT r1.a FROM R r1, R r2").distinct
    assert not query("SELECT r1.a FROM R r1, R r2").distinct


# windows


def test_begin_end_applies_the_same_window_to_every_item() -> None:
    q = query("SELECT * FROM R, S, traffic BEGIN NOW - 10 END NOW")
    assert [s.window for s in q.sources] == [
        Window(WindowType.RANGE, relative(-10), relative(0))] * 3


def test_rows_begin_end_applies_to_every_item() -> None:
    q = query("SELECT * FROM R r1, R r2 BEGIN (NOW - 5 ROWS) END NOW")
    assert [s.window for s in q.sources] == [Window(WindowType.ROWS, rows=5)] * 2


def test_per_item_windows() -> None:
    q = query("SELECT * FROM R r [ROWS 10], S [RANGE 5 MINUTES], traffic")
    assert [s.window for s in q.sources] == [
        Window(WindowType.ROWS, rows=10),
        Window(WindowType.RANGE, relative(-300), relative(0)),
        Window(WindowType.ALL),
    ]


def test_partition_by_names_its_own_items_columns() -> None:
    q = query("SELECT * FROM R r [PARTITION BY a ROWS 2], S s [PARTITION BY s.a, ok ROWS 3]")
    assert [s.window for s in q.sources] == [
        Window(WindowType.PARTITION, rows=2, partition_by=("a",)),
        Window(WindowType.PARTITION, rows=3, partition_by=("a", "ok")),
    ]


def test_partition_by_another_items_column_is_an_error() -> None:
    e = error("SELECT * FROM R r [PARTITION BY s.a ROWS 2], S s")
    assert str(e) == (
        "line 1, column 33: 's.a' is not a column of 'r': a window partitions its own stream"
    )


def test_begin_end_with_a_window_on_any_item_is_an_error() -> None:
    e = error("SELECT * FROM R, S [ROWS 5] BEGIN NOW - 1 END NOW")
    assert "BEGIN/END cannot be used" in str(e)
    assert (e.line, e.column) == (1, 29)


# error positions across lines


def test_join_errors_point_at_line_and_column() -> None:
    e = error("SELECT *\nFROM R r1,\n     R r2\nWHERE r1.a < b")
    assert (e.line, e.column) == (4, 14)
    assert str(e).startswith("line 4, column 14: ambiguous column 'b' (in r1, r2)")
