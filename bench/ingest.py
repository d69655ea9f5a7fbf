"""Ingest throughput with many standing queries (PSoup Sect. 5.2.4, Fig. 9).

Tuples per second through `Engine.insert`, in batches of column arrays, with 128 ... 4,096
inequality queries registered first, for PSoup-P and PSoup-C, each with the shared
predicate index (Shrd) and with every query evaluated on its own (Unshrd), as the
paper's four curves. psoup's Unshrd packs each query's mask into its bitmaps, most of its
time; so the unshared baseline is also measured as a numpy user writes it
(`common.UnsharedNumpy`: masks computed in place, matches kept as row numbers per query)
on the same batches, its matches checked against PSoup-P's on the last batch.

P_Shrd's rate with the retention full is set beside the C floor (bench/floor.py), and
beside the least an insert orchestrated in Python costs on the same engine's structures
(`least_python_insert`: the checks, the tupleIDs, a numpy copy per column and the
engine's compiled probe, nothing else), which says how much of the gap to the floor is
the engine's own bookkeeping and how much any Python-driven insert would pay.

With --large, P_Shrd alone is also measured at 10,000 and 100,000 queries (the other
variants would take minutes per batch there), as above and once the retention is full
(about a minute more, mostly registering 100,000 queries).

Usage: python bench/ingest.py [--quick | --smoke] [--large]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)
import floor  # noqa: E402

import psoup  # noqa: E402
from psoup.bits import aligned_zeros  # noqa: E402
from psoup.options import ModeName  # noqa: E402
from psoup.results.partial import ROW_PAD  # noqa: E402
from psoup.stems.batch import make_batch  # noqa: E402

#: (label, Engine mode, shared_index) per measured engine.
VARIANTS: tuple[tuple[str, ModeName, bool], ...] = (
    ("P_Shrd", "partial", True), ("P_Unshrd", "partial", False),
    ("C_Shrd", "complete", True), ("C_Unshrd", "complete", False))
RETAIN_ROWS = 200_000

#: The targets of the ingest issue: (query count, what is checked).
SPEEDUP_TARGET = (4096, 20.0)        # P_Shrd >= 20x P_Unshrd at 4,096 queries
RATE_TARGET = (1024, 500_000.0)      # P_Shrd >= 500,000 tuples/s at 1,024 queries

#: Query counts past the paper's, for P_Shrd alone (--large).
LARGE_COUNTS = (10_000, 100_000)


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"counts": [4, 16], "batch": 500, "pool": 2, "min_time": 0.0,
                "cap_shared": 0.05, "cap_unshared": 0.05}
    if level == "quick":
        return {"counts": [16, 64], "batch": 2_000, "pool": 4, "min_time": 0.05,
                "cap_shared": 0.2, "cap_unshared": 0.2}
    return {"counts": [128, 512, 1024, 4096], "batch": 10_000, "pool": 32,
            "min_time": 0.6, "cap_shared": 1.2, "cap_unshared": 1.2}


class _Feeder:
    """Inserts the next batch of a fixed pool of batches, with ever-increasing ts."""

    def __init__(self, engine: psoup.Engine, pool: list[dict[str, NDArray[np.int64]]],
                 batch: int):
        self.engine, self.pool, self.batch = engine, pool, batch
        self.offsets = np.arange(batch, dtype=np.float64)
        self.sent = 0

    def __call__(self) -> None:
        columns = self.pool[(self.sent // self.batch) % len(self.pool)]
        self.engine.insert("R", columns, ts=self.offsets + self.sent)
        self.sent += self.batch


def measure(mode: ModeName, shared: bool, queries: list[str],
            pool: list[dict[str, NDArray[np.int64]]], s: dict[str, Any],
            check: common.UnsharedNumpy | None = None) -> dict[str, Any]:
    """Register `queries`, warm up with one batch, then time batches (from the first:
    the retention's first fill is in them, each new results chunk fresh memory from the
    OS); with `check` (P_Shrd), time them again once RETAIN_ROWS tuples have expired
    (chunks reused, as the floor reuses its output), and the matches must equal the
    engine's on the last batch (a sample of the queries)."""
    eng = psoup.Engine(mode=mode, shared_index=shared)
    eng.execute(f"{common.CREATE_R} RETAIN {RETAIN_ROWS} ROWS")
    t0 = time.perf_counter()
    handles = [eng.register(sql) for sql in queries]
    register_s = time.perf_counter() - t0
    feed = _Feeder(eng, pool, s["batch"])
    feed()
    cap = s["cap_shared"] if shared else s["cap_unshared"]
    timing = common.timed(feed, repeat=3, min_time=s["min_time"], max_time=cap)
    steady: common.Timing | None = None
    memory: float | None = None
    least: float | None = None
    if check is not None:       # P_Shrd: timed again once the retention is full
        while feed.sent < 2 * RETAIN_ROWS:
            feed()
        steady = common.timed(feed, repeat=3, min_time=s["min_time"], max_time=cap)
        stats = eng.stats()
        memory = stats["memory"]["results"] / (
            stats["streams"]["R"]["rows"] * -(-len(queries) // 64) * 8)
        least = least_python_insert(eng, pool, s)
    if check is not None:
        first = feed.sent - s["batch"]
        check.insert(pool[(first // s["batch"]) % len(pool)])
        for i in range(0, len(queries), max(1, len(queries) // 64)):
            got = eng.invoke(handles[i], now=float(feed.sent)).tuple_ids
            if not np.array_equal(got[got >= first] - first, check.matches[i]):
                raise AssertionError(f"query {i}: {mode} and the numpy baseline disagree")
    eng.close()
    return {"rate": timing.calls * s["batch"] / timing.total, "batches": timing.calls,
            "median_batch_ms": 1e3 * timing.median, "register_s": register_s,
            "steady_rate": steady and steady.calls * s["batch"] / steady.total,
            "memory": memory, "least_rate": least}


def least_python_insert(eng: psoup.Engine, pool: list[dict[str, NDArray[np.int64]]],
                        s: dict[str, Any]) -> float:
    """Tuples/s of the least an insert orchestrated in Python costs on this engine's
    structures, the bound of any such design: each batch checked as Engine.insert checks
    it (`make_batch`), its tupleIDs made, its six columns copied by numpy into the next
    slice of a ring of stored columns as long as the retention, and the engine's own probe
    (`QuerySteM.probe_into`: the compiled kernel over the engine's reject tables) written
    into the next slice of a ring of result rows. Nothing else: no lock, routing,
    retention or chunk bookkeeping. The rings are written once before the timing (no
    first-use page faults), as the engine's chunks are by then."""
    core = eng._core
    batch: int = s["batch"]
    schema, probe = core.stem("R").schema, core.query_stem.probe_into
    slices = max(1, RETAIN_ROWS // batch)
    stored = [np.zeros((6, batch), np.int64) for _ in range(slices)]
    # rows 8 words further apart than their length, as in the engine's chunks (rows
    # exactly 10,000 words apart made the probe 1.3x slower at 4,096 queries)
    results = [aligned_zeros((core.query_stem.words, batch + ROW_PAD))[:, :batch]
               for _ in range(slices)]
    offsets = np.arange(batch, dtype=np.float64)
    sent = [0]

    def insert() -> None:
        k, first = sent[0] // batch, sent[0]
        sent[0] += batch
        got = make_batch(schema, pool[k % len(pool)], offsets + first, 0.0, float("-inf"))
        columns = stored[k % slices]
        for row, values in enumerate(got.columns.values()):
            columns[row] = values
        columns[4] = got.ts.view(np.int64)
        columns[5] = np.arange(first, first + batch, dtype=np.int64)
        probe("R", got.columns, [(0, batch, results[k % slices])])
    for _ in range(slices):
        insert()
    timing = common.timed(insert, repeat=3, min_time=s["min_time"], max_time=s["cap_shared"])
    return timing.calls * batch / timing.total


def measure_large(queries: list[str], pool: list[dict[str, NDArray[np.int64]]],
                  s: dict[str, Any]) -> dict[str, Any]:
    """P_Shrd with many queries, timed twice: as `measure` times it (a warm-up batch, then
    the timed batches: at these counts they are mostly the retention's first fill, each
    results chunk fresh memory from the OS) and in the steady state, once RETAIN_ROWS
    tuples have expired (their chunks reused)."""
    eng = psoup.Engine(mode="partial")
    eng.execute(f"{common.CREATE_R} RETAIN {RETAIN_ROWS} ROWS")
    t0 = time.perf_counter()
    for sql in queries:
        eng.register(sql)
    register_s = time.perf_counter() - t0
    feed = _Feeder(eng, pool, s["batch"])
    feed()
    first = common.timed(feed, repeat=3, min_time=s["min_time"], max_time=s["cap_shared"])
    while feed.sent < 2 * RETAIN_ROWS:
        feed()
    steady = common.timed(feed, repeat=3, min_time=s["min_time"], max_time=s["cap_shared"])
    eng.close()
    return {"queries": len(queries), "register_s": register_s,
            "rate": first.calls * s["batch"] / first.total, "batches": first.calls,
            "steady_rate": steady.calls * s["batch"] / steady.total,
            "steady_batches": steady.calls}


def measure_numpy(queries: list[str], pool: list[dict[str, NDArray[np.int64]]],
                  s: dict[str, Any]) -> tuple[common.UnsharedNumpy, float]:
    """The tight unshared numpy baseline over the same batches: (baseline, tuples/s)."""
    baseline = common.UnsharedNumpy([common.factors(q.split(" WHERE ", 1)[1])
                                     for q in queries])
    sent = [0]

    def feed() -> None:
        baseline.insert(pool[sent[0] % len(pool)])
        sent[0] += 1
    feed()
    timing = common.timed(feed, repeat=3, min_time=s["min_time"], max_time=s["cap_unshared"])
    return baseline, timing.calls * s["batch"] / timing.total


def _verdicts(rows: list[dict[str, Any]]) -> list[str]:
    by_count = {row["queries"]: row for row in rows}
    notes = []
    n, target = SPEEDUP_TARGET
    row = by_count.get(n)
    got = f"{row['P Shrd/Unshrd']:.1f}x" if row else "not measured (quick run)"
    verdict = ("PASS" if row["P Shrd/Unshrd"] >= target else "MISS") if row else "n/a"
    notes.append(f"target: P_Shrd >= {target:.0f}x P_Unshrd at {n:,} queries: {got} -> "
                 f"{verdict}")
    if row:
        notes.append(f"against the tight numpy unshared baseline at {n:,} queries: "
                     f"{row['P Shrd/np Unshrd']:.1f}x (psoup's own Unshrd packs each "
                     f"query's mask into its bitmaps: numpy Unshrd is "
                     f"{row['np_Unshrd'] / row['P_Unshrd']:.1f}x faster than P_Unshrd)")
    n, target = RATE_TARGET
    row = by_count.get(n)
    got = f"{row['P_Shrd']:,.0f} tuples/s" if row else "not measured (quick run)"
    verdict = ("PASS" if row["P_Shrd"] >= target else "MISS") if row else "n/a"
    notes.append(f"target: P_Shrd >= {target:,.0f} tuples/s at {n:,} queries: {got} -> "
                 f"{verdict}")
    for row in rows:
        if row["queries"] >= 1024 and row.get("P_Shrd/floor") is not None:
            share = row["steady/floor called"]
            notes.append(
                f"target: P_Shrd >= 0.5 of the C floor at {row['queries']:,} queries, with "
                f"the retention full and the floor timed as the issue's floor script times "
                f"it (a ctypes call per 4,096 tuples): {share:.2f} -> "
                f"{'PASS' if share >= 0.5 else 'MISS'}; against the bare loop "
                f"{row['steady/floor']:.2f}; from the first batch (the retention's first "
                f"fill in it) {row['P_Shrd/floor']:.2f} of the bare loop; against the C loop "
                f"run as an engine with this retention must run it (its results and tuples "
                f"kept, floor.retaining_floor) {row['steady/retaining']:.2f}; the least "
                f"insert orchestrated in Python on the same structures (checks, tupleIDs, "
                f"a numpy copy per column, the engine's probe; least_python_insert) "
                f"{row['least/floor called']:.2f} of the floor as called")
    worst = max((row for row in rows if row.get("results memory")),
                key=lambda row: row["results memory"], default=None)
    if worst is not None:
        notes.append(
            f"target: results memory <= 1.1 x ceil(Q/64) x 8 bytes per retained tuple "
            f"(PSoup-P, retention full, {RETAIN_ROWS:,} rows): worst "
            f"{worst['results memory']:.3f} at {worst['queries']:,} queries -> "
            f"{'PASS' if worst['results memory'] <= 1.1 else 'MISS'} (the rows' exact "
            "width, plus whole 8,192-tuple chunks: the oldest partly expired, one kept for "
            "reuse, and word rows 1/32 ahead for new queries)")
    notes.append("numpy Unshrd: each query on its own, comparisons into preallocated masks "
                 "(out=), matches kept as row numbers per query (common.UnsharedNumpy); "
                 "its matches equal PSoup-P's on the last batch")
    return notes


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    counts = [row["queries"] for row in rows]
    for label, _, shared in VARIANTS:
        ax.plot(counts, [row[label] for row in rows], marker="o", label=label,
                linestyle="-" if shared else "--")
    ax.plot(counts, [row["np_Unshrd"] for row in rows], marker="s", linestyle=":",
            color="k", label="numpy Unshrd (tight)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [f"{c:,}" for c in counts])
    ax.set_xlabel("standing queries")
    ax.set_ylabel("tuples / s ingested")
    ax.set_title("Ingest throughput (PSoup Fig. 9)")
    ax.legend()


def main() -> None:
    large = "--large" in sys.argv      # this script's own flag; common parses the rest
    if large:
        sys.argv.remove("--large")
    level, suffix = common.size_flag(__doc__)
    quick = level != "full"
    s = _settings(level)

    data_gen = common.rng(1)
    pool = [common.data_columns(data_gen, s["batch"]) for _ in range(s["pool"])]
    all_queries = common.selection_queries(common.rng(2), max(s["counts"]), "inequality")

    rows: list[dict[str, Any]] = []
    for count in s["counts"]:
        row: dict[str, Any] = {"queries": count}
        baseline, row["np_Unshrd"] = measure_numpy(all_queries[:count], pool, s)
        for label, mode, shared in VARIANTS:
            got = measure(mode, shared, all_queries[:count], pool, s,
                          check=baseline if label == "P_Shrd" else None)
            row[label] = got["rate"]
            row[f"{label} batches"] = got["batches"]
            row[f"{label} median batch ms"] = got["median_batch_ms"]
            row[f"{label} register s"] = got["register_s"]
            if label == "P_Shrd":
                row["P_Shrd steady"] = got["steady_rate"]
                row["results memory"] = got["memory"]
                row["least insert"] = got["least_rate"]
        row["P Shrd/Unshrd"] = row["P_Shrd"] / row["P_Unshrd"]
        row["P Shrd/np Unshrd"] = row["P_Shrd"] / row["np_Unshrd"]
        row["C Shrd/Unshrd"] = row["C_Shrd"] / row["C_Unshrd"]
        row["P/C"] = row["P_Shrd"] / row["C_Shrd"]
        row["floor"] = floor.ingest_floor(count)
        row["floor called"] = floor.ingest_floor(count, called=True)
        if row["floor"]:
            row["P_Shrd/floor"] = row["P_Shrd"] / row["floor"]
            row["steady/floor"] = row["P_Shrd steady"] / row["floor"]
            row["steady/floor called"] = row["P_Shrd steady"] / row["floor called"]
            row["retaining floor"] = floor.retaining_floor(count, s["batch"], RETAIN_ROWS)
            row["steady/retaining"] = row["P_Shrd steady"] / row["retaining floor"]
            row["least/floor called"] = row["least insert"] / row["floor called"]
        rows.append(row)

    columns = [("queries", "queries", ",d")]
    columns += [(label, f"{label} tuples/s", ",.0f") for label, _, _ in VARIANTS]
    columns += [("np_Unshrd", "numpy Unshrd tuples/s", ",.0f"),
                ("P Shrd/Unshrd", "P Shrd/Unshrd", ".1f"),
                ("P Shrd/np Unshrd", "P Shrd/numpy Unshrd", ".1f"),
                ("C Shrd/Unshrd", "C Shrd/Unshrd", ".1f"), ("P/C", "P/C (Shrd)", ".1f"),
                ("P_Shrd steady", "P_Shrd full tuples/s", ",.0f"),
                ("floor", "C floor tuples/s", ",.0f"), ("P_Shrd/floor", "P_Shrd/floor", ".2f"),
                ("steady/floor", "P_Shrd full/floor", ".2f"),
                ("floor called", "C floor as called", ",.0f"),
                ("steady/floor called", "P_Shrd full/floor as called", ".2f"),
                ("retaining floor", "C retaining floor", ",.0f"),
                ("steady/retaining", "P_Shrd full/retaining floor", ".2f"),
                ("least insert", "least Python insert tuples/s", ",.0f"),
                ("least/floor called", "least Python insert/floor as called", ".2f"),
                ("results memory", "results B/(retained x ceil(Q/64) x 8)", ".3f")]
    columns += [(f"{label} register s", f"{label} reg s", ".2f") for label, _, _ in VARIANTS]
    notes = _verdicts(rows)
    measured_large: list[dict[str, Any]] = []
    for count in LARGE_COUNTS if large else ():
        got = measure_large(common.selection_queries(common.rng(2), count, "inequality"),
                            pool, s)
        got["floor"] = floor.ingest_floor(count)
        got["floor_called"] = floor.ingest_floor(count, called=True)
        got["retaining_floor"] = floor.retaining_floor(count, s["batch"], RETAIN_ROWS)
        measured_large.append(got)
        share = (f" = {got['rate'] / got['floor']:.2f} / {got['steady_rate'] / got['floor']:.2f}"
                 f" of the bare C floor ({got['floor']:,.0f} tuples/s); with the retention "
                 f"full {got['steady_rate'] / got['floor_called']:.2f} of the floor as "
                 f"called ({got['floor_called']:,.0f} tuples/s; target 0.5: "
                 f"{'PASS' if got['steady_rate'] >= 0.5 * got['floor_called'] else 'MISS'})"
                 f"; {got['steady_rate'] / got['retaining_floor']:.2f} of the C retaining "
                 f"floor ({got['retaining_floor']:,.0f} tuples/s)"
                 if got["floor"] else "")
        notes.append(f"P_Shrd at {count:,} queries (--large): {got['rate']:,.0f} tuples/s "
                     f"measured as above ({got['batches']} batches, mostly the retention's "
                     f"first fill), {got['steady_rate']:,.0f} tuples/s with the retention "
                     f"full{share}; registering took {got['register_s']:.1f} s")
    params = {"batch_rows": s["batch"], "retain_rows": RETAIN_ROWS,
              "query_kind": "inequality", "min_time_s": s["min_time"],
              "cap_shared_s": s["cap_shared"], "cap_unshared_s": s["cap_unshared"],
              "seed": common.SEED, "quick": quick, "large": measured_large}
    common.report(f"ingest{suffix}", rows, columns, _plot, notes=notes, params=params)


if __name__ == "__main__":
    main()
