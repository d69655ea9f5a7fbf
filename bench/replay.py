"""Spark replay of an archive into a live engine, against Spark's own read rate (issue 6).

An archive of N readings of `traffic (lane INT, stationid INT, speed FLOAT)` (the trace
of bench/traffic.py, 50 readings a second across a UTC midnight; 2,000,000 rows, --quick
50,000) is written by psoup's `Archive`, as an engine would. Then, in the same run:

- read: Spark reads the archive the way replay does (slices of about 2^19 rows, which
  the executors sort per partition and write as Parquet to a staging folder, psoup
  reads back in (ts, tupleID) order), delivering nowhere:
  `psoup.spark.replay.ordered_runs` over a ready plan;
- replay: `psoup.spark.replay.replay` into an embedded PSoup-P engine holding 100 of the
  paper's traffic queries, `SELECT * FROM traffic WHERE lane = c1 AND stationid = c2 AND
  speed > c3`: the plan (the archive's checks and slicing, pyarrow in psoup),
  Spark's read, and the inserts through the eddy;
- and, to show where replay's time goes, the plan alone and the inserts alone (the
  same batches, from memory, into the same kind of engine).

Spark is started and warmed by one untimed read before anything is timed; each line is
the median of `repeat` runs, a fresh engine (queries registered) for each replay. The
issue's target: replay at >= 50% of Spark's read rate.

Usage: python bench/replay.py [--quick | --smoke]
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)
import traffic  # noqa: E402

import psoup  # noqa: E402
from psoup.archive.parquet import Archive  # noqa: E402
from psoup.spark.replay import SLICE_ROWS  # noqa: E402

TARGET = 0.5                  # replay >= 50% of Spark's read rate
T0 = 1_767_225_600.0 - 6 * 3600   # six hours before a UTC midnight
PER_SECOND = 50
COLUMNS = [("lane", "int"), ("stationid", "int"), ("speed", "float")]


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"rows": 5_000, "queries": 10, "repeat": 1, "master": "local[*]"}
    if level == "quick":
        return {"rows": 50_000, "queries": 100, "repeat": 3, "master": "local[*]"}
    return {"rows": 2_000_000, "queries": 100, "repeat": 3, "master": "local[*]"}


def write_archive(root: Path, n: int) -> None:
    """n traffic readings as psoup's archive writes them (files of 2^17 rows per day)."""
    gen = common.rng(91)
    archive = Archive(root)
    step = 1 << 17
    for first in range(0, n, step):
        rows = min(step, n - first)
        archive.add("traffic", COLUMNS, {
            "tupleID": np.arange(first, first + rows), **traffic.readings(gen, rows),
            "ts": T0 + np.arange(first, first + rows, dtype=np.float64) / PER_SECOND})
    archive.flush()


def _engine(sqls: list[str]) -> psoup.Engine:
    eng = psoup.Engine(mode="partial")
    eng.execute(traffic.CREATE)
    for sql in sqls:
        eng.register(sql)
    return eng


def bench(s: dict[str, Any], root: Path) -> list[dict[str, Any]]:
    from psoup.spark.replay import ordered_runs, plan_replay, replay
    from psoup.spark.session import spark_session

    n = s["rows"]
    write_archive(root, n)
    sqls = [f"SELECT * FROM traffic WHERE {w}"
            for w in traffic.queries(common.rng(92), s["queries"])]
    spark = spark_session(s["master"])
    plan = plan_replay([root], {})
    runs = list(ordered_runs(plan, spark))          # warms Spark up; the inserts' input
    assert sum(len(ts) for _, _, ts in runs) == n

    def read() -> None:
        got = sum(len(ts) for _, _, ts in ordered_runs(plan, spark))
        assert got == n

    times: dict[str, list[float]] = {"read": [], "replay": [], "plan": [], "insert": []}
    counts: list[int] = []
    for _ in range(s["repeat"]):
        with common.settled():
            t = common.timed(read, repeat=1)
        times["read"].append(t.total)
        with common.settled():
            t = common.timed(lambda: plan_replay([root], {}), repeat=1)
        times["plan"].append(t.total)
        eng = _engine(sqls)
        with common.settled():
            began = time.perf_counter()
            report = replay([root], eng, master=s["master"])
            times["replay"].append(time.perf_counter() - began)
        assert report.rows == n
        counts.append(sum(q["results"] for q in eng.stats()["queries"].values()))
        eng.close()
        eng = _engine(sqls)
        with common.settled():
            began = time.perf_counter()
            for name, columns, ts in runs:
                eng.insert(name, columns, ts=ts)
            times["insert"].append(time.perf_counter() - began)
        eng.close()
    assert len(set(counts)) == 1, counts
    labels = {"read": "Spark read, sliced and ordered (no delivery)",
              "replay": f"replay into PSoup-P, {s['queries']} queries",
              "plan": "  of which: plan (checks, slicing; pyarrow)",
              "insert": f"  of which: inserts alone ({s['queries']} queries)"}
    rows: list[dict[str, Any]] = []
    for key in ("read", "replay", "plan", "insert"):
        median = float(np.median(times[key]))
        rows.append({"what": labels[key], "rows": n, "seconds": median, "rows/s": n / median,
                     "runs": [round(x, 3) for x in times[key]]})
    rows[1]["matches"] = counts[0]
    return rows


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    ax.barh([r["what"].strip() for r in rows][::-1], [r["rows/s"] for r in rows][::-1],
            color=["C0", "C1", "C2", "C3"][:len(rows)][::-1])
    ax.set_xscale("log")
    ax.set_xlabel("rows per second (median)")
    ax.set_title(f"Replay vs Spark's read, {rows[0]['rows']:,} rows")


def main() -> None:
    level, suffix = common.size_flag(__doc__)
    quick = level != "full"
    s = _settings(level)
    with tempfile.TemporaryDirectory(prefix="psoup-replay-") as tmp:
        rows = bench(s, Path(tmp) / "archive")
    ratio = rows[1]["rows/s"] / rows[0]["rows/s"]
    common.report(f"replay{suffix}", rows, [
        ("what", "", "s"), ("rows", "rows", ",d"), ("seconds", "seconds (median)", ".3f"),
        ("rows/s", "rows/s", ",.0f"),
    ], _plot, notes=[
        f"replay/read = {ratio:.0%} of Spark's own read rate (target >= {TARGET:.0%}: "
        f"{'met' if ratio >= TARGET else 'NOT met'})",
        f"every replay gave the same {rows[1]['matches']:,} query matches; Spark master "
        f"{s['master']}, warmed by one untimed read",
    ], params={**s, "slice_rows": SLICE_ROWS,
               "per_second": PER_SECOND, "seed": common.SEED, "quick": quick})


if __name__ == "__main__":
    main()
