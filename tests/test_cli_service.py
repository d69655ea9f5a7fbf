"""The `psoup` command against a running server: streams, ingest, named handles, invoke,
--changes, watch, errors and the handle store, as a disconnected user would use them."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeAlias

import click
import pytest
from click.testing import CliRunner
from click.testing import Result as CliResult

from psoup import Engine
from psoup.cli.handles import HandleStore
from psoup.cli.main import main
from psoup.client import Client
from psoup.config import parse_address, token_path
from psoup.results.result import Result
from psoup.server import Server
from tests.support import Clock, wait_listening, write

#: The `psoup` fixture: run(*args, input=None, runner=None) -> click's Result.
Run: TypeAlias = Callable[..., CliResult]

TOKEN = "cli-test-token"
T0 = 1_767_225_600.0
DDL_COLUMNS = "lane INT, stationid INT, speed FLOAT, note TEXT"
SLOW = ("SELECT stationid, speed, note FROM traffic WHERE lane = 3 AND speed < 30 "
        "BEGIN NOW - 100 END NOW")


def readings(n: int, t0: float = T0 - 100, start: int = 0) -> list[dict[str, Any]]:
    """n traffic readings, one per second from t0; about a third are slow lane-3 ones."""
    out: list[dict[str, Any]] = []
    for i in range(start, start + n):
        out.append({"lane": 3 if i % 3 == 0 else 1 + i % 8, "stationid": i % 9 + 1,
                    "speed": round(5.5 + (i * 7.3) % 60, 1),
                    "note": ["ok", "jam", "wet road"][i % 3], "ts": t0 + (i - start)})
    return out


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config"
    monkeypatch.setenv("PSOUP_CONFIG_DIR", str(path))
    monkeypatch.delenv("PSOUP_SERVER", raising=False)
    monkeypatch.delenv("PSOUP_TOKEN", raising=False)
    return path


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def server(clock: Clock) -> Iterator[str]:
    srv = Server(Engine(clock=clock), port=0, token=TOKEN)
    host, port = srv.start_in_thread()
    yield f"{host}:{port}"
    srv.stop()


@pytest.fixture
def psoup(server: str) -> Run:
    """Run one `psoup` command against the test server; returns click's Result."""

    def run(*args: str, input: bytes | str | None = None,
            runner: CliRunner | None = None) -> CliResult:
        return (runner or CliRunner()).invoke(
            main, ["--server", server, "--token", TOKEN, *args], input=input)
    return run


@pytest.fixture
def traffic(psoup: Run) -> str:
    done = psoup("stream", "create", "traffic", DDL_COLUMNS, "--retain", "1 hour")
    assert done.exit_code == 0, done.output
    return "traffic"


def ok(result: CliResult) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result.stdout


def embedded_answer(rows: list[dict[str, Any]], sql: str, now: float) -> Result:
    eng = Engine(clock=lambda: now)
    eng.execute(f"CREATE STREAM traffic ({DDL_COLUMNS}) RETAIN 1 HOUR")
    eng.insert("traffic", [{k: v for k, v in r.items() if k != "ts"} for r in rows],
               ts=[r["ts"] for r in rows])
    return eng.invoke(eng.register(sql))


# ---------------------------------------------------------------------- ingest

@pytest.mark.parametrize("name", ["readings.csv", "readings.jsonl", "readings.parquet"])
def test_ingested_file_answers_like_the_embedded_engine(psoup: Run, traffic: str, tmp_path: Path,
                                                        name: str) -> None:
    rows = readings(90)
    path = write(tmp_path / name, rows)
    assert ok(psoup("ingest", "traffic", str(path), "--batch-rows", "40")).startswith(
        "90 rows into traffic")
    handle = ok(psoup("register", SLOW)).strip()
    got = json.loads(ok(psoup("invoke", handle, "--format", "json")))
    want = embedded_answer(rows, SLOW, T0)
    assert len(want) > 10
    assert got["rows"] == [list(r) for r in want.rows]
    assert got["ts"] == want.ts.tolist()


def test_csv_column_declared_text_stays_text_even_when_it_looks_numeric(psoup: Run,
                                                                        tmp_path: Path) -> None:
    ok(psoup("stream", "create", "stations", "id INT, zip TEXT"))
    path = tmp_path / "stations.csv"
    path.write_text("id,zip,ts\n1,02134,10\n2,10001,11\n")
    ok(psoup("ingest", "stations", str(path)))
    handle = ok(psoup("register", "SELECT zip FROM stations WHERE id >= 1")).strip()
    got = json.loads(ok(psoup("invoke", handle, "--format", "json", "--now", "12")))
    assert got["rows"] == [["02134"], ["10001"]]


def test_ingest_reads_csv_from_stdin(psoup: Run, traffic: str, tmp_path: Path) -> None:
    rows = readings(30)
    data = write(tmp_path / "r.csv", rows).read_bytes()
    assert ok(psoup("ingest", "traffic", "-", input=data)).startswith("30 rows into traffic")
    handle = ok(psoup("register", SLOW)).strip()
    got = json.loads(ok(psoup("invoke", handle, "--format", "json")))
    assert got["rows"] == [list(r) for r in embedded_answer(rows, SLOW, T0).rows]


def test_ingest_without_ts_column_uses_the_server_clock(psoup: Run, traffic: str,
                                                        tmp_path: Path) -> None:
    path = tmp_path / "no_ts.jsonl"
    path.write_text('{"lane": 3, "stationid": 1, "speed": 2.5, "note": "x"}\n')
    ok(psoup("ingest", "traffic", str(path)))
    handle = ok(psoup("register", SLOW)).strip()
    assert json.loads(ok(psoup("invoke", handle, "--format", "json")))["ts"] == [T0]


def test_ingest_of_millisecond_timestamps_needs_ts_unit_and_then_matches(psoup: Run, traffic: str,
                                                                          tmp_path: Path) -> None:
    """A ms clock without --ts-unit is refused whole, naming the unit; with it, the
    answer is the one of the same rows in seconds."""
    rows = readings(20)
    in_ms = [dict(r, ts=int(round(r["ts"] * 1000))) for r in rows]
    path = write(tmp_path / "ms.jsonl", in_ms)
    refused = psoup("ingest", "traffic", str(path))
    assert refused.exit_code == 1
    assert "looks like milliseconds" in refused.stderr and "--ts-unit ms" in refused.stderr
    assert ok(psoup("ingest", "traffic", str(path), "--ts-unit", "ms")).startswith(
        "20 rows into traffic")
    handle = ok(psoup("register", SLOW)).strip()
    got = json.loads(ok(psoup("invoke", handle, "--format", "json")))
    want = embedded_answer([dict(r, ts=m["ts"] / 1000)
                            for r, m in zip(rows, in_ms, strict=True)], SLOW, T0)
    assert got["rows"] == [list(r) for r in want.rows] and got["ts"] == want.ts.tolist()


def test_ingest_stops_at_a_bad_batch_and_says_what_went_in(psoup: Run, traffic: str,
                                                           tmp_path: Path) -> None:
    path = write(tmp_path / "bad.csv", readings(10))
    lines = path.read_text().splitlines()
    lines[8] = "abc" + lines[8][lines[8].index(","):]          # input row 8: lane = abc
    path.write_text("\n".join(lines) + "\n")
    done = psoup("ingest", "traffic", str(path), "--batch-rows", "3")
    assert done.exit_code == 1
    assert "6 rows ingested before it" in done.stderr and "(input rows 7-9)" in done.stderr
    assert "input row 8 holds 'abc'" in done.stderr
    assert "'traffic', input row 7, column 'lane'" in done.stderr     # not the batch's row 0
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    stats = json.loads(ok(psoup("stats", "--format", "json")))
    assert stats["streams"]["traffic"]["rows"] == 6


def test_ingest_names_a_column_the_stream_does_not_have(psoup: Run, traffic: str,
                                                        tmp_path: Path) -> None:
    path = write(tmp_path / "r.csv", [dict(r, station="A") for r in readings(3)])
    done = psoup("ingest", "traffic", str(path))
    assert done.exit_code == 1
    assert "the input has column 'station', which stream 'traffic' does not have" \
        in done.stderr


def test_ingest_suggests_ts_column_for_a_timestamp_under_another_name(psoup: Run, traffic: str,
                                                                       tmp_path: Path) -> None:
    rows = [{("time" if k == "ts" else k): v for k, v in r.items()} for r in readings(3)]
    done = psoup("ingest", "traffic", str(write(tmp_path / "r.csv", rows)))
    assert done.exit_code == 1 and "pass --ts-column time" in done.stderr
    ok(psoup("ingest", "traffic", str(tmp_path / "r.csv"), "--ts-column", "time"))


def test_an_empty_csv_cell_names_its_line_and_column_and_says_there_are_no_nulls(
        psoup: Run, traffic: str, tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("lane,stationid,speed,note,ts\n1,2,3.5,ok,10\n1,,3.5,ok,11\n")
    done = psoup("ingest", "traffic", str(path))
    assert done.exit_code == 1
    assert "line 3, column 'stationid': an empty cell, and psoup has no NULLs" in done.stderr


def test_a_short_csv_row_names_its_line(psoup: Run, traffic: str, tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text('lane,stationid,speed,note,ts\n1,2,3.5,"two\nlines",10\n1,2,3.5,11\n')
    done = psoup("ingest", "traffic", str(path))
    assert done.exit_code == 1 and "line 4 has 4 cells, the header 5" in done.stderr


def test_ingest_of_an_unknown_extension_is_a_usage_error(psoup: Run, traffic: str,
                                                         tmp_path: Path) -> None:
    path = tmp_path / "readings.xlsx"
    path.write_text("x")
    done = psoup("ingest", "traffic", str(path))
    assert done.exit_code == 2 and "--format" in done.stderr


def compressed(path: Path, codec: str) -> Path:
    """The file compressed with `codec` beside it, under its name plus the codec's suffix."""
    import pyarrow as pa
    out = path.with_name(path.name + {"gzip": ".gz", "bz2": ".bz2", "zstd": ".zst"}[codec])
    with pa.output_stream(str(out), compression=codec) as stream:
        stream.write(path.read_bytes())
    return out


@pytest.mark.parametrize("name,codec", [("r.csv", "zstd"), ("r.jsonl", "bz2"),
                                        ("r.ndjson", "gzip"), ("r.csv", "gzip")])
def test_ingest_decompresses_gz_bz2_and_zst(psoup: Run, traffic: str, tmp_path: Path, name: str,
                                            codec: str) -> None:
    rows = readings(30)
    plain = write(tmp_path / "plain.jsonl" if name.endswith("json") else tmp_path / name, rows)
    path = compressed(plain.rename(tmp_path / name), codec)
    assert ok(psoup("ingest", "traffic", str(path), "--batch-rows", "7")).startswith(
        "30 rows into traffic")
    handle = ok(psoup("register", SLOW)).strip()
    got = json.loads(ok(psoup("invoke", handle, "-o", "json")))
    assert got["rows"] == [list(r) for r in embedded_answer(rows, SLOW, T0).rows]


@pytest.mark.parametrize("name,fmt,why", [
    ("r.csv.lz4", [], ".lz4 compression is not supported"),
    ("r.parquet.gz", [], "compresses its pages itself"),
    ("r.gz", ["-o", "parquet"], "compresses its pages itself")])
def test_ingest_refuses_unsupported_formats_and_compressions_clearly(
        psoup: Run, traffic: str, tmp_path: Path, name: str, fmt: list[str], why: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"x")
    done = psoup("ingest", "traffic", str(path), *fmt)
    assert done.exit_code == 2 and why in done.stderr, done.stderr


def test_ingest_progress_shows_percentage_and_eta_of_a_named_file(
        psoup: Run, traffic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psoup.cli.main as cli
    monkeypatch.setattr(cli, "_stderr_is_terminal", lambda: True)
    for name in ("r.csv", "r.parquet"):
        path = write(tmp_path / name, readings(50))
        done = psoup("ingest", "traffic", str(path), "--batch-rows", "10")
        lines = [line for line in ok(done) and done.stderr.split("\r") if "rows/s" in line]
        assert len(lines) == 5 and "ETA" in lines[0]
        assert lines[-1].startswith("50 rows  100%  ETA 00:00:00")
        ok(psoup("stream", "drop", "traffic"))
        ok(psoup("stream", "create", "traffic", DDL_COLUMNS))
    piped = psoup("ingest", "traffic", "-", "--batch-rows", "10",
                  input=write(tmp_path / "s.csv", readings(50)).read_bytes())
    lines = [line for line in ok(piped) and piped.stderr.split("\r") if "rows/s" in line]
    assert len(lines) == 5 and lines[-1].startswith("50 rows  ") and "%" not in piped.stderr


def test_progress_rates_and_eta_follow_the_recent_pace() -> None:
    from psoup.cli.ingest import RateMeter
    now = [0.0]
    meter = RateMeter(10_000, clock=lambda: now[0], window=10.0)
    now[0] = 10.0                                   # a slow start: 100 bytes/s, 10 rows/s
    assert meter.update(100, 1_000) == "100 rows  10%  ETA 00:01:30  10 rows/s"
    for t in (11, 12, 13, 14):                      # then 2,000 bytes/s, 200 rows/s
        now[0] = t
        line = meter.update(100 + 200 * (t - 10), 1_000 + 2_000 * (t - 10))
    # the rates reach back to the start while it is within the window: 9,000 bytes in
    # 14 s, 1,000 bytes left -> 1.6 s, shown rounded up
    assert line == "900 rows  90%  ETA 00:00:02  64 rows/s"
    now[0] = 20.0                     # the start has left the window: from t=10 on
    assert meter.update(1_000, 9_950) == "1,000 rows  99%  ETA 00:00:01  90 rows/s"
    now[0] = 25.0                     # from t=14 on (the last sample 10 s old or more)
    assert meter.update(1_000, 9_990) == "1,000 rows  99%  ETA 00:00:01  9 rows/s"
    now[0] = 26.0                     # 100% only once all of the input is consumed
    assert meter.update(1_010, 10_000) == "1,010 rows  100%  ETA 00:00:00  9 rows/s"


def test_progress_window_drops_old_samples_and_stdin_has_no_share() -> None:
    from psoup.cli.ingest import RateMeter
    now = [0.0]
    meter = RateMeter(1_000_000, clock=lambda: now[0], window=5.0)
    for t in range(1, 11):                          # 1 s per batch of 1,000 rows
        now[0] = t
        line = meter.update(1_000 * t, 10_000 * t)
    assert line == "10,000 rows  10%  ETA 00:01:30  1,000 rows/s"
    now[0] = 20.0                     # a stall: from t=10 on, 10 times slower
    assert meter.update(11_000, 110_000) == "11,000 rows  11%  ETA 00:14:50  100 rows/s"
    piped = RateMeter(None, clock=lambda: now[0])
    now[0] = 22.0
    assert piped.update(500, 4_096) == "500 rows  250 rows/s"
    resumed = RateMeter(1_000, clock=lambda: now[0])
    now[0] = 30.0
    resumed.restart(600)              # 600 bytes read past (already stored), not sent
    now[0] = 32.0
    assert resumed.update(50, 700) == "50 rows  70%  ETA 00:00:06  25 rows/s"


@pytest.mark.parametrize("codec", [None, "gzip"])
def test_csv_position_follows_the_rows_handed_out_not_the_read_ahead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str | None) -> None:
    """Arrow reads up to 32 blocks ahead: the position is where the rows handed out end."""
    import psoup.cli.ingest as ingesting
    monkeypatch.setattr(ingesting, "_CSV_BLOCK", 1 << 12)
    path = write(tmp_path / "r.csv", readings(20_000))
    lines = path.read_bytes().splitlines(keepends=True)
    if codec is not None:
        path = compressed(path, codec)
    position = ingesting.Position()
    seen: list[tuple[int, int]] = []
    rows = 0
    for batch in ingesting.read_batches(str(path), "csv", 2_000, position=position):
        rows += len(batch["lane"])
        seen.append((rows, position.done))
    total = path.stat().st_size
    assert position.total == total and seen[-1] == (20_000, total)
    assert [d for _, d in seen] == sorted({d for _, d in seen})        # strictly rising
    for done_rows, done in seen:
        if codec is None:             # within a block of the end of the rows handed out
            assert abs(done - sum(map(len, lines[:done_rows + 1]))) <= 1 << 12
        else:                         # the file's position: within gzip's 8 KiB reads
            assert abs(done - total * done_rows // 20_000) <= 1 << 14, (done_rows, done)


def test_jsonl_and_parquet_positions(tmp_path: Path) -> None:
    import psoup.cli.ingest as ingesting
    for name, total in (("r.jsonl", None), ("r.parquet", 300)):
        path = write(tmp_path / name, readings(300))
        position = ingesting.Position()
        done = [position.done for _ in ingesting.read_batches(
            str(path), name.split(".")[1], 100, position=position)]
        size = total or path.stat().st_size
        assert position.total == size and done[-1] == size
        assert done[0] < done[1] < size


def test_a_resumed_ingest_measures_its_pace_from_where_it_starts_sending() -> None:
    from psoup.cli.ingest import IngestInterrupted, ingest

    class Sink:
        def __init__(self) -> None:
            self.sent: list[int] = []

        def insert(self, stream: str, batch: dict[str, Any], ts: Any = None) -> None:
            self.sent.append(len(batch["a"]))

    def batches(stop: int | None = None) -> Iterator[dict[str, Any]]:
        for b in range(5):
            if b == stop:
                raise KeyboardInterrupt
            yield {"a": [b] * 10}
    sink, calls = Sink(), []
    report = ingest(sink, "s", batches(), skip=2,
                    progress=lambda rows, seconds: calls.append(rows))
    assert calls == [0, 10, 20, 30] and sink.sent == [10, 10, 10]
    assert (report.rows, report.batches, report.skipped) == (30, 3, 20)
    with pytest.raises(IngestInterrupted) as stopped:   # still reading past stored rows
        ingest(Sink(), "s", batches(stop=1), skip=2)
    assert stopped.value.rows_done == 10 and not stopped.value.exact
    with pytest.raises(IngestInterrupted) as stopped:
        ingest(Sink(), "s", batches(stop=4), skip=2)
    assert stopped.value.rows_done == 40 and stopped.value.exact
    assert stopped.value.in_doubt is None

def resume_files(config_dir: Path) -> list[str]:
    """The resume state files (and their temporaries) of unfinished ingests."""
    folder = config_dir / "ingest"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_finished_or_refused_ingest_leaves_no_resume_state(psoup: Run, traffic: str,
                                                             tmp_path: Path,
                                                             config_dir: Path) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "r.csv", readings(30))),
             "--batch-rows", "10"))
    assert resume_files(config_dir) == []
    bad = write(tmp_path / "bad.csv", readings(10))
    bad.write_text(bad.read_text().replace("\n3,", "\nabc,", 1))       # a rejected batch
    stray = write(tmp_path / "stray.csv", [dict(r, station="A") for r in readings(3)])
    empty_cell = tmp_path / "empty.csv"
    empty_cell.write_text("lane,stationid,speed,note,ts\n1,2,3.5,ok,10\n1,,3.5,ok,11\n")
    for stream, path in (("traffic", bad), ("traffic", stray), ("traffic", empty_cell),
                         ("nosuch", tmp_path / "r.csv")):
        done = psoup("ingest", stream, str(path), "--batch-rows", "3")
        assert done.exit_code == 1 and done.stderr.startswith("error: "), done.stderr
        assert resume_files(config_dir) == [], (path, done.stderr)


def interrupting(monkeypatch: pytest.MonkeyPatch, after: int) -> None:
    """Ctrl-C from the reader of `psoup ingest`, once it has handed out `after` batches."""
    import psoup.cli.ingest as ingesting
    read = ingesting.read_batches

    def read_then_interrupt(*args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        batches = read(*args, **kwargs)
        for _ in range(after):
            yield next(batches)
        raise KeyboardInterrupt
    monkeypatch.setattr(ingesting, "read_batches", read_then_interrupt)


def test_ctrl_c_says_what_is_stored_and_how_resume_continues(
        psoup: Run, traffic: str, tmp_path: Path, config_dir: Path, server: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "r.csv", readings(50))
    with monkeypatch.context() as patch:
        interrupting(patch, after=3)
        done = psoup("ingest", "traffic", str(path), "--batch-rows", "10")
    assert done.exit_code == 130 and "Aborted" not in done.output
    assert done.stderr.strip() == (
        f"interrupted: 30 rows of {path} are stored; `psoup --server {server} --token TOKEN "
        f"ingest traffic {path} --batch-rows 10 --resume` continues from row 31")
    assert len(resume_files(config_dir)) == 1
    stats = json.loads(ok(psoup("stats", "--format", "json")))
    assert stats["streams"]["traffic"]["rows"] == 30
    assert ok(psoup("ingest", "traffic", str(path), "--batch-rows", "10", "--resume")) \
        .startswith("20 rows into traffic") and resume_files(config_dir) == []
    handle = ok(psoup("register", SLOW)).strip()
    got = json.loads(ok(psoup("invoke", handle, "--format", "json")))
    assert got["rows"] == [list(r) for r in embedded_answer(readings(50), SLOW, T0).rows]


def test_ctrl_c_before_anything_is_stored_leaves_no_state_and_stdin_says_so(
        psoup: Run, traffic: str, tmp_path: Path, config_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "r.csv", readings(50))
    with monkeypatch.context() as patch:
        interrupting(patch, after=0)
        done = psoup("ingest", "traffic", str(path))
    assert done.exit_code == 130 and resume_files(config_dir) == []
    assert done.stderr.strip() == f"interrupted: 0 rows of {path} are stored"
    with monkeypatch.context() as patch:
        interrupting(patch, after=2)
        piped = psoup("ingest", "traffic", "-", "--batch-rows", "10", input=path.read_bytes())
    assert piped.exit_code == 130
    assert piped.stderr.strip() == "interrupted: 20 rows from stdin are stored"


def test_ctrl_c_during_a_send_waits_for_its_reply(psoup: Run, traffic: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "r.csv", readings(50))
    insert, calls = Client.insert, []

    def insert_pressing_ctrl_c(self: Client, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)      # while the batch is in flight
        return insert(self, *args, **kwargs)
    monkeypatch.setattr(Client, "insert", insert_pressing_ctrl_c)
    done = psoup("ingest", "traffic", str(path), "--batch-rows", "10")
    assert done.exit_code == 130, done.output
    assert done.stderr.startswith(f"interrupted: 20 rows of {path} are stored; `psoup ")
    assert done.stderr.rstrip().endswith("--resume` continues from row 21")
    stats = json.loads(ok(psoup("stats", "--format", "json")))
    assert stats["streams"]["traffic"]["rows"] == 20 and len(calls) == 2


def test_ctrl_c_that_cuts_a_send_short_leaves_it_in_doubt_and_resume_sorts_it_out(
        psoup: Run, traffic: str, tmp_path: Path, config_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "r.csv", readings(50))
    insert, calls = Client.insert, []

    def insert_then_interrupt(self: Client, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        result = insert(self, *args, **kwargs)
        if len(calls) == 3:
            raise KeyboardInterrupt                 # a second Ctrl-C, before the reply
        return result
    with monkeypatch.context() as patch:
        patch.setattr(Client, "insert", insert_then_interrupt)
        done = psoup("ingest", "traffic", str(path), "--batch-rows", "10")
    assert done.exit_code == 130
    assert done.stderr.startswith(
        f"interrupted: 20 rows of {path} are stored, and batch 3 (input rows 21-30) was in "
        "flight: it may or may not be; `psoup ")
    assert done.stderr.rstrip().endswith(
        "--resume` continues after the last batch the server applied, without duplicating")
    assert len(resume_files(config_dir)) == 1
    resumed = ok(psoup("ingest", "traffic", str(path), "--batch-rows", "10", "--resume"))
    assert resumed.startswith("20 rows into traffic") and "; 30 rows were already stored" \
        in resumed                    # the batch in doubt had been applied
    stats = json.loads(ok(psoup("stats", "--format", "json")))
    assert stats["streams"]["traffic"]["rows"] == 50 and resume_files(config_dir) == []

def test_register_over_a_large_store_says_so_first(psoup: Run, traffic: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import psoup.cli.progress as cli
    ok(psoup("ingest", "traffic", str(write(tmp_path / "r.csv", readings(50)))))
    monkeypatch.setattr(cli, "LARGE_STORE", 50)         # 50 retained tuples count as many
    done = psoup("register", SLOW)
    assert ok(done).strip() and done.stderr == "applying the query to 50 retained tuples…\n"
    monkeypatch.setattr(cli, "LARGE_STORE", 51)
    done = psoup("register", SLOW)
    assert ok(done).strip() and done.stderr == ""
    done = psoup("register", "SELECT * FROM nowhere")   # the server's error, nothing before
    assert done.exit_code == 1 and "applying" not in done.stderr


# ---------------------------------------------------------------------- named handles

def test_named_handle_works_from_a_new_shell(psoup: Run, traffic: str, tmp_path: Path,
                                             server: str) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "r.csv", readings(30)))))
    handle = ok(psoup("register", SLOW, "--name", "slow-lane3", runner=CliRunner())).strip()
    # A new shell: a new runner and no --server; the name remembers where its query lives.
    later = CliRunner().invoke(main, ["--token", TOKEN, "invoke", "slow-lane3", "--format",
                                      "json"])
    assert json.loads(ok(later))["rows"] == \
        [list(r) for r in embedded_answer(readings(30), SLOW, T0).rows]
    stored = HandleStore().lookup("slow-lane3")
    assert stored is not None
    assert stored | {"created": 0} == \
        {"server": server, "handle": handle, "sql": SLOW, "created": 0}


def test_a_taken_name_needs_replace(psoup: Run, traffic: str) -> None:
    first = ok(psoup("register", SLOW, "--name", "slow")).strip()
    taken = psoup("register", SLOW, "--name", "slow")
    assert taken.exit_code == 1 and "--replace" in taken.stderr
    assert f"is taken (handle {first} on " in taken.stderr            # the whole handle
    assert len(json.loads(ok(psoup("queries", "--format", "json")))["queries"]) == 1
    second = ok(psoup("register", SLOW, "--name", "slow", "--replace")).strip()
    stored = HandleStore().lookup("slow")
    assert stored is not None
    assert stored["handle"] == second != first


def test_a_name_whose_handle_is_gone_shows_the_whole_handle(psoup: Run, traffic: str,
                                                            server: str) -> None:
    handle = ok(psoup("register", SLOW, "--name", "slow")).strip()
    with Client(server, token=TOKEN) as client:
        client.unregister(handle)
    done = psoup("invoke", "slow")
    assert done.exit_code == 1
    assert f"the name 'slow' refers to handle {handle}, which the server" in done.stderr


def test_unknown_name_exits_1(psoup: Run, traffic: str) -> None:
    done = psoup("invoke", "no-such-name")
    assert done.exit_code == 1
    assert done.stderr.startswith("error: 'no-such-name' is neither a name")


def test_handles_never_look_like_options(psoup: Run, traffic: str) -> None:
    handles = [ok(psoup("register", SLOW)).strip() for _ in range(20)]
    assert all(h[0] != "-" and len(h) >= 32 for h in handles)


def test_unregister_forgets_the_name(psoup: Run, traffic: str) -> None:
    ok(psoup("register", SLOW, "--name", "slow"))
    assert ok(psoup("unregister", "slow")).strip() == "unregistered slow"
    assert HandleStore().lookup("slow") is None
    assert json.loads(ok(psoup("queries", "--format", "json"))) == {"queries": []}
    assert psoup("invoke", "slow").exit_code == 1


def test_queries_lists_names_handles_and_sql(psoup: Run, traffic: str) -> None:
    handle = ok(psoup("register", SLOW, "--name", "slow")).strip()
    listing = ok(psoup("queries")).splitlines()
    assert listing[0].split() == ["name", "handle", "sql"]
    assert listing[2].split()[:2] == ["slow", handle] and listing[2].endswith(SLOW)


# ---------------------------------------------------------------------- invoke

def test_changes_show_each_change_exactly_once(psoup: Run, traffic: str, tmp_path: Path,
                                               clock: Clock) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(30)))))
    ok(psoup("register", SLOW, "--name", "slow"))
    first = psoup("invoke", "slow", "--changes", "--format", "json")
    whole = json.loads(ok(first))
    assert whole["reset"] and len(whole["inserted"]) > 3 and whole["deleted"] == []
    assert json.loads(ok(psoup("invoke", "slow", "--changes", "--format", "json"))) | \
        {"cursor": None} == {"columns": whole["columns"], "inserted": [], "deleted": [],
                             "cursor": None, "reset": False}
    # 30 s later: readings 30-59 arrive, and the first 30 s of readings leave the window.
    clock.now = T0 + 30
    ok(psoup("ingest", "traffic", str(write(tmp_path / "b.csv", readings(30, T0 - 70, 30)))))
    step = json.loads(ok(psoup("invoke", "slow", "--changes", "--format", "json")))
    before = embedded_answer(readings(30), SLOW, T0).rows
    after = embedded_answer(readings(60), SLOW, T0 + 30).rows
    assert sorted(map(tuple, step["inserted"])) == sorted(set(after) - set(before))
    assert sorted(map(tuple, step["deleted"])) == sorted(set(before) - set(after))
    assert step["inserted"] and step["deleted"]
    again = json.loads(ok(psoup("invoke", "slow", "--changes", "--format", "json")))
    assert again["inserted"] == again["deleted"] == []


def test_changes_table_marks_rows_and_notes_a_first_call(psoup: Run, traffic: str,
                                                         tmp_path: Path) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(9)))))
    ok(psoup("register", SLOW, "--name", "slow"))
    done = psoup("invoke", "slow", "--changes")
    lines = ok(done).splitlines()
    assert "whole answer as inserted rows" in done.stderr
    assert [line.split()[0] for line in lines[2:-1]] == ["+"] * 3
    assert lines[-1] == "(3 inserted, 0 deleted)"
    csv_out = ok(psoup("invoke", "slow", "--changes", "--format", "csv"))
    assert csv_out.strip() == "change,ts,stationid,speed,note"


def test_an_expired_cursor_gives_the_whole_answer(psoup: Run, traffic: str, tmp_path: Path,
                                                  server: str) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(9)))))
    handle = ok(psoup("register", SLOW)).strip()
    HandleStore().set_cursor(server, handle, "forgotten-by-the-server")
    got = json.loads(ok(psoup("invoke", handle, "--changes", "--format", "json")))
    assert got["reset"] and len(got["inserted"]) == 3


def test_json_answer_is_one_stable_document(psoup: Run, traffic: str, tmp_path: Path) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(9)))))
    handle = ok(psoup("register", SLOW)).strip()
    out = [ok(psoup("invoke", handle, "--format", "json")) for _ in range(2)]
    docs = [json.loads(o) for o in out]          # one document each: json.loads accepts no more
    assert [list(d) for d in docs] == [["columns", "rows", "ts", "cursor"]] * 2
    assert docs[0]["columns"] == ["stationid", "speed", "note"]
    assert docs[0] | {"cursor": None} == docs[1] | {"cursor": None}
    assert docs[0]["cursor"] and docs[1]["cursor"]   # equal answers may share a cursor


def test_invoke_now_resolves_the_window_then(psoup: Run, traffic: str, tmp_path: Path) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(30)))))
    handle = ok(psoup("register", SLOW)).strip()
    got = json.loads(ok(psoup("invoke", handle, "--format", "json", "--now",
                              "2026-01-01T00:01:00Z")))
    assert got["rows"] == [list(r) for r in embedded_answer(readings(30), SLOW, T0 + 60).rows]


def test_watch_prints_the_answer_then_changes(psoup: Run, traffic: str, tmp_path: Path,
                                              clock: Clock) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(200)))))
    ok(psoup("register", SLOW, "--name", "slow"))
    clock.tick = 30.0               # each invocation sees the window 30 s further on
    out = ok(psoup("watch", "slow", "--every", "0.1s", "--count", "3", "--format", "json"))
    polls = [json.loads(line) for line in out.splitlines()]
    assert len(polls) == 3 and "rows" in polls[0]
    assert all(p["inserted"] and p["deleted"] for p in polls[1:])
    assert all(p["polled"] > time.time() - 60 for p in polls)


def test_watch_table_stamps_each_poll(psoup: Run, traffic: str, tmp_path: Path) -> None:
    ok(psoup("register", SLOW, "--name", "slow"))
    lines = ok(psoup("watch", "slow", "--every", "50ms", "--count", "2")).splitlines()
    assert lines[0].endswith("] 0 rows") and lines[-1].endswith("] no changes")


def test_watch_rejects_a_bad_interval(psoup: Run, traffic: str) -> None:
    done = psoup("watch", "slow", "--every", "soon")
    assert done.exit_code == 2 and "30s" in done.stderr


# ---------------------------------------------------------------------- errors

def test_bad_sql_is_one_line_on_stderr(psoup: Run, traffic: str) -> None:
    done = psoup("register", "SELECT x FROM traffic")
    assert done.exit_code == 1 and done.stdout == ""
    assert done.stderr.startswith("error: line 1, column 8: unknown column 'x'")
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def test_unreachable_server_exits_1_with_a_hint() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # free once closed: nothing listens there
    done = CliRunner().invoke(main, ["--server", f"127.0.0.1:{port}", "queries"])
    assert done.exit_code == 1
    assert done.stderr.startswith(f"error: cannot reach psoup server at 127.0.0.1:{port}")
    assert "is `psoup serve` running?" in done.stderr and len(done.stderr.splitlines()) == 1


def test_wrong_token_is_explained(server: str) -> None:
    done = CliRunner().invoke(main, ["--server", server, "--token", "nope", "queries"])
    assert done.exit_code == 1 and "refused the connection" in done.stderr


def test_wrong_token_names_where_the_servers_token_is(server: str) -> None:
    done = CliRunner().invoke(main, ["--server", server, "--token", "nope", "queries"])
    path = token_path(*parse_address(server))
    assert str(path) in done.stderr and "with --token or PSOUP_TOKEN" in done.stderr
    assert "Client(" not in done.stderr


def test_a_bad_retain_is_reported_against_the_option(psoup: Run) -> None:
    done = psoup("stream", "create", "s", "a INT", "--retain", "1 hourz")
    assert done.exit_code == 1
    assert "in --retain '1 hourz', at character 3: expected a unit" in done.stderr
    assert "CREATE STREAM" not in done.stderr and "column 2" not in done.stderr


def test_a_bad_column_type_is_reported_against_the_columns_typed(psoup: Run) -> None:
    done = psoup("stream", "create", "s", "a INT, b FLOT")
    assert done.exit_code == 1
    assert "in COLUMNS 'a INT, b FLOT', at character 10: unknown type 'FLOT'" in done.stderr


def test_archive_import_reports_bad_columns_against_the_option(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("a,ts\n1,10\n")
    done = CliRunner().invoke(main, ["archive", "import", str(path), "--stream", "s",
                                     "--columns", "a INT,", "--into", str(tmp_path / "a")])
    assert done.exit_code == 1
    assert "in --columns 'a INT,', at its end: expected a column name" in done.stderr


def test_bad_server_address_is_a_usage_error() -> None:
    done = CliRunner().invoke(main, ["--server", "localhost:http", "queries"])
    assert done.exit_code == 2 and "port must be a number" in done.stderr


# ---------------------------------------------------------------------- the handle store

def test_handle_store_is_owner_only(psoup: Run, traffic: str, config_dir: Path) -> None:
    ok(psoup("register", SLOW, "--name", "slow"))
    assert stat.S_IMODE((config_dir / "handles.json").stat().st_mode) == 0o600


def test_corrupt_handle_store_is_reported_and_kept(psoup: Run, traffic: str,
                                                   config_dir: Path) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "handles.json").write_text('{"names": {"slow": ')
    done = psoup("register", SLOW, "--name", "other")
    assert done.exit_code == 1 and "corrupt" in done.stderr and "Traceback" not in done.stderr
    assert (config_dir / "handles.json").read_text() == '{"names": {"slow": '


def test_concurrent_writers_lose_no_names(config_dir: Path) -> None:
    def name(i: int) -> None:
        HandleStore().remember(f"q{i}", "127.0.0.1:7070", f"h{i}", "SELECT a FROM R")

    threads = [threading.Thread(target=name, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(HandleStore().names()) == sorted(f"q{i}" for i in range(16))


# ---------------------------------------------------------------------- the real command

def test_console_script_serves_ingests_and_invokes(tmp_path: Path, config_dir: Path) -> None:
    script = Path(sys.executable).with_name("psoup")
    psoup = [str(script)] if script.exists() else [sys.executable, "-m", "psoup.cli.main"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PSOUP_CONFIG_DIR=str(config_dir), PSOUP_SERVER=f"127.0.0.1:{port}")
    serve = subprocess.Popen(psoup + ["serve", "--port", str(port), "--data-dir",
                                      str(tmp_path / "state")],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(serve, port)

        def cli(*args: str) -> str:       # no --token: the server left it for local clients
            done = subprocess.run(psoup + list(args), env=env, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, done.stderr
            return done.stdout

        cli("stream", "create", "traffic", DDL_COLUMNS)
        rows = readings(30, t0=time.time() - 50)
        cli("ingest", "traffic", str(write(tmp_path / "r.parquet", rows)))
        cli("register", SLOW, "--name", "slow-lane3")
        got = json.loads(cli("invoke", "slow-lane3", "--format", "json"))
        assert got["rows"] == [[r["stationid"], r["speed"], r["note"]] for r in rows
                               if r["lane"] == 3 and r["speed"] < 30]
    finally:
        serve.send_signal(signal.SIGTERM)
        out, err = serve.communicate(timeout=120)
    assert serve.returncode == 0, err
    assert f"serving on 127.0.0.1:{port}" in out
    assert f"psoup on 127.0.0.1:{port} stopped after" in out and "closed cleanly" in out


def test_serve_logs_each_request_at_debug_and_none_by_default(tmp_path: Path,
                                                              config_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PSOUP_CONFIG_DIR=str(config_dir), PSOUP_SERVER=f"127.0.0.1:{port}")
    logs = {}
    for level in ("warning", "debug"):
        serve = subprocess.Popen([sys.executable, "-m", "psoup.cli.main", "serve", "--port",
                                  str(port), "--log-level", level], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_listening(serve, port)
            for args in (["queries"], ["register", "SELECT x FROM nowhere"]):
                subprocess.run([sys.executable, "-m", "psoup.cli.main", *args], env=env,
                               capture_output=True, timeout=60)
        finally:
            serve.send_signal(signal.SIGTERM)
            logs[level] = serve.communicate(timeout=120)[1]
    assert " queries ok " not in logs["warning"] and " register query " not in logs["warning"]
    assert " queries ok " in logs["debug"] and " register query " in logs["debug"]
    assert "ms" in logs["debug"].split(" queries ok ")[1].splitlines()[0]


# ---------------------------------------------------------------------- the catalog

def test_stream_list_shows_every_stream(psoup: Run, traffic: str) -> None:
    psoup("ingest", "traffic", "-", "--format", "jsonl",
          input="\n".join(json.dumps(r) for r in readings(3)))
    out = psoup("stream", "list")
    assert out.exit_code == 0, out.output
    assert "traffic" in out.output and "1 HOUR" in out.output and "(1 stream)" in out.output
    doc = json.loads(psoup("stream", "list", "--format", "json").output)
    assert doc["streams"][0] | {"latest_ts": None} == {
        "stream": "traffic", "columns": DDL_COLUMNS, "retain": "1 HOUR", "rows": 3,
        "rows_total": 3, "latest_ts": None, "queries": 0}
    assert psoup("stream", "list", "--format", "csv").output.splitlines()[0] == \
        "stream,columns,retain,rows,rows_total,latest_ts,queries"


def test_stream_describe_shows_one_stream(psoup: Run, traffic: str) -> None:
    out = psoup("stream", "describe", "traffic")
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[:3] == ["stream      traffic", f"columns     {DDL_COLUMNS}",
                                           "retain      1 HOUR"]
    assert json.loads(psoup("stream", "describe", "traffic", "--format", "json").output)[
        "rows"] == 0
    missing = psoup("stream", "describe", "nope")
    assert missing.exit_code == 1 and "unknown stream 'nope'" in missing.output


def test_stream_drop_is_refused_while_a_query_reads_it_unless_cascade(psoup: Run,
                                                                      traffic: str) -> None:
    handle = psoup("register", SLOW, "--name", "slow").output.strip()
    refused = psoup("stream", "drop", "traffic")
    assert refused.exit_code == 1 and handle in refused.output
    assert "use --cascade to" in refused.output and "CASCADE" not in refused.output
    done = psoup("stream", "drop", "traffic", "--cascade")
    assert done.exit_code == 0, done.output
    assert done.output.strip() == "dropped stream traffic and 1 standing query"
    assert HandleStore().lookup("slow") is None
    assert "(0 streams)" in psoup("stream", "list").output


def test_show_prints_a_querys_sql_and_statistics(psoup: Run, traffic: str) -> None:
    handle = psoup("register", SLOW, "--name", "slow").output.strip()
    psoup("ingest", "traffic", "-", "--format", "jsonl",
          input="\n".join(json.dumps(r) for r in readings(30)))
    doc = json.loads(psoup("show", "slow", "--format", "json").output)
    assert doc["name"] == "slow" and doc["handle"] == handle and doc["sql"] == SLOW
    assert doc["results"] == sum(1 for r in readings(30) if r["lane"] == 3 and r["speed"] < 30)
    table = psoup("show", handle)
    assert table.exit_code == 0 and f"sql       {SLOW}" in table.output
    unknown = psoup("show", "0" * 40)
    assert unknown.exit_code == 1 and "neither a name" in unknown.output


# ---------------------------------------------------------------------- output and options

def test_o_is_the_short_option_of_format_on_every_command_that_has_it(psoup: Run,
                                                                      traffic: str) -> None:
    from psoup.cli.main import main as group

    def commands(cmd: click.Command, path: tuple[str, ...] = ()
                 ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from commands(sub, path + (name,))
        if not hasattr(cmd, "commands"):
            yield path, cmd
    with_format = [(path, [p for p in cmd.params if "--format" in p.opts])
                   for path, cmd in commands(group)]
    assert len([p for p in with_format if p[1]]) >= 9
    assert all("-o" in params[0].opts for _, params in with_format if params)
    assert json.loads(ok(psoup("stream", "list", "-o", "json")))["streams"]


def test_invoke_table_starts_with_each_rows_time_in_utc_and_csv_keeps_seconds(
        psoup: Run, traffic: str, tmp_path: Path) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(9)))))
    handle = ok(psoup("register", SLOW)).strip()
    lines = ok(psoup("invoke", handle)).splitlines()
    assert lines[0].split() == ["ts", "stationid", "speed", "note"]
    assert lines[2].startswith("2025-12-31T23:58:20.000Z ")      # readings(9)[0]: T0 - 100
    rows = ok(psoup("invoke", handle, "-o", "csv")).splitlines()
    assert rows[0] == "ts,stationid,speed,note" and rows[1].startswith(f"{T0 - 100!r},")
    polls = ok(psoup("watch", handle, "--every", "1s", "--count", "1", "-o", "csv"))
    assert polls.splitlines()[0] == "polled,change,ts,stationid,speed,note"
    assert f",+,{T0 - 100!r}," in polls.splitlines()[1]
    listed = ok(psoup("queries", "-o", "csv")).splitlines()
    assert listed[0] == "name,handle,sql" and listed[1].startswith(f",{handle},")
    assert json.loads(ok(psoup("invoke", handle, "-o", "json")))["ts"][0] == T0 - 100


def test_limit_cuts_a_table_and_the_footer_says_how_many_rows_there_were(psoup: Run, traffic: str,
                                                                          tmp_path: Path) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(90)))))
    handle = ok(psoup("register", SLOW)).strip()
    n = len(json.loads(ok(psoup("invoke", handle, "-o", "json")))["rows"])
    assert n > 5
    lines = ok(psoup("invoke", handle, "--limit", "5")).splitlines()
    assert len(lines) == 2 + 5 + 1
    assert lines[-1] == f"({n} rows, first 5 shown; --limit 0 for all)"
    assert ok(psoup("invoke", handle)).splitlines()[-1] == f"({n} rows)"   # not a terminal
    cut = psoup("invoke", handle, "-o", "csv", "--limit", "5")
    assert len(ok(cut).splitlines()) == 1 + 5 and f"{n} rows, first 5" in cut.stderr
    assert len(json.loads(ok(psoup("invoke", handle, "-o", "json", "--limit", "5")))[
        "rows"]) == 5
    changes = ok(psoup("invoke", handle, "--changes", "--limit", "2")).splitlines()
    assert changes[-1] == "(0 inserted, 0 deleted)"


def test_a_terminal_gets_100_rows_through_a_pager_unless_told_otherwise(
        psoup: Run, traffic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psoup.cli.main as cli
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(600, T0 - 700)))))
    handle = ok(psoup("register", "SELECT stationid, speed FROM traffic WHERE lane = 3")
                ).strip()
    paged: list[str] = []
    monkeypatch.setattr(cli, "_stdout_is_terminal", lambda: True)
    monkeypatch.setattr(click, "echo_via_pager", lambda text: paged.append(text))
    assert ok(psoup("invoke", handle)) == ""
    assert paged[0].splitlines()[-1] == "(250 rows, first 100 shown; --limit 0 for all)"
    assert len(paged[0].splitlines()) == 2 + 100 + 1
    direct = ok(psoup("invoke", handle, "--no-pager", "--limit", "0")).splitlines()
    assert len(paged) == 1 and len(direct) == 2 + 250 + 1 and direct[-1] == "(250 rows)"
    assert len(ok(psoup("invoke", handle, "-o", "csv")).splitlines()) == 1 + 250


def test_watch_limits_the_rows_of_each_poll(psoup: Run, traffic: str, tmp_path: Path) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(90)))))
    ok(psoup("register", SLOW, "--name", "slow"))
    n = len(json.loads(ok(psoup("invoke", "slow", "-o", "json")))["rows"])
    lines = ok(psoup("watch", "slow", "--every", "50ms", "--count", "1", "--limit", "3")
               ).splitlines()
    assert lines[0].endswith(f"] {n} rows, first 3 shown; --limit 0 for all")
    assert len(lines) == 1 + 2 + 3 and lines[1].split()[0] == "ts"


MULTILINE = """SELECT stationid, speed
    FROM traffic
   WHERE lane = 3 AND speed < 30
   BEGIN NOW - 100 END NOW"""


def test_multi_line_sql_is_one_line_in_tables_and_whole_in_json(psoup: Run, traffic: str) -> None:
    ok(psoup("register", MULTILINE, "--name", "multi"))
    ok(psoup("register", "SELECT stationid FROM traffic WHERE " +
             " AND ".join(f"speed <> {i}" for i in range(40))))
    listing = ok(psoup("queries")).splitlines()
    assert len(listing) == 2 + 2 + 1
    assert any(line.endswith(" ".join(MULTILINE.split())) for line in listing)
    assert any(line.endswith("...") and len(line.split("  ")[-1]) <= 100 for line in listing)
    sqls = {q["sql"] for q in json.loads(ok(psoup("queries", "-o", "json")))["queries"]}
    assert MULTILINE in sqls
    stats = ok(psoup("stats")).splitlines()
    header = next(i for i, line in enumerate(stats) if line.startswith("name"))
    assert stats[header].split() == ["name", "handle", "matches", "sql"]
    assert len(stats[header + 2:]) == 2                 # one line per query
    assert any(line.startswith("multi") and line.endswith(" ".join(MULTILINE.split()))
               for line in stats)


def test_stats_and_stream_list_show_the_latest_ts_in_utc(psoup: Run, traffic: str,
                                                         tmp_path: Path) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(3)))))
    shown = ok(psoup("stats"))
    assert "2025-12-31T23:58:22.000Z" in shown
    # sections read as text: an empty dict is "none", not "reduction ,"; None is "-"
    assert " ," not in shown and "None" not in shown and "{" not in shown
    assert "2025-12-31T23:58:22.000Z" in ok(psoup("stream", "list"))
    assert "2025-12-31T23:58:22.000Z" in ok(psoup("stream", "describe", "traffic"))
    assert ",1767225502.0," in ok(psoup("stream", "list", "-o", "csv"))


def test_timestamps_in_errors_are_shown_in_utc_like_the_tables(psoup: Run, traffic: str,
                                                               tmp_path: Path) -> None:
    ok(psoup("ingest", "traffic", str(write(tmp_path / "a.csv", readings(3)))))
    done = psoup("ingest", "traffic", str(write(tmp_path / "b.csv", readings(1, T0 - 500))))
    assert done.exit_code == 1
    assert "ts 2025-12-31T23:51:40.000Z (1767225100.0) is older than the stream's latest " \
           "ts 2025-12-31T23:58:22.000Z (1767225502.0)" in done.stderr
