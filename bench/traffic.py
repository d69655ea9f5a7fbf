"""The PSoup experiments on a traffic-like trace (Sect. 5.5, Figs. 12 and 13), with DuckDB.

The paper repeated its tests on CalTrans sensor readings (Table 3): lane 1-8 and
stationid 1-9 uniform, speed 0-100 "approximately modal, with the extreme values (very
slow and very fast) being rare". This trace has that shape: sensors report in turn, and
speed is a normal around 60 mph (sd 12) clipped to [0, 100], rounded to 0.1. The queries
are the paper's, `lane = c1 AND stationid = c2 AND speed > c3` with constants uniform in
each attribute's domain.

- response (Fig. 12): invocation latency vs window (last W readings) for PSoup-P,
  PSoup-C, NoMat and DuckDB over the same readings; every answer checked against DuckDB.
  DuckDB returns rows (fetchall, against `Result.rows`) and, prepared once, columns
  (fetchnumpy, against PSoup-P's `Result.to_numpy()`).
- arrival (Fig. 13): the maximum arrival rate vs number of standing queries (128 ...
  4,096), PSoup-P and PSoup-C, shared and unshared, with input windows (retention) of
  1,000 and 10,000 readings; beside psoup's own Unshrd (which packs every query's mask
  into its bitmaps), the unshared baseline as a numpy user writes it
  (`common.UnsharedNumpy`: masks in place, row numbers per query, for each batch).

Usage: python bench/traffic.py [--quick | --smoke]
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)

import psoup  # noqa: E402
from psoup.options import MODE_NAMES, ModeName  # noqa: E402

MODES: tuple[ModeName, ...] = MODE_NAMES
LABELS = {"partial": "PSoup-P", "complete": "PSoup-C", "nomat": "NoMat", "duckdb": "DuckDB"}
VARIANTS: tuple[tuple[str, ModeName, bool], ...] = (
    ("P_Shrd", "partial", True), ("P_Unshrd", "partial", False),
    ("C_Shrd", "complete", True), ("C_Unshrd", "complete", False))
CREATE = "CREATE STREAM traffic (lane INT, stationid INT, speed FLOAT)"


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"windows": [100, 300], "queries": 4, "repeat": 1, "counts": [4, 16],
                "arrival_windows": [100, 300], "batch": 300, "min_time": 0.0,
                "cap": 0.05}
    if level == "quick":
        return {"windows": [100, 1_000], "queries": 8, "repeat": 2, "counts": [16, 64],
                "arrival_windows": [100, 1_000], "batch": 1_000, "min_time": 0.05,
                "cap": 0.2}
    return {"windows": [1_000, 10_000, 50_000, 100_000], "queries": 64, "repeat": 5,
            "counts": [128, 512, 1024, 4096], "arrival_windows": [1_000, 10_000],
            "batch": 10_000, "min_time": 0.3, "cap": 0.6}


def readings(gen: np.random.Generator, n: int) -> dict[str, NDArray[Any]]:
    """n readings of the trace's shape (see the module docstring)."""
    sensor = np.arange(n) % (8 * 9)
    return {"lane": sensor % 8 + 1, "stationid": sensor // 8 + 1,
            "speed": np.round(np.clip(gen.normal(60.0, 12.0, n), 0.0, 100.0), 1)}


def queries(gen: np.random.Generator, n: int) -> list[str]:
    """The paper's SQCs: `lane = c1 AND stationid = c2 AND speed > c3`."""
    return [f"lane = {gen.integers(1, 9)} AND stationid = {gen.integers(1, 10)} AND "
            f"speed > {gen.integers(0, 101)}" for _ in range(n)]


# ---------------------------------------------------------------------- response

def bench_response(s: dict[str, Any]) -> list[dict[str, Any]]:
    import duckdb
    import pyarrow as pa
    n = max(s["windows"]) + 1_000
    data = readings(common.rng(61), n)
    con = duckdb.connect()
    con.register("src", pa.table({"tid": np.arange(n), **data}))
    con.execute("CREATE TABLE traffic AS SELECT * FROM src")
    con.unregister("src")
    wheres = queries(common.rng(62), s["queries"])
    rows: dict[int, dict[str, Any]] = {w: {"window": w} for w in s["windows"]}
    expected: dict[int, list[Any]] = {}
    # Callable[..., Any]: mypy infers no type for a lambda with a default in a
    # Callable[[], Any] context
    calls: list[Callable[..., Any]]
    for w, row in rows.items():
        calls = [lambda q=f"SELECT lane, stationid, speed FROM traffic WHERE tid >= {n - w} "
                 f"AND {where}": con.execute(q).fetchall() for where in wheres]
        expected[w] = [call() for call in calls]
        row["rows"] = sum(map(len, expected[w])) / len(wheres)
        row["duckdb ms"] = _mean_ms(calls, s["repeat"])
        prepared = [common.prepare(
            con, f"SELECT lane, stationid, speed FROM traffic WHERE tid >= {n - w} AND "
            f"{where}") for where in wheres]
        calls = [lambda q=q: con.execute(q).fetchnumpy() for q in prepared]
        for i, call in enumerate(calls):
            if list(zip(*(v.tolist() for v in call().values()), strict=True)) != expected[w][i]:
                raise AssertionError(f"prepared DuckDB, W={w}: {wheres[i]} differs")
        row["duckdb prep ms"] = _mean_ms(calls, s["repeat"])
    for mode in MODES:
        eng = psoup.Engine(mode=mode, answer_cache_bytes=0)   # timed again and again over
        eng.execute(CREATE)                                   # one window: read whole
        handles = {w: [eng.register(f"SELECT * FROM traffic WHERE {where} "
                                     f"BEGIN (NOW - {w} ROWS) END NOW") for where in wheres]
                   for w in s["windows"]}
        for p in range(0, n, s["batch"]):
            eng.insert("traffic", {c: v[p:p + s["batch"]] for c, v in data.items()},
                       ts=np.arange(p, min(p + s["batch"], n), dtype=np.float64))
        for w, row in rows.items():
            calls = [lambda h=h, eng=eng: eng.invoke(h, now=float(n)).rows for h in handles[w]]
            for i, call in enumerate(calls):
                if call() != expected[w][i]:
                    raise AssertionError(f"{mode}, W={w}: {wheres[i]} differs from DuckDB")
            row[f"{mode} ms"] = _mean_ms(calls, s["repeat"])
            if mode == "partial":
                calls = [lambda h=h, eng=eng: eng.invoke(h, now=float(n)).to_numpy()
                         for h in handles[w]]
                row["partial np ms"] = _mean_ms(calls, s["repeat"])
        eng.close()
    for row in rows.values():
        row["duckdb/P"] = row["duckdb ms"] / row["partial ms"]
        row["duckdb prep/P np"] = row["duckdb prep ms"] / row["partial np ms"]
        row["duckdb/C"] = row["duckdb ms"] / row["complete ms"]
        row["nomat/C"] = row["nomat ms"] / row["complete ms"]
    return list(rows.values())


def _mean_ms(calls: Sequence[Callable[[], Any]], repeat: int) -> float:
    with common.settled():
        total = sum(common.timed(call, repeat=repeat).total for call in calls)
    return 1e3 * total / (len(calls) * repeat)


def _plot_response(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    windows = [r["window"] for r in rows]
    for key in MODES + ("duckdb",):
        ax.plot(windows, [r[f"{key} ms"] for r in rows], marker="o", label=LABELS[key])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("window (readings)")
    ax.set_ylabel("ms per invocation")
    ax.set_title("Traffic trace: response time vs window (Fig. 12)")
    ax.legend()


# ---------------------------------------------------------------------- arrival

def bench_arrival(s: dict[str, Any]) -> list[dict[str, Any]]:
    gen = common.rng(63)
    pool = [readings(gen, s["batch"]) for _ in range(8)]
    sqcs = queries(common.rng(64), max(s["counts"]))
    rows: list[dict[str, Any]] = []
    for window in s["arrival_windows"]:
        for count in s["counts"]:
            row = {"window": window, "queries": count}
            baseline = common.UnsharedNumpy([common.factors(q) for q in sqcs[:count]])
            sent = [0]

            def feed_numpy(sent: list[int] = sent,
                           baseline: common.UnsharedNumpy = baseline) -> None:
                baseline.insert(pool[sent[0] % len(pool)])
                sent[0] += 1
            feed_numpy()
            t = common.timed(feed_numpy, repeat=2, min_time=s["min_time"], max_time=s["cap"])
            row["np_Unshrd"] = t.calls * s["batch"] / t.total
            for label, mode, shared in VARIANTS:
                eng = psoup.Engine(mode=mode, shared_index=shared)
                eng.execute(f"{CREATE} RETAIN {window} ROWS")
                for where in sqcs[:count]:
                    eng.register(f"SELECT * FROM traffic WHERE {where} "
                                 f"BEGIN (NOW - {window} ROWS) END NOW")
                sent = [0]

                def feed(eng: psoup.Engine = eng, sent: list[int] = sent) -> None:
                    batch = s["batch"]
                    eng.insert("traffic", pool[(sent[0] // batch) % len(pool)],
                               ts=np.arange(sent[0], sent[0] + batch, dtype=np.float64))
                    sent[0] += batch
                feed()
                t = common.timed(feed, repeat=2, min_time=s["min_time"], max_time=s["cap"])
                row[label] = t.calls * s["batch"] / t.total
                eng.close()
            row["P Shrd/Unshrd"] = row["P_Shrd"] / row["P_Unshrd"]
            row["P Shrd/np Unshrd"] = row["P_Shrd"] / row["np_Unshrd"]
            row["P/C (Shrd)"] = row["P_Shrd"] / row["C_Shrd"]
            rows.append(row)
    return rows


def _plot_arrival(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    for w_index, window in enumerate(sorted({r["window"] for r in rows})):
        mine = [r for r in rows if r["window"] == window]
        for v_index, (label, _, shared) in enumerate(VARIANTS):
            ax.plot([r["queries"] for r in mine], [r[label] for r in mine],
                    color=f"C{v_index}", linestyle="-" if w_index == 0 else ":",
                    marker="o" if shared else "x",
                    label=f"{label}, W={window:,}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("standing queries")
    ax.set_ylabel("readings / s ingested")
    ax.set_title("Traffic trace: arrival rate vs queries (Fig. 13)")
    ax.legend(fontsize=7, ncol=2)


def main() -> None:
    level, suffix = common.size_flag(__doc__)
    s = _settings(level)
    response = bench_response(s)
    top = response[-1]
    common.report(f"traffic_response{suffix}", response, [
        ("window", "W", ",d"), ("rows", "rows", ",.1f"),
        *[(f"{k} ms", f"{LABELS[k]} ms", ".4f") for k in MODES + ("duckdb",)],
        ("duckdb/P", "DuckDB/P", ".1f"), ("duckdb/C", "DuckDB/C", ".1f"),
        ("nomat/C", "NoMat/C", ".1f"), ("partial np ms", "P numpy ms", ".4f"),
        ("duckdb prep ms", "DuckDB prep numpy ms", ".4f"),
        ("duckdb prep/P np", "DuckDB prep/P numpy", ".1f"),
    ], _plot_response, notes=[
        "every answer of every mode matched DuckDB's (prepared DuckDB's columns too)",
        f"as columns at W={top['window']:,}: DuckDB prepared with fetchnumpy / PSoup-P's "
        f"to_numpy() = {top['duckdb prep/P np']:.1f}x",
        f"at W={top['window']:,}: PSoup-C {top['duckdb/C']:.0f}x and PSoup-P "
        f"{top['duckdb/P']:.0f}x faster than DuckDB, NoMat {top['nomat/C']:.0f}x slower than "
        "PSoup-C (the paper: PSoup-C best, NoMat poorest)"], params=s)
    arrival = bench_arrival(s)
    common.report(f"traffic_arrival{suffix}", arrival, [
        ("window", "W", ",d"), ("queries", "queries", ",d"),
        *[(label, f"{label} /s", ",.0f") for label, _, _ in VARIANTS],
        ("np_Unshrd", "numpy Unshrd /s", ",.0f"),
        ("P Shrd/Unshrd", "P Shrd/Unshrd", ".1f"),
        ("P Shrd/np Unshrd", "P Shrd/numpy Unshrd", ".1f"), ("P/C (Shrd)", "P/C Shrd", ".1f"),
    ], _plot_arrival, notes=[
        "numpy Unshrd: each query on its own over each batch, masks computed in place "
        "(out=), matches kept as row numbers per query (no window kept); P Shrd/Unshrd is "
        "the old ratio, P Shrd/numpy Unshrd the honest one",
        "the paper (Fig. 13): P above C, Shrd above Unshrd; at W=1,000 a crossover "
        "between P_Unshrd and C_Shrd"], params=s)


if __name__ == "__main__":
    main()
