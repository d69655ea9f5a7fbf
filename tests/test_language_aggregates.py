"""The query language's aggregates and GROUP BY (docs/language.md, select_list; docs/semantics.md,
"Aggregates"): parsing and checking into SelectItem.agg, Query.group_by and Query.aggregated."""

from __future__ import annotations

import pytest

from psoup.errors import QueryError
from psoup.query import compile_statement
from psoup.query.model import Query, SelectItem, StreamSchema, TimeExpr, Window, WindowType

TRAFFIC = StreamSchema(
    "traffic", (("lane", "int"), ("stationid", "int"), ("speed", "float"), ("road", "text"))
)
R = StreamSchema(
    "R", (("a", "int"), ("b", "int"), ("x", "float"), ("y", "float"), ("name", "text"),
          ("flag", "bool"))
)  # fmt: skip
S = StreamSchema("S", (("a", "int"), ("c", "float"), ("label", "text"), ("ok", "bool")))
# Aggregate names and BY are not reserved: they may name columns.
C = StreamSchema("C", (("count", "int"), ("sum", "float"), ("by", "text")))
SCHEMAS = {"traffic": TRAFFIC, "R": R, "S": S, "C": C}


def query(sql: str) -> Query:
    q = compile_statement(sql, SCHEMAS)
    assert isinstance(q, Query)
    return q


def error(sql: str) -> QueryError:
    with pytest.raises(QueryError) as info:
        compile_statement(sql, SCHEMAS)
    return info.value


# select items


def test_count_star_is_source_0_column_star() -> None:
    q = query("SELECT COUNT(*) FROM traffic")
    assert q.select == (SelectItem(0, "*", "count(*)", "count"),)
    assert q.columns == ["count(*)"]
    assert q.aggregated and q.group_by == ()


@pytest.mark.parametrize(
    "item, expected",
    [("COUNT(lane)", SelectItem(0, "lane", "count(lane)", "count")),
     ("COUNT(road)", SelectItem(0, "road", "count(road)", "count")),
     ("SUM(speed)", SelectItem(0, "speed", "sum(speed)", "sum")),
     ("AVG(speed)", SelectItem(0, "speed", "avg(speed)", "avg")),
     ("MIN(lane)", SelectItem(0, "lane", "min(lane)", "min")),
     ("MAX(stationid)", SelectItem(0, "stationid", "max(stationid)", "max")),
     ("MAX(ts)", SelectItem(0, "ts", "max(ts)", "max")),
     ("MIN(tupleID)", SelectItem(0, "tupleID", "min(tupleID)", "min")),
     ("SUM(tupleID)", SelectItem(0, "tupleID", "sum(tupleID)", "sum")),
     ("AVG(ts)", SelectItem(0, "ts", "avg(ts)", "avg"))],
)  # fmt: skip
def test_each_aggregate_over_a_column(item: str, expected: SelectItem) -> None:
    q = query(f"SELECT {item} FROM traffic")
    assert q.select == (expected,)
    assert q.aggregated


@pytest.mark.parametrize(
    "item, agg",
    [("count(*)", "count"), ("Count(*)", "count"), ("sum(speed)", "sum"),
     ("Avg(speed)", "avg"), ("mIn(speed)", "min"), ("MaX(speed)", "max")],
)  # fmt: skip
def test_function_names_are_case_insensitive_and_named_in_lower_case(item: str, agg: str) -> None:
    (got,) = query(f"SELECT {item} FROM traffic").select
    assert got.agg == agg
    assert got.name == agg + item[item.index("(") :]


@pytest.mark.parametrize("column", ["road", "lane", "speed", "ts", "tupleID"])
def test_count_takes_any_column_type(column: str) -> None:
    assert query(f"SELECT COUNT({column}) FROM traffic").select[0].agg == "count"


def test_count_of_a_bool_column() -> None:
    q = query("SELECT count(flag) FROM R")
    assert q.select == (SelectItem(0, "flag", "count(flag)", "count"),)


def test_as_renames_an_aggregate() -> None:
    q = query("SELECT COUNT(*) AS n, AVG(speed) AS mean FROM traffic")
    assert q.select == (SelectItem(0, "*", "n", "count"), SelectItem(0, "speed", "mean", "avg"))


def test_qualified_argument_in_a_one_stream_query_is_named_by_its_bare_column() -> None:
    q = query("SELECT SUM(traffic.speed), MAX(t.lane) FROM traffic t")
    assert q.select == (
        SelectItem(0, "speed", "sum(speed)", "sum"),
        SelectItem(0, "lane", "max(lane)", "max"),
    )


def test_several_aggregates_keep_their_order() -> None:
    q = query("SELECT MIN(speed), COUNT(*), MAX(speed), SUM(lane) FROM traffic")
    assert q.columns == ["min(speed)", "count(*)", "max(speed)", "sum(lane)"]
    assert [item.agg for item in q.select] == ["min", "count", "max", "sum"]


def test_same_column_under_different_aggregates() -> None:
    q = query("SELECT MIN(a), MAX(a), AVG(a), SUM(a), COUNT(a) FROM R")
    assert [(i.column, i.agg) for i in q.select] == [
        ("a", "min"), ("a", "max"), ("a", "avg"), ("a", "sum"), ("a", "count")
    ]  # fmt: skip


def test_spaces_and_lines_inside_an_aggregate() -> None:
    q = query("SELECT count ( * ), sum (\n speed ) FROM traffic")
    assert q.columns == ["count(*)", "sum(speed)"]


def test_aggregate_names_are_not_reserved() -> None:
    q = query("SELECT count, sum(sum), count(count) AS n, by FROM C GROUP BY count, by")
    assert q.select == (
        SelectItem(0, "count", "count", None),
        SelectItem(0, "sum", "sum(sum)", "sum"),
        SelectItem(0, "count", "n", "count"),
        SelectItem(0, "by", "by", None),
    )
    assert q.group_by == ((0, "count"), (0, "by"))


def test_aggregate_with_where_and_window() -> None:
    q = query("SELECT AVG(speed) FROM traffic WHERE lane = 2 BEGIN NOW - 10 END NOW")
    (src,) = q.sources
    assert src.window == Window(WindowType.RANGE, TimeExpr(True, -10.0), TimeExpr(True, 0.0))
    assert src.predicates[0].column == "lane"
    assert q.select == (SelectItem(0, "speed", "avg(speed)", "avg"),)


def test_aggregate_with_a_per_stream_window() -> None:
    q = query("SELECT COUNT(*) FROM traffic [ROWS 100]")
    assert q.sources[0].window == Window(WindowType.ROWS, rows=100) and q.aggregated


def test_distinct_with_aggregates_is_allowed() -> None:
    q = query("SELECT DISTINCT lane, COUNT(*) FROM traffic GROUP BY lane")
    assert q.distinct and q.aggregated


# GROUP BY


def test_group_by_resolves_columns_in_written_order() -> None:
    q = query("SELECT road, lane, COUNT(*) FROM traffic GROUP BY road, lane")
    assert q.group_by == ((0, "road"), (0, "lane"))
    assert q.select[:2] == (SelectItem(0, "road", "road"), SelectItem(0, "lane", "lane"))


def test_group_by_without_aggregates_is_aggregated() -> None:
    q = query("SELECT lane FROM traffic GROUP BY lane")
    assert q.group_by == ((0, "lane"),)
    assert q.aggregated
    assert q.select == (SelectItem(0, "lane", "lane"),)


def test_group_by_column_need_not_be_selected() -> None:
    q = query("SELECT COUNT(*) FROM traffic GROUP BY lane, road")
    assert q.group_by == ((0, "lane"), (0, "road"))
    assert q.columns == ["count(*)"]


@pytest.mark.parametrize(
    "group_by, expected",
    [("lane, lane", ((0, "lane"),)),
     ("lane, traffic.lane", ((0, "lane"),)),
     ("road, lane, road", ((0, "road"), (0, "lane"))),
     ("t.lane, lane, t.road, road", ((0, "lane"), (0, "road")))],
)  # fmt: skip
def test_repeated_group_by_columns_are_folded_keeping_the_first(
        group_by: str, expected: tuple[tuple[int, str], ...]) -> None:
    assert query(f"SELECT COUNT(*) FROM traffic t GROUP BY {group_by}").group_by == expected


@pytest.mark.parametrize("column", ["ts", "tupleID", "road", "speed"])
def test_group_by_any_column_type_including_implicit_ones(column: str) -> None:
    q = query(f"SELECT {column}, COUNT(*) FROM traffic GROUP BY {column}")
    assert q.group_by == ((0, column),)


def test_group_by_bool_column() -> None:
    assert query("SELECT flag, MAX(x) FROM R GROUP BY flag").group_by == ((0, "flag"),)


def test_selected_column_may_be_written_differently_from_its_group_by() -> None:
    q = query("SELECT R.a, r.b, COUNT(*) FROM R r GROUP BY a, R.b")
    assert q.group_by == ((0, "a"), (0, "b"))


def test_group_by_keyword_is_case_insensitive() -> None:
    assert query("select lane, count(*) from traffic group by lane").group_by == ((0, "lane"),)


@pytest.mark.parametrize(
    "tail",
    ["WHERE lane > 1 GROUP BY lane BEGIN NOW - 10 END NOW",
     "WHERE lane > 1 BEGIN NOW - 10 END NOW GROUP BY lane",
     "GROUP BY lane BEGIN NOW - 10 END NOW",
     "BEGIN NOW - 10 END NOW GROUP BY lane;",
     "GROUP BY lane;"],
)  # fmt: skip
def test_group_by_goes_after_where_before_or_after_begin_end(tail: str) -> None:
    q = query(f"SELECT lane, COUNT(*) FROM traffic {tail}")
    assert q.group_by == ((0, "lane"),)
    if "BEGIN" in tail:
        assert q.sources[0].window.kind == "range"
    if "WHERE" in tail:
        assert q.sources[0].predicates[0].lo == 2


# joins


def test_join_aggregates_are_named_with_the_item_name() -> None:
    q = query("SELECT COUNT(*), SUM(x), AVG(S.c), MAX(R.a) FROM R, S WHERE R.a = S.a")
    assert q.select == (
        SelectItem(0, "*", "count(*)", "count"),
        SelectItem(0, "x", "sum(R.x)", "sum"),
        SelectItem(1, "c", "avg(S.c)", "avg"),
        SelectItem(0, "a", "max(R.a)", "max"),
    )
    assert len(q.joins) == 1


def test_join_aggregate_names_use_the_alias_not_the_written_qualifier() -> None:
    q = query("SELECT SUM(R.x), MIN(s2.c) FROM R r, S s1, S s2")
    assert q.columns == ["sum(r.x)", "min(s2.c)"]
    assert [i.source for i in q.select] == [0, 2]


def test_self_join_aggregates_of_the_same_column_get_distinct_names() -> None:
    q = query("SELECT r1.a, MAX(r2.b), MIN(r2.b) FROM R r1, R r2 WHERE r1.a = r2.a "
              "GROUP BY r1.a")  # fmt: skip
    assert q.select == (
        SelectItem(0, "a", "a"),
        SelectItem(1, "b", "max(r2.b)", "max"),
        SelectItem(1, "b", "min(r2.b)", "min"),
    )
    assert q.group_by == ((0, "a"),)


def test_join_group_by_resolves_bare_and_qualified_columns() -> None:
    q = query("SELECT S.a, label, COUNT(*) FROM R, S GROUP BY label, S.a, x")
    assert q.group_by == ((1, "label"), (1, "a"), (0, "x"))
    assert q.select[:2] == (SelectItem(1, "a", "a"), SelectItem(1, "label", "label"))


def test_join_group_by_ambiguous_column_must_be_qualified() -> None:
    assert "ambiguous column 'a'" in str(error("SELECT COUNT(*) FROM R, S GROUP BY a"))


def test_join_plain_column_grouped_under_the_other_item_is_an_error() -> None:
    message = str(error("SELECT R.a, COUNT(*) FROM R, S GROUP BY S.a"))
    assert "column 'R.a' must appear in GROUP BY or be inside an aggregate" in message


def test_join_as_name_clashing_with_a_plain_column_qualifies_it_as_before() -> None:
    q = query("SELECT R.a, COUNT(*) AS a FROM R, S GROUP BY R.a")
    assert q.columns == ["R.a", "a"]


def test_join_count_of_a_qualified_column() -> None:
    q = query("SELECT COUNT(s.ok) FROM R r, S s")
    assert q.select == (SelectItem(1, "ok", "count(s.ok)", "count"),)


# non-aggregate queries are unchanged


@pytest.mark.parametrize(
    "sql",
    ["SELECT * FROM R",
     "SELECT a, b AS bee FROM R WHERE a > 1",
     "SELECT DISTINCT name FROM R BEGIN NOW - 5 END NOW",
     "SELECT R.a, S.a FROM R, S WHERE R.a = S.a",
     "SELECT count FROM C",
     "SELECT * FROM traffic [PARTITION BY lane ROWS 5]"],
)  # fmt: skip
def test_plain_queries_are_not_aggregated(sql: str) -> None:
    q = query(sql)
    assert not q.aggregated and q.group_by == ()
    assert all(item.agg is None for item in q.select)


# errors


@pytest.mark.parametrize(
    "sql, message",
    [("SELECT SUM(road) FROM traffic",
      "SUM over TEXT column 'road' is not supported (INT or FLOAT columns only)"),
     ("SELECT AVG(name) FROM R", "AVG over TEXT column 'name' is not supported"),
     ("SELECT min(flag) FROM R", "MIN over BOOL column 'flag' is not supported"),
     ("SELECT Max(R.name) FROM R", "MAX over TEXT column 'R.name' is not supported"),
     ("SELECT SUM(s.label) FROM R, S s", "SUM over TEXT column 's.label' is not supported")],
)  # fmt: skip
def test_numeric_aggregates_reject_text_and_bool_columns(sql: str, message: str) -> None:
    assert message in str(error(sql))


@pytest.mark.parametrize(
    "sql, message",
    [("SELECT lane, COUNT(*) FROM traffic",
      "column 'lane' must appear in GROUP BY or be inside an aggregate"),
     ("SELECT road, COUNT(*) FROM traffic GROUP BY lane",
      "column 'road' must appear in GROUP BY or be inside an aggregate"),
     ("SELECT lane, road FROM traffic GROUP BY lane",
      "column 'road' must appear in GROUP BY or be inside an aggregate"),
     ("SELECT COUNT(*), traffic.speed FROM traffic",
      "column 'traffic.speed' must appear in GROUP BY"),
     ("SELECT ts, COUNT(*) FROM traffic", "column 'ts' must appear in GROUP BY")],
)  # fmt: skip
def test_plain_columns_of_an_aggregated_query_must_be_grouped(sql: str, message: str) -> None:
    assert message in str(error(sql))


@pytest.mark.parametrize(
    "sql, message",
    [("SELECT *, COUNT(*) FROM traffic", "SELECT * cannot be used with aggregates or GROUP BY"),
     ("SELECT * FROM traffic GROUP BY lane", "SELECT * cannot be used with aggregates"),
     ("SELECT R.*, COUNT(*) FROM R, S", "SELECT R.* cannot be used with aggregates"),
     ("SELECT COUNT(*), * FROM R", "SELECT * cannot be used")],
)  # fmt: skip
def test_star_with_aggregation_is_an_error(sql: str, message: str) -> None:
    assert message in str(error(sql))


@pytest.mark.parametrize(
    "sql, name",
    [("SELECT COUNT(*), count(*) FROM R", "count(*)"),
     ("SELECT SUM(a), sum(R.a) FROM R", "sum(a)"),
     ("SELECT MAX(R.a), max(r.a) FROM R r, S", "max(r.a)"),
     ("SELECT COUNT(*) AS n, SUM(a) AS n FROM R", "n"),
     ("SELECT a, COUNT(*) AS a FROM R GROUP BY a", "a")],
)  # fmt: skip
def test_duplicate_output_names_are_an_error(sql: str, name: str) -> None:
    assert f"duplicate output column '{name}' (rename one with AS)" in str(error(sql))


def test_aliases_resolve_duplicate_default_names() -> None:
    q = query("SELECT SUM(a), sum(R.a) AS total FROM R")
    assert q.columns == ["sum(a)", "total"]


@pytest.mark.parametrize(
    "sql, message",
    [("SELECT COUNT(DISTINCT a) FROM R", "COUNT(DISTINCT ...) is not supported"),
     ("SELECT sum(distinct a) FROM R", "SUM(DISTINCT ...) is not supported"),
     ("SELECT SUM(*) FROM R", "SUM(*) is not supported: only COUNT takes *"),
     ("SELECT max(*) FROM R", "MAX(*) is not supported"),
     ("SELECT SUM(a + 1) FROM R", "aggregates of expressions are not supported"),
     ("SELECT SUM(a * b) FROM R", "aggregates of expressions are not supported"),
     ("SELECT AVG(-a) FROM R", "aggregates of expressions are not supported"),
     ("SELECT COUNT(1) FROM R", "the argument of COUNT must be a column or *"),
     ("SELECT SUM('x') FROM R", "the argument of SUM must be a column"),
     ("SELECT SUM((a)) FROM R", "aggregates of expressions are not supported"),
     ("SELECT SUM(a > 1) FROM R", "aggregates of expressions are not supported"),
     ("SELECT SUM(MAX(a)) FROM R", "nested aggregates are not supported (MAX inside SUM)"),
     ("SELECT count(count(*)) FROM R", "nested aggregates are not supported (count inside count)"),
     ("SELECT SUM(abs(a)) FROM R", "functions are not supported (abs)"),
     ("SELECT abs(a) FROM R", "functions are not supported (abs)"),
     ("SELECT * FROM R WHERE max(a) > 1", "aggregates are not supported in WHERE (max)"),
     ("SELECT * FROM R WHERE 1 < COUNT(*)", "aggregates are not supported in WHERE (COUNT)"),
     ("SELECT COUNT(*) FROM R GROUP BY sum(a)", "aggregates are not supported in GROUP BY (sum)"),
     ("SELECT * FROM R [PARTITION BY count(a) ROWS 2]",
      "aggregates are not supported in PARTITION BY (count)")],
)  # fmt: skip
def test_unsupported_aggregate_forms_are_rejected_by_name(sql: str, message: str) -> None:
    assert message in str(error(sql))


@pytest.mark.parametrize(
    "sql, message",
    [("SELECT lane, COUNT(*) FROM traffic GROUP BY lane HAVING COUNT(*) > 1",
      "HAVING is not supported"),
     ("SELECT lane FROM traffic WHERE lane > 1 HAVING lane > 2", "HAVING is not supported"),
     ("SELECT lane, COUNT(*) FROM traffic GROUP BY lane ORDER BY lane",
      "ORDER BY is not supported"),
     ("SELECT COUNT(*) FROM traffic ORDER BY lane", "ORDER BY is not supported"),
     ("SELECT COUNT(*) FROM traffic LIMIT 1", "LIMIT is not supported")],
)  # fmt: skip
def test_having_and_order_by_stay_rejected(sql: str, message: str) -> None:
    text = str(error(sql))
    assert message in text
    assert "needs aggregates" not in text


@pytest.mark.parametrize(
    "sql, message",
    [("SELECT COUNT(*) FROM R GROUP BY a GROUP BY b", "GROUP BY appears twice"),
     ("SELECT COUNT(*) FROM R GROUP BY a BEGIN NOW END NOW GROUP BY b", "GROUP BY appears twice"),
     ("SELECT COUNT(*) FROM R GROUP BY a WHERE a > 1", "WHERE goes before GROUP BY"),
     ("SELECT COUNT(*) FROM R GROUP a", "expected BY after 'GROUP', found 'a'"),
     ("SELECT COUNT(*) FROM R GROUP BY", "expected a column after 'BY', found the end"),
     ("SELECT COUNT(*) FROM R GROUP BY 1", "expected a column after 'BY', found '1'"),
     ("SELECT COUNT(*) FROM R GROUP BY a,", "expected a column after ','"),
     ("SELECT COUNT(*) FROM R GROUP BY a b",
      "expected ',', BEGIN or the end of the statement after 'a', found 'b'"),
     ("SELECT COUNT(*) FROM R BEGIN NOW END NOW GROUP BY a b",
      "expected ',' or the end of the statement after 'a', found 'b'"),
     ("SELECT COUNT(*) FROM R WHERE a > 1 b",
      "expected AND, GROUP BY, BEGIN or the end of the statement after '1'"),
     ("SELECT COUNT(*) FROM R b c",
      "expected WHERE, GROUP BY, BEGIN or the end of the statement after 'b', found 'c'"),
     ("SELECT COUNT(*) + 1 FROM R", "expected ',', AS or FROM after 'COUNT(*)', found '+'"),
     ("SELECT COUNT() FROM R", "expected a column or '*' after '(', found ')'"),
     ("SELECT SUM() FROM R", "expected a column after '(', found ')'"),
     ("SELECT SUM(a, b) FROM R", "expected ')' after 'a', found ','"),
     ("SELECT SUM(a FROM R", "expected ')' after 'a', found 'FROM'"),
     ("SELECT COUNT(*) FROM R GROUP BY zz", "unknown column 'zz' in stream 'R'"),
     ("SELECT SUM(zz) FROM R", "unknown column 'zz' in stream 'R'"),
     ("SELECT COUNT(*) FROM R GROUP BY Q.a", "unknown stream or alias 'Q'"),
     ("SELECT a AS k, COUNT(*) FROM R GROUP BY k", "unknown column 'k'")],
)  # fmt: skip
def test_group_by_and_aggregate_syntax_errors(sql: str, message: str) -> None:
    assert message in str(error(sql))


def test_group_by_is_reserved() -> None:
    assert "reserved word 'group'" in str(error("CREATE STREAM G (group INT)"))


# positions


@pytest.mark.parametrize(
    "sql, line, column",
    [("SELECT SUM(road) FROM traffic", 1, 12),
     ("SELECT lane,\n  COUNT(*), road FROM traffic GROUP BY lane", 2, 13),
     ("SELECT COUNT(DISTINCT lane) FROM traffic", 1, 14),
     ("SELECT SUM(lane + 1) FROM traffic", 1, 17),
     ("SELECT SUM(MAX(lane)) FROM traffic", 1, 12),
     ("SELECT * FROM traffic\nWHERE max(lane) > 1", 2, 7),
     ("SELECT COUNT(*), COUNT(*) FROM traffic", 1, 18),
     ("SELECT *, COUNT(*) FROM traffic", 1, 8),
     ("SELECT COUNT(*) FROM traffic\n  GROUP BY lane HAVING lane > 1", 2, 17),
     ("SELECT COUNT(*) FROM traffic GROUP BY nope", 1, 39)],
)  # fmt: skip
def test_errors_carry_line_and_column(sql: str, line: int, column: int) -> None:
    err = error(sql)
    assert (err.line, err.column) == (line, column)
    assert str(err).startswith(f"line {line}, column {column}: ")
