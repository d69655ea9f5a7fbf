"""Import and replay (issue 6, part A): files become an archive through Spark, and an
archive goes back through Spark into live engines, in timestamp order, with the answers
the same tuples give when they arrive live (docs/durability.md, "Import and replay")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from numpy.typing import NDArray

import psoup
from psoup.archive.layout import part_path
from psoup.archive.parquet import Archive
from psoup.cli.main import Failure, main, replay_options
from psoup.errors import ArchiveError, ReplayError
from psoup.options import ModeName
from psoup.server import Server
from psoup.spark import importer
from psoup.spark.importer import import_files, parse_columns
from psoup.spark.replay import plan_replay, replay
from tests.support import write

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")   # pyspark on pandas 3

T0 = 1_767_225_600.0          # 2026-01-01T00:00:00Z
R_COLUMNS = [("a", "int"), ("b", "int"), ("x", "float"), ("name", "text")]
S_COLUMNS = [("b", "int"), ("c", "int"), ("ok", "bool")]
QUERIES = [
    "SELECT a, name FROM R WHERE a > 3 AND x < 50.0",
    "SELECT * FROM R WHERE b = 2 BEGIN NOW - 600 END NOW",
    "SELECT c, ok FROM S WHERE ok = TRUE AND c <= 5",
    "SELECT R.a, S.c FROM R, S WHERE R.b = S.b AND R.a < 3 BEGIN NOW - 300 END NOW",
    "SELECT b, COUNT(*) FROM R WHERE a >= 5 GROUP BY b",
    "SELECT name FROM R WHERE x BETWEEN 20.0 AND 30.0 BEGIN (NOW - 50 ROWS) END NOW",
]

#: One tuple as it arrives: (stream, row, ts).
Event = tuple[str, tuple[Any, ...], float]


def arrivals(n: int, seed: int = 1, t0: float = T0 - 3600) -> list[Event]:
    """n tuples of R and S in arrival order: ts never decreases over both (ties
    included), and the trace crosses midnight, so each stream spans two date partitions."""
    gen = np.random.default_rng(seed)
    ts = t0 + np.cumsum(gen.choice([0.0, 0.5, 9.0], n))
    out: list[Event] = []
    for i in range(n):
        if gen.random() < 0.6:
            row = (int(gen.integers(0, 8)), int(gen.integers(0, 4)),
                   round(float(gen.uniform(0, 100)), 2), f"n{i % 13}")
            out.append(("R", row, float(ts[i])))
        else:
            out.append(("S", (int(gen.integers(0, 4)), int(gen.integers(0, 10)),
                              bool(gen.random() < 0.5)), float(ts[i])))
    return out


def write_archive(
        root: Path, events: Sequence[Event], flush_rows: int = 300, first_tid: int = 0) -> Path:
    """events as an engine would archive them: global tupleIDs in arrival order, files of
    at most `flush_rows` rows per stream and day."""
    arc = Archive(root, flush_rows=flush_rows)
    for stream, columns in (("R", R_COLUMNS), ("S", S_COLUMNS)):
        mine = [(first_tid + i, row, ts) for i, (s, row, ts) in enumerate(events) if s == stream]
        if not mine:
            continue
        data: dict[str, NDArray[Any] | list[Any]] = {
            "tupleID": np.array([m[0] for m in mine]), "ts": np.array([m[2] for m in mine])}
        for j, (name, _) in enumerate(columns):
            data[name] = [m[1][j] for m in mine]
        arc.add(stream, columns, data)
    arc.flush()
    return root


def new_engine(mode: ModeName = "partial", **kwargs: Any) -> tuple[psoup.Engine, list[str]]:
    eng = psoup.Engine(mode=mode, clock=lambda: T0 + 10_000, **kwargs)
    for name, columns in (("R", R_COLUMNS), ("S", S_COLUMNS)):
        eng.create_stream(name, columns)
    return eng, [eng.register(sql) for sql in QUERIES]


def feed(target: psoup.Engine, events: Sequence[Event]) -> None:
    """Insert events live, one insert per run of one stream."""
    start = 0
    for i in range(1, len(events) + 1):
        if i == len(events) or events[i][0] != events[start][0]:
            run = events[start:i]
            target.insert(run[0][0], [row for _, row, _ in run], ts=[ts for _, _, ts in run])
            start = i


def answers(target: psoup.Engine | psoup.Client, handles: list[str], nows: list[float]
            ) -> list[tuple[Any, ...]]:
    out = []
    for h in handles:
        for now in nows:
            res = target.invoke(h, now=now)
            out.append((res.columns, res.rows, res.ts.tolist(), res.tuple_ids.tolist()))
    return out


def row_counts(target: psoup.Engine) -> dict[str, int]:
    return {name: s["rows_total"] for name, s in target.stats()["streams"].items()}


# ---------------------------------------------------------------------- replay

@pytest.mark.parametrize("mode", psoup.MODES)
def test_replay_answers_exactly_like_live_arrival(
        spark: SparkSession, tmp_path: Path, mode: ModeName) -> None:
    events = arrivals(1500)
    archive = write_archive(tmp_path / "arc", events)
    live, live_handles = new_engine(mode)
    feed(live, events)
    replayed, handles = new_engine(mode)
    report = replay([archive], replayed, slice_rows=400, batch_rows=128)
    assert report.rows == len(events)
    assert report.streams == {"R": sum(e[0] == "R" for e in events),
                              "S": sum(e[0] == "S" for e in events)}
    nows = [events[700][2], events[-1][2], events[-1][2] + 200]
    want = answers(live, live_handles, nows)
    assert answers(replayed, handles, nows) == want
    assert sum(len(rows) for _, rows, _, _ in want) > 500
    assert row_counts(replayed) == row_counts(live)


def test_replay_rows_reach_psoup_through_files_not_through_sparks_driver(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No slice is collected through Spark's driver: the executors write each slice
    to `.replay/` in the archive, psoup reads it from there in order and removes it
    once read, and nothing stays behind, after a replay or one that stopped."""
    from pyspark.sql import DataFrame

    from psoup.spark import replay as replay_module

    def collected(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError("replay collected a slice through Spark's driver")

    for name in ("toArrow", "_collect_as_arrow", "collect", "toPandas"):
        monkeypatch.setattr(DataFrame, name, collected, raising=False)
    read: list[Path] = []
    real_read = pq.read_table

    def recorded(source: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(Path(source))
        return real_read(source, *args, **kwargs)

    monkeypatch.setattr(pq, "read_table", recorded)
    events = arrivals(900, seed=3)
    archive = write_archive(tmp_path / "arc", events, flush_rows=100)
    live, live_handles = new_engine()
    feed(live, events)
    replayed, handles = new_engine()
    assert replay([archive], replayed, slice_rows=150, batch_rows=64).rows == len(events)
    nows = [events[400][2], events[-1][2]]
    assert answers(replayed, handles, nows) == answers(live, live_handles, nows)
    staging = (archive / ".replay").resolve()
    assert read and all(staging in path.parents for path in read)
    assert len({path.parent for path in read}) >= 6         # a folder a slice and stream
    assert not staging.exists()

    stopped, _ = new_engine()
    with pytest.raises(ReplayError):
        replay([archive], _StopAfter(stopped, 2), batch_rows=64)
    assert not staging.exists()

    def read_only(*args: Any, **kwargs: Any) -> NoReturn:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(replay_module, "make_dir", read_only)   # an archive psoup cannot write
    read.clear()
    again, handles = new_engine()
    assert replay([archive], again, slice_rows=300).rows == len(events)
    assert answers(again, handles, nows) == answers(live, live_handles, nows)
    temporary = {path.parents[1] for path in read}
    assert len(temporary) == 1 and not staging.exists()
    assert next(iter(temporary)).name.startswith("psoup-replay-")
    assert not any(path.exists() for path in temporary)


def test_replay_keeps_both_bounds_of_the_range_inclusive(
        spark: SparkSession, tmp_path: Path) -> None:
    stamps = [T0 + t for t in (1, 2, 2, 3, 3, 3, 4, 4, 5)]
    events = [("R", (i, 0, 1.0, "n"), ts) for i, ts in enumerate(stamps)]
    archive = write_archive(tmp_path / "arc", events)
    eng, _ = new_engine()
    h = eng.register("SELECT a FROM R")
    replay([archive], eng, start=T0 + 2, end=T0 + 4)
    got = eng.invoke(h, now=T0 + 9)
    assert got.ts.tolist() == [T0 + t for t in (2, 2, 3, 3, 3, 4, 4)]
    assert [r[0] for r in got.rows] == [1, 2, 3, 4, 5, 6, 7]
    assert row_counts(eng) == {"R": 7, "S": 0}


def test_replay_into_a_running_server_answers_like_live(
        spark: SparkSession, tmp_path: Path) -> None:
    events = arrivals(600, seed=4)
    archive = write_archive(tmp_path / "arc", events)
    live, live_handles = new_engine()
    feed(live, events)
    engine, handles = new_engine()
    server = Server(engine, port=0, token="t")
    host, port = server.start_in_thread()
    try:
        with psoup.Client(f"{host}:{port}", token="t") as client:
            report = replay([archive], client, streams=["R", "S"])
            assert report.rows == len(events)
            nows = [events[-1][2]]
            assert answers(client, handles, nows) == answers(live, live_handles, nows)
    finally:
        server.stop()


def test_replay_may_start_at_the_latest_ts_and_creates_missing_streams(
        spark: SparkSession, tmp_path: Path) -> None:
    events = [("R", (i, i % 3, 2.5, "n"), T0 + i // 2) for i in range(10)]
    archive = write_archive(tmp_path / "arc", events)
    eng = psoup.Engine()
    eng.create_stream("R", R_COLUMNS)
    eng.insert("R", [(99, 0, 1.0, "live")], ts=T0 + 3)
    report = replay([archive], eng, start=T0 + 3)      # rows at exactly the latest ts too
    assert report.rows == 4
    assert eng.stats()["streams"]["R"]["latest_ts"] == T0 + 4

    fresh = psoup.Engine()
    replay([archive], fresh, streams=["R"], end=T0)
    assert fresh.stats()["streams"]["R"]["columns"] == dict(R_COLUMNS)
    assert row_counts(fresh) == {"R": 2}


def test_several_archives_replay_as_one(spark: SparkSession, tmp_path: Path) -> None:
    events = arrivals(400, seed=6)
    first = write_archive(tmp_path / "one", events[:250])
    second = write_archive(tmp_path / "two", events[250:], first_tid=250)
    whole, handles = new_engine()
    replay([second, first], whole, slice_rows=100)
    live, live_handles = new_engine()
    feed(live, events)
    nows = [events[-1][2]]
    assert answers(whole, handles, nows) == answers(live, live_handles, nows)


# ---------------------------------------------------------------------- the ordering rule

@pytest.mark.parametrize("start", [None, T0 + 2.5])
def test_replay_that_would_not_append_is_refused_before_anything(
        tmp_path: Path, start: float | None) -> None:
    events = [("R", (i, 0, 1.0, "n"), T0 + i) for i in range(10)]
    archive = write_archive(tmp_path / "arc", events)
    eng = psoup.Engine()
    eng.create_stream("R", R_COLUMNS)
    eng.insert("R", [(1, 0, 1.0, "live")], ts=T0 + 5.5)
    with pytest.raises(ReplayError) as err:
        replay([archive], eng, start=start)
    message = str(err.value)
    assert "stream 'R' holds data up to ts 1767225605.5" in message
    assert "start=1767225605.5 replays all of them" in message
    assert row_counts(eng) == {"R": 1}


# ---------------------------------------------------------------------- bad archives

def _part(root: Path, stream: str, table: pa.Table, first: int, last: int) -> Path:
    path = part_path(root, stream, float(table.column("ts")[0].as_py()), first, last)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def _r_table(ts: list[float], tids: list[int], **override: Any) -> pa.Table:
    n = len(ts)
    cols = {"ts": pa.array(ts, pa.float64()), "tuple_id": pa.array(tids, pa.int64()),
            "a": pa.array(range(n), pa.int64()), "b": pa.array([1] * n, pa.int64()),
            "x": pa.array([0.5] * n, pa.float64()), "name": pa.array(["n"] * n, pa.string())}
    cols.update(override)
    return pa.table({k: v for k, v in cols.items() if v is not None})


@pytest.mark.parametrize("damage, complaint", [
    (lambda root: _part(root, "R", _r_table([T0, T0 + 1], [5, 6], x=None), 5, 6),
     "no column 'x' (stream 'R' has a INT, b INT, x FLOAT, name TEXT)"),
    (lambda root: _part(root, "R", _r_table([T0, T0 + 1], [5, 6],
                                            a=pa.array([1.0, 2.0])), 5, 6),
     "column 'a' holds double, but stream 'R' declares it INT"),
    (lambda root: _part(root, "R", _r_table([T0, T0 + 1], [5, 6],
                                            extra=pa.array([1, 2])), 5, 6),
     "column 'extra' is not a column of stream 'R'"),
    (lambda root: _part(root, "R", _r_table([T0 + 1, T0], [5, 6]), 5, 6),
     "ts 1767225600.0 at tuple_id 6 is older than ts 1767225601.0 at tuple_id 5"),
    (lambda root: _part(root, "R", _r_table([T0 - 5, T0 - 4], [900, 901]), 900, 901),
     "is older than ts"),
    (lambda root: _part(root, "R", _r_table([T0, T0 + 1], [5, 6],
                                            x=pa.array([1.0, float("nan")])), 5, 6),
     "column 'x' is NaN at tuple_id 6"),
    (lambda root: _part(root, "R", _r_table([T0, T0 + 1], [5, 6],
                                            name=pa.array(["n", None])), 5, 6),
     "column 'name' is NULL at tuple_id 6"),
    (lambda root: _part(root, "R", _r_table([T0, T0 + 1], [5, 6]), 5, 5),
     "holds tuple_id 6, outside the range 5..5 its name gives"),
])
def test_bad_archive_is_reported_by_file_and_nothing_is_delivered(
        tmp_path: Path, damage: Callable[[Path], Path], complaint: str) -> None:
    events = [("R", (i, 0, 1.0, "n"), T0 + 10 + i) for i in range(5)]
    archive = write_archive(tmp_path / "arc", events, first_tid=100)
    bad = damage(archive)
    eng, _ = new_engine()
    with pytest.raises(ArchiveError) as err:
        replay([archive], eng)
    assert str(err.value).startswith(f"{bad}: ")
    assert complaint in str(err.value)
    assert row_counts(eng) == {"R": 0, "S": 0}


def _truncate(data: bytes) -> bytes:
    return data[:-40]


def _scribble(data: bytes) -> bytes:
    middle = len(data) // 3
    return data[:middle] + bytes(range(7, 247)) + data[middle + 240:]


@pytest.mark.parametrize("damage", [_truncate, _scribble])
def test_damaged_parquet_file_is_reported_by_name(
        tmp_path: Path, damage: Callable[[bytes], bytes]) -> None:
    archive = write_archive(tmp_path / "arc", arrivals(2000), flush_rows=500)
    victim = sorted(archive.rglob("*.parquet"))[1]
    victim.write_bytes(damage(victim.read_bytes()))
    eng, _ = new_engine()
    with pytest.raises(ArchiveError, match=f"^{re.escape(str(victim))}: "):
        replay([archive], eng)
    assert row_counts(eng) == {"R": 0, "S": 0}


def test_overlapping_tuple_ids_across_archives_are_refused(tmp_path: Path) -> None:
    events = arrivals(50)
    one = write_archive(tmp_path / "one", events)
    two = write_archive(tmp_path / "two", events)
    with pytest.raises(ArchiveError, match="overlap"):
        plan_replay([one, two], {})


def test_unknown_stream_is_named(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "arc", arrivals(20))
    with pytest.raises(ArchiveError, match="no stream 'Q' in .* \\(streams there: R, S\\)"):
        plan_replay([archive], {}, streams=["Q"])


def test_slices_hold_about_slice_rows_and_never_split_a_timestamp(tmp_path: Path) -> None:
    events = arrivals(3000, seed=9)
    archive = write_archive(tmp_path / "arc", events)
    plan = plan_replay([archive], {}, slice_rows=500)
    stamps = np.array([ts for _, _, ts in events])
    sizes = [int(((stamps >= lo) & ((stamps <= hi) if closed else (stamps < hi))).sum())
             for lo, hi, closed in plan.slices]
    assert sum(sizes) == len(events) == plan.rows
    assert max(sizes) <= 500 + 2 * 500 // 16 + 2      # sampling slack per stream, ties
    assert len(plan.slices) >= 6


# ---------------------------------------------------------------------- import

def _traffic_rows(n: int, start: int = 0, t0: float = T0) -> list[dict[str, Any]]:
    """Readings in no particular ts order, with ties, spanning two days."""
    return [{"lane": i % 5, "speed": round(10 + (i * 7.3) % 80, 1), "road": f"r{i % 7}",
             "ts": t0 - 500 + ((i * 37) % 1000)} for i in range(start, start + n)]


TRAFFIC = "lane INT, speed FLOAT, road TEXT"


@pytest.mark.parametrize("file_rows", [1 << 20, 97])     # 97: many sorted partitions
def test_import_of_csv_json_and_parquet_reads_back_in_ts_then_input_order(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        file_rows: int) -> None:
    monkeypatch.setattr(importer, "_FILE_ROWS", file_rows)
    root = tmp_path / "arc"
    old = Archive(root)
    old.add("traffic", parse_columns("traffic", TRAFFIC),
            {"ts": np.array([T0 - 900.0, T0 - 800.0]), "tupleID": np.array([40, 41]),
             "lane": np.array([1, 2]), "speed": np.array([5.0, 6.0]), "road": ["a", "b"]})
    old.flush()
    parts = [_traffic_rows(300), _traffic_rows(200, 300), _traffic_rows(100, 500)]
    files = [write(tmp_path / "a.csv", parts[0]), write(tmp_path / "b.jsonl", parts[1]),
             write(tmp_path / "c.parquet", parts[2])]
    report = import_files(files, "traffic", parse_columns("traffic", TRAFFIC), root)
    assert (report.rows, report.first_tid, report.last_tid) == (600, 42, 641)

    rows = [r for part in parts for r in part]
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["ts"], i))   # stable: input order
    got = Archive(root).read("traffic").to_pylist()
    assert [r["tuple_id"] for r in got] == [40, 41, *range(42, 642)]
    assert got[2:] == [{"ts": rows[i]["ts"], "tuple_id": 42 + k, "lane": rows[i]["lane"],
                        "speed": rows[i]["speed"], "road": rows[i]["road"]}
                       for k, i in enumerate(order)]
    assert {p.parent.name for p in report.files} == {"date=2025-12-31", "date=2026-01-01"}
    if file_rows > report.rows:
        assert len(report.files) == 2                   # one per day
    else:
        assert len(report.files) > 2                    # one per day of each partition
    seen = duckdb.sql(f"SELECT count(*), min(tuple_id), max(tuple_id), count(DISTINCT date) "
                      f"FROM read_parquet('{root}/*/*/*.parquet', hive_partitioning=true) "
                      f"WHERE stream = 'traffic'")
    assert seen is not None and seen.fetchall() == [(602, 40, 641, 2)]
    plan_replay([root], {})                 # and replay's checks accept it
    for grain in ("minute", "hour", "day"):  # aggregate copies beside it (durability.md)
        copies = {p.name for p in (tmp_path / "aggregates" / "stream=traffic" /
                                   f"grain={grain}").glob("*.parquet")}
        assert {p.name.replace("part-", "agg-", 1) for p in report.files} <= copies


@pytest.mark.parametrize("name, text, complaint", [
    ("no_speed.csv", "lane,road,ts\n1,x,5\n", "no column 'speed' (its columns: lane, road, ts)"),
    ("bad_int.csv", "lane,speed,road,ts\n1,2.5,x,5\n2.5,3,y,6\n",
     "column 'lane' holds '2.5', which is not INT (in its first 2 rows)"),
    ("bad_int_late.csv", "lane,speed,road,ts\n" + "1,2,x,5\n" * 1000 + "2.5,3,y,6\n",
     "column 'lane' holds '2.5', which is not INT (1 row like it)"),
    ("nan.csv", "lane,speed,road,ts\n1,NaN,x,5\n", "column 'speed' holds NaN"),
    ("missing.jsonl", '{"lane": 1, "speed": 2.0, "road": "x", "ts": 5}\n'
                      '{"lane": 1, "road": "x", "ts": 6}\n',
     "column 'speed' has a missing value (psoup has no NULLs)"),
    ("typed.jsonl", '{"lane": 1, "speed": 2.0, "road": 7, "ts": 5}\n',
     "column 'road' holds bigint, which does not cast to TEXT"),
    ("bad_ts.csv", "lane,speed,road,ts\n1,2,x,yesterday\n",
     "timestamp column 'ts' holds 'yesterday'"),
    ("broken.jsonl", '{"lane": 1, "speed": 2.0, "road": "x", "ts": 5}\n{"lane": 1,\n',
     "cannot be read as jsonl (Expecting"),
])
def test_import_error_names_file_and_column_and_writes_nothing(
        spark: SparkSession, tmp_path: Path, name: str, text: str, complaint: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    root = tmp_path / "arc"
    with pytest.raises(ArchiveError) as err:
        import_files([path], "traffic", parse_columns("traffic", TRAFFIC), root)
    assert str(err.value).startswith(f"{path}: ")
    assert complaint in str(err.value)
    assert not list(root.rglob("*.parquet"))


@pytest.mark.parametrize("name, text, complaint", [
    ("header.csv", "lane,sped,road,ts\n1,2,x,5\n", "no column 'speed'"),
    ("header.csv.gz", None, "no column 'speed'"),
    ("types.jsonl", '{"lane": "one", "speed": 2.0, "road": "x", "ts": 5}\n',
     "column 'lane' holds 'one', which is not INT"),
    ("header.parquet", None, "no timestamp column 'ts'"),
])
def test_import_checks_headers_and_first_rows_before_starting_spark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str | None,
        complaint: str) -> None:
    """A wrong header or a plainly wrong type is reported in a moment, not after Spark
    has started."""
    import gzip

    from psoup.spark import session

    def no_spark(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError("Spark was started")
    monkeypatch.setattr(session, "spark_session", no_spark)
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(b"lane,sped,road,ts\n1,2,x,5\n"))
    elif name.endswith(".parquet"):
        pq.write_table(pa.table({"lane": [1], "speed": [2.0], "road": ["x"], "t": [5.0]}), path)
    else:
        assert text is not None
        path.write_text(text)
    with pytest.raises(ArchiveError, match=re.escape(complaint)):
        import_files([path], "traffic", parse_columns("traffic", TRAFFIC), tmp_path / "arc")


def test_import_older_than_the_archive_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "arc"
    columns = parse_columns("traffic", TRAFFIC)
    import_files([write(tmp_path / "new.csv", _traffic_rows(20, t0=T0 + 5000))], "traffic",
                 columns, root)
    before = sorted(root.rglob("*.parquet"))
    with pytest.raises(ArchiveError, match="grows forward in time"):
        import_files([write(tmp_path / "old.csv", _traffic_rows(20))], "traffic", columns, root)
    with pytest.raises(ArchiveError, match="holds stream 'traffic' with columns lane INT"):
        import_files([tmp_path / "new.csv"], "traffic", parse_columns("traffic", "lane INT"),
                     root)
    assert sorted(root.rglob("*.parquet")) == before


def test_import_into_a_relative_directory_writes_under_the_absolute_one(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # executors on a cluster have working directories of their own: they get the
    # archive root as an absolute path
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    write(work / "in.csv", _traffic_rows(50))
    seen: list[str] = []
    bind = partial                      # what the importer binds its tasks' arguments with

    def watched(fn: Callable[..., Any], root: str, *rest: Any) -> partial[Any]:
        seen.append(root)
        return bind(fn, root, *rest)

    monkeypatch.setattr(importer, "partial", watched)
    report = import_files(["in.csv"], "traffic", parse_columns("traffic", TRAFFIC), "arc")
    assert seen == [str(work / "arc")]
    assert report.rows == 50 and all(p.is_absolute() for p in report.files)
    assert Archive(work / "arc").read("traffic").num_rows == 50
    assert not list(work.rglob("*.tmp"))


def test_an_import_that_fails_while_renaming_leaves_the_archive_as_it_was(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "arc"
    columns = parse_columns("traffic", TRAFFIC)
    import_files([write(tmp_path / "a.csv", _traffic_rows(30))], "traffic", columns, root)
    before = sorted(root.rglob("*"))
    calls: list[str] = []
    real_replace = os.replace           # the importer's, which is os's

    def failing(src: str, dst: str) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    later = _traffic_rows(60, t0=T0 + 86_400)            # two days: two part files
    with pytest.raises(ArchiveError, match="No space left on device; none of the input was "
                                           "archived"):
        import_files([write(tmp_path / "b.csv", later)], "traffic", columns, root)
    assert len(calls) == 2
    assert sorted(root.rglob("*")) == before
    assert Archive(root).read("traffic").num_rows == 30


def test_an_import_whose_tasks_fail_leaves_no_temporary_files(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importer, "_FILE_ROWS", 20)    # several tasks, some succeed
    root = tmp_path / "arc"
    blocker = root / "stream=traffic" / "date=2026-01-01"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the day's directory should go")
    with pytest.raises(ArchiveError, match="writing stream 'traffic' under") as err:
        import_files([write(tmp_path / "a.csv", _traffic_rows(80))], "traffic",
                     parse_columns("traffic", TRAFFIC), root)
    # the executor's own exception, not the stage failure around it
    assert "failed: in a Spark executor: FileExistsError: " in str(err.value)
    assert sorted(root.rglob("*")) == [blocker.parent, blocker]


def test_import_reads_the_compressions_ingest_reads(spark: SparkSession, tmp_path: Path) -> None:
    """.csv.zst and .ndjson.gz, as `psoup ingest` takes them (psoup.formats)."""
    rows = _traffic_rows(60)
    files = []
    for name, codec, part in (("a.csv", "zstd", rows[:30]), ("b.jsonl", "gzip", rows[30:])):
        plain = write(tmp_path / name, part)
        out = tmp_path / ({"zstd": "a.csv.zst", "gzip": "b.ndjson.gz"}[codec])
        with pa.output_stream(str(out), compression=codec) as stream:
            stream.write(plain.read_bytes())
        files.append(out)
    root = tmp_path / "arc"
    report = import_files(files, "traffic", parse_columns("traffic", TRAFFIC), root)
    assert report.rows == 60
    got = Archive(root).read("traffic").to_pylist()
    assert sorted((r["ts"], r["lane"], r["road"]) for r in got) == \
        sorted((r["ts"], r["lane"], r["road"]) for r in rows)


@pytest.mark.parametrize("name,fmt,complaint", [
    ("a.csv.lz4", None, ".lz4 compression is not supported"),
    ("a.parquet.gz", None, "compresses its pages itself"),
    ("a.csv.gz", "parquet", "compresses its pages itself"),
    ("a.xlsx", None, "cannot tell the format"),
])
def test_import_refuses_what_ingest_refuses_before_spark_starts(
        tmp_path: Path, name: str, fmt: str | None, complaint: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"x")
    with pytest.raises(ArchiveError, match=re.escape(complaint)):
        import_files([path], "traffic", parse_columns("traffic", TRAFFIC), tmp_path / "arc",
                     fmt=fmt)


class _StopAfter:
    """A target that rejects every insert after the first `ok`: a replay that stops part
    way, its last run cut short by a batch boundary inside one ts."""

    def __init__(self, engine: psoup.Engine, ok: int):
        self.engine, self.ok = engine, ok

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    def create_stream(self, name: str, columns: Sequence[tuple[str, str]]) -> None:
        return self.engine.create_stream(name, columns)

    def insert(self, stream: str, columns: Any, ts: Any) -> NDArray[np.int64]:
        if self.ok == 0:
            raise psoup.PSoupError("the connection was lost")
        self.ok -= 1
        return self.engine.insert(stream, columns, ts=ts)


def stored(engine: psoup.Engine, stream: str = "R") -> list[tuple[float, tuple[Any, ...]]]:
    h = engine.register(f"SELECT * FROM {stream}")
    got = engine.invoke(h, now=T0 + 10_000)
    engine.unregister(h)
    return list(zip(got.ts.tolist(), got.rows, strict=True))


@pytest.mark.parametrize("ok", [1, 2, 3, 5])
def test_resume_after_a_replay_stopped_part_way_doubles_and_loses_nothing(
        spark: SparkSession, tmp_path: Path, ok: int) -> None:
    # five rows per ts and inserts of 2 rows: stopping after `ok` inserts leaves the
    # target part way through the rows of one ts
    events: list[Event] = [("R", (i, i % 4, float(i), f"n{i}"), T0 + i // 5) for i in range(30)]
    events += [("S", (i % 4, i, i % 2 == 0), T0 + i // 3) for i in range(12)]
    events.sort(key=lambda e: e[2])
    archive = write_archive(tmp_path / "arc", events, flush_rows=7)
    whole = psoup.Engine()
    replay([archive], whole)
    eng = psoup.Engine()
    with pytest.raises(ReplayError):
        replay([archive], _StopAfter(eng, ok), batch_rows=2)
    held = sum(row_counts(eng).values())
    assert 0 < held < len(events)
    report = replay([archive], eng, resume=True)
    assert report.rows == len(events) - held
    for stream in ("R", "S"):
        assert stored(eng, stream) == stored(whole, stream)
    again = replay([archive], eng, resume=True)
    assert again.rows == 0 and again.note.startswith("nothing to resume: stream 'R' holds "
                                                     f"data up to ts {T0 + 5!r}")


def test_resume_counts_the_rows_at_the_latest_ts_across_checkpoints_and_retention(
        tmp_path: Path) -> None:
    events = [("R", (i, 0, 1.0, "n"), T0 + i // 4) for i in range(12)]   # four per ts
    archive = write_archive(tmp_path / "arc", events)
    state = tmp_path / "state"
    with psoup.Engine(path=str(state)) as eng:
        eng.execute("CREATE STREAM R (a INT, b INT, x FLOAT, name TEXT) RETAIN 2 ROWS")
        for _, row, ts in events[:7]:         # three of the four rows at T0 + 1
            eng.insert("R", [row], ts=ts)
        eng.checkpoint()
    with psoup.Engine(path=str(state)) as eng:
        stream = eng.stats()["streams"]["R"]
        assert (stream["rows"], stream["latest_ts"], stream["rows_at_latest_ts"]) == \
            (2, T0 + 1, 3)
        plan = plan_replay([archive], eng.stats()["streams"], resume=True)
        assert plan.rows == 5 and plan.streams["R"].skip == 3
        eng.insert("R", [(99, 0, 1.0, "n")], ts=T0 + 1)
        assert eng.stats()["streams"]["R"]["rows_at_latest_ts"] == 4
        eng.insert("R", [(99, 0, 1.0, "n")] * 2, ts=[T0 + 1, T0 + 9])
        assert eng.stats()["streams"]["R"]["rows_at_latest_ts"] == 1
        eng._check()


def test_resume_starts_each_stream_at_its_own_latest_ts_and_honours_the_range(
        tmp_path: Path) -> None:
    events: list[Event] = [("R", (i, 0, 1.0, "n"), T0 + i) for i in range(10)]
    events += [("S", (0, i, True), T0 + i) for i in range(10)]
    archive = write_archive(tmp_path / "arc", sorted(events, key=lambda e: e[2]))
    eng = psoup.Engine()
    eng.create_stream("R", R_COLUMNS)
    eng.create_stream("S", S_COLUMNS)
    eng.insert("R", [(1, 0, 1.0, "n")], ts=T0 + 6)
    eng.insert("S", [(0, 1, True)], ts=T0 + 2)
    plan = plan_replay([archive], eng.stats()["streams"], resume=True)
    assert (plan.streams["R"].rows, plan.streams["S"].rows) == (3, 7)
    plan = plan_replay([archive], eng.stats()["streams"], start=T0 + 4, end=T0 + 8,
                       resume=True)
    assert (plan.streams["R"].rows, plan.streams["S"].rows) == (2, 5)
    plan = plan_replay([archive], eng.stats()["streams"], end=T0 + 5, resume=True)
    assert (plan.streams["R"].rows, plan.streams["S"].rows) == (0, 3)


# ---------------------------------------------------------------------- the command line

def test_a_refusal_says_which_rows_at_the_latest_ts_each_from_value_replays(tmp_path: Path) -> None:
    events = [("R", (i, 0, 1.0, "n"), T0 + i // 2) for i in range(10)]   # two rows per ts
    archive = write_archive(tmp_path / "arc", events)
    eng = psoup.Engine()
    eng.create_stream("R", R_COLUMNS)
    eng.insert("R", [(1, 0, 1.0, "replayed")], ts=T0 + 2)   # a replay that stopped there
    with pytest.raises(ReplayError) as err:
        replay([archive], eng)
    message = str(err.value)
    assert (f"The archive has 2 rows of 'R' at ts {T0 + 2!r}: resume=True skips those "
            "'R' holds; ") in message
    assert f"start={T0 + 2!r} replays all of them" in message
    assert f"start={T0 + 3!r}, the archive's next ts, skips them all" in message
    shown = Failure(replay_options(message)).message     # as `psoup replay` prints it
    assert ": --resume skips those 'R' holds; --from " in shown
    assert "ts 2026-01-01T00:00:00.000Z (1767225600.0). The archive" in shown
    assert "--from 2026-01-01T00:00:03.000Z (1767225603.0), the archive's next" in shown
    assert len(shown) < 600
    assert row_counts(eng) == {"R": 1}


def test_a_refusal_says_when_the_archive_ends_before_the_targets_latest_ts(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "arc", [("R", (i, 0, 1.0, "n"), T0 + i)
                                               for i in range(3)])
    eng = psoup.Engine()
    eng.create_stream("R", R_COLUMNS)
    eng.insert("R", [(1, 0, 1.0, "live")], ts=T0 + 50)
    with pytest.raises(ReplayError, match=f"archive ends at ts {T0 + 2!r}, before that"):
        replay([archive], eng)


def test_a_start_after_the_archives_end_is_reported_not_silent(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "arc", [("R", (i, 0, 1.0, "n"), T0 + i)
                                               for i in range(3)])
    eng = psoup.Engine()
    report = replay([archive], eng, start=T0 + 10)
    assert report.rows == 0 and report.note == (f"the archive ends at ts {T0 + 2!r}, "
                                                f"before the start {T0 + 10!r}")


def test_cli_imports_then_replays_into_a_data_dir(spark: SparkSession, tmp_path: Path) -> None:
    runner = CliRunner()
    data = write(tmp_path / "readings.csv", _traffic_rows(120))
    archive = tmp_path / "arc"
    done = runner.invoke(main, ["archive", "import", str(data), "--stream", "traffic",
                                "--columns", TRAFFIC, "--into", str(archive)])
    assert done.exit_code == 0, (done.output, done.exception)
    assert done.stdout.startswith(f"120 rows of traffic into {archive} (2 files, tupleIDs 0..119")

    state = tmp_path / "state"
    with psoup.Engine(path=str(state)) as eng:
        eng.execute(f"CREATE STREAM traffic ({TRAFFIC})")
        eng.insert("traffic", [(9, 9.0, "live")], ts=T0 + 100)
        h = eng.register("SELECT road FROM traffic WHERE lane = 3")
    refused = runner.invoke(main, ["replay", str(archive), "--data-dir", str(state)])
    assert refused.exit_code == 1
    assert "--from 2026-01-01T00:01:40.000Z (1767225700.0)" in refused.stderr

    done = runner.invoke(main, ["replay", str(archive), "--data-dir", str(state),
                                "--from", "1767225700.0", "--to", "2026-01-01T00:08:00"])
    assert done.exit_code == 0, (done.output, done.exception)
    want = [r for r in _traffic_rows(120) if T0 + 100 <= r["ts"] <= T0 + 480]
    assert done.stdout.startswith(f"{len(want)} rows replayed into {state} (traffic "
                                  f"{len(want)};")
    with psoup.Engine(path=str(state)) as eng:  # durable: the log holds the replay
        got = eng.invoke(h, now=T0 + 500)
        assert len(got) == sum(r["lane"] == 3 for r in want)
        assert eng.stats()["streams"]["traffic"]["rows_total"] == 1 + len(want)


def test_cli_import_says_on_a_captured_stderr_what_it_is_doing(tmp_path: Path) -> None:
    # a process of its own: its Spark starts here, with the master it names
    data = write(tmp_path / "readings.csv", _traffic_rows(120))
    done = subprocess.run([sys.executable, "-m", "psoup.cli.main", "archive", "import",
                           str(data), "--stream", "traffic", "--columns", TRAFFIC,
                           "--into", str(tmp_path / "arc"), "--master", "local[1]"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("120 rows of traffic into")
    said = [line for line in done.stderr.splitlines() if not re.search(r": \d+ s", line)]
    want = ["1 input file checked (headers and first rows)", "starting Spark (local[1])…",
            "Spark started in N s", "reading and checking every row (a Spark job)…",
            "120 rows read and checked", "sorting and writing 120 rows (a Spark job)…",
            "2 part files written"]
    assert [re.sub(r"in \d+ s$", "in N s", line) for line in said] == want, done.stderr


def test_cli_resume_continues_a_replay_that_stopped_inside_one_ts(
        spark: SparkSession, tmp_path: Path) -> None:
    events = [("R", (i, 0, 1.0, f"n{i}"), T0 + i // 3) for i in range(9)]   # three per ts
    archive = write_archive(tmp_path / "arc", events)
    state = tmp_path / "state"
    with psoup.Engine(path=str(state)) as eng:
        eng.create_stream("R", R_COLUMNS)
        for _, row, ts in events[:4]:         # what a replay stopped after 4 rows left
            eng.insert("R", [row], ts=ts)
    done = CliRunner().invoke(main, ["replay", str(archive), "--data-dir", str(state),
                                     "--resume"])
    assert done.exit_code == 0, (done.output, done.exception)
    assert done.stdout.startswith(f"5 rows replayed into {state} (R 5;")
    assert done.stderr.startswith("archive checked: 5 rows to replay from 1 part file\n")
    with psoup.Engine(path=str(state)) as eng:
        got = eng.invoke(eng.register("SELECT a, name FROM R"), now=T0 + 10)
        assert got.rows == [(row[0], row[3]) for _, row, _ in events]
        assert got.ts.tolist() == [ts for _, _, ts in events]


@pytest.mark.parametrize("args, complaint", [
    (["--data-dir", "state", "--server", "127.0.0.1:9"], "pass --data-dir or --server, not both"),
    (["--from", "10", "--to", "5"], "--from 10.0 is after --to 5.0"),
])
def test_cli_replay_usage_errors(tmp_path: Path, args: list[str], complaint: str) -> None:
    done = CliRunner().invoke(main, ["replay", str(tmp_path), *args])
    assert done.exit_code == 2
    assert complaint in done.stderr
