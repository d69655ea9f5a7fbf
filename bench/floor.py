"""The hardware floor of psoup's two hot loops on this machine, for the benchmarks to
report psoup as a fraction of it (a ratio is stable across noisy runs; a time is not).

`ingest_floor(q)`: tuples/s of a C loop doing only the shared probe's work for q queries
(bench/floor.c `reject_or4`, four attributes, 257 cells each, 4,096-tuple batches into
one reused output), its arguments converted once; `ingest_floor(q, called=True)`: the
same loop timed as the ingest issue's floor script times it, converting them at each call.
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
from functools import lru_cache
from pathlib import Path

import numpy as np

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
    lib.column_positions.argtypes = [ptr, size, ptr]
    lib.column_positions.restype = size
    lib.strided_positions.argtypes = [ptr, size, size, size, ctypes.c_uint64, ptr]
    lib.strided_positions.restype = size
    return lib


def _median_seconds(fn, repeat: int = 9) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _address(a: np.ndarray) -> int:
    return a.ctypes.data


def ingest_floor(q: int, called: bool = False) -> float | None:
    """Tuples per second of the bare shared probe for q queries, its arguments converted
    once; with `called`, timed the way the ingest issue's own floor script times it,
    against which its targets were set: each timed call converts its twelve arguments
    (addresses through ctypes) and crosses into C, once per 4,096-tuple batch, which
    costs about a third of the loop's time at 1,024 queries."""
    lib = _library()
    if lib is None:
        return None
    gen = np.random.default_rng(0)
    words = (q + 63) // 64
    tables = [gen.integers(0, 2**63, (CELLS, words), dtype=np.uint64) for _ in range(4)]
    rows = [gen.integers(0, CELLS, BATCH, dtype=np.int64) for _ in range(4)]
    interest = np.full(words, np.uint64(2**64 - 1))
    out = np.empty((BATCH, words), np.uint64)

    def arguments() -> list:
        return [*map(_address, tables), *map(_address, rows), _address(interest),
                _address(out), BATCH, words]
    once = arguments()
    lib.reject_or4(*once)
    if called:
        return BATCH / _median_seconds(lambda: lib.reject_or4(*arguments()))
    return BATCH / _median_seconds(lambda: lib.reject_or4(*once))


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
    out = np.empty(window, np.int64)
    sliced = _median_seconds(lambda: lib.column_positions(_address(column), len(column),
                                                          _address(out)))
    strided = _median_seconds(lambda: lib.strided_positions(
        _address(bitmap), window, words, 0, 1, _address(out)))
    return {"bitsliced_us": 1e6 * sliced, "rowmajor_us": 1e6 * strided}


if __name__ == "__main__":
    for count in [int(a) for a in sys.argv[1:]] or [1024, 4096, 10_000, 100_000]:
        print(json.dumps({"queries": count, "ingest_tuples_per_s": ingest_floor(count),
                          "ingest_called_tuples_per_s": ingest_floor(count, called=True),
                          **(find_floor(count, 1 << 16) or {})}))
