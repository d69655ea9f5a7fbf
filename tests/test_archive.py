"""The Parquet archive: layout, per-day files, types, high water marks, recovery."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from psoup.archive import parquet
from psoup.archive.parquet import Archive
from psoup.archive.sampling import in_order, write_runs
from psoup.errors import SchemaError

COLUMNS = [("a", "int"), ("x", "float"), ("name", "text"), ("on", "bool")]
DAY = datetime(2024, 3, 1, tzinfo=timezone.utc).timestamp()   # midnight, 2024-03-01 UTC


def rows(first: int, last: int, t0: float = DAY + 3600.0,
         step: float = 1.0) -> dict[str, Any]:
    """Tuples first..last with a = 10 * tupleID, x = tupleID / 2, name = f"n{tupleID}",
    on = tupleID even, at ts = t0 + step * (tupleID - first)."""
    tids = np.arange(first, last + 1, dtype=np.int64)
    return {"ts": t0 + step * (tids - first).astype(np.float64), "tupleID": tids,
            "a": tids * 10, "x": tids / 2,
            "name": np.array([f"n{t}" for t in tids], dtype=object), "on": tids % 2 == 0}


def part(first: int, last: int) -> str:
    return f"part-{first:020d}-{last:020d}.parquet"


# ---------------------------------------------------------------------- layout

def test_flush_writes_the_hive_layout_named_by_tuple_id_range(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 2))
    assert arc.flush() == [tmp_path / "stream=R" / "date=2024-03-01" / part(0, 2)]
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet")] == [
        f"stream=R/date=2024-03-01/{part(0, 2)}"]


def test_rows_spanning_two_utc_days_go_to_two_files(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(5, 8, t0=DAY - 1.0, step=0.5))   # 23:59:59 .. 00:00:00.5
    paths = arc.flush()
    assert [(p.parent.name, p.name) for p in paths] == [
        ("date=2024-02-29", part(5, 6)), ("date=2024-03-01", part(7, 8))]
    assert in_order(pq.read_table(paths[0])).column("ts").to_pylist() == [DAY - 1.0, DAY - 0.5]
    assert in_order(pq.read_table(paths[1])).column("ts").to_pylist() == [DAY, DAY + 0.5]


def test_each_stream_has_its_own_directory(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 1))
    arc.add("S", [("b", "int")], {"ts": np.array([DAY]), "tupleID": np.array([2]),
                                  "b": np.array([7])})
    assert [p.relative_to(tmp_path).parts[0] for p in arc.flush()] == ["stream=R", "stream=S"]
    assert arc.streams() == ["R", "S"]


def test_file_holds_ts_tuple_id_then_schema_columns_with_their_types(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 2))
    schema = pq.read_schema(arc.flush()[0])
    assert schema.names == ["ts", "tuple_id", "a", "x", "name", "on", "psoup_sample"]
    assert schema.types == [pa.float64(), pa.int64(), pa.int64(), pa.float64(), pa.string(),
                            pa.bool_(), pa.int16()]


def test_psoup_schema_is_in_the_parquet_metadata(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 0))
    metadata = pq.read_schema(arc.flush()[0]).metadata
    assert metadata[b"psoup.stream"] == b"R"
    assert json.loads(metadata[b"psoup.columns"]) == [list(c) for c in COLUMNS]


def test_no_tmp_file_is_left_after_a_flush(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 3, t0=DAY - 2.0))
    arc.flush()
    assert list(tmp_path.rglob("*.tmp")) == []


# ---------------------------------------------------------------------- read

def test_read_returns_the_rows_in_tuple_id_order_with_their_types(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 2, t0=DAY - 1.5))   # two days
    arc.flush()
    arc.add("R", COLUMNS, rows(3, 4, t0=DAY + 5.0))
    arc.flush()
    assert arc.read("R").to_pylist() == [
        {"ts": DAY - 1.5 + t if t < 3 else DAY + 5.0 + t - 3, "tuple_id": t, "a": 10 * t,
         "x": t / 2, "name": f"n{t}", "on": t % 2 == 0} for t in range(5)]
    assert arc.read("R").schema.field("on").type == pa.bool_()
    assert arc.read("R").schema.field("name").type == pa.string()


def test_read_leaves_out_buffered_rows(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 1))
    arc.flush()
    arc.add("R", COLUMNS, rows(2, 3))
    assert arc.read("R").column("tuple_id").to_pylist() == [0, 1]


def test_read_of_a_stream_with_nothing_archived_is_empty(tmp_path: Path) -> None:
    table = Archive(tmp_path).read("R")
    assert table.num_rows == 0
    assert table.column_names == ["ts", "tuple_id"]


def test_text_columns_may_come_as_lists(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", [("name", "text")], {"ts": [DAY, DAY], "tupleID": [0, 1], "name": ["é", ""]})
    arc.flush()
    assert arc.read("R").column("name").to_pylist() == ["é", ""]


def test_caller_arrays_may_be_reused_after_add(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    data = rows(0, 2)
    arc.add("R", COLUMNS, data)
    for values in data.values():
        values[:] = values[::-1]
    arc.flush()
    fresh = rows(0, 2)
    table = arc.read("R")
    assert table.column("ts").to_pylist() == fresh["ts"].tolist()
    assert table.column("tuple_id").to_pylist() == [0, 1, 2]
    assert table.column("a").to_pylist() == [0, 10, 20]
    assert table.column("on").to_pylist() == [True, False, True]


def test_duckdb_reads_the_archive_with_hive_columns(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 3, t0=DAY - 2.0))
    arc.add("S", [("b", "float")], {"ts": np.array([DAY]), "tupleID": np.array([4]),
                                    "b": np.array([1.5])})
    arc.flush()
    files = f"{tmp_path}/**/*.parquet"
    counted = duckdb.sql(f"select count(*) from read_parquet('{files}', hive_partitioning=true, "
                         f"union_by_name=true)")
    assert counted is not None                  # a SELECT gives a relation
    assert counted.fetchall() == [(5,)]
    grouped = duckdb.sql(f"select stream, cast(date as varchar), count(*) from read_parquet("
                         f"'{tmp_path}/stream=R/**/*.parquet', hive_partitioning=true) "
                         f"group by all order by all")
    assert grouped is not None
    got = grouped.fetchall()
    assert got == [("R", "2024-02-29", 2), ("R", "2024-03-01", 2)]


# ---------------------------------------------------------------------- buffering

def test_rows_are_buffered_until_flush(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 2))
    assert arc.buffered_rows == 3
    assert list(tmp_path.rglob("*.parquet")) == []
    assert arc.high_water("R") == -1


def test_a_stream_is_flushed_when_its_buffer_reaches_flush_rows(tmp_path: Path) -> None:
    arc = Archive(tmp_path, flush_rows=4)
    arc.add("R", COLUMNS, rows(0, 2))
    assert list(tmp_path.rglob("*.parquet")) == []
    arc.add("R", COLUMNS, rows(3, 4))
    assert [p.name for p in tmp_path.rglob("*.parquet")] == [part(0, 4)]
    assert arc.buffered_rows == 0


def test_flush_with_nothing_buffered_writes_nothing(tmp_path: Path) -> None:
    assert Archive(tmp_path).flush() == []


def test_a_new_schema_for_a_stream_flushes_the_old_rows_first(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", [("a", "int")], {"ts": [DAY], "tupleID": [0], "a": [1]})
    arc.add("R", [("a", "int"), ("b", "text")], {"ts": [DAY], "tupleID": [1], "a": [2],
                                                  "b": ["x"]})
    assert [p.name for p in tmp_path.rglob("*.parquet")] == [part(0, 0)]
    arc.flush()
    assert arc.read("R").to_pylist() == [{"ts": DAY, "tuple_id": 0, "a": 1, "b": None},
                                         {"ts": DAY, "tuple_id": 1, "a": 2, "b": "x"}]


def test_rejected_rows_under_a_new_schema_leave_the_old_buffer_alone(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", [("a", "int")], {"ts": [DAY], "tupleID": [0], "a": [1]})
    with pytest.raises(SchemaError):
        arc.add("R", [("b", "text")], {"ts": [DAY], "tupleID": [1], "b": [5]})
    assert arc.buffered_rows == 1
    assert list(tmp_path.rglob("*.parquet")) == []


# ---------------------------------------------------------------------- high water

def test_high_water_is_the_largest_flushed_tuple_id(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 4, t0=DAY - 2.0))
    arc.flush()
    assert arc.high_water("R") == 4
    assert arc.high_water("S") == -1


def test_high_water_survives_reopening(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 4, t0=DAY - 2.0))
    arc.add("S", COLUMNS, rows(10, 11))
    arc.flush()
    again = Archive(tmp_path)
    assert (again.high_water("R"), again.high_water("S")) == (4, 11)
    assert again.streams() == ["R", "S"]


def test_rows_already_archived_are_skipped_after_reopening(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 4))
    arc.flush()
    again = Archive(tmp_path)
    again.add("R", COLUMNS, rows(2, 7))   # a log replayed after a crash
    assert again.buffered_rows == 3
    again.flush()
    assert again.read("R").column("tuple_id").to_pylist() == list(range(8))


def test_rows_already_buffered_are_skipped(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 4))
    arc.add("R", COLUMNS, rows(0, 6))
    assert arc.buffered_rows == 7
    arc.flush()
    assert arc.read("R").column("tuple_id").to_pylist() == list(range(7))


def test_leftover_tmp_files_are_removed_on_open(tmp_path: Path) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 1))
    path = arc.flush()[0]
    tmp = path.parent / (part(2, 3) + ".tmp")
    tmp.write_bytes(b"half a file")
    again = Archive(tmp_path)
    assert not tmp.exists()
    assert again.high_water("R") == 1


def test_failed_flush_keeps_only_the_unwritten_rows(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    arc = Archive(tmp_path)
    arc.add("R", COLUMNS, rows(0, 3, t0=DAY - 2.0))   # two days: 0-1 and 2-3
    real_write = write_runs                     # what parquet.write_runs is
    calls: list[int] = []

    def failing_second(table: pa.Table, rng: np.random.Generator, where: str | IO[bytes],
                       **kwargs: Any) -> None:
        calls.append(table.num_rows)
        if len(calls) == 2:
            raise OSError("disk full")
        real_write(table, rng, where, **kwargs)

    monkeypatch.setattr(parquet, "write_runs", failing_second)
    with pytest.raises(OSError, match="disk full"):
        arc.flush()
    assert (arc.high_water("R"), arc.buffered_rows) == (1, 2)
    monkeypatch.setattr(parquet, "write_runs", real_write)
    arc.flush()
    assert sorted(p.name for p in tmp_path.rglob("*.parquet")) == [part(0, 1), part(2, 3)]


# ---------------------------------------------------------------------- bad input

@pytest.mark.parametrize("stream, columns, data", [
    ("R", COLUMNS, {k: v for k, v in rows(0, 2).items() if k != "name"}),
    ("R", COLUMNS, {**rows(0, 2), "a": np.array([1, 2])}),
    ("R", COLUMNS, {**rows(0, 2), "tupleID": np.array([0, 2, 1])}),
    ("R", COLUMNS, {**rows(0, 2), "ts": np.array([DAY, np.nan, DAY])}),
    ("R", COLUMNS, {**rows(0, 2), "a": np.array(["p", "q", "r"])}),
    ("R", [("a", "decimal")], rows(0, 2)),
    ("R", [("tuple_id", "int")], {**rows(0, 2), "tuple_id": np.arange(3)}),
    ("R/../S", COLUMNS, rows(0, 2)),
], ids=["missing column", "short column", "tuple ids decrease", "nan ts", "text as int",
        "unknown type", "column named tuple_id", "bad stream name"])
def test_bad_rows_are_rejected_and_change_nothing(tmp_path: Path, stream: str,
                                                 columns: list[tuple[str, str]],
                                                 data: dict[str, Any]) -> None:
    arc = Archive(tmp_path)
    with pytest.raises(SchemaError):
        arc.add(stream, columns, data)
    assert arc.buffered_rows == 0
    assert arc.streams() == []
