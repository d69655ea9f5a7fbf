"""Registration over a large store (issue 37): a new query over a million retained tuples
answers as DuckDB does over the same rows, in every mode; and a registration that scans
off the engine's lock while batches arrive (and expire) answers exactly as one made with
the stream quiet: no tuple missed or counted twice at the boundary of its snapshot."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import psoup
from psoup import core
from psoup.options import ModeName
from psoup.stems import halves

N = 1_000_000
MODES: tuple[ModeName, ...] = ("partial", "complete", "nomat")
BATCH = 1 << 18

SELECTIONS = [
    "SELECT lane, speed FROM traffic WHERE speed < 30 AND lane = 3",
    "SELECT lane, zone, speed FROM traffic WHERE lane IN (1, 5) AND speed >= 90",
]
AGGREGATES = [
    "SELECT COUNT(*), AVG(speed), MAX(speed) FROM traffic WHERE speed < 50",
    "SELECT lane, COUNT(*), AVG(speed), MIN(speed), SUM(zone) FROM traffic GROUP BY lane",
    "SELECT lane, zone, COUNT(*), SUM(speed) FROM traffic WHERE speed > 10 "
    "GROUP BY lane, zone",
]


def _columns(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"lane": rng.integers(0, 8, n), "zone": rng.integers(-2, 2, n),
            "speed": rng.random(n) * 100}


def _fill(eng: psoup.Engine, cols: dict[str, np.ndarray], start: int = 0) -> None:
    n = len(cols["lane"])
    for i in range(0, n, BATCH):
        part = {k: v[i:i + BATCH] for k, v in cols.items()}
        eng.insert("traffic", part, ts=np.arange(start + i, start + min(n, i + BATCH),
                                                 dtype=float))


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    return _columns(N, 7)


@pytest.fixture(scope="module")
def duck(data: dict[str, np.ndarray]) -> Iterator[Any]:
    con = duckdb.connect()
    con.register("t", pa.table(data))
    con.execute("CREATE TABLE traffic AS SELECT * FROM t")
    yield con
    con.close()


@pytest.fixture(scope="module", params=MODES)
def engine(request: pytest.FixtureRequest, data: dict[str, np.ndarray]) -> psoup.Engine:
    eng = psoup.Engine(mode=request.param)
    eng.execute("CREATE STREAM traffic (lane INT, zone INT, speed FLOAT)")
    _fill(eng, data)
    return eng


def _same_rows(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(sorted(got), sorted(want), strict=True):
        assert len(g) == len(w)
        for a, b in zip(g, w, strict=True):
            if isinstance(b, float):
                assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (g, w)
            else:
                assert a == b, (g, w)


@pytest.mark.parametrize("sql", SELECTIONS)
def test_a_selection_over_a_million_rows_answers_as_duckdb(engine: psoup.Engine, duck: Any,
                                                           sql: str) -> None:
    got = engine.invoke(engine.register(sql), now=float(N)).to_numpy()
    want = duck.execute(sql).fetchnumpy()
    names = list(want)
    assert list(got) == names
    order_got = np.lexsort([got[c] for c in reversed(names)])
    order_want = np.lexsort([np.asarray(want[c]) for c in reversed(names)])
    for c in names:
        assert np.array_equal(got[c][order_got], np.asarray(want[c])[order_want])


@pytest.mark.parametrize("sql", AGGREGATES)
def test_an_aggregate_over_a_million_rows_answers_as_duckdb(engine: psoup.Engine, duck: Any,
                                                            sql: str) -> None:
    handle = engine.register(sql)
    _same_rows(engine.invoke(handle, now=float(N)).rows, duck.execute(sql).fetchall())
    engine.unregister(handle)


# ------------------------------------------------------------- off the engine's lock

RETAINED = 150_000
QUERIES = [SELECTIONS[0], AGGREGATES[0], AGGREGATES[1], AGGREGATES[2]]


def _answers(eng: psoup.Engine, handles: list[str], now: float) -> list[list[tuple[Any, ...]]]:
    return [sorted(eng.invoke(h, now=now).rows) for h in handles]


def _new_engine(mode: ModeName) -> psoup.Engine:
    eng = psoup.Engine(mode=mode)
    eng.execute(f"CREATE STREAM traffic (lane INT, zone INT, speed FLOAT) "
                f"RETAIN {RETAINED} ROWS")
    return eng


@pytest.mark.parametrize("mode", MODES)
def test_rows_arriving_and_expiring_during_the_scan_are_each_counted_once(
        mode: ModeName, monkeypatch: pytest.MonkeyPatch) -> None:
    """While each query's scan runs off the lock, 40,000 tuples arrive and as many
    expire (tuples the scan read among them): every answer is that of the same query
    registered with the stream quiet after the same batches, tuple for tuple."""
    busy, quiet = _new_engine(mode), _new_engine(mode)
    first = _columns(200_000, 1)
    _fill(busy, first)
    _fill(quiet, first)
    assert busy._core.stems["traffic"].retained >= core.OFF_LOCK_ROWS
    run = core.Ahead.run
    scans: list[int] = []
    handles, quiet_handles = [], []
    start = 200_000
    for i, sql in enumerate(QUERIES):
        more = _columns(40_000, 20 + i)

        def run_then_insert(self: core.Ahead, more: dict[str, np.ndarray] = more,
                            start: int = start) -> None:
            run(self)
            scans.append(self.n0)
            _fill(busy, more, start)
        monkeypatch.setattr(core.Ahead, "run", run_then_insert)
        handles.append(busy.register(sql))
        monkeypatch.setattr(core.Ahead, "run", run)
        if len(scans) <= i:                 # NoMat: registered in one hold, no scan
            _fill(busy, more, start)
        _fill(quiet, more, start)
        quiet_handles.append(quiet.register(sql))
        start += 40_000
    assert scans == ([] if mode == "nomat" else [200_000 + 40_000 * i
                                                 for i in range(len(QUERIES))])
    got, want = _answers(busy, handles, start), _answers(quiet, quiet_handles, start)
    for g, w in zip(got, want, strict=True):
        _same_rows(g, w)
    busy._check()


@pytest.mark.parametrize("mode", MODES)
def test_a_registration_beside_a_producer_thread_answers_as_one_made_after(
        mode: ModeName) -> None:
    """A thread inserts batches while the main thread registers each query; once the
    producer is done, the same queries registered again answer exactly alike."""
    eng = _new_engine(mode)
    _fill(eng, _columns(200_000, 3))
    batches = [_columns(5_000, 10 + i) for i in range(40)]
    started = threading.Event()

    def produce() -> None:
        started.set()
        for i, cols in enumerate(batches):
            eng.insert("traffic", cols, ts=np.arange(200_000 + 5_000 * i,
                                                     200_000 + 5_000 * (i + 1), dtype=float))
    producer = threading.Thread(target=produce)
    producer.start()
    started.wait()
    during = [eng.register(sql) for sql in QUERIES]
    producer.join()
    after = [eng.register(sql) for sql in QUERIES]
    now = float(400_000)
    for g, w in zip(_answers(eng, during, now), _answers(eng, after, now), strict=True):
        _same_rows(g, w)
    eng._check()


def test_a_stream_made_anew_during_the_scan_is_registered_afresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot's stream was dropped and created again meanwhile: the query is
    compiled and applied to the new stream, in the second hold."""
    eng = _new_engine("partial")
    _fill(eng, _columns(100_000, 4))
    run = core.Ahead.run

    def run_then_recreate(self: core.Ahead) -> None:
        run(self)
        eng.execute("DROP STREAM traffic")
        eng.execute("CREATE STREAM traffic (lane INT, zone INT, speed FLOAT)")
        eng.insert("traffic", {"lane": [3, 3, 4], "zone": [0, 0, 0],
                               "speed": [1.0, 2.0, 3.0]}, ts=[1.0, 2.0, 3.0])
    monkeypatch.setattr(core.Ahead, "run", run_then_recreate)
    handle = eng.register(SELECTIONS[0])
    assert sorted(eng.invoke(handle, now=3.0).rows) == [(3, 1.0), (3, 2.0)]
    eng._check()


@pytest.mark.parametrize("mode", ["partial", "complete"])
def test_a_registration_split_between_threads_answers_as_duckdb(
        duck: Any, data: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch,
        mode: ModeName) -> None:
    """The scan split in three parts on the pool's threads (psoup.stems.halves): the
    same answers as DuckDB's."""
    monkeypatch.setattr(halves, "PARALLEL_ROWS", 4096)
    monkeypatch.setattr(halves, "THREADS", 3)
    eng = psoup.Engine(mode=mode)
    eng.execute("CREATE STREAM traffic (lane INT, zone INT, speed FLOAT)")
    _fill(eng, data)
    for sql in AGGREGATES:
        _same_rows(eng.invoke(eng.register(sql), now=float(N)).rows,
                   duck.execute(sql).fetchall())
    for sql in SELECTIONS:
        _same_rows(eng.invoke(eng.register(sql), now=float(N)).rows,
                   duck.execute(sql).fetchall())
    eng._check()


def test_a_copy_for_a_scan_keeps_its_chunks_from_reuse_by_retention() -> None:
    """Batches that expire every chunk the copy holds (and would recycle their memory
    for the next chunks) leave the copy's tuples as they were."""
    from psoup.query.model import Source, StreamSchema, Window
    from psoup.stems.batch import make_batch
    from psoup.stems.data_stem import DataSteM

    schema = StreamSchema("R", (("a", "int"),), retain_rows=64)
    stem = DataSteM(schema, chunk_rows=16)

    def add(first: int, n: int) -> None:
        rows = [(first + i,) for i in range(n)]
        stem.append(make_batch(schema, rows, [float(first + i) for i in range(n)], 0,
                               stem.last_ts), np.arange(first, first + n))
    add(0, 64)
    copy = stem.copy_for_scan()
    for first in range(64, 320, 16):          # every chunk the copy holds expires, and
        add(first, 16)                        # dropped chunks are reused by the next
    assert stem.horizon > copy.n
    every = copy.probe(Source("R", "R", Window()))
    assert every.tolist() == list(range(copy.horizon, copy.n))
    assert copy.take(["a"], every)["a"].tolist() == list(range(copy.horizon, copy.n))
    stem._check()


def test_a_scan_is_split_into_ordered_parts_cut_at_chunk_boundaries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(halves, "PARALLEL_ROWS", 4)
    assert halves.split(np.arange(10), threads=3) == [(0, 3), (3, 6), (6, 10)]
    assert halves.split(np.arange(3), threads=3) == [(0, 3)]
    assert halves.ranges(5, 3_000_005, 8192, threads=2) == [(5, 1499136), (1499136, 3000005)]
    assert halves.ranges(0, 10, 8192, threads=2) == [(0, 10)]      # no boundary inside
    positions = np.array([1, 2, 5, 7, 8, 9, 12, 17, 18, 19])
    # cuts at 3 and 6 move up to the first positions of a multiple of 4: 8 and 12
    assert halves.split_aligned(positions, 4, threads=3) == [(0, 4), (4, 6), (6, 10)]
    assert halves.split_aligned(positions, 64, threads=3) == [(0, 10)]
    assert halves.each(lambda x: x * 2, [1, 2, 3]) == [2, 4, 6]


def test_a_registration_refused_after_its_scan_changes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another registration takes the last query the limit allows while the scan runs:
    the second hold refuses this one (LimitError) and the engine is as it was, its log
    included (a durable engine reopened holds only the other query)."""
    import tempfile

    from psoup.errors import LimitError

    with tempfile.TemporaryDirectory() as tmp:
        eng = psoup.Engine(path=f"{tmp}/db", max_queries=1)
        eng.execute("CREATE STREAM traffic (lane INT, zone INT, speed FLOAT)")
        _fill(eng, _columns(100_000, 5))
        run = core.Ahead.run
        other: list[str] = []

        def run_then_register(self: core.Ahead) -> None:
            run(self)
            monkeypatch.setattr(core, "OFF_LOCK_ROWS", 1 << 40)    # the other: one hold
            other.append(eng.register("SELECT lane FROM traffic WHERE lane = 1"))
        monkeypatch.setattr(core.Ahead, "run", run_then_register)
        with pytest.raises(LimitError, match="max_queries=1"):
            eng.register(SELECTIONS[0])
        assert [h for h, _ in eng.queries()] == other
        eng._check()
        eng.close()
        again = psoup.Engine(path=f"{tmp}/db")
        assert [h for h, _ in again.queries()] == other
        again.close()


@pytest.mark.parametrize("mode", ["partial", "complete"])
def test_a_group_by_of_many_groups_answers_each_groups_latest_ts(mode: ModeName) -> None:
    """A hundred thousand groups, their keys narrow over the first few thousand
    rows and wide after (the bulk load's guessed key table misses, and counts again):
    rows and each group's latest ts as NoMat's, at registration's end, after a batch,
    and at a NOW before the newest tuples (a ts read by position)."""
    n, rng = 100_000, np.random.default_rng(11)
    keys = np.r_[rng.integers(0, 8, 5000), rng.integers(-10**6, 10**6, n - 5000)]
    later = rng.integers(-10**6, 10**6, 1000)
    sql = "SELECT k, COUNT(*), SUM(v), MAX(v) FROM t GROUP BY k"
    got = []
    for m in (mode, "nomat"):
        eng = psoup.Engine(mode=m)
        eng.execute("CREATE STREAM t (k INT, v FLOAT)")
        eng.insert("t", {"k": keys, "v": np.arange(n) * 0.5}, ts=np.arange(n, dtype=float))
        h = eng.register(sql)
        answers = [eng.invoke(h, now=float(n))]
        eng.insert("t", {"k": later, "v": np.ones(1000)}, ts=np.arange(n, n + 1000.0))
        answers += [eng.invoke(h, now=float(n + 1000)), eng.invoke(h, now=float(n // 2))]
        got.append([(a.rows, a.ts.tolist()) for a in answers])
    assert got[0] == got[1]
