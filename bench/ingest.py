"""Ingest throughput with many standing queries (PSoup Sect. 5.2.4, Fig. 9).

Tuples per second through `Engine.insert`, in batches of column arrays, with 128 ... 4,096
inequality queries registered first, for PSoup-P and PSoup-C, each with the shared
predicate index (Shrd) and with every query evaluated on its own (Unshrd), as the
paper's four curves. psoup's Unshrd packs each query's mask into its bitmaps, most of its
time; so the unshared baseline is also measured as a numpy user writes it
(`common.UnsharedNumpy`: masks computed in place, matches kept as row numbers per query),
and so is the shared one (`common.SharedNumpy`: the same bit table per attribute as
psoup's index, a cell per value, one row gather per attribute and an AND across them;
also with np.searchsorted per value in place of the value -> cell map), on the same
batches, their matches checked against PSoup-P's on the last batch.

P_Shrd's rate with the retention full is set beside the C floor (bench/floor.py: the
loop timed inside C, the target's; also one ctypes call per batch, and as called, its
arguments converted at each call, the old column), and
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


#: The numpy baselines an engine's matches are checked against: (unshared, shared ones).
Baselines = tuple[common.UnsharedNumpy, list[common.SharedNumpy]]


def measure(mode: ModeName, shared: bool, queries: list[str],
            pool: list[dict[str, NDArray[np.int64]]], s: dict[str, Any],
            check: Baselines | None = None) -> dict[str, Any]:
    """Register `queries`, warm up with one batch, then time batches (from the first:
    the retention's first fill is in them, each new results chunk fresh memory from the
    OS); with `check` (P_Shrd), time them again once RETAIN_ROWS tuples have expired
    (chunks reused, as the floor reuses its output), and the baselines' matches must
    equal the engine's on the last batch (a sample of the queries)."""
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
        _verify(eng, handles, feed.sent, pool[(feed.sent // s["batch"] - 1) % len(pool)],
                check)
    eng.close()
    return {"rate": timing.calls * s["batch"] / timing.total, "batches": timing.calls,
            "median_batch_ms": 1e3 * timing.median, "register_s": register_s,
            "steady_rate": steady and steady.calls * s["batch"] / steady.total,
            "memory": memory, "least_rate": least}


def _verify(eng: psoup.Engine, handles: Sequence[str], sent: int,
            last: dict[str, NDArray[np.int64]], check: Baselines) -> None:
    """The baselines' matches on the last batch (`last`, the tuples before `sent`) must
    equal the engine's, for a sample of 64 queries; the shared baselines' rows all
    equal."""
    unshared, shared = check
    first = sent - len(next(iter(last.values())))
    unshared.insert(last)
    for baseline in shared:
        baseline.insert(last)
        if not np.array_equal(baseline.rows, shared[0].rows):
            raise AssertionError("the shared numpy baselines disagree")
    for i in range(0, len(handles), max(1, len(handles) // 64)):
        got = eng.invoke(handles[i], now=float(sent)).tuple_ids
        got = got[got >= first] - first
        if not np.array_equal(got, unshared.matches[i]):
            raise AssertionError(f"query {i}: PSoup-P and the numpy baseline disagree")
        if not np.array_equal(got, shared[0].matches(i)):
            raise AssertionError(f"query {i}: PSoup-P and the shared numpy baseline disagree")


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


def measure_numpy(baseline: common.UnsharedNumpy | common.SharedNumpy,
                  pool: list[dict[str, NDArray[np.int64]]], s: dict[str, Any]) -> float:
    """Tuples/s of a numpy baseline over the same batches."""
    sent = [0]

    def feed() -> None:
        baseline.insert(pool[sent[0] % len(pool)])
        sent[0] += 1
    feed()
    timing = common.timed(feed, repeat=3, min_time=s["min_time"], max_time=s["cap_unshared"])
    return timing.calls * int(s["batch"]) / timing.total


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
                     f"{row['np_Unshrd'] / row['P_Unshrd']:.1f}x faster than P_Unshrd); "
                     f"against the shared numpy baseline {row['P Shrd/np Shrd']:.2f}x")
    n, target = RATE_TARGET
    row = by_count.get(n)
    got = f"{row['P_Shrd']:,.0f} tuples/s" if row else "not measured (quick run)"
    verdict = ("PASS" if row["P_Shrd"] >= target else "MISS") if row else "n/a"
    notes.append(f"target: P_Shrd >= {target:,.0f} tuples/s at {n:,} queries: {got} -> "
                 f"{verdict}")
    for row in rows:
        if row["queries"] >= 1024 and row.get("P_Shrd/floor") is not None:
            notes.append(_floor_verdict(row))
            notes.append(_retaining_verdict(row))
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
                 "numpy Shrd: the shared structure built with numpy (common.SharedNumpy: "
                 "per attribute a bit row per cell of the queries' sorted bounds, each "
                 "value's cell from a value -> cell map, one row gather per attribute and "
                 "a bitwise AND across them, one row of match bits per tuple); numpy Shrd "
                 "searchsorted: the same with np.searchsorted per value in place of the "
                 "map; their matches equal PSoup-P's on the last batch; neither keeps more "
                 "than its last batch's matches, psoup keeps the retention's")
    return notes


def _retaining_verdict(row: dict[str, Any]) -> str:
    share = row["steady/retaining"]
    return (f"target (every CPU): P_Shrd >= 0.5 of the retaining C loop at "
            f"{row['queries']:,} queries, retention full: {share:.2f} -> "
            f"{'PASS' if share >= 0.5 else 'MISS'} (the loop: floor.retaining_floor, "
            f"{row['retaining floor']:,.0f} tuples/s here)")


def _floor_verdict(row: dict[str, Any]) -> str:
    share = row["steady/floor in C"]
    return (f"target: P_Shrd >= 0.5 of the C floor at {row['queries']:,} queries, with the "
            f"retention full and the floor's loop timed inside C (no ctypes call in its "
            f"time): {share:.2f} -> {'PASS' if share >= 0.5 else 'MISS'}; against the "
            f"floor as called (a ctypes call per 4,096 tuples, its arguments converted "
            f"each time, the old target's) {row['steady/floor called']:.2f}; against a "
            f"call per batch, arguments converted once {row['steady/floor']:.2f}; from "
            f"the first batch (the retention's first fill in it) "
            f"{row['P_Shrd/floor in C']:.2f} of the floor in C; against the C loop run "
            f"as an engine with this retention must run it (its results and tuples kept, "
            f"floor.retaining_floor) {row['steady/retaining']:.2f}; the least insert "
            f"orchestrated in Python on the same structures (checks, tupleIDs, a numpy "
            f"copy per column, the engine's probe; least_python_insert) "
            f"{row['least/floor in C']:.2f} of the floor in C")


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    counts = [row["queries"] for row in rows]
    for label, _, shared in VARIANTS:
        ax.plot(counts, [row[label] for row in rows], marker="o", label=label,
                linestyle="-" if shared else "--")
    ax.plot(counts, [row["np_Unshrd"] for row in rows], marker="s", linestyle=":",
            color="k", label="numpy Unshrd (tight)")
    ax.plot(counts, [row["np_Shrd"] for row in rows], marker="^", linestyle=":",
            color="grey", label="numpy Shrd (same bit tables)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [f"{c:,}" for c in counts])
    ax.set_xlabel("standing queries")
    ax.set_ylabel("tuples / s ingested")
    ax.set_title("Ingest throughput (PSoup Fig. 9)")
    ax.legend()


def measure_count(queries: list[str], pool: list[dict[str, NDArray[np.int64]]],
                  s: dict[str, Any]) -> dict[str, Any]:
    """One table row: the numpy baselines, then the four variants, over `queries`."""
    row: dict[str, Any] = {"queries": len(queries)}
    factor_lists = [common.factors(q.split(" WHERE ", 1)[1]) for q in queries]
    unshared = common.UnsharedNumpy(factor_lists)
    shared = [common.SharedNumpy(factor_lists), common.SharedNumpy(factor_lists, direct=False)]
    row["np_Unshrd"] = measure_numpy(unshared, pool, s)
    row["np_Shrd"] = measure_numpy(shared[0], pool, s)
    row["np_Shrd search"] = measure_numpy(shared[1], pool, s)
    for label, mode, is_shared in VARIANTS:
        got = measure(mode, is_shared, queries, pool, s,
                      check=(unshared, shared) if label == "P_Shrd" else None)
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
    row["P Shrd/np Shrd"] = row["P_Shrd"] / row["np_Shrd"]
    row["C Shrd/Unshrd"] = row["C_Shrd"] / row["C_Unshrd"]
    row["P/C"] = row["P_Shrd"] / row["C_Shrd"]
    _floors(row, s)
    return row


def _floors(row: dict[str, Any], s: dict[str, Any]) -> None:
    """The C floors at the row's query count, and P_Shrd as a share of each."""
    count = row["queries"]
    row["floor"] = floor.ingest_floor(count)
    row["floor called"] = floor.ingest_floor(count, "called")
    row["floor in C"] = floor.ingest_floor(count, "in_c")
    if row["floor"]:
        row["P_Shrd/floor in C"] = row["P_Shrd"] / row["floor in C"]
        row["P_Shrd/floor"] = row["P_Shrd"] / row["floor"]
        row["steady/floor"] = row["P_Shrd steady"] / row["floor"]
        row["steady/floor called"] = row["P_Shrd steady"] / row["floor called"]
        row["steady/floor in C"] = row["P_Shrd steady"] / row["floor in C"]
        row["retaining floor"] = floor.retaining_floor(count, s["batch"], RETAIN_ROWS)
        row["steady/retaining"] = row["P_Shrd steady"] / row["retaining floor"]
        row["least/floor called"] = row["least insert"] / row["floor called"]
        row["least/floor in C"] = row["least insert"] / row["floor in C"]


#: (key, header, format) of the printed table's columns.
COLUMNS = [("queries", "queries", ",d")]
COLUMNS += [(label, f"{label} tuples/s", ",.0f") for label, _, _ in VARIANTS]
COLUMNS += [("np_Unshrd", "numpy Unshrd tuples/s", ",.0f"),
            ("np_Shrd", "numpy Shrd tuples/s", ",.0f"),
            ("np_Shrd search", "numpy Shrd searchsorted tuples/s", ",.0f"),
            ("P Shrd/Unshrd", "P Shrd/Unshrd", ".1f"),
            ("P Shrd/np Unshrd", "P Shrd/numpy Unshrd", ".1f"),
            ("P Shrd/np Shrd", "P Shrd/numpy Shrd", ".2f"),
            ("C Shrd/Unshrd", "C Shrd/Unshrd", ".1f"), ("P/C", "P/C (Shrd)", ".1f"),
            ("P_Shrd steady", "P_Shrd full tuples/s", ",.0f"),
            ("floor in C", "C floor in C", ",.0f"),
            ("steady/floor in C", "P_Shrd full/floor in C", ".2f"),
            ("floor", "C floor tuples/s", ",.0f"), ("P_Shrd/floor", "P_Shrd/floor", ".2f"),
            ("steady/floor", "P_Shrd full/floor", ".2f"),
            ("floor called", "C floor as called", ",.0f"),
            ("steady/floor called", "P_Shrd full/floor as called", ".2f"),
            ("retaining floor", "C retaining floor", ",.0f"),
            ("steady/retaining", "P_Shrd full/retaining floor", ".2f"),
            ("least insert", "least Python insert tuples/s", ",.0f"),
            ("least/floor in C", "least Python insert/floor in C", ".2f"),
            ("least/floor called", "least Python insert/floor as called", ".2f"),
            ("results memory", "results B/(retained x ceil(Q/64) x 8)", ".3f")]
COLUMNS += [(f"{label} register s", f"{label} reg s", ".2f") for label, _, _ in VARIANTS]


def large_note(count: int, pool: list[dict[str, NDArray[np.int64]]],
               s: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """P_Shrd at `count` queries (--large): its figures and the note that reports them."""
    got = measure_large(common.selection_queries(common.rng(2), count, "inequality"),
                        pool, s)
    got["floor"] = floor.ingest_floor(count)
    got["floor_called"] = floor.ingest_floor(count, "called")
    got["floor_in_c"] = floor.ingest_floor(count, "in_c")
    got["retaining_floor"] = floor.retaining_floor(count, s["batch"], RETAIN_ROWS)
    share = ""
    if got["floor"]:
        steady = got["steady_rate"]
        share = (f" = {got['rate'] / got['floor_in_c']:.2f} / "
                 f"{steady / got['floor_in_c']:.2f} of the C floor timed in C "
                 f"({got['floor_in_c']:,.0f} tuples/s; target 0.5 with the retention full: "
                 f"{'PASS' if steady >= 0.5 * got['floor_in_c'] else 'MISS'}); "
                 f"{steady / got['floor_called']:.2f} of the floor as called "
                 f"({got['floor_called']:,.0f} tuples/s); "
                 f"{steady / got['retaining_floor']:.2f} of the C retaining floor "
                 f"({got['retaining_floor']:,.0f} tuples/s)")
    return got, (f"P_Shrd at {count:,} queries (--large): {got['rate']:,.0f} tuples/s "
                 f"measured as above ({got['batches']} batches, mostly the retention's "
                 f"first fill), {got['steady_rate']:,.0f} tuples/s with the retention "
                 f"full{share}; registering took {got['register_s']:.1f} s")


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
    rows = [measure_count(all_queries[:count], pool, s) for count in s["counts"]]
    notes = _verdicts(rows)
    measured_large: list[dict[str, Any]] = []
    for count in LARGE_COUNTS if large else ():
        got, note = large_note(count, pool, s)
        measured_large.append(got)
        notes.append(note)
    params = {"batch_rows": s["batch"], "retain_rows": RETAIN_ROWS,
              "query_kind": "inequality", "min_time_s": s["min_time"],
              "cap_shared_s": s["cap_shared"], "cap_unshared_s": s["cap_unshared"],
              "seed": common.SEED, "quick": quick, "large": measured_large}
    common.report(f"ingest{suffix}", rows, COLUMNS, _plot, notes=notes, params=params)


if __name__ == "__main__":
    main()
