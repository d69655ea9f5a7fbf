"""The query stream: registrations interleaved with data (PSoup treats queries as a stream).

For each query count Q (Fig. 9's inequality queries over R, 100-tuple batches, the last
RETAIN_ROWS tuples retained):

* apart: register the Q queries first, then insert Q batches;
* interleaved: register one query, insert one batch, Q times (each new query is also
  joined with the retained data, the paper's new query over old data);
* per step: one register + one batch at Q queries, against one plain batch at Q queries;
* after unregister: the first batch after one query leaves, against a steady batch.

Targets (issue 14): interleaved total <= 2x apart; a step <= 5x a plain insert; the
batch after an unregister <= 2x a steady batch.

Usage: python bench/register.py [--quick | --smoke]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)

import psoup  # noqa: E402

BATCH = 100
RETAIN_ROWS = 10_000
TARGETS = {"interleaved/apart": 2.0, "step/insert": 5.0, "after unregister/steady": 2.0}


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"counts": [16, 32], "samples": 2}
    if level == "quick":
        return {"counts": [64, 256], "samples": 5}
    return {"counts": [1_000, 4_096, 10_000], "samples": 30}


class _Stream:
    """Batches of BATCH tuples with ever-increasing ts, from a fixed pool."""

    def __init__(self, engine: psoup.Engine, pool: list[dict[str, NDArray[np.int64]]]):
        self.engine, self.pool, self.sent = engine, pool, 0
        self.offsets = np.arange(BATCH, dtype=np.float64)

    def __call__(self) -> None:
        self.engine.insert("R", self.pool[(self.sent // BATCH) % len(self.pool)],
                           ts=self.offsets + self.sent)
        self.sent += BATCH


def _engine(pool: list[dict[str, NDArray[np.int64]]]) -> tuple[psoup.Engine, _Stream]:
    eng = psoup.Engine()
    eng.execute(f"{common.CREATE_R} RETAIN {RETAIN_ROWS} ROWS")
    return eng, _Stream(eng, pool)


def apart(queries: list[str], pool: list[dict[str, NDArray[np.int64]]]) -> float:
    eng, feed = _engine(pool)
    with common.settled():
        t0 = time.perf_counter()
        for sql in queries:
            eng.register(sql)
        for _ in queries:
            feed()
        return time.perf_counter() - t0


def interleaved(queries: list[str], pool: list[dict[str, NDArray[np.int64]]],
                samples: int) -> dict[str, float]:
    """The whole interleaved run, then at Q: step, plain batch and after-unregister times
    (medians of `samples`, each step's query unregistered again so Q stays put)."""
    eng, feed = _engine(pool)
    with common.settled():
        t0 = time.perf_counter()
        for sql in queries:
            eng.register(sql)
            feed()
        total = time.perf_counter() - t0
        extra = common.selection_queries(common.rng(7), samples, "inequality")
        steps: list[float] = []
        plain: list[float] = []
        after: list[float] = []
        for sql in extra:
            t = time.perf_counter()
            feed()
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            handle = eng.register(sql)
            feed()
            steps.append(time.perf_counter() - t)
            eng.unregister(handle)
            t = time.perf_counter()
            feed()
            after.append(time.perf_counter() - t)
    return {"total": total, "step": statistics.median(steps),
            "insert": statistics.median(plain), "after": statistics.median(after)}


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    counts = [row["queries"] for row in rows]
    ax.plot(counts, [row["interleaved s"] for row in rows], marker="o", label="interleaved")
    ax.plot(counts, [row["apart s"] for row in rows], marker="o", label="registered first")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("queries (one registered per 100-tuple batch)")
    ax.set_ylabel("total seconds")
    ax.set_title("The query stream: registrations interleaved with data")
    ax.legend()


def main() -> None:
    level, suffix = common.size_flag(__doc__)
    quick = level != "full"
    s = _settings(level)
    pool = [common.data_columns(common.rng(1), BATCH) for _ in range(64)]
    all_queries = common.selection_queries(common.rng(2), max(s["counts"]), "inequality")
    apart(all_queries[:8], pool)          # load the compiled kernels before any timing:
    interleaved(all_queries[:8], pool, 2)   # a registration's probe of retained data too
    rows: list[dict[str, Any]] = []
    for count in s["counts"]:
        queries = all_queries[:count]
        a = apart(queries, pool)
        got = interleaved(queries, pool, s["samples"])
        rows.append({"queries": count, "apart s": a, "interleaved s": got["total"],
                     "interleaved/apart": got["total"] / a,
                     "step ms": 1e3 * got["step"], "insert ms": 1e3 * got["insert"],
                     "step/insert": got["step"] / got["insert"],
                     "after unregister ms": 1e3 * got["after"],
                     "after unregister/steady": got["after"] / got["insert"]})
    notes: list[str] = []
    for key, target in TARGETS.items():
        worst = max(row[key] for row in rows)
        verdict = "PASS" if worst <= target else "MISS"
        notes.append(f"target: {key} <= {target:g}x at every count: worst {worst:.2f}x "
                     f"-> {verdict}")
    columns = [("queries", "queries", ",d"), ("apart s", "apart s", ".2f"),
               ("interleaved s", "interleaved s", ".2f"),
               ("interleaved/apart", "inter/apart", ".2f"), ("step ms", "step ms", ".3f"),
               ("insert ms", "insert ms", ".3f"), ("step/insert", "step/insert", ".2f"),
               ("after unregister ms", "after unreg ms", ".3f"),
               ("after unregister/steady", "after/steady", ".2f")]
    params = {"batch_rows": BATCH, "retain_rows": RETAIN_ROWS, "query_kind": "inequality",
              "samples": s["samples"], "seed": common.SEED, "quick": quick}
    common.report(f"register{suffix}", rows, columns, _plot, notes=notes, params=params)


if __name__ == "__main__":
    main()
