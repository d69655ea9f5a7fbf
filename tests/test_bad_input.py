"""Bad input through the embedded API: mutated SQL and garbage row batches get a psoup
error naming the problem (never an AssertionError, TypeError or RecursionError), and a
call that raises changes nothing."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import psoup
from psoup.errors import PSoupError
from tests.support import Clock

SQL = [
    "SELECT a, name FROM R WHERE a > 2 AND b <= 40.5 BEGIN NOW - 50 END NOW",
    "SELECT COUNT(*), SUM(b) FROM R WHERE a BETWEEN 1 AND 9 GROUP BY a",
    "SELECT DISTINCT name FROM R WHERE name IN ('x', 'y') [ROWS 10]",
    "SELECT r.a, s.b FROM R r, R s WHERE r.a = s.a + 1 AND r.b < 3",
    "CREATE STREAM S (x INT, y FLOAT, z TEXT, w BOOL) RETAIN 1 HOUR",
]
#: What a mutation inserts: SQL's own characters, and some a user would not mean.
PIECES = list("()[],.;*'\"-+<>=!0123456789 \n\tabcxyzRS_") + [
    "\u00e9", "\u0663", "\u00a0", "\U0001f600", "\x00", "AND ", "OR ", "((", "))",
    "SELECT ", "FROM ", "WHERE ", "NOW", "ROWS", "'", "''", "--", "1e999", "2e-999",
    "99999999999999999999999",
]


@st.composite
def mutated_sql(draw: st.DrawFn) -> str:
    sql = draw(st.sampled_from(SQL))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(sql)))
        kind = draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = draw(st.sampled_from(PIECES))
        if kind == "insert":
            sql = sql[:at] + piece + sql[at:]
        elif kind == "delete":
            sql = sql[:at] + sql[at + draw(st.integers(1, 6)):]
        else:
            sql = sql[:at] + piece + sql[at + len(piece):]
    return sql


VALUES = st.one_of(
    st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3), st.booleans(), st.none(), st.binary(max_size=2),
    st.lists(st.integers(0, 3), max_size=2), st.just(np.int64(3)), st.just(np.float32(1.5)),
    st.just(object()),
)
ROW = st.one_of(st.tuples(VALUES, VALUES, VALUES), st.lists(VALUES, max_size=4),
                st.dictionaries(st.sampled_from(["a", "b", "name", "zz", 1]), VALUES,
                                max_size=4), VALUES)
COLUMN = st.one_of(st.lists(VALUES, max_size=3),
                   st.sampled_from([np.arange(2), np.arange(2.0), np.array(["x", "y"]),
                                    np.zeros((2, 2)), np.array([True, False]),
                                    np.array([1, 2], dtype=np.uint64),
                                    np.array([2**64 - 1], dtype=np.uint64),
                                    np.array([math.nan, 1.0]), np.array([], dtype=object)]))
ROWS = st.one_of(st.lists(ROW, max_size=3),
                 st.dictionaries(st.sampled_from(["a", "b", "name", "zz"]), COLUMN, max_size=4),
                 VALUES, st.just(np.zeros((2, 3))))
TS = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True),
               st.lists(st.floats(-1e12, 1e12), max_size=3), st.text(max_size=2),
               st.just(np.array([1.0, 2.0])), st.integers(-(2**70), 2**70))


def _engine() -> psoup.Engine:
    eng = psoup.Engine(clock=Clock(1000.0))
    eng.execute("CREATE STREAM R (a INT, b FLOAT, name TEXT)")
    eng.register("SELECT a, name FROM R WHERE b > 0")
    eng.insert("R", [(1, 1.5, "x")], ts=500.0)
    return eng


def _state(eng: psoup.Engine) -> tuple[object, ...]:
    return ([eng.invoke(h, now=2000.0).rows for h, _ in eng.queries()], eng.queries(),
            {k: (v["rows"], v["latest_ts"]) for k, v in eng.stats()["streams"].items()})


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_sql())
def test_mutated_sql_is_a_psoup_error_or_a_statement(sql: str) -> None:
    eng = _engine()
    before = _state(eng)
    try:
        if sql.lstrip().upper().startswith("CREATE"):
            eng.execute(sql)
        else:
            eng.register(sql)
    except PSoupError:
        assert _state(eng) == before
    # any other exception fails the test: it is a crash on bad input


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ROWS, TS)
def test_garbage_rows_are_a_psoup_error_and_change_nothing(rows: object, ts: object) -> None:
    eng = _engine()
    before = _state(eng)
    try:
        eng.insert("R", rows, ts=ts)
    except PSoupError:
        assert _state(eng) == before
