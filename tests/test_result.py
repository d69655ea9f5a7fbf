"""Answers as columns: to_numpy, to_arrow and to_pandas give what `rows` gives; DISTINCT
and `since` over numeric columns keep and report what they do over rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from numpy.typing import NDArray

import psoup
from psoup.options import ModeName
from psoup.results.cursors import _differ, _differ_columns, difference
from psoup.results.result import Result
from tests.answer_strategies import numeric_columns, two_answers


@pytest.fixture
def eng() -> psoup.Engine:
    e = psoup.Engine(clock=lambda: 100.0)
    e.execute("CREATE STREAM R (a INT, x FLOAT, name TEXT, ok BOOL)")
    e.insert("R", [(1, 0.5, "p", True), (2, 1.5, "q", False), (1, 0.5, "p", True),
                   (7, -2.0, "r", True)], ts=[1.0, 2.0, 3.0, 4.0])
    return e


def _as_columns(result: Result) -> dict[str, list[Any]]:
    return {name: [row[i] for row in result.rows] for i, name in enumerate(result.columns)}


@pytest.mark.parametrize("sql", [
    "SELECT a, x, name, ok FROM R WHERE a < 5",
    "SELECT DISTINCT a, name FROM R",
    "SELECT name FROM R WHERE a > 100",
    "SELECT a, COUNT(*) AS n, SUM(x) AS s FROM R GROUP BY a",
    "SELECT r1.a, r2.name FROM R r1, R r2 WHERE r1.a = r2.a",
])
def test_columns_hold_what_the_rows_hold(eng: psoup.Engine, sql: str) -> None:
    answer = eng.invoke(eng.register(sql), now=10.0)
    want = _as_columns(answer)
    got = answer.to_numpy()
    assert list(got) == answer.columns
    assert {name: values.tolist() for name, values in got.items()} == want
    table = answer.to_arrow()
    assert table.column_names == answer.columns and table.num_rows == len(answer)
    assert table.to_pydict() == want
    frame = answer.to_pandas()
    assert list(frame.columns) == answer.columns and len(frame) == len(answer)


def test_rows_are_built_only_when_asked_for_and_then_kept(eng: psoup.Engine) -> None:
    answer = eng.invoke(eng.register("SELECT a FROM R WHERE a < 5"), now=10.0)
    assert len(answer) == 3 and answer._rows is None     # the count needs no rows
    assert answer.rows == [(1,), (2,), (1,)]
    assert answer.rows is answer.rows


@pytest.mark.parametrize("mode", ["partial", "complete", "nomat"])
@pytest.mark.parametrize("columns", ["a", "name, a", "ts, a"])
def test_ts_and_tuple_ids_read_late_are_those_of_the_rows_even_after_they_expired(
        mode: ModeName, columns: str) -> None:
    """An answer's ts and tupleIDs may be taken from the stream only when first read
    (PSoup-P over a position range), or when retention drops a chunk, whichever comes
    first: they are those of the answer's rows however far retention has moved on and
    however many chunks it has recycled meanwhile, and no chunk stays held."""
    e = psoup.Engine(mode=mode, chunk_rows=64)
    e.execute("CREATE STREAM R (a INT, name TEXT) RETAIN 100 ROWS")
    h = e.register(f"SELECT {columns} FROM R WHERE a < 1000 BEGIN (NOW - 90 ROWS) END NOW")
    v = np.arange(300)
    a = np.where(v % 3 == 0, v, v + 1000)       # every third tuple matches
    ids = e.insert("R", {"a": a, "name": [f"n{x}" for x in a]}, ts=v.astype(float))
    answer = e.invoke(h, now=299.0)
    rows_wanted = [v for v in range(210, 300) if v % 3 == 0]
    for k in range(1, 20):              # every chunk the answer read expires, and more
        b = np.arange(300 * k, 300 * (k + 1))
        e.insert("R", {"a": b % 7, "name": ["x"] * len(b)}, ts=b.astype(float) + 0.5)
    assert answer._identity is None     # taken as retention dropped a chunk: none held
    assert answer.ts.tolist() == [float(v) for v in rows_wanted]
    assert answer.tuple_ids.tolist() == ids[rows_wanted].tolist()
    assert answer.to_numpy()["a"].tolist() == rows_wanted
    assert len(answer) == len(rows_wanted)
    again = e.invoke(h, now=10_000.0)
    assert not set(again.tuple_ids.tolist()) & set(answer.tuple_ids.tolist())
    e._check()


def test_a_result_taking_ts_and_tuple_ids_late_asks_once_and_pickles_them() -> None:
    calls = []

    def identity() -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        calls.append(1)
        return np.array([1.0, 2.0]), np.array([10, 11])
    r = Result(["a"], None, None, None, values=[np.array([5, 6])], identity=identity)
    assert len(r) == 2 and not calls               # the length needs neither
    assert r.tuple_ids.tolist() == [10, 11] and r.ts.tolist() == [1.0, 2.0]
    assert len(calls) == 1
    assert not r.ts.flags.writeable
    import pickle
    back = pickle.loads(pickle.dumps(r))
    assert back.ts.tolist() == [1.0, 2.0] and back.tuple_ids.tolist() == [10, 11]


def test_text_and_bool_columns_keep_their_types(eng: psoup.Engine) -> None:
    got = eng.invoke(eng.register("SELECT name, ok FROM R"), now=10.0).to_numpy()
    assert got["name"].dtype == object and got["name"].tolist() == ["p", "q", "p", "r"]
    assert got["ok"].dtype == np.bool_


def test_a_result_made_of_rows_converts_too() -> None:
    r = Result(["a", "t"], [(1, "x"), (None, "y")], np.array([1.0, 2.0]), np.array([0, 1]))
    got = r.to_numpy()
    assert got["a"].tolist() == [1, None] and got["t"].tolist() == ["x", "y"]
    assert r.to_arrow().to_pydict() == {"a": [1, None], "t": ["x", "y"]}


def _exact(rows: Iterable[Sequence[object]]) -> list[tuple[tuple[type, str], ...]]:
    """Rows as (type, repr) of each value: NaN equals NaN here, -0.0 is not 0.0."""
    return [tuple((type(v), repr(v)) for v in row) for row in rows]


def _pair(columns: list[NDArray[Any]]) -> tuple[Result, Result]:
    """The same answer twice: held as columns, and as the rows they give."""
    n = len(columns[0])
    ts, ids = np.arange(n, dtype=float), np.arange(n) * 3
    names = [f"c{i}" for i in range(len(columns))]
    columned = Result(names, None, ts, ids, values=columns)
    return columned, Result(names, columned.rows, ts, ids)


@given(numeric_columns())
def test_distinct_on_numeric_columns_keeps_what_distinct_on_rows_keeps(
        columns: list[NDArray[Any]]) -> None:
    columned, rowed = _pair(columns)
    got, want = columned.distinct(), rowed.distinct()
    assert got.values is not None                       # it stayed columns
    assert _exact(got.rows) == _exact(want.rows)
    assert got.ts.tolist() == want.ts.tolist()
    assert got.tuple_ids.tolist() == want.tuple_ids.tolist()


def test_distinct_over_text_falls_back_to_rows(eng: psoup.Engine) -> None:
    answer = eng.invoke(eng.register("SELECT DISTINCT a, name FROM R"), now=10.0)
    assert answer.rows == [(1, "p"), (2, "q"), (7, "r")]
    assert answer.tuple_ids.tolist() == [0, 1, 3]


@given(two_answers())
def test_changes_between_numeric_distinct_answers_equal_the_row_comparison(
        answers: tuple[list[NDArray[Any]], list[NDArray[Any]]]) -> None:
    got, want = [difference(a.distinct(), b.distinct(), distinct=True)
                 for a, b in zip(*map(_pair, answers), strict=True)]
    for mine, theirs in zip(got, want, strict=True):
        assert mine.values is not None
        assert _exact(mine.rows) == _exact(theirs.rows)
        assert mine.tuple_ids.tolist() == theirs.tuple_ids.tolist()


@given(two_answers())
def test_multiset_difference_of_numeric_rows_equals_that_of_tuples(
        answers: tuple[list[NDArray[Any]], list[NDArray[Any]]]) -> None:
    old, new = answers
    rows = [_pair(columns)[1].rows for columns in (new, old)]
    got = _differ_columns(new, old)
    assert got is not None
    assert [m.tolist() for m in got] == [m.tolist() for m in _differ(*rows)]
