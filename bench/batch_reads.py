"""Invocations over a stream probed in Spark's executors (WITH (probe = 'executors')):
what an answer read from the stream's committed batches costs, beside the same query
answered by the in-memory engine over the same tuples.

The batch store (psoup.archive.batches) is filled as the executors fill it: Fig. 9's
tuples and 1,024 inequality queries, each micro-batch's partitions probed by
psoup.spark.executors.probe_part (here in this process; Spark only runs it elsewhere)
and committed. The same tuples are inserted into an in-memory Engine with the same
queries. Each query below is invoked both ways; the latency is the median of repeated
calls (warm: the batch store's column cache holds what the read needs; cold: a store
opened afresh on the same files, so every column is read from the page cache and
decoded). Answers are checked equal between the two.

- one of the 1,024 queries over the last 60 seconds (about 3% of the tuples), and over
  everything retained;
- COUNT(*), SUM(a), MAX(b) with that query's WHERE: over everything (every part file
  wholly inside the window: answered from the files' totals) and over the last 60 s.

Usage: python bench/batch_reads.py [--quick | --smoke]
"""

from __future__ import annotations

import math
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)

QUERIES = 1024
TUPLES_PER_SECOND = 1000.0      # the stream's ts: one tuple a millisecond


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"batches": 4, "batch_rows": 5_000, "parts": 2, "repeat": 3}
    if level == "quick":
        return {"batches": 8, "batch_rows": 25_000, "parts": 2, "repeat": 10}
    return {"batches": 40, "batch_rows": 50_000, "parts": 2, "repeat": 20}


def _fill(store: Any, s: dict[str, Any], queries: list[str], columns: dict[str, Any],
          ts: np.ndarray) -> None:
    """Commit the tuples to `store` in micro-batches of `parts` partitions, each probed
    and written by probe_part with the totals the live source asks for."""
    import pyarrow as pa

    from psoup.query import compile_statement
    from psoup.query.model import Query, StreamSchema
    from psoup.spark.executors import probe_part, summed_of

    handles = {f"h{i:05d}": q for i, q in enumerate(queries)}
    slots = {h: i for i, h in enumerate(sorted(handles))}
    listed = [(slot, handles[h]) for h, slot in slots.items()]
    schema = StreamSchema("R", [(c, "int") for c in common.STREAM_COLUMNS])
    compiled = {h: compile_statement(q, {"R": schema}) for h, q in handles.items()}
    summed = [(slots[h], c) for h, c in summed_of(
        schema, {h: q for h, q in compiled.items() if isinstance(q, Query)}).items()]
    step = s["batch_rows"] // s["parts"]
    for b in range(s["batches"]):
        staging = store.staging()
        reports = []
        for p in range(s["parts"]):
            lo = b * s["batch_rows"] + p * step
            rows = pa.record_batch({**{c: v[lo:lo + step] for c, v in columns.items()},
                                    "ts": ts[lo:lo + step]})
            report, = next(probe_part(iter([rows]), ddl=common.CREATE_R, queries=listed,
                                      words=(len(listed) + 63) // 64, staging=str(staging),
                                      latest=-math.inf, commit_ts=0.0,
                                      summed=summed)).to_pylist()
            reports.append(dict(report, partition=p))
        store.commit(b, staging, reports, slots, committed_at=0.0)


def bench(s: dict[str, Any]) -> list[dict[str, Any]]:
    import psoup
    from psoup.archive.batches import BatchStore
    from psoup.plans import SelectionPlan
    from psoup.query import compile_statement
    from psoup.query.model import ColumnType, Query, StreamSchema
    from psoup.results.answers import answer_from_batches

    n = s["batches"] * s["batch_rows"]
    columns = common.data_columns(common.rng(1), n)
    ts = np.arange(n, dtype=np.float64) / TUPLES_PER_SECOND
    now = float(ts[-1])
    base = common.selection_queries(common.rng(2), QUERIES, "inequality")
    where = base[0].split(" WHERE ", 1)[1]
    measured = {
        "selection, last 60 s": f"SELECT * FROM R [RANGE 60 SECONDS] WHERE {where}",
        "selection, everything": f"SELECT * FROM R WHERE {where}",
        "aggregate, everything": f"SELECT COUNT(*), SUM(a), MAX(b) FROM R WHERE {where}",
        "aggregate, last 60 s":
            f"SELECT COUNT(*), SUM(a), MAX(b) FROM R [RANGE 60 SECONDS] WHERE {where}",
    }
    queries = base[1:] + list(measured.values())     # 1,024 in all, with the measured
    root = Path(tempfile.mkdtemp(prefix="psoup-batch-reads-"))
    try:
        types = {c: ColumnType.INT for c in common.STREAM_COLUMNS}
        store = BatchStore(root / "batches", types)
        _fill(store, s, queries, columns, ts)
        handle_of = {q: f"h{i:05d}" for i, q in enumerate(queries)}
        eng = psoup.Engine()
        eng.execute(common.CREATE_R)
        handles = {q: eng.register(q) for q in queries}
        eng.insert("R", columns, ts)
        schema = StreamSchema("R", [(c, "int") for c in common.STREAM_COLUMNS])
        rows = []
        with common.settled():
            for label, sql in measured.items():
                query = compile_statement(sql, {"R": schema})
                assert isinstance(query, Query)
                plan = SelectionPlan(0, query)

                def from_batches(on: Any = store, q: str = sql, p: Any = plan) -> Any:
                    return answer_from_batches(p, handle_of[q], on, now)

                want = eng.invoke(handles[sql], now=now)
                got = from_batches()
                if got.rows != want.rows:
                    raise RuntimeError(f"{label}: the batches' answer differs from the "
                                       "engine's")
                def afresh(q: str = sql, p: Any = plan) -> Any:
                    return answer_from_batches(p, handle_of[q],
                                               BatchStore(root / "batches", types), now)

                def in_memory(h: str = handles[sql]) -> Any:
                    return eng.invoke(h, now=now)

                warm = common.timed(from_batches, repeat=s["repeat"])
                cold = common.timed(afresh, repeat=max(3, s["repeat"] // 4))
                engine = common.timed(in_memory, repeat=s["repeat"])
                rows.append({"query": label, "answer rows": len(want.rows),
                             "batches warm ms": warm.median * 1e3,
                             "batches cold ms": cold.median * 1e3,
                             "engine ms": engine.median * 1e3,
                             "warm/engine": warm.median / engine.median})
        eng.close()
        disk = sum(p.stat().st_size for p in (root / "batches").rglob("*.parquet"))
        for row in rows:
            row["tuples"] = n
            row["store MB"] = disk / 1e6
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    x = np.arange(len(rows))
    for i, (key, label) in enumerate((("batches warm ms", "batch store, warm"),
                                      ("batches cold ms", "batch store, cold"),
                                      ("engine ms", "in-memory engine"))):
        ax.bar(x + (i - 1) * 0.27, [r[key] for r in rows], width=0.27, label=label)
    ax.set_xticks(x, [r["query"].replace(", ", "\n") for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("ms per invocation (median)")
    ax.set_title("Invocations over a stream probed in Spark's executors")
    ax.legend(fontsize=8)


def main() -> None:
    level, suffix = common.size_flag(__doc__)
    s = _settings(level)
    began = time.perf_counter()
    rows = bench(s)
    info = common.machine_info()
    n = s["batches"] * s["batch_rows"]
    common.report(f"batch_reads{suffix}", rows, [
        ("query", "query", "s"), ("tuples", "tuples", ",d"),
        ("answer rows", "answer rows", ",d"), ("batches warm ms", "batches warm ms", ".2f"),
        ("batches cold ms", "batches cold ms", ".2f"), ("engine ms", "engine ms", ".2f"),
        ("warm/engine", "warm/engine", ".1f"), ("store MB", "store MB", ",.0f"),
    ], _plot, notes=[
        f"measured on {common.cpu_line(info)}, {info['cpu_count']} CPUs, in "
        f"{time.perf_counter() - began:.0f} s",
        f"{n:,} tuples of Fig. 9's stream, one a millisecond, in {s['batches']} "
        f"micro-batches of {s['parts']} part files, probed with {QUERIES:,} inequality "
        "queries by the executors' own task function; the in-memory engine (PSoup-P, "
        "defaults) holds the same tuples and queries",
        "warm: the batch store's column cache (64 MiB) holds what the read needs; cold: "
        "a store opened afresh (its files in the page cache), medians of repeated calls; "
        "every answer checked equal to the engine's",
    ], params={**s, "queries": QUERIES})


if __name__ == "__main__":
    main()
