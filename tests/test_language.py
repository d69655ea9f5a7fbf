"""The query language (docs/language.md): SQL text -> StreamSchema / normalized Query."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest

from psoup.errors import QueryError
from psoup.query import compile_statement, parse_retain, parse_type
from psoup.query.model import (
    DESCRIBE,
    DROP_STREAM,
    SHOW_QUERIES,
    SHOW_STREAMS,
    AttrPredicate,
    Catalog,
    ColumnFactor,
    ColumnType,
    CompareOp,
    Query,
    SelectItem,
    Source,
    StreamSchema,
    TimeExpr,
    Window,
    WindowType,
)
from psoup.query.tokens import NUMBER, STRING, tokenize

TRAFFIC = StreamSchema(
    "traffic", (("lane", "int"), ("stationid", "int"), ("speed", "float"), ("road", "text"))
)
R = StreamSchema(
    "R", (("a", "int"), ("b", "int"), ("x", "float"), ("y", "float"), ("name", "text"),
          ("flag", "bool"))
)  # fmt: skip
SCHEMAS = {"traffic": TRAFFIC, "R": R}


def query(sql: str, schemas: Mapping[str, StreamSchema] = SCHEMAS) -> Query:
    q = compile_statement(sql, schemas)
    assert isinstance(q, Query)
    return q


def stream_schema(sql: str, schemas: Mapping[str, StreamSchema] = SCHEMAS) -> StreamSchema:
    schema = compile_statement(sql, schemas)
    assert isinstance(schema, StreamSchema)
    return schema


def source(sql: str) -> Source:
    (src,) = query(sql).sources
    return src


def predicates(where: str) -> tuple[AttrPredicate, ...]:
    return source(f"SELECT * FROM R WHERE {where}").predicates


def predicate(where: str) -> AttrPredicate:
    (pred,) = predicates(where)
    return pred


def window(tail: str) -> Window:
    return source(f"SELECT * FROM R {tail}").window


def error(sql: str, schemas: Mapping[str, StreamSchema] = SCHEMAS) -> QueryError:
    with pytest.raises(QueryError) as info:
        compile_statement(sql, schemas)
    return info.value


def relative(seconds: float) -> TimeExpr:
    return TimeExpr(True, float(seconds))


def absolute(seconds: float) -> TimeExpr:
    return TimeExpr(False, float(seconds))


# tokens


def test_tokens_carry_line_and_column() -> None:
    tokens = tokenize("SELECT a\n  FROM R")
    assert [(t.text, t.pos.line, t.pos.column) for t in tokens[:4]] == [
        ("SELECT", 1, 1), ("a", 1, 8), ("FROM", 2, 3), ("R", 2, 8)
    ]  # fmt: skip


def test_integer_literals_are_int_and_decimals_or_exponents_are_float() -> None:
    values = [t.value for t in tokenize("3 3.0 1e3 .5") if t.kind == NUMBER]
    assert values == [3, 3.0, 1000.0, 0.5]
    assert [type(v) for v in values] == [int, float, float, float]


def test_string_literal_doubles_a_quote_to_escape_it() -> None:
    (tok,) = [t for t in tokenize("'it''s'") if t.kind == STRING]
    assert tok.value == "it's"


def test_keywords_are_case_insensitive() -> None:
    q = query("select distinct a from R where a = 1 begin now - 5 end now")
    assert q.distinct and q.columns == ["a"]


def test_identifiers_are_case_sensitive() -> None:
    assert "unknown stream 'r'" in str(error("SELECT * FROM r"))
    assert "unknown column 'A'" in str(error("SELECT A FROM R"))


def test_comments_run_to_the_end_of_the_line() -> None:
    q = query("SELECT a -- the lane\nFROM R -- WHERE a = 1\nWHERE b = 2")
    assert q.sources[0].predicates == (AttrPredicate("b", ColumnType.INT, eq=frozenset({2})),)


def test_trailing_semicolon_is_optional() -> None:
    assert query("SELECT a FROM R;").columns == ["a"]


def test_query_keeps_the_sql_as_written() -> None:
    sql = "  SELECT a FROM R WHERE a > 1 ;"
    assert query(sql).sql == sql


# CREATE STREAM


def test_create_stream_returns_its_schema() -> None:
    schema = compile_statement("CREATE STREAM S (a INT, x FLOAT, t TEXT, f BOOL)", SCHEMAS)
    assert schema == StreamSchema(
        "S", (("a", "int"), ("x", "float"), ("t", "text"), ("f", "bool"))
    )


def test_create_stream_accepts_type_synonyms_in_any_case() -> None:
    schema = stream_schema(
        "create stream S (a integer, b BigInt, c double, d Real, e varchar, f STRING, "
        "g boolean)",
        SCHEMAS,
    )
    assert [t for _, t in schema.columns] == ["int", "int", "float", "float", "text",
                                              "text", "bool"]  # fmt: skip


@pytest.mark.parametrize(
    "retain, seconds",
    [("1 HOUR", 3600.0), ("90 seconds", 90.0), ("1 second", 1.0), ("10 MINUTE", 600.0),
     ("2 DAYS", 172800.0), ("1.5 hours", 5400.0)],
)  # fmt: skip
def test_create_stream_retain_time_is_in_seconds(retain: str, seconds: float) -> None:
    schema = stream_schema(f"CREATE STREAM S (a INT) RETAIN {retain}")
    assert (schema.retain_seconds, schema.retain_rows) == (seconds, None)
    assert isinstance(schema.retain_seconds, float)


def test_create_stream_retain_rows() -> None:
    schema = stream_schema("CREATE STREAM S (a INT) RETAIN 100000 ROWS")
    assert (schema.retain_seconds, schema.retain_rows) == (None, 100000)


def test_create_stream_without_retain_keeps_everything() -> None:
    schema = stream_schema("CREATE STREAM S (a INT)")
    assert (schema.retain_seconds, schema.retain_rows) == (None, None)


def test_create_existing_stream_is_an_error() -> None:
    e = error("CREATE STREAM R (a INT)")
    assert "stream 'R' already exists" in str(e)
    assert (e.line, e.column) == (1, 15)


@pytest.mark.parametrize("column", ["ts", "tupleID"])
def test_create_stream_rejects_the_implicit_column_names(column: str) -> None:
    e = error(f"CREATE STREAM S (a INT, {column} FLOAT)")
    assert f"'{column}' is reserved" in str(e)
    assert (e.line, e.column) == (1, 25)


def test_create_stream_rejects_duplicate_columns() -> None:
    assert "duplicate column 'a'" in str(error("CREATE STREAM S (a INT, a FLOAT)"))


def test_create_stream_unknown_type_lists_the_known_types() -> None:
    message = str(error("CREATE STREAM S (a INTT)"))
    assert "line 1, column 20: unknown type 'INTT'" in message
    for known in ("INT", "FLOAT", "TEXT", "BOOL"):
        assert known in message


def test_create_stream_needs_a_column() -> None:
    assert "expected a column name after '('" in str(error("CREATE STREAM S ()"))


def test_create_stream_retain_needs_a_unit() -> None:
    assert "expected a unit" in str(error("CREATE STREAM S (a INT) RETAIN 100"))


@pytest.mark.parametrize("rows", ["0", "2.5"])
def test_create_stream_retain_rows_must_be_a_positive_integer(rows: str) -> None:
    assert "positive whole number" in str(error(f"CREATE STREAM S (a INT) RETAIN {rows} ROWS"))


def test_reserved_word_cannot_name_a_column() -> None:
    assert "found the reserved word 'end'" in str(error("CREATE STREAM S (end INT)"))


# parse_retain and parse_type


@pytest.mark.parametrize(
    "text, expected",
    [("1 hour", (3600.0, None)), ("90 seconds", (90.0, None)), ("100000 rows", (None, 100000)),
     ("2 DAYS", (172800.0, None)), ("1 Row", (None, 1)), (" 3 minutes ", (180.0, None))],
)  # fmt: skip
def test_parse_retain(text: str, expected: tuple[float | None, int | None]) -> None:
    assert parse_retain(text) == expected


@pytest.mark.parametrize(
    "text", ["", "hour", "100", "1 week", "0 rows", "1.5 rows", "0 seconds", "-1 hour",
             "1 hour extra"]
)  # fmt: skip
def test_parse_retain_rejects_anything_else(text: str) -> None:
    with pytest.raises(QueryError):
        parse_retain(text)


@pytest.mark.parametrize(
    "name, ctype",
    [("INT", "int"), ("int", "int"), ("INTEGER", "int"), ("BIGINT", "int"),
     ("FLOAT", "float"), ("double", "float"), ("REAL", "float"), ("TEXT", "text"),
     ("VARCHAR", "text"), ("string", "text"), ("BOOL", "bool"), ("Boolean", "bool")],
)  # fmt: skip
def test_parse_type(name: str, ctype: str) -> None:
    assert parse_type(name) == ctype


def test_parse_type_unknown_names_the_known_types() -> None:
    with pytest.raises(QueryError, match=r"unknown type 'date' \(known types: INT, .*BOOL"):
        parse_type("date")


# SELECT list and FROM


def test_star_expands_to_the_declared_columns() -> None:
    q = query("SELECT * FROM traffic")
    assert q.select == tuple(
        SelectItem(0, c, c) for c in ("lane", "stationid", "speed", "road")
    )


def test_select_items_keep_their_order_and_as_names() -> None:
    q = query("SELECT b, a AS first, ts, tupleID AS id FROM R")
    assert q.select == (SelectItem(0, "b", "b"), SelectItem(0, "a", "first"),
                        SelectItem(0, "ts", "ts"), SelectItem(0, "tupleID", "id"))  # fmt: skip
    assert q.columns == ["b", "first", "ts", "id"]


def test_columns_may_be_qualified_by_the_stream_or_its_alias() -> None:
    q = query("SELECT t.lane, traffic.speed FROM traffic t WHERE t.lane = 1")
    assert q.select == (SelectItem(0, "lane", "lane"), SelectItem(0, "speed", "speed"))
    assert q.sources[0].predicates == (AttrPredicate("lane", ColumnType.INT, eq=frozenset({1})),)


def test_qualified_star_expands_like_star() -> None:
    assert query("SELECT t.* FROM traffic t").columns == ["lane", "stationid", "speed", "road"]


def test_source_alias_defaults_to_the_stream_name() -> None:
    assert source("SELECT * FROM traffic").alias == "traffic"
    assert source("SELECT * FROM traffic AS t").alias == "t"
    assert source("SELECT * FROM traffic t").stream == "traffic"


def test_select_distinct() -> None:
    assert query("SELECT DISTINCT lane FROM traffic").distinct
    assert not query("SELECT lane FROM traffic").distinct


def test_duplicate_output_column_is_an_error() -> None:
    e = error("SELECT a, b AS a FROM R")
    assert "duplicate output column 'a'" in str(e)
    assert (e.line, e.column) == (1, 11)


def test_unknown_stream_lists_the_streams() -> None:
    e = error("SELECT * FROM trafic", {"traffic": TRAFFIC})
    assert str(e) == "line 1, column 15: unknown stream 'trafic' (streams: traffic)"


def test_unknown_column_lists_the_columns() -> None:
    e = error("SELECT * FROM traffic WHERE traffic.speeed > 5")
    assert str(e) == (
        "line 1, column 37: unknown column 'speeed' in stream 'traffic' "
        "(columns: lane, stationid, speed, road)"
    )


def test_unknown_qualifier_is_an_error() -> None:
    assert "unknown stream or alias 'x' in 'x.lane'" in str(error("SELECT x.lane FROM traffic"))


def test_qualifier_naming_a_stream_outside_from_is_an_error() -> None:
    e = error("SELECT a FROM R WHERE R.a < traffic.lane")
    assert str(e) == (
        "line 1, column 29: stream 'traffic' in 'traffic.lane' is not in FROM (FROM: R)"
    )


def test_one_stream_query_does_not_qualify_clashing_names() -> None:
    e = error("SELECT a, R.a FROM R")
    assert "duplicate output column 'a'" in str(e)
    assert (e.line, e.column) == (1, 11)


# WHERE: single-attribute factors


def test_float_greater_than_is_an_open_lower_bound() -> None:
    assert predicate("x > 2.5") == AttrPredicate("x", ColumnType.FLOAT, lo=2.5, lo_open=True)


def test_constant_on_the_left_is_flipped() -> None:
    assert predicate("2.5 < x") == AttrPredicate("x", ColumnType.FLOAT, lo=2.5, lo_open=True)
    assert predicate("2.5 >= x") == AttrPredicate("x", ColumnType.FLOAT, hi=2.5)


def test_bounds_on_one_column_intersect_to_the_tighter_ones() -> None:
    assert predicate("x > 1 AND x >= 3 AND x < 10 AND x <= 7") == AttrPredicate(
        "x", ColumnType.FLOAT, lo=3.0, hi=7.0
    )


def test_at_an_equal_bound_the_open_one_is_tighter() -> None:
    assert predicate("x >= 5 AND x > 5 AND x < 9 AND x <= 9") == AttrPredicate(
        "x", ColumnType.FLOAT, lo=5.0, lo_open=True, hi=9.0, hi_open=True
    )


def test_int_strict_bounds_become_closed() -> None:
    assert predicate("a > 5 AND a < 9") == AttrPredicate("a", ColumnType.INT, lo=6, hi=8)


@pytest.mark.parametrize(
    "factor, lo, hi",
    [("a > 2.5", 3, None), ("a >= 2.5", 3, None), ("a < 2.5", None, 2), ("a <= 2.5", None, 2),
     ("a > 2.0", 3, None), ("a >= 2.0", 2, None), ("a > -2.5", -2, None), ("a < -2.5", None, -3)],
)  # fmt: skip
def test_int_column_with_a_float_constant_gets_integer_bounds(
        factor: str, lo: int | None, hi: int | None) -> None:
    pred = predicate(factor)
    assert pred == AttrPredicate("a", ColumnType.INT, lo=lo, hi=hi)
    assert all(type(v) is int for v in (pred.lo, pred.hi) if v is not None)


def test_int_equal_to_a_fraction_is_an_empty_set_and_a_contradiction() -> None:
    q = query("SELECT * FROM R WHERE a = 2.5")
    assert q.sources[0].predicates == (AttrPredicate("a", ColumnType.INT, eq=frozenset()),)
    assert q.contradiction


def test_int_not_equal_to_a_fraction_always_holds_and_emits_nothing() -> None:
    assert predicates("a != 2.5") == ()


def test_int_in_list_drops_fractions_and_makes_integral_floats_ints() -> None:
    pred = predicate("a IN (1, 2.0, 2.5)")
    assert pred == AttrPredicate("a", ColumnType.INT, eq=frozenset({1, 2}))
    assert pred.eq is not None
    assert all(type(v) is int for v in pred.eq)


def test_float_column_takes_int_constants_as_floats() -> None:
    pred = predicate("x IN (1, 2.5) AND x != 3")
    assert pred == AttrPredicate("x", ColumnType.FLOAT, eq=frozenset({1.0, 2.5}))
    assert pred.eq is not None
    assert all(type(v) is float for v in pred.eq)
    assert type(predicate("x > 3").lo) is float


def test_equality_and_in_sets_intersect() -> None:
    assert predicate("a IN (1, 2, 3) AND a IN (2, 3, 4) AND a = 3") == AttrPredicate(
        "a", ColumnType.INT, eq=frozenset({3})
    )


def test_eq_set_is_filtered_by_the_bounds_and_not_equals_which_are_then_dropped() -> None:
    assert predicate("a IN (1, 5, 7, 9, 12) AND a > 4 AND a <= 9 AND a != 7") == AttrPredicate(
        "a", ColumnType.INT, eq=frozenset({5, 9})
    )


def test_not_equal_values_outside_the_bounds_are_dropped() -> None:
    assert predicate("x != 1 AND x != 5 AND x != 20 AND x > 2 AND x < 10") == AttrPredicate(
        "x", ColumnType.FLOAT, lo=2.0, lo_open=True, hi=10.0, hi_open=True, ne=frozenset({5.0})
    )


def test_diamond_and_bang_equal_are_the_same_operator() -> None:
    assert predicate("a <> 3 AND a != 4") == AttrPredicate(
        "a", ColumnType.INT, ne=frozenset({3, 4})
    )


def test_contradictory_bounds_are_empty_and_make_the_query_a_contradiction() -> None:
    q = query("SELECT * FROM R WHERE a > 5 AND a < 3")
    assert q.sources[0].predicates == (AttrPredicate("a", ColumnType.INT, empty=True),)
    assert q.contradiction


def test_int_bounds_with_no_integer_between_them_are_empty() -> None:
    assert predicate("a > 3 AND a < 4") == AttrPredicate("a", ColumnType.INT, empty=True)


def test_float_equal_bounds_with_an_open_end_are_empty() -> None:
    assert predicate("x > 1 AND x <= 1") == AttrPredicate("x", ColumnType.FLOAT, empty=True)


def test_a_single_admitted_value_excluded_by_not_equal_is_empty() -> None:
    assert predicate("x >= 1 AND x <= 1 AND x != 1") == AttrPredicate(
        "x", ColumnType.FLOAT, empty=True
    )
    assert predicate("a >= 1 AND a <= 2 AND a != 1 AND a != 2") == AttrPredicate(
        "a", ColumnType.INT, empty=True
    )


def test_satisfiable_query_is_not_a_contradiction() -> None:
    assert not query("SELECT * FROM R WHERE a > 3 AND a < 5").contradiction
    assert not query("SELECT * FROM R").contradiction


def test_text_compares_with_text() -> None:
    assert predicate("name >= 'b' AND name < 'd'") == AttrPredicate(
        "name", ColumnType.TEXT, lo="b", hi="d", hi_open=True
    )
    assert predicate("name = 'it''s'") == AttrPredicate(
        "name", ColumnType.TEXT, eq=frozenset({"it's"})
    )


def test_bool_equality_is_a_set_of_bools() -> None:
    pred = predicate("flag = TRUE")
    assert pred == AttrPredicate("flag", ColumnType.BOOL, eq=frozenset({True}))
    assert pred.eq is not None
    assert all(type(v) is bool for v in pred.eq)


def test_bool_not_equal_becomes_the_other_value() -> None:
    assert predicate("flag != true") == AttrPredicate(
        "flag", ColumnType.BOOL, eq=frozenset({False})
    )


def test_bool_excluding_both_values_is_a_contradiction() -> None:
    q = query("SELECT * FROM R WHERE flag != TRUE AND flag <> FALSE")
    assert q.sources[0].predicates == (AttrPredicate("flag", ColumnType.BOOL, eq=frozenset()),)
    assert q.contradiction


def test_bool_in_both_values_restricts_nothing() -> None:
    assert predicates("flag IN (TRUE, FALSE)") == ()


def test_int_in_zero_and_one_is_a_restriction_unlike_bool_in_both_values() -> None:
    assert predicate("a IN (0, 1)") == AttrPredicate("a", ColumnType.INT, eq=frozenset({0, 1}))


def test_bool_ordering_puts_false_before_true() -> None:
    assert predicate("flag < TRUE") == AttrPredicate("flag", ColumnType.BOOL, eq=frozenset({False}))
    assert predicate("flag BETWEEN TRUE AND TRUE") == AttrPredicate(
        "flag", ColumnType.BOOL, eq=frozenset({True})
    )
    assert predicates("flag >= FALSE") == ()
    assert query("SELECT * FROM R WHERE flag > TRUE").contradiction


def test_between_is_an_inclusive_pair_of_bounds() -> None:
    assert predicate("x BETWEEN 1 AND 2.5") == AttrPredicate("x", ColumnType.FLOAT, lo=1.0, hi=2.5)


def test_between_reversed_is_a_contradiction() -> None:
    assert query("SELECT * FROM R WHERE a BETWEEN 5 AND 1").contradiction


def test_in_list_is_an_equality_set() -> None:
    assert predicate("name IN ('a', 'b', 'a')") == AttrPredicate(
        "name", ColumnType.TEXT, eq=frozenset({"a", "b"})
    )


def test_negative_constants() -> None:
    assert predicate("a > -3 AND a < - 1") == AttrPredicate("a", ColumnType.INT, lo=-2, hi=-2)


def test_predicates_are_one_per_column_sorted_by_column() -> None:
    assert [p.column for p in predicates("x > 1 AND b = 2 AND a < 3 AND x < 5")] == ["a", "b", "x"]


def test_ts_is_a_float_column_and_tupleid_an_int_column() -> None:
    assert predicates("ts >= 1700000000 AND tupleID > 5") == (
        AttrPredicate("ts", ColumnType.FLOAT, lo=1700000000.0),
        AttrPredicate("tupleID", ColumnType.INT, lo=6),
    )


def test_int_constants_beyond_64_bits_restrict_nothing_or_everything() -> None:
    assert predicates("a < 1e19 AND a > -1e19") == ()
    assert predicate("a > 1e19") == AttrPredicate("a", ColumnType.INT, empty=True)
    assert predicate("a = 1e19") == AttrPredicate("a", ColumnType.INT, eq=frozenset())


def test_integer_literal_beyond_64_bits_is_an_error() -> None:
    assert "out of the 64-bit range" in str(error("SELECT * FROM R WHERE a > 9223372036854775808"))


def test_parentheses_around_factors_and_the_conjunction_are_accepted() -> None:
    assert predicates("((a > 1) AND (b < 2 AND x = 1))") == (
        AttrPredicate("a", ColumnType.INT, lo=2),
        AttrPredicate("b", ColumnType.INT, hi=1),
        AttrPredicate("x", ColumnType.FLOAT, eq=frozenset({1.0})),
    )


@pytest.mark.parametrize(
    "factor, message",
    [("road = 5", "cannot compare TEXT column 'road' with number 5"),
     ("lane = 'x'", "cannot compare INT column 'lane' with string 'x'"),
     ("speed > TRUE", "cannot compare FLOAT column 'speed' with TRUE"),
     ("lane IN (1, 'x')", "cannot compare INT column 'lane' with string 'x'"),
     ("road BETWEEN 'a' AND 3", "cannot compare TEXT column 'road' with number 3")],
)  # fmt: skip
def test_type_mismatch_names_both_types(factor: str, message: str) -> None:
    assert message in str(error(f"SELECT * FROM traffic WHERE {factor}"))


def test_type_mismatch_points_at_the_constant() -> None:
    e = error("SELECT * FROM traffic WHERE road = 5")
    assert (e.line, e.column) == (1, 36)


def test_comparing_two_constants_is_an_error() -> None:
    assert "compares two constants" in str(error("SELECT * FROM R WHERE 1 = 1"))


# WHERE: multi-attribute factors


def test_column_comparison_is_a_column_factor() -> None:
    src = source("SELECT * FROM R WHERE a < b")
    assert src.column_factors == (ColumnFactor("a", CompareOp.LT, "b", 0),)
    assert src.predicates == ()


@pytest.mark.parametrize(
    "factor, offset",
    [("a < b + 3", 3), ("a < b - 3", -3), ("a < b - -3", 3), ("x < y + 0.5", 0.5),
     ("a < x + 3", 3), ("x < a - 0.5", -0.5)],
)
def test_column_factor_offset_is_on_the_right(factor: str, offset: float) -> None:
    (cf,) = source(f"SELECT * FROM R WHERE {factor}").column_factors
    assert cf == ColumnFactor(factor[0], CompareOp.LT, factor[4], offset)
    assert type(cf.offset) is type(offset)


@pytest.mark.parametrize(
    "factor, folded",
    [("a < b + 0.5", ColumnFactor("a", CompareOp.LE, "b", 0)),       # a - b < 0.5: a - b <= 0
     ("a <= b - 0.5", ColumnFactor("a", CompareOp.LE, "b", -1)),     # a - b <= -0.5: <= -1
     ("a > b + 2.5", ColumnFactor("a", CompareOp.GT, "b", 2)),        # a - b > 2.5: >= 3
     ("a >= b - 2.5", ColumnFactor("a", CompareOp.GT, "b", -3)),      # a - b >= -2.5: >= -2
     ("a = b + 2.0", ColumnFactor("a", CompareOp.EQ, "b", 2))],
)
def test_fractional_offset_between_int_columns_is_an_integer_one(
        factor: str, folded: ColumnFactor) -> None:
    (cf,) = source(f"SELECT * FROM R WHERE {factor}").column_factors
    assert cf == folded
    assert type(cf.offset) is int


def test_int_column_factor_no_integers_satisfy_is_a_contradiction() -> None:
    q = query("SELECT * FROM R WHERE a = b + 0.5")
    assert q.contradiction


def test_int_column_factor_every_integer_satisfies_is_dropped() -> None:
    q = query("SELECT * FROM R WHERE a <> b - 0.5 AND a > 1")
    assert not q.contradiction and q.sources[0].column_factors == ()


def test_column_factor_folds_diamond_to_bang_equal() -> None:
    assert source("SELECT * FROM R WHERE x <> y").column_factors == (
        ColumnFactor("x", CompareOp.NE, "y"),
    )


def test_column_factor_may_compare_int_with_float_and_a_column_with_itself() -> None:
    assert source("SELECT * FROM R WHERE a >= x AND a = a").column_factors == (
        ColumnFactor("a", CompareOp.GE, "x"), ColumnFactor("a", CompareOp.EQ, "a"))  # fmt: skip


def test_column_factor_on_bool_columns() -> None:
    schemas = {"P": StreamSchema("P", (("f", "bool"), ("g", "bool")))}
    q = query("SELECT * FROM P WHERE f < g", schemas)
    assert q.sources[0].column_factors == (ColumnFactor("f", CompareOp.LT, "g"),)


def test_column_factor_on_text_columns() -> None:
    schemas = {"P": StreamSchema("P", (("s", "text"), ("t", "text")))}
    q = query("SELECT * FROM P WHERE s <= t", schemas)
    assert q.sources[0].column_factors == (ColumnFactor("s", CompareOp.LE, "t"),)


def test_column_factor_type_mismatch_names_both_columns() -> None:
    assert "cannot compare TEXT column 'name' with INT column 'a'" in str(
        error("SELECT * FROM R WHERE name = a")
    )


def test_arithmetic_on_a_text_column_is_an_error() -> None:
    schemas = {"P": StreamSchema("P", (("s", "text"), ("t", "text")))}
    assert "cannot add a number to TEXT column 't'" in str(
        error("SELECT * FROM P WHERE s < t + 1", schemas)
    )


@pytest.mark.parametrize("where", ["a + 1 < b", "a - 1 > 5", "5 < a + 1"])
def test_arithmetic_is_only_allowed_on_the_right_hand_column(where: str) -> None:
    assert "arithmetic is only supported" in str(error(f"SELECT * FROM R WHERE {where}"))


# unsupported features


@pytest.mark.parametrize(
    "sql, message",
    [("SELECT * FROM R WHERE a = 1 OR a = 2", "OR is not supported"),
     ("SELECT * FROM R WHERE NOT a = 1", "NOT is not supported"),
     ("SELECT * FROM R WHERE a NOT IN (1)", "NOT is not supported"),
     ("SELECT * FROM R WHERE a NOT BETWEEN 1 AND 2", "NOT is not supported"),
     ("SELECT * FROM R WHERE a IN (SELECT a FROM R)", "subqueries are not supported"),
     ("SELECT * FROM R WHERE (SELECT a FROM R) = 1", "subqueries are not supported"),
     ("SELECT * FROM (SELECT a FROM R)", "subqueries are not supported"),
     ("SELECT * FROM R WHERE max(a) > 1", "aggregates are not supported in WHERE"),
     ("SELECT abs(a) FROM R", "functions are not supported"),
     ("SELECT a FROM R WHERE a > 1 HAVING a > 2", "HAVING is not supported yet"),
     ("SELECT a FROM R ORDER BY a", "ORDER BY is not supported"),
     ("SELECT a FROM R LIMIT 5", "LIMIT is not supported"),
     ("SELECT a FROM R UNION SELECT a FROM R", "UNION is not supported"),
     ("SELECT a FROM R JOIN traffic", "JOIN is not supported: list the streams in FROM"),
     ("SELECT a FROM R WHERE a IS NULL", "not supported"),
     ("SELECT a FROM R WHERE name LIKE 'x%'", "LIKE is not supported")],
)  # fmt: skip
def test_unsupported_features_are_rejected_by_name(sql: str, message: str) -> None:
    assert message in str(error(sql))


def test_second_from_item_makes_a_join() -> None:
    q = query("SELECT a FROM R, traffic")
    assert [(s.stream, s.alias) for s in q.sources] == [("R", "R"), ("traffic", "traffic")]
    assert q.select == (SelectItem(0, "a", "a"),)


def test_now_in_where_is_rejected() -> None:
    assert "NOW is only allowed in BEGIN and END" in str(error("SELECT * FROM R WHERE ts > NOW"))


# windows: BEGIN ... END


def test_no_window_means_everything_retained() -> None:
    assert window("") == Window(WindowType.ALL)


def test_sliding_window_is_a_range_relative_to_now() -> None:
    assert window("BEGIN NOW - 10 END NOW") == Window(WindowType.RANGE, relative(-10), relative(0))


@pytest.mark.parametrize(
    "edge, seconds",
    [("NOW - 10 SECONDS", -10), ("NOW - 1 second", -1), ("NOW - 10 MINUTES", -600),
     ("NOW - 2 HOUR", -7200), ("NOW - 1 DAY", -86400), ("NOW - 1.5 minutes", -90),
     ("NOW + 5", 5)],
)  # fmt: skip
def test_time_units_convert_to_seconds(edge: str, seconds: float) -> None:
    assert window(f"BEGIN {edge} END NOW + 10").begin == relative(seconds)


def test_time_expressions_may_be_parenthesized() -> None:
    assert window("BEGIN (NOW - 10) END (NOW)") == Window(
        WindowType.RANGE, relative(-10), relative(0)
    )


def test_landmark_window_begins_at_epoch_seconds() -> None:
    assert window("BEGIN 1700000000 END NOW") == Window(
        WindowType.RANGE, absolute(1.7e9), relative(0)
    )


@pytest.mark.parametrize(
    "stamp, seconds",
    [("2000-01-01 00:00:00", 946684800), ("2000-01-01T00:00:00", 946684800),
     ("2000-01-01T00:00:00Z", 946684800), ("2000-01-01 00:00:00.25", 946684800.25),
     ("2000-01-01T01:00:00+01:00", 946684800), ("1999-12-31T23:30:00-00:30", 946684800),
     ("2000-01-01 05:30:00+0530", 946684800), ("1970-01-02 00:00", 86400)],
)  # fmt: skip
def test_iso_timestamps_are_utc_unless_they_carry_an_offset(stamp: str, seconds: float) -> None:
    assert window(f"BEGIN '{stamp}' END NOW").begin == absolute(seconds)


def test_snapshot_window_has_two_constant_edges() -> None:
    w = window("BEGIN 100 END '1970-01-01 00:02:00'")
    assert w == Window(WindowType.RANGE, absolute(100), absolute(120))
    assert w.begin is not None and w.end is not None
    assert not w.begin.relative and not w.end.relative


def test_constant_begin_after_constant_end_is_an_error() -> None:
    e = error("SELECT * FROM R BEGIN 200 END 100")
    assert "BEGIN 200 is after END 100" in str(e)
    assert (e.line, e.column) == (1, 17)


def test_relative_begin_after_relative_end_is_an_error() -> None:
    assert "is after END" in str(error("SELECT * FROM R BEGIN NOW END NOW - 5"))


def test_invalid_timestamp_is_an_error() -> None:
    e = error("SELECT * FROM R BEGIN '2000-13-01 00:00:00' END NOW")
    assert "invalid timestamp '2000-13-01 00:00:00'" in str(e)
    assert (e.line, e.column) == (1, 23)


def test_rows_window_from_begin_end() -> None:
    assert window("BEGIN (NOW - 100 ROWS) END NOW") == Window(WindowType.ROWS, rows=100)


def test_rows_window_needs_end_now() -> None:
    assert "END must be NOW" in str(error("SELECT * FROM R BEGIN NOW - 100 ROWS END NOW - 1"))


@pytest.mark.parametrize("clause", ["BEGIN NOW - 0 ROWS END NOW", "BEGIN NOW - 2.5 ROWS END NOW"])
def test_rows_window_needs_a_positive_integer(clause: str) -> None:
    assert "positive whole number" in str(error(f"SELECT * FROM R {clause}"))


def test_rows_in_end_is_an_error() -> None:
    assert "ROWS belongs in BEGIN" in str(error("SELECT * FROM R BEGIN NOW END NOW - 5 ROWS"))


def test_unknown_time_unit_is_an_error() -> None:
    assert "expected a unit" in str(error("SELECT * FROM R BEGIN NOW - 1 WEEK END NOW"))


# windows: per-stream (CQL)


@pytest.mark.parametrize(
    "spec, expected",
    [("[RANGE 10 MINUTES]", Window(WindowType.RANGE, relative(-600), relative(0))),
     ("[RANGE 10]", Window(WindowType.RANGE, relative(-10), relative(0))),
     ("[RANGE UNBOUNDED]", Window(WindowType.ALL)),
     ("[ROWS 100]", Window(WindowType.ROWS, rows=100)),
     ("[PARTITION BY lane ROWS 5]", Window(WindowType.PARTITION, rows=5, partition_by=("lane",))),
     ("[PARTITION BY road, t.lane ROWS 2]",
      Window(WindowType.PARTITION, rows=2, partition_by=("road", "lane"))),
     ("[NOW]", Window(WindowType.RANGE, relative(0), relative(0)))],
)  # fmt: skip
def test_per_stream_window(spec: str, expected: Window) -> None:
    assert source(f"SELECT * FROM traffic t {spec}").window == expected


def test_partition_column_must_exist() -> None:
    assert "unknown column 'lanes' in stream 'traffic'" in str(
        error("SELECT * FROM traffic [PARTITION BY lanes ROWS 5]")
    )


@pytest.mark.parametrize("spec", ["[ROWS 0]", "[ROWS 2.5]", "[PARTITION BY lane ROWS 0]"])
def test_per_stream_rows_must_be_a_positive_integer(spec: str) -> None:
    assert "positive whole number" in str(error(f"SELECT * FROM traffic {spec}"))


def test_per_stream_window_with_begin_end_is_an_error() -> None:
    assert "BEGIN/END cannot be used" in str(
        error("SELECT * FROM traffic [ROWS 5] BEGIN NOW - 1 END NOW")
    )


def test_range_of_rows_is_an_error() -> None:
    assert "use [ROWS n]" in str(error("SELECT * FROM traffic [RANGE 5 ROWS]"))


# syntax errors


def test_syntax_error_names_what_was_expected_where() -> None:
    e = error("SELECT * FROM traffic WHERE traffic.speed speeed > 50")
    assert str(e) == (
        "line 1, column 43: expected a comparison operator after 'traffic.speed', "
        "found 'speeed'"
    )


def test_error_position_counts_lines_and_columns() -> None:
    e = error("SELECT a\nFROM R\nWHERE a >< 3")
    assert (e.line, e.column) == (3, 10)
    assert str(e).startswith("line 3, column 10: ")


def test_query_error_is_a_value_error() -> None:
    assert isinstance(error("SELECT"), ValueError)


@pytest.mark.parametrize("sql", ["", "   ", "-- nothing\n", ";"])
def test_empty_statement_is_an_error(sql: str) -> None:
    assert "empty statement" in str(error(sql))


def test_unknown_statement_is_an_error() -> None:
    assert ("expected SELECT, CREATE STREAM, SHOW, DESCRIBE or DROP STREAM, found 'ALTER'"
            in str(error("ALTER STREAM R")))


# ---------------------------------------------------------------------- the catalog


@pytest.mark.parametrize("sql, expected", [
    ("SHOW STREAMS", Catalog(SHOW_STREAMS)),
    ("show queries;", Catalog(SHOW_QUERIES)),
    ("DESCRIBE traffic", Catalog(DESCRIBE, "traffic")),
    ("DROP STREAM R", Catalog(DROP_STREAM, "R")),
    ("drop stream R Cascade ;", Catalog(DROP_STREAM, "R", cascade=True)),
])
def test_catalog_statements_compile(sql: str, expected: Catalog) -> None:
    assert compile_statement(sql, SCHEMAS) == expected


def test_catalog_words_are_not_reserved() -> None:
    schema = stream_schema("CREATE STREAM show (streams INT, cascade INT)", {})
    assert compile_statement("DROP STREAM show CASCADE", {"show": schema}) == \
        Catalog(DROP_STREAM, "show", cascade=True)


@pytest.mark.parametrize("sql, message, column", [
    ("SHOW", "expected STREAMS or QUERIES after 'SHOW', found the end of the statement", 5),
    ("SHOW TABLES", "expected STREAMS or QUERIES after 'SHOW', found 'TABLES'", 6),
    ("SHOW STREAMS R", "expected the end of the statement after 'STREAMS', found 'R'", 14),
    ("DESCRIBE", "expected a stream name after 'DESCRIBE', found the end", 9),
    ("DESCRIBE SELECT", "found the reserved word 'SELECT'", 10),
    ("DROP R", "expected STREAM after 'DROP', found 'R'", 6),
    ("DROP STREAM R RESTRICT", "expected CASCADE or the end of the statement after 'R', "
                               "found 'RESTRICT'", 15),
    ("DROP STREAM R CASCADE; SHOW STREAMS", "one statement at a time", 24),
])
def test_catalog_syntax_errors_say_where(sql: str, message: str, column: int) -> None:
    err = error(sql)
    assert message in str(err) and (err.line, err.column) == (1, column)


@pytest.mark.parametrize("sql", ["DESCRIBE nope", "DROP STREAM nope", "DROP STREAM nope CASCADE"])
def test_catalog_of_an_unknown_stream_is_an_error(sql: str) -> None:
    err = error(sql)
    assert "unknown stream 'nope' (streams: R, traffic)" in str(err)
    assert err.column == sql.index("nope") + 1


def test_missing_from_is_an_error() -> None:
    assert "expected ',', AS or FROM after 'a', found the end" in str(error("SELECT a"))


def test_trailing_garbage_is_an_error() -> None:
    e = error("SELECT a FROM R WHERE a = 1 b")
    assert "found 'b'" in str(e)
    assert (e.line, e.column) == (1, 29)


def test_only_one_statement_at_a_time() -> None:
    assert "one statement at a time" in str(error("SELECT a FROM R; SELECT b FROM R"))


def test_unterminated_string_is_an_error_at_its_opening_quote() -> None:
    e = error("SELECT * FROM R WHERE name = 'abc")
    assert "unterminated string" in str(e)
    assert (e.line, e.column) == (1, 30)


def test_unexpected_character_is_an_error() -> None:
    assert "unexpected character '\"'" in str(error('SELECT * FROM R WHERE name = "x"'))


def test_letters_and_digits_outside_ascii_are_refused_by_name() -> None:
    e = error("SELECT * FROM R WHERE caf\u00e9 = 1")
    assert "unexpected character '\u00e9'" in str(e) and (e.line, e.column) == (1, 26)
    assert "unexpected character '\u0663'" in str(error("SELECT * FROM R WHERE a = \u0663"))


def test_malformed_number_is_an_error() -> None:
    assert "malformed number '12abc'" in str(error("SELECT * FROM R WHERE a = 12abc"))


def test_incomplete_where_is_an_error() -> None:
    assert "expected a column or a constant after 'AND'" in str(
        error("SELECT * FROM R WHERE a = 1 AND")
    )


def test_float_literal_overflow_is_an_error() -> None:
    assert "out of range" in str(error("SELECT * FROM R WHERE x > 1e999"))


def test_int_bounds_are_exact_for_large_float_constants() -> None:
    assert predicate("a <= 1e18").hi == 10**18 and predicate("a < 1e18").hi == 10**18 - 1
    hi = predicate("x <= 1e18").hi
    assert isinstance(hi, (int, float)) and math.isclose(hi, 1e18)


def test_parentheses_nest_at_most_64_deep() -> None:
    assert query("SELECT * FROM R WHERE " + "(" * 64 + "a > 1" + ")" * 64).sources
    e = error("SELECT * FROM R WHERE " + "(" * 5000 + "a > 1" + ")" * 5000)
    assert "nested more than 64 deep" in str(e) and (e.line, e.column) == (1, 23 + 64)
    assert "nested more than 64 deep" in str(
        error("SELECT * FROM R WHERE a > 1 BEGIN " + "(" * 100 + "NOW" + ")" * 100 + " END NOW"))


def test_stream_and_column_names_have_at_most_64_characters() -> None:
    assert stream_schema(f"CREATE STREAM {'s' * 64} ({'c' * 64} INT)", {}).name == "s" * 64
    long_stream = error(f"CREATE STREAM {'s' * 300} (a INT)")
    assert "300 characters long" in str(long_stream) and "at most 64" in str(long_stream)
    assert "column name" in str(error(f"CREATE STREAM T ({'c' * 65} INT)"))


def test_a_statement_that_is_not_a_string_is_a_query_error() -> None:
    bad_values: tuple[Any, ...] = (5, None, b"SELECT * FROM R")    # not str, on purpose
    for bad in bad_values:
        with pytest.raises(QueryError, match="a statement is a string of SQL"):
            compile_statement(bad, {})
