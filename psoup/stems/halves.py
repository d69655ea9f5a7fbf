"""A long scan over sorted positions split between the machine's cores: a new query's
registration over a large store (its probe, block folds, grouping and copies, PSoup-P's
setting of its bits are compiled kernels that release the GIL, so threads run them side
by side).

Below PARALLEL_ROWS a scan stays on the calling thread. Measured on a quiet 2-core AMD
EPYC (bench/scale_register.py's queries, register / DuckDB, unsplit -> split): at 1M
tuples a selection 0.56 -> 0.45x, an aggregate 1.45 -> 1.20x, a GROUP BY 1.49 -> 1.17x
(PSoup-P); at 4M 1.17 -> 0.85x, 2.42 -> 1.71x and 2.04 -> 1.30x; at 16M the GROUP BY
2.81 -> 2.05x. A pool's hand-off costs tens of microseconds, lost in a scan of 256K
tuples or more (about a millisecond). The caller takes a part too and the parts are
taken one at a time, so a split whose other core is busy costs about what the whole
scan costs on one. The threads are the engine's (`DataSteM.threads`, `Engine(threads=)`):
an engine with one thread never splits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import TypeVar

import numpy as np

from psoup.workers import Workers, default_threads

_T = TypeVar("_T")
_R = TypeVar("_R")

#: Positions from which a scan is split between the cores (see the module docstring).
PARALLEL_ROWS = 1 << 18

#: Threads a scan is split between: the cores this process may run on.
THREADS = default_threads()

#: The pool the parts run on (made on first use, as psoup.workers makes it).
_workers = Workers(THREADS)


def split(positions: np.ndarray, threads: int | None = None) -> list[tuple[int, int]]:
    """[a, b) bounds of about equal parts of `positions` (one part below
    PARALLEL_ROWS or with one thread), in order.

    Example:
        >>> split(np.arange(10), threads=2)
        [(0, 10)]
    """
    n, k = len(positions), THREADS if threads is None else threads
    if n < PARALLEL_ROWS or k < 2:
        return [(0, n)]
    cuts = [n * i // k for i in range(k + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def split_aligned(positions: np.ndarray, align: int, threads: int | None = None
                  ) -> list[tuple[int, int]]:
    """`split` of sorted `positions` with each cut moved up to the first position of a
    multiple of `align`, so that no two parts hold positions of one aligned run (a
    chunk, a block). Empty parts are left out.

    Example:
        >>> split_aligned(np.arange(10), 4, threads=1)
        [(0, 10)]
    """
    parts = split(positions, threads)
    if len(parts) == 1:
        return parts
    cuts = [0]
    for a, _ in parts[1:]:
        start = -(-int(positions[a]) // align) * align      # rounded up to a multiple
        cuts.append(max(cuts[-1], int(np.searchsorted(positions, start))))
    cuts.append(len(positions))
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a]


def ranges(p0: int, p1: int, align: int, threads: int | None = None) -> list[tuple[int, int]]:
    """[a, b) parts of about equal size covering [p0, p1), cut at multiples of `align`
    (one part below PARALLEL_ROWS or with one thread), in order.

    Example:
        >>> ranges(5, 3_000_005, 8192, threads=1)
        [(5, 3000005)]
    """
    k = THREADS if threads is None else threads
    if p1 - p0 < PARALLEL_ROWS or k < 2:
        return [(p0, p1)]
    cuts = sorted({p0, p1, *(min(p1, max(p0, (p0 + (p1 - p0) * i // k) // align * align))
                             for i in range(1, k))})
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def each(fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
    """[fn(item) for item in items], the items taken in turn by this thread and the
    pool's (`Workers.run`; the first exception raised is raised here, after every part
    taken has finished)."""
    return _workers.run([partial(fn, item) for item in items])
