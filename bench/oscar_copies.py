"""Hourly averages from the archive's aggregate copies vs from its tuples (issue 18,
"windowed-aggregate copies"), in the same run.

An archive of N sensor readings (full: 2 million over 4 days, Poisson arrivals; quick:
100,000 over 2 days), `S (v FLOAT, k INT)`, written by a durable engine as its tuples
leave retention (RETAIN 10,000 ROWS), so the archive's part files get their copies
(COUNT, SUM, MIN, MAX per minute, hour and day: psoup.archive.rollups) as the archive
flushes them. Two measurements:

- engine: `SELECT COUNT(*), AVG(v) FROM S [RANGE 1 HOUR]`, a query with an archive
  tier (history), invoked at every hour boundary of the archive (NOW = h: the window
  [h - 3600, h] is one whole hour plus the tuples at ts = h), answered from the copies
  (psoup.results.answers `Answers.substitute`) and from the tier's tuples (the same
  engine with its copies switched off: what it did before). Both after a first pass
  that fills the caches (the tier's decoded segments, up to 64 MB; the decoded
  copies, up to 32 MB), and that first pass itself (cold: caches emptied, compiled kernels kept).
  Then `SELECT COUNT(*), AVG(v) FROM S` (everything: the archive's whole days from
  the copies, the rest of the tier and memory from tuples) invoked once, the same ways.
  The tiers are the ones a history job over an empty archive gives
  (`ArchiveTiers.begin`/`finish` before any tuple arrives), grown as the tuples left
  retention: no Spark pass.
- archive: the hourly averages of the whole archive, from the hour copies read from
  disk (`Rollups.buckets`) vs from the part files' tuples (pyarrow reads ts and v, numpy
  groups by hour), and DuckDB's GROUP BY over the part files as a peer.

Every answer from the copies is checked against the tuples' (COUNT exact, AVG to 1e-9).

Run by bench/oscar.py (`psoup bench oscar`), after its reduced-read part; writes
bench/results/oscar_copies.json and .png.
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

import psoup  # noqa: E402
from psoup.plans import SelectionPlan  # noqa: E402

HOUR = 3600.0
START = 86400.0 * 19000              # a UTC midnight
QUERY = "SELECT COUNT(*), AVG(v) FROM S [RANGE 1 HOUR]"
#: The same over everything (archive and memory): the copies' days and whole tier.
EVERYTHING = "SELECT COUNT(*), AVG(v) FROM S"


def _settings(level: common.Level) -> dict[str, int]:
    if level == "smoke":
        return {"rows": 10_000, "days": 2, "batch": 2_000, "retain": 2_000, "repeat": 1}
    if level == "quick":
        return {"rows": 100_000, "days": 2, "batch": 10_000, "retain": 10_000, "repeat": 2}
    return {"rows": 2_000_000, "days": 4, "batch": 50_000, "retain": 10_000, "repeat": 5}


def build(state: Path, s: dict[str, int]) -> tuple[psoup.Engine, list[str], float]:
    """A durable engine on `state` whose archive holds all but `retain` of the rows;
    the handles of QUERY and EVERYTHING; the last ts."""
    gen = common.rng(181)
    eng = psoup.Engine(path=str(state))
    eng.execute(f"CREATE STREAM S (v FLOAT, k INT) RETAIN {s['retain']} ROWS")
    handles = [eng.register(QUERY), eng.register(EVERYTHING)]
    core = eng._core
    slots: dict[int, str] = {}
    for h in handles:
        plan = core.plan(h)
        assert isinstance(plan, SelectionPlan)      # one stream: no join plan
        slots[plan.slot] = h
    core.tiers.begin("S", list(slots))
    core.tiers.finish({"S": {slot: [] for slot in slots}}, slots)
    rate = s["rows"] / (s["days"] * 86400.0)
    ts = START + np.cumsum(gen.exponential(1.0 / rate, s["rows"]))
    for a in range(0, s["rows"], s["batch"]):
        b = min(a + s["batch"], s["rows"])
        eng.insert("S", {"v": np.round(gen.normal(20.0, 5.0, b - a), 3),
                         "k": gen.integers(0, 100, b - a)}, ts=ts[a:b])
        if (a // s["batch"]) % 4 == 3:
            eng.checkpoint()
    eng.checkpoint()
    return eng, handles, float(ts[-1])


def invocations(eng: psoup.Engine, handle: str, hours: list[float], copies: bool,
                repeat: int) -> tuple[list[Any], float, float]:
    """The answers at each of `hours`, the seconds of a cold pass (caches emptied),
    and the median seconds of a warm pass, from the copies or from the tier's tuples."""
    core = eng._core
    journal = eng._durability.journal
    assert journal is not None and journal.archive.rollups is not None   # durable
    rollups = journal.archive.rollups
    core.answers.rollups = rollups if copies else None
    eng.invoke(handle, now=hours[0])       # the memory part's kernels compiled (numba)
    core.tiers._cache.clear()
    core.tiers._cached = 0
    rollups._cache.clear()
    rollups._cached = 0
    core.answers._substituted = None

    def run() -> list[Any]:
        return [eng.invoke(handle, now=h).rows[0] for h in hours]

    t0 = time.perf_counter()
    answers = run()
    cold = time.perf_counter() - t0
    with common.settled():
        warm = common.timed(run, repeat=repeat).median
    core.answers.rollups = rollups
    return answers, cold, warm


def whole_archive(root: Path, aggregates: Path) -> dict[str, Any]:
    """Hourly averages of the whole archive three ways, timed once each, checked."""
    import duckdb
    import pyarrow.parquet as pq

    from psoup.archive.rollups import Grain, Rollups
    from psoup.archive.sampling import in_order
    from psoup.query.model import ColumnType

    t0 = time.perf_counter()
    r = Rollups(root, aggregates)
    got = r.buckets("S", Grain.HOUR, [("v", ColumnType.FLOAT)])
    copies = dict(zip(got.bucket.tolist(), (got.columns["v"][0] / got.rows).tolist(),
                      strict=True))
    t_copies = time.perf_counter() - t0

    t0 = time.perf_counter()
    parts = sorted(root.glob("stream=S/date=*/part-*.parquet"))
    tables = [in_order(pq.read_table(p, columns=["ts", "tuple_id", "v", "psoup_sample"]))
              for p in parts]
    ts = np.concatenate([t.column("ts").to_numpy() for t in tables])
    v = np.concatenate([t.column("v").to_numpy() for t in tables])
    hour = np.floor_divide(ts, HOUR).astype(np.int64)
    keys, codes = np.unique(hour, return_inverse=True)
    tuples = dict(zip(keys.tolist(), (np.bincount(codes, v) / np.bincount(codes)).tolist(),
                      strict=True))
    t_tuples = time.perf_counter() - t0

    t0 = time.perf_counter()
    relation = duckdb.sql(
        f"SELECT CAST(floor(ts / {HOUR}) AS BIGINT) AS h, avg(v) FROM read_parquet("
        f"'{root}/stream=S/*/*.parquet') GROUP BY h")
    assert relation is not None                     # a SELECT gives a relation
    duck = dict(relation.fetchall())
    t_duck = time.perf_counter() - t0
    for table in (tuples, duck):
        assert copies.keys() == table.keys()
        assert all(math.isclose(copies[k], table[k], rel_tol=1e-9) for k in copies)
    return {"hours": len(copies), "rows": int(got.rows.sum()), "copies": t_copies,
            "tuples": t_tuples, "duckdb": t_duck,
            "copy_bytes": r.disk_bytes("S"),
            "part_bytes": sum(p.stat().st_size for p in parts)}


def bench(s: dict[str, int]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    folder = Path(tempfile.mkdtemp(prefix="psoup-oscar-"))
    try:
        t0 = time.perf_counter()
        eng, (hourly, everything), last = build(folder / "state", s)
        built = time.perf_counter() - t0
        journal = eng._durability.journal
        assert journal is not None
        archived = journal.archive.latest_ts("S")
        assert archived is not None                 # build() archived all but `retain`
        hours = [START + HOUR * k for k in range(1, int((archived - START) // HOUR) + 1)]
        fast, fast_cold, fast_warm = invocations(eng, hourly, hours, True, s["repeat"])
        slow, slow_cold, slow_warm = invocations(eng, hourly, hours, False, s["repeat"])
        now = [last]
        all_fast, all_fast_cold, all_fast_warm = invocations(eng, everything, now, True,
                                                             s["repeat"])
        all_slow, all_slow_cold, all_slow_warm = invocations(eng, everything, now, False,
                                                             s["repeat"])
        for a, b in zip(fast + all_fast, slow + all_slow, strict=True):
            assert a[0] == b[0] and math.isclose(a[1], b[1], rel_tol=1e-9), (a, b)
        assert all_fast[0][0] == s["rows"]
        eng.close()
        whole = whole_archive(folder / "state" / "archive", folder / "state" / "aggregates")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    n = len(hours)
    rows: list[dict[str, Any]] = [
        {"what": f"engine, {n} hourly invocations, warm", "copies ms": fast_warm * 1e3,
         "tuples ms": slow_warm * 1e3, "duckdb ms": None, "ratio": slow_warm / fast_warm},
        {"what": f"engine, {n} hourly invocations, cold", "copies ms": fast_cold * 1e3,
         "tuples ms": slow_cold * 1e3, "duckdb ms": None, "ratio": slow_cold / fast_cold},
        {"what": "engine, average of everything, warm", "copies ms": all_fast_warm * 1e3,
         "tuples ms": all_slow_warm * 1e3, "duckdb ms": None,
         "ratio": all_slow_warm / all_fast_warm},
        {"what": "engine, average of everything, cold", "copies ms": all_fast_cold * 1e3,
         "tuples ms": all_slow_cold * 1e3, "duckdb ms": None,
         "ratio": all_slow_cold / all_fast_cold},
        {"what": f"archive, {whole['hours']} hourly averages", "copies ms": whole["copies"] * 1e3,
         "tuples ms": whole["tuples"] * 1e3, "duckdb ms": whole["duckdb"] * 1e3,
         "ratio": whole["tuples"] / whole["copies"]},
    ]
    extra = {"build_s": built, "archived_rows": whole["rows"], "copy_bytes": whole["copy_bytes"],
             "part_bytes": whole["part_bytes"]}
    return rows, extra


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    labels = [r["what"] for r in rows]
    y = np.arange(len(rows))
    ax.barh(y - 0.27, [r["tuples ms"] for r in rows], 0.27, label="from tuples")
    ax.barh(y, [r["copies ms"] for r in rows], 0.27, label="from aggregate copies")
    duck = [(k, r["duckdb ms"]) for k, r in enumerate(rows) if r["duckdb ms"] is not None]
    ax.barh([y[k] + 0.27 for k, _ in duck], [ms for _, ms in duck], 0.27,
            label="DuckDB over the part files")
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("ms (log)")
    ax.set_title("Hourly averages: aggregate copies vs tuples")
    ax.legend()


def report_copies(level: common.Level, suffix: str) -> None:
    """Measure and report (bench/results/oscar_copies{suffix}.json and .png)."""
    s = _settings(level)
    rows, extra = bench(s)
    common.report(f"oscar_copies{suffix}", rows, [
        ("what", "measurement", "s"), ("copies ms", "copies ms", ".2f"),
        ("tuples ms", "tuples ms", ".2f"), ("duckdb ms", "DuckDB ms", ".2f"),
        ("ratio", "tuples/copies", ".1f"),
    ], _plot, notes=[
        f"{extra['archived_rows']:,} archived rows; copies {extra['copy_bytes']:,} bytes on "
        f"disk beside {extra['part_bytes']:,} bytes of part files "
        f"({extra['copy_bytes'] / extra['part_bytes']:.1%}); engine built in "
        f"{extra['build_s']:.1f} s",
        "every hourly answer from the copies matched the tuples' (COUNT exact, AVG 1e-9); "
        "the whole-archive averages matched numpy's and DuckDB's",
        "warm 'everything' repeats one NOW: the engine reuses the copies' totals planned for "
        "it (until the archive flushes), and reads only the tier's rest and memory"],
        params={**s, **extra})

