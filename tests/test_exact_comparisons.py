"""Comparisons between columns with an offset are exact as written, in every mode and
whether the query is registered before or after the data (docs/semantics.md, "Values and
comparisons"):

* FLOAT `b.x > a.x + 1` computes a.x + 1 in doubles and compares; rewriting it as
  `a.x < b.x - 1` would round differently (1.575 + 1 == 2.575, but 2.575 - 1 > 1.575);
* INT with INT plus a fractional offset is a comparison of integers (`a = b + 0.5` never
  holds), with no detour through doubles, which cannot tell 2**62 from 2**62 + 1;
* with a FLOAT involved, the INT side plus its offset is exact and then rounded once.
"""

from __future__ import annotations

from typing import Any

import pytest

import psoup
from psoup.options import ModeName

BIG = 2**62


@pytest.fixture(params=psoup.MODES)
def mode(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def answers(mode: ModeName, ddl: str, stream: str, batches: list[list[tuple[Any, ...]]],
            sql: str) -> list[list[tuple[Any, ...]]]:
    """The query's rows when registered before the data and when registered after."""
    out: list[list[tuple[Any, ...]]] = []
    for register_first in (True, False):
        eng = psoup.Engine(mode=mode)
        eng.execute(ddl)
        h = eng.register(sql) if register_first else None
        for i, rows in enumerate(batches):
            eng.insert(stream, rows, ts=1.0 + i)
        h = h or eng.register(sql)
        out.append(eng.invoke(h, now=10.0).rows)
    return out


def test_float_join_offset_is_evaluated_as_written(mode: ModeName) -> None:
    # 1.575 + 1 == 2.575 in doubles, so b.x > a.x + 1 does not hold for (1.575, 2.575)
    assert 1.575 + 1 == 2.575 and 2.575 - 1 > 1.575
    before, after = answers(mode, "CREATE STREAM T (x FLOAT)", "T", [[(1.575,)], [(2.575,)]],
                            "SELECT a.x, b.x FROM T a, T b WHERE b.x > a.x + 1")
    assert before == after == []
    before, after = answers(mode, "CREATE STREAM T (x FLOAT)", "T", [[(1.575,)], [(2.575,)]],
                            "SELECT a.x, b.x FROM T a, T b WHERE b.x >= a.x + 1")
    assert before == after == [(1.575, 2.575)]


def test_float_column_offset_is_evaluated_as_written(mode: ModeName) -> None:
    # 0.1 + 0.2 > 0.3 in doubles
    before, after = answers(mode, "CREATE STREAM T (x FLOAT, y FLOAT)", "T",
                            [[(0.3, 0.1), (0.30000000000000004, 0.1)]],
                            "SELECT x FROM T WHERE x = y + 0.2")
    assert before == after == [(0.30000000000000004,)]


@pytest.mark.parametrize("sql, want", [
    ("SELECT a FROM R WHERE a = b + 0.5", []),
    ("SELECT a FROM R WHERE a < b - 0.5", [(BIG,)]),        # a - b = -1 < -0.5
    ("SELECT a FROM R WHERE a > b - 1.5", [(BIG,)]),        # -1 > -1.5
    ("SELECT a FROM R WHERE a >= b - 0.5", []),             # -1 >= -0.5 fails
    ("SELECT a FROM R WHERE a != b + 0.5", [(BIG,)]),
    ("SELECT r1.a FROM R r1, R r2 WHERE r1.a = r2.b + 0.5", []),
    ("SELECT r1.a FROM R r1, R r2 WHERE r1.a < r2.b - 0.5", [(BIG,)]),
    ("SELECT r1.a FROM R r1, R r2 WHERE r2.b > r1.a + 0.5", [(BIG,)]),     # 1 > 0.5
    ("SELECT r1.a FROM R r1, R r2 WHERE r2.b <= r1.a + 0.5", []),
])
def test_int_compared_with_int_plus_a_float_offset_is_exact(mode: ModeName, sql: str,
                                                            want: list[tuple[int]]) -> None:
    before, after = answers(mode, "CREATE STREAM R (a INT, b INT)", "R", [[(BIG, BIG + 1)]],
                            sql)
    assert before == after == want


def test_int_plus_an_offset_beyond_int64_does_not_wrap(mode: ModeName) -> None:
    top = 2**63 - 1
    before, after = answers(mode, "CREATE STREAM R (a INT, b INT)", "R", [[(top, top)]],
                            "SELECT a FROM R WHERE a < b + 1")
    assert before == after == [(top,)]
    # the offset 1.8e19 is the integer 18 * 10**18 (beyond int64 itself): b + it is
    # 8776627963145224192, inside int64 again, and a is above it
    before, after = answers(mode, "CREATE STREAM R (a INT, b INT)", "R", [[(top, -top - 1)]],
                            "SELECT r1.a FROM R r1, R r2 WHERE r1.a > r2.b + 1.8e19")
    assert before == after == [(top,)]
    before, after = answers(mode, "CREATE STREAM R (a INT, b INT)", "R", [[(top, -top - 1)]],
                            "SELECT r1.a FROM R r1, R r2 WHERE r1.a > r2.b + 1.9e19")
    assert before == after == []


@pytest.mark.parametrize("sql, want", [
    # x = 2**53 + 2.0; a + 0.5 = 2**53 + 1.5 exactly, which rounds once to 2**53 + 2
    ("SELECT a FROM R WHERE x = a + 0.5", [(2**53 + 1,)]),
    # float(a) + 0.5 would be 2**53 + 0.5 -> 2**53: not what exact-then-round gives
    ("SELECT a FROM R WHERE x > a + 0.5", []),
    # a + 1 = 2**53 + 2 exactly
    ("SELECT a FROM R WHERE x = a + 1", [(2**53 + 1,)]),
    # the FLOAT side's offset is double arithmetic: x - 1 = 2**53 + 1 rounds to 2**53
    # (ties to even), and a alone rounds to 2**53 as well
    ("SELECT a FROM R WHERE a > x - 1", []),
    ("SELECT a FROM R WHERE a = x - 1", [(2**53 + 1,)]),
])
def test_int_side_is_exact_then_rounded_once_against_a_float(mode: ModeName, sql: str,
                                                             want: list[tuple[int]]) -> None:
    before, after = answers(mode, "CREATE STREAM R (a INT, x FLOAT)", "R",
                            [[(2**53 + 1, float(2**53 + 2))]], sql)
    assert before == after == want
