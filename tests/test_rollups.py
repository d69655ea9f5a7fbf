"""Windowed-aggregate copies of the archive (psoup.archive.rollups): COUNT, SUM, MIN and
MAX per minute, hour and day, kept beside the part files; the oracle is DuckDB's GROUP BY
over the same buckets of the same rows. Then aggregate queries with history answered
from them (psoup.results.answers), against DuckDB over every tuple inserted and against
the same engine answering from its tuples."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

import psoup
from psoup.archive.parquet import Archive
from psoup.archive.rollups import GRAINS, Grain, Rollups, copy_path, pieces
from psoup.archive.tiers import ArchiveTiers, Segment
from psoup.errors import ArchiveError
from psoup.journal import journal
from psoup.query.model import ColumnType
from psoup.results.answers import Answers
from tests.support import Clock, check_copies, substitutes

COLUMNS = [("a", "int"), ("x", "float"), ("name", "text")]
NUMERIC = [("a", ColumnType.INT), ("x", ColumnType.FLOAT)]


def rows(gen: np.random.Generator, first: int, n: int, t0: float, gaps: float
         ) -> dict[str, NDArray[Any]]:
    """n tuples from tupleID `first`, ts from `t0` by random steps of quarter seconds
    (mean `gaps` seconds), a wide INT a, a FLOAT x, a TEXT name."""
    steps = np.round(gen.exponential(gaps, n) * 4) / 4
    tids = np.arange(first, first + n, dtype=np.int64)
    return {"ts": t0 + np.cumsum(steps), "tupleID": tids,
            "a": gen.integers(-2**62, 2**62, n), "x": np.round(gen.normal(0, 100, n), 2),
            "name": np.array([f"n{t}" for t in tids], dtype=object)}


def archived(tmp_path: Path, seed: int, batches: int, n: int, gaps: float, flush_rows: int = 50
             ) -> tuple[Archive, pa.Table]:
    """An archive of stream R under tmp_path/archive, its copies under
    tmp_path/aggregates, written in `batches` flushes of `n` rows; and every row."""
    gen = np.random.default_rng(seed)
    arc = opened(tmp_path, flush_rows=flush_rows, seed=seed)
    t0, first, every = 86400.0 * 19000 - 7200.0, 0, []
    for _ in range(batches):
        data = rows(gen, first, n, t0, gaps)
        arc.add("R", COLUMNS, data)
        every.append(data)
        t0, first = float(data["ts"][-1]), first + n
    arc.flush()
    table = pa.table({name: np.concatenate([d[name] for d in every])
                      for name in ("ts", "tupleID", "a", "x")})
    return arc, table


def opened(tmp_path: Path, **kwargs: Any) -> Archive:
    return Archive(tmp_path / "archive", aggregates=tmp_path / "aggregates", **kwargs)


def rollups(tmp_path: Path) -> Rollups:
    return Rollups(tmp_path / "archive", tmp_path / "aggregates")


def oracle(table: pa.Table, grain: Grain) -> list[tuple[Any, ...]]:
    """DuckDB's GROUP BY over the grain's buckets of `table`."""
    g = GRAINS[grain]
    con = duckdb.connect()
    con.register("src", table)
    return con.execute(
        f"SELECT CAST(floor(ts / {g}) AS BIGINT) AS k, COUNT(*), max(ts), "
        "SUM(a), MIN(a), MAX(a), SUM(x), MIN(x), MAX(x) FROM src GROUP BY k ORDER BY k"
    ).fetchall()


def merged(r: Rollups, grain: Grain) -> list[tuple[Any, ...]]:
    got = r.buckets("R", grain, NUMERIC)
    (sa, la, ha), (sx, lx, hx) = got.columns["a"], got.columns["x"]
    return list(zip(got.bucket.tolist(), got.rows.tolist(), got.ts_max.tolist(),
                    sa.tolist(), la.tolist(), ha.tolist(), sx.tolist(), lx.tolist(),
                    hx.tolist(), strict=True))


def assert_same(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    """Equal rows; float sums (column 6) to 1e-9 relative (their rounding differs)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[:6] == w[:6] and g[7:] == w[7:], (g, w)
        assert math.isclose(g[6], w[6], rel_tol=1e-9, abs_tol=1e-9), (g, w)


# ---------------------------------------------------------------------- the copies

@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batches=st.integers(1, 4),
       n=st.integers(1, 120), gaps=st.sampled_from([0.5, 20.0, 900.0, 20000.0]))
def test_copies_equal_duckdb_group_by_over_the_same_buckets(
        tmp_path_factory: pytest.TempPathFactory, seed: int, batches: int, n: int,
        gaps: float) -> None:
    arc, table = archived(tmp_path_factory.mktemp("arc"), seed, batches, n, gaps)
    assert arc.rollups is not None
    arc.rollups._check()
    for grain in GRAINS:
        assert_same(merged(arc.rollups, grain), oracle(table, grain))


def test_a_bucket_split_across_flushes_is_one_bucket(tmp_path: Path) -> None:
    arc = opened(tmp_path, flush_rows=2)
    assert arc.rollups is not None
    for k in (0, 2):                            # two flushes of two rows
        arc.add("R", COLUMNS, {"ts": np.array([0.0, 10.0, 20.0, 70.0])[k:k + 2],
                               "tupleID": np.arange(k, k + 2), "a": np.array([1, 2, 3, 4])[k:k + 2],
                               "x": np.array([0.5, 1.5, 2.5, 3.5])[k:k + 2],
                               "name": np.array(list("pqrs"), dtype=object)[k:k + 2]})
    per_part = [pq.read_table(copy_path(tmp_path / "aggregates", "R", Grain.MINUTE, f, f + 1))
                .column("count").to_pylist() for f in (0, 2)]
    assert per_part == [[2], [1, 1]]             # minute 0 is in both parts' copies
    got = arc.rollups.buckets("R", Grain.MINUTE, NUMERIC)
    assert got.bucket.tolist() == [0, 1] and got.rows.tolist() == [3, 1]
    assert got.columns["a"][0].tolist() == [6, 4]


def test_int_sums_are_exact_beyond_int64(tmp_path: Path) -> None:
    arc = opened(tmp_path)
    assert arc.rollups is not None
    arc.add("R", [("a", "int")], {"ts": np.arange(4.0), "tupleID": np.arange(4),
                                  "a": np.full(4, 2**62)})
    arc.flush()
    assert (arc.rollups.buckets("R", Grain.DAY, [("a", ColumnType.INT)])
            .columns["a"][0].tolist() == [2**64])


def test_copies_live_outside_the_archive(tmp_path: Path) -> None:
    arc, _ = archived(tmp_path, 1, 2, 30, 20.0)
    assert (tmp_path / "aggregates" / "stream=R" / "grain=hour").is_dir()
    assert all(p.name.startswith("part-") for p in (tmp_path / "archive").rglob("*")
               if p.is_file())
    files = f"{tmp_path}/archive/**/*.parquet"
    counted = duckdb.sql(f"select count(*) from read_parquet('{files}', hive_partitioning=true)")
    assert counted is not None and counted.fetchall() == [(60,)]
    assert arc.read("R").num_rows == 60


# ---------------------------------------------------------------------- build

def _copies(root: Path) -> dict[str, str]:
    folder = root / "aggregates"
    return {p.relative_to(folder).as_posix(): pq.read_table(p).to_pandas().to_json()
            for p in folder.rglob("*.parquet")}


def test_build_writes_the_copies_a_flush_writes_and_is_idempotent(tmp_path: Path) -> None:
    arc, _ = archived(tmp_path, 2, 3, 40, 300.0)
    flushed = _copies(tmp_path)
    for path in (tmp_path / "aggregates").rglob("*.parquet"):
        path.unlink()
    r = rollups(tmp_path)
    assert r.complete("R") == []
    assert r.build() == len(list(tmp_path.glob("archive/stream=R/date=*/part-*.parquet")))
    assert _copies(tmp_path) == flushed
    assert r.build() == 0 and _copies(tmp_path) == flushed
    assert r.build(rebuild=True) > 0 and _copies(tmp_path) == flushed
    r._check()


def test_build_summarizes_part_files_written_by_another_tool(tmp_path: Path) -> None:
    folder = tmp_path / "archive" / "stream=S" / "date=1970-01-01"
    folder.mkdir(parents=True)
    table = pa.table({"ts": [1.0, 2.0, 3700.0], "tuple_id": pa.array([0, 1, 2], pa.int64()),
                      "v": [1.5, 2.5, 4.0]})
    pq.write_table(table, folder / f"part-{0:020d}-{2:020d}.parquet")
    r = rollups(tmp_path)
    assert r.build("S") == 1
    got = r.buckets("S", Grain.HOUR, [("v", ColumnType.FLOAT)])
    assert got.bucket.tolist() == [0, 1] and got.columns["v"][0].tolist() == [4.0, 4.0]


def test_a_part_file_not_of_its_dates_day_gets_no_copies(tmp_path: Path) -> None:
    folder = tmp_path / "archive" / "stream=S" / "date=1970-01-01"
    folder.mkdir(parents=True)
    for first, ts in ((0, [1.0, 86401.0]), (2, [86402.0, 86403.0]), (4, [5.0, 6.0])):
        pq.write_table(pa.table({"ts": ts, "tuple_id": pa.array([first, first + 1], pa.int64()),
                                 "v": [1.0, 2.0]}),
                       folder / f"part-{first:020d}-{first + 1:020d}.parquet")
    r = rollups(tmp_path)
    assert r.build() == 3
    assert r.complete("S") == [(4, 5)]             # two days; another day than its folder's
    assert rollups(tmp_path).complete("S") == [(4, 5)]
    r._check()


def test_build_removes_copies_whose_part_file_is_gone(tmp_path: Path) -> None:
    arc, table = archived(tmp_path, 3, 2, 40, 60.0)
    last = max(tmp_path.glob("archive/stream=R/date=*/part-*.parquet"))
    last.unlink()
    r = rollups(tmp_path)
    assert r.build() == 0
    first, end = map(int, last.stem.split("-")[1:])
    assert not copy_path(tmp_path / "aggregates", "R", Grain.MINUTE, first, end).exists()
    r._check()


def test_a_part_missing_a_copy_is_not_counted(tmp_path: Path) -> None:
    arc, table = archived(tmp_path, 4, 2, 30, 60.0, flush_rows=30)
    assert arc.rollups is not None
    parts = arc.rollups.complete("R")
    copy_path(tmp_path / "aggregates", "R", Grain.HOUR, *parts[0]).unlink()   # crashed midway
    r = rollups(tmp_path)
    assert r.complete("R") == parts[1:]
    cov = r.coverage("R")
    assert cov.covers(np.array([parts[0][0], parts[1][0]])).tolist() == [False, True]
    assert sum(r.buckets("R", Grain.DAY, NUMERIC).rows) == parts[-1][1] - parts[1][0] + 1


def test_a_null_in_an_imported_part_is_refused_by_name(tmp_path: Path) -> None:
    folder = tmp_path / "archive" / "stream=S" / "date=1970-01-01"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"ts": [1.0], "tuple_id": pa.array([0], pa.int64()),
                             "v": pa.array([None], pa.int64())}),
                   folder / f"part-{0:020d}-{0:020d}.parquet")
    with pytest.raises(ArchiveError, match="part-0.*column 'v' holds 1 null"):
        rollups(tmp_path).build()


# ---------------------------------------------------------------------- drop

def test_dropping_a_stream_drops_its_copies(tmp_path: Path) -> None:
    arc, _ = archived(tmp_path, 5, 2, 30, 60.0)
    assert arc.rollups is not None
    arc.add("S", [("b", "int")], {"ts": np.array([5.0]), "tupleID": np.array([999]),
                                  "b": np.array([1])})
    arc.flush()
    arc.drop("R", below=1000)
    assert not (tmp_path / "aggregates" / "stream=R").exists()
    assert arc.rollups.complete("R") == [] and arc.rollups.complete("S") == [(999, 999)]
    arc.rollups._check()
    assert rollups(tmp_path).complete("S") == [(999, 999)]


# ---------------------------------------------------------------------- windows

@settings(max_examples=200, deadline=None)
@given(begin=st.integers(-3 * 86400, 3 * 86400), length=st.integers(0, 4 * 86400),
       frac=st.sampled_from([0.0, 0.25, 0.5]))
def test_pieces_are_whole_buckets_tiling_the_whole_minutes_of_a_window(
        begin: int, length: int, frac: float) -> None:
    lo, hi = begin + frac, begin + length + frac
    runs = pieces(lo, hi)
    a, b = math.ceil(lo / 60) * 60, math.floor(hi / 60) * 60
    spans = [(first * GRAINS[g], stop * GRAINS[g]) for g, first, stop in runs]
    assert all(first < stop for _, first, stop in runs)
    if a >= b:
        assert runs == []
        return
    assert spans[0][0] == a and spans[-1][1] == b
    assert all(x[1] == y[0] for x, y in zip(spans, spans[1:], strict=False))
    assert len([g for g, *_ in runs if g == "day"]) <= 1


def test_totals_over_an_aligned_window_equal_duckdb(tmp_path: Path) -> None:
    arc, table = archived(tmp_path, 6, 4, 200, 400.0)
    assert arc.rollups is not None
    ts = table.column("ts").to_numpy()
    begin, end = math.ceil(ts[10] / 3600) * 3600.0, math.floor(ts[-10] / 3600) * 3600.0
    sub = arc.rollups.substitute("R", begin, end, NUMERIC)
    assert sub is not None and (sub.a, sub.b) == (begin, end)
    con = duckdb.connect()
    con.register("src", table)
    want = con.execute(f"SELECT COUNT(*), SUM(a), MIN(a), MAX(x) FROM src WHERE ts >= {begin} "
                       f"AND ts < {end}").fetchone()
    assert want is not None
    t = sub.totals
    assert (t["count"], t["sum"]["a"], t["min"]["a"], t["max"]["x"]) == want


# ---------------------------------------------------------------------- answers

AGGREGATES = "COUNT(*), SUM(a), AVG(x), MIN(a), MAX(x), COUNT(x)"
START = 86400.0 * 19000 - 5000.0          # a few minutes before a UTC midnight


def engine_with_history(state: Path, windows: list[str], flush_rows: int = 40
                        ) -> tuple[psoup.Engine, list[str]]:
    """A durable engine on `state` with stream R (RETAIN 20 ROWS), whose archive
    writes a part file every `flush_rows` rows, and the aggregate query over each of
    `windows` registered and given an archive tier before any tuple arrives (a history
    job over the empty archive, which finds nothing)."""
    with pytest.MonkeyPatch.context() as patch:
        # the engine has no option for it: its journal makes the Archive, whose
        # constructor takes it
        patch.setattr(journal, "Archive", partial(Archive, flush_rows=flush_rows))
        eng = psoup.Engine(path=str(state), clock=Clock(START), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, x FLOAT, name TEXT) RETAIN 20 ROWS")
    handles = [eng.register(f"SELECT {AGGREGATES} FROM R {w}") for w in windows]
    assert eng.evaluate_history() == {h: 0 for h in handles}
    assert all(eng.stats()["queries"][h]["history"] for h in handles)
    return eng, handles


def without_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on the copies answer nothing: answers read the tier's tuples, as an
    engine without copies does."""
    monkeypatch.setattr(Answers, "substitute", lambda *args: None)


def fill(eng: psoup.Engine, gen: np.random.Generator, n: int, gaps: float,
         checkpoints: int) -> pa.Table:
    """Insert n tuples of R in batches (ts by random quarter-second steps of mean
    `gaps`, some equal), checkpointing `checkpoints` times on the way; every row."""
    every = []
    t0 = eng.stats()["streams"]["R"]["latest_ts"] or START
    cuts = sorted(gen.choice(np.arange(1, n), min(checkpoints, n - 1), replace=False))
    for a, b in zip([0, *cuts], [*cuts, n], strict=True):
        steps = np.round(gen.exponential(gaps, b - a) * 4) / 4
        ts = t0 + np.cumsum(steps)
        batch = {"a": gen.integers(-2**60, 2**60, b - a), "x": np.round(gen.normal(0, 9, b - a), 2),
                 "name": np.array(["n"] * (b - a), dtype=object)}
        eng.insert("R", batch, ts=ts)
        every.append(pa.table({"ts": ts, "a": batch["a"], "x": batch["x"]}))
        t0 = float(ts[-1])
        eng.checkpoint()
    return pa.concat_tables(every)


def duck(table: pa.Table, begin: float, end: float) -> tuple[Any, ...]:
    con = duckdb.connect()
    con.register("src", table)
    where = "" if math.isinf(begin) else f"WHERE ts BETWEEN {begin!r} AND {end!r}"
    row = con.execute(f"SELECT {AGGREGATES} FROM src {where}").fetchone()
    assert row is not None
    return row


def assert_answer(got: tuple[Any, ...], want: tuple[Any, ...]) -> None:
    """COUNT, SUM over INT, MIN, MAX exact; AVG over FLOAT to 1e-9 relative."""
    assert (got[0], got[1], got[3], got[4], got[5]) == (want[0], want[1], want[3], want[4],
                                                        want[5]), (got, want)
    assert (got[2] is None) == (want[2] is None)
    if got[2] is not None:
        assert math.isclose(got[2], want[2], rel_tol=1e-9, abs_tol=1e-9), (got, want)


def window_edges(draw: Callable[[st.SearchStrategy[float]], float], lo: float,
                 hi: float) -> tuple[float, float]:
    """A window's edges within [lo - 1 h, hi + 1 h]: each a quarter second, or a
    minute, hour or day boundary."""
    def edge() -> float:
        t = draw(st.floats(lo - 3600, hi + 3600))
        unit = draw(st.sampled_from([0.25, 60, 3600, 86400]))
        return math.floor(t / unit) * unit
    a, b = edge(), edge()
    return min(a, b), max(a, b)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(30, 250),
       gaps=st.sampled_from([5.0, 90.0, 700.0]), checkpoints=st.integers(1, 6),
       data=st.data())
def test_aggregates_over_copies_equal_duckdb_and_the_tuples(
        tmp_path_factory: pytest.TempPathFactory, seed: int, n: int, gaps: float,
        checkpoints: int, data: st.DataObject) -> None:
    gen = np.random.default_rng(seed)
    span = n * gaps
    edges = [window_edges(data.draw, START, START + span) for _ in range(6)]
    windows = ["", *(f"BEGIN {a!r} END {b!r}" for a, b in edges)]
    eng, handles = engine_with_history(tmp_path_factory.mktemp("eng"), windows,
                                       flush_rows=int(gen.integers(10, 60)))
    table = fill(eng, gen, n, gaps, checkpoints)
    state = eng.path
    assert state is not None
    for handle, (a, b) in zip(handles, [(-math.inf, math.inf), *edges], strict=True):
        got = eng.invoke(handle).rows[0]
        assert_answer(got, duck(table, a, b))
        with pytest.MonkeyPatch.context() as patch:
            without_copies(patch)
            assert_answer(got, eng.invoke(handle).rows[0])
    eng._check()
    eng.close()
    check_copies(state)


def test_an_aligned_window_reads_the_copies_and_not_the_tuples(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies answer the whole aligned window, so an invocation reads fewer of the
    tier's segments than it must without them; both answers equal DuckDB's."""
    day = 86400.0 * 19000
    eng, (handle,) = engine_with_history(tmp_path, [f"BEGIN {day - 7200} END {day + 3600}"])
    gen = np.random.default_rng(7)
    table = fill(eng, gen, 600, 30.0, 5)
    met: list[list[str]] = []             # the segments each look-up gave
    meeting = ArchiveTiers.meeting

    def spy(tiers: ArchiveTiers, *args: Any) -> list[Segment]:
        met.append([seg.name for seg in meeting(tiers, *args)])
        return meeting(tiers, *args)
    monkeypatch.setattr(ArchiveTiers, "meeting", spy)
    subs = substitutes(monkeypatch)
    assert_answer(eng.invoke(handle).rows[0], duck(table, day - 7200, day + 3600))
    assert subs and all(s is not None and (s.a, s.b) == (day - 7200, day + 3600)
                        for s in subs)
    with_copies = met[-1]
    without_copies(monkeypatch)
    assert_answer(eng.invoke(handle).rows[0], duck(table, day - 7200, day + 3600))
    assert len(with_copies) < len(met[-1])
    eng.close()


def test_a_tuple_at_an_aligned_end_is_counted_once(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    hour = 3600.0 * (19000 * 24)
    eng, (handle,) = engine_with_history(tmp_path, [f"BEGIN {hour - 3600} END {hour}"])
    ts = np.array([hour - 3600, hour - 1800, hour, hour, hour + 1] + [hour + 60.0] * 40)
    eng.insert("R", {"a": np.arange(len(ts)), "x": np.ones(len(ts)),
                     "name": np.array(["n"] * len(ts), dtype=object)}, ts=ts)
    eng.checkpoint()
    subs = substitutes(monkeypatch)
    got = eng.invoke(handle).rows[0]
    assert subs and all(s is not None for s in subs), "answered from the copies"
    assert got[:2] == (4, 0 + 1 + 2 + 3)
    eng.close()


def test_a_query_with_where_or_group_by_reads_tuples(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Over an archive whose copies answer a plain aggregate, the copies answer nothing
    of a query with WHERE, GROUP BY, an aggregate of ts, or no aggregate; each answer
    equals DuckDB's over the tuples."""
    eng, (plain,) = engine_with_history(tmp_path, [""])
    others = {"SELECT COUNT(*) FROM R WHERE a > 1": "SELECT COUNT(*) FROM src WHERE a > 1",
              "SELECT a, COUNT(*) FROM R GROUP BY a":
                  "SELECT a, COUNT(*) FROM src GROUP BY a",
              "SELECT MAX(ts) FROM R": "SELECT MAX(ts) FROM src",
              "SELECT a FROM R": "SELECT a FROM src"}
    handles = {sql: eng.register(sql) for sql in others}
    assert eng.evaluate_history(list(handles.values())) == {h: 0 for h in handles.values()}
    table = fill(eng, np.random.default_rng(2), 300, 60.0, 3)
    subs = substitutes(monkeypatch)
    eng.invoke(plain)
    assert subs and all(s is not None for s in subs), "the copies answer a plain one"
    con = duckdb.connect()
    con.register("src", table)
    for sql, handle in handles.items():
        subs.clear()
        got = eng.invoke(handle).rows
        assert not any(subs), sql
        want = [tuple(r) for r in con.execute(others[sql]).fetchall()]
        assert sorted(got) == sorted(want), sql           # as multisets: ties in ts
    eng.close()


def test_new_parts_count_in_answers_after_the_copies_were_read(tmp_path: Path) -> None:
    day = 86400.0 * 19000
    edges = [(-math.inf, math.inf), (day - 3600, day + 7200)]
    eng, handles = engine_with_history(tmp_path, ["", f"BEGIN {day - 3600} END {day + 7200}"])
    gen = np.random.default_rng(11)
    tables = []
    for _ in range(4):
        tables.append(fill(eng, gen, 120, 30.0, 2))
        table = pa.concat_tables(tables)
        for handle, (a, b) in zip(handles, edges, strict=True):
            assert_answer(eng.invoke(handle).rows[0], duck(table, a, b))
        check_copies(tmp_path)
    eng.close()


def test_copies_answer_after_a_restart(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    day = 86400.0 * 19000
    window = f"BEGIN {day - 7200} END {day + 3600}"
    eng, (handle,) = engine_with_history(tmp_path, [window])
    table = fill(eng, np.random.default_rng(3), 400, 40.0, 4)
    before = eng.invoke(handle).rows[0]
    eng.close()
    eng = psoup.Engine(path=str(tmp_path))
    subs = substitutes(monkeypatch)
    assert eng.invoke(handle).rows[0] == before
    assert subs and all(s is not None for s in subs), "answered from the copies"
    assert_answer(before, duck(table, day - 7200, day + 3600))
    eng.close()


def test_drop_stream_removes_the_copies_and_stats_show_them(tmp_path: Path) -> None:
    eng = psoup.Engine(path=str(tmp_path))
    eng.execute("CREATE STREAM R (v INT) RETAIN 10 ROWS")
    eng.insert("R", {"v": np.arange(100)}, ts=np.arange(100) * 100.0)
    eng.checkpoint()
    shown = eng.stats()["durability"]["aggregates"]["R"]
    assert shown["complete_parts"] == shown["parts"] == 1 and shown["bytes"] > 0
    eng.execute("DROP STREAM R")
    assert not list((tmp_path / "aggregates").rglob("*.parquet"))
    assert eng.stats()["durability"]["aggregates"] == {}
    eng.close()


def test_far_window_edges_are_clipped_to_the_copies(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    far = "BEGIN -100000000000000 END 100000000000000"
    eng, (handle,) = engine_with_history(tmp_path, [far])
    table = fill(eng, np.random.default_rng(5), 200, 200.0, 3)
    subs = substitutes(monkeypatch)
    assert_answer(eng.invoke(handle).rows[0], duck(table, -1e14, 1e14))
    assert subs and all(s is not None for s in subs), "answered from the copies"
    eng.close()


def test_a_part_without_its_copies_is_answered_from_tuples(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eng, handles = engine_with_history(tmp_path, ["", "BEGIN 0 END 10000000000"])
    table = fill(eng, np.random.default_rng(9), 300, 60.0, 4)
    eng.close()
    copies = sorted((tmp_path / "aggregates").rglob("agg-*.parquet"))
    copies[len(copies) // 2].unlink()                        # a crash before its write
    copies[0].with_name(copies[0].name + ".tmp").write_bytes(b"cut short")
    eng = psoup.Engine(path=str(tmp_path))
    shown = eng.stats()["durability"]["aggregates"]["R"]
    assert shown["complete_parts"] == shown["parts"] - 1
    assert not list((tmp_path / "aggregates").rglob("*.tmp"))
    subs = substitutes(monkeypatch)
    for handle, (a, b) in zip(handles, [(-math.inf, math.inf), (0, 1e10)], strict=True):
        subs.clear()
        assert_answer(eng.invoke(handle).rows[0], duck(table, a, b))
        assert subs and all(s is not None for s in subs), "the other parts' copies answer"
    eng.close()
    check_copies(tmp_path)
