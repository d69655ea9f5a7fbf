"""Reduced reads of the archive ("Remembrance of Streams Past", Fig. 12): the time of a
COUNT(*) over the whole archive at reduction levels 0, 25, 50 and 75%, psoup's sampled
layout against the paper's strawman, in the same run.

An archive of N traffic readings (full: 10 million, 10 part files; the layout of
psoup.archive.parquet) is written twice, with the same rows: in psoup's sampled layout
(psoup.archive.sampling: each run of a file cut into 16 row groups by a uniform random
draw per row, each in tupleID order) and in the plain layout of archives written before
it, or by other tools (rows in tupleID order, no draws): the strawman, which must read
every row and sample in the executor (draws hashed from the tupleID).

At each reduction r, the standing query `SELECT COUNT(*) FROM traffic TABLESAMPLE SYSTEM
(100 - r)` is evaluated over each archive by psoup's history pass
(psoup.spark.history.evaluate, what `Engine.evaluate_history` runs: Spark reads the
archive, psoup's Query SteM probes each batch inside the executors, the matches are
written as the query's archive tier), and its answer is the tier's matches scaled by
1 / rate, with the 95% interval of psoup's estimator; the time is the pass's, end to
end. Each measurement is the better of two runs (a warm-up pass runs first).

Target (issue 18): at 75% reduction, psoup's time <= 0.35x its time at 0%.

Then the hourly averages from the archive's aggregate copies vs from its tuples
(bench/oscar_copies.py), reported as bench/results/oscar_copies.json and .png.

Usage: python bench/oscar.py [--quick | --smoke]
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
import oscar_copies  # noqa: E402  (the aggregate copies' part)
import traffic  # noqa: E402  (the trace's generator)

TARGET = 0.35          # time at 75% reduction / time at 0%
DDL = "CREATE STREAM traffic (lane INT, stationid INT, speed FLOAT)"
REDUCTIONS = [0, 25, 50, 75]


def _settings(level: common.Level) -> dict[str, int]:
    if level == "smoke":
        return {"rows": 20_000, "file_rows": 10_000, "repeat": 1}
    if level == "quick":
        return {"rows": 400_000, "file_rows": 100_000, "repeat": 1}
    return {"rows": 10_000_000, "file_rows": 1_000_000, "repeat": 2}


def write_archives(sampled: Path, plain: Path, n: int, file_rows: int) -> None:
    """n readings, 100 per second from the epoch, as psoup's archive of `traffic`, twice:
    in the sampled layout under `sampled`, in the plain one under `plain`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from psoup.archive.layout import arrow_schema, part_path
    from psoup.archive.sampling import write_runs

    schema = arrow_schema("traffic", [("lane", "int"), ("stationid", "int"),
                                      ("speed", "float")])
    gen = common.rng(121)
    draws = np.random.default_rng(122)
    for first in range(0, n, file_rows):
        last = min(first + file_rows, n) - 1
        ids = np.arange(first, last + 1, dtype=np.int64)
        table = pa.table({"ts": ids / 100.0, "tuple_id": ids,
                          **traffic.readings(gen, len(ids))}).cast(schema)
        for root, write in ((sampled, lambda t, p: write_runs(t, draws, p)),
                            (plain, lambda t, p: pq.write_table(t, p))):
            path = part_path(root, "traffic", float(ids[0]) / 100.0, first, last)
            path.parent.mkdir(parents=True, exist_ok=True)
            write(table, str(path))


def count_pass(spark: Any, root: Path, n: int, reduction: int, into: Path
               ) -> tuple[float, float, float]:
    """psoup's history pass of the COUNT(*) query at `reduction` over the archive under
    `root`: (seconds, the estimated count, the half-width of its 95% interval)."""
    from psoup.archive.rates import system_rate
    from psoup.query import compile_statement
    from psoup.query.model import StreamSchema
    from psoup.spark.history import evaluate

    schema = compile_statement(DDL, {})
    assert isinstance(schema, StreamSchema)
    rate = 1.0 if reduction == 0 else system_rate(1 - reduction / 100)
    sample = "" if reduction == 0 else f" TABLESAMPLE SYSTEM ({100 - reduction})"
    query = (0, f"SELECT COUNT(*) FROM traffic{sample}")
    shutil.rmtree(into, ignore_errors=True)
    t0 = time.perf_counter()
    found = evaluate(spark, root, DDL, schema, [query], n, into,
                     samples={} if rate == 1.0 else {0: ((-math.inf, rate),)})
    seconds = time.perf_counter() - t0
    matches = sum(seg.rows for seg in found[0])
    estimate = matches / rate
    error = 1.96 * math.sqrt(matches * (1 / rate ** 2 - 1 / rate))
    return seconds, estimate, error


def bench(s: dict[str, int]) -> list[dict[str, Any]]:
    from psoup.spark.session import spark_session

    n = s["rows"]
    work = Path(tempfile.mkdtemp(prefix="psoup-oscar-"))
    try:
        sampled, plain, into = work / "sampled", work / "plain", work / "tiers"
        t0 = time.perf_counter()
        write_archives(sampled, plain, n, s["file_rows"])
        print(f"wrote {n:,} readings twice in {time.perf_counter() - t0:.1f} s", flush=True)
        spark = spark_session()
        count_pass(spark, sampled, n, 75, into)             # warm-up: JVM, workers
        rows: list[dict[str, Any]] = []
        for reduction in REDUCTIONS:
            row: dict[str, Any] = {"reduction": reduction}
            for name, root in (("psoup", sampled), ("strawman", plain)):
                runs = [count_pass(spark, root, n, reduction, into)
                        for _ in range(s["repeat"])]
                seconds, estimate, error = min(runs)
                assert abs(estimate - n) <= max(error, 0.0) * 1.5 + 1e-9, \
                    (name, reduction, estimate, error)   # the answer is right
                row[f"{name}_s"] = seconds
                row[f"{name}_count"] = estimate
                row[f"{name}_error"] = error
            rows.append(row)
            print(f"reduction {reduction}%: psoup {row['psoup_s']:.2f} s, strawman "
                  f"{row['strawman_s']:.2f} s", flush=True)
        for row in rows:
            row["psoup_x"] = row["psoup_s"] / rows[0]["psoup_s"]
            row["strawman_x"] = row["strawman_s"] / rows[0]["strawman_s"]
            row["vs_strawman"] = row["strawman_s"] / row["psoup_s"]
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    x = [r["reduction"] for r in rows]
    ax.plot(x, [r["psoup_s"] for r in rows], "o-", label="psoup, sampled layout")
    ax.plot(x, [r["strawman_s"] for r in rows], "s--", color="C3",
            label="strawman: read all, sample in the executor")
    ax.set_xlabel("reduction level (%)")
    ax.set_ylabel("seconds (COUNT(*) over the archive)")
    ax.set_ylim(bottom=0)
    ax.set_title("Fig. 12: query time vs reduction level")
    ax.legend()


def main() -> None:
    level, suffix = common.size_flag(__doc__)
    s = _settings(level)
    rows = bench(s)
    at75 = rows[-1]["psoup_x"]
    common.report(f"oscar{suffix}", rows, [
        ("reduction", "reduction %", "d"), ("psoup_s", "psoup s", ".2f"),
        ("psoup_x", "x at 0%", ".2f"), ("strawman_s", "strawman s", ".2f"),
        ("strawman_x", "x at 0%", ".2f"), ("vs_strawman", "strawman/psoup", ".2f"),
        ("psoup_count", "psoup COUNT", ",.0f"), ("psoup_error", "+-95%", ",.0f"),
    ], _plot, notes=[
        f"{s['rows']:,} archived readings; each time the better of {s['repeat']} history "
        "passes (Spark reads, psoup probes in the executors, matches written as the tier)",
        f"psoup at 75% reduction: {at75:.2f}x its time at 0% (target <= {TARGET}: "
        f"{'met' if at75 <= TARGET else 'NOT met'}); the strawman at 75%: "
        f"{rows[-1]['strawman_x']:.2f}x",
    ], params=s)
    oscar_copies.report_copies(level, suffix)


if __name__ == "__main__":
    main()
