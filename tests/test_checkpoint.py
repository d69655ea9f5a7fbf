"""Checkpoints as files (psoup.journal.checkpoint): a restart from one answers exactly as
the engine did before it, in every mode; a checkpoint cut short leaves the previous one
valid and nothing acknowledged lost; one written while other calls go on (in the
background, or between its cut and its manifest) loses and duplicates nothing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import psoup
from psoup.journal import checkpoint as checkpoints
from psoup.journal.journal import Journal
from psoup.options import ModeName
from psoup.results.result import Changes
from tests.support import checkpointed

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 16

STREAMS = ["CREATE STREAM R (a INT, b FLOAT, name TEXT, ok BOOL) RETAIN 150 ROWS",
           "CREATE STREAM S (a INT, c INT) RETAIN 40 SECONDS"]
QUERIES = [
    "SELECT * FROM R WHERE a > 3",
    "SELECT b, name FROM R WHERE b <= 0.5 AND ok = true BEGIN NOW - 20 END NOW",
    "SELECT DISTINCT name FROM R WHERE a BETWEEN 2 AND 8",
    "SELECT a FROM R [ROWS 7] WHERE a = 4",
    "SELECT name, COUNT(*), SUM(a), MAX(b) FROM R WHERE a < 7 GROUP BY name",
    "SELECT COUNT(*), AVG(c) FROM S WHERE c > 2 BEGIN NOW - 15 END NOW",
    "SELECT R.a, S.c FROM R, S WHERE R.a = S.a AND S.c > 3",
    "SELECT c FROM S WHERE a IN (1, 2) AND c >= 3",
    "SELECT a FROM R WHERE a > 100",
]
#: The QUERIES whose `since` answers are recomputed from the tuples (selections).
RECOMPUTED = {0, 1, 2, 3, 7, 8}


class Twin:
    """A durable engine and an in-memory one given the same calls: the durable one's
    answers must equal the other's, whatever restarts and checkpoints it went through."""

    def __init__(self, path: Path, mode: ModeName):
        self.path, self.mode = path, mode
        self.now = 0.0
        self.durable = self._open()
        self.memory = psoup.Engine(mode=mode, chunk_rows=CHUNK, clock=self._clock)
        self.handles: list[tuple[str, str]] = []       # (durable, memory), live ones
        #: (handle index, the durable engine's cursor, the other's)
        self.cursors: list[tuple[int, str | None, str | None]] = []
        self.restarted = False                         # since the cursors were taken
        for ddl in STREAMS:
            self.durable.execute(ddl)
            self.memory.execute(ddl)

    def _clock(self) -> float:
        return self.now

    def _open(self) -> psoup.Engine:
        return psoup.Engine(path=str(self.path), mode=self.mode, chunk_rows=CHUNK,
                            clock=self._clock, sync="off", checkpoint_bytes=1 << 40)

    def both(self, call: Callable[[psoup.Engine], Any]) -> tuple[Any, Any]:
        return call(self.durable), call(self.memory)

    def register(self, sql: str) -> None:
        self.handles.append(self.both(lambda e: e.register(sql)))

    def unregister(self, i: int) -> None:
        i %= len(self.handles)
        d, m = self.handles.pop(i)
        self.durable.unregister(d)
        self.memory.unregister(m)
        self.cursors = [(k if k < i else k - 1, c, n) for k, c, n in self.cursors if k != i]

    def insert(self, seed: int, rows: int) -> None:
        gen = np.random.default_rng(seed)
        self.now += 1.0 + float(gen.random())
        r = {"a": gen.integers(0, 10, rows), "b": gen.random(rows),
             "name": [f"n{v}" for v in gen.integers(0, 5, rows)], "ok": gen.random(rows) < 0.5}
        s = {"a": gen.integers(0, 10, rows // 3 + 1), "c": gen.integers(0, 10, rows // 3 + 1)}
        self.both(lambda e: e.insert("R", r))
        self.both(lambda e: e.insert("S", s))

    def remember(self) -> None:
        """Take a cursor of every selection's handle (those a restarted engine can answer
        `since` from the tuples it holds), to ask for the changes since after restarts."""
        sqls = dict(self.durable.queries())
        self.cursors = [(i, self.durable.invoke(d).cursor, self.memory.invoke(m).cursor)
                        for i, (d, m) in enumerate(self.handles)
                        if QUERIES.index(sqls[d]) in RECOMPUTED]
        self.restarted = False

    def restart(self, crash: bool = False) -> None:
        """Reopen the durable engine: closed first, or (`crash`) from a copy of its
        directory taken while it was open, as a killed process leaves it."""
        if crash:
            copy = self.path.with_name(self.path.name + "-crash")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(self.path, copy, ignore=shutil.ignore_patterns("lock"))
            self.durable._durability.stop()
            self.durable.close()
            shutil.rmtree(self.path)
            copy.rename(self.path)
        else:
            self.durable.close()
        self.durable = self._open()
        self.restarted = True

    def check(self) -> None:
        self.durable._check()
        for d, m in self.handles:
            assert _answer(self.durable.invoke(d)) == _answer(self.memory.invoke(m)), \
                self.durable.queries()
        for i, c, n in self.cursors:
            d, m = self.handles[i]
            assert c is not None and n is not None
            try:
                got = self.durable.invoke(d, since=c)
            except psoup.CursorExpired:
                # its tuples left memory, and the copy of its answer did not outlive
                # the restart (docs/durability.md): the restarted engine says so
                assert self.restarted
                continue
            want = self.memory.invoke(m, since=n)
            assert isinstance(got, Changes) and isinstance(want, Changes)
            assert (_answer(got.inserted), _answer(got.deleted)) == \
                (_answer(want.inserted), _answer(want.deleted))
        assert self.durable.queries() == [(d, sql) for (d, _), (_, sql) in
                                          zip(self.handles, self.memory.queries(), strict=True)]
        stats, mem = self.durable.stats(), self.memory.stats()
        for name in ("R", "S"):
            for key in ("rows", "rows_total", "latest_ts", "rows_at_latest_ts"):
                assert stats["streams"][name][key] == mem["streams"][name][key], (name, key)

    def close(self) -> None:
        self.durable.close()
        self.memory.close()


def _answer(result: Any) -> Any:
    rows = list(zip(result.tuple_ids.tolist(), map(repr, result.rows), strict=True)) \
        if result.tuple_ids is not None and len(result.tuple_ids) == len(result.rows) \
        else sorted(map(repr, result.rows))
    return sorted(rows)


OPS = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(1, 60)),
    st.tuples(st.just("register"), st.integers(0, len(QUERIES) - 1), st.just(0)),
    st.tuples(st.just("unregister"), st.integers(0, 20), st.just(0)),
    st.tuples(st.just("checkpoint"), st.just(0), st.just(0)),
    st.tuples(st.just("remember"), st.just(0), st.just(0)),
    st.tuples(st.just("restart"), st.booleans(), st.just(0))), min_size=1, max_size=30)


@pytest.mark.parametrize("mode", psoup.MODES)
@settings(max_examples=12)
@given(ops=OPS)
def test_restart_from_a_checkpoint_answers_as_before(tmp_path_factory: pytest.TempPathFactory,
                                                     mode: ModeName,
                                                     ops: list[tuple[str, Any, int]]) -> None:
    """Every kind of query (selections, windows, DISTINCT, aggregates with and without
    GROUP BY, a join), cursors taken before a restart, slots freed and reused, chunks
    expired, checkpoints anywhere: after each restart (a clean one or a crash), and
    after more calls on the restarted engine, every answer equals an engine's that never
    restarted."""
    twin = Twin(tmp_path_factory.mktemp("db") / "state", mode)
    try:
        for sql in QUERIES[:4]:
            twin.register(sql)
        for op, a, b in ops:
            if op == "insert":
                twin.insert(a, b)
            elif op == "register":
                twin.register(QUERIES[a])
            elif op == "unregister" and twin.handles:
                twin.unregister(a)
            elif op == "checkpoint":
                twin.durable.checkpoint()
            elif op == "remember":
                twin.remember()
            elif op == "restart":
                twin.restart(crash=bool(a))
                twin.check()
        twin.durable.checkpoint()
        twin.insert(1, 20)
        twin.restart()
        twin.check()
    finally:
        twin.close()


@pytest.mark.parametrize("crash", [False, True])
@pytest.mark.parametrize("mode", psoup.MODES)
def test_calls_between_a_cut_and_its_manifest_are_repaired_by_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: ModeName, crash: bool) -> None:
    """While a checkpoint writes its files, other calls change the chunks it holds (bits
    of a query registered into a freed slot, of one unregistered, the last chunk filled,
    chunks expired): the files are then part before, part after them, and the log after
    the cut makes the restart exact, after a crash as after a clean stop."""
    twin = Twin(tmp_path / "state", mode)
    for sql in QUERIES:
        twin.register(sql)
    for i in range(12):
        twin.insert(i, 40)
    written = {"files": 0}
    real = checkpoints._write_array

    def meddling(path: Path, array: Any) -> None:
        written["files"] += 1
        if written["files"] == 3:                 # part way through the files
            twin.unregister(0)
            twin.register("SELECT name FROM R WHERE a <= 2")    # the freed slot
            twin.unregister(2)
            for i in range(5):
                twin.insert(100 + i, 45)
        real(path, array)
    monkeypatch.setattr(checkpoints, "_write_array", meddling)
    twin.durable.checkpoint()
    monkeypatch.undo()
    assert written["files"] > 3
    twin.check()
    twin.restart(crash=crash)
    twin.check()
    twin.insert(7, 30)
    twin.register(QUERIES[2])
    twin.check()
    twin.close()


@pytest.mark.parametrize("where", ["files", "manifest"])
def test_a_checkpoint_cut_short_leaves_the_previous_one_and_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """A checkpoint that fails between its files, or before its manifest, raises and
    changes nothing that counts: the previous checkpoint and the log after it stay in
    use, and a restart (after a crash right then, or after more writes) has everything."""
    twin = Twin(tmp_path / "state", "partial")
    for sql in QUERIES:
        twin.register(sql)
    for i in range(8):
        twin.insert(i, 30)
    twin.durable.checkpoint()                               # the previous one
    for i in range(8, 14):
        twin.insert(i, 30)
    folder = twin.path / "checkpoint"
    before = sorted(p.name for p in folder.iterdir())
    real = checkpoints._write_file
    count = {"files": 0}

    def failing(path: Path, data: Any) -> None:
        count["files"] += 1
        if (where == "files" and count["files"] == 4) or \
                (where == "manifest" and path.name.startswith("manifest")):
            raise OSError(28, "No space left on device")
        real(path, data)
    monkeypatch.setattr(checkpoints, "_write_file", failing)
    with pytest.raises(OSError, match="No space"):
        twin.durable.checkpoint()
    monkeypatch.undo()
    assert sorted(p.name for p in folder.iterdir()) == before, "its own files removed"
    twin.check()
    twin.restart(crash=True)
    twin.check()
    assert sorted(p.name for p in folder.iterdir()) == before
    twin.insert(99, 30)
    twin.durable.checkpoint()                  # the next one works
    twin.restart(crash=True)
    twin.check()
    twin.close()


CHILD = """
import sys, time
import numpy as np
import psoup
from psoup.journal import checkpoint
eng = psoup.Engine(path=sys.argv[1], chunk_rows=64, sync="off")
eng.execute("CREATE STREAM R (a INT, b FLOAT)")
handles = [eng.register(f"SELECT a FROM R WHERE a > {k}") for k in range(0, 100, 7)]
handles.append(eng.register("SELECT COUNT(*), SUM(a) FROM R WHERE b < 0.5"))
gen = np.random.default_rng(5)
def batch(i):
    eng.insert("R", {"a": gen.integers(0, 100, 500), "b": gen.random(500)}, ts=float(i))
for i in range(10):
    batch(i)
eng.checkpoint()
for i in range(10, 20):
    batch(i)
real, count = checkpoint._write_array, [0]
def slow(path, array):
    count[0] += 1
    if count[0] == 5:
        batch(20)                  # acknowledged after the cut, before the kill
        print(" ".join(handles), flush=True)
        time.sleep(60)
    real(path, array)
checkpoint._write_array = slow
eng.checkpoint()
"""


def test_sigkill_in_the_middle_of_a_checkpoint_restarts_from_the_previous_one(
        tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    handles = child.stdout.readline().split()
    assert handles, "the child reached the middle of its checkpoint"
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    assert [p.name for p in (tmp_path / "checkpoint").glob("manifest-*")] == \
        ["manifest-00000001.mp"]
    half = {p.name for p in (tmp_path / "checkpoint").iterdir() if p.name.endswith(".2.raw")}
    assert half, "the second checkpoint had written some files"
    gen = np.random.default_rng(5)
    cols = [{"a": gen.integers(0, 100, 500), "b": gen.random(500)} for _ in range(21)]
    a = np.concatenate([c["a"] for c in cols])
    b = np.concatenate([c["b"] for c in cols])
    with psoup.Engine(path=str(tmp_path), chunk_rows=64) as back:
        back._check()
        for k, handle in zip(range(0, 100, 7), handles, strict=False):
            assert back.invoke(handle, now=1e9).tuple_ids.tolist() == \
                np.flatnonzero(a > k).tolist()
        assert back.invoke(handles[-1], now=1e9).rows == \
            [(int((b < 0.5).sum()), int(a[b < 0.5].sum()))]
        assert back.stats()["streams"]["R"]["rows_total"] == 21 * 500
    assert not half & {p.name for p in (tmp_path / "checkpoint").iterdir()}, "removed"


@pytest.mark.parametrize("mode", ["partial", "complete"])
def test_background_checkpoints_beside_a_writer_lose_and_duplicate_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: ModeName) -> None:
    """Automatic checkpoints run on their own thread (slowed here, so that many of
    them overlap the calls) while one thread inserts keyed batches and another
    registers, unregisters and invokes: no insert waits for a checkpoint's files, and
    after a crash every acknowledged batch is back once, every answer as an engine's
    that never stopped."""
    real = checkpoints._write_array

    def slow(path: Path, array: Any) -> None:
        time.sleep(0.0005)
        real(path, array)
    monkeypatch.setattr(checkpoints, "_write_array", slow)
    path = tmp_path / "state"
    eng = psoup.Engine(path=str(path), mode=mode, chunk_rows=32, sync="off",
                       checkpoint_bytes=20_000)
    eng.execute("CREATE STREAM R (a INT, b INT) RETAIN 3000 ROWS")
    fixed = [eng.register(f"SELECT a, b FROM R WHERE a > {k}") for k in (10, 50, 90)]
    fixed.append(eng.register("SELECT b, COUNT(*) FROM R WHERE a < 40 GROUP BY b"))
    batches = [{"a": np.random.default_rng(i).integers(0, 100, 50),
                "b": np.random.default_rng(i + 7).integers(0, 5, 50)} for i in range(600)]
    stop = threading.Event()
    errors: list[BaseException] = []
    cuts = {"taken": 0}
    cut = Journal.cut

    def counting(self: Journal, *args: Any) -> Any:
        cuts["taken"] += 1
        return cut(self, *args)
    monkeypatch.setattr(Journal, "cut", counting)

    def churn() -> None:
        try:
            k = 0
            while not stop.is_set():
                h = eng.register(f"SELECT a FROM R WHERE b = {k % 5} AND a >= {k % 60}")
                eng.invoke(fixed[k % len(fixed)])
                eng.unregister(h)
                k += 1
        except BaseException as exc:       # reported below, in the test's thread
            errors.append(exc)
    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for i, cols in enumerate(batches):
            eng.insert("R", cols, ts=float(i), producer="p", seq=i)
    finally:
        stop.set()
        churner.join()
    assert not errors, errors
    assert cuts["taken"] >= 2, "checkpoints ran beside the writer"
    checkpointed(eng)
    assert eng.stats()["durability"]["checkpoint_error"] is None
    late = eng.register("SELECT a FROM R WHERE b = 3")
    copy = tmp_path / "crashed"
    shutil.copytree(path, copy, ignore=shutil.ignore_patterns("lock"))
    eng.close()
    ref = psoup.Engine(mode=mode, chunk_rows=32)
    ref.execute("CREATE STREAM R (a INT, b INT) RETAIN 3000 ROWS")
    for i, cols in enumerate(batches):
        ref.insert("R", cols, ts=float(i))
    want = [ref.register(sql) for _, sql in eng.queries()]
    with psoup.Engine(path=str(copy), mode=mode, chunk_rows=32) as back:
        back._check()
        assert back.stats()["streams"]["R"]["rows_total"] == 600 * 50
        assert back.last_seq("p") == 599
        for handle, other in zip([*fixed, late], want, strict=True):
            assert _answer(back.invoke(handle, now=1e9)) == _answer(ref.invoke(other, now=1e9))
        again = back.insert("R", batches[-1], ts=599.0, producer="p", seq=599)
        assert again[0] == 599 * 50, "a batch sent again is recognised, not applied twice"


@pytest.mark.parametrize("mode", psoup.MODES)
def test_an_engine_opened_with_other_chunks_takes_the_tuples_the_ordinary_way(
        tmp_path: Path, mode: ModeName) -> None:
    """The files hold chunks of the checkpoint's `chunk_rows`; an engine opened with
    another size inserts the retained tuples again, every query registered first, and
    answers as before. What left retention was archived at the checkpoint's cut."""
    twin = Twin(tmp_path / "state", mode)
    for sql in QUERIES:
        twin.register(sql)
    for i in range(15):
        twin.insert(i, 37)
    twin.durable.checkpoint()
    twin.insert(99, 20)
    twin.durable.close()
    archived = psoup.Engine(path=str(twin.path), mode=mode, chunk_rows=CHUNK * 4,
                            clock=twin._clock)
    twin.durable = archived
    twin.check()
    twin.close()
