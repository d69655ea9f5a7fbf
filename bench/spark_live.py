"""Streams fed by a Spark source (issue 38's benchmark): Fig. 9's tuples landing in a
folder as Parquet files, read by `CREATE STREAM ... FROM FILES` on Spark masters local[1]
and local[2], against the same engine inserting the same tuples itself and against Spark
Structured Streaming's own N filters over the same kind of files.

Both designs built (psoup/spark/live.py) are measured, each stream declared WITH (probe =
...): 'executors', where each Spark task probes its partition of a micro-batch with the
standing queries and writes its rows and their Results Structure words to the stream's
batch store, psoup committing the batch by id (psoup.spark.executors, psoup.archive.
batches); and 'engine', where Spark collects each micro-batch to the psoup process
(`toArrow`), one Engine.insert probes it and the log is forced to disk before Spark
commits it. Each measurement runs in a process of its own (one Spark session per
process, its master fixed; memory measured from a fresh process):

- throughput: R (a, b, c, d INT) `RETAIN <rows> ROWS FROM FILES ... FORMAT PARQUET WITH
  (trigger = '0 seconds', maxFilesPerTrigger = k)` (micro-batches back to back, k files
  each; probed in the executors, `RETAIN 1 DAY`: such a stream keeps whole batches on
  disk, and none leaves retention during the run), the queries (1,024 and 10^4 of
  Fig. 9's inequality queries, common.selection_queries) registered first. The data
  lands in four equal parts, each file written elsewhere and renamed into the folder:
  the first part alone (Spark's first batches, the kernels compiled), then the other
  three at once; tuples/s is the last three parts' tuples over the seconds from their
  landing to the stream counting them all (rows_total; for the executors, the rows
  committed).
- memory: the RSS of the psoup process and of Spark's driver JVM (the java process among
  this process's descendants, as bench/history.py finds it) once the first part is in
  and once all four are: the landed data grown 4x, the retained window full at both.
- direct: the same process, after the source, inserting the same tuples into a durable
  engine with the same retention and queries, one insert (and commit, as the source
  forces each batch to disk) per k files' tuples; tuples/s over the last three parts.
- freshness (at the first query count): a stream F with `WITH (trigger = '1 second')`
  and the same queries, plus one that finds a marker row; a file of fresh rows lands
  (renamed in) at a random moment of the trigger interval, and an invocation of the
  marker query is polled until the file's marker row is in its answer: the seconds from
  the rename to that answer, p50 and p99.
- Spark's N filters (at the first query count, in a process of its own with a 4 GB
  driver heap, as bench/peers.py needs at 1,024 queries): the peers suite's query (one
  streaming query tagging each row with the ids of the queries it matches, a foreachBatch
  sink counting the tags), one file per micro-batch, `availableNow`; its per-query
  counts are checked against numpy's. It runs over the first few of the same files only
  (it processes about a thousand tuples a second at 1,024 queries).

Each run's process tree is pinned to its master's CPUs: local[1] to one CPU, local[2] to
two (unpinned, local[1]'s JVM decodes input on the second CPU of this 2-CPU machine).

Targets (issue 38), judged on the executors' rows: local[2] >= 1.6x local[1]; psoup >=
100x Spark's filters at 1,024 queries; RSS within 1.2x as the landed data grows 4x;
freshness p50 <= trigger + 2 s.

Usage: python bench/spark_live.py [--quick | --smoke]
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)

MASTERS = ("local[1]", "local[2]")
#: The CPUs each master's run may use: local[1] runs on one, whole (Spark's JVM decodes a
#: task's input on a thread of its own: unpinned, local[1] keeps two CPUs busy, and on
#: this 2-CPU machine measured 0.96-0.99x local[2] whatever the probe).
CPUS = {"local[1]": 1, "local[2]": 2}
#: The rows run on a standalone cluster on 127.0.0.1: a master and two workers of one
#: core and 1 GB each (probed in the executors only).
CLUSTER = "cluster"
PROBES = ("executors", "engine")    # WITH (probe = ...): the design scaled, the other
CORES_TARGET = 1.6          # local[2] / local[1], tuples/s through the source
SPARK_TARGET = 100.0        # psoup's source / Spark's own N filters, at 1,024 queries
RSS_TARGET = 1.2            # RSS with the landed data 4x / 1x
FRESH_SLACK = 2.0           # freshness p50 <= the trigger interval + this many seconds
FRESH_TRIGGER_S = 1.0
THROUGHPUT_TRIGGER = "0 seconds"
FILTERS_MEMORY = "4g"       # Spark's filters: the 512m psoup starts Spark with runs out
MARKER = 1_000              # the freshness files' marker rows: a >= MARKER (data: 0..255)
WAIT_S = 900.0              # a source that has not applied its files by then has hung
COLUMNS = "(a INT, b INT, c INT, d INT)"


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"queries": [8, 32], "file_rows": 500, "files": 4, "files_per_trigger": 1,
                "retain_rows": 500, "filter_files": 2, "fresh_samples": 2, "fresh_rows": 100,
                "cluster": 0}
    if level == "quick":
        return {"queries": [1024, 10_000], "file_rows": 10_000, "files": 8,
                "files_per_trigger": 2, "retain_rows": 20_000, "filter_files": 2,
                "fresh_samples": 8, "fresh_rows": 1_000, "cluster": 0}
    return {"queries": [1024, 10_000], "file_rows": 50_000, "files": 32,
            "files_per_trigger": 4, "retain_rows": 200_000, "filter_files": 2,
            "fresh_samples": 40, "fresh_rows": 1_000, "cluster": 1}


# ---------------------------------------------------------------------- in a child

def _queries(n: int, stream: str = "R") -> list[str]:
    """Fig. 9's first n inequality queries (the seed the peers suite draws them with)."""
    queries = common.selection_queries(common.rng(2), n, "inequality")
    return [q.replace(" FROM R ", f" FROM {stream} ") for q in queries]


def _rss_mb() -> tuple[float, float]:
    """(this process's RSS, the driver JVM's RSS) in MB, from /proc (VmRSS: now, not
    the peak; the JVM is the java process among this process's descendants)."""
    import history
    return history._peaks("VmRSS")


def _wait(check: Callable[[], bool], what: str, every: float = 0.01) -> float:
    """Poll `check` every `every` seconds until it holds; the time.perf_counter() then."""
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)
    return time.perf_counter()


def _land(files: Sequence[Path], inbox: Path) -> float:
    """Rename each of `files` (written beside the folder) into it; the time of the first."""
    t0 = time.perf_counter()
    for f in files:
        f.rename(inbox / f.name)
    return t0


def _stage(staged: Sequence[Path], into: Path) -> list[Path]:
    """Copies of the parent's files in `into` (the same file system as the inbox), ready
    to be renamed in: new files, each its own modification time."""
    into.mkdir(parents=True, exist_ok=True)
    out = []
    for f in staged:
        shutil.copyfile(f, into / f.name)
        out.append(into / f.name)
    return out


def _parts(files: list[Path]) -> list[list[Path]]:
    quarter = len(files) // 4
    return [files[i * quarter:(i + 1) * quarter] for i in range(4)]


def _retain(s: dict[str, Any], probe: str) -> str:
    """The RETAIN clause: rows in the engine; a time in the executors (whole batches)."""
    return "RETAIN 1 DAY" if probe == "executors" else f"RETAIN {s['retain_rows']} ROWS"


def _count(eng: Any, stream: str, probe: str) -> int:
    """The rows the stream has taken: applied, or committed by the executors."""
    if probe == "executors":
        return int(eng.stats()["sources"][stream].get("retained_rows", 0))
    return int(eng.describe(stream)["rows_total"])


def _source_run(eng: Any, s: dict[str, Any], queries: list[str], root: Path,
                staged: list[Path], probe: str) -> dict[str, Any]:
    """Throughput and memory through R's FILES source (see the module's docstring)."""
    inbox = root / "inbox"
    inbox.mkdir()
    files = _stage(staged, root / "landing")
    eng.execute(f"CREATE STREAM R {COLUMNS} {_retain(s, probe)} FROM FILES "
                f"'{inbox}' FORMAT PARQUET WITH (trigger = '{THROUGHPUT_TRIGGER}', "
                f"maxFilesPerTrigger = {s['files_per_trigger']}, probe = '{probe}')")
    for q in queries:
        eng.register(q)
    began = time.perf_counter()
    _wait(lambda: eng.stats()["sources"]["R"]["state"] == "running", "the source", 0.1)
    out: dict[str, Any] = {"spark start s": time.perf_counter() - began}
    part = s["file_rows"] * len(files) // 4
    parts = _parts(files)

    def rows_in(n: int) -> Callable[[], bool]:
        return lambda: _count(eng, "R", probe) >= n
    t0 = _land(parts[0], inbox)
    out["first part s"] = _wait(rows_in(part), "the first part") - t0
    out["psoup mb 1x"], out["jvm mb 1x"] = _rss_mb()
    with common.settled():          # as the direct inserts are timed
        t0 = _land([f for p in parts[1:] for f in p], inbox)
        took = _wait(rows_in(4 * part), "every part") - t0
    out["source tuples/s"] = 3 * part / took
    out["psoup mb 4x"], out["jvm mb 4x"] = _rss_mb()
    stats = eng.stats()["sources"]["R"]
    if stats["rows"] != 4 * part or stats["rejected_rows"] or stats["last_error"]:
        raise RuntimeError(f"the source applied {stats['rows']} of {4 * part} rows, "
                           f"rejected {stats['rejected_rows']}: {stats['last_error']}")
    out["batches"] = stats["batches"]
    eng.execute("DROP STREAM R CASCADE")
    return out


def _freshness(eng: Any, s: dict[str, Any], queries: list[str], root: Path,
               probe: str) -> list[float]:
    """Seconds from each fresh file's rename into F's folder to its marker row in an
    answer of the marker query (polled every 10 ms)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    inbox, landing = root / "fresh", root / "fresh-landing"
    inbox.mkdir()
    landing.mkdir()
    eng.execute(f"CREATE STREAM F {COLUMNS} {_retain(s, probe)} FROM FILES '{inbox}' "
                f"FORMAT PARQUET WITH (trigger = '{FRESH_TRIGGER_S:g} second', "
                f"probe = '{probe}')")
    for q in queries:
        eng.register(q.replace(" FROM R ", " FROM F "))
    marker = eng.register(f"SELECT a FROM F WHERE a >= {MARKER}")
    _wait(lambda: eng.stats()["sources"]["F"]["state"] == "running", "the source", 0.1)
    gen, pick = common.rng(7), random.Random(common.SEED)
    latencies: list[float] = []
    for k in range(s["fresh_samples"] + 1):         # the first: Spark's first batch, untimed
        columns = common.data_columns(gen, s["fresh_rows"])
        columns["a"][0] = MARKER + k
        path = landing / f"{k:05d}.parquet"
        pq.write_table(pa.table(columns), path)
        time.sleep(pick.uniform(0.0, FRESH_TRIGGER_S))
        t0 = _land([path], inbox)
        seen = _wait(_answered(eng, marker, k + 1), "a fresh file")
        if k:
            latencies.append(seen - t0)
    eng.execute("DROP STREAM F CASCADE")
    return latencies


def _answered(eng: Any, handle: str, n: int) -> Callable[[], bool]:
    """Whether an invocation of `handle` answers at least n rows."""
    return lambda: len(eng.invoke(handle).rows) >= n


def _direct_run(s: dict[str, Any], queries: list[str], root: Path,
                staged: list[Path]) -> float:
    """Tuples/s of Engine.insert (and commit) on the same tuples, a source batch's worth
    (files_per_trigger files) per insert, over the last three parts."""
    import psoup
    parts = _parts(staged)
    k = s["files_per_trigger"]
    batches = [[_read(part[i:i + k]) for i in range(0, len(part), k)] for part in parts]
    with psoup.Engine(path=root / "direct") as eng:
        eng.execute(f"CREATE STREAM R {COLUMNS} RETAIN {s['retain_rows']} ROWS")
        for q in queries:
            eng.register(q)
        for columns in batches[0]:
            eng.insert("R", columns)
            eng.commit()
        with common.settled():
            t0 = time.perf_counter()
            for part in batches[1:]:
                for columns in part:
                    eng.insert("R", columns)
                    eng.commit()
            took = time.perf_counter() - t0
    return sum(len(c["a"]) for part in batches[1:] for c in part) / took


def _read(files: Sequence[Path]) -> dict[str, NDArray[np.int64]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.concat_tables([pq.read_table(f) for f in files])
    return {c: np.asarray(table.column(c).to_numpy()) for c in common.STREAM_COLUMNS}


def measure_source(args: dict[str, Any]) -> dict[str, Any]:
    """A child: the source's throughput and memory, freshness when asked, then the
    direct inserts, on Spark master args["master"]."""
    import psoup
    s, root = args["settings"], Path(args["root"])
    staged = sorted((root.parent / "data").iterdir())
    queries = _queries(args["queries"])
    eng = psoup.Engine(path=root / "engine", spark_master=args["master"])
    try:
        out = _source_run(eng, s, queries, root, staged, args["probe"])
        if args["fresh"]:
            out["fresh"] = _freshness(eng, s, queries, root, args["probe"])
    finally:
        eng.close()
    out["direct tuples/s"] = _direct_run(s, queries, root, staged)
    return out


def measure_filters(args: dict[str, Any]) -> dict[str, Any]:
    """A child: Spark's own N filters (bench/peers.py's query) over the first
    filter_files of the source's files."""
    import peers

    from psoup.spark.session import spark_session
    root = Path(args["root"])
    folder = root / "filters"
    staged = sorted((root.parent / "data").iterdir())[:args["settings"]["filter_files"]]
    _stage(staged, folder)
    spark = spark_session(args["master"], {"spark.driver.memory": FILTERS_MEMORY})
    spark.sparkContext.setLogLevel("OFF")    # the 64 KB fallback logs a whole stack trace
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    spark.range(1000).selectExpr("sum(id)").collect()
    queries = _queries(args["queries"])
    ran = peers.run_spark(spark, queries, folder, root / "checkpoint")
    want = _counts(queries, _read(sorted(folder.iterdir())))
    if ran["counts"] != want:
        raise RuntimeError("Spark's filters disagree with numpy's match counts")
    tuples = args["settings"]["filter_files"] * args["settings"]["file_rows"]
    return {"spark tuples/s": tuples / ran["total_s"],
            "spark steady tuples/s": ran["steady_rows"] / ran["steady_s"]
            if ran["steady_s"] else None,
            "spark codegen": peers.spark_codegen(spark, peers.tagging(queries))}


def _counts(queries: list[str], columns: dict[str, NDArray[np.int64]]) -> list[int]:
    """Each query's match count over `columns`, by numpy (common.UnsharedNumpy)."""
    where = [common.factors(q.split(" WHERE ", 1)[1]) for q in queries]
    return [len(m) for m in common.UnsharedNumpy(where).insert(dict(columns))]


# ---------------------------------------------------------------------- the parent

def _write_inputs(s: dict[str, Any], root: Path) -> None:
    """Fig. 9's tuples (the seed bench/peers.py draws them with) as the Parquet files
    every run lands, in root/data."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    gen = common.rng(1)
    (root / "data").mkdir(parents=True)
    for i in range(s["files"]):
        pq.write_table(pa.table(common.data_columns(gen, s["file_rows"])),
                       root / "data" / f"{i:05d}.parquet")


def _child(kind: str, args: dict[str, Any]) -> dict[str, Any]:
    """One measurement in a process of its own (its stderr passed through), on the
    master's CPUs: local[1] pinned to one CPU, with Spark's JVM and Python workers (they
    inherit it); local[2] on two."""
    mine = sorted(os.sched_getaffinity(0))
    cpus = set(mine[:CPUS.get(args["master"], len(mine))])
    done = subprocess.run([sys.executable, __file__, "--child", kind, json.dumps(args)],
                          stdout=subprocess.PIPE, text=True, check=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    return cast(dict[str, Any], json.loads(done.stdout.strip().splitlines()[-1]))


def bench(s: dict[str, Any]) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="psoup-spark-live-"))
    rows: list[dict[str, Any]] = []
    try:
        _write_inputs(s, root)
        first = s["queries"][0]
        for probe in PROBES:
            for master in MASTERS:
                for count in s["queries"]:
                    work = root / f"run-{len(rows)}"
                    work.mkdir()
                    args = {"settings": s, "root": str(work), "master": master,
                            "queries": count, "fresh": count == first, "probe": probe}
                    row: dict[str, Any] = {"probe": probe, "master": master,
                                           "cpus": CPUS[master], "queries": count,
                                           "tuples": s["files"] * s["file_rows"],
                                           **_child("source", args)}
                    if count == first and probe == PROBES[0]:
                        row.update(_child("filters", args))
                    shutil.rmtree(work, ignore_errors=True)
                    rows.append(_derived(row))
        if s["cluster"]:
            rows += _on_cluster(s, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _cores(rows)
    return rows


def _on_cluster(s: dict[str, Any], root: Path) -> list[dict[str, Any]]:
    """The executors' rows on a standalone cluster of two one-core workers (this
    machine's Python on the workers: it has psoup and its dependencies)."""
    rows: list[dict[str, Any]] = []
    with _standalone(root / "cluster") as url:
        for count in s["queries"]:
            work = root / f"run-{len(rows)}-cluster"
            work.mkdir()
            args = {"settings": s, "root": str(work), "master": url, "queries": count,
                    "fresh": False, "probe": PROBES[0]}
            row = {"probe": PROBES[0], "master": CLUSTER, "cpus": 2, "queries": count,
                   "tuples": s["files"] * s["file_rows"], **_child("source", args)}
            shutil.rmtree(work, ignore_errors=True)
            rows.append(_derived(row))
    return rows


def _logged(log: Path, line: bytes) -> bool:
    return line in log.read_bytes()


@contextlib.contextmanager
def _standalone(folder: Path) -> Iterator[str]:
    """spark://127.0.0.1:PORT with two workers of one core and 1 GB each, started from
    the installed pyspark's spark-class and stopped (by process group) at the end."""
    import socket

    import pyspark

    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    folder.mkdir(parents=True)
    home = Path(pyspark.__file__).parent
    env = {k: v for k, v in os.environ.items() if k != "PSOUP_SPARK_CONF"}
    env.update(SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(folder / "logs"), PYSPARK_PYTHON=sys.executable)
    os.environ["PYSPARK_PYTHON"] = sys.executable       # the drivers' executors
    port, spark_class = free_port(), str(home / "bin" / "spark-class")
    url = f"spark://127.0.0.1:{port}"
    started: list[subprocess.Popen[bytes]] = []
    logs = [folder / f"{name}.log" for name in ("master", "worker-1", "worker-2")]
    commands = [["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                 str(port), "--webui-port", str(free_port())]]
    commands += [["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores",
                  "1", "--memory", "1g", "--work-dir", str(folder / f"work-{i}"),
                  "--webui-port", str(free_port()), url] for i in (1, 2)]
    waits = [b"I have been elected leader"] + [b"Successfully registered with master"] * 2
    try:
        for command, log, wait in zip(commands, logs, waits, strict=True):
            with open(log, "wb") as out:
                started.append(subprocess.Popen([spark_class, *command], env=env,
                                                stdout=out, stderr=subprocess.STDOUT,
                                                cwd=folder, start_new_session=True))
            _wait(partial(_logged, log, wait), f"{log.stem}'s start", 0.5)
        yield url
    finally:
        _stop_groups(started)


def _stop_groups(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process's group, then SIGKILL the groups still there 30 s later."""
    import signal

    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30.0
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _cores(rows: Sequence[dict[str, Any]]) -> None:
    """Each local[2] row's tuples/s through the source over local[1]'s at its count."""
    one = {(r["probe"], r["queries"]): r for r in rows if r["master"] == "local[1]"}
    for row in rows:
        key = (row["probe"], row["queries"])
        if row["master"] == "local[2]" and key in one:
            row["x local[1]"] = row["source tuples/s"] / one[key]["source tuples/s"]


def _derived(row: dict[str, Any]) -> dict[str, Any]:
    row["source/direct"] = row["source tuples/s"] / row["direct tuples/s"]
    row["psoup x"] = row["psoup mb 4x"] / row["psoup mb 1x"]
    row["jvm x"] = row["jvm mb 4x"] / row["jvm mb 1x"] if row["jvm mb 1x"] else None
    fresh = row.pop("fresh", None)
    if fresh:
        row["fresh p50 s"] = float(np.percentile(fresh, 50))
        row["fresh p99 s"] = float(np.percentile(fresh, 99))
        row["fresh samples"] = len(fresh)
    if row.get("spark tuples/s"):
        row["psoup/spark"] = row["source tuples/s"] / row["spark tuples/s"]
    if row.get("spark steady tuples/s"):
        row["psoup/spark steady"] = row["source tuples/s"] / row["spark steady tuples/s"]
    return row


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def verdicts(rows: Sequence[dict[str, Any]], s: dict[str, Any]) -> list[str]:
    """The issue's four targets, each with its verdict, on the rows probed in the
    executors (the engine's rows beside them where they say something)."""
    at = {(r["probe"], r["master"], r["queries"]): r for r in rows}
    probe = PROBES[0]
    notes = []
    for count in s["queries"]:
        one, two = at[(probe, "local[1]", count)], at[(probe, "local[2]", count)]
        ratio = two["source tuples/s"] / one["source tuples/s"]
        old = [r for r in rows if r["probe"] == "engine" and r["queries"] == count
               and r.get("x local[1]")]
        notes.append(f"target: local[2] >= {CORES_TARGET}x local[1] at {count:,} queries: "
                     f"{ratio:.2f}x -> {_verdict(ratio >= CORES_TARGET)}"
                     + (f" (probed in the psoup process: {old[0]['x local[1]']:.2f}x)"
                        if old else ""))
    first = s["queries"][0]
    for master in MASTERS:
        row = at[(probe, master, first)]
        end, steady = row.get("psoup/spark"), row.get("psoup/spark steady")
        if steady:
            notes.append(f"target: psoup >= {SPARK_TARGET:.0f}x Spark's own N filters at "
                         f"{first:,} queries on {master}: {steady:,.0f}x Spark's steady "
                         f"micro-batches (end to end: {end:,.0f}x) -> "
                         f"{_verdict(steady >= SPARK_TARGET)}")
    mine = [r for r in rows if r["probe"] == probe]
    worst = max(max(r["psoup x"], r["jvm x"] or 0.0) for r in mine)
    old_worst = max((max(r["psoup x"], r["jvm x"] or 0.0) for r in rows
                     if r["probe"] == "engine"), default=None)
    notes.append(f"target: RSS (psoup, driver JVM) within {RSS_TARGET}x as the landed data "
                 f"grows 4x: worst {worst:.2f}x -> {_verdict(worst <= RSS_TARGET)}"
                 + ("" if old_worst is None else
                    f" (probed in the psoup process, its window of {s['retain_rows']:,} rows "
                    f"in memory: {old_worst:.2f}x)"))
    cluster = [r for r in rows if r["master"] == CLUSTER]
    if cluster:
        notes.append("on the standalone cluster (a master and two workers of one core each, "
                     "on this machine's two CPUs, beside the driver and psoup): " + ", ".join(
                         f"{r['source tuples/s']:,.0f} tuples/s at {r['queries']:,} queries"
                         for r in cluster))
    for master in MASTERS:
        row = at[(probe, master, first)]
        p50 = row["fresh p50 s"]
        notes.append(f"target: freshness p50 <= trigger ({FRESH_TRIGGER_S:g} s) + "
                     f"{FRESH_SLACK:g} s on {master}: p50 {p50:.2f} s, p99 "
                     f"{row['fresh p99 s']:.2f} s over {row['fresh samples']} files -> "
                     f"{_verdict(p50 <= FRESH_TRIGGER_S + FRESH_SLACK)}")
    return notes


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    labels = [f"{r['probe'][:4]}\n{r['master']}\n{r['queries']:,} q" for r in rows]
    x = np.arange(len(rows))
    for i, (key, label) in enumerate((("source tuples/s", "psoup, FROM FILES"),
                                      ("direct tuples/s", "psoup, Engine.insert"),
                                      ("spark tuples/s", "Spark's N filters"))):
        values = [r.get(key) or 0.0 for r in rows]
        ax.bar(x + (i - 1) * 0.27, values, width=0.27, label=label)
    ax.set_xticks(x, labels)
    ax.set_yscale("log")
    ax.set_ylabel("tuples / s")
    ax.set_title("Files landing in a folder: psoup's Spark source")
    ax.legend(fontsize=8)


def main() -> None:
    if "--child" in sys.argv:               # one measurement, in a process of its own
        kind, args = sys.argv[sys.argv.index("--child") + 1:][:2]
        run = measure_source if kind == "source" else measure_filters
        print(json.dumps(run(json.loads(args))))
        return
    level, suffix = common.size_flag(__doc__)
    s = _settings(level)
    write_report(bench(s), s, suffix)


def write_report(rows: list[dict[str, Any]], s: dict[str, Any], suffix: str) -> None:
    """The table, its notes (the targets' verdicts first), the JSON and the PNG."""
    info = common.machine_info()
    notes = verdicts(rows, s) + [
        f"measured on {common.cpu_line(info)}, {info['cpu_count']} CPUs; Spark's JVM runs "
        "at nice 10 (psoup.spark.session), the psoup process at the caller's",
        f"the source: Parquet files of {s['file_rows']:,} tuples, {s['files_per_trigger']} "
        f"per micro-batch, trigger '{THROUGHPUT_TRIGGER}'; tuples/s over the last three "
        f"of four equal parts ({s['files'] * s['file_rows'] * 3 // 4:,} tuples), from "
        "their renaming into the folder to the stream counting them; probe 'executors': "
        "each task probes and writes its partition, psoup commits the batch (its files "
        "fsync'ed); probe 'engine': each batch collected to the psoup process, inserted "
        "and forced to disk",
        "direct: Engine.insert and commit on a durable engine with the same retention and "
        "queries, one insert per micro-batch's tuples, same process after the source",
        f"Spark's N filters: bench/peers.py's query over the first {s['filter_files']} of "
        f"the same files ({s['filter_files'] * s['file_rows']:,} tuples), one per "
        f"micro-batch, trigger availableNow, driver heap {FILTERS_MEMORY}; "
        "steady: its micro-batches after the first (durations from its progress); its "
        "match counts equal numpy's",
        f"freshness: a file of {s['fresh_rows']:,} tuples renamed into the folder of a "
        f"stream with trigger '{FRESH_TRIGGER_S:g} second', at a random moment of the "
        "interval; until its marker row is in an invocation of a standing query (polled "
        f"every 10 ms), with the {s['queries'][0]:,} queries also registered",
        "memory: VmRSS of the psoup process and of the driver JVM once the first part is "
        "in (1x) and once all four are (4x); each master and query count in a fresh process",
        "CPUs: each run's process tree (psoup, Spark's JVM, its Python workers) pinned to "
        "that many CPUs: local[1] to one, so that local[2] / local[1] says what a second "
        "core gives (unpinned, Spark's JVM decodes local[1]'s input on the other CPU)",
    ]
    common.report(f"spark_live{suffix}", rows, [
        ("probe", "probe", "s"), ("master", "master", "s"), ("cpus", "CPUs", "d"),
        ("queries", "queries", ",d"),
        ("tuples", "tuples", ",d"), ("source tuples/s", "FROM FILES tuples/s", ",.0f"),
        ("direct tuples/s", "Engine.insert tuples/s", ",.0f"),
        ("source/direct", "source/direct", ".3f"), ("x local[1]", "x local[1]", ".2f"),
        ("first part s", "first part s", ".2f"), ("batches", "batches", ",d"),
        ("spark tuples/s", "Spark filters tuples/s", ",.0f"),
        ("spark steady tuples/s", "Spark steady", ",.0f"),
        ("spark codegen", "Spark codegen", "s"),
        ("psoup/spark", "psoup/Spark", ",.0f"),
        ("psoup/spark steady", "psoup/Spark steady", ",.0f"),
        ("psoup mb 1x", "psoup MB 1x", ",.0f"), ("psoup mb 4x", "psoup MB 4x", ",.0f"),
        ("psoup x", "psoup 4x/1x", ".2f"), ("jvm mb 1x", "JVM MB 1x", ",.0f"),
        ("jvm mb 4x", "JVM MB 4x", ",.0f"), ("jvm x", "JVM 4x/1x", ".2f"),
        ("fresh p50 s", "fresh p50 s", ".2f"), ("fresh p99 s", "fresh p99 s", ".2f"),
    ], _plot, notes=notes, params={**s, "masters": list(MASTERS), "probes": list(PROBES),
                                   "throughput_trigger": THROUGHPUT_TRIGGER,
                                   "fresh_trigger_s": FRESH_TRIGGER_S})


if __name__ == "__main__":
    main()
