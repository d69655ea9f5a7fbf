"""Historical evaluation on Spark: many standing queries over a large archive in one pass
(issue 6), against one Spark SQL filter job per query, in the same run.

An archive of N traffic readings (full: 10 million; the layout of psoup.archive.parquet,
two days) and Q = 1,024 queries `lane = c1 AND stationid = c2 AND speed > c3` (c3 in
85..99, so each matches about 0.1% of the readings). psoup's pass
(psoup.spark.history.evaluate, what `Engine.evaluate_history` runs) reads the archive
once and probes every Arrow batch with a Query SteM holding all Q queries inside the
executors (`mapInArrow`), which write every (query, tuple) match as Parquet, by query
and sorted, for psoup to keep as the queries' archive tier files (indexed from their
footers, never read back whole). The baseline runs each query as its own Spark SQL job
(`where(...)`, the matching tupleIDs collected as Arrow); it is timed on a sample of the
queries and its total extrapolated to all Q (marked as such). The match counts of the
sample are checked against psoup's.

`--scale` (report history_scale) runs the same pass over archives of 1, 10 and 30
million readings (quick: 0.1, 0.3, 1 million), each in a process of its own, and
reports the peak memory of the driver's two processes, psoup's Python (which keeps an
index of the tier files, not the matches) and Spark's driver JVM (which no match
passes through), against the smallest archive's (target: within 1.5x);
and the pass over the middle archive on local[1] against local[2] (target: >= 1.7x
from 1 to 2 cores).

Usage: python bench/history.py [--quick] [--scale]
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)
import traffic  # noqa: E402  (the trace's generator)

TARGET = 20.0          # psoup's pass >= 20x faster than one Spark SQL job per query
DDL = "CREATE STREAM traffic (lane INT, stationid INT, speed FLOAT)"


def _settings(quick: bool) -> dict:
    if quick:
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


def _pass(spark, root: Path, n: int, wheres: list[str]) -> tuple[dict, float]:
    """psoup's pass over the archive of n readings under `root` with a query per WHERE
    clause (Spark up and the files listed first, untimed), its tier files written under
    `root`/tiers: (match count by slot, seconds)."""
    from psoup.query import compile_statement
    from psoup.spark import history

    spark.read.parquet(str(root / "stream=traffic")).count()
    queries = [(slot, f"SELECT * FROM traffic WHERE {w}") for slot, w in enumerate(wheres)]
    schema = compile_statement(DDL, {})
    began = time.perf_counter()
    segments = history.evaluate(spark, root, DDL, schema, queries, n, root / "tiers")
    seconds = time.perf_counter() - began
    return {slot: sum(seg.rows for seg in segs) for slot, segs in segments.items()}, seconds


def bench(s: dict) -> list[dict]:
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


def _plot(ax, rows) -> None:
    ax.bar([0, 1], [rows[0]["seconds"], rows[1]["seconds"]], color=["C0", "C3"])
    ax.set_xticks([0, 1], ["psoup, one pass", "one Spark SQL job\nper query (extrapolated)"])
    ax.set_yscale("log")
    ax.set_ylabel("seconds")
    ax.set_title(f"{rows[0]['queries']:,} queries over {rows[2]['rows']:,} archived tuples")


SCALE_SIZES = {False: [1_000_000, 10_000_000, 30_000_000], True: [100_000, 300_000, 1_000_000]}
RSS_TARGET = 1.5          # the driver JVM's peak memory at the largest archive / smallest
CORES_TARGET = 1.7        # local[2] / local[1] speed-up


def _measure(n: int, queries: int, master: str) -> dict:
    """In this process: an archive of n readings, Spark on `master`, psoup's pass; the
    seconds, matches and peak memory (MB) of this process and of the driver JVM."""
    from psoup.spark.session import spark_session

    root = Path(tempfile.mkdtemp(prefix="psoup-history-scale-"))
    try:
        write_archive(root, n, 1_000_000)
        matches, seconds = _pass(spark_session(master), root, n, _queries(queries))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    jvm = 0.0
    for pid in _descendants(os.getpid()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "java" in command and "VmHWM:" in status:
            jvm = max(jvm, int(status.split("VmHWM:")[1].split()[0]) / 1024)
    return {"seconds": seconds, "matches": sum(matches.values()),
            "python_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "jvm_mb": jvm}


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
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _in_process(n: int, queries: int, master: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--measure", str(n), str(queries),
                           master], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def scale(quick: bool, suffix: str) -> None:
    sizes = SCALE_SIZES[quick]
    queries = 64 if quick else 256
    rows = [dict(_in_process(n, queries, "local[2]"), rows=n, master="local[2]")
            for n in sizes]
    rows.append(dict(_in_process(sizes[1], queries, "local[1]"), rows=sizes[1],
                     master="local[1]"))
    base = rows[0]
    for row in rows:
        row["python_x"] = row["python_mb"] / base["python_mb"]
        row["jvm_x"] = row["jvm_mb"] / max(base["jvm_mb"], 1e-9)
        row["rows_per_s"] = row["rows"] / row["seconds"]
    jvm_x = rows[len(sizes) - 1]["jvm_x"]
    cores = rows[-1]["seconds"] / rows[1]["seconds"]
    common.report(f"history_scale{suffix}", rows, [
        ("master", "Spark", "s"), ("rows", "archived tuples", ",d"),
        ("matches", "matches", ",d"), ("seconds", "seconds", ",.1f"),
        ("rows_per_s", "tuples/s", ",.0f"), ("python_mb", "psoup peak MB", ",.0f"),
        ("python_x", "psoup x smallest", ".2f"), ("jvm_mb", "driver JVM peak MB", ",.0f"),
        ("jvm_x", "JVM x smallest", ".2f"),
    ], _plot_scale, notes=[
        f"{queries} queries; each row a process of its own (peak memory is per process)",
        f"driver JVM peak memory at {sizes[-1]:,} tuples / at {sizes[0]:,}: {jvm_x:.2f}x "
        f"(target <= {RSS_TARGET}x: {'met' if jvm_x <= RSS_TARGET else 'NOT met'})",
        f"psoup's own peak memory (an index of the tier files): "
        f"{rows[len(sizes) - 1]['python_x']:.2f}x",
        f"local[2] / local[1] on {sizes[1]:,} tuples: {cores:.2f}x faster (target >= "
        f"{CORES_TARGET}x: {'met' if cores >= CORES_TARGET else 'NOT met'}; 2 cores shared "
        "with the driver)"], params={"sizes": sizes, "queries": queries})


def _plot_scale(ax, rows) -> None:
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
        at = sys.argv.index("--measure")
        n, queries, master = int(sys.argv[at + 1]), int(sys.argv[at + 2]), sys.argv[at + 3]
        print(json.dumps(_measure(n, queries, master)))
        return
    scaled = "--scale" in sys.argv
    if scaled:
        sys.argv.remove("--scale")
    quick, suffix = common.quick_flag(__doc__)
    if scaled:
        scale(quick, suffix)
        return
    s = _settings(quick)
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
