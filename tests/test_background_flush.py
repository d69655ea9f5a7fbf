"""An engine's archive writes expired rows beside the writer (docs/durability.md): the
insert that fills a buffer returns before the buffer is written; the flusher publishes
a run whole; close, a drop and a crash see it through; the writer waits only when the
flusher is PENDING_RUNS buffers behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import psoup
from psoup.archive import parquet
from psoup.archive.parquet import PENDING_RUNS, Archive
from psoup.archive.rollups import Rollups
from psoup.archive.sampling import write_runs
from psoup.journal import journal
from tests.support import Clock, check_copies, substitutes

FLUSH_ROWS = 128
CHUNK = 8
T0 = 86400.0 * 19000 + 3600.0           # minute-aligned, far from a UTC midnight
#: the window of the aggregate query: tupleIDs 0..61 (ts = T0 + tupleID), whole minute
#: [T0, T0 + 60) inside it
WINDOW = (T0, T0 + 61.0)
QUERY = f"SELECT COUNT(*), SUM(a), MIN(a), MAX(a) FROM R BEGIN {WINDOW[0]!r} END {WINDOW[1]!r}"


class Gate:
    """Holds the flusher at one step of a write until released; `reached` is set
    when it gets there."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def held(*args: Any, **kwargs: Any) -> Any:
            self.reached.set()
            assert self.release.wait(30), "the test never released the flusher"
            return real(*args, **kwargs)
        return held


@pytest.fixture(params=["part", "copies"])
def gate(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """The flusher held while it writes a part file (`part`), or after the part file
    is in place and before its aggregate copies (`copies`)."""
    held = Gate()
    if request.param == "part":
        monkeypatch.setattr(parquet, "write_runs", held.wrap(write_runs))   # as parquet has it
    else:
        monkeypatch.setattr(Rollups, "write", held.wrap(Rollups.write))
    yield held
    held.release.set()          # a failed test leaves no thread waiting


def engine(state: Path) -> psoup.Engine:
    """A durable engine whose archive flushes every FLUSH_ROWS rows, with stream R
    (RETAIN 20 ROWS, chunks of 8: rows reach the archive 8 at a time)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(journal, "Archive", partial(Archive, flush_rows=FLUSH_ROWS))
        eng = psoup.Engine(path=str(state), clock=Clock(T0 + 10_000.0), chunk_rows=CHUNK)
    eng.execute("CREATE STREAM R (a INT) RETAIN 20 ROWS")
    return eng


def insert(eng: psoup.Engine, first: int, n: int) -> None:
    """Rows first..first + n - 1 (a: tupleID * 7 - 100, ts: T0 + tupleID)."""
    tids = np.arange(first, first + n)
    eng.insert("R", {"a": tids * 7 - 100}, ts=T0 + tids.astype(np.float64))


def archive_of(eng: psoup.Engine) -> Archive:
    assert eng._durability.journal is not None
    return eng._durability.journal.archive


def truth() -> tuple[int, int, int, int]:
    a = np.arange(0, 62) * 7 - 100
    return 62, int(a.sum()), int(a.min()), int(a.max())


def fill_until_handed(eng: psoup.Engine, gate: Gate, first: int) -> int:
    """Insert 8 rows at a time from `first` until the flusher reaches the gate; the
    next row's tupleID. Every insert returns meanwhile: none waits for the write."""
    n = first
    while not gate.reached.is_set():
        began = time.perf_counter()
        insert(eng, n, CHUNK)
        assert time.perf_counter() - began < 5.0
        n += CHUNK
        assert n < first + 4 * FLUSH_ROWS, "no buffer was handed to the flusher"
        if not gate.reached.is_set():
            gate.reached.wait(0.05 if archive_of(eng).buffered_rows >= FLUSH_ROWS else 0)
    return n


def test_an_insert_that_fills_the_buffer_returns_before_the_flush_is_written(
        tmp_path: Path, gate: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = engine(tmp_path / "state")
    copies = substitutes(monkeypatch)
    handle = eng.register(QUERY)
    assert eng.evaluate_history() == {handle: 0}     # a tier, growing as rows leave
    arc = archive_of(eng)
    insert(eng, 0, 88)                               # rows 0..63 expired: the window's
    before = eng.invoke(handle).rows
    assert before == [truth()]
    assert arc.buffered_rows == 64 and arc.high_water("R") == -1

    n = fill_until_handed(eng, gate, 88)             # the flusher holds a full run
    assert not gate.release.is_set()
    assert arc.high_water("R") == -1                 # nothing published
    assert arc.read("R").num_rows == 0               # not even a part file in place
    assert arc.buffered_rows >= FLUSH_ROWS           # the rows still count as buffered
    assert arc.streams() == ["R"]
    stats = eng.stats()["durability"]
    assert stats["archive_buffered_rows"] >= FLUSH_ROWS
    assert stats.get("aggregates", {}).get("R", {}).get("complete_parts", 0) == 0
    during = eng.invoke(handle).rows
    assert copies[-1] is None                        # the tier's tuples answer
    insert(eng, n, CHUNK)                            # the writer goes on
    n += CHUNK

    gate.release.set()
    arc.wait_flushed()
    assert arc.high_water("R") == FLUSH_ROWS - 1
    assert eng.stats()["durability"]["aggregates"]["R"]["complete_parts"] == 1
    after = eng.invoke(handle).rows
    assert copies[-1] is not None                    # the copies answer [T0, T0 + 60)
    assert before == during == after == [truth()]
    eng.close()

    ids = Archive(tmp_path / "state" / "archive").read("R").column("tuple_id").to_pylist()
    assert ids == list(range(len(ids))) and len(ids) >= n - 20 - CHUNK   # each once
    check_copies(tmp_path / "state")


def test_close_waits_for_the_pending_flush(tmp_path: Path, gate: Gate) -> None:
    eng = engine(tmp_path / "state")
    n = fill_until_handed(eng, gate, 0)
    closing = threading.Thread(target=eng.close)
    closing.start()
    closing.join(0.3)
    assert closing.is_alive(), "close returned with a flush pending"
    gate.release.set()
    closing.join(30)
    assert not closing.is_alive()
    ids = Archive(tmp_path / "state" / "archive").read("R").column("tuple_id").to_pylist()
    assert ids == list(range(len(ids))) and len(ids) >= n - 20 - CHUNK


def test_the_writer_waits_when_the_flusher_is_pending_runs_behind(
        tmp_path: Path, gate: Gate) -> None:
    eng = engine(tmp_path / "state")
    arc = archive_of(eng)
    n = fill_until_handed(eng, gate, 0)
    # PENDING_RUNS - 1 more full buffers wait behind the one held, then one more fills
    blocked = threading.Event()
    done = threading.Event()

    def produce() -> None:
        nonlocal n
        while n < PENDING_RUNS * FLUSH_ROWS + FLUSH_ROWS + 40:
            blocked.set()
            insert(eng, n, CHUNK)
            blocked.clear()
            n += CHUNK
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    assert not done.wait(1.0), "the writer filled a buffer too many without waiting"
    assert blocked.is_set()
    assert arc.buffered_rows <= (PENDING_RUNS + 1) * FLUSH_ROWS
    gate.release.set()
    producer.join(30)
    assert done.is_set()
    arc.wait_flushed()
    assert arc.high_water("R") >= PENDING_RUNS * FLUSH_ROWS - 1
    eng.close()
    ids = Archive(tmp_path / "state" / "archive").read("R").column("tuple_id").to_pylist()
    assert ids == list(range(len(ids)))


def test_a_stream_dropped_with_a_flush_pending_leaves_no_file(tmp_path: Path,
                                                             gate: Gate) -> None:
    eng = engine(tmp_path / "state")
    fill_until_handed(eng, gate, 0)
    dropping = threading.Thread(target=eng.execute, args=("DROP STREAM R",))
    dropping.start()
    dropping.join(0.2)
    gate.release.set()                  # the run being written is waited for
    dropping.join(30)
    assert not dropping.is_alive()
    arc = archive_of(eng)
    assert arc.streams() == [] and arc.buffered_rows == 0
    assert not list((tmp_path / "state" / "archive").rglob("*.parquet"))
    eng.execute("CREATE STREAM R (a INT) RETAIN 20 ROWS")
    eng.close()
    assert Archive(tmp_path / "state" / "archive").read("R").num_rows == 0


CRASHING = textwrap.dedent("""
    import sys, threading, time
    from functools import partial
    import numpy as np
    import psoup
    from psoup.archive import parquet
    from psoup.archive.parquet import Archive
    from psoup.archive.rollups import Rollups
    from psoup.journal import journal

    state, where = sys.argv[1], sys.argv[2]
    stuck = threading.Event()

    def hold(*args, **kwargs):
        print("held", flush=True)
        stuck.wait()                    # until the process is killed

    if where == "part":
        parquet.write_runs = hold
    else:
        Rollups.write = hold
    journal.Archive = partial(Archive, flush_rows=64)
    eng = psoup.Engine(path=state, chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT) RETAIN 20 ROWS")
    for i in range(25):                 # 200 rows: runs 0..63 (held), 64..127 pending
        tids = np.arange(8 * i, 8 * i + 8)
        eng.insert("R", {"a": tids}, ts=tids.astype(np.float64))
    print("acked", flush=True)
    time.sleep(120)
""")


@pytest.mark.parametrize("where", ["part", "copies"])
def test_a_crash_with_a_flush_pending_archives_every_row_once(tmp_path: Path,
                                                              where: str) -> None:
    state = tmp_path / "state"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), env.get("PYTHONPATH")] if p)
    proc = subprocess.Popen([sys.executable, "-c", CRASHING, str(state), where],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().strip() for _ in range(2)]
        assert sorted(lines) == ["acked", "held"], lines
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    archive = state / "archive"
    if where == "part":
        assert list(archive.rglob("*.tmp")), "killed while writing a part file"
    else:
        assert len(list(archive.rglob("*.parquet"))) == 1     # in place, no copies

    eng = psoup.Engine(path=str(state), chunk_rows=8)       # replays the log
    assert not list(archive.rglob("*.tmp"))
    assert eng.describe("R")["rows_total"] == 200           # every acknowledged row
    eng.checkpoint()                    # archives every expired row, waits for it
    handle = eng.register("SELECT a FROM R")
    kept = sorted(a for (a,) in eng.invoke(handle).rows)
    eng.close()
    ids = Archive(archive).read("R").column("tuple_id").to_pylist()
    assert ids == list(range(len(ids)))                     # once each, in order
    assert sorted(ids + kept) == list(range(200))           # none lost, none twice
    check_copies(state)
