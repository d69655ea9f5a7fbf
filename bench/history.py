"""Historical evaluation on Spark: many standing queries over a large archive in one pass
(issue 6), against one Spark SQL filter job per query, in the same run.

An archive of N traffic readings (full: 10 million; the layout of psoup.archive.parquet,
two days) and Q = 1,024 queries `lane = c1 AND stationid = c2 AND speed > c3` (c3 in
85..99, so each matches about 0.1% of the readings). psoup's pass
(psoup.spark.history.evaluate, what `Engine.evaluate_history` runs) reads the archive
once and probes every Arrow batch with a Query SteM holding all Q queries inside the
executors (`mapInArrow`), which write each query's matches, sorted by tupleID, as the
files of its archive tier, which psoup then moves into place (it opens none). The
baseline runs each query as its own Spark SQL job (`where(...)`, the matching tupleIDs
collected as Arrow); it is timed on a sample of the queries and its total extrapolated
to all Q (marked as such). The match counts of the sample are checked against psoup's.

`--scale` (report history_scale) runs the same pass over archives of 1, 10 and 30
million readings (quick: 0.1, 0.3, 1 million), each in a process of its own, and reports
the peak memory of the driver's two processes, psoup's Python (which keeps an index of
the tier files and never reads a match) and Spark's driver JVM (which no match passes
through), against the smallest archive's (target: within 1.5x); and the pass over the middle
archive with 2 cores (local[2]) against 1 core (local[1] with every process pinned to
one CPU; target: >= 1.7x), against local[1] unpinned, and on a standalone cluster of two
one-core workers started on 127.0.0.1.

Usage: python bench/history.py [--quick | --smoke] [--scale]
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)
import traffic  # noqa: E402  (the trace's generator)

TARGET = 20.0          # psoup's pass >= 20x faster than one Spark SQL job per query
DDL = "CREATE STREAM traffic (lane INT, stationid INT, speed FLOAT)"


def _settings(level: common.Level) -> dict[str, int]:
    if level == "smoke":
        return {"rows": 20_000, "queries": 8, "sample": 2, "file_rows": 10_000}
    if level == "quick":
        return {"rows": 200_000, "queries": 64, "sample": 4, "file_rows": 100_000}
    return {"rows": 10_000_000, "queries": 1024, "sample": 12, "file_rows": 1_000_000}


def write_archive(root: Path, n: int, file_rows: int) -> None:
    """n readings, 100 per second from the epoch, as psoup's archive of `traffic`."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    gen = common.rng(81)
    for first in range(0, n, file_rows):
        last = min(first + file_rows, n) - 1
        ts = np.arange(first, last + 1, dtype=np.float64) / 100.0
        day = time.strftime("%Y-%m-%d", time.gmtime(ts[0]))
        folder = root / "stream=traffic" / f"date={day}"
        folder.mkdir(parents=True, exist_ok=True)
        cols = traffic.readings(gen, last - first + 1)
        table = pa.table({"ts": ts, "tuple_id": np.arange(first, last + 1, dtype=np.int64),
                          **cols})
        pq.write_table(table, folder / f"part-{first:020d}-{last:020d}.parquet")


def _queries(n: int) -> list[str]:
    gen = common.rng(82)
    return [f"lane = {gen.integers(1, 9)} AND stationid = {gen.integers(1, 10)} AND "
            f"speed > {gen.integers(85, 100)}" for _ in range(n)]


def _pass(spark: Any, root: Path, n: int, wheres: list[str]) -> tuple[dict[int, int], float]:
    """psoup's pass over the archive of n readings under `root` with a query per WHERE
    clause (Spark up and the files listed first, untimed), its tier files written under
    `root`/tiers: (match count by slot, seconds)."""
    from psoup.query import compile_statement
    from psoup.query.model import StreamSchema
    from psoup.spark import history

    spark.read.parquet(str(root / "stream=traffic")).count()
    queries = [(slot, f"SELECT * FROM traffic WHERE {w}") for slot, w in enumerate(wheres)]
    schema = compile_statement(DDL, {})
    assert isinstance(schema, StreamSchema)
    began = time.perf_counter()
    segments = history.evaluate(spark, root, DDL, schema, queries, n, root / "tiers")
    seconds = time.perf_counter() - began
    return {slot: sum(seg.rows for seg in segs) for slot, segs in segments.items()}, seconds


def bench(s: dict[str, int]) -> list[dict[str, Any]]:
    from psoup.spark.session import spark_session

    root = Path(tempfile.mkdtemp(prefix="psoup-history-"))
    try:
        began = time.perf_counter()
        write_archive(root, s["rows"], s["file_rows"])
        build_s = time.perf_counter() - began
        spark = spark_session()
        folder = str(root / "stream=traffic")
        wheres = _queries(s["queries"])
        matches, psoup_s = _pass(spark, root, s["rows"], wheres)
        per_slot = np.array([matches[slot] for slot in range(len(wheres))])

        frame = spark.read.parquet(folder)
        sample = list(range(0, len(wheres), len(wheres) // s["sample"]))[:s["sample"]]
        began = time.perf_counter()
        for slot in sample:
            got = frame.where(wheres[slot]).select("tuple_id").toArrow()
            if got.num_rows != per_slot[slot]:
                raise AssertionError(f"query {slot}: Spark SQL found {got.num_rows} "
                                     f"matches, psoup {per_slot[slot]}")
        per_query_s = (time.perf_counter() - began) / len(sample)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    total = per_query_s * len(wheres)
    return [
        {"method": "psoup: one pass, all queries (mapInArrow)", "queries": len(wheres),
         "seconds": psoup_s, "matches": int(per_slot.sum()), "measured": "yes"},
        {"method": "Spark SQL: one filter job per query", "queries": len(wheres),
         "seconds": total, "matches": None,
         "measured": f"{len(sample)} jobs timed, x{len(wheres) / len(sample):.0f}"},
        {"method": "ratio (per-query jobs / psoup)", "queries": len(wheres),
         "seconds": total / psoup_s, "matches": None, "measured": "",
         "rows": s["rows"], "build_s": build_s},
    ]


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    ax.bar([0, 1], [rows[0]["seconds"], rows[1]["seconds"]], color=["C0", "C3"])
    ax.set_xticks([0, 1], ["psoup, one pass", "one Spark SQL job\nper query (extrapolated)"])
    ax.set_yscale("log")
    ax.set_ylabel("seconds")
    ax.set_title(f"{rows[0]['queries']:,} queries over {rows[2]['rows']:,} archived tuples")


SCALE_SIZES = {False: [1_000_000, 10_000_000, 30_000_000], True: [100_000, 300_000, 1_000_000]}
RSS_TARGET = 1.5          # peak memory at the largest archive / at the smallest
CORES_TARGET = 1.7        # 2 cores (local[2]) / 1 core (local[1], pinned to one CPU)


def _measure(root: Path, n: int, queries: int, master: str,
             cpus: int | None) -> dict[str, Any]:
    """In this process (pinned to `cpus` CPUs, with the Spark processes it starts, when
    given): Spark on `master`, psoup's pass over the archive of n readings under `root`;
    the seconds, matches and peak memory (MB) of this process and of the driver JVM."""
    from psoup.spark.session import spark_session

    if cpus is not None:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])
    spark = spark_session(master)
    times: list[float] = []
    peaks: list[tuple[float, float]] = []
    for _ in range(2):              # the first job of a session, then one after it
        try:
            matches, seconds = _pass(spark, root, n, _queries(queries))
            times.append(seconds)
            peaks.append(_peaks())
        finally:
            shutil.rmtree(root / "tiers", ignore_errors=True)
    return {"seconds": times[0], "warm_seconds": times[1], "matches": sum(matches.values()),
            "python_mb": peaks[0][0], "jvm_mb": peaks[0][1], "python_2_mb": peaks[1][0],
            "jvm_2_mb": peaks[1][1]}


def _peaks(field: str = "VmHWM") -> tuple[float, float]:
    """Peak memory (MB) so far of this process and of the driver JVM it started (VmHWM,
    not ru_maxrss: a process's ru_maxrss starts from its parent's at the fork, and the
    parent wrote the archive); with field="VmRSS", the memory they hold now."""
    jvm = 0.0
    for pid in _descendants(os.getpid()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "java" in command and f"{field}:" in status:
            jvm = max(jvm, int(status.split(f"{field}:")[1].split()[0]) / 1024)
    python = int(Path("/proc/self/status").read_text().split(f"{field}:")[1].split()[0])
    return python / 1024, jvm


def _descendants(pid: int) -> list[int]:
    """The processes started (directly or not) by `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _in_process(root: Path, n: int, queries: int, master: str,
                cpus: int | None = None) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--measure", str(root), str(n),
                           str(queries), master, str(cpus or 0)],
                          capture_output=True, text=True, check=True)
    return cast(dict[str, Any], json.loads(done.stdout.strip().splitlines()[-1]))


@contextmanager
def standalone(workers: int) -> Iterator[str]:
    """A Spark standalone master and `workers` one-core workers on 127.0.0.1, started
    from the installed pyspark's spark-class and stopped by process group on exit:
    yields the master's URL."""
    import pyspark

    home, folder = Path(pyspark.__file__).parent, Path(tempfile.mkdtemp(prefix="psoup-sc-"))
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(folder), PYSPARK_PYTHON=sys.executable)
    env.pop("PSOUP_SPARK_CONF", None)
    port = _free_port()
    url, log = f"spark://127.0.0.1:{port}", folder / "master.log"
    commands = [["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                 str(port), "--webui-port", str(_free_port())]]
    commands += [["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores",
                  "1", "--memory", "2g", "--work-dir", str(folder / f"work-{i}"),
                  "--webui-port", str(_free_port()), url] for i in range(workers)]
    started: list[subprocess.Popen[bytes]] = []
    try:
        for i, command in enumerate(commands):
            with open(log if i == 0 else folder / f"worker-{i}.log", "wb") as out:
                started.append(subprocess.Popen(
                    [str(home / "bin" / "spark-class"), *command], env=env, stdout=out,
                    stderr=subprocess.STDOUT, cwd=folder, start_new_session=True))
        deadline = time.monotonic() + 120
        while log.read_bytes().count(b"Registering worker") < workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standalone cluster did not start: see {folder}")
            time.sleep(0.5)
        yield url
    finally:
        for proc in started:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in started:
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return cast(int, s.getsockname()[1])


def scale(quick: bool, suffix: str) -> None:
    sizes = SCALE_SIZES[quick]
    queries = 64 if quick else 256
    rows: list[dict[str, Any]] = []
    for n in sizes:
        root = Path(tempfile.mkdtemp(prefix="psoup-history-scale-"))
        try:
            write_archive(root, n, 1_000_000)
            runs: list[tuple[str, str, int | None]] = [("local[2]", "local[2]", None)]
            if n == sizes[1]:
                runs += [("local[1], 1 CPU", "local[1]", 1), ("local[1]", "local[1]", None)]
                with standalone(2) as url:
                    rows.append(dict(_in_process(root, n, queries, url), rows=n,
                                     master="cluster, 2 x 1-core workers"))
            rows += [dict(_in_process(root, n, queries, master, cpus), rows=n, master=label)
                     for label, master, cpus in runs]
        finally:
            shutil.rmtree(root, ignore_errors=True)
    two = [r for r in rows if r["master"] == "local[2]"]
    base = two[0]
    for row in rows:
        row["python_x"] = row["python_mb"] / base["python_mb"]
        row["jvm_x"] = row["jvm_mb"] / max(base["jvm_mb"], 1e-9)
        row["rows_per_s"] = row["rows"] / row["warm_seconds"]
    at = {r["master"]: r for r in rows if r["rows"] == sizes[1]}
    jvm_x, python_x = two[-1]["jvm_x"], two[-1]["python_x"]
    def ratio(slow: str, fast: str, key: str = "warm_seconds") -> float:
        return cast(float, at[slow][key] / at[fast][key])
    cores, cold = ratio("local[1], 1 CPU", "local[2]"), ratio("local[1], 1 CPU", "local[2]",
                                                               "seconds")
    slots = ratio("local[1]", "local[2]")
    cluster = ratio("local[1], 1 CPU", "cluster, 2 x 1-core workers")
    common.report(f"history_scale{suffix}", rows, [
        ("master", "Spark", "s"), ("rows", "archived tuples", ",d"),
        ("matches", "matches", ",d"), ("seconds", "first job s", ",.1f"),
        ("warm_seconds", "next job s", ",.1f"),
        ("rows_per_s", "tuples/s (next)", ",.0f"), ("python_mb", "psoup peak MB", ",.0f"),
        ("python_x", "psoup x smallest", ".2f"), ("jvm_mb", "driver JVM peak MB", ",.0f"),
        ("jvm_x", "JVM x smallest", ".2f"), ("python_2_mb", "psoup MB, 2 jobs", ",.0f"),
        ("jvm_2_mb", "JVM MB, 2 jobs", ",.0f"),
    ], _plot_scale, notes=[
        f"{queries} queries; each row a process of its own (peak memory is per process; "
        "the archive is written by the parent), running two jobs: the session's first "
        "(JVM warm-up, Python workers starting) and the next, as a server runs them",
        f"peak memory of a job at {sizes[-1]:,} tuples / at {sizes[0]:,}: driver JVM "
        f"{jvm_x:.2f}x, psoup {python_x:.2f}x (target <= {RSS_TARGET}x: "
        f"{'met' if max(jvm_x, python_x) <= RSS_TARGET else 'NOT met'}); after a second "
        f"job the JVM's heap has grown further ({two[-1]['jvm_2_mb']:,.0f} MB at "
        f"{sizes[-1]:,}, {two[0]['jvm_2_mb']:,.0f} MB at {sizes[0]:,}), up to "
        "spark.driver.memory (512m, psoup's default), which in local mode is the "
        "executors' heap",
        f"2 cores / 1 core on {sizes[1]:,} tuples (local[2] / local[1] with every process "
        f"pinned to one CPU), the next job: {cores:.2f}x faster (target >= {CORES_TARGET}x: "
        f"{'met' if cores >= CORES_TARGET else 'NOT met'}); the session's first job: "
        f"{cold:.2f}x",
        f"local[2] / local[1] unpinned: {slots:.2f}x (local[1] is one task at a time, but "
        "its JVM and its Python worker run side by side, on both CPUs)",
        f"2-worker standalone cluster / 1 core, the next job: {cluster:.2f}x faster (the "
        "workers, the master and the driver share this machine's CPUs)"],
        params={"sizes": sizes, "queries": queries})


def _plot_scale(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    mine = [r for r in rows if r["master"] == "local[2]"]
    ax.plot([r["rows"] for r in mine], [r["python_mb"] for r in mine], "o-",
            label="psoup (Python) peak MB")
    ax.plot([r["rows"] for r in mine], [r["jvm_mb"] for r in mine], "s-",
            label="Spark driver JVM peak MB")
    ax.set_xscale("log")
    ax.set_xlabel("archived tuples")
    ax.set_ylabel("MB")
    ax.set_title("History: driver memory against archive size")
    ax.legend(fontsize=8)


def main() -> None:
    if "--measure" in sys.argv:                 # one measurement, in a process of its own
        root, n, queries, master, cpus = sys.argv[sys.argv.index("--measure") + 1:][:5]
        print(json.dumps(_measure(Path(root), int(n), int(queries), master,
                                  int(cpus) or None)))
        return
    scaled = "--scale" in sys.argv
    if scaled:
        sys.argv.remove("--scale")
    level, suffix = common.size_flag(__doc__)
    if scaled:                      # a smoke run scales over the quick sizes
        scale(level != "full", suffix)
        return
    s = _settings(level)
    rows = bench(s)
    ratio = rows[2]["seconds"]
    common.report(f"history{suffix}", rows, [
        ("method", "method", "s"), ("queries", "queries", ",d"),
        ("seconds", "seconds (last row: ratio)", ",.2f"), ("matches", "matches", ",d"),
        ("measured", "measured", "s"),
    ], _plot, notes=[
        f"{s['rows']:,} archived tuples; the sample's match counts agree with psoup's",
        f"psoup's single pass is {ratio:.0f}x faster than one Spark SQL job per query "
        f"(target >= {TARGET:.0f}x: {'met' if ratio >= TARGET else 'NOT met'})"], params=s)


if __name__ == "__main__":
    main()
