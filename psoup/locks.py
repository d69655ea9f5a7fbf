"""A reentrant lock granted in arrival order.

The engine holds one lock per call (stream-prefix consistency across threads). With
`threading.RLock`, a writer that releases the lock and asks again at once usually wins
against a reader that has been waiting, so under continuous ingest an invocation could
wait for many batches. Granting the lock first come, first served bounds that wait by
the one call ahead of it (the service issue: "invocations never block on ingest longer
than one batch").
"""

from __future__ import annotations

import threading
import time
from typing import Any


class FairLock:
    """A reentrant, first-come-first-served lock (a ticket lock on a Condition).

    Example:
        >>> lock = FairLock()
        >>> with lock:
        ...     with lock:          # reentrant
        ...         lock.held()
        True
        >>> lock.held()
        False
    """

    def __init__(self) -> None:
        # entered as the plain lock it wraps (a Condition's own __enter__ is Python code)
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._owner: int | None = None
        self._depth = 0
        self._next_ticket = 0
        self._serving = 0
        self._waiting = 0
        # tickets whose threads stopped waiting (`acquire_within`): skipped when reached
        self._abandoned: set[int] = set()

    def __enter__(self) -> FairLock:
        self._acquire(None)
        return self

    def acquire_if_free(self) -> bool:
        """Take the lock only if no thread holds it or waits for it (so no waiter is
        overtaken); True when taken, to be released with `__exit__`. Never blocks.

        Example:
            >>> lock = FairLock()
            >>> lock.acquire_if_free(), lock.held()
            (True, True)
            >>> lock.__exit__()
        """
        me = threading.get_ident()
        with self._mutex:
            if self._owner is not None and self._owner != me:
                return False
            if self._owner == me:
                self._depth += 1
                return True
            if self._serving != self._next_ticket:      # a ticket ahead is waiting
                return False
            self._next_ticket += 1
            self._owner, self._depth = me, 1
        return True

    def acquire_within(self, seconds: float) -> bool:
        """Take the lock in arrival order like `with lock`, but wait for it at most
        `seconds`: True when taken (release it with `__exit__`), False when the time
        ran out (the ticket is given up, and the waiters behind it keep their order).

        Example:
            >>> lock = FairLock()
            >>> lock.acquire_within(0.01), lock.held()
            (True, True)
            >>> lock.__exit__()
        """
        return self._acquire(seconds)

    def _acquire(self, seconds: float | None) -> bool:
        """Take a ticket and wait for its turn (for at most `seconds`; None: as long as
        it takes): True when the lock is held, False when the time ran out (the ticket
        is then given up, `__exit__` skips it)."""
        me = threading.get_ident()
        with self._mutex:
            if self._owner == me:
                self._depth += 1
                return True
            ticket = self._next_ticket
            self._next_ticket += 1
            if self._serving != ticket:
                self._waiting += 1
                deadline = None if seconds is None else time.monotonic() + seconds
                while self._serving != ticket:
                    if deadline is None:
                        self._cond.wait()
                        continue
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._cond.wait(left):
                        if self._serving == ticket:
                            break
                        self._waiting -= 1
                        self._abandoned.add(ticket)
                        return False
                self._waiting -= 1
            self._owner, self._depth = me, 1
        return True

    def __exit__(self, *exc: Any) -> None:
        with self._mutex:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._serving += 1
                while self._abandoned and self._serving in self._abandoned:
                    self._abandoned.remove(self._serving)
                    self._serving += 1
                if self._waiting:          # an uncontended release wakes no one
                    self._cond.notify_all()

    def holding(self, wait: bool | float = True) -> Holding:
        """Hold the lock for a block: its `__enter__` gives True. With `wait=False` it
        is taken only if no one holds it or waits for it, and the block gets False
        otherwise, at once; with `wait` a number of seconds, it is waited for that long
        at most. (A class, not a generator: a server's every read goes through it.)"""
        return Holding(self, wait)

    def held(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == threading.get_ident()


class Holding:
    """The block of `FairLock.holding`: takes the lock as `wait` says on entry (giving
    whether it is held) and releases it on exit if it was taken."""

    __slots__ = ("lock", "wait", "held")

    def __init__(self, lock: FairLock, wait: bool | float):
        self.lock, self.wait, self.held = lock, wait, False

    def __enter__(self) -> bool:
        wait, lock = self.wait, self.lock
        if wait is True:
            lock.__enter__()
            self.held = True
        elif wait is False:
            self.held = lock.acquire_if_free()
        else:
            self.held = lock.acquire_within(wait)
        return self.held

    def __exit__(self, *exc: Any) -> None:
        if self.held:
            self.held = False
            self.lock.__exit__()
