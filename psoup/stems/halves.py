"""A long scan over sorted positions split between the machine's cores: a new query's
registration over millions of retained tuples (its probe, grouping and copies are
compiled kernels that release the GIL, so threads run them side by side).

Below PARALLEL_ROWS a scan stays on the calling thread: handing work to a pool and
waiting for it costs tens of microseconds, what a kernel does with ~100K tuples.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

import numpy as np

_T = TypeVar("_T")
_R = TypeVar("_R")

#: Positions from which a scan is split between the cores.
PARALLEL_ROWS = 1 << 20

#: Threads a scan is split between: the cores this process may run on.
THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
    (os.cpu_count() or 1)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def split(positions: np.ndarray, threads: int | None = None) -> list[tuple[int, int]]:
    """[a, b) bounds of about equal parts of `positions` (one part below
    PARALLEL_ROWS or with one thread), in order.

    Example:
        >>> split(np.arange(10)), split(np.arange(3 << 20), threads=2)
        ([(0, 10)], [(0, 1572864), (1572864, 3145728)])
    """
    n, k = len(positions), THREADS if threads is None else threads
    if n < PARALLEL_ROWS or k < 2:
        return [(0, n)]
    cuts = [n * i // k for i in range(k + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def ranges(p0: int, p1: int, align: int, threads: int | None = None) -> list[tuple[int, int]]:
    """[a, b) parts of about equal size covering [p0, p1), cut at multiples of `align`
    (one part below PARALLEL_ROWS or with one thread), in order.

    Example:
        >>> ranges(5, 3_000_005, 8192, threads=2)
        [(5, 1499136), (1499136, 3000005)]
    """
    k = THREADS if threads is None else threads
    if p1 - p0 < PARALLEL_ROWS or k < 2:
        return [(p0, p1)]
    cuts = sorted({p0, p1, *(min(p1, max(p0, (p0 + (p1 - p0) * i // k) // align * align))
                             for i in range(1, k))})
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def each(fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
    """[fn(item) for item in items], the items on the pool's threads when there are
    several (the first exception raised is raised here, after all have finished)."""
    items = list(items)
    if len(items) < 2:
        return [fn(item) for item in items]
    pool = _executor()
    futures = [pool.submit(fn, item) for item in items]
    wait(futures)
    return [future.result() for future in futures]


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="psoup-scan")
        return _pool
