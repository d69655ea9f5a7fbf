"""Historical evaluation and hybrid queries (issue 6): standing queries evaluated over the
archive by one Spark pass, then answered over archive + memory with an exact boundary.

The oracle is DuckDB over every tuple inserted: each is either in the archive or still
in memory, so the hybrid answer must equal the query run over all of them. ROWS windows
count the tuples in memory only, as documented.
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.dataset  # noqa: F401  (pa.dataset)
import pyarrow.parquet  # noqa: F401  (pa.parquet)
import pytest

import psoup
from psoup.archive.sampling import in_order
from psoup.errors import PSoupError, QueryError
from psoup.options import ModeName
from tests.support import Clock

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

QUERIES = {
    "all": "SELECT a, t FROM R WHERE a > 5",
    "archive only": "SELECT a, b FROM R WHERE a >= 3 BEGIN 20 END 90",
    "across": "SELECT t FROM R WHERE a < 4 BEGIN 150 END 260",
    "memory only": "SELECT a FROM R WHERE a != 2 BEGIN NOW - 15 END NOW",
    "landmark": "SELECT DISTINCT t FROM R WHERE b < 0.5 BEGIN 100 END NOW",
    "grouped": "SELECT t, COUNT(*), SUM(a), MIN(b), MAX(a) FROM R WHERE a > 1 GROUP BY t",
    "rows": "SELECT a FROM R WHERE a > 0 BEGIN (NOW - 12 ROWS) END NOW",
}
DUCK = {
    "all": "SELECT a, t FROM src WHERE a > 5 ORDER BY ts, tid",
    "archive only": "SELECT a, b FROM src WHERE a >= 3 AND ts BETWEEN 20 AND 90 ORDER BY ts, tid",
    "across": "SELECT t FROM src WHERE a < 4 AND ts BETWEEN 150 AND 260 ORDER BY ts, tid",
    "memory only": "SELECT a FROM src WHERE a != 2 AND ts BETWEEN {now} - 15 AND {now} "
                   "ORDER BY ts, tid",
    "landmark": "SELECT t FROM src WHERE b < 0.5 AND ts BETWEEN 100 AND {now} "
                "GROUP BY t ORDER BY min(tid)",
    "grouped": "SELECT t, COUNT(*), SUM(a), MIN(b), MAX(a) FROM src WHERE a > 1 GROUP BY t "
               "ORDER BY t",
}


def _fill(eng: psoup.Engine, gen: np.random.Generator, start: float, batches: int,
          rows: dict[str, list[Any]]) -> None:
    """Insert `batches` batches of 10 rows, ts from `start`; record them in `rows`
    (column -> list: ts, tid, a, b, t)."""
    for i in range(batches):
        ts = start + i * 10 + np.arange(10, dtype=float)
        batch = {"a": gen.integers(0, 10, 10), "b": np.round(gen.random(10), 3),
                 "t": np.array([f"k{v}" for v in gen.integers(0, 4, 10)], dtype=object)}
        tids = eng.insert("R", batch, ts=ts)
        for name, values in (("ts", ts), ("tid", tids), *batch.items()):
            rows.setdefault(name, []).extend(values.tolist())


def _evaluated(state: Path, seed: int
               ) -> tuple[np.random.Generator, dict[str, list[Any]], psoup.Engine, dict[str, str]]:
    """A durable engine at `state` with QUERIES registered over 300 tuples (35 retained)
    and their history evaluated: (its generator, the tuples inserted, it, handles)."""
    gen = np.random.default_rng(seed)
    inserted: dict[str, list[Any]] = {}
    eng = psoup.Engine(path=str(state), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 35 ROWS")
    handles = {name: eng.register(sql) for name, sql in QUERIES.items()}
    _fill(eng, gen, 0, 30, inserted)
    eng.evaluate_history()
    return gen, inserted, eng, handles


def _tier_files(eng: psoup.Engine, handle: str) -> list[str]:
    """The segment files of the query's archive tier under tiers/, oldest first."""
    files: list[str] = eng.stats()["queries"][handle]["tier_files"]
    return files


def _meets(path: Path, begin: float, end: float) -> bool:
    """Whether the tier file at `path` holds a match stamped within [begin, end]."""
    ts = pa.parquet.read_table(path, columns=["ts"]).column("ts").to_numpy()
    return len(ts) > 0 and ts.max() >= begin and ts.min() <= end


def _no_job(eng: psoup.Engine) -> None:
    """Assert that the engine started no history job (after a restart: nothing was
    due to be evaluated again)."""
    with pytest.raises(PSoupError, match="its latest: none yet"):
        eng.history_status()


def _oracle(rows: dict[str, list[Any]]) -> duckdb.DuckDBPyConnection:
    """DuckDB with `src` = every tuple inserted (ts, tid, a, b, t)."""
    con = duckdb.connect()
    con.register("src", pa.table(rows))
    return con


def _check(eng: psoup.Engine, handles: dict[str, str], con: duckdb.DuckDBPyConnection,
           now: float) -> None:
    for name, sql in DUCK.items():
        want = [tuple(r) for r in con.execute(sql.format(now=now)).fetchall()]
        got = eng.invoke(handles[name], now=now).rows
        if name == "grouped":
            assert [g[:3] + g[4:] for g in got] == [w[:3] + w[4:] for w in want], name
            assert [g[3] for g in got] == pytest.approx([w[3] for w in want]), name
        else:
            assert got == want, name


@pytest.mark.parametrize("mode", psoup.MODES)
def test_hybrid_answers_equal_duckdb_over_archive_files_plus_memory(tmp_path: Path,
                                                                    mode: ModeName) -> None:
    gen = np.random.default_rng(5)
    clock = Clock(0.0)
    eng = psoup.Engine(path=str(tmp_path / "state"), mode=mode, clock=clock, chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 35 ROWS")
    handles = {name: eng.register(sql) for name, sql in QUERIES.items()}
    inserted: dict[str, list[Any]] = {}
    _fill(eng, gen, 0, 30, inserted)               # ts 0 .. 299; memory keeps ~35
    memory_before = eng.invoke(handles["all"], now=300.0).rows
    counts = eng.evaluate_history()
    assert set(counts) == set(handles.values())
    assert counts[handles["rows"]] > 0              # a tier is kept, though ROWS ignores it
    archive = pa.dataset.dataset(str(tmp_path / "state" / "archive" / "stream=R"),
                                 format="parquet").to_table()
    assert archive.num_rows >= 300 - 35 - 8        # all but memory (35 + a part chunk)
    _check(eng, handles, _oracle(inserted), 300.0)
    # the tier really answers: memory alone had far fewer rows
    assert len(eng.invoke(handles["all"], now=300.0).rows) > 3 * len(memory_before)
    # ROWS windows count the tuples in memory only: the 12 newest
    assert eng.invoke(handles["rows"], now=300.0).tuple_ids.min() >= 300 - 12
    eng._check()

    # more data: tuples leave memory after the evaluation, and the tier follows them
    _fill(eng, gen, 300, 12, inserted)
    eng.commit()
    _check(eng, handles, _oracle(inserted), 420.0)
    eng._check()
    eng.close()


def test_matches_go_through_files_not_through_sparks_driver(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executors write the matches, already as one file per query; the driver
    collects nothing (a billion archived tuples' matches would pass
    spark.driver.maxResultSize), psoup writes no segment (it renames those the
    executors wrote), and the staging files are gone once the job ends, done or
    failed."""
    from pyspark.sql import DataFrame

    from psoup.spark import history

    def collected(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("history collected its matches through Spark's driver")

    def written(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("psoup wrote a segment: the executors should have")

    for name in ("toArrow", "_collect_as_arrow", "collect", "toPandas"):
        monkeypatch.setattr(DataFrame, name, collected, raising=False)
    monkeypatch.setattr(history, "write_runs", written)     # psoup's process only
    gen = np.random.default_rng(8)
    eng = psoup.Engine(path=str(tmp_path / "state"), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 35 ROWS")
    handles = {name: eng.register(sql) for name, sql in QUERIES.items()}
    inserted: dict[str, list[Any]] = {}
    _fill(eng, gen, 0, 30, inserted)
    eng.evaluate_history()
    _check(eng, handles, _oracle(inserted), 300.0)
    staging = tmp_path / "state" / "archive" / ".history"
    assert not staging.exists()

    monkeypatch.setattr(history, "receive", lambda *a: 1 / 0)
    _fill(eng, gen, 300, 12, inserted)
    h = eng.register("SELECT a FROM R WHERE a > 2")
    with pytest.raises(ZeroDivisionError):
        eng.evaluate_history([h])
    assert not staging.exists()
    eng.close()


def test_tiers_stay_on_disk_and_a_window_reads_only_the_segments_it_meets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Spark pass's matches go to segment files (here at most 7 a file, so each
    query's history is several), the engine keeps an index of them, not the matches,
    and an invocation reads only the files whose ts range meets its window; answers
    equal DuckDB across segment boundaries, before and after a restart. The window is
    read after the restart, when no file is in the cache."""
    from psoup.archive import tiers as tiers_module
    from psoup.spark import history
    monkeypatch.setattr(history, "SEGMENT_ROWS", 7)
    reads: list[str] = []
    real_read = tiers_module.ArchiveTiers._read

    def counted(self: Any, stream: str, seg: Any, *limit: Any) -> Any:
        reads.append(seg.name)
        return real_read(self, stream, seg, *limit)

    monkeypatch.setattr(tiers_module.ArchiveTiers, "_read", counted)
    state = tmp_path / "s"
    gen, inserted, eng, handles = _evaluated(state, 13)
    files = _tier_files(eng, handles["all"])
    assert len(files) >= 3 and eng.stats()["memory"]["history"] == 0   # an index only
    for name in files:           # each in the sampled layout, its row groups in order
        table = pa.parquet.read_table(state / "tiers" / name)
        ids = in_order(table, "tupleID").column("tupleID").to_numpy()
        assert len(ids) <= 7 and (np.diff(ids) > 0).all(), name
        assert sorted(table.column("tupleID").to_pylist()) == ids.tolist()
    _check(eng, handles, _oracle(inserted), 300.0)
    eng._check()
    eng.close()

    reopened = psoup.Engine(path=str(state), clock=Clock(300.0), chunk_rows=8)
    assert _tier_files(reopened, handles["all"]) == files
    assert reopened.stats()["memory"]["history"] == 0
    # a window over ts 150..260 meets only the segments of "across" that overlap it
    reads.clear()
    reopened.invoke(handles["across"], now=300.0)
    across = _tier_files(reopened, handles["across"])
    meets = [name for name in across if _meets(state / "tiers" / name, 150, 260)]
    assert reads == meets and len(meets) < len(across)
    with monkeypatch.context() as m:                     # the second time from the cache
        m.setattr(pa.parquet, "read_table", lambda *a, **k: 1 / 0)
        again = reopened.invoke(handles["across"], now=300.0)
    assert again.rows == reopened.invoke(handles["across"], now=300.0).rows
    assert 0 < reopened.stats()["memory"]["history"] <= tiers_module.CACHE_BYTES
    _check(reopened, handles, _oracle(inserted), 300.0)
    reopened._check()
    reopened.close()


def test_an_invocation_reads_the_tier_files_it_needs_off_the_engines_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The segment files a window needs are read before the engine's lock is taken for
    the answer (writers go on meanwhile); the answer, from the cache then, equals
    DuckDB's; a file damaged after it was indexed is still named by the invocation.
    Each part runs on an engine just opened, when no file is in the cache."""
    from psoup.archive import tiers as tiers_module
    from psoup.spark import history
    monkeypatch.setattr(history, "SEGMENT_ROWS", 7)
    state = tmp_path / "s"
    gen, inserted, eng, handles = _evaluated(state, 19)
    eng.close()
    eng = psoup.Engine(path=str(state), clock=Clock(300.0), chunk_rows=8)
    locked: list[bool] = []
    real = tiers_module.load_segment

    def load(*args: Any, **kwargs: Any) -> Any:
        locked.append(eng._lock.held())
        return real(*args, **kwargs)
    monkeypatch.setattr(tiers_module, "load_segment", load)
    _check(eng, handles, _oracle(inserted), 300.0)
    assert locked and not any(locked), "every file was read off the lock"
    eng.close()
    eng = psoup.Engine(path=str(state), clock=Clock(300.0), chunk_rows=8)
    victim = next(name for name in _tier_files(eng, handles["across"])
                  if _meets(state / "tiers" / name, 150, 260))
    (state / "tiers" / victim).write_bytes(b"not parquet")
    with pytest.raises(PSoupError, match=victim):
        eng.invoke(handles["across"], now=300.0)
    eng.close()


def test_the_executors_write_one_sorted_file_per_query_and_psoup_only_moves_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`write_segments` (a task of the write stage) cuts its sorted matches into one
    file per slot of at most `segment_rows`, in the sampled layout, the sampled slots'
    metadata in theirs, and lists them in its manifest; `receive` moves the files the
    manifest names into place without opening one (an attempt's files the manifest
    does not name stay behind), gives each slot its segments in tupleID order, with
    their ranges, and refuses overlapping segments of one slot."""
    import pyarrow.parquet as pq

    from psoup.archive.tiers import SAMPLED_KEY, Sampled
    from psoup.query.model import StreamSchema
    from psoup.spark import history

    schema = StreamSchema("R", (("a", "int"),))
    staging = tmp_path / "staging"
    how = Sampled(((-np.inf, 0.5),), 30, 15.0)

    def matches(slots: list[int], ids: list[int]) -> pa.RecordBatch:
        return pa.record_batch({"slot": slots, "tupleID": ids, "ts": [i / 2 for i in ids],
                                "a": [10 * i for i in ids],
                                "psoup_sample": pa.array([i % 7 for i in ids], pa.int16())})

    def task(*batches: pa.RecordBatch) -> None:      # one task: its manifest committed
        rows = list(history.write_segments(iter(batches), str(staging),
                                           history.segment_schema(schema), 2,
                                           {3: how.to_json()}))
        (staging / "manifest").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_batches(rows, history.MANIFEST_SCHEMA),
                       staging / "manifest" / f"part-{len(rows)}-{id(rows)}.parquet")

    task(matches([1, 1], [4, 6]), matches([1, 3, 3], [7, 2, 8]), matches([3], [20]))
    task(matches([], []))
    with pytest.raises(ValueError, match="out of"):     # not sorted: a bug, not repaired
        list(history.write_segments(iter([matches([1, 1], [4, 6]), matches([3, 1], [2, 4])]),
                                    str(staging), history.segment_schema(schema), 2, {}))
    orphans = {p for p in staging.rglob("*.parquet") if "manifest" not in p.parts}
    assert len(orphans) == 5      # the four the first task committed, the failed one's
    def writer(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError("psoup wrote a segment: the executors should have")

    monkeypatch.setattr(pq, "ParquetWriter", writer)
    real_read = pq.read_table

    def read(source: Any, *args: Any, **kwargs: Any) -> Any:
        assert "manifest" in Path(source).parts, f"psoup opened a segment: {source}"
        return real_read(source, *args, **kwargs)

    monkeypatch.setattr(pq, "read_table", read)
    got = history.receive(staging, tmp_path / "in", schema, [1, 2, 3], {3: how})
    monkeypatch.undo()
    assert set(got) == {1, 2, 3} and got[2] == []
    assert [(s.first, s.last, s.lo, s.hi, s.rows) for s in got[1]] == [(4, 6, 2.0, 3.0, 2),
                                                                       (7, 7, 3.5, 3.5, 1)]
    assert [(s.first, s.last, s.rows, s.sample) for s in got[3]] == [(2, 8, 2, how),
                                                                    (20, 20, 1, how)]
    left = {p for p in staging.rglob("*.parquet") if "manifest" not in p.parts}
    assert len(left) == 1 and left < orphans            # the failed attempt's file only
    back = pq.read_table(got[3][0].name)
    assert back.schema == history.segment_schema(schema).with_metadata(back.schema.metadata)
    assert Sampled.from_json(back.schema.metadata[SAMPLED_KEY.encode()]) == how
    assert not pq.read_table(got[1][0].name).schema.metadata    # not sampled: no metadata
    draws = back.sort_by("tupleID").column("psoup_sample").to_pylist()
    assert draws == [2, 1]                                      # the archive's draws kept
    back = in_order(back, "tupleID")
    assert back.column("a").to_pylist() == [20, 80]
    assert got[1][0].name == str(tmp_path / "in" / "1" / f"{4:020d}-{6:020d}.parquet")

    shutil.rmtree(staging)
    task(matches([1, 1], [4, 6]))
    task(matches([1], [5]))                                        # inside 4..6
    with pytest.raises(PSoupError, match="slot 1 overlap"):
        history.receive(staging, tmp_path / "again", schema, [1, 2, 3])


def test_a_job_whose_segments_cannot_be_moved_into_place_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installing a job's segments is all or nothing: a rename that fails on the second
    query leaves no tier visible (the first query's is dropped again; its file goes at
    the next checkpoint), the job failed with the error; the next job succeeds."""
    import pathlib
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
    handles = [eng.register("SELECT a FROM R WHERE a > 2"),
               eng.register("SELECT a FROM R WHERE a < 7")]
    inserted: dict[str, list[Any]] = {}
    _fill(eng, np.random.default_rng(4), 0, 6, inserted)
    before = [eng.invoke(h, now=100.0).rows for h in handles]
    real = pathlib.Path.replace
    moved: list[Any] = []

    def second_fails(self: pathlib.Path, target: Any) -> pathlib.Path:
        if moved:
            raise OSError(28, "No space left on device")
        moved.append(target)
        return real(self, target)

    monkeypatch.setattr(pathlib.Path, "replace", second_fails)
    with pytest.raises(OSError, match="No space left"):
        eng.evaluate_history()
    monkeypatch.undo()
    assert moved and [eng.invoke(h, now=100.0).rows for h in handles] == before
    assert not any(_tier_files(eng, h) for h in handles)
    assert not (tmp_path / "s" / "tiers" / ".incoming").exists()
    eng.checkpoint()                    # the file moved before the failure: named by no log
    assert not list((tmp_path / "s" / "tiers").rglob("*.parquet"))
    eng._check()
    counts = eng.evaluate_history()
    want = [sum(1 for a in inserted["a"] if a > 2), sum(1 for a in inserted["a"] if a < 7)]
    assert [len(eng.invoke(h, now=100.0).rows) for h in handles] == want
    assert all(counts[h] > 0 for h in handles)
    eng.close()


def test_a_damaged_segment_is_named_at_invocation(tmp_path: Path) -> None:
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
    h = eng.register("SELECT a FROM R WHERE a >= 0")
    _fill(eng, np.random.default_rng(3), 0, 6, {})
    eng.evaluate_history([h])
    name = _tier_files(eng, h)[0]
    (tmp_path / "s" / "tiers" / name).write_bytes(b"not parquet")
    with pytest.raises(PSoupError, match=f"tier file .*{name}.* cannot be read"):
        eng.invoke(h, now=100.0)
    eng.close()


def test_one_spark_pass_per_stream_evaluates_every_query(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from psoup.spark import history
    calls: list[int] = []
    real = history.evaluate

    def counting(*a: Any, **k: Any) -> Any:
        calls.append(len(a[4]))
        return real(*a, **k)
    monkeypatch.setattr(history, "evaluate", counting)
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
    handles = [eng.register(f"SELECT a FROM R WHERE a > {k}") for k in range(40)]
    inserted: dict[str, list[Any]] = {}
    _fill(eng, np.random.default_rng(1), 0, 8, inserted)
    counts = eng.evaluate_history()
    assert calls == [40]
    # a > k matches fewer tuples as k grows; all 80 tuples are reachable again
    got = [counts[h] for h in handles]
    assert got == sorted(got, reverse=True) and got[-1] == 0
    retained = inserted["a"][-10:]                              # RETAIN 10 ROWS
    assert len(eng.invoke(handles[0], now=100.0).rows) == counts[handles[0]] + sum(
        1 for a in retained if a > 0)
    assert eng.evaluate_history() == {} and calls == [40]     # nothing left to evaluate
    assert eng.evaluate_history(handles[:2]) == {h: counts[h] for h in handles[:2]}
    assert calls == [40]                                         # already evaluated
    eng.close()


def test_history_needs_a_durable_engine_and_a_selection_query(tmp_path: Path) -> None:
    eng = psoup.Engine()
    eng.execute("CREATE STREAM R (a INT)")
    with pytest.raises(PSoupError, match="history needs a durable engine"):
        eng.evaluate_history()
    durable = psoup.Engine(path=str(tmp_path / "d"))
    durable.execute("CREATE STREAM R (a INT)")
    durable.execute("CREATE STREAM S (a INT)")
    join = durable.register("SELECT R.a FROM R, S WHERE R.a = S.a")
    with pytest.raises(QueryError, match="selection queries only"):
        durable.evaluate_history([join])
    durable.close()


def test_history_is_evaluated_again_after_a_restart_and_never_answered_short(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tier its job failed to save (a full disk): the reopened engine evaluates the
    history of the queries that had one again, by itself, and refuses to answer them
    short meanwhile (HistoryPending); then the answer is the one from before the
    restart."""
    from psoup.archive.tiers import ArchiveTiers

    def full(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ArchiveTiers, "write", full)
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
    h = eng.register("SELECT a, t FROM R WHERE a > 3")
    memory_only = eng.register("SELECT a FROM R WHERE a < 3")
    _fill(eng, np.random.default_rng(2), 0, 6, {})
    eng.evaluate_history([h])
    whole = eng.invoke(h, now=100.0).rows
    short = eng.invoke(memory_only, now=100.0).rows
    eng.close()
    monkeypatch.undo()
    again = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    job = again.history_status()
    assert job["state"] in ("running", "done")
    if job["state"] == "running":
        with pytest.raises(psoup.HistoryPending, match="evaluated again"):
            again.invoke(h, now=100.0)
    assert again.invoke(memory_only, now=100.0).rows == short     # no history: answered
    again.history_wait(job["id"])
    assert again.invoke(h, now=100.0).rows == whole
    again.unregister(h)
    again.close()
    third = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    _no_job(third)                                # nothing left to evaluate
    third.close()


@pytest.mark.parametrize("mode", psoup.MODES)
def test_a_checkpoint_saves_the_tiers_and_a_restart_restores_them(tmp_path: Path,
                                                                  mode: ModeName) -> None:
    """Tiers saved at checkpoints (each checkpoint saves the matches new
    since the last) come back at the next start without a Spark job, follow the horizon
    from there, and equal DuckDB over archive plus memory; an unregistered query's
    files go at the next checkpoint."""
    state = tmp_path / "s"
    gen = np.random.default_rng(11)
    inserted: dict[str, list[Any]] = {}
    eng = psoup.Engine(path=str(state), mode=mode, clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 35 ROWS")
    handles = {name: eng.register(sql) for name, sql in QUERIES.items()}
    _fill(eng, gen, 0, 30, inserted)
    eng.evaluate_history()                         # saved, and named in the log
    _check(eng, handles, _oracle(inserted), 300.0)
    _fill(eng, gen, 300, 6, inserted)
    eng.close()
    saved = sorted(p.relative_to(state / "tiers").as_posix()
                   for p in (state / "tiers").rglob("*.parquet"))
    assert saved and {p.split("/")[0] for p in saved} <= set(handles.values())
    opened = [p for p in (state / "tiers").rglob("*") if p.stat().st_mode & 0o077]
    assert not opened, "a data directory's files are its owner's only"

    for restart in range(2):
        eng = psoup.Engine(path=str(state), mode=mode, clock=Clock(0.0), chunk_rows=8)
        _no_job(eng)                               # restored, not evaluated again
        _check(eng, handles, _oracle(inserted), 360.0 + 60 * restart)
        _fill(eng, gen, 360 + 60 * restart, 6, inserted)   # the tiers follow the horizon
        _check(eng, handles, _oracle(inserted), 420.0 + 60 * restart)
        eng._check()
        eng.checkpoint()                           # saves what the tiers gained
        eng.close()
    assert len(list((state / "tiers").rglob("*.parquet"))) > len(saved)

    eng = psoup.Engine(path=str(state), mode=mode, clock=Clock(0.0), chunk_rows=8)
    gone = handles["all"]
    eng.unregister(gone)
    eng.checkpoint()
    assert not (state / "tiers" / gone).exists()
    assert not list((state / "tiers").rglob("*.tmp"))
    eng.close()


def test_checkpoints_merge_small_segments_so_files_do_not_pile_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each checkpoint saves what the tiers gained since the last; rewritten together
    with the last segments while they are no larger than what joins them (and within
    MERGE_ROWS), a tier keeps a few files, not one per checkpoint; the files replaced
    are removed, the answers equal DuckDB before and after a restart."""
    from psoup.archive import tiers as tiers_module
    from psoup.spark import history
    monkeypatch.setattr(history, "SEGMENT_ROWS", 7)
    monkeypatch.setattr(tiers_module, "MERGE_ROWS", 40)
    state = tmp_path / "s"
    gen, inserted, eng, handles = _evaluated(state, 17)
    from_spark = len(_tier_files(eng, handles["all"]))
    for k in range(16):                         # a checkpoint every 10 tuples
        _fill(eng, gen, 300 + 10 * k, 1, inserted)
        eng.checkpoint()
        eng._check()
    on_disk = sorted(p.relative_to(state / "tiers").as_posix()
                     for p in (state / "tiers").rglob("*.parquet"))
    named = sorted(name for h in handles.values() for name in _tier_files(eng, h))
    assert on_disk == named, "the files replaced are gone"
    rows = [pa.parquet.read_metadata(state / "tiers" / name).num_rows for name in on_disk]
    assert max(rows) <= 40
    # one file per checkpoint would be from_spark + 16 (the query matches in each)
    kept = _tier_files(eng, handles["all"])
    assert len(kept) <= from_spark + 6, kept
    _check(eng, handles, _oracle(inserted), 460.0)
    eng.close()
    eng = psoup.Engine(path=str(state), clock=Clock(460.0), chunk_rows=8)
    _no_job(eng)                                   # restored, not evaluated again
    _check(eng, handles, _oracle(inserted), 460.0)
    eng.close()


def test_history_through_the_server_and_the_command_line(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from psoup.cli.main import main
    from psoup.server import Server

    monkeypatch.setenv("PSOUP_CONFIG_DIR", str(tmp_path / "config"))
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    srv = Server(eng, port=0, token="tok")
    host, port = srv.start_in_thread()
    try:
        client = psoup.Client(f"{host}:{port}", token="tok")
        client.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
        wide = client.register("SELECT a FROM R WHERE a >= 0")
        narrow = client.register("SELECT a FROM R WHERE a > 100")
        client.insert("R", [(i % 7, 0.5, "x") for i in range(60)], ts=[float(i) for i in range(60)])
        assert len(client.invoke(wide, now=60.0)) == 10
        done = CliRunner().invoke(main, ["--server", f"{host}:{port}", "--token", "tok",
                                         "history", wide])
        assert done.exit_code == 0, done.output
        assert f"{wide}  " in done.output and "50" in done.output    # 50 tuples left memory
        # progress on stderr though it is no terminal: seconds, then the job's step
        assert re.search(r"^\d+ s(, \d+/\d+ Spark tasks)?: \S", done.stderr, re.M), done.stderr
        assert len(client.invoke(wide, now=60.0)) == 60
        assert len(client.invoke(narrow, now=60.0)) == 0
        assert client.evaluate_history() == {narrow: 0}               # the rest, by default
        client.close()
    finally:
        srv.stop()
        eng.close()


def test_a_corrupt_archive_file_is_named_and_nothing_is_applied(tmp_path: Path) -> None:
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
    eng.execute("CREATE STREAM Q (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
    hq = eng.register("SELECT a FROM Q WHERE a >= 0")
    hr = eng.register("SELECT a FROM R WHERE a >= 0")
    gen = np.random.default_rng(3)
    _fill(eng, gen, 0, 6, {})
    for i in range(6):
        eng.insert("Q", {"a": np.arange(10), "b": np.zeros(10), "t": np.array(["q"] * 10,
                                                                              dtype=object)},
                   ts=np.arange(10.0) + 10 * i)
    eng.checkpoint()                               # the archive's buffers written too
    victim = sorted((tmp_path / "s" / "archive" / "stream=R").rglob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:40])                 # a torn file
    before = (eng.invoke(hq, now=100.0).rows, eng.invoke(hr, now=100.0).rows)
    with pytest.raises(PSoupError, match=r"history of stream R: \S+stream=R\S+/part-\d+-\d+"
                                         r"\.parquet is not a readable Parquet file"):
        eng.evaluate_history()
    assert not any(q["history"] for q in eng.stats()["queries"].values())   # not even Q's
    assert (eng.invoke(hq, now=100.0).rows, eng.invoke(hr, now=100.0).rows) == before
    assert eng.evaluate_history([hq]) == {hq: 50}                # Q's archive is fine
    eng.close()


@pytest.mark.parametrize("damage, message", [
    ("missing", r"history of stream R: \S+\.parquet: no column 'b'"),
    ("type", r"column 'a' holds string, but stream 'R' declares it INT"),
    ("unsorted", r"ts decreases within \S+part-00000000000000000001-00000000000000000003"
                 r"\.parquet \(from 9001\.0 to 9000\.0\)"),
])
def test_a_bad_archive_file_is_named_and_nothing_is_applied(tmp_path: Path, damage: str,
                                                            message: str) -> None:
    import pyarrow.parquet as pq
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
    h = eng.register("SELECT a FROM R WHERE a >= 0")
    _fill(eng, np.random.default_rng(4), 0, 4, {})
    eng.checkpoint()                               # the archive's buffers written too
    columns = {"ts": [9001.0, 9000.0, 9002.0] if damage == "unsorted" else [1.0, 2.0, 3.0],
               "tuple_id": [1, 2, 3], "a": [1, 2, 3], "b": [0.5] * 3, "t": ["x"] * 3}
    if damage == "missing":
        del columns["b"]
    if damage == "type":
        columns["a"] = ["1", "2", "3"]
    folder = tmp_path / "s" / "archive" / "stream=R" / "date=1970-01-02"
    folder.mkdir()
    pq.write_table(pa.table(columns), folder / "part-00000000000000000001-00000000000000000003"
                                                ".parquet")
    before = eng.invoke(h, now=100.0).rows
    with pytest.raises(PSoupError, match=message):
        eng.evaluate_history()
    assert not eng.stats()["queries"][h]["history"]
    assert eng.invoke(h, now=100.0).rows == before
    eng.close()


def test_unregistering_with_history_around(tmp_path: Path) -> None:
    """A join and a query with history unregistered while tiers exist; the stream's
    horizon hook goes with the last tier on it."""
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
    eng.execute("CREATE STREAM S (a INT)")
    h = eng.register("SELECT a FROM R WHERE a > 3")
    join = eng.register("SELECT R.a FROM R, S WHERE R.a = S.a")
    _fill(eng, np.random.default_rng(6), 0, 4, {})
    eng.evaluate_history([h])
    eng.unregister(join)
    assert eng.stats()["queries"][h]["history"]
    eng._check()                        # the hook stays while a tier is on the stream
    eng.unregister(h)
    assert eng.stats()["memory"]["history"] == 0
    eng._check()                        # ... and goes with the last one
    _fill(eng, np.random.default_rng(7), 100, 2, {})        # no hook, no tier: fine
    eng.close()


# ---------------------------------------------------------------- history as a background job


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """Hold every Spark pass of a history job until `gate.go` is set (`gate.started` is
    set once one waits), so a test acts while the job runs, without timing."""
    from psoup.spark import history
    real = history.evaluate
    started, go = threading.Event(), threading.Event()

    def held(*args: Any, **kwargs: Any) -> Any:
        started.set()
        assert go.wait(120), "the test never let the history job go on"
        return real(*args, **kwargs)

    monkeypatch.setattr(history, "evaluate", held)
    yield SimpleNamespace(started=started, go=go)
    go.set()


def _running(eng: psoup.Engine, job: str) -> bool:
    running: bool = eng.history_status(job)["state"] == "running"
    return running


def test_writers_and_readers_go_on_while_history_runs_and_the_answer_equals_duckdb(
        tmp_path: Path, gate: SimpleNamespace) -> None:
    gen = np.random.default_rng(8)
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 35 ROWS")
    handles = {name: eng.register(sql) for name, sql in QUERIES.items()}
    inserted: dict[str, list[Any]] = {}
    _fill(eng, gen, 0, 30, inserted)                     # ts 0 .. 299
    job = eng.history()
    assert gate.started.wait(60)
    for k in range(12):                                  # 120 tuples leave memory meanwhile
        _fill(eng, gen, 300 + 10 * k, 1, inserted)
        assert _running(eng, job), "an insert finished while the job ran"
        eng.invoke(handles["all"], now=400.0)
    late = eng.register("SELECT a, t FROM R WHERE a > 5")
    eng.unregister(handles.pop("rows"))
    eng.commit()
    assert _running(eng, job) and eng.history_status()["id"] == job
    gate.go.set()
    status = eng.history_wait(job, timeout=300)
    assert status["state"] == "done" and status["error"] is None
    assert set(status["result"]) == set(handles.values())       # not the unregistered one
    _check(eng, handles, _oracle(inserted), 420.0)
    eng._check()
    assert not eng.stats()["queries"][late]["history"]
    assert eng.evaluate_history() == {late: status["result"][handles["all"]]}
    assert eng.invoke(late, now=420.0).rows == eng.invoke(handles["all"], now=420.0).rows
    _fill(eng, gen, 420, 5, inserted)                    # the tiers keep following memory
    _check(eng, handles, _oracle(inserted), 470.0)
    eng._check()
    eng.close()


def test_one_job_at_a_time_and_a_cancelled_job_changes_nothing(tmp_path: Path,
                                                               gate: SimpleNamespace) -> None:
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
    h = eng.register("SELECT a, t FROM R WHERE a > 3")
    _fill(eng, np.random.default_rng(9), 0, 6, {})
    before = eng.invoke(h, now=100.0).rows
    job = eng.history()
    assert gate.started.wait(60)
    with pytest.raises(PSoupError, match=f"history job {job} is still running"):
        eng.history()
    assert eng.history_cancel(job)["id"] == job
    gate.go.set()                                        # Spark runs; its result is dropped
    status = eng.history_wait(job, timeout=300)
    assert status["state"] == "cancelled" and status["result"] is None
    assert eng.history_cancel(job)["state"] == "cancelled"        # again: nothing
    assert not eng.stats()["queries"][h]["history"]
    assert eng.invoke(h, now=100.0).rows == before
    eng._check()
    with pytest.raises(PSoupError, match="no history job 'nope'"):
        eng.history_status("nope")
    eng.close()


def test_a_failed_job_changes_nothing_and_says_why(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from psoup.spark import history

    def broken(*args: Any, **kwargs: Any) -> None:
        raise PSoupError("history of stream R: the archive is on fire")

    monkeypatch.setattr(history, "evaluate", broken)
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
    h = eng.register("SELECT a FROM R WHERE a >= 0")
    _fill(eng, np.random.default_rng(10), 0, 4, {})
    before = eng.invoke(h, now=100.0).rows
    status = eng.history_wait(eng.history(), timeout=60)
    assert status["state"] == "failed" and "archive is on fire" in status["error"]
    assert not eng.stats()["queries"][h]["history"]
    assert eng.invoke(h, now=100.0).rows == before
    _fill(eng, np.random.default_rng(11), 40, 2, {})     # no horizon hook left behind
    eng._check()
    with pytest.raises(PSoupError, match="archive is on fire"):
        eng.evaluate_history()                           # a new job may start at once
    eng.close()


def test_history_over_the_wire_answers_at_once_and_runs_off_the_writer(
        tmp_path: Path, gate: SimpleNamespace) -> None:
    from psoup.server import Server

    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=8)
    srv = Server(eng, port=0, token="tok")
    host, port = srv.start_in_thread()
    try:
        client = psoup.Client(f"{host}:{port}", token="tok")
        client.execute("CREATE STREAM R (a INT, b FLOAT, t TEXT) RETAIN 10 ROWS")
        h = client.register("SELECT a FROM R WHERE a >= 0")
        client.insert("R", [(i % 7, 0.5, "x") for i in range(60)],
                      ts=[float(i) for i in range(60)])
        with pytest.raises(PSoupError, match="'master' is not accepted.*--spark-master"):
            client._request("history", {"master": "local[1]"})
        job = client._request("history", {})["job"]          # {"op": "history"}: no args
        assert gate.started.wait(60)
        client.insert("R", [(1, 0.5, "y")], ts=60.0)          # the writer thread is free
        assert len(client.invoke(h, now=61.0)) == 10
        status = client.history_status(job)
        assert status["state"] == "running" and status["handles"] == 1
        gate.go.set()
        done = client.history_wait(job, timeout=300, poll=0.1)
        assert done["result"] == {h: 51}
        assert len(client.invoke(h, now=61.0)) == 61
        client.close()
    finally:
        gate.go.set()
        srv.stop()
        eng.close()


def test_spark_runs_below_the_servers_priority(spark: Any) -> None:
    """Spark's driver JVM, its executor threads and their Python workers run at
    niceness SPARK_NICENESS, so a history job yields the CPU to requests."""
    from pathlib import Path

    from pyspark import SparkContext

    from psoup.spark.session import SPARK_NICENESS
    spark.range(1000).selectExpr("sum(id)").collect()       # threads started since
    gateway = SparkContext._gateway
    assert gateway is not None                  # the session above started it
    pid = gateway.proc.pid
    nice: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            nice.append(int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]))
        except FileNotFoundError:        # the thread ended while we listed them
            continue
    assert nice and min(nice) >= SPARK_NICENESS


def test_job_status_never_calls_spark_on_the_callers_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A server answers history_status on its event loop under the engine lock, so
    status() must not wait on the JVM: Spark's task counts come from the job's own
    watcher thread, started by the first status() while the job runs."""
    import psoup.spark.jobs as jobs
    import psoup.spark.session as session

    callers: list[threading.Thread] = []

    def progress(group: str) -> tuple[int, int]:
        callers.append(threading.current_thread())
        return 3, 8

    monkeypatch.setattr(session, "group_progress", progress)
    monkeypatch.setattr(jobs, "PROGRESS_EVERY", 0.01)
    job = jobs.HistoryJob("j1", ["h"], ["R"])
    first = job.status()
    assert first["state"] == "running" and "tasks" not in first["progress"]
    for _ in range(500):
        if "tasks" in job.status()["progress"]:
            break
        threading.Event().wait(0.01)
    assert job.status()["progress"] == {"message": "", "tasks_done": 3, "tasks": 8}
    assert callers and threading.current_thread() not in callers
    job.end("done", {"h": 1})
    assert job._watcher is not None
    job._watcher.join(5)
    assert not job._watcher.is_alive()               # the watcher ends with the job
    assert "tasks" not in job.status()["progress"]
