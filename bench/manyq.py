"""Ingest with 10^4 and 10^5 standing queries: psoup's shared Query SteM against the
many-query baseline a user would otherwise write (Fabret et al.'s setting, a percolator).

Each query is 1-4 inequality factors on distinct attributes of R (the Fig. 9 workload,
Sect. 5.2.1). The baseline holds the queries as (column, operator, constant) lists and,
for every batch, evaluates each query over the batch with numpy (one vectorized
comparison per factor) and keeps the matching row numbers per query: per-query
evaluation, vectorized over tuples. It is measured twice: as first written (each
comparison allocates a fresh mask) and tight (`common.UnsharedNumpy`: comparisons into
preallocated masks with `out=`). A numpy user can also share the work as psoup does:
`common.SharedNumpy` builds the same bit table per attribute, finds each value's cell
(a value -> cell map; also timed with np.searchsorted per value), gathers the cells' rows
and ANDs them across attributes, one row of match bits per tuple. psoup (PSoup-P) probes
its predicate index once per batch for all queries and records the matches in its
Results Structure. All get the same batches; the matches are compared on the last batch.
The C floor is bench/floor.c's probe loop, timed inside C (the target's) and, as before,
with a ctypes call per batch.

Usage: python bench/manyq.py [--quick | --smoke]
"""

from __future__ import annotations

import operator
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)
import floor  # noqa: E402

import psoup  # noqa: E402

OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"counts": [100, 400], "batch": 200, "min_time": 0.0, "cap": 0.05}
    if level == "quick":
        return {"counts": [1_000, 4_000], "batch": 1_000, "min_time": 0.1, "cap": 0.5}
    return {"counts": [10_000, 100_000], "batch": 4_000, "min_time": 1.0, "cap": 3.0}


def workload(gen: np.random.Generator, n: int) -> list[list[tuple[str, str, int]]]:
    """n queries as factor lists [(column, operator, constant), ...]."""
    out: list[list[tuple[str, str, int]]] = []
    for _ in range(n):
        cols = gen.choice(common.STREAM_COLUMNS, size=int(gen.integers(1, 5)), replace=False)
        ops = list(OPS)
        out.append([(str(c), ops[int(gen.integers(4))], common.constant(gen)) for c in cols])
    return out


class Percolator:
    """The baseline: every query evaluated on its own over each batch."""

    def __init__(self, queries: list[list[tuple[str, str, int]]]):
        self.queries = [[(c, OPS[op], v) for c, op, v in q] for q in queries]
        self.matches: list[NDArray[np.intp]] = []

    def insert(self, columns: dict[str, NDArray[np.int64]]) -> None:
        out: list[NDArray[np.intp]] = []
        for factors in self.queries:
            c, op, v = factors[0]
            mask = op(columns[c], v)
            for c, op, v in factors[1:]:
                mask &= op(columns[c], v)
            out.append(np.flatnonzero(mask))
        self.matches = out


#: The baselines whose matches are checked: as first written, tight, shared.
Baselines = tuple[Percolator, common.UnsharedNumpy, common.SharedNumpy]


def _rate(fn: Callable[[], object], s: dict[str, Any]) -> float:
    """Tuples/s of `fn`, one batch per call, timed as every peer here is."""
    with common.settled():
        t = common.timed(fn, repeat=2, min_time=s["min_time"], max_time=s["cap"])
    return t.calls * int(s["batch"]) / t.total


def _baselines(row: dict[str, Any], qs: list[list[tuple[str, str, int]]],
               last: dict[str, NDArray[np.int64]], s: dict[str, Any]) -> Baselines:
    """Time the numpy baselines on the last batch psoup took, into `row`."""
    first = Percolator(qs)
    tight = common.UnsharedNumpy(qs)
    shared = common.SharedNumpy(qs)
    searched = common.SharedNumpy(qs, direct=False)
    row["numpy tuples/s"] = _rate(lambda: first.insert(last), s)
    row["tight tuples/s"] = _rate(lambda: tight.insert(last), s)
    row["shared tuples/s"] = _rate(lambda: shared.insert(last), s)
    row["searched tuples/s"] = _rate(lambda: searched.insert(last), s)
    if not np.array_equal(shared.rows, searched.rows):
        raise AssertionError("the shared numpy baselines disagree")
    row["speedup"] = row["psoup tuples/s"] / row["numpy tuples/s"]
    row["speedup tight"] = row["psoup tuples/s"] / row["tight tuples/s"]
    row["speedup shared"] = row["psoup tuples/s"] / row["shared tuples/s"]
    return first, tight, shared


def _verify(eng: psoup.Engine, handles: list[str], sent: int, batch: int,
            baselines: Baselines) -> None:
    """The last batch's matches (tupleIDs from `sent - batch` on) per query, a sample of
    200 queries: psoup's and every baseline's the same."""
    first, tight, shared = baselines
    first_tid = sent - batch
    for i in range(0, len(handles), max(1, len(handles) // 200)):
        got = eng.invoke(handles[i], now=float(sent)).tuple_ids
        got = got[got >= first_tid] - first_tid
        if not (np.array_equal(got, first.matches[i]) and np.array_equal(got, tight.matches[i])
                and np.array_equal(got, shared.matches(i))):
            raise AssertionError(f"query {i}: psoup and the baseline disagree")


def _floors(row: dict[str, Any], s: dict[str, Any]) -> None:
    """The C floors at the row's query count, and psoup as a share of each."""
    count = row["queries"]
    row["floor in C"] = floor.ingest_floor(count, "in_c")
    row["floor tuples/s"] = floor.ingest_floor(count)
    if row["floor tuples/s"]:
        row["of floor in C"] = row["psoup tuples/s"] / row["floor in C"]
        row["of floor"] = row["psoup tuples/s"] / row["floor tuples/s"]
        row["retaining floor"] = floor.retaining_floor(count, s["batch"], 2 * s["batch"])
        row["of retaining"] = row["psoup tuples/s"] / row["retaining floor"]


def bench(s: dict[str, Any]) -> list[dict[str, Any]]:
    gen = common.rng(71)
    pool = [common.data_columns(gen, s["batch"]) for _ in range(4)]
    qs = workload(common.rng(72), max(s["counts"]))
    rows: list[dict[str, Any]] = []
    for count in s["counts"]:
        row: dict[str, Any] = {"queries": count}
        eng = psoup.Engine(chunk_rows=s["batch"] * 2)
        eng.execute(f"{common.CREATE_R} RETAIN {s['batch'] * 2} ROWS")
        t0 = time.perf_counter()
        handles = [eng.register("SELECT * FROM R WHERE " + " AND ".join(
            f"{c} {op} {v}" for c, op, v in q)) for q in qs[:count]]
        row["register s"] = time.perf_counter() - t0
        sent = [0]

        def feed_psoup(eng: psoup.Engine = eng, sent: list[int] = sent) -> None:
            cols = pool[(sent[0] // s["batch"]) % len(pool)]
            eng.insert("R", cols, ts=np.arange(sent[0], sent[0] + s["batch"], dtype=float))
            sent[0] += s["batch"]
        t0 = time.perf_counter()
        feed_psoup()                               # builds the predicate index
        row["first batch s"] = time.perf_counter() - t0
        with common.settled():
            t = common.timed(feed_psoup, repeat=3, min_time=s["min_time"], max_time=s["cap"])
        row["psoup tuples/s"] = t.calls * s["batch"] / t.total
        last = pool[((sent[0] - s["batch"]) // s["batch"]) % len(pool)]
        baselines = _baselines(row, qs[:count], last, s)
        _verify(eng, handles, sent[0], s["batch"], baselines)
        row["memory MB"] = eng.stats()["memory"]["total"] / 1e6
        _floors(row, s)
        eng.close()
        rows.append(row)
    return rows


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    counts = [r["queries"] for r in rows]
    ax.plot(counts, [r["psoup tuples/s"] for r in rows], marker="o", label="psoup (PSoup-P)")
    ax.plot(counts, [r["numpy tuples/s"] for r in rows], marker="s", linestyle="--",
            label="per-query numpy (as first written)")
    ax.plot(counts, [r["tight tuples/s"] for r in rows], marker="^", linestyle=":",
            label="per-query numpy, tight (out=)")
    ax.plot(counts, [r["shared tuples/s"] for r in rows], marker="v", linestyle="-.",
            label="shared numpy (the same bit tables)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("standing queries")
    ax.set_ylabel("tuples / s ingested")
    ax.set_title("Many standing queries: shared index vs per-query evaluation")
    ax.legend()


COLUMNS = [
    ("queries", "queries", ",d"), ("psoup tuples/s", "psoup tuples/s", ",.0f"),
    ("numpy tuples/s", "per-query numpy tuples/s", ",.0f"), ("speedup", "psoup/numpy", ".1f"),
    ("tight tuples/s", "numpy tight tuples/s", ",.0f"),
    ("speedup tight", "psoup/numpy tight", ".1f"),
    ("shared tuples/s", "numpy shared tuples/s", ",.0f"),
    ("speedup shared", "psoup/numpy shared", ".2f"),
    ("searched tuples/s", "numpy shared searchsorted tuples/s", ",.0f"),
    ("register s", "register s", ".1f"), ("first batch s", "first batch s", ".2f"),
    ("memory MB", "memory MB", ",.0f"),
    ("floor in C", "C floor in C", ",.0f"), ("of floor in C", "psoup/floor in C", ".2f"),
    ("floor tuples/s", "C floor tuples/s", ",.0f"), ("of floor", "psoup/floor", ".2f"),
    ("retaining floor", "C retaining floor", ",.0f"),
    ("of retaining", "psoup/retaining floor", ".2f"),
]

NOTES = [
    "matches agree on the last batch for a sample of 200 queries per count",
    "numpy tight: the same per-query evaluation with every comparison written into a "
    "preallocated mask (out=), matches kept as row numbers per query; psoup/numpy is "
    "the old ratio, psoup/numpy tight the honest one against per-query evaluation",
    "numpy shared: the shared structure built with numpy (common.SharedNumpy): per "
    "attribute a bit row per cell of the queries' sorted bounds, each value's cell from a "
    "value -> cell map, one row gather per attribute and a bitwise AND across them, one "
    "row of match bits per tuple; the strongest numpy peer; searchsorted: the same with "
    "np.searchsorted per value in place of the map; neither keeps more than the last "
    "batch's rows, psoup keeps its retention's",
    "register s: registering the queries one by one through SQL; first batch s: the "
    "first batch after them",
    "C floor in C: bench/floor.c's bare probe loop (4 attributes, reused output) timed "
    "inside C over many batches (no ctypes call in its time), the target's; C floor: the "
    "same loop with a ctypes call per batch (the old column)",
    "C retaining floor: the same loop as an engine with this retention (2 batches) must "
    "run it, its result rows and its tuples kept in rings (floor.retaining_floor)"]


def _verdicts(rows: Sequence[dict[str, Any]]) -> list[str]:
    return [f"target: psoup >= 0.5 of the C floor in C at {r['queries']:,} queries: "
            f"{r['of floor in C']:.2f} -> {'PASS' if r['of floor in C'] >= 0.5 else 'MISS'} "
            f"(with a ctypes call per batch {r['of floor']:.2f})"
            for r in rows if r.get("of floor in C") is not None]


def main() -> None:
    level, suffix = common.size_flag(__doc__)
    s = _settings(level)
    rows = bench(s)
    common.report(f"manyq{suffix}", rows, COLUMNS, _plot, notes=_verdicts(rows) + NOTES,
                  params=s)


if __name__ == "__main__":
    main()
