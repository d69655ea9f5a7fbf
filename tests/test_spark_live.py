"""Streams fed by a Spark source (issue 38, items 1-3 in part, and 5): CREATE STREAM ...
FROM FILES | RATE | KAFKA declared, kept in the catalog across restarts, refused with a
clear error when it cannot run; files landing in a folder become tuples whose answers
equal DuckDB's over the same files; a micro-batch Spark runs again is not applied twice;
answers say up to which ts they are complete (`fresh_to`, also over the protocol:
tests/test_freshness.py has the rest)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pytest

import psoup
from psoup.archive.parquet import Archive
from psoup.errors import QueryError
from psoup.query.model import SourceFormat, SourceKind, StreamSource
from psoup.spark.live import LiveSources
from tests.support import (
    QUERIES,
    Clock,
    answers,
    compiled_schema,
    killed_after_batch_1,
    land,
    oracle,
    trace,
    wait_for,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")   # pyspark on pandas 3

T0 = 1_767_225_600.0          # 2026-01-01T00:00:00Z
# ---------------------------------------------------------------------- declaring it

def source_of(ddl: str) -> StreamSource:
    source = compiled_schema(ddl).source
    assert source is not None
    return source


def test_the_language_reads_every_kind_of_source() -> None:
    files = source_of(
        "CREATE STREAM traffic (lane INT, speed FLOAT) RETAIN 30 DAYS FROM FILES '/in' "
        "FORMAT csv WITH (sep = ';', header = FALSE, maxFilesPerTrigger = 2)")
    assert (files.kind, files.path, files.format) == (SourceKind.FILES, "/in", SourceFormat.CSV)
    assert files.options == (("sep", ";"), ("header", "false"), ("maxFilesPerTrigger", "2"))
    assert compiled_schema(files.describe().join(["CREATE STREAM t (a INT) FROM ", ""])) \
        .source == files        # SHOW STREAMS shows it as the language reads it
    rate = source_of("CREATE STREAM r (value INT) FROM RATE WITH "
                     "(rowsPerSecond = 50, trigger = '2 seconds')")
    assert rate.kind == SourceKind.RATE and rate.path is None
    kafka = source_of("CREATE STREAM k (a INT) FROM KAFKA FORMAT JSON WITH "
                      "(kafka.bootstrap.servers = 'h:9092', subscribe = 't')")
    assert kafka.options[0] == ("kafka.bootstrap.servers", "h:9092")
    assert compiled_schema("CREATE STREAM p (a INT) RETAIN 1 HOUR").source is None


@pytest.mark.parametrize(("sql", "message"), [
    ("CREATE STREAM t (a INT) FROM FILES '{d}' FORMAT XML", "unknown format 'XML'"),
    ("CREATE STREAM t (a INT) FROM FILES '{d}'", "FROM FILES needs a FORMAT"),
    ("CREATE STREAM t (a INT) FROM FILES FORMAT CSV", "expected a folder"),
    ("CREATE STREAM t (a INT) FROM FILES '' FORMAT CSV", "needs a folder"),
    ("CREATE STREAM t (a INT) FROM SOCKET", "expected a source \\(FILES, RATE or KAFKA\\)"),
    ("CREATE STREAM t (a INT) FROM RATE", "only the column value"),
    ("CREATE STREAM t (value INT) FROM RATE FORMAT CSV", "takes no FORMAT"),
    ("CREATE STREAM t (a INT) FROM KAFKA FORMAT PARQUET", "takes no FORMAT"),
    ("CREATE STREAM t (a INT) FROM FILES '{d}' FORMAT CSV WITH (x = 1, X = 2)",
     "option 'X' is given twice"),
    ("CREATE STREAM t (a INT) FROM FILES '{d}' FORMAT CSV WITH (x 1)", "expected '='"),
    ("CREATE STREAM t (value INT) FROM RATE WITH (trigger = 'often')",
     "trigger takes an interval"),
    ("CREATE STREAM t (a INT) FROM FILES '{d}/missing' FORMAT CSV", "does not exist"),
])
def test_a_bad_declaration_is_refused_and_changes_nothing(tmp_path: Path, sql: str,
                                                           message: str) -> None:
    data = tmp_path / "data"
    inbox = tmp_path / "in"
    inbox.mkdir()
    with psoup.Engine(path=data) as eng:
        eng.execute("CREATE STREAM kept (a INT)")
        with pytest.raises(QueryError, match=message):
            eng.execute(sql.format(d=inbox))
        assert eng.streams() == ["kept"]
    with psoup.Engine(path=data) as back:       # nothing of it was logged
        assert back.streams() == ["kept"]
        assert "sources" not in back.stats()
    assert not (data / "sources").exists() or not any((data / "sources").iterdir())


def test_a_source_needs_a_durable_engine(tmp_path: Path) -> None:
    with psoup.Engine() as eng:
        for sql in (f"CREATE STREAM t (a INT) FROM FILES '{tmp_path}' FORMAT JSON",
                    "CREATE STREAM t (value INT) FROM RATE"):
            with pytest.raises(QueryError, match="needs a durable engine"):
                eng.execute(sql)
        assert eng.streams() == []


# ---------------------------------------------------------------------- end to end

def rows_of(eng: psoup.Engine, n: int) -> Callable[[], bool]:
    return lambda: eng.describe("traffic")["rows_total"] >= n


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_files_landing_in_a_folder_give_duckdbs_answers(spark: SparkSession, tmp_path: Path,
                                                        fmt: str) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    with psoup.Engine(path=tmp_path / "data", clock=lambda: T0 + 10_000) as eng:
        eng.execute(f"CREATE STREAM traffic (lane INT, speed FLOAT) RETAIN 30 DAYS "
                    f"FROM FILES '{inbox}' FORMAT {fmt.upper()} WITH (trigger = '1 second')")
        handles = [eng.register(q) for q in QUERIES]
        land(inbox, f"a.{fmt}", trace(40, 0, 1), fmt)
        wait_for(rows_of(eng, 40))
        land(inbox, f"b.{fmt}", trace(30, 40, 2), fmt)
        land(inbox, f"c.{fmt}", trace(25, 70, 3), fmt)
        wait_for(rows_of(eng, 95))
        assert answers(eng, handles) == oracle(inbox, fmt)
        # complete to the latest ts the files gave (the rows' own ts)
        assert [eng.invoke(h).fresh_to for h in handles] == [trace(25, 70, 3)[-1][2]] * 3
        shown = eng.execute("SHOW STREAMS").to_dicts()[0]     # type: ignore[union-attr]
        assert shown["source"] == f"FILES '{inbox}' FORMAT {fmt.upper()} WITH " \
                                  "(trigger = '1 second')"
        assert shown["source_state"] == "running" and shown["source_batches"] >= 2
        stats = eng.stats()["sources"]["traffic"]
        assert stats["rows"] == 95 and stats["last_error"] is None
        assert stats["rejected_rows"] == 0 and stats["late_rows"] == 0


def test_a_batch_run_again_is_not_applied_twice(spark: SparkSession, tmp_path: Path) -> None:
    """Spark runs a batch again when it failed after psoup applied it (here: a fault
    after the insert, as a crash before Spark's commit), in the same engine and after
    a restart of it: each row is applied once, the source keeps its checkpoint, and the
    DROP STREAM at the end removes it."""
    inbox, data = tmp_path / "in", tmp_path / "data"
    inbox.mkdir()
    create = (f"CREATE STREAM traffic (lane INT, speed FLOAT) FROM FILES '{inbox}' "
              "FORMAT CSV")
    LiveSources.fail_after_insert = {0}
    try:
        with psoup.Engine(path=data) as eng:
            eng.execute(create)
            handles = [eng.register(q) for q in QUERIES]
            land(inbox, "a.csv", trace(20, 0, 4))
            wait_for(lambda: eng.stats()["sources"]["traffic"]["replayed_batches"] >= 1)
            assert eng.stats()["sources"]["traffic"]["restarts"] >= 1
            assert eng.describe("traffic")["rows_total"] == 20
            LiveSources.fail_after_insert = {1}
            land(inbox, "b.csv", trace(15, 20, 5))
            # closed while it waits to start the query again (2 s after a second
            # failure): the new engine's query runs batch 1 again
            wait_for(lambda: eng.stats()["sources"]["traffic"]["restarts"] >= 2)
            assert eng.describe("traffic")["rows_total"] == 35
        with psoup.Engine(path=data) as back:    # Spark runs batch 1 again: a duplicate
            shown = back.execute("SHOW STREAMS").rows       # type: ignore[union-attr]
            assert shown[0][7] == f"FILES '{inbox}' FORMAT CSV"
            wait_for(lambda: back.stats()["sources"]["traffic"]["replayed_batches"] >= 1)
            land(inbox, "c.csv", trace(10, 35, 6))
            wait_for(rows_of(back, 45))
            assert back.describe("traffic")["rows_total"] == 45
            assert answers(back, handles) == oracle(inbox)
            folders = list((data / "sources").iterdir())
            assert len(folders) == 1
            back.execute("DROP STREAM traffic CASCADE")
            assert "sources" not in back.stats()
            wait_for(lambda: not folders[0].exists(), 60.0)
    finally:
        LiveSources.fail_after_insert = set()


def test_the_rate_source_feeds_a_stream(spark: SparkSession, tmp_path: Path) -> None:
    with psoup.Engine(path=tmp_path / "data") as eng:
        eng.execute("CREATE STREAM r (value INT) FROM RATE WITH (rowsPerSecond = 20)")
        h = eng.register("SELECT value FROM r WHERE value < 10")
        wait_for(lambda: eng.describe("r")["rows_total"] >= 10)
        assert eng.invoke(h).rows == [(v,) for v in range(10)]
        with eng.locked():              # no batch lands between the two
            assert eng.invoke(h).fresh_to == eng.describe("r")["latest_ts"]
        stats = eng.stats()["sources"]["r"]
        assert stats["batches"] >= 1 and stats["source"] == "RATE WITH (rowsPerSecond = '20')"


def test_files_become_archived_tuples_once(spark: SparkSession, tmp_path: Path) -> None:
    """What leaves retention reaches the archive once, a batch Spark ran again included:
    the archive and the retained tuples together are the files' rows, each once."""
    inbox, data = tmp_path / "in", tmp_path / "data"
    inbox.mkdir()
    LiveSources.fail_after_insert = {1}
    try:
        with psoup.Engine(path=data, chunk_rows=4) as eng:
            eng.execute(f"CREATE STREAM traffic (lane INT, speed FLOAT) RETAIN 6 ROWS "
                        f"FROM FILES '{inbox}' FORMAT CSV")
            everything = eng.register("SELECT * FROM traffic")
            for i, n in enumerate((9, 14, 11)):
                land(inbox, f"{i}.csv", trace(n, 100 * i, 10 + i))
                wait_for(rows_of(eng, (9, 23, 34)[i]))
            wait_for(lambda: eng.stats()["sources"]["traffic"]["replayed_batches"] >= 1)
            assert eng.describe("traffic")["rows_total"] == 34
            eng.checkpoint()            # archives what left retention but is held
            held = eng.invoke(everything)
            kept = [(t, *r) for t, r in zip(held.ts.tolist(), held.rows, strict=True)]
            kept_ids = held.tuple_ids.tolist()
    finally:
        LiveSources.fail_after_insert = set()
    archived = Archive(data / "archive").read("traffic").to_pylist()
    ids = [r["tuple_id"] for r in archived] + kept_ids
    assert len(ids) == len(set(ids)) == 34 and 0 < len(archived) < 34
    both = sorted([(r["ts"], r["lane"], r["speed"]) for r in archived] + kept)
    db = duckdb.connect()
    files = db.execute(f"SELECT ts::DOUBLE, lane::BIGINT, speed::DOUBLE FROM "
                       f"read_csv('{inbox}/*.csv', header = true) ORDER BY 1, 2, 3").fetchall()
    assert both == [tuple(r) for r in files]


def test_rows_without_a_ts_take_the_commit_time(spark: SparkSession, tmp_path: Path) -> None:
    """Rows without a ts take their micro-batch's commit time (the engine's clock), and
    answers are complete to the commit time of the last batch with rows."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    clock = Clock(T0 + 5000)
    with psoup.Engine(path=tmp_path / "data", clock=clock) as eng:
        eng.execute(f"CREATE STREAM traffic (lane INT, speed FLOAT) FROM FILES '{inbox}' "
                    "FORMAT CSV WITH (header = false)")
        h = eng.register("SELECT lane, speed FROM traffic WHERE lane > 1")
        assert eng.invoke(h).fresh_to == -math.inf      # nothing has arrived yet
        (tmp_path / "x").write_text("1,20.5\n2,30.25\n3,x\n4,40.0\n")
        (tmp_path / "x").rename(inbox / "x.csv")
        wait_for(rows_of(eng, 3))
        answer = eng.invoke(h)
        assert sorted(answer.rows) == [(2, 30.25), (4, 40.0)]
        assert set(answer.ts.tolist()) == {T0 + 5000}
        assert answer.fresh_to == T0 + 5000
        assert eng.stats()["sources"]["traffic"]["rejected_rows"] == 1
        clock.now = T0 + 6000           # the next batch commits later
        (tmp_path / "y").write_text("5,50.5\n")
        (tmp_path / "y").rename(inbox / "y.csv")
        wait_for(rows_of(eng, 4))
        assert eng.invoke(h).fresh_to == T0 + 6000
        first = eng.invoke(h)
        assert eng.invoke(h, since=first.cursor or "").fresh_to == T0 + 6000


def test_a_psoup_killed_mid_batch_applies_it_once(tmp_path: Path) -> None:
    """SIGKILL after psoup logged batch 1 and before Spark committed it: the engine
    opened again on the data directory gets batch 1 from Spark again, answers it as a
    duplicate, and goes on; no tuple is lost or counted twice. (The restarted engine
    runs in this process once the killed one, and its Spark, are gone.)"""
    inbox, data = tmp_path / "in", tmp_path / "data"
    killed_after_batch_1(inbox, data, "engine")
    with psoup.Engine(path=data) as back:
        assert back.describe("traffic")["rows_total"] == 29    # batch 1 is in the log
        handles = [back.register(q) for q in QUERIES]
        wait_for(lambda: back.stats()["sources"]["traffic"]["replayed_batches"] == 1)
        land(inbox, "c.csv", trace(8, 29, 23))
        wait_for(rows_of(back, 37))
        assert back.stats()["sources"]["traffic"]["batches"] == 1
        assert back.describe("traffic")["rows_total"] == 37
        assert answers(back, handles) == oracle(inbox)
        back.checkpoint()               # the source is in the checkpoint's catalog too
    with psoup.Engine(path=data) as again:
        shown = again.describe("traffic")
        assert (shown["source"], shown["rows_total"]) == (f"FILES '{inbox}' FORMAT CSV", 37)
        assert answers(again, handles) == oracle(inbox)


def test_a_server_takes_a_source_from_its_clients(spark: SparkSession, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A client declares the stream; the server's durable engine runs its source, and the
    client's SHOW STREAMS and invocations see it, with their freshness: the first
    client served by the server's process, the second through a front process."""
    from psoup.server import Server
    from psoup.server import server as server_module

    monkeypatch.setattr(server_module, "DIRECT_CONNECTIONS", 1)
    inbox = tmp_path / "in"
    inbox.mkdir()
    engine = psoup.Engine(path=tmp_path / "data")
    server = Server(engine, port=0, token="t", fronts=1)
    host, port = server.start_in_thread()
    try:
        with psoup.Client(f"{host}:{port}", token="t") as client, \
                psoup.Client(f"{host}:{port}", token="t") as fronted:
            client.execute(f"CREATE STREAM traffic (lane INT, speed FLOAT) FROM FILES "
                           f"'{inbox}' FORMAT CSV")
            handles = [client.register(q) for q in QUERIES]
            land(inbox, "a.csv", trace(30, 0, 31))
            wait_for(lambda: client.describe("traffic")["rows_total"] >= 30)
            shown = client.describe("traffic")
            assert shown["source"] == f"FILES '{inbox}' FORMAT CSV"
            assert shown["source_batches"] == 1
            assert answers(client, handles) == oracle(inbox)
            assert answers(fronted, handles) == oracle(inbox)
            latest = trace(30, 0, 31)[-1][2]
            for user in (client, fronted):
                assert [user.invoke(h).fresh_to for h in handles] == [latest] * 3
    finally:
        server.stop()
        engine.close()


def test_a_registration_during_ingest_sees_every_row_once(spark: SparkSession,
                                                          tmp_path: Path) -> None:
    """Queries registered while micro-batches arrive (one file per batch) answer over
    every row, those before the registration and those after, each once."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    with psoup.Engine(path=tmp_path / "data") as eng:
        eng.execute(f"CREATE STREAM traffic (lane INT, speed FLOAT) FROM FILES '{inbox}' "
                    "FORMAT CSV WITH (maxFilesPerTrigger = 1, trigger = '500 milliseconds')")
        for i in range(8):
            land(inbox, f"{i}.csv", trace(10, 10 * i, 40 + i))
        wait_for(rows_of(eng, 20))
        handles = [eng.register(q) for q in QUERIES]
        assert eng.describe("traffic")["rows_total"] < 80      # registered mid-ingest
        wait_for(rows_of(eng, 80))
        assert answers(eng, handles) == oracle(inbox)
        stats = eng.stats()["sources"]["traffic"]
        assert stats["batches"] == 8 and stats["input_rows_per_s"] is not None
        assert stats["late_rows"] == 0


def test_rows_older_than_the_stream_take_its_latest_ts(spark: SparkSession,
                                                       tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    with psoup.Engine(path=tmp_path / "data") as eng:
        eng.execute(f"CREATE STREAM traffic (lane INT, speed FLOAT) FROM FILES '{inbox}' "
                    "FORMAT CSV")
        h = eng.register("SELECT lane FROM traffic")
        land(inbox, "later.csv", trace(5, 100, 51))
        wait_for(rows_of(eng, 5))
        land(inbox, "earlier.csv", trace(4, 0, 52))
        wait_for(rows_of(eng, 9))
        latest = trace(5, 100, 51)[-1][2]
        assert eng.invoke(h).ts.tolist()[5:] == [latest] * 4
        assert eng.invoke(h).fresh_to == latest         # the late rows did not lower it
        assert eng.stats()["sources"]["traffic"]["late_rows"] == 4


def test_a_batch_met_by_a_close_comes_again_after_it(spark: SparkSession, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine closes while a micro-batch is being collected: the batch is not
    applied, Spark does not commit it, and the engine opened again applies it."""
    import threading

    import psoup.spark.live as live

    entered, release = threading.Event(), threading.Event()
    collect = live._collect

    def held(frame: Any, schema: Any) -> Any:
        entered.set()
        release.wait(60.0)
        return collect(frame, schema)

    monkeypatch.setattr(live, "_collect", held)
    inbox, data = tmp_path / "in", tmp_path / "data"
    inbox.mkdir()
    eng = psoup.Engine(path=data)
    eng.execute(f"CREATE STREAM traffic (lane INT, speed FLOAT) FROM FILES '{inbox}' "
                "FORMAT CSV")
    land(inbox, "a.csv", trace(12, 0, 61))
    assert entered.wait(240.0)
    closing = threading.Thread(target=eng.close)
    closing.start()
    time.sleep(1.0)                     # close() has stopped the source: it waits
    release.set()
    closing.join(120.0)
    assert not closing.is_alive()
    monkeypatch.setattr(live, "_collect", collect)
    with psoup.Engine(path=data) as back:
        assert back.describe("traffic")["rows_total"] == 0
        wait_for(rows_of(back, 12))
        assert back.stats()["sources"]["traffic"]["batches"] == 1


def test_stream_list_shows_source_columns_only_when_a_stream_has_a_source() -> None:
    from psoup.catalog import CATALOG_COLUMNS
    from psoup.cli.main import _sourced

    plain = ("R", "a INT", None, 0, 0, None, 0, None, None, None)
    fed = ("S", "value INT", None, 5, 5, 1.0, 0, "RATE", "running", 2)
    assert _sourced(CATALOG_COLUMNS, [plain]) == (CATALOG_COLUMNS[:7], [plain[:7]])
    assert _sourced(CATALOG_COLUMNS, [plain, fed]) == (CATALOG_COLUMNS, [plain, fed])


def test_a_stream_created_again_reads_its_folder_afresh_once(spark: SparkSession,
                                                             tmp_path: Path) -> None:
    """DROP STREAM then CREATE STREAM of the same name: the new stream's source has a
    checkpoint of its own (it reads the folder from the start), and an engine opened
    again goes on from that one, not the dropped one's."""
    inbox, data = tmp_path / "in", tmp_path / "data"
    inbox.mkdir()
    create = f"CREATE STREAM traffic (lane INT, speed FLOAT) FROM FILES '{inbox}' FORMAT CSV"
    with psoup.Engine(path=data) as eng:
        eng.execute(create)
        land(inbox, "a.csv", trace(12, 0, 71))
        wait_for(rows_of(eng, 12))
        eng.execute("DROP STREAM traffic")
        eng.execute(create)
        wait_for(rows_of(eng, 12))
        land(inbox, "b.csv", trace(5, 12, 72))
        wait_for(rows_of(eng, 17))
    with psoup.Engine(path=data) as back:
        land(inbox, "c.csv", trace(3, 17, 73))
        wait_for(rows_of(back, 20))
        time.sleep(2.0)                 # nothing read twice arrives late
        assert back.describe("traffic")["rows_total"] == 20
        assert back.stats()["sources"]["traffic"]["batches"] == 1
        assert len(list((data / "sources").iterdir())) == 1
