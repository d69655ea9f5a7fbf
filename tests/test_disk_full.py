"""A full disk (docs/durability.md, "A full disk"): a write the log cannot take is refused
with DiskFull (wire code disk_full) naming the file, and nothing of it is applied, then or
after a restart; reads go on; writes resume by themselves once space is freed; an archive
flush or a checkpoint that meets the full disk never fails the write that triggered it.

Most tests fill the disk by fault injection (the log's writes, its fsyncs or the
archive's Parquet writes fail with ENOSPC while `FullDisk.full` is set); the last ones,
when run as root, fill a real 4 MiB tmpfs.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

import numpy as np
import pytest
from click.testing import CliRunner

import psoup
from psoup import Client, Engine
from psoup.archive import parquet, sampling
from psoup.archive.parquet import Archive
from psoup.cli.main import main
from psoup.errors import DiskFull
from psoup.journal import checkpoint, durable, wal
from psoup.journal.journal import Journal
from psoup.server import Server
from tests.support import Clock, checkpointed

TOKEN = "test-token"
WAIT = 60.0
QUERY = "SELECT a, name FROM R WHERE a >= 0"


def _no_space() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FullDisk:
    """Makes the disk look full while `full` is set: a write of the log stores part of
    its bytes and then fails (a short write, as a real full disk gives) unless `log` is
    cleared, an fsync fails when `fsync` is set too, and a Parquet file of the archive
    fails part way unless `archive` is cleared. Counts the refusals; `room` lets the
    small writes through (a nearly full disk: a record fits, a checkpoint does not)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.full = False
        self.log = True
        self.room = 0           # a write of the log this small still fits
        self.fsync = False
        self.archive = True
        self.refused = 0
        real_write_all, real_fsync = wal._write_all, os.fsync
        real_runs = sampling.write_runs          # what parquet.write_runs is
        real_file = checkpoint._write_file       # a checkpoint's files

        def write_all(fd: int, data: bytes) -> None:
            if not (self.full and self.log) or len(data) <= self.room:
                real_write_all(fd, data)
                return
            self.refused += 1
            os.write(fd, data[:len(data) // 2])
            raise _no_space()

        def write_file(path: Path, data: bytes | memoryview) -> None:
            if not (self.full and self.log) or len(data) <= self.room:
                real_file(path, data)
                return
            self.refused += 1
            real_file(path, bytes(data[:len(data) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        def fsync(fd: int) -> None:
            if self.full and self.fsync:
                self.refused += 1
                raise _no_space()
            real_fsync(fd)

        def write_runs(table: Any, rng: Any, where: str | IO[bytes], **kw: Any) -> None:
            if self.full and self.archive:
                self.refused += 1
                assert not isinstance(where, str), "the archive writes to an open .tmp"
                where.write(b"PAR1" * 64)
                raise _no_space()
            real_runs(table, rng, where, **kw)

        monkeypatch.setattr(wal, "_write_all", write_all)
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(parquet, "write_runs", write_runs)
        monkeypatch.setattr(checkpoint, "_write_file", write_file)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    return FullDisk(monkeypatch)


def _rows(first: int, n: int) -> list[tuple[int, str]]:
    return [(a, f"r{a}") for a in range(first, first + n)]


def _log_file(path: Path) -> Path:
    (segment,) = (path / "wal").glob("wal-*.log")
    return segment


def _every_write_refused(eng: Engine, handle: str, data: Path) -> None:
    """Each kind of write raises DiskFull naming the log, and changes nothing."""
    writes: list[Callable[[], object]] = [lambda: eng.insert("R", _rows(100, 3), ts=50.0),
              lambda: eng.insert("R", _rows(100, 3), ts=50.0, producer="p", seq=1),
              lambda: eng.register("SELECT a FROM R WHERE a > 1"),
              lambda: eng.execute("CREATE STREAM S (x INT)"),
              lambda: eng.unregister(handle),
              lambda: eng.drop_stream("R", cascade=True)]
    for write in writes:
        with pytest.raises(DiskFull, match="the disk is full") as refused:
            write()
        assert refused.value.code == "disk_full"
        assert refused.value.path == str(_log_file(data))
        assert str(_log_file(data)) in str(refused.value)


@pytest.mark.parametrize("sync", ["always", "group", "off"])
def test_a_write_the_log_cannot_take_is_refused_applied_never_and_resumes(
        tmp_path: Path, disk: FullDisk, sync: Any) -> None:
    data = tmp_path / "data"
    eng = Engine(path=str(data), sync=sync, clock=Clock(1000.0))
    eng.execute("CREATE STREAM R (a INT, name TEXT)")
    handle = eng.register(QUERY)
    eng.insert("R", _rows(0, 5), ts=10.0, producer="p", seq=0)
    eng.commit()
    answer = eng.invoke(handle, now=100.0).rows
    size = _log_file(data).stat().st_size

    disk.full = True
    _every_write_refused(eng, handle, data)
    assert disk.refused == 6
    assert _log_file(data).stat().st_size == size         # each part-record cut off
    # reads go on, and see nothing of the refused writes
    assert eng.invoke(handle, now=100.0).rows == answer
    assert eng.queries() == [(handle, QUERY)]
    assert eng.streams() == ["R"]
    assert eng.describe("R")["rows"] == 5
    shown = eng.execute("SHOW STREAMS")
    assert isinstance(shown, psoup.Result) and len(shown.rows) == 1
    assert eng.stats()["streams"]["R"]["rows"] == 5
    assert eng.last_seq("p") == 0

    disk.full = False                                      # space is back: no restart
    ids = eng.insert("R", _rows(5, 3), ts=20.0, producer="p", seq=1)
    assert ids.tolist() == [5, 6, 7]                       # no tupleID taken by a refusal
    eng.insert("R", _rows(8, 2), ts=30.0)
    eng.commit()
    acknowledged = eng.invoke(handle, now=100.0).rows
    assert len(acknowledged) == 10
    eng.close()

    back = Engine(path=str(data), clock=Clock(2000.0))
    assert back.invoke(handle, now=100.0).rows == acknowledged   # exactly those
    assert back.last_seq("p") == 1
    assert back.streams() == ["R"] and len(back.queries()) == 1
    back.close()


def test_a_log_fsync_that_fails_for_want_of_space_takes_the_record_back_out(
        tmp_path: Path, disk: FullDisk) -> None:
    """sync="always": the record was written but could not be made durable, so it is cut
    off again; a restart must not apply a write the caller was told was refused."""
    data = tmp_path / "data"
    eng = Engine(path=str(data), sync="always")
    eng.execute("CREATE STREAM R (a INT, name TEXT)")
    handle = eng.register(QUERY)
    eng.insert("R", _rows(0, 2), ts=1.0)
    size = _log_file(data).stat().st_size
    disk.full = disk.fsync = True
    with pytest.raises(DiskFull, match="nothing of it was applied"):
        eng.insert("R", _rows(2, 2), ts=2.0)
    assert _log_file(data).stat().st_size == size
    assert len(eng.invoke(handle, now=10.0)) == 2
    disk.full = disk.fsync = False
    eng.insert("R", _rows(4, 1), ts=3.0)
    eng.close()
    back = Engine(path=str(data))
    assert [a for a, _ in back.invoke(handle, now=10.0).rows] == [0, 1, 4]
    back.close()


def test_a_cut_that_fails_is_made_before_the_next_append(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         disk: FullDisk) -> None:
    log = wal.WriteAheadLog(tmp_path)
    assert list(log.replay()) == []
    log.append({"op": "a"})
    real_truncate = os.ftruncate

    def broken(fd: int, length: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(os, "ftruncate", broken)
    disk.full = True
    with pytest.raises(DiskFull):
        log.append({"op": "b" * 100})
    assert log.size < (tmp_path / "wal-00000001.log").stat().st_size    # the torn frame
    monkeypatch.setattr(os, "ftruncate", real_truncate)
    disk.full = False
    log.append({"op": "c"})
    log.close()
    again = wal.WriteAheadLog(tmp_path)
    assert list(again.replay()) == [{"op": "a"}, {"op": "c"}]
    again.close()


def test_an_archive_flush_on_a_full_disk_keeps_the_rows_and_the_engine_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disk: FullDisk) -> None:
    """The flush runs inside an insert that is already logged: it fails quietly, the
    rows wait in memory (and in the log), stats say why, and a later insert archives
    them, each once."""
    monkeypatch.setattr(parquet, "RETRY_SECONDS", 0.0)
    data = tmp_path / "data"
    eng = Engine(path=str(data), chunk_rows=4)
    journal = eng._durability.journal
    assert journal is not None
    journal.archive.flush_rows = 8
    eng.execute("CREATE STREAM R (a INT, name TEXT) RETAIN 8 ROWS")
    handle = eng.register(QUERY)
    disk.full, disk.log = True, False          # the archive's quota is used up, say
    for i in range(10):
        eng.insert("R", _rows(4 * i, 4), ts=float(i))
    with pytest.raises(DiskFull):           # the flusher's next attempt (it runs beside)
        journal.archive.wait_flushed()
    assert disk.refused >= 1
    durability = eng.stats()["durability"]
    assert "the disk is full" in durability["archive_error"]
    assert str(data / "archive") in durability["archive_error"]
    assert durability["archive_buffered_rows"] >= 8
    assert not list((data / "archive").rglob("*.tmp"))    # no half file holds space
    assert not list((data / "archive").rglob("*.parquet"))
    assert len(eng.invoke(handle, now=100.0)) == 8

    disk.full = False
    eng.insert("R", _rows(40, 4), ts=10.0)
    journal.archive.wait_flushed()
    durability = eng.stats()["durability"]
    assert durability["archive_error"] is None
    assert durability["archive_buffered_rows"] < 8
    eng.close()
    ids = Archive(data / "archive").read("R").column("tuple_id").to_pylist()
    assert ids == list(range(len(ids))) and len(ids) >= 44 - 8 - 4


def test_rows_not_archived_when_the_engine_closes_are_archived_after_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disk: FullDisk) -> None:
    data = tmp_path / "data"
    eng = Engine(path=str(data), chunk_rows=4)
    eng.execute("CREATE STREAM R (a INT, name TEXT) RETAIN 4 ROWS")
    for i in range(6):
        eng.insert("R", _rows(4 * i, 4), ts=float(i))
    eng.commit()
    disk.full = True
    with pytest.raises(DiskFull, match="wait to be archived"):
        eng.close()                                        # it is closed all the same
    with pytest.raises(psoup.PSoupError, match="closed"):
        eng.insert("R", _rows(99, 1), ts=9.0)
    disk.full = False
    Engine(path=str(data), chunk_rows=4).close()           # replays, and archives them
    ids = Archive(data / "archive").read("R").column("tuple_id").to_pylist()
    assert ids == list(range(len(ids))) and len(ids) >= 24 - 4 - 4


def test_an_automatic_checkpoint_on_a_nearly_full_disk_is_reported_and_made_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disk: FullDisk) -> None:
    now = [100.0]
    monkeypatch.setattr(durable, "time", SimpleNamespace(monotonic=lambda: now[0]))
    data = tmp_path / "data"
    eng = Engine(path=str(data), checkpoint_bytes=2048)
    eng.execute("CREATE STREAM R (a INT, name TEXT)")
    handle = eng.register(QUERY)
    disk.full, disk.room = True, 512
    for i in range(30):                        # past checkpoint_bytes: it is tried
        eng.insert("R", _rows(i, 1), ts=float(i))
        checkpointed(eng)      # automatic ones run in the background
    durability = eng.stats()["durability"]
    assert durability["checkpoint_error"].startswith("DiskFull: the disk is full: No "
                                                     "space left on device writing ")
    assert str(data) in durability["checkpoint_error"]
    # no checkpoint was made: the log from the start is all kept (the cuts of the failed
    # ones only moved the writes after them to segments of their own)
    assert (data / "wal" / "wal-00000001.log").exists()
    assert not list((data / "checkpoint").glob("manifest*"))
    disk.full = False
    now[0] += 1.0                              # failed twice: tried again 1 s later
    eng.insert("R", _rows(30, 1), ts=30.0)
    checkpointed(eng)
    durability = eng.stats()["durability"]
    assert durability["checkpoint_error"] is None and durability["log_bytes"] < 2048
    eng.close()
    back = Engine(path=str(data))
    assert [a for a, _ in back.invoke(handle, now=100.0).rows] == list(range(31))
    back.close()


def test_a_failing_automatic_checkpoint_is_retried_at_growing_intervals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[float] = []
    now = [100.0]
    failing = [True]
    monkeypatch.setattr(durable, "time", SimpleNamespace(monotonic=lambda: now[0]))
    real = Journal.checkpoint

    def full(self: Journal, *args: Any, **kwargs: Any) -> None:
        attempts.append(now[0])
        if failing[0]:
            raise DiskFull("the disk is full: No space left on device writing x; ...", "x")
        real(self, *args, **kwargs)
    eng = Engine(path=str(tmp_path), checkpoint_bytes=256)
    eng.execute("CREATE STREAM R (a INT)")
    monkeypatch.setattr(Journal, "checkpoint", full)
    for step in range(40):                    # a write every 0.25 s for 10 s
        eng.insert("R", [(step,)], ts=float(step))
        checkpointed(eng)     # automatic ones run in the background
        now[0] += 0.25
    assert "DiskFull" in eng.stats()["durability"]["checkpoint_error"]
    assert np.diff(attempts).tolist() == [0.25, 1.0, 2.0, 4.0]   # then 1, 2, 4 s later
    failing[0] = False
    eng.insert("R", [(99,)], ts=99.0)         # not due yet: no attempt
    checkpointed(eng)
    assert len(attempts) == 5
    now[0] += 8.0
    eng.insert("R", [(100,)], ts=100.0)       # due: it works, and says so
    checkpointed(eng)
    assert len(attempts) == 6
    assert eng.stats()["durability"]["checkpoint_error"] is None
    eng.close()
    back = Engine(path=str(tmp_path))
    assert back.describe("R")["rows"] == 42
    back.close()


# ---------------------------------------------------------------------- the service

@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Engine, str]]:
    engine = Engine(path=str(tmp_path / "data"), sync="group", clock=Clock(1000.0))
    srv = Server(engine, port=0, token=TOKEN)
    host, port = srv.start_in_thread()
    yield engine, f"{host}:{port}"
    srv.stop()
    engine.close()


def test_the_client_gets_disk_full_reads_go_on_and_writes_resume(
        tmp_path: Path, disk: FullDisk, served: tuple[Engine, str]) -> None:
    engine, address = served
    with Client(address, token=TOKEN, timeout=WAIT, batch_rows=2000) as client:
        client.execute("CREATE STREAM R (a INT, name TEXT)")
        handle = client.register(QUERY)
        client.insert("R", _rows(0, 4), ts=10.0)
        disk.full = True
        with pytest.raises(DiskFull, match="the disk is full") as refused:
            client.insert("R", _rows(4, 4), ts=20.0)
        assert refused.value.code == "disk_full"
        assert refused.value.path == str(tmp_path / "data" / "wal" / "wal-00000001.log")
        assert refused.value.path in str(refused.value)
        with pytest.raises(DiskFull):
            client.register("SELECT a FROM R WHERE a > 2")
        with pytest.raises(DiskFull) as pipelined:           # in three batches
            client.insert("R", _rows(100, 6_000), ts=30.0)
        assert pipelined.value.path == refused.value.path
        assert len(client.invoke(handle, now=100.0)) == 4           # reads go on
        assert client.stats()["streams"]["R"]["rows"] == 4
        assert client.describe("R")["rows"] == 4
        shown = client.execute("SHOW QUERIES")
        assert isinstance(shown, psoup.Result) and len(shown.rows) == 1
        disk.full = False
        assert client.insert("R", _rows(4, 4), ts=20.0).tolist() == [4, 5, 6, 7]
        assert len(client.invoke(handle, now=100.0)) == 8
    # the CLI says it in one line
    disk.full = True
    done = CliRunner().invoke(main, ["--server", address, "--token", TOKEN,
                                     "stream", "create", "S", "x INT"])
    assert done.exit_code == 1
    assert done.output.startswith("error: the disk is full: No space left on device "
                                  "writing ")
    assert "wal-00000001.log" in done.output and "Traceback" not in done.output
    disk.full = False
    engine.close()
    back = Engine(path=str(tmp_path / "data"))
    assert [a for a, _ in back.invoke(handle, now=100.0).rows] == list(range(8))
    assert back.streams() == ["R"] and len(back.queries()) == 1
    back.close()


def test_an_ingest_stopped_by_a_full_disk_says_so_and_resume_continues_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disk: FullDisk,
        served: tuple[Engine, str]) -> None:
    monkeypatch.setenv("PSOUP_CONFIG_DIR", str(tmp_path / "config"))
    engine, address = served
    engine.execute("CREATE STREAM R (a INT, name TEXT)")
    readings = tmp_path / "r.csv"
    readings.write_text("a,name,ts\n" + "".join(f"{i},n{i},{i}\n" for i in range(30)))
    command = ["--server", address, "--token", TOKEN, "ingest", "R", str(readings),
               "--batch-rows", "10"]
    disk.full = True
    done = CliRunner().invoke(main, command)
    assert done.exit_code == 1 and "Traceback" not in done.output
    assert done.output.startswith("error: batch 1 (input rows 1-10) was refused, none of "
                                  "it applied; 0 rows ingested before it: the disk is "
                                  "full: No space left on device writing ")
    assert done.output.rstrip().endswith("Once space is freed there, run the same command "
                                         "with --resume to continue")
    disk.full = False
    done = CliRunner().invoke(main, [*command, "--resume"])
    assert done.exit_code == 0, done.output
    assert engine.describe("R")["rows"] == 30


# ---------------------------------------------------------------------- a real tmpfs

def _tmpfs_refusal(mountpoint: Path) -> str | None:
    """Why a tmpfs cannot be mounted here (None: it can), with `mountpoint` made."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a small tmpfs needs root (CI runs as root)"
    if shutil.which("mount") is None:
        return "no mount command"
    mountpoint.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs",
                           str(mountpoint)], capture_output=True, text=True)
    if done.returncode != 0:
        return f"`mount -t tmpfs` failed: {done.stderr.strip() or done.returncode}"
    return None


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, unmounted at the end."""
    mountpoint = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}"
    why = _tmpfs_refusal(mountpoint)
    if why is not None:
        pytest.skip(why)
    try:
        yield mountpoint
    finally:
        done = subprocess.run(["umount", str(mountpoint)], capture_output=True)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def _fill(eng: Engine, first: int, rows: int, batches: int) -> tuple[int, DiskFull | None]:
    """Insert up to `batches` batches of `rows` rows; the rows acknowledged and the
    refusal that stopped it (None: none did)."""
    rng = np.random.default_rng(first)
    done = 0
    for _ in range(batches):
        a = np.arange(first + done, first + done + rows, dtype=np.int64)
        try:
            eng.insert("R", {"a": a, "b": rng.random(rows),
                             "name": [f"n{v:012d}" for v in a.tolist()]})
        except DiskFull as exc:
            return done, exc
        done += rows
    return done, None


@pytest.mark.parametrize("sync", ["always", "group"])
def test_a_real_full_disk_refuses_writes_keeps_reads_and_resumes_when_freed(
        small_disk: Path, sync: Any) -> None:
    data = small_disk / "data"
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (1 << 20))          # 1 MiB to free later
    eng = Engine(path=str(data), sync=sync, clock=Clock(1000.0, tick=0.001))
    eng.execute("CREATE STREAM R (a INT, b FLOAT, name TEXT)")
    handle = eng.register("SELECT a FROM R WHERE a >= 0")
    acknowledged, refused = _fill(eng, 0, 2000, 200)
    assert refused is not None, "4 MiB should fill up"
    assert acknowledged > 0
    assert refused.path.startswith(str(data / "wal"))
    assert "No space left on device" in str(refused)
    log = _log_file(data)
    assert log.stat().st_size == eng.stats()["durability"]["log_bytes"]  # nothing torn

    # reads go on
    assert len(eng.invoke(handle)) == acknowledged
    assert eng.describe("R")["rows"] == acknowledged
    shown = eng.execute("SHOW STREAMS")
    assert isinstance(shown, psoup.Result) and len(shown.rows) == 1
    assert eng.stats()["streams"]["R"]["rows"] == acknowledged
    later, still = _fill(eng, acknowledged, 2000, 1)    # writes stay refused while full
    assert later == 0 and still is not None

    filler.unlink()                                # space comes back
    more, again = _fill(eng, acknowledged, 2000, 5)
    assert again is None and more == 10_000        # no restart, no manual step
    eng.register("SELECT a FROM R WHERE a > 5")
    acknowledged += more
    assert len(eng.invoke(handle)) == acknowledged
    eng.close()

    back = Engine(path=str(data))
    got = back.invoke(handle)
    assert sorted(a for (a,) in got.rows) == list(range(acknowledged))   # exactly those
    assert len(back.queries()) == 2
    back.close()


def test_a_real_full_disk_keeps_what_it_cannot_archive_in_memory(
        small_disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention moves rows to the archive, which cannot be written: the inserts that
    the log still takes succeed; once space is back, the rows are archived, each once."""
    monkeypatch.setattr(parquet, "RETRY_SECONDS", 0.0)     # each insert tries again
    data = small_disk / "data"
    eng = Engine(path=str(data), chunk_rows=1024, clock=Clock(1000.0, tick=0.001))
    journal = eng._durability.journal
    assert journal is not None
    journal.archive.flush_rows = 4096
    eng.execute("CREATE STREAM R (a INT, b FLOAT, name TEXT) RETAIN 2048 ROWS")
    filler = small_disk / "filler"
    free = shutil.disk_usage(small_disk).free
    filler.write_bytes(b"\0" * max(0, free - (600 << 10)))   # leave ~600 KiB
    acknowledged, refused = _fill(eng, 0, 1024, 400)
    assert refused is not None and acknowledged >= 4096
    assert refused.path.startswith(str(data / "wal"))
    with pytest.raises(DiskFull):           # the flusher's next attempt (it runs beside)
        journal.archive.wait_flushed()
    stats = eng.stats()
    assert stats["streams"]["R"]["rows"] == 2048
    error = stats["durability"]["archive_error"]
    assert error is not None and "the disk is full" in error and str(data) in error
    assert not list((data / "archive").rglob("*.tmp"))
    assert eng.describe("R")["rows_total"] == acknowledged
    filler.unlink()
    more, again = _fill(eng, acknowledged, 1024, 4)
    assert again is None
    journal.archive.wait_flushed()
    stats = eng.stats()
    assert stats["durability"]["archive_error"] is None
    assert stats["durability"]["archive_buffered_rows"] < 4096
    eng.close()
    ids = Archive(data / "archive").read("R").column("tuple_id").to_pylist()
    assert ids == list(range(len(ids)))
    assert len(ids) >= acknowledged + more - 2048 - 1024
