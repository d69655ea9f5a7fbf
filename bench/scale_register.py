"""Registration at scan speed (issue 37): a new query applied to N retained tuples (PSoup's
new query over old data) against DuckDB running the same SQL over the same rows in the
same process, at N = 1M, 4M and 16M, in every mode.

The stream is traffic(lane INT in 0..7, speed FLOAT in [0, 100)); DuckDB holds the same
rows as a table and answers with `con.execute(sql).fetchnumpy()` on its default threads.
Three queries, one per kind: a selection (`WHERE speed < 30 AND lane = 3`), an aggregate
(`COUNT(*), AVG(speed) WHERE speed < 50`) and a GROUP BY (`lane, COUNT(*), AVG(speed)
GROUP BY lane`). Each repetition registers the query (timed), unregisters it (timed)
and runs it in DuckDB (timed), in turn, so both see the same machine load; medians.
Every psoup answer is checked against DuckDB's first. The last row of each N and mode
times DROP STREAM ... CASCADE of the stream with the three queries registered.

The target: register <= 2x DuckDB for every kind, N and mode.

Usage: python bench/scale_register.py [--quick | --smoke]
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)

import psoup  # noqa: E402
from psoup.options import MODE_NAMES, ModeName  # noqa: E402

MODES: tuple[ModeName, ...] = MODE_NAMES
LABELS = {"partial": "PSoup-P", "complete": "PSoup-C", "nomat": "NoMat"}
QUERIES = {
    "selection": "SELECT lane, speed FROM traffic WHERE speed < 30 AND lane = 3",
    "aggregate": "SELECT COUNT(*), AVG(speed) FROM traffic WHERE speed < 50",
    "group by": "SELECT lane, COUNT(*), AVG(speed) FROM traffic GROUP BY lane",
}
CREATE = "CREATE STREAM traffic (lane INT, speed FLOAT)"
TARGET = 2.0
BATCH = 1 << 18


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"sizes": [20_000], "repeat": 1}
    if level == "quick":
        return {"sizes": [1_000_000], "repeat": 9}
    return {"sizes": [1_000_000, 4_000_000, 16_000_000], "repeat": 9}


def _columns(n: int) -> dict[str, np.ndarray]:
    gen = common.rng(37)
    return {"lane": gen.integers(0, 8, n, dtype=np.int64), "speed": gen.random(n) * 100}


def _duckdb(columns: dict[str, np.ndarray]) -> Any:
    import duckdb
    import pyarrow as pa
    con = duckdb.connect()
    con.register("src", pa.table(columns))
    con.execute("CREATE TABLE traffic AS SELECT * FROM src")
    con.unregister("src")
    return con


def _engine(mode: ModeName, columns: dict[str, np.ndarray]) -> psoup.Engine:
    eng = psoup.Engine(mode=mode)
    eng.execute(CREATE)
    n = len(columns["lane"])
    for p in range(0, n, BATCH):
        eng.insert("traffic", {c: v[p:p + BATCH] for c, v in columns.items()},
                   ts=np.arange(p, min(n, p + BATCH), dtype=np.float64))
    return eng


def _check(kind: str, got: psoup.Result, want: dict[str, np.ndarray]) -> None:
    """psoup's answer against DuckDB's: the same rows (selections as sorted columns,
    aggregates to a relative 1e-9)."""
    if kind == "selection":
        mine = got.to_numpy()
        for name, values in want.items():
            if not np.array_equal(np.sort(mine[name]), np.sort(np.asarray(values))):
                raise AssertionError(f"{kind}: column {name} differs from DuckDB's")
        return
    theirs = sorted(zip(*(np.asarray(v).tolist() for v in want.values()), strict=True))
    for a, b in zip(sorted(got.rows), theirs, strict=True):
        if not all(math.isclose(x, y, rel_tol=1e-9) for x, y in zip(a, b, strict=True)):
            raise AssertionError(f"{kind}: {a} != DuckDB {b}")
    if len(got.rows) != len(theirs):
        raise AssertionError(f"{kind}: {len(got.rows)} rows, DuckDB {len(theirs)}")


def _size(n: int, repeat: int) -> list[dict[str, Any]]:
    columns = _columns(n)
    con = _duckdb(columns)
    want = {kind: con.execute(sql).fetchnumpy() for kind, sql in QUERIES.items()}
    rows = [row for mode in MODES for row in _mode(mode, columns, con, want, repeat)]
    con.close()
    return rows


def _mode(mode: ModeName, columns: dict[str, np.ndarray], con: Any,
          want: dict[str, dict[str, np.ndarray]], repeat: int) -> list[dict[str, Any]]:
    """One mode's rows at one N: each kind's register, unregister and DuckDB medians,
    then DROP STREAM."""
    n = len(columns["lane"])
    eng = _engine(mode, columns)
    clock = time.perf_counter
    rows: list[dict[str, Any]] = []
    for kind, sql in QUERIES.items():
        handle = eng.register(sql)          # loads the kernels, warms the stem
        _check(kind, eng.invoke(handle, now=float(n)), want[kind])
        eng.unregister(handle)
        reg, unreg, duck = [], [], []
        with common.settled():
            for _ in range(repeat):
                t0 = clock()
                handle = eng.register(sql)
                t1 = clock()
                eng.unregister(handle)
                t2 = clock()
                con.execute(sql).fetchnumpy()
                t3 = clock()
                reg.append(t1 - t0)
                unreg.append(t2 - t1)
                duck.append(t3 - t2)
        row: dict[str, Any] = {"mode": mode, "kind": kind, "rows": n,
                               "register ms": statistics.median(reg) * 1e3,
                               "unregister ms": statistics.median(unreg) * 1e3,
                               "duckdb ms": statistics.median(duck) * 1e3}
        row["ratio"] = row["register ms"] / row["duckdb ms"]
        row["verdict"] = "met" if row["ratio"] <= TARGET else "NOT met"
        rows.append(row)
    for sql in QUERIES.values():
        eng.register(sql)
    with common.settled():
        t0 = clock()
        eng.execute("DROP STREAM traffic CASCADE")
        dropped = clock() - t0
    rows.append({"mode": mode, "kind": "drop stream", "rows": n,
                 "unregister ms": dropped * 1e3})
    eng.close()
    return rows


def bench(s: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for n in s["sizes"] for row in _size(n, s["repeat"])]


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    markers = {"selection": "o", "aggregate": "s", "group by": "^"}
    colors = {"partial": "C0", "complete": "C1", "nomat": "C2"}
    for mode in MODES:
        for kind, marker in markers.items():
            mine = [r for r in rows if r["mode"] == mode and r["kind"] == kind]
            ax.plot([r["rows"] for r in mine], [r["ratio"] for r in mine], marker=marker,
                    color=colors[mode], label=f"{LABELS[mode]} {kind}")
    ax.axhline(TARGET, color="k", linestyle="--", linewidth=1, label=f"target {TARGET:g}x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("retained tuples N")
    ax.set_ylabel("register / DuckDB (median)")
    ax.set_title("New query over old data vs DuckDB, same rows")
    ax.legend(fontsize=7, ncol=3)


def main() -> None:
    level, suffix = common.size_flag(__doc__)
    s = _settings(level)
    rows = bench(s)
    timed = [r for r in rows if "ratio" in r]
    worst = max(timed, key=lambda r: r["ratio"])
    missed = [r for r in timed if r["ratio"] > TARGET]
    common.report(f"scale_register{suffix}", rows, [
        ("mode", "mode", "s"), ("kind", "query", "s"), ("rows", "N", ",d"),
        ("register ms", "register ms", ".2f"), ("unregister ms", "unregister/drop ms", ".2f"),
        ("duckdb ms", "DuckDB ms", ".2f"), ("ratio", "register/DuckDB", ".2f"),
        ("verdict", f"<= {TARGET:g}x", "s"),
    ], _plot, notes=[
        "every psoup answer matched DuckDB's (selections row for row, aggregates to 1e-9)",
        f"worst ratio {worst['ratio']:.2f}x ({LABELS[worst['mode']]} {worst['kind']}, "
        f"N={worst['rows']:,}); {len(timed) - len(missed)} of {len(timed)} within "
        f"{TARGET:g}x" + ("" if level == "full" else " (not the full sizes)"),
        "drop stream rows: DROP STREAM traffic CASCADE with the three queries registered",
    ], params=s)


if __name__ == "__main__":
    main()
