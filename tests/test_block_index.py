"""The aggregate index by blocks (psoup/results/blocks.py) against the index of every
result (AggregateIndex), engine against engine: the same stream, the same query
registered at the same point, the same invocations, in every materializing mode and on
chunks of several sizes (so blocks of 1, 2, 4 and 64 positions), with retention
expiring blocks, GROUP BY keys that outgrow the blocks (the query moves to an
AggregateIndex), INT sums that wrap int64 and infinite FLOATs. Every BlockIndex's
invariants are checked after each step.

COUNT, MIN, MAX and INT sums must match exactly; FLOAT sums and averages to 1e-9 of the
sum of the magnitudes summed (the two indexes round differently, both compensated).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

import psoup
from psoup.options import ModeName
from psoup.results import aggregates, blocks
from psoup.results.aggregates import AggregateIndex, AggregateSink
from psoup.results.blocks import BlockIndex
from tests.support import Clock

QUERIES = [
    "SELECT COUNT(*), SUM(i), AVG(f), MIN(f), MAX(i) FROM R{window} WHERE f < 40.0",
    "SELECT g, COUNT(*), SUM(f), AVG(i), MIN(i), MAX(f) FROM R{window} GROUP BY g",
    "SELECT g, COUNT(*) FROM R{window} WHERE i > 0 GROUP BY g",
    "SELECT SUM(f), COUNT(*) FROM R{window}",
    "SELECT g, MAX(f), MIN(f) FROM R{window} WHERE g >= 2 GROUP BY g",
]
WINDOWS = ["", " [ROWS 7]", " [ROWS 150]", " [RANGE 40 SECONDS]"]
CHUNKS = [1, 2, 4, 64, 8192]

#: One batch: (first key, keys' span, rows, whether it holds an infinite FLOAT).
BATCH = st.tuples(st.integers(-3, 6), st.integers(1, 5), st.integers(1, 60), st.booleans())


@contextmanager
def blocks_off() -> Iterator[None]:
    """Engines made inside keep every aggregate per result (AggregateIndex)."""
    saved = aggregates.BLOCKS
    aggregates.BLOCKS = False
    try:
        yield
    finally:
        aggregates.BLOCKS = saved


def _sinks(eng: psoup.Engine) -> list[AggregateSink]:
    return list(eng._core.kept.aggregates.values())


def _check_blocks(eng: psoup.Engine) -> None:
    for sink in _sinks(eng):
        if isinstance(sink.index, BlockIndex):
            sink.index._check()


def _rows(gen: np.random.Generator, batch: tuple[int, int, int, bool], big: bool
          ) -> dict[str, np.ndarray]:
    first, span, n, infinite = batch
    g = gen.integers(first, first + span, n)
    i = gen.integers(-2**62, 2**62, n) if big else gen.integers(-50, 50, n)
    f = gen.normal(30.0, 25.0, n)
    if infinite and n > 2:
        f[n // 2] = math.inf
    return {"g": g, "i": i, "f": f}


def _same(got: psoup.Result, want: psoup.Result) -> None:
    assert got.columns == want.columns
    assert len(got.rows) == len(want.rows), (got.rows, want.rows)
    for a, b in zip(got.rows, want.rows, strict=True):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) or isinstance(y, float):
                assert x is not None and y is not None
                if math.isinf(x) or math.isinf(y) or math.isnan(x) or math.isnan(y):
                    assert x == y or (math.isnan(x) and math.isnan(y)), (a, b)
                else:
                    assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6), (a, b)
            else:
                assert x == y and type(x) is type(y), (a, b)
    assert np.array_equal(got.ts, want.ts, equal_nan=True)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["partial", "complete"]), st.sampled_from(CHUNKS),
       st.sampled_from(QUERIES), st.sampled_from(WINDOWS), st.lists(BATCH, min_size=1,
                                                                    max_size=8),
       st.integers(0, 8), st.sampled_from([None, 5, 90]), st.booleans(),
       st.sampled_from([blocks.MAX_SPAN, 6]), st.integers(0, 2**32 - 1))
def test_blocks_answer_as_every_result_does(mode: ModeName, chunk_rows: int, sql: str,
                                            window: str, batches: list[Any],
                                            register_after: int, retain: int | None,
                                            big: bool, span: int, seed: int) -> None:
    """`span` 6: keys outgrow the blocks in some runs, before or after registering."""
    saved = blocks.MAX_SPAN
    blocks.MAX_SPAN = span
    try:
        _compare(mode, chunk_rows, sql.format(window=window), batches, register_after,
                 retain, big, seed)
    finally:
        blocks.MAX_SPAN = saved


def _compare(mode: ModeName, chunk_rows: int, query: str, batches: list[Any],
             register_after: int, retain: int | None, big: bool, seed: int) -> None:
    gen = np.random.default_rng(seed)
    clock = Clock(0.0)
    engines = {}
    for kept in ("blocks", "rows"):
        if kept == "rows":
            with blocks_off():
                engines[kept] = psoup.Engine(mode=mode, chunk_rows=chunk_rows, clock=clock)
        else:
            engines[kept] = psoup.Engine(mode=mode, chunk_rows=chunk_rows, clock=clock)
    ddl = "CREATE STREAM R (g INT, i INT, f FLOAT)" + (
        f" RETAIN {retain} ROWS" if retain else "")
    handles: dict[str, str] = {}
    t = 0.0
    for step, batch in enumerate([None, *batches]):
        if step == 0:
            for eng in engines.values():
                eng.execute(ddl)
        else:
            rows = _rows(gen, batch, big)
            ts = t + np.arange(len(rows["g"]), dtype=np.float64)
            t = float(ts[-1]) + 1.0
            for eng in engines.values():
                eng.insert("R", rows, ts=ts)
        if step == min(register_after, len(batches)):
            for kept, eng in engines.items():
                with blocks_off() if kept == "rows" else _nothing():
                    handles[kept] = eng.register(query)
        if handles:
            _check_blocks(engines["blocks"])
            for now in (t, t - 3.0, t - 25.0):
                got = engines["blocks"].invoke(handles["blocks"], now=now)
                want = engines["rows"].invoke(handles["rows"], now=now)
                _same(got, want)
    for eng in engines.values():
        eng.close()


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def test_keys_that_outgrow_the_blocks_move_the_query_to_every_result(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocks, "MAX_SPAN", 8)
    eng = psoup.Engine(chunk_rows=4)
    eng.execute("CREATE STREAM R (g INT, i INT, f FLOAT)")
    eng.insert("R", {"g": [1, 2, 3, 1], "i": [1, 2, 3, 4], "f": [0.5, 1.5, 2.5, 3.5]},
               ts=[0.0, 1.0, 2.0, 3.0])
    h = eng.register("SELECT g, COUNT(*), SUM(i) FROM R GROUP BY g")
    (sink,) = _sinks(eng)
    assert isinstance(sink.index, BlockIndex)
    before = sink.index
    eng.insert("R", {"g": [8], "i": [10], "f": [0.0]}, ts=[4.0])     # span 1..8: fits
    assert sink.index is before
    eng.insert("R", {"g": [0, 20], "i": [5, 6], "f": [0.0, 0.0]}, ts=[5.0, 6.0])
    assert isinstance(sink.index, AggregateIndex)
    assert eng.invoke(h, now=6.0).rows == [(0, 1, 5), (1, 2, 5), (2, 1, 2), (3, 1, 3),
                                           (8, 1, 10), (20, 1, 6)]
    eng.close()


def test_a_registration_too_wide_for_blocks_keeps_every_result(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocks, "MAX_SPAN", 8)
    eng = psoup.Engine(chunk_rows=4)
    eng.execute("CREATE STREAM R (g INT, i INT)")
    eng.insert("R", {"g": [0, 100, 5], "i": [1, 2, 3]}, ts=[0.0, 1.0, 2.0])
    h = eng.register("SELECT g, SUM(i) FROM R GROUP BY g")
    (sink,) = _sinks(eng)
    assert isinstance(sink.index, AggregateIndex)
    assert eng.invoke(h, now=2.0).rows == [(0, 1), (5, 3), (100, 2)]
    eng.close()


def test_other_groupings_keep_every_result() -> None:
    eng = psoup.Engine()
    eng.execute("CREATE STREAM R (g INT, h INT, f FLOAT, name TEXT)")
    for sql in ("SELECT g, h, COUNT(*) FROM R GROUP BY g, h",
                "SELECT f, COUNT(*) FROM R GROUP BY f",
                "SELECT name, COUNT(*) FROM R GROUP BY name"):
        eng.register(sql)
    kinds = {type(sink.index) for sink in _sinks(eng)}
    assert kinds == {AggregateIndex}
    eng.register("SELECT g, COUNT(*), AVG(f) FROM R GROUP BY g")
    assert BlockIndex in {type(sink.index) for sink in _sinks(eng)}
    eng.close()


def test_a_registration_over_a_large_store_built_off_the_lock_matches() -> None:
    """Over OFF_LOCK_ROWS retained tuples the index is built on a copy of the stream
    and caught up under the lock; its answers are those of every result."""
    gen = np.random.default_rng(7)
    n = 70_000
    cols = {"g": gen.integers(0, 6, n), "i": gen.integers(-10**12, 10**12, n),
            "f": gen.normal(0, 1e3, n)}
    ts = np.arange(n, dtype=np.float64)
    engines = {}
    for kept in ("blocks", "rows"):
        with blocks_off() if kept == "rows" else _nothing():
            eng = engines[kept] = psoup.Engine(chunk_rows=8192)
            eng.execute("CREATE STREAM R (g INT, i INT, f FLOAT) RETAIN 65000 ROWS")
            eng.insert("R", cols, ts=ts)
    sql = "SELECT g, COUNT(*), SUM(i), AVG(f), MIN(f), MAX(i) FROM R WHERE f > -500.0 GROUP BY g"
    handles = {}
    for kept, eng in engines.items():
        with blocks_off() if kept == "rows" else _nothing():
            handles[kept] = eng.register(sql)
    _check_blocks(engines["blocks"])
    for now, window in ((float(n), None), (float(n) - 1000.5, None)):
        del window
        _same(engines["blocks"].invoke(handles["blocks"], now=now),
              engines["rows"].invoke(handles["rows"], now=now))
    more = {"g": gen.integers(0, 6, 5000), "i": gen.integers(-5, 5, 5000),
            "f": gen.normal(0, 1e3, 5000)}
    for eng in engines.values():
        eng.insert("R", more, ts=float(n) + np.arange(5000, dtype=np.float64))
    _check_blocks(engines["blocks"])
    _same(engines["blocks"].invoke(handles["blocks"], now=float(n + 5000)),
          engines["rows"].invoke(handles["rows"], now=float(n + 5000)))
    for eng in engines.values():
        eng.close()


def test_a_query_without_matches_answers_without_scanning() -> None:
    eng = psoup.Engine(chunk_rows=64)
    eng.execute("CREATE STREAM R (g INT, f FLOAT)")
    eng.insert("R", {"g": np.zeros(1000, np.int64), "f": np.ones(1000)},
               ts=np.arange(1000, dtype=np.float64))
    h = eng.register("SELECT COUNT(*), SUM(f) FROM R WHERE f > 5.0")
    h2 = eng.register("SELECT g, COUNT(*) FROM R WHERE f > 5.0 GROUP BY g")
    assert eng.invoke(h, now=999.0).rows == [(0, None)]
    assert eng.invoke(h2, now=999.0).rows == []
    eng.close()


def test_a_group_absent_from_the_last_blocks_keeps_its_latest_ts() -> None:
    """Group 1's matches all lie in the first blocks: its row's ts is that of its last
    match, found by the binary search over the prefix counts (`_last_rows`)."""
    eng = psoup.Engine(chunk_rows=4)
    eng.execute("CREATE STREAM R (g INT, i INT)")
    g = [1, 0, 1, 1, 0, 1, 0, 0] + [0] * 40
    eng.insert("R", {"g": g, "i": list(range(len(g)))},
               ts=[10.0 * k for k in range(len(g))])
    h = eng.register("SELECT g, COUNT(*), SUM(i) FROM R GROUP BY g")

    def want(p0: int) -> list[tuple[int, int, int]]:
        return [(key, sum(1 for p in range(p0, len(g)) if g[p] == key),
                 sum(p for p in range(p0, len(g)) if g[p] == key)) for key in (0, 1)]
    got = eng.invoke(h, now=1000.0)
    assert got.rows == want(0)
    assert got.ts.tolist() == [470.0, 50.0]
    (sink,) = _sinks(eng)
    assert isinstance(sink.index, BlockIndex)
    for p0 in (1, 2, 4, 5):
        part = sink.index.answer(p0, len(g))
        assert part.rows == want(p0) and part.ts.tolist() == [470.0, 50.0]
    eng.close()
