"""A query's last answer reused by its next invocation (psoup.results.recent): the
answer must equal one read whole, whatever happened in between (new tuples, retention,
a window moved back, the query gone and its slot reused, the budget full), and the
reuse must really read only the tuples that arrived since.

The answers read whole (answer_cache_bytes=0) are themselves checked against DuckDB by
tests/test_differential.py, which runs with and without the reuse too. Small windows are
read whole by the engine's cost model (reusing pays over tens of thousands of tuples), so
the scenarios make it always reuse (`always_reuse`); the last tests use the model itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given
from numpy.typing import NDArray

import psoup
from psoup.options import ModeName
from psoup.plans import SelectionPlan
from psoup.results.materialized import Materialized, SelectionCut
from psoup.stems.span import Span
from tests.support import Clock, always_reuse

WINDOWS = ["[ROWS 6]", "[RANGE 3 SECONDS]", "", "[RANGE UNBOUNDED]",
           "BEGIN NOW - 4 END NOW - 1", "BEGIN (NOW - 9 ROWS) END NOW"]


def _sql(where: int, window: str) -> str:
    suffix, clause = (f" {window}", "") if window.startswith("[") or not window else \
        ("", f" {window}")
    return f"SELECT b, a, t FROM R{suffix} WHERE a >= {where}{clause}"


@given(st.sampled_from(psoup.MODES), st.sampled_from([3, 8, 64]),
       st.sampled_from(["", " RETAIN 10 ROWS", " RETAIN 5 SECONDS"]),
       st.lists(st.one_of(
           st.tuples(st.just("insert"), st.lists(st.integers(0, 9), min_size=1, max_size=7),
                     st.sampled_from([0.0, 0.5, 1.0, 2.0])),
           st.tuples(st.just("invoke"), st.integers(0, 5), st.sampled_from([0, 0, 0, -2, 1])),
           st.tuples(st.just("replace"), st.integers(0, 5), st.integers(0, 9))),
           min_size=1, max_size=30),
       st.sampled_from([64 << 20, 400]))
def test_reused_answers_equal_answers_read_whole(
        mode: ModeName, chunk_rows: int, retain: str, ops: list[tuple[Any, ...]], budget: int
) -> None:
    clock = Clock(100.0)
    with always_reuse():
        reused = psoup.Engine(mode=mode, clock=clock, chunk_rows=chunk_rows,
                              answer_cache_bytes=budget)
    whole = psoup.Engine(mode=mode, clock=clock, chunk_rows=chunk_rows,
                         answer_cache_bytes=0)
    handles: list[list[str]] = []
    for eng in (reused, whole):
        eng.execute(f"CREATE STREAM R (a INT, b FLOAT, t TEXT){retain}")
        handles.append([eng.register(_sql(i % 4, w)) for i, w in enumerate(WINDOWS)])
    ts = 100.0
    for op in ops:
        if op[0] == "insert":
            rows = [(a, a / 2, "x" * a) for a in op[1]]
            ts += op[2]
            clock.now = ts
            for eng in (reused, whole):
                eng.insert("R", rows, ts=ts)
        elif op[0] == "invoke":
            now = clock.now + op[2]
            got, want = (eng.invoke(h[op[1]], now=now) for eng, h in zip((reused, whole),
                                                                       handles, strict=True))
            assert got.rows == want.rows, (WINDOWS[op[1]], now)
            assert got.tuple_ids.tolist() == want.tuple_ids.tolist()
            assert got.ts.tolist() == want.ts.tolist()
            assert got.cursor is not None
        else:                          # the query leaves; a new one may take its slot
            for eng, h in zip((reused, whole), handles, strict=True):
                eng.unregister(h[op[1]])
                h[op[1]] = eng.register(_sql(op[2], WINDOWS[op[1]]))
        reused._check()
    assert reused.stats()["memory"]["answers"] <= budget


def test_a_poll_of_a_large_window_reads_only_the_tuples_that_arrived_since(
        monkeypatch: pytest.MonkeyPatch) -> None:
    eng = psoup.Engine(clock=lambda: 1000.0)
    eng.execute("CREATE STREAM R (a INT)")
    h = eng.register("SELECT a FROM R [ROWS 100000] WHERE a = 7")
    eng.insert("R", {"a": np.arange(200_000) % 100}, ts=np.linspace(0.0, 500.0, 200_000))
    spans: list[tuple[int, int]] = []

    Columns = dict[str, NDArray[Any]]

    def spy(kind: type[Materialized | SelectionCut]) -> None:
        fetch, fetch_deferred = kind.fetch, kind.fetch_deferred

        def spied(kept: Any, plan: SelectionPlan, span: Span, names: Sequence[str],
                  *later: Sequence[str]) -> Columns | tuple[Columns, Callable[[], Columns]]:
            spans.append(span.bounds())
            if later:
                return fetch_deferred(kept, plan, span, names, *later)
            return fetch(kept, plan, span, names)
        monkeypatch.setattr(kind, "fetch", spied)
        monkeypatch.setattr(kind, "fetch_deferred", spied)
    # on the classes: the find of every engine's results goes through one of them (a
    # snapshot's, for an invocation that reads off the lock), here one's
    spy(Materialized)
    spy(SelectionCut)
    first = eng.invoke(h)
    eng.insert("R", {"a": np.arange(30) % 10}, ts=np.full(30, 600.0))
    second = eng.invoke(h)
    third = eng.invoke(h)
    assert spans == [(100_000, 200_000), (200_000, 200_030)], \
        "the second poll reads the 30 new tuples; the third, nothing"
    assert second.tuple_ids.tolist() == [t for t in range(100_030, 200_030)
                                         if (t < 200_000 and t % 100 == 7)
                                         or (t >= 200_000 and t % 10 == 7)]
    assert third.to_numpy()["a"] is second.to_numpy()["a"], "nothing new: shared columns"
    assert len(first) == 1000 and len(second) == 1000 - 1 + 3
    eng.unregister(h)
    assert eng.stats()["memory"]["answers"] == 0, "a query's answer leaves with it"


def test_an_answer_that_is_much_of_its_window_is_read_whole_each_time() -> None:
    eng = psoup.Engine(clock=lambda: 1000.0)
    eng.execute("CREATE STREAM R (a INT)")
    h = eng.register("SELECT a FROM R [ROWS 100000] WHERE a >= 1")
    eng.insert("R", {"a": np.arange(200_000) % 100}, ts=np.linspace(0.0, 500.0, 200_000))
    assert len(eng.invoke(h)) == 99_000
    assert eng.stats()["memory"]["answers"] == 0, "copying it would cost more than a find"


def test_the_budget_keeps_the_most_recently_invoked_answers() -> None:
    # answers of 100, 99, 98 and 97 rows over a 70,000-tuple window (worth keeping), each
    # 24 bytes a row (a, ts, tupleID): three fit the budget, the least recent leaves
    eng = psoup.Engine(clock=lambda: 1000.0, answer_cache_bytes=3 * 24 * 100)
    eng.execute("CREATE STREAM R (a INT)")
    hs = [eng.register(f"SELECT a FROM R WHERE a >= {69_900 + k}") for k in range(4)]
    eng.insert("R", {"a": np.arange(70_000)}, ts=1.0)
    for h in hs:
        eng.invoke(h)
    assert eng.stats()["memory"]["answers"] == 24 * (99 + 98 + 97), \
        "the least recent (100 rows) left first"
    eng.invoke(hs[0])                # kept again, the least recent now hs[1]'s
    assert eng.stats()["memory"]["answers"] == 24 * (100 + 98 + 97)
    eng._check()


def test_answer_cache_bytes_is_checked() -> None:
    bad_values: tuple[Any, ...] = (-1, 1.5, True, "64")   # wrong types are the point
    for bad in bad_values:
        try:
            psoup.Engine(answer_cache_bytes=bad)
        except ValueError as exc:
            assert "answer_cache_bytes" in str(exc)
        else:
            raise AssertionError(f"answer_cache_bytes={bad!r} was taken")
