"""A long scan over sorted positions split between the machine's cores: a new query's
registration over millions of retained tuples (its probe, grouping and copies are
compiled kernels that release the GIL, so threads run them side by side).

Below PARALLEL_ROWS a scan stays on the calling thread. On the 2-core machine these
were measured on, shared with other work, splitting did not pay: registrations over 4M
tuples ran from 1.5x faster to 2x slower split than whole, from run to run (a selection
the same, an aggregate 1.3x slower, a GROUP BY either way), since the other core was
seldom free; at 1M, split was slower. So by default nothing is split (PARALLEL_ROWS is
beyond any store); a machine with cores to spare lowers it (1M is where a pool's hand-off,
tens of microseconds, is lost in the scan).
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
PARALLEL_ROWS = 1 << 62

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
        start = (int(positions[a]) // align + 1) * align if positions[a] % align else \
            int(positions[a])
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
