"""Streams whose micro-batches are probed in Spark's executors (WITH (probe =
'executors'), local mode): files landing in a folder give DuckDB's answers without a
row in the psoup process; a batch Spark runs again, or finds committed after a
restart or a SIGKILL of psoup, is not committed twice; a registration during ingest
sees every row once (the history pass covers the batches probed before it); what such
a stream cannot answer is refused with the reason."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import psoup
from psoup.errors import HistoryPending, QueryError
from psoup.spark.live import LiveSources
from tests.support import QUERIES, answers, killed_after_batch_1, land, oracle, trace, wait_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")   # pyspark on pandas 3

T0 = 1_767_225_600.0


def create(inbox: Path, extra: str = "") -> str:
    return (f"CREATE STREAM traffic (lane INT, speed FLOAT) RETAIN 30 DAYS FROM FILES "
            f"'{inbox}' FORMAT CSV WITH (probe = 'executors', trigger = '500 milliseconds'"
            f"{extra})")


def committed(eng: psoup.Engine, n: int) -> bool:
    return int(eng.stats()["sources"]["traffic"]["retained_rows"]) >= n


def settled(eng: psoup.Engine, handles: list[str]) -> bool:
    """Every handle answers (no batch lacks it any more)."""
    try:
        for h in handles:
            eng.invoke(h)
    except HistoryPending:
        return False
    return True


def test_files_give_duckdbs_answers_with_no_row_in_psoup(spark: SparkSession,
                                                         tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    with psoup.Engine(path=tmp_path / "data", clock=lambda: T0 + 10_000) as eng:
        eng.execute(create(inbox))
        handles = [eng.register(q) for q in QUERIES]
        window = eng.register("SELECT lane FROM traffic [RANGE 10 SECONDS] WHERE lane > 1")
        land(inbox, "a.csv", trace(40, 0, 1))
        wait_for(lambda: committed(eng, 40))
        first = eng.invoke(handles[0])
        land(inbox, "b.csv", trace(30, 40, 2))
        land(inbox, "c.csv", trace(25, 70, 3))
        wait_for(lambda: committed(eng, 95))
        assert answers(eng, handles) == oracle(inbox)
        changes = eng.invoke(handles[0], since=first.cursor or "")
        assert len(first.rows) + len(changes.inserted.rows) == len(oracle(inbox)[0])
        assert not changes.deleted.rows
        latest = trace(25, 70, 3)[-1][2]
        assert [eng.invoke(h).fresh_to for h in handles] == [latest] * 3
        # a window at the engine's NOW (T0 + 10,000): past the rows, so empty
        assert eng.invoke(window).rows == []
        assert eng.invoke(window, now=latest).rows == [
            (lane,) for lane, _, ts in trace(25, 70, 3) if ts >= latest - 10 and lane > 1]
        assert eng._core.stems["traffic"].n == 0            # none held in memory
        shown = eng.describe("traffic")                     # the batch store's
        assert (shown["rows"], shown["rows_total"], shown["latest_ts"]) == (95, 95, latest)
        assert eng.latest_ts("traffic") == latest
        stats = eng.stats()["sources"]["traffic"]
        assert stats["probe"] == "executors" and stats["retained_rows"] == 95
        assert stats["rows"] == 95 and stats["last_error"] is None
        assert stats["history_batches"] == 0     # every query was in every batch


def test_a_batch_run_again_is_committed_once_across_a_restart(spark: SparkSession,
                                                              tmp_path: Path) -> None:
    inbox, data = tmp_path / "in", tmp_path / "data"
    inbox.mkdir()
    LiveSources.fail_after_insert = {0}
    try:
        with psoup.Engine(path=data) as eng:
            eng.execute(create(inbox))
            handles = [eng.register(q) for q in QUERIES]
            land(inbox, "a.csv", trace(20, 0, 4))
            wait_for(lambda: eng.stats()["sources"]["traffic"]["replayed_batches"] >= 1)
            assert eng.stats()["sources"]["traffic"]["retained_rows"] == 20
            LiveSources.fail_after_insert = {1}
            land(inbox, "b.csv", trace(15, 20, 5))
            wait_for(lambda: eng.stats()["sources"]["traffic"]["restarts"] >= 2)
        with psoup.Engine(path=data) as back:      # Spark runs batch 1 again: skipped
            wait_for(lambda: back.stats()["sources"]["traffic"]["replayed_batches"] >= 1)
            land(inbox, "c.csv", trace(10, 35, 6))
            wait_for(lambda: committed(back, 45))
            assert back.stats()["sources"]["traffic"]["retained_rows"] == 45
            assert answers(back, handles) == oracle(inbox)
            folders = list((data / "sources").iterdir())
            back.execute("DROP STREAM traffic CASCADE")
            wait_for(lambda: not folders[0].exists(), 60.0)
    finally:
        LiveSources.fail_after_insert = set()


def test_a_registration_during_ingest_sees_every_row_once(spark: SparkSession,
                                                          tmp_path: Path) -> None:
    """Queries registered while batches arrive: the batches probed before are covered
    by the history pass, the later ones probed with them; each row counts once."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    with psoup.Engine(path=tmp_path / "data") as eng:
        eng.execute(create(inbox, ", maxFilesPerTrigger = 1"))
        for i in range(8):
            land(inbox, f"{i}.csv", trace(10, 10 * i, 40 + i))
        wait_for(lambda: committed(eng, 20))
        handles = [eng.register(q) for q in QUERIES]
        assert eng.stats()["sources"]["traffic"]["retained_rows"] < 80
        wait_for(lambda: committed(eng, 80))
        wait_for(lambda: settled(eng, handles))
        assert answers(eng, handles) == oracle(inbox)
        assert eng.stats()["sources"]["traffic"]["history_batches"] >= 2
        eng.unregister(handles[1])
        with pytest.raises(psoup.UnknownHandle):
            eng.invoke(handles[1])


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT * FROM traffic [ROWS 5]", "a window that counts rows"),
    ("SELECT * FROM traffic [PARTITION BY lane ROWS 2]", "a window that counts rows"),
    ("SELECT * FROM traffic WHERE tupleID > 3", "WHERE on tupleID"),
    ("SELECT * FROM traffic TABLESAMPLE BERNOULLI (10)", "TABLESAMPLE is not supported"),
    ("SELECT * FROM traffic AS a, other AS b WHERE a.lane = b.lane", "a join over it"),
])
def test_what_such_a_stream_cannot_answer_is_refused(spark: SparkSession, tmp_path: Path,
                                                     sql: str, message: str) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    with psoup.Engine(path=tmp_path / "data") as eng:
        eng.execute(create(inbox))
        eng.execute("CREATE STREAM other (lane INT)")
        with pytest.raises(QueryError, match=message):
            eng.register(sql)
        with pytest.raises(QueryError, match="takes no INSERT"):
            eng.insert("traffic", [(1, 2.0)])
        assert eng.queries() == []


def test_a_bad_probe_option_or_rows_retention_is_refused(tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    with psoup.Engine(path=tmp_path / "data") as eng:
        with pytest.raises(QueryError, match="option probe takes 'engine' or 'executors'"):
            eng.execute(f"CREATE STREAM t (a INT) FROM FILES '{inbox}' FORMAT CSV "
                        "WITH (probe = 'gpu')")
        with pytest.raises(QueryError, match="give RETAIN as a time"):
            eng.execute(f"CREATE STREAM t (a INT) RETAIN 5 ROWS FROM FILES '{inbox}' "
                        "FORMAT CSV WITH (probe = 'executors')")
        assert eng.streams() == []


def test_a_psoup_killed_mid_batch_commits_it_once(tmp_path: Path) -> None:
    """SIGKILL after psoup committed batch 1 and before Spark did: the engine opened
    again gets batch 1 from Spark again and skips it; no row is lost or counted twice."""
    inbox, data = tmp_path / "in", tmp_path / "data"
    killed_after_batch_1(inbox, data, "executors")
    with psoup.Engine(path=data) as back:
        handle, = (h for h, _ in back.queries())
        assert back.stats()["sources"]["traffic"]["retained_rows"] == 29
        wait_for(lambda: back.stats()["sources"]["traffic"]["replayed_batches"] == 1)
        land(inbox, "c.csv", trace(8, 29, 23))
        wait_for(lambda: committed(back, 37))
        assert back.stats()["sources"]["traffic"]["batches"] == 1
        assert back.invoke(handle).rows == oracle(inbox)[0]


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="read replicas need Linux")
def test_a_read_replica_sends_such_a_streams_invocations_to_the_primary(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch store is the primary's: a replica forwards the invocations of the
    handles over such a stream, those in its snapshot and those registered after."""
    from psoup.server import Server

    inbox = tmp_path / "in"
    inbox.mkdir()
    engine = psoup.Engine(path=tmp_path / "data")
    engine.execute(create(inbox))
    before = engine.register(QUERIES[0])
    land(inbox, "a.csv", trace(30, 0, 71))
    wait_for(lambda: committed(engine, 30))
    server = Server(engine, port=0, token="t", replicas=1, fronts=0)
    host, port = server.start_in_thread()
    answered: list[str] = []
    invoke = engine.invoke

    def recorded(handle: str, *args: Any, **kwargs: Any) -> Any:
        answered.append(handle)
        return invoke(handle, *args, **kwargs)

    monkeypatch.setattr(engine, "invoke", recorded)
    try:
        wait_for(lambda: server._replicas is not None and any(
            link.ready for link in server._replicas._all), 60.0)
        clients = [psoup.Client(f"{host}:{port}", token="t") for _ in range(2)]
        replica, = (c for c in clients if "replica" in c.server)
        after = replica.register(QUERIES[1])
        wait_for(lambda: settled(engine, [after]))
        want = oracle(inbox)
        answered.clear()
        assert replica.invoke(before).rows == want[0]
        got = replica.invoke(after)
        assert [(t, *r) for t, r in zip(got.ts.tolist(), got.rows, strict=True)] == want[1]
        assert answered == [before, after]
        for client in clients:
            client.close()
    finally:
        server.stop()
        engine.close()
