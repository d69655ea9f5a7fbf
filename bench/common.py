"""Shared pieces of the psoup benchmarks: the PSoup paper's synthetic workload
(Sect. 5.2.1), a timer, machine information and the table/JSON/PNG report.

Every script in bench/ imports this module by name (bench/ is on sys.path when a script
runs), builds its rows with these generators, and ends with one `report` call.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: One seed for every benchmark, so two runs see the same tuples and queries.
SEED = 20030609

#: The paper's stream: four integer attributes, values uniform in [0, 255].
STREAM_COLUMNS = ("a", "b", "c", "d")
DOMAIN = 256
CREATE_R = "CREATE STREAM R (a INT, b INT, c INT, d INT)"

_INEQUALITIES = ("<", "<=", ">", ">=")


def rng(offset: int = 0) -> np.random.Generator:
    """The benchmarks' random generator; `offset` separates independent streams of draws."""
    return np.random.default_rng(SEED + offset)


def data_columns(gen: np.random.Generator, n: int) -> dict[str, NDArray[np.int64]]:
    """n tuples of R as column arrays (int64, uniform in [0, 255])."""
    return {col: gen.integers(0, DOMAIN, n, dtype=np.int64) for col in STREAM_COLUMNS}


def constant(gen: np.random.Generator) -> int:
    """A factor's constant: a uniform multiple of 32 with probability 0.2, else uniform
    in [0, 255] (Sect. 5.2.1: the multiples make some constants shared by many queries)."""
    if gen.random() < 0.2:
        return 32 * int(gen.integers(0, DOMAIN // 32))
    return int(gen.integers(0, DOMAIN))


def _factor(gen: np.random.Generator, kind: str, col: str) -> str:
    if kind == "inequality":
        return f"{col} {_INEQUALITIES[gen.integers(len(_INEQUALITIES))]} {constant(gen)}"
    if kind == "equality":
        return f"{col} = {constant(gen)}"
    if kind == "interval":
        size = int(gen.integers(0, DOMAIN))
        lo = int(gen.integers(0, DOMAIN - size))
        return f"{col} BETWEEN {lo} AND {lo + size}"
    raise ValueError(f"unknown factor kind {kind!r} (inequality, equality, interval)")


def where_clause(gen: np.random.Generator, kind: str) -> str:
    """1-4 factors of `kind` on distinct attributes, joined by AND; also valid DuckDB SQL.

    Args:
        kind: "inequality" (`a >= 37`, Fig. 9), "equality" (`a = 37`, Fig. 7a) or
            "interval" (`a BETWEEN 12 AND 140`, interval size uniform in [0, 255], Fig. 7b).
    """
    k = int(gen.integers(1, len(STREAM_COLUMNS) + 1))
    cols = gen.choice(STREAM_COLUMNS, size=k, replace=False)
    return " AND ".join(_factor(gen, kind, str(col)) for col in cols)


def selection_queries(gen: np.random.Generator, n: int, kind: str) -> list[str]:
    """n selection queries over R, e.g. "SELECT * FROM R WHERE a >= 37 AND c < 128".

    Args:
        gen: the random generator.
        n: how many queries.
        kind: "inequality" (Fig. 9), "equality" (Fig. 7a) or "interval" (Fig. 7b).
    """
    return [f"SELECT * FROM R WHERE {where_clause(gen, kind)}" for _ in range(n)]


_UFUNCS = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
           "=": np.equal}


def factors(where: str) -> list[tuple[str, str, int]]:
    """A conjunction of `column op constant` factors as (column, op, constant) triples.

    Example:
        >>> factors("a >= 37 AND c < 128")
        [('a', '>=', 37), ('c', '<', 128)]
    """
    out: list[tuple[str, str, int]] = []
    for factor in where.split(" AND "):
        col, op, value = factor.split()
        out.append((col, op, int(value)))
    return out


class UnsharedNumpy:
    """The unshared baseline as a competent numpy user writes it: each query evaluated on
    its own over each batch, one comparison per factor into preallocated masks (`out=`),
    and each query's matches kept as the batch's row numbers (np.flatnonzero), its
    natural result form, not a bitmap in psoup's layout.

    Example:
        >>> u = UnsharedNumpy([[("a", ">", 1)], [("a", "<", 3), ("b", "=", 0)]])
        >>> [m.tolist() for m in u.insert({"a": np.arange(4), "b": np.zeros(4, int)})]
        [[2, 3], [0, 1, 2]]
    """

    def __init__(self, queries: Sequence[Sequence[tuple[str, str, int]]]):
        self.queries = [[(c, _UFUNCS[op], v) for c, op, v in q] for q in queries]
        self.matches: list[NDArray[np.intp]] = []
        self._mask = self._factor = np.empty(0, dtype=bool)

    def insert(self, columns: dict[str, NDArray[Any]]) -> list[NDArray[np.intp]]:
        n = len(next(iter(columns.values())))
        if len(self._mask) != n:
            self._mask, self._factor = np.empty(n, dtype=bool), np.empty(n, dtype=bool)
        out: list[NDArray[np.intp]] = []
        mask, factor, land = self._mask, self._factor, np.logical_and
        for query in self.queries:
            c, op, v = query[0]
            op(columns[c], v, out=mask)
            for c, op, v in query[1:]:
                op(columns[c], v, out=factor)
                land(mask, factor, out=mask)
            out.append(np.flatnonzero(mask))
        self.matches = out
        return out


_LOWEST, _HIGHEST = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)

#: SharedNumpy keeps a direct value -> cell array for a column while its values span
#: fewer than this (psoup's predicate index keeps its direct map under the same bound).
DIRECT_SPAN = 1 << 16


def _accepted(op: str, value: int) -> tuple[int, int]:
    """The integers a factor `column op value` accepts, as inclusive bounds."""
    return {"<": (_LOWEST, value - 1), "<=": (_LOWEST, value), ">": (value + 1, _HIGHEST),
            ">=": (value, _HIGHEST), "=": (value, value)}[op]


class SharedNumpy:
    """The shared baseline as a numpy expert writes it, the structure psoup shares built
    with numpy alone: per attribute, the queries' bounds sorted into cells and one bit
    row per cell (query i is bit i % 64 of word i // 64) of the queries that accept it;
    each batch then costs, per attribute, finding each value's cell, one gather of those
    cells' rows, and a bitwise AND across attributes: an (n, ceil(Q/64)) uint64 array,
    one row of match bits per tuple (the bits psoup records, in the C floor's layout).
    The rows are a fresh array per batch (they are the batch's answer and outlive it);
    the other gathers go into one reused array, with mode="clip" (with out=, np.take's
    default mode gathers into a buffer first: 3x slower at 1,024 queries). Only the last
    batch's rows are kept, as the unshared baseline keeps only its last matches. Integer
    columns only (`a > v` is taken as `a >= v + 1`).

    The cells' rows are cumulative: going up the cells, a query's bit turns on at the
    cell where its accepted interval starts and off where it ends, so each table is the
    running XOR (np.logical_xor.accumulate) of those toggles. A value's cell is
    np.searchsorted of the value among the bounds; while a column's values seen so far
    span fewer than DIRECT_SPAN values, a value -> cell array over that span (built by
    np.searchsorted, widened when a value falls outside it) finds them with one gather
    instead, as psoup's index does: a binary search per value costs several times the
    rest of the batch at 1,024 queries. With direct=False every value is searched.

    Example:
        >>> s = SharedNumpy([[("a", ">", 1)], [("a", "<", 3), ("b", "=", 0)]])
        >>> rows = s.insert({"a": np.arange(4), "b": np.zeros(4, int)})
        >>> rows[:, 0].tolist(), s.matches(0).tolist(), s.matches(1).tolist()
        ([2, 2, 3, 1], [2, 3], [0, 1, 2])
    """

    def __init__(self, queries: Sequence[Sequence[tuple[str, str, int]]],
                 direct: bool = True):
        self.words, self.direct = -(-len(queries) // 64), direct
        columns = sorted({c for query in queries for c, _, _ in query})
        if not columns:
            raise ValueError("SharedNumpy needs at least one factor")
        self.tables = [(c, *self._table(queries, c)) for c in columns]
        #: per table: (the first value, the cell of each value from it on)
        self.maps = [(0, np.empty(0, np.intp)) for _ in columns]
        self.rows = np.empty((0, self.words), np.uint64)
        self._spare = self.rows

    def _table(self, queries: Sequence[Sequence[tuple[str, str, int]]],
               column: str) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
        """(sorted cell bounds, one bit row per cell) for `column`: cell k holds the
        values v with k bounds <= v (np.searchsorted's side="right")."""
        lo = np.full(len(queries), _LOWEST, np.int64)
        hi = np.full(len(queries), _HIGHEST, np.int64)
        for i, query in enumerate(queries):
            for c, op, value in query:
                if c == column:         # several factors on one column: they intersect
                    low, high = _accepted(op, value)
                    lo[i], hi[i] = max(int(lo[i]), low), min(int(hi[i]), high)
        live = np.flatnonzero(lo <= hi)          # an empty interval never turns on
        ends = live[hi[live] < _HIGHEST]
        bounds = np.unique(np.concatenate([lo[live][lo[live] > _LOWEST], hi[ends] + 1]))
        toggles = np.zeros((len(bounds) + 1, 64 * self.words), dtype=bool)
        toggles[np.searchsorted(bounds, lo[live], side="right"), live] = True
        toggles[np.searchsorted(bounds, hi[ends] + 1, side="right"), ends] = True
        accept = np.logical_xor.accumulate(toggles, axis=0)
        packed = np.packbits(accept, axis=1, bitorder="little")
        return bounds, packed.view(np.dtype("<u8")).astype(np.uint64, copy=False)

    def cells(self, k: int, values: NDArray[np.int64]) -> NDArray[np.intp]:
        """The cell of each of `values` in table k."""
        bounds = self.tables[k][1]
        if not self.direct:
            return np.searchsorted(bounds, values, side="right")
        first, cell = self.maps[k]
        lo, hi = int(values.min()), int(values.max())
        if lo < first or hi >= first + len(cell):
            if len(cell):
                lo, hi = min(lo, first), max(hi, first + len(cell) - 1)
            if hi - lo >= DIRECT_SPAN:
                return np.searchsorted(bounds, values, side="right")
            first, cell = lo, np.searchsorted(bounds, np.arange(lo, hi + 1), side="right")
            self.maps[k] = first, cell
        return np.take(cell, values - first if first else values)

    def insert(self, columns: dict[str, NDArray[Any]]) -> NDArray[np.uint64]:
        n = len(next(iter(columns.values())))
        if len(self._spare) != n:
            self._spare = np.empty((n, self.words), np.uint64)
        (c, _, table), *rest = self.tables
        rows = np.take(table, self.cells(0, columns[c]), axis=0)
        spare, land = self._spare, np.bitwise_and
        for k, (c, _, table) in enumerate(rest, start=1):
            np.take(table, self.cells(k, columns[c]), axis=0, out=spare, mode="clip")
            land(rows, spare, out=rows)
        self.rows = rows
        return rows

    def matches(self, query: int) -> NDArray[np.intp]:
        """Query number `query`'s matches in the last batch, as its row numbers."""
        bits = self.rows[:, query >> 6] >> np.uint64(query & 63)
        return np.flatnonzero(bits & np.uint64(1))


_PREPARED = itertools.count()


def prepare(con: Any, sql: str) -> str:
    """Prepare `sql` once on the DuckDB connection `con` (planned once, as a user serving
    the same question again and again would); returns the statement that runs it.

    Example:
        >>> import duckdb
        >>> con = duckdb.connect()
        >>> con.execute(prepare(con, "SELECT 42 AS x")).fetchnumpy()["x"].tolist()
        [42]
    """
    name = f"bench_{next(_PREPARED)}"
    con.execute(f"PREPARE {name} AS {sql}")
    return f"EXECUTE {name}"


@dataclass
class Timing:
    """Seconds taken by each call of a timed function."""

    times: list[float]

    @property
    def calls(self) -> int:
        return len(self.times)

    @property
    def total(self) -> float:
        return sum(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


@contextmanager
def settled() -> Iterator[None]:
    """Collect garbage, then freeze every object alive so far (the data, the engines,
    the expected answers) out of the collector's reach until the block ends. Time inside
    it: otherwise each full collection triggered by the timed calls' allocations rescans
    the whole setup, a cost that depends on how much setup happens to be alive rather
    than on the engine measured. Peers are timed the same way."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def timed(fn: Callable[[], Any], repeat: int = 5, min_time: float = 0.0,
          max_time: float = float("inf")) -> Timing:
    """Call `fn` at least `repeat` times and until `min_time` seconds have been spent in
    it, but stop once `max_time` seconds have been spent (after at least one call).

    Example:
        >>> timed(lambda: None, repeat=3).calls
        3
    """
    times: list[float] = []
    spent = 0.0
    clock = time.perf_counter
    while (len(times) < repeat or spent < min_time) and (not times or spent < max_time):
        t0 = clock()
        fn()
        dt = clock() - t0
        times.append(dt)
        spent += dt
    return Timing(times)


def paced(stop: threading.Event, every: float, step: Callable[[], object]) -> None:
    """Call `step` every `every` seconds until `stop` (late calls do not burst to catch
    up): an open-loop client, such as a producer or a poller at a fixed rate."""
    due = time.monotonic()
    while not stop.is_set():
        step()
        due = max(due + every, time.monotonic())
        stop.wait(due - time.monotonic())


def run_for(threads: list[threading.Thread], stop: threading.Event, seconds: float) -> float:
    """Start `threads`, let them run `seconds`, set `stop` (a threading.Event they
    watch) and join them; returns the seconds from the first start to the last join."""
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


#: A run's sizes: "full" measures; "quick" (`--quick`) is a small run that still times
#: something; "smoke" (`--smoke`, or PSOUP_BENCH_SMOKE=1 in the environment, which is how
#: `psoup bench --quick` passes it on) only checks that a suite runs and writes its reports,
#: in seconds (the tests run it).
Level = Literal["full", "quick", "smoke"]

#: The environment variable that turns every suite's run into a smoke run.
SMOKE_ENV = "PSOUP_BENCH_SMOKE"

_SUFFIXES: dict[Level, str] = {"full": "", "quick": "_quick", "smoke": "_smoke"}


def size_flag(doc: str) -> tuple[Level, str]:
    """Parse a benchmark's command line (`--quick`, `--smoke`): (level, report-name
    suffix). The smoke level wins over --quick, so `psoup bench --quick` with
    PSOUP_BENCH_SMOKE=1 runs every suite at smoke sizes."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run")
    parser.add_argument("--smoke", action="store_true",
                        help=f"a tiny run that only checks the wiring (also {SMOKE_ENV}=1)")
    args = parser.parse_args()
    level: Level = "full"
    if args.smoke or os.environ.get(SMOKE_ENV, "") not in ("", "0"):
        level = "smoke"
    elif args.quick:
        level = "quick"
    return level, _SUFFIXES[level]


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in Linux's /proc/cpuinfo ("model name", "flags",
    "cpu family", "model", ...), or none where there is no such file."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break               # the first processor's fields end here
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def kernel_target() -> dict[str, Any]:
    """The kernels the figures ran: the backend (PSOUP_KERNELS) and, for numba, the CPU
    and the features LLVM compiled them for (numba's host CPU, or NUMBA_CPU_NAME and
    NUMBA_CPU_FEATURES), the features as the enabled ones only. Numba is not imported
    under the numpy backend."""
    from psoup.kernels import BACKEND
    target: dict[str, Any] = {"backend": BACKEND}
    if BACKEND == "numba":
        from numba.core.registry import cpu_target
        codegen = cpu_target.target_context.codegen()
        features = str(getattr(codegen, "_tm_features", ""))
        target["cpu"] = str(codegen._get_host_cpu_name())
        target["features"] = " ".join(f[1:] for f in features.split(",") if f.startswith("+"))
        target["avx512 compress"] = "+avx512f" in features.split(",")
    return target


def machine_info() -> dict[str, Any]:
    """Where the numbers were measured: the CPU's model, family and flags (a kernel's
    speed can hang on one instruction that CPUs run at very different speeds) and the
    kernels' target among them."""
    import matplotlib
    cpu = _cpuinfo()
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu": cpu.get("model name"),
        "cpu_family": cpu.get("cpu family"),
        "cpu_model": cpu.get("model"),
        "cpu_flags": cpu.get("flags"),
        "cpu_count": os.cpu_count(),
        "kernels": kernel_target(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "matplotlib": matplotlib.__version__,
    }
    try:
        import duckdb
        info["duckdb"] = duckdb.__version__
    except ImportError:
        pass
    return info


def cpu_line(info: dict[str, Any] | None = None) -> str:
    """The CPU and the kernels' target in one line, for a report's notes: "AMD EPYC
    (family 26 model 2), kernels numba compiled for znver5, with AVX-512"."""
    info = info or machine_info()
    cpu = info.get("cpu") or info.get("processor") or info["machine"]
    if info.get("cpu_family"):
        cpu += f" (family {info['cpu_family']} model {info['cpu_model']})"
    kernels = info["kernels"]
    target = kernels["backend"]
    if "cpu" in kernels:
        compress = "with" if kernels["avx512 compress"] else "without"
        target += f" compiled for {kernels['cpu']}, {compress} AVX-512"
    return f"{cpu}, kernels {target}"


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return format(value, fmt)


def report(name: str, rows: Sequence[dict[str, Any]],
           columns: Sequence[tuple[str, str, str]],
           plot_fn: Callable[[Any, Sequence[dict[str, Any]]], None],
           notes: Sequence[str] = (), params: dict[str, Any] | None = None) -> None:
    """Print `rows` as an aligned table, then write bench/results/<name>.json and .png.

    Args:
        name: the benchmark's name, used for the output files.
        rows: one dict per table row.
        columns: (key, header, format spec) per printed column; None prints as "-".
        plot_fn: draws on a matplotlib Axes, called as plot_fn(ax, rows).
        notes: lines printed under the table and stored in the JSON (verdicts, caveats).
        params: the benchmark's parameters, stored in the JSON.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [[header for _, header, _ in columns]]
    cells += [[_cell(row.get(key), fmt) for key, _, fmt in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    print("\n".join(lines))
    for note in notes:
        print(note)

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": name,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "params": params or {},
        "columns": [list(column) for column in columns],
        "rows": list(rows),
        "notes": list(notes),
    }
    json_path = RESULTS_DIR / f"{name}.json"
    json_path.write_text(json.dumps(doc, indent=2, default=_jsonable) + "\n")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_fn(ax, rows)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    png_path = RESULTS_DIR / f"{name}.png"
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    print(f"wrote {json_path.relative_to(ROOT)} and {png_path.relative_to(ROOT)}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
