"""The batch store of a stream probed in Spark's executors (psoup.archive.batches), with
the executors' task functions run in this process (psoup.spark.executors): random
streams split into micro-batches and partitions, random selection and aggregate queries
registered between batches (their earlier batches covered by the history pass; the
aggregates without GROUP BY answered from the totals of the part files wholly in their
window), each answer against DuckDB over the same rows and window; the store reopened
from disk gives the same answers; commits and sidecars are all-or-nothing."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from psoup.archive.batches import BatchStore
from psoup.errors import HistoryPending, PSoupError
from psoup.plans import SelectionPlan
from psoup.query import compile_statement
from psoup.query.model import TUPLE_ID, Query, StreamSchema
from psoup.results.answers import answer_from_batches
from psoup.spark.executors import cover, probe_part, summed_of
from tests.oracles import Oracle, answer_aggregate, rows_match
from tests.strategies import VALUES, aggregate_queries, queries, schemas

T0 = 1000.0


def ddl_of(name: str, columns: list[tuple[str, str]]) -> str:
    return f"CREATE STREAM {name} (" + ", ".join(f"{c} {t}" for c, t in columns) + ")"


def in_process(jobs: list[dict[str, Any]], task: Any) -> list[dict[str, Any]]:
    """The history pass's runner without Spark: one task over every job."""
    return [row for batch in task(iter([pa.RecordBatch.from_pylist(jobs)]))
            for row in batch.to_pylist()]


class Feed:
    """A stream's batches committed to a store as Spark's tasks would, in this process."""

    def __init__(self, folder: Path, schema: StreamSchema, ddl: str) -> None:
        self.folder, self.schema, self.ddl = folder, schema, ddl
        self.store = BatchStore(folder, dict(schema.columns), schema.retain_seconds)
        self.queries: dict[str, str] = {}
        self.next_batch = 0

    def summed(self) -> dict[str, list[str]]:
        """The aggregates without GROUP BY, whose part files keep totals."""
        return summed_of(self.schema, {h: _compiled(sql, self.schema)
                                       for h, sql in self.queries.items()})

    def commit(self, parts: list[list[tuple[Any, ...]]], ts: list[list[float]]) -> None:
        slots = {h: i for i, h in enumerate(sorted(self.queries))}
        listed = [(s, self.queries[h]) for h, s in slots.items()]
        summed = [(slots[h], c) for h, c in self.summed().items()]
        staging = self.store.staging()
        reports = []
        latest = self.store.latest_ts
        for p, (rows, stamps) in enumerate(zip(parts, ts, strict=True)):
            cols = {c: [r[i] for r in rows] for i, (c, _) in enumerate(self.schema.columns)}
            types = {c: pa.array([], type=_arrow(t)).type for c, t in self.schema.columns}
            batch = pa.record_batch({**{c: pa.array(v, type=types[c]) for c, v in cols.items()},
                                     "ts": pa.array(stamps, type=pa.float64())})
            report, = next(probe_part(iter([batch]), ddl=self.ddl, queries=listed,
                                      words=(len(slots) + 63) // 64, staging=str(staging),
                                      latest=-math.inf if latest is None else latest,
                                      commit_ts=0.0, summed=summed)).to_pylist()
            reports.append(dict(report, partition=p))
        self.store.commit(self.next_batch, staging, reports, slots, committed_at=0.0)
        self.next_batch += 1

    def cover(self) -> None:
        lacking = self.store.lacking(self.queries)
        cover(in_process, self.store, self.ddl, self.queries, lacking, self.summed())
        assert not self.store.lacking(self.queries)


def _arrow(ctype: Any) -> pa.DataType:
    from psoup.archive.layout import ARROW_TYPES
    return ARROW_TYPES[ctype]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Any, list[tuple[Any, ...]]]:
    columns, retain = draw(schemas())
    if retain is not None and retain[0] == "rows":
        retain = None                   # refused on such streams
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["batch", "batch", "register", "aggregate"]))
        if kind == "batch":
            parts = []
            for _ in range(draw(st.integers(1, 3))):
                n = draw(st.integers(0, 6))
                parts.append(([tuple(draw(VALUES[t]) for _, t in columns) for _ in range(n)],
                              draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0]),
                                            min_size=n, max_size=n))))
            ops.append(("batch", parts))
        elif kind == "register":
            ops.append(("register", draw(queries("R", columns))))
        else:
            ops.append(("aggregate", draw(aggregate_queries("R", columns))))
    ops.append(("invoke_all", draw(st.integers(-5, 5))))
    return (columns, retain), ops


def admitted(query: Query) -> bool:
    """What a stream probed in the executors takes (LiveSources.admit)."""
    source = query.sources[0]
    return (source.window.kind.value in ("all", "range")
            and not any(p.column == TUPLE_ID for p in source.predicates)
            and not any(TUPLE_ID in (f.left, f.right) for f in source.column_factors))


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scenario=scenarios())
def test_answers_from_the_batches_equal_duckdbs(tmp_path_factory: pytest.TempPathFactory,
                                                scenario: tuple[Any, list[Any]]) -> None:
    (columns, retain), ops = scenario
    secs = None if retain is None else retain[1]
    schema = StreamSchema("R", columns, retain_seconds=secs)
    ddl = ddl_of("R", columns)
    folder = tmp_path_factory.mktemp("batches")
    feed = Feed(folder, schema, ddl)
    oracle = Oracle({"R": (columns, retain)})
    registered: list[tuple[str, Query, str, dict[str, Any]]] = []
    now = T0
    for op in ops:
        if op[0] == "batch":
            now = _land(feed, oracle, op[1], now)
        elif op[0] in ("register", "aggregate"):
            sql, spec = op[1]
            query = compile_statement(sql, {"R": schema})
            assert isinstance(query, Query)
            if admitted(query):
                handle = f"h{len(registered)}"
                feed.queries[handle] = query.sql
                registered.append((handle, query, op[0], spec))
    assume(registered)
    at = now + op[1]
    lacking = {h for hs in feed.store.lacking(feed.queries).values() for h in hs}
    for handle, query, _, spec in registered:
        if handle in lacking and spec["window"] == ("all",) and secs is None:
            with pytest.raises(HistoryPending, match="being evaluated"):
                _answer(feed.store, handle, query, at)
    feed.cover()
    for store in (feed.store, BatchStore(folder, dict(schema.columns), secs)):
        store._check()
        for handle, query, kind, spec in registered:
            got = _answer(store, handle, query, at)
            if kind == "aggregate":
                want = answer_aggregate(oracle.db, oracle.source(spec, at), spec)
                rows = sorted(got.rows, key=repr) if spec["keys"] else got.rows
                want = sorted(want, key=repr) if spec["keys"] else want
                assert rows_match(rows, want), (query.sql, rows, want)
            else:
                assert got.rows == oracle.answer(spec, at), query.sql


def _land(feed: Feed, oracle: Oracle, parts: list[tuple[list[Any], list[float]]],
          now: float) -> float:
    """Commit one batch of `parts` (rows, ts steps) to `feed` and the oracle; the new
    latest ts."""
    rows_of, stamps = [], []
    tid = feed.store.next_tid
    for rows, steps in parts:
        ts = list(now + np.cumsum(steps)) if steps else []
        now = float(ts[-1]) if ts else now
        rows_of.append(rows)
        stamps.append([float(t) for t in ts])
        if rows:
            oracle.insert("R", rows, stamps[-1], list(range(tid, tid + len(rows))))
            tid += len(rows)
    feed.commit(rows_of, stamps)
    return now


def _answer(store: BatchStore, handle: str, query: Query, at: float) -> Any:
    return answer_from_batches(SelectionPlan(0, query), handle, store, at)


# ---------------------------------------------------------------------- commits

SCHEMA = StreamSchema("R", [("a", "int")], retain_seconds=10.0)
DDL = "CREATE STREAM R (a INT)"


def test_a_failed_attempts_file_is_not_committed_and_staging_is_emptied(tmp_path: Path) -> None:
    feed = Feed(tmp_path, SCHEMA, DDL)
    feed.queries["h"] = "SELECT a FROM R WHERE a > 1"
    feed.commit([[(1,), (2,)]], [[1.0, 2.0]])
    stray = feed.store.staging()
    (stray / "part-00000-dead.parquet").write_bytes(b"half")
    batch = feed.store.batches()[0]
    assert [f.name for f in batch.files] == [p.name for p in batch.folder.glob("part-*")]
    assert feed.store.committed(0) and not feed.store.committed(1)
    with pytest.raises(PSoupError, match="not after the last committed"):
        feed.store.commit(0, feed.store.staging(), [], {}, committed_at=0.0)
    late = batch.folder / "part-00001-late.parquet"     # a speculative attempt's
    late.write_bytes(b"late")
    orphan = batch.folder / f"cover-0123-{batch.files[0].name}"  # no JSON: a crash
    orphan.write_bytes(b"words")
    again = BatchStore(tmp_path, {"a": SCHEMA.columns[0][1]}, 10.0)   # a restart
    assert not (tmp_path / ".staging").exists()
    assert not late.exists() and not orphan.exists()
    assert again.next_tid == 2 and again.latest_ts == 2.0
    assert _answer(again, "h", _query("SELECT a FROM R WHERE a > 1"), 5.0).rows == [(2,)]


def _query(sql: str) -> Query:
    return _compiled(sql, SCHEMA)


def _compiled(sql: str, schema: StreamSchema) -> Query:
    query = compile_statement(sql, {schema.name: schema})
    assert isinstance(query, Query)
    return query


def test_retention_removes_whole_batches_and_answers_see_retained_rows(tmp_path: Path
                                                                        ) -> None:
    feed = Feed(tmp_path, SCHEMA, DDL)
    feed.queries["h"] = "SELECT a FROM R"
    feed.commit([[(1,), (2,)]], [[1.0, 2.0]])
    feed.commit([[(3,)], [(4,)]], [[5.0], [12.0]])
    feed.commit([[(5,)]], [[13.0]])
    q = _query("SELECT a FROM R")
    # retained: ts >= 13 - 10 = 3, as memory keeps them (the first batch is wholly older)
    assert _answer(feed.store, "h", q, 20.0).rows == [(3,), (4,), (5,)]
    assert feed.store.expire(13.0 - 10.0) == 1
    assert [b.batch_id for b in feed.store.batches()] == [1, 2]
    assert _answer(feed.store, "h", q, 20.0).tuple_ids.ravel().tolist() == [2, 3, 4]
    feed.store._check()
    assert feed.store.committed(0)      # left by retention, still not applied again


def test_a_sidecar_covers_a_query_registered_after_a_batch(tmp_path: Path) -> None:
    feed = Feed(tmp_path, SCHEMA, DDL)
    feed.commit([[(1,), (7,)], [(9,)]], [[1.0, 2.0], [3.0]])
    feed.queries["late"] = "SELECT a FROM R WHERE a > 5"
    q = _query("SELECT a FROM R WHERE a > 5")
    with pytest.raises(HistoryPending):
        _answer(feed.store, "late", q, 5.0)
    assert feed.store.lacking(["late"]) == {0: ["late"]}
    feed.cover()
    feed.commit([[(8,)]], [[4.0]])       # probed with it now: in the batch itself
    assert _answer(feed.store, "late", q, 5.0).rows == [(7,), (9,), (8,)]
    reopened = BatchStore(tmp_path, dict(SCHEMA.columns), 10.0)
    assert reopened.lacking(["late"]) == {}
    assert _answer(reopened, "late", q, 5.0).rows == [(7,), (9,), (8,)]
    reopened._check()


def test_a_window_before_the_lacking_batches_needs_no_history(tmp_path: Path) -> None:
    feed = Feed(tmp_path, SCHEMA, DDL)
    feed.commit([[(1,)]], [[1.0]])
    feed.queries["h"] = "SELECT a FROM R"
    feed.commit([[(2,)]], [[6.0]])
    got = _answer(feed.store, "h", _query("SELECT a FROM R [RANGE 1 SECONDS]"), 6.5)
    assert got.rows == [(2,)] and np.asarray(got.ts).tolist() == [6.0]


def test_an_aggregate_reads_only_the_files_at_its_windows_edges(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    feed = Feed(tmp_path, SCHEMA, DDL)
    feed.queries["n"] = "SELECT COUNT(*), SUM(a), MAX(a) FROM R WHERE a > 1"
    feed.commit([[(1,), (2,)], [(3,)]], [[1.0, 2.0], [3.0]])
    feed.commit([[(4,), (5,)]], [[4.0, 5.0]])
    read: list[str] = []
    matches = BatchStore._matches

    def counted(self: BatchStore, batch: Any, f: Any, *args: Any) -> Any:
        read.append(f.name)
        return matches(self, batch, f, *args)

    monkeypatch.setattr(BatchStore, "_matches", counted)
    q = _query("SELECT COUNT(*), SUM(a), MAX(a) FROM R WHERE a > 1")
    assert _answer(feed.store, "n", q, 9.0).rows == [(4, 14, 5)]
    assert read == []                                   # every file from its totals
    window = _query("SELECT COUNT(*), SUM(a), MAX(a) FROM R WHERE a > 1 BEGIN 1.5 END 4.5")
    assert _answer(feed.store, "n", window, 9.0).rows == [(3, 9, 4)]
    first = feed.store.batches()[0].files[0].name
    last = feed.store.batches()[1].files[0].name
    assert read == [first, last]    # the files across the window's edges: read for rows
