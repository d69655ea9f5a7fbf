"""Invocation latency against the window size (PSoup Sect. 5.2.2, Fig. 7), with DuckDB.

For each window of W = 2^10 ... 2^16 tuples and each engine mode (PSoup-P "partial",
PSoup-C "complete", "nomat"), 64 selection queries with the window
BEGIN (NOW - W ROWS) END NOW are registered, the stream is filled past 2^16 tuples, and
each query is invoked several times. Two workloads: equality factors (Fig. 7a) and
interval factors (Fig. 7b). DuckDB runs the same WHERE clauses over the same tuples,
restricted to the last W rows by `tid >= n - W`, and returns Python tuples as psoup does.

Usage: python bench/invoke.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)
import psoup  # noqa: E402

MODES = ("partial", "complete", "nomat")
WORKLOADS = ("equality", "interval")
LABELS = {"partial": "PSoup-P", "complete": "PSoup-C", "nomat": "NoMat", "duckdb": "DuckDB"}


def _settings(quick: bool) -> dict:
    if quick:
        return {"windows": [1 << 6, 1 << 8], "extra": 64, "queries": 8, "repeat": 2,
                "batch": 100}
    return {"windows": [1 << 10, 1 << 12, 1 << 14, 1 << 16], "extra": 1 << 13,
            "queries": 64, "repeat": 10, "batch": 10_000}


def _duckdb(columns: dict[str, np.ndarray]):
    """A DuckDB connection holding the tuples as R(tid, ts, a, b, c, d)."""
    import duckdb
    import pyarrow as pa
    n = len(columns["a"])
    table = pa.table({"tid": np.arange(n, dtype=np.int64),
                      "ts": np.arange(n, dtype=np.float64), **columns})
    con = duckdb.connect()
    con.register("src", table)
    con.execute("CREATE TABLE R AS SELECT * FROM src")
    con.unregister("src")
    return con


def _psoup(mode: str, wheres: list[str], window: int, columns: dict[str, np.ndarray],
           batch: int) -> tuple[psoup.Engine, list[str]]:
    """An engine of `mode` with the queries registered, then all tuples inserted."""
    eng = psoup.Engine(mode=mode)
    eng.execute(common.CREATE_R)
    handles = [eng.register(f"SELECT * FROM R WHERE {w} BEGIN (NOW - {window} ROWS) END NOW")
               for w in wheres]
    n = len(columns["a"])
    for s in range(0, n, batch):
        eng.insert("R", {c: v[s:s + batch] for c, v in columns.items()},
                   ts=np.arange(s, min(s + batch, n), dtype=np.float64))
    return eng, handles


def _time_all(calls, repeat: int, expected: list[list[tuple]] | None) -> tuple[float, list]:
    """Mean seconds per call over all `calls`, each called once untimed (its answer
    checked against `expected`) and then `repeat` times; returns (mean, answers)."""
    answers, total = [], 0.0
    for i, call in enumerate(calls):
        rows = call()
        answers.append(rows)
        if expected is not None and rows != expected[i]:
            raise AssertionError(f"query {i}: {len(rows)} rows, expected {len(expected[i])}")
        with common.settled():
            total += common.timed(call, repeat=repeat).total
    return total / (len(calls) * repeat), answers


def _plot(ax, rows: list[dict]) -> None:
    styles = {"equality": "-", "interval": "--"}
    colors = {key: f"C{i}" for i, key in enumerate(MODES + ("duckdb",))}
    for workload in WORKLOADS:
        mine = [row for row in rows if row["workload"] == workload]
        windows = [row["window"] for row in mine]
        for key in MODES + ("duckdb",):
            ax.plot(windows, [row[f"{key} ms"] for row in mine], styles[workload],
                    color=colors[key], marker="o", label=f"{LABELS[key]} ({workload})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("window (tuples)")
    ax.set_ylabel("ms per invocation")
    ax.set_title("Invocation latency (PSoup Fig. 7)")
    ax.legend(fontsize=7, ncol=2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    args = parser.parse_args(argv)
    s = _settings(args.quick)

    n = max(s["windows"]) + s["extra"]
    columns = common.data_columns(common.rng(3), n)
    con = _duckdb(columns)
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]

    rows = []
    for offset, workload in enumerate(WORKLOADS):
        gen = common.rng(4 + offset)
        wheres = [common.where_clause(gen, workload) for _ in range(s["queries"])]
        for window in s["windows"]:
            row = {"workload": workload, "window": window}
            sqls = [f"SELECT a, b, c, d FROM R WHERE tid >= {n - window} AND ({w})"
                    for w in wheres]
            duck = [lambda q=q: con.execute(q).fetchall() for q in sqls]
            row["duckdb ms"], expected = _time_all(duck, s["repeat"], None)
            row["mean rows"] = sum(map(len, expected)) / len(expected)
            for mode in MODES:
                t0 = time.perf_counter()
                eng, handles = _psoup(mode, wheres, window, columns, s["batch"])
                row[f"{mode} load s"] = time.perf_counter() - t0
                calls = [lambda h=h: eng.invoke(h, now=float(n)).rows for h in handles]
                row[f"{mode} ms"], _ = _time_all(calls, s["repeat"], expected)
            for key in MODES + ("duckdb",):
                row[f"{key} ms"] *= 1e3
            row["nomat/P"] = row["nomat ms"] / row["partial ms"]
            row["P/C"] = row["partial ms"] / row["complete ms"]
            row["duckdb/P"] = row["duckdb ms"] / row["partial ms"]
            rows.append(row)

    columns_out = [("workload", "workload", "s"), ("window", "window", ",d"),
                   ("mean rows", "rows", ",.0f")]
    columns_out += [(f"{key} ms", f"{LABELS[key]} ms", ".3f") for key in MODES + ("duckdb",)]
    columns_out += [("nomat/P", "NoMat/P", ".2f"), ("P/C", "P/C", ".2f"),
                    ("duckdb/P", "DuckDB/P", ".2f")]
    params = {"queries_per_engine": s["queries"], "tuples": n, "repeat": s["repeat"],
              "insert_batch": s["batch"], "duckdb_threads": threads,
              "seed": common.SEED, "quick": args.quick,
              "method": "per query: one untimed invocation (answer checked against "
                        "DuckDB), then `repeat` timed ones; ms = mean over all"}
    notes = ["answers of every mode matched DuckDB's row for row",
             f"DuckDB: {threads} threads, WHERE tid >= n - W AND (...), fetchall()"]
    name = "invoke_quick" if args.quick else "invoke"
    common.report(name, rows, columns_out, _plot, notes=notes, params=params)


if __name__ == "__main__":
    main()
