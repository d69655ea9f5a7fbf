"""The threads the engine spreads one large step over.

The compiled kernels release the GIL (numba's `nogil=True`), so a probe of a large batch
split by tuples runs on as many cores as there are threads: each thread writes its own
tuples' columns of the results, and nothing shared is written by two of them. `Workers`
holds the pool: the caller runs the first share itself and waits for the others, so a
split step still returns only once it is wholly done (the Eddy's stream-prefix
consistency is untouched). With one thread nothing is split and no pool exists: the
engine does exactly what it did before threads came.

`Engine(threads=...)`, `psoup serve --threads`: the number of threads (default
`default_threads()`, the cores this process may run on); `check_threads` refuses what is
not a whole number >= 1.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

_T = TypeVar("_T")


def default_threads() -> int:
    """The cores this process may run on (its CPU affinity, which a container or
    `taskset` narrows), else the machine's; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):       # no affinity outside Linux
        return max(1, os.cpu_count() or 1)


def check_threads(value: object) -> int:
    """`value` as a number of threads, or ValueError saying what is allowed.

    Example:
        >>> check_threads(2)
        2
        >>> check_threads(0)
        Traceback (most recent call last):
        ...
        ValueError: threads must be a whole number >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"threads must be a whole number >= 1, got {value!r}")
    return value


class Workers:
    """A pool of `threads - 1` threads beside the caller's, made on first use.

    Example:
        >>> w = Workers(2)
        >>> w.run([lambda: 1, lambda: 2])
        [1, 2]
        >>> w.close()
    """

    def __init__(self, threads: int = 1):
        self.threads = check_threads(threads)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()       # one pool, whoever asks for it first

    def run(self, tasks: Sequence[Callable[[], _T]]) -> list[_T]:
        """Each task's result, in order: the first run on the calling thread, the others
        on the pool's, all finished when this returns. An exception of any task is
        raised here, once every task has ended (none is left writing)."""
        if len(tasks) <= 1 or self.threads == 1:
            return [task() for task in tasks]
        pool = self._pool
        if pool is None:
            with self._lock:
                pool = self._pool
                if pool is None:
                    pool = self._pool = ThreadPoolExecutor(
                        self.threads - 1, thread_name_prefix="psoup-worker")
        futures: list[Future[_T]] = [pool.submit(task) for task in tasks[1:]]
        try:
            first = tasks[0]()
        finally:
            for future in futures:      # wait for all, even when the first raised
                future.exception()
        return [first] + [future.result() for future in futures]

    def close(self) -> None:
        """Stop the pool's threads (a later `run` starts them again)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
