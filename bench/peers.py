"""Peers a user would pick instead of psoup for many standing selection queries, measured
in the same run on the same tuples and queries, with the answers compared.

The workload is Fig. 9's (bench/ingest.py): the first batches of its tuples (R, four
attributes uniform in [0, 255]) and its first 128 ... 1,024 inequality queries. Each
engine gets the tuples as a stream of batches and every query's match count over them
must equal psoup's.

- psoup (PSoup-P): the queries registered, the batches inserted; end to end (from an
  empty engine to every batch in) and steady (the batches after the first), the median
  of three runs, the kernels compiled by an untimed run first.
- Spark Structured Streaming (local[2], UI off): the batches as parquet files in a
  folder, read by a file stream source one file per micro-batch
  (`maxFilesPerTrigger=1`, trigger `availableNow`); one streaming query tags each row
  with the ids of the queries it matches (`explode(filter(array(CASE WHEN <where_i>
  THEN i END, ...), x -> x IS NOT NULL))`, the best form a Spark user writes for many
  filters) and a foreachBatch sink counts the tags per query. End to end: from the
  query's start (the session already warm) to its end; steady: the micro-batches after
  the first. Beyond a few hundred queries the generated code passes the JVM's 64 KB per
  method and Spark falls back to evaluation without whole-stage code: reported as it is
  (the "codegen" column, probed on one row with the fallback off). Also measured: all
  the files in one micro-batch (Spark's best throughput), and the first query alone
  (what the stream of micro-batches costs Spark before any filter).
- Pathway (optional: `pip install 'psoup[peers]'`, or an interpreter that has it named
  by PSOUP_PATHWAY_PYTHON): the batches as CSV files read in static mode, in its own
  process (bench/peers_pathway.py); N filters (one filter and count per query), and the
  queries as a table joined to the data (on the first tuples only, as every tuple meets
  every query; psoup is timed end to end on the same tuples for that ratio).
  Its time includes building the graph, reported apart.

A peer whose package is absent is skipped, with a note saying so.

Usage: python bench/peers.py [--quick | --smoke]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)

import psoup  # noqa: E402

PATHWAY_ENV = "PSOUP_PATHWAY_PYTHON"
SPARK_MEMORY = "4g"          # the driver's heap: the default 1g runs out at 1,024 queries


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"batch": 200, "files": {8: 1}, "data_tuples": 100, "filters_max": 8}
    if level == "quick":
        return {"batch": 1_000, "files": {64: 2}, "data_tuples": 500, "filters_max": 64}
    # fewer files at 1,024 queries: Spark processes a few hundred tuples per second there;
    # Pathway's N-filter graph takes minutes to build beyond a few hundred filters
    return {"batch": 10_000, "files": {128: 10, 1024: 2}, "data_tuples": 1_000,
            "filters_max": 128}


def batches(s: dict[str, Any]) -> list[dict[str, NDArray[np.int64]]]:
    """The Fig. 9 workload's first batches (bench/ingest.py draws its pool the same way)."""
    gen = common.rng(1)
    return [common.data_columns(gen, s["batch"]) for _ in range(max(s["files"].values()))]


def run_psoup(queries: list[str], pool: list[dict[str, NDArray[np.int64]]]) -> dict[str, Any]:
    """PSoup-P: seconds end to end and for the batches after the first, per-query counts
    of matches by tupleID (counts(limit) counts those below `limit`)."""
    eng = psoup.Engine()
    eng.execute(common.CREATE_R)
    began = time.perf_counter()
    handles = [eng.register(sql) for sql in queries]
    first: float | None = None
    sent = 0
    for columns in pool:
        n = len(columns["a"])
        eng.insert("R", columns, ts=np.arange(sent, sent + n, dtype=np.float64))
        sent += n
        first = first or time.perf_counter()
    ended = time.perf_counter()
    assert first is not None                # the pool is not empty
    tids = [eng.invoke(h, now=float(sent)).tuple_ids for h in handles]
    eng.close()
    return {"total_s": ended - began, "steady_s": ended - first, "tids": tids}


def psoup_rates(queries: list[str],
                pool: list[dict[str, NDArray[np.int64]]]) -> dict[str, Any]:
    """The median of three runs of `run_psoup` (each a fresh engine), after one untimed
    run on one batch that compiles the kernels (as Spark's JVM is warmed first)."""
    run_psoup(queries[:1], pool[:1])
    runs = [run_psoup(queries, pool) for _ in range(3)]
    tuples = sum(len(c["a"]) for c in pool)
    steady_tuples = tuples - len(pool[0]["a"])
    return {"psoup tuples/s": tuples / float(np.median([r["total_s"] for r in runs])),
            "psoup steady tuples/s": steady_tuples / float(np.median(
                [r["steady_s"] for r in runs])) if steady_tuples else None,
            "tids": runs[0]["tids"]}


def counts_below(tids: list[NDArray[np.int64]], limit: int) -> list[int]:
    return [int(np.count_nonzero(t < limit)) for t in tids]


# ---------------------------------------------------------------------- Spark

def spark_or_none() -> Any:
    """A local[2] SparkSession (the JVM warmed by one small job), or None without pyspark
    or Java."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return None
    from psoup.errors import PSoupError
    from psoup.spark.session import spark_session
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--driver-memory {SPARK_MEMORY} pyspark-shell")
    try:
        spark = spark_session("local[2]")
    except PSoupError:
        return None
    spark.sparkContext.setLogLevel("OFF")    # the 64 KB fallback logs a whole stack trace
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    spark.range(1000).selectExpr("sum(id)").collect()
    return spark


def tagging(queries: list[str]) -> str:
    """The one expression that tags a row with the ids of the queries it matches."""
    cases = ", ".join(f"CASE WHEN {q.split(' WHERE ', 1)[1]} THEN {i} END"
                      for i, q in enumerate(queries))
    return f"explode(filter(array({cases}), x -> x IS NOT NULL)) AS qid"


def spark_codegen(spark: Any, expr: str) -> str:
    """Whether whole-stage code generation compiles `expr` (one row, fallback off)."""
    spark.conf.set("spark.sql.codegen.fallback", "false")
    try:
        spark.range(1).selectExpr(*(f"id AS {c}" for c in common.STREAM_COLUMNS)) \
            .selectExpr(expr).collect()
        return "compiled"
    except Exception as exc:       # py4j's wrapper around Janino's CompileException
        return "fell back (64 KB)" if "64 KB" in str(exc) else "fell back"
    finally:
        spark.conf.set("spark.sql.codegen.fallback", "true")


def run_spark(spark: Any, queries: list[str], folder: Path, work: Path,
              files_per_batch: int = 1) -> dict[str, Any]:
    """One streaming query over the parquet files in `folder`, `files_per_batch` files
    per micro-batch: seconds end to end and for the micro-batches after the first, and
    each query's match count."""
    counts = np.zeros(len(queries), dtype=np.int64)

    def count(df: Any, epoch: int) -> None:
        for row in df.groupBy("qid").count().collect():
            counts[row["qid"]] += row["count"]
    stream = (spark.readStream.schema("tid LONG, a LONG, b LONG, c LONG, d LONG")
              .option("maxFilesPerTrigger", files_per_batch).parquet(str(folder)))
    began = time.perf_counter()
    query = (stream.selectExpr(tagging(queries)).writeStream.foreachBatch(count)
             .trigger(availableNow=True).option("checkpointLocation", str(work)).start())
    query.awaitTermination()
    total = time.perf_counter() - began
    later = [p for p in query.recentProgress if p["numInputRows"] and p["batchId"] > 0]
    steady = sum(p["durationMs"]["triggerExecution"] for p in later) / 1e3
    return {"total_s": total, "steady_s": steady,
            "steady_rows": sum(p["numInputRows"] for p in later), "counts": counts.tolist()}


# ---------------------------------------------------------------------- Pathway

def pathway_python() -> str | None:
    """The interpreter that has Pathway: $PSOUP_PATHWAY_PYTHON, else this one; None if
    neither imports it."""
    for python in (os.environ.get(PATHWAY_ENV), sys.executable):
        if python and subprocess.run([python, "-c", "import pathway"],
                                     capture_output=True).returncode == 0:
            return python
    return None


def run_pathway(python: str, variant: str, folder: Path, queries: list[str],
                work: Path) -> dict[str, Any]:
    """bench/peers_pathway.py in its own process: build s, run s, per-query counts."""
    path = work / "queries.json"
    path.write_text(json.dumps([common.factors(q.split(" WHERE ", 1)[1]) for q in queries]))
    done = subprocess.run([python, str(Path(__file__).with_name("peers_pathway.py")),
                           variant, str(folder), str(path)], capture_output=True, text=True,
                          check=True)
    return cast(dict[str, Any], json.loads(done.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------------- the suite

def write_inputs(pool: list[dict[str, NDArray[np.int64]]], files: int, root: Path,
                 data_tuples: int) -> dict[str, Path]:
    """The first `files` batches as parquet (Spark) and CSV (Pathway) files with a tid
    column, and the first `data_tuples` tuples as one CSV file."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    folders = {k: root / k for k in ("parquet", "csv", "csv_head")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    sent = 0
    for i, columns in enumerate(pool[:files]):
        n = len(columns["a"])
        tid = np.arange(sent, sent + n, dtype=np.int64)
        pq.write_table(pa.table({"tid": tid, **columns}), folders["parquet"] / f"{i:05d}.parquet")
        _write_csv(folders["csv"] / f"{i:05d}.csv", tid, columns)
        if sent < data_tuples:
            k = min(n, data_tuples - sent)
            _write_csv(folders["csv_head"] / f"{i:05d}.csv", tid[:k],
                       {c: v[:k] for c, v in columns.items()})
        sent += n
    return folders


def _write_csv(path: Path, tid: NDArray[np.int64], columns: dict[str, NDArray[np.int64]]) -> None:
    with open(path, "w") as f:
        f.write("tid," + ",".join(columns) + "\n")
        np.savetxt(f, np.column_stack([tid, *columns.values()]), fmt="%d", delimiter=",")


def bench(s: dict[str, Any], notes: list[str]) -> list[dict[str, Any]]:
    pool = batches(s)
    all_queries = common.selection_queries(common.rng(2), max(s["files"]), "inequality")
    spark = spark_or_none()
    if spark is None:
        notes.append("Spark skipped: pyspark or Java is not available")
    python = pathway_python()
    if python is None:
        notes.append(f"Pathway skipped: not importable here, and ${PATHWAY_ENV} names no "
                     "interpreter that has it (pip install 'psoup[peers]')")
    rows: list[dict[str, Any]] = []
    for count, files in s["files"].items():
        queries, mine = all_queries[:count], pool[:files]
        tuples = files * s["batch"]
        row: dict[str, Any] = {"queries": count, "tuples": tuples}
        got = psoup_rates(queries, mine)
        tids = got.pop("tids")
        want = counts_below(tids, tuples)
        row.update(got)
        root = Path(tempfile.mkdtemp(prefix="psoup-peers-"))
        try:
            folders = write_inputs(pool, files, root, s["data_tuples"])
            if spark is not None:
                row["spark codegen"] = spark_codegen(spark, tagging(queries))
                ran = run_spark(spark, queries, folders["parquet"], root / "checkpoint")
                _check("Spark", ran["counts"], want)
                row["spark tuples/s"] = tuples / ran["total_s"]
                row["spark steady tuples/s"] = (ran["steady_rows"] / ran["steady_s"]
                                                if ran["steady_s"] else None)
                ran = run_spark(spark, queries, folders["parquet"], root / "one", files)
                _check("Spark, one micro-batch", ran["counts"], want)
                row["spark one tuples/s"] = tuples / ran["total_s"]
                ran = run_spark(spark, queries[:1], folders["parquet"], root / "floor")
                row["spark floor tuples/s"] = tuples / ran["total_s"]
            if python is not None and count <= s["filters_max"]:
                ran = run_pathway(python, "filters", folders["csv"], queries, root)
                _check("Pathway filters", ran["counts"], want)
                row["pathway tuples/s"] = tuples / (ran["build_s"] + ran["run_s"])
                row["pathway build s"] = ran["build_s"]
            if python is not None:
                head = min(s["data_tuples"], tuples)
                ran = run_pathway(python, "data", folders["csv_head"], queries, root)
                _check("Pathway queries as data", ran["counts"], counts_below(tids, head))
                row["pathway data tuples"] = head
                row["pathway data tuples/s"] = head / (ran["build_s"] + ran["run_s"])
                row["psoup head tuples/s"] = psoup_rates(queries, [
                    {c: v[:head] for c, v in mine[0].items()}])["psoup tuples/s"]
        finally:
            shutil.rmtree(root, ignore_errors=True)
        psoup_key = {"spark steady": "psoup steady tuples/s",
                     "pathway data": "psoup head tuples/s"}
        for peer in ("spark", "spark steady", "spark one", "pathway", "pathway data"):
            mine_rate = row.get(psoup_key.get(peer, "psoup tuples/s"))
            if row.get(f"{peer} tuples/s") and mine_rate:
                row[f"psoup/{peer}"] = mine_rate / row[f"{peer} tuples/s"]
        rows.append(row)
    return rows


def _check(peer: str, counts: list[int], want: list[int]) -> None:
    if list(counts) != want:
        bad = next(i for i, (a, b) in enumerate(zip(counts, want, strict=True)) if a != b)
        raise AssertionError(f"{peer}: query {bad} matched {counts[bad]} tuples, psoup "
                             f"{want[bad]}")


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    counts = [r["queries"] for r in rows]
    for key, label, marker in (("psoup tuples/s", "psoup (PSoup-P)", "o"),
                               ("spark tuples/s", "Spark Structured Streaming", "s"),
                               ("pathway tuples/s", "Pathway, N filters", "^"),
                               ("pathway data tuples/s", "Pathway, queries as data", "v")):
        if any(r.get(key) for r in rows):
            ax.plot(counts, [r.get(key) for r in rows], marker=marker, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [f"{c:,}" for c in counts])
    ax.set_xlabel("standing queries")
    ax.set_ylabel("tuples / s, end to end")
    ax.set_title("Many standing queries: psoup vs stream processors")
    ax.legend()


def main() -> None:
    level, suffix = common.size_flag(__doc__)
    s = _settings(level)
    notes: list[str] = []
    rows = bench(s, notes)
    notes += [
        "every peer's per-query match counts equal psoup's on the same tuples",
        "Spark 1 micro-batch: the same query over all the files in one micro-batch (its "
        "best throughput, no longer a stream of batches); Spark 1 query: the first query "
        "alone, one file per micro-batch (Spark's cost of the stream itself)",
        "end to end: psoup from an empty engine (registration included) to the last batch "
        "in, median of 3 runs; Spark from the streaming query's start (session warm) to its "
        "end; Pathway from building its graph to the end of the run; steady: the batches "
        "(micro-batches) after the first",
        f"Pathway's queries-as-data variant runs on the first {s['data_tuples']:,} tuples "
        "only (every tuple meets every query in its join); psoup/Pathway data compares "
        "it with psoup's end-to-end rate on those tuples (psoup head)",
        f"Pathway's N filters run up to {s['filters_max']:,} queries: building the graph "
        "grows faster than the number of filters (about 6 minutes for 1,024 on a 2-core "
        "machine, measured once)",
    ]
    common.report(f"peers{suffix}", rows, [
        ("queries", "queries", ",d"), ("tuples", "tuples", ",d"),
        ("psoup tuples/s", "psoup tuples/s", ",.0f"),
        ("psoup steady tuples/s", "psoup steady", ",.0f"),
        ("spark tuples/s", "Spark SS tuples/s", ",.0f"),
        ("spark steady tuples/s", "Spark steady", ",.0f"),
        ("spark codegen", "Spark codegen", "s"),
        ("psoup/spark", "psoup/Spark", ",.0f"),
        ("psoup/spark steady", "psoup/Spark steady", ",.0f"),
        ("spark one tuples/s", "Spark 1 micro-batch", ",.0f"),
        ("psoup/spark one", "psoup/Spark 1 batch", ",.0f"),
        ("spark floor tuples/s", "Spark 1 query", ",.0f"),
        ("pathway tuples/s", "Pathway filters tuples/s", ",.0f"),
        ("pathway build s", "Pathway build s", ".1f"),
        ("psoup/pathway", "psoup/Pathway", ",.0f"),
        ("psoup head tuples/s", "psoup head tuples/s", ",.0f"),
        ("pathway data tuples/s", "Pathway data tuples/s", ",.0f"),
        ("psoup/pathway data", "psoup/Pathway data", ",.0f"),
    ], _plot, notes=notes, params={**s, "files": {str(k): v for k, v in s["files"].items()}})


if __name__ == "__main__":
    main()
