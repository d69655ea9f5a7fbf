"""Durable engines (Engine(path=...)): whatever a call acknowledged comes back after a
restart — streams, retained tuples with their tupleIDs, handles (the same strings) and
every query's answer — and what left retention is in the Parquet archive."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import psoup
from psoup.archive.parquet import Archive
from psoup.core import Core
from psoup.journal.journal import Journal
from psoup.options import ModeName
from psoup.results.result import Changes, Result
from tests.support import Clock, checkpointed

QUERIES = [
    "SELECT * FROM R WHERE a > 3",
    "SELECT b, name FROM R WHERE b <= 5 BEGIN NOW - 20 END NOW",
    "SELECT DISTINCT name FROM R WHERE a BETWEEN 2 AND 8",
    "SELECT a FROM R [ROWS 7] WHERE a = b",
]


def _feed(eng: psoup.Engine, rng: np.random.Generator, batches: int, t0: float) -> float:
    t = t0
    for _ in range(batches):
        n = int(rng.integers(1, 30))
        ts = t + np.cumsum(rng.random(n))
        t = float(ts[-1])
        eng.insert("R", {"a": rng.integers(0, 10, n), "b": rng.integers(0, 10, n),
                         "name": [f"n{v}" for v in rng.integers(0, 5, n)]}, ts=ts)
    return t


def _answers(eng: psoup.Engine, handles: list[str],
             now: float) -> list[list[tuple[Any, ...]]]:
    results = [eng.invoke(h, now=now) for h in handles]
    return [list(zip(r.tuple_ids.tolist(), r.rows, strict=True)) for r in results]


@pytest.mark.parametrize("mode", psoup.MODES)
@pytest.mark.parametrize("checkpoint_bytes", [64 << 20, 4096])
def test_restart_restores_streams_tuples_handles_and_answers(tmp_path: Path, mode: ModeName,
                                                            checkpoint_bytes: int) -> None:
    ddl = "CREATE STREAM R (a INT, b INT, name TEXT) RETAIN 60 SECONDS"
    kw: dict[str, Any] = dict(mode=mode, chunk_rows=16, checkpoint_bytes=checkpoint_bytes)
    eng = psoup.Engine(path=str(tmp_path), **kw)
    twin = psoup.Engine(mode=mode, chunk_rows=16)         # never restarted
    for e in (eng, twin):
        e.execute(ddl)
    handles = [eng.register(q) for q in QUERIES]
    twin_handles = [twin.register(q) for q in QUERIES]
    t = _feed(eng, np.random.default_rng(5), 40, 0.0)
    _feed(twin, np.random.default_rng(5), 40, 0.0)
    eng.unregister(handles.pop(0))
    twin.unregister(twin_handles.pop(0))
    eng.close()

    back = psoup.Engine(path=str(tmp_path), **kw)
    assert [h for h, _ in back.queries()] == handles
    assert _answers(back, handles, t) == _answers(twin, twin_handles, t)
    later = back.insert("R", [(9, 9, "z")], ts=t + 1)
    assert later[0] == twin.insert("R", [(9, 9, "z")], ts=t + 1)[0]
    assert _answers(back, handles, t + 1) == _answers(twin, twin_handles, t + 1)


def test_engine_of_a_process_that_died_without_close_is_recovered(tmp_path: Path) -> None:
    script = ("import os, sys, psoup\n"
              "eng = psoup.Engine(path=sys.argv[1], sync='off')\n"
              "eng.execute('CREATE STREAM R (a INT)')\n"
              "print(eng.register('SELECT a FROM R WHERE a >= 2'), flush=True)\n"
              "eng.insert('R', [(1,), (2,), (3,)], ts=[1.0, 2.0, 3.0])\n"
              "os._exit(0)\n")                      # no close(), no flush, no atexit
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    back = psoup.Engine(path=str(tmp_path))
    assert back.invoke(done.stdout.strip(), now=3.0).rows == [(2,), (3,)]


def test_rates_after_a_restart_count_live_rows_not_the_recovered_ones(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    with psoup.Engine(path=str(tmp_path / "db"), clock=clock) as eng:
        eng.execute("CREATE STREAM R (a INT)")
        eng.insert("R", {"a": np.arange(5000)}, ts=np.full(5000, 10.0))
    clock.now += 100.0
    with psoup.Engine(path=str(tmp_path / "db"), clock=clock) as eng:
        clock.now += 2.0
        assert eng.stats()["streams"]["R"]["rows_per_s"] == 0.0
        eng.insert("R", {"a": np.arange(10)}, ts=np.full(10, 11.0))
        assert eng.stats()["streams"]["R"]["rows_per_s"] == pytest.approx(5.0)
        assert eng.stats()["streams"]["R"]["rows_total"] == 5010


def test_rejected_calls_are_not_logged(tmp_path: Path) -> None:
    eng = psoup.Engine(path=str(tmp_path))
    eng.execute("CREATE STREAM R (a INT)")
    eng.insert("R", [(1,)], ts=5.0)
    with pytest.raises(psoup.SchemaError):
        eng.insert("R", [(2,)], ts=4.0)              # decreasing ts
    with pytest.raises(psoup.QueryError):
        eng.register("SELECT nope FROM R")
    eng.close()
    back = psoup.Engine(path=str(tmp_path))
    assert back.queries() == []
    assert back.stats()["streams"]["R"]["rows"] == 1
    assert back.insert("R", [(3,)], ts=6.0).tolist() == [1]


def test_engine_clock_timestamps_are_logged_not_reread(tmp_path: Path) -> None:
    clock = Clock(100.0)
    eng = psoup.Engine(path=str(tmp_path), clock=clock)
    eng.execute("CREATE STREAM R (a INT)")
    h = eng.register("SELECT a FROM R BEGIN NOW - 5 END NOW")
    eng.insert("R", [(1,)])
    eng.close()
    back = psoup.Engine(path=str(tmp_path), clock=Clock(500.0))
    assert back.invoke(h, now=102.0).ts.tolist() == [100.0]


def test_everything_in_a_data_directory_is_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    import os
    import stat
    data = tmp_path / "data"
    (data / "wal").mkdir(parents=True, mode=0o755)        # as an older version left it
    old = os.umask(0o002)                                  # a permissive umask
    try:
        eng = psoup.Engine(path=str(data), chunk_rows=4, checkpoint_bytes=1024)
        eng.execute("CREATE STREAM R (a INT, name TEXT) RETAIN 8 ROWS")
        for i in range(12):
            eng.insert("R", [(i * 4 + k, f"x{k}") for k in range(4)], ts=float(i))
        eng.close()
    finally:
        os.umask(old)
    paths = [data, *data.rglob("*")]
    assert any(p.suffix == ".parquet" for p in paths), "something was archived"
    assert any(p.parent.name == "wal" for p in paths), "something was logged"
    opened = [p for p in paths if stat.S_IMODE(p.stat().st_mode) & 0o077]
    assert not opened, [(str(p.relative_to(data)), oct(p.stat().st_mode)) for p in opened]


def test_a_failed_automatic_checkpoint_never_fails_the_write_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write is applied and logged before its checkpoint runs: a checkpoint that
    fails (a full disk, say) is reported in stats, and the write stands, durable."""
    eng = psoup.Engine(path=str(tmp_path), checkpoint_bytes=512)
    eng.execute("CREATE STREAM R (a INT)")
    handle = eng.register("SELECT a FROM R WHERE a > 0")

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Journal, "checkpoint", full_disk)     # every journal's, here one
    ids = eng.insert("R", [(i,) for i in range(1, 60)], ts=1.0)      # due: it fails
    assert len(ids) == 59
    checkpointed(eng)             # automatic ones run in the background
    assert "No space left" in eng.stats()["durability"]["checkpoint_error"]
    with pytest.raises(OSError):
        eng.checkpoint()                          # asked for explicitly, it raises
    monkeypatch.undo()
    eng.insert("R", [(100,)], ts=2.0)             # the next write's checkpoint works
    checkpointed(eng)
    assert eng.stats()["durability"]["checkpoint_error"] is None
    eng.close()
    reopened = psoup.Engine(path=str(tmp_path))
    assert len(reopened.invoke(handle, now=3.0)) == 60 # nothing lost, nothing twice
    reopened.close()


@pytest.mark.parametrize("durable", [True, False])
def test_a_change_that_fails_after_it_is_logged_stops_the_engine_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool) -> None:
    """A failure while a logged change is applied (a bug, memory running out) is never
    reported as a plain failure a caller would retry: the error says the change is
    durable, the engine refuses every later call, and the reopened engine holds the
    change exactly once."""
    eng = psoup.Engine(path=str(tmp_path) if durable else None)
    eng.execute("CREATE STREAM R (a INT)")
    handle = eng.register("SELECT a FROM R WHERE a > 0")
    eng.insert("R", [(1,), (2,)], ts=1.0)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise MemoryError("out of memory")
    monkeypatch.setattr(Core, "append", broken)               # every engine's, here one
    with pytest.raises(psoup.ApplyFailed, match="do not send it again" if durable
                       else "state is unknown") as failed:
        eng.insert("R", [(3,), (4,)], ts=2.0)
    assert "the batch of 2 rows into 'R'" in str(failed.value)
    monkeypatch.undo()
    for call in (lambda: eng.insert("R", [(5,)], ts=3.0), lambda: eng.invoke(handle, now=4.0),
                 lambda: eng.register("SELECT a FROM R")):
        with pytest.raises(psoup.ApplyFailed, match="this engine stopped"):
            call()
    eng.close()
    if durable:
        reopened = psoup.Engine(path=str(tmp_path))
        assert sorted(reopened.invoke(handle, now=4.0).rows) == [(1,), (2,), (3,), (4,)]
        reopened.close()


def test_a_slowly_growing_log_is_checkpointed_by_time(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Past checkpoint_seconds, a log that grew by CHECKPOINT_MIN_GROWTH is rewritten
    as the retained state; with checkpoint_seconds=None only its size counts."""
    from psoup.journal import journal
    monkeypatch.setattr(journal, "CHECKPOINT_MIN_GROWTH", 2000)
    for seconds, rewritten in ((0.0, True), (None, False)):
        where = tmp_path / str(seconds)
        eng = psoup.Engine(path=str(where), checkpoint_seconds=seconds)
        eng.execute("CREATE STREAM R (a INT) RETAIN 10 ROWS")
        handle = eng.register("SELECT a FROM R")
        sizes = []
        for i in range(40):
            eng.insert("R", [(j,) for j in range(20)], ts=float(i))
            checkpointed(eng)     # automatic ones run in the background
            sizes.append(eng.stats()["durability"]["log_bytes"])
        assert (max(sizes) < 3 * 2000) == rewritten
        eng.close()
        with psoup.Engine(path=str(where)) as reopened:
            assert len(reopened.invoke(handle, now=50.0)) == 10


def test_recovery_reports_its_progress_through_the_log(tmp_path: Path) -> None:
    eng = psoup.Engine(path=str(tmp_path))
    eng.execute("CREATE STREAM R (a INT)")
    for i in range(50):
        eng.insert("R", [(j,) for j in range(100)], ts=float(i))
    eng.close()
    calls: list[tuple[int, int]] = []
    reopened = psoup.Engine(path=str(tmp_path), progress=lambda done, total: calls.append((done,
                                                                                      total)))
    size = reopened.stats()["durability"]["log_bytes"]
    assert calls and calls[-1] == (size, size) and size > 50 * 800
    assert all(0 <= done <= total for done, total in calls)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    reopened.close()


def test_expired_tuples_are_archived_once(tmp_path: Path) -> None:
    eng = psoup.Engine(path=str(tmp_path), chunk_rows=4, checkpoint_bytes=2048)
    eng.execute("CREATE STREAM R (a INT, name TEXT) RETAIN 10 ROWS")
    for i in range(10):
        eng.insert("R", [(i * 5 + k, f"x{k}") for k in range(5)],
                   ts=[86400.0 * (i // 5) + i * 5 + k for k in range(5)])
    eng.close()
    psoup.Engine(path=str(tmp_path)).close()              # a recovery must not archive again
    table = Archive(tmp_path / "archive").read("R")
    ids = table.column("tuple_id").to_pylist()
    assert ids == sorted(set(ids))
    assert ids == list(range(len(ids)))              # a gap-free prefix of the stream
    assert len(ids) >= 50 - 10 - 4                   # all but the retained and one chunk
    assert table.column("a").to_pylist() == ids
    assert table.column("name").to_pylist()[:3] == ["x0", "x1", "x2"]
    days = sorted(p.parent.name for p in (tmp_path / "archive").rglob("*.parquet"))
    assert days[0] == "date=1970-01-01" and days[-1] == "date=1970-01-02"


def test_closed_engine_refuses_writes(tmp_path: Path) -> None:
    eng = psoup.Engine(path=str(tmp_path))
    eng.execute("CREATE STREAM R (a INT)")
    eng.close()
    with pytest.raises(psoup.PSoupError, match="closed"):
        eng.insert("R", [(1,)])


def test_cursor_changes_compose_to_the_difference_of_answers() -> None:
    clock = Clock(0.0)
    eng = psoup.Engine(clock=clock, chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b INT) RETAIN 40 ROWS")
    plain = eng.register("SELECT a FROM R WHERE b > 2 BEGIN NOW - 15 END NOW")
    distinct = eng.register("SELECT DISTINCT a FROM R WHERE b > 2 BEGIN NOW - 15 END NOW")
    rng = np.random.default_rng(11)
    for h, key in ((plain, "ids"), (distinct, "rows")):
        first = eng.invoke(h, now=clock.now)
        seen = _keyed(first, key)
        cursor = first.cursor
        for _ in range(25):
            n = int(rng.integers(0, 6))
            if n:
                clock.now += 1.0
                eng.insert("R", {"a": rng.integers(0, 4, n), "b": rng.integers(0, 6, n)})
            clock.now += float(rng.integers(0, 3))
            changes = eng.invoke(h, since=cursor)
            assert isinstance(changes, Changes)     # a str cursor (Result.cursor is Optional)
            full = eng.invoke(h)
            assert not (_keyed(changes.inserted, key) & seen)
            assert _keyed(changes.deleted, key) <= seen
            seen = (seen - _keyed(changes.deleted, key)) | _keyed(changes.inserted, key)
            assert seen == _keyed(full, key)
            cursor = changes.cursor


def _keyed(result: Result, key: str) -> set[Any]:
    if key == "ids":
        return set(zip(result.tuple_ids.tolist(), result.rows, strict=True))
    return set(result.rows)


def test_unknown_cursor_is_refused() -> None:
    eng = psoup.Engine()
    eng.execute("CREATE STREAM R (a INT)")
    h = eng.register("SELECT a FROM R")
    with pytest.raises(psoup.errors.CursorExpired, match="invoke without since"):
        eng.invoke(h, since="made-up")


def test_a_data_directory_is_open_in_one_engine_at_a_time(tmp_path: Path) -> None:
    first = psoup.Engine(path=str(tmp_path))
    with pytest.raises(psoup.PSoupError, match="in use by another psoup engine"):
        psoup.Engine(path=str(tmp_path))
    first.close()
    psoup.Engine(path=str(tmp_path)).close()          # free again once closed


def test_join_queries_survive_a_restart(tmp_path: Path) -> None:
    eng = psoup.Engine(path=str(tmp_path), checkpoint_bytes=2048)
    eng.execute("CREATE STREAM R (a INT, b INT)")
    eng.execute("CREATE STREAM S (b INT, c INT)")
    h = eng.register("SELECT R.a, S.c FROM R, S WHERE R.b = S.b AND R.a < 5")
    for i in range(20):
        eng.insert("R", [(i % 7, i % 3)], ts=float(2 * i))
        eng.insert("S", [(i % 3, i)], ts=float(2 * i + 1))
    before = eng.invoke(h, now=100.0)
    eng.close()
    back = psoup.Engine(path=str(tmp_path))
    after = back.invoke(h, now=100.0)
    assert len(before) > 20
    assert after.rows == before.rows
    assert after.tuple_ids.tolist() == before.tuple_ids.tolist()


# ---------------------------------------------------------------- DROP STREAM

def _dropped_and_recreated(path: Path, **kw: Any) -> str:
    """R (retaining 4 rows, so most of it archived) dropped with its query, then created
    again with other columns; returns the new query's handle."""
    eng = psoup.Engine(path=str(path), chunk_rows=4, **kw)
    eng.execute("CREATE STREAM R (a INT) RETAIN 4 ROWS")
    eng.register("SELECT a FROM R WHERE a > 1")
    eng.insert("R", [(i,) for i in range(20)], ts=50.0)
    eng.checkpoint()                                        # the old R is archived
    assert Archive(path / "archive").streams() == ["R"]
    eng.execute("DROP STREAM R CASCADE")
    eng.execute("CREATE STREAM R (b TEXT) RETAIN 2 ROWS")
    h = eng.register("SELECT b FROM R")
    eng.insert("R", [(c,) for c in "uvwxyz"], ts=60.0)     # u..x leave for the archive
    eng.close()
    return h


@pytest.mark.parametrize("checkpoint", [False, True])
def test_drop_stream_survives_restart_and_checkpoint(tmp_path: Path, checkpoint: bool) -> None:
    h = _dropped_and_recreated(tmp_path)
    if checkpoint:
        with psoup.Engine(path=str(tmp_path), chunk_rows=4) as eng:
            eng.checkpoint()
    with psoup.Engine(path=str(tmp_path), chunk_rows=4) as eng:
        eng._check()
        assert [q for q, _ in eng.queries()] == [h]
        assert eng.describe("R")["columns"] == "b TEXT"
        assert eng.invoke(h, now=70.0).rows == [("y",), ("z",)]
        assert eng.describe("R")["rows"] == 2


def test_drop_stream_removes_only_the_dropped_streams_archive(tmp_path: Path) -> None:
    _dropped_and_recreated(tmp_path)
    for _ in range(2):                   # replaying the drop spares the new stream's files
        psoup.Engine(path=str(tmp_path), chunk_rows=4).close()
        archived = Archive(tmp_path / "archive").read("R")
        assert archived.column_names == ["ts", "tuple_id", "b"]
        assert archived.column("b").to_pylist() == list("uvwx")
