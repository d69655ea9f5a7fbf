"""The hardware floor of psoup's two hot loops on this machine, for the benchmarks to
report psoup as a fraction of it (a ratio is stable across noisy runs; a time is not).

`ingest_floor(q)`: tuples/s of a C loop doing only the shared probe's work for q queries
(bench/floor.c `reject_or4`, four attributes, 257 cells each, 4,096-tuple batches into
one reused output), one ctypes call per batch, its arguments converted once;
`ingest_floor(q, timing="called")`: the same loop timed as the ingest issue's first floor
script timed it, converting them at each call; `ingest_floor(q, timing="in_c")`: the
same loop timed inside C, one call for many batches (`reject_or4_timed`), the loop's own
rate with no Python in it: the floor the targets are set against.
`retaining_floor(q, batch, retain_rows)`: the same loop as an engine with a retention
must run it, its results and tuples kept in rings as long as the retention (the memory
they take, not the probe, then bounds it).
`find_floor(q, window)`: microseconds to list one query's matches among `window` tuples
(1 in 8 matching) from a bit column (`column_positions`) and from a row-major bitmap
(`strided_positions`). Each returns None when no C compiler is found.

Usage: python bench/floor.py [Q ...]
"""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

HERE = Path(__file__).resolve().parent
BATCH, CELLS = 4096, 257


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    target = Path(tempfile.mkdtemp(prefix="psoup-floor-")) / "floor.so"
    subprocess.run([cc, "-O3", "-march=native", "-shared", "-fPIC", str(HERE / "floor.c"),
                    "-o", str(target)], check=True)
    lib = ctypes.CDLL(str(target))
    ptr, size = ctypes.c_void_p, ctypes.c_size_t
    lib.reject_or4.argtypes = [ptr] * 10 + [size, size]
    lib.reject_or4_timed.argtypes = [ptr] * 10 + [size, size, size]
    lib.reject_or4_timed.restype = ctypes.c_double
    lib.retain_or4.argtypes = [ptr] * 10 + [size, size, ptr, size, ptr, size, size]
    lib.column_positions.argtypes = [ptr, size, ptr]
    lib.column_positions.restype = size
    lib.strided_positions.argtypes = [ptr, size, size, size, ctypes.c_uint64, ptr]
    lib.strided_positions.restype = size
    return lib


def _median_seconds(fn: Callable[[], object], repeat: int = 9) -> float:
    times: list[float] = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _address(a: NDArray[Any]) -> int:
    return a.ctypes.data


def _probe_inputs(q: int, n: int, seed: int) -> tuple[
        int, list[NDArray[np.uint64]], list[NDArray[np.int64]], NDArray[np.uint64]]:
    """The probe's inputs for q queries and n tuples: (words, four reject tables of CELLS
    random rows, each tuple's cell in each, an all-ones interest row)."""
    gen = np.random.default_rng(seed)
    words = (q + 63) // 64
    tables = [gen.integers(0, 2**63, (CELLS, words), dtype=np.uint64) for _ in range(4)]
    rows = [gen.integers(0, CELLS, n, dtype=np.int64) for _ in range(4)]
    return words, tables, rows, np.full(words, np.uint64(2**64 - 1))


#: How `ingest_floor` times the loop: "once" (a ctypes call per batch, its arguments
#: converted once), "called" (converted at each call too) or "in_c" (inside C).
FloorTiming = Literal["once", "called", "in_c"]

#: The in-C timing's work per reading, in result words: about 16 batches at 1,024
#: queries, a fraction of a millisecond; each reading short, as the other timings are, so
#: that on a shared machine most readings fit between two preemptions (the clock, inside
#: C, needs no more: one batch would do).
IN_C_WORDS = 1 << 20


def ingest_floor(q: int, timing: FloorTiming = "once") -> float | None:
    """Tuples per second of the bare shared probe for q queries.

    Args:
        timing: "once": a ctypes call per 4,096-tuple batch, its twelve arguments
            converted once; "called": timed the way the ingest issue's first floor script
            timed it, each call converting its arguments (addresses through ctypes) and
            crossing into C, which costs 20-30% of the loop's time at 1,024 queries;
            "in_c": the loop timed inside C around many batches in one call
            (`reject_or4_timed`), no Python in the time: the loop's own rate.
    """
    lib = _library()
    if lib is None:
        return None
    words, tables, rows, interest = _probe_inputs(q, BATCH, seed=0)
    out = np.empty((BATCH, words), np.uint64)

    def arguments() -> list[int]:
        return [*map(_address, tables), *map(_address, rows), _address(interest),
                _address(out), BATCH, words]
    once = arguments()
    lib.reject_or4(*once)
    if timing == "in_c":
        reps = max(1, IN_C_WORDS // (BATCH * words))
        seconds = [float(lib.reject_or4_timed(*once, reps)) for _ in range(15)]
        return reps * BATCH / float(np.median(seconds))
    if timing == "called":
        return BATCH / _median_seconds(lambda: lib.reject_or4(*arguments()))
    return BATCH / _median_seconds(lambda: lib.reject_or4(*once))


def retaining_floor(q: int, batch: int, retain_rows: int, columns: int = 6,
                    pool: int = 32) -> float | None:
    """Tuples per second of the same probe loop run as an engine that answers later must
    run it (bench/floor.c `retain_or4`): each `batch` of tuples has its result rows
    written to the next slice of a ring of `retain_rows` rows, and its `columns` 8-byte
    columns (R's four, ts and tupleID) copied from the next of `pool` batches into the
    next slice of a ring of stored columns, as psoup stores them; the cells found
    beforehand, as in `ingest_floor`. The memory the results and the tuples take, not
    the probe, then bounds the rate: this is the floor of ingest with a retention."""
    lib = _library()
    if lib is None:
        return None
    words, tables, rows, interest = _probe_inputs(q, batch, seed=2)
    gen = np.random.default_rng(3)
    # touched (no first-use faults), on a cache line (whole-line streaming stores)
    ring = np.zeros(retain_rows * words + 8, np.uint64)
    ring = ring[(-ring.ctypes.data % 64) // 8:][:retain_rows * words]
    stored = np.zeros((columns, retain_rows), np.uint64)
    sources = [gen.integers(0, 256, (columns, batch)).astype(np.uint64) for _ in range(pool)]
    fixed = [*map(_address, tables), *map(_address, rows), _address(interest)]
    slots = retain_rows // batch
    sent = [0]

    def one() -> None:
        k = sent[0]
        sent[0] += 1
        at = (k % slots) * batch
        lib.retain_or4(*fixed, _address(ring) + at * words * 8, batch, words,
                       _address(sources[k % pool]), batch,
                       _address(stored) + at * 8, retain_rows, columns)
    for _ in range(slots):
        one()
    return batch / _median_seconds(one, repeat=max(9, 2 * slots))


def find_floor(q: int, window: int) -> dict[str, float] | None:
    """Microseconds to list one query's matches in `window` tuples: bit column and
    row-major bitmap."""
    lib = _library()
    if lib is None:
        return None
    gen = np.random.default_rng(1)
    words = (q + 63) // 64
    hits = gen.random(window) < 0.125
    column = np.packbits(hits, bitorder="little").view(np.uint64)
    bitmap = np.zeros((window, words), np.uint64)
    bitmap[:, 0] = hits
    out = np.full(window, -1, np.int64)         # written: no page faults in the loop
    # the least of several medians: the floor is what the machine can do, and a stall
    # inside one timing (seen: 135 us for a 12 us loop, a whole median long) would make
    # psoup look faster than the hardware
    sliced = min(_median_seconds(lambda: lib.column_positions(
        _address(column), len(column), _address(out))) for _ in range(3))
    strided = min(_median_seconds(lambda: lib.strided_positions(
        _address(bitmap), window, words, 0, 1, _address(out))) for _ in range(3))
    return {"bitsliced_us": 1e6 * sliced, "rowmajor_us": 1e6 * strided}


if __name__ == "__main__":
    for count in [int(a) for a in sys.argv[1:]] or [1024, 4096, 10_000, 100_000]:
        print(json.dumps({"queries": count, "ingest_tuples_per_s": ingest_floor(count),
                          "ingest_called_tuples_per_s": ingest_floor(count, "called"),
                          "ingest_in_c_tuples_per_s": ingest_floor(count, "in_c"),
                          "retaining_tuples_per_s": retaining_floor(count, 10_000, 200_000),
                          **(find_floor(count, 1 << 16) or {})}))
