"""The threads the engine spreads one large step over.

The compiled kernels release the GIL (numba's `nogil=True`), so a probe of a large batch
split by tuples runs on as many cores as there are threads: each thread writes its own
tuples' columns of the results, and nothing shared is written by two of them. `Workers`
holds the pool: the caller and the pool's threads take the shares one at a time, and
the caller returns only once every share is done, so a split step is still one step
(the Eddy's stream-prefix consistency is untouched). With one thread nothing is split
and no pool exists: the engine does exactly what it did before threads came.

`Engine(threads=...)`, `psoup serve --threads`: the number of threads (default
`default_threads()`, the cores this process may run on); `check_threads` refuses what is
not a whole number >= 1.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar, cast

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
        """Each task's result, in order, all finished when this returns. The calling
        thread and the pool's take the tasks in turn, each the next one not yet taken:
        a pool thread that a busy core holds back takes fewer, or none (the caller does
        not wait for a thread that has not started one). An exception of a task is
        raised here once every task taken has ended (none is left writing)."""
        if len(tasks) <= 1 or self.threads == 1:
            return [task() for task in tasks]
        pool = self._pool
        if pool is None:
            with self._lock:
                pool = self._pool
                if pool is None:
                    pool = self._pool = ThreadPoolExecutor(
                        self.threads - 1, thread_name_prefix="psoup-worker")
        batch = _Batch(tasks)
        for _ in range(min(self.threads, len(tasks)) - 1):
            pool.submit(batch.work)
        batch.work()
        batch.done.wait()
        if batch.errors:
            raise batch.errors[0]
        return batch.results

    def close(self) -> None:
        """Stop the pool's threads (a later `run` starts them again)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


class _Batch(Generic[_T]):
    """One `Workers.run`: its tasks, taken one at a time by whichever thread asks
    first, their results, and an event set when the last task taken has ended."""

    def __init__(self, tasks: Sequence[Callable[[], _T]]):
        self.tasks = tasks
        self.results: list[_T] = [cast(_T, None)] * len(tasks)
        self.errors: list[BaseException] = []
        self.done = threading.Event()
        self._next = 0
        self._left = len(tasks)
        self._lock = threading.Lock()

    def work(self) -> None:
        """Run tasks not yet taken until none is left."""
        while True:
            with self._lock:
                i = self._next
                if i >= len(self.tasks):
                    return
                self._next = i + 1
            try:
                self.results[i] = self.tasks[i]()
            except BaseException as exc:    # raised by run, on the calling thread
                self.errors.append(exc)
            finally:
                with self._lock:
                    self._left -= 1
                    if not self._left:
                        self.done.set()
