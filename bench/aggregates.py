"""Aggregate invocation latency against the window size (PSoup Sect. 6), with DuckDB.

For windows of W = 2^10 ... 2^20 tuples, three aggregate queries over the last W rows
(`BEGIN (NOW - W ROWS) END NOW`) with the selection `a < 128` (half the tuples):
COUNT(*), SUM(b) and MAX(c). PSoup-P and PSoup-C answer them from the structures kept
per query (prefix sums; the ranked MIN/MAX tree of Fig. 14), NoMat scans the window at
invocation, and DuckDB runs the same SQL over the same tuples, restricted to the last W
rows by `tid >= n - W`, as first written (planned at every call, fetchall) and prepared
once (PREPARE/EXECUTE, fetchone). The plain numpy peer holds the columns as arrays and
scans the window's slice at each call: the selection into a preallocated mask, then
count_nonzero, a masked product summed, or the maximum of np.where(mask, c, lowest).
Every answer is checked against DuckDB's.

Usage: python bench/aggregates.py [--quick | --smoke]
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
LABELS = {"partial": "PSoup-P", "complete": "PSoup-C", "nomat": "NoMat", "duckdb": "DuckDB",
          "prepared": "DuckDB prepared", "numpy": "numpy scan"}
KINDS = {"COUNT": "COUNT(*)", "SUM": "SUM(b)", "MAX": "MAX(c)"}
WHERE = "a < 128"
TARGET = (1 << 20, 100.0)        # PSoup-P >= 100x faster than DuckDB at W = 2^20


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"windows": [1 << 6, 1 << 8], "extra": 1 << 6, "repeat": 1, "batch": 64}
    if level == "quick":
        return {"windows": [1 << 8, 1 << 10], "extra": 1 << 8, "repeat": 3, "batch": 256}
    return {"windows": [1 << k for k in range(10, 21, 2)], "extra": 1 << 14, "repeat": 20,
            "batch": 1 << 16}


def _sql(kind: str, window: int | None = None) -> str:
    clause = f" BEGIN (NOW - {window} ROWS) END NOW" if window else ""
    return f"SELECT {KINDS[kind]} FROM R WHERE {WHERE}{clause}"


def bench(s: dict[str, Any]) -> list[dict[str, Any]]:
    gen = common.rng(51)
    n = max(s["windows"]) + s["extra"]
    columns = common.data_columns(gen, n)
    ts = np.arange(n, dtype=np.float64)
    con = _duckdb(columns)
    rows: dict[tuple[str, int], dict[str, Any]] = {
        (kind, w): {"kind": kind, "window": w} for kind in KINDS for w in s["windows"]}
    want: dict[tuple[str, int], list[Any]] = {}
    for (kind, w), row in rows.items():
        sql = f"SELECT {KINDS[kind]} FROM R WHERE tid >= {n - w} AND {WHERE}"
        want[(kind, w)] = con.execute(sql).fetchall()
        def fetch_all(sql: str = sql) -> Any:
            return con.execute(sql).fetchall()
        with common.settled():
            t = common.timed(fetch_all, repeat=s["repeat"])
        row["duckdb ms"] = t.median * 1e3
        prepared = common.prepare(con, sql)
        if con.execute(prepared).fetchall() != want[(kind, w)]:
            raise AssertionError(f"prepared DuckDB {kind} W={w}: answer differs")
        def fetch_one(q: str = prepared) -> Any:
            return con.execute(q).fetchone()
        with common.settled():
            t = common.timed(fetch_one, repeat=s["repeat"])
        row["prepared ms"] = t.median * 1e3
        scan = _numpy_scan(columns, kind, w)
        if [(scan(),)] != want[(kind, w)]:
            raise AssertionError(f"numpy {kind} W={w}: {scan()} != DuckDB {want[(kind, w)]}")
        with common.settled():
            t = common.timed(scan, repeat=s["repeat"])
        row["numpy ms"] = t.median * 1e3
    for mode in MODES:
        eng = psoup.Engine(mode=mode)
        eng.execute(common.CREATE_R)
        handles = {key: eng.register(_sql(*key)) for key in rows}
        for p in range(0, n, s["batch"]):
            eng.insert("R", {c: v[p:p + s["batch"]] for c, v in columns.items()},
                       ts=ts[p:p + s["batch"]])
        now = float(n)
        for key, h in handles.items():
            got = [tuple(r) for r in eng.invoke(h, now=now).rows]
            if got != want[key]:
                raise AssertionError(f"{LABELS[mode]} {key}: {got} != DuckDB {want[key]}")
            def invoke(h: str = h, eng: psoup.Engine = eng, now: float = now) -> psoup.Result:
                return eng.invoke(h, now=now)
            with common.settled():
                t = common.timed(invoke, repeat=s["repeat"])
            rows[key][f"{mode} ms"] = t.median * 1e3
        eng.close()
    for row in rows.values():
        row["duckdb/P"] = row["duckdb ms"] / row["partial ms"]
        row["prepared/P"] = row["prepared ms"] / row["partial ms"]
        row["numpy/P"] = row["numpy ms"] / row["partial ms"]
        row["nomat/P"] = row["nomat ms"] / row["partial ms"]
    return list(rows.values())


def _numpy_scan(columns: dict[str, NDArray[np.int64]], kind: str,
                window: int) -> Callable[[], int | None]:
    """The plain numpy peer: a function answering `kind` over the last `window` rows."""
    a, b, c = (columns[k][-window:] for k in "abc")
    mask, work = np.empty(window, dtype=bool), np.empty(window, dtype=np.int64)
    lowest = np.iinfo(np.int64).min

    def count() -> int | None:
        return int(np.count_nonzero(np.less(a, 128, out=mask)))

    def total() -> int | None:
        np.less(a, 128, out=mask)
        return int(np.multiply(b, mask, out=work).sum()) if mask.any() else None

    def maximum() -> int | None:
        np.less(a, 128, out=mask)
        return int(np.where(mask, c, lowest).max()) if mask.any() else None
    return {"COUNT": count, "SUM": total, "MAX": maximum}[kind]


def _duckdb(columns: dict[str, NDArray[np.int64]]) -> Any:
    """A DuckDB connection holding the tuples as R(tid, a, b, c, d)."""
    import duckdb
    import pyarrow as pa
    n = len(columns["a"])
    con = duckdb.connect()
    con.register("src", pa.table({"tid": np.arange(n, dtype=np.int64), **columns}))
    con.execute("CREATE TABLE R AS SELECT * FROM src")
    con.unregister("src")
    return con


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    markers = {"COUNT": "o", "SUM": "s", "MAX": "^"}
    colors = {"partial": "C0", "complete": "C1", "nomat": "C2", "duckdb": "C3",
              "prepared": "C4", "numpy": "C5"}
    for engine in MODES + ("duckdb", "prepared", "numpy"):
        for kind, marker in markers.items():
            mine = [r for r in rows if r["kind"] == kind]
            ax.plot([r["window"] for r in mine], [r[f"{engine} ms"] for r in mine],
                    marker=marker, color=colors[engine],
                    label=f"{LABELS[engine]}" if kind == "COUNT" else None)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("window W (tuples); markers: o COUNT, s SUM, ^ MAX")
    ax.set_ylabel("invoke latency (ms, median)")
    ax.set_title("Aggregates over the last W rows (Sect. 6)")
    ax.legend()


def main() -> None:
    level, suffix = common.size_flag(__doc__)
    s = _settings(level)
    rows = bench(s)
    window, target = TARGET
    top = max(s["windows"])
    at = [r for r in rows if r["window"] == top]
    low = min(s["windows"])
    growth = {r["kind"]: r["partial ms"] / next(x["partial ms"] for x in rows
                                                if x["kind"] == r["kind"] and x["window"] == low)
              for r in at}
    worst = min(r["duckdb/P"] for r in at)
    verdict = ('met' if top == window and worst >= target
               else 'not measured' if top != window else 'NOT met')
    common.report(f"aggregates{suffix}", rows, [
        ("kind", "query", "s"), ("window", "W", ",d"),
        *[(f"{k} ms", f"{LABELS[k]} ms", ".4f") for k in MODES + ("duckdb",)],
        ("prepared ms", "DuckDB prepared ms", ".4f"), ("numpy ms", "numpy ms", ".4f"),
        ("duckdb/P", "DuckDB/P", ".0f"), ("prepared/P", "DuckDB prepared/P", ".0f"),
        ("numpy/P", "numpy/P", ".2f"), ("nomat/P", "NoMat/P", ".0f"),
    ], _plot, notes=[
        "every answer of every mode, of prepared DuckDB and of numpy matched DuckDB's",
        f"at W={top:,}: DuckDB prepared/P >= {min(r['prepared/P'] for r in at):.0f}x, "
        f"numpy/P >= {min(r['numpy/P'] for r in at):.1f}x over COUNT, SUM and MAX",
        f"at W={top:,}: DuckDB/P >= {worst:.0f}x over COUNT, SUM and MAX (target >= "
        f"{target:.0f}x at W={window:,}: "
        f"{verdict})",
        "PSoup-P latency growth from W={:,} to W={:,}: {}".format(
            low, top, ", ".join(f"{k} {g:.2f}x" for k, g in growth.items()))], params=s)


if __name__ == "__main__":
    main()
