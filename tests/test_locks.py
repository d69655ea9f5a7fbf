"""The engine's lock is granted in arrival order, so a reader waiting behind a stream of
writes gets in after the write in progress, not after all of them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from psoup.locks import FairLock


def _wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    # The bound only catches a hang: a thread starting on a loaded machine may be slow.
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _queue_up(lock: FairLock, order: list[str], name: str) -> threading.Thread:
    """Start a thread that takes the lock and records its name; return once it waits."""
    tickets = lock._next_ticket
    thread = threading.Thread(target=lambda: _record(lock, order, name))
    thread.start()
    _wait_for(lambda: lock._next_ticket == tickets + 1)
    return thread


def _record(lock: FairLock, order: list[str], name: str) -> None:
    with lock:
        order.append(name)


def test_waiters_get_the_lock_in_arrival_order() -> None:
    lock, order = FairLock(), list[str]()
    with lock:
        threads = [_queue_up(lock, order, name) for name in "abcde"]
    for thread in threads:
        thread.join(5)
    assert order == list("abcde")


def test_a_releasing_thread_that_asks_again_goes_behind_the_waiters() -> None:
    lock, order = FairLock(), list[str]()
    with lock:
        reader = _queue_up(lock, order, "reader")
    with lock:                   # the writer's next batch
        order.append("writer")
    reader.join(5)
    assert order == ["reader", "writer"]


def test_the_lock_is_reentrant_and_released_only_by_the_outermost_exit() -> None:
    lock, order = FairLock(), list[str]()
    with lock:
        with lock:
            other = _queue_up(lock, order, "other")
        assert lock.held() and order == []
    other.join(5)
    assert order == ["other"] and not lock.held()


def test_acquire_if_free_takes_a_free_lock_and_reenters() -> None:
    lock = FairLock()
    assert lock.acquire_if_free() and lock.held()
    assert lock.acquire_if_free()                  # reentrant, like `with lock`
    lock.__exit__()
    lock.__exit__()
    assert not lock.held()
    assert lock.acquire_if_free()
    lock.__exit__()


def test_acquire_if_free_does_not_wait_for_a_held_lock() -> None:
    lock, got = FairLock(), []
    with lock:
        other = threading.Thread(target=lambda: got.append(lock.acquire_if_free()))
        other.start()
        other.join(5)
    assert got == [False] and not other.is_alive()


def test_acquire_if_free_does_not_overtake_a_waiting_ticket() -> None:
    lock = FairLock()
    lock._next_ticket += 1                  # a ticket drawn, its thread not yet served
    assert not lock.acquire_if_free()
    lock._serving += 1
    assert lock.acquire_if_free()
    lock.__exit__()


def test_acquire_within_takes_a_free_lock_and_reenters() -> None:
    lock = FairLock()
    assert lock.acquire_within(0.0) and lock.acquire_within(0.0) and lock.held()
    lock.__exit__()
    lock.__exit__()
    assert not lock.held() and lock.acquire_if_free()
    lock.__exit__()


def test_acquire_within_gets_a_lock_released_in_time() -> None:
    lock, got = FairLock(), []
    lock.__enter__()
    other = threading.Thread(target=lambda: got.append(lock.acquire_within(60.0)))
    other.start()
    _wait_for(lambda: lock._waiting == 1)
    lock.__exit__()
    other.join(5)
    assert got == [True] and lock._owner == other.ident
    lock._owner = None               # released for the thread that has ended
    lock._serving += 1


def test_a_wait_that_runs_out_gives_up_its_turn_and_keeps_the_order_behind_it() -> None:
    lock, order, got = FairLock(), list[str](), []
    with lock:
        before = _queue_up(lock, order, "before")
        late = threading.Thread(target=lambda: got.append(lock.acquire_within(0.05)))
        late.start()
        late.join(5)
        after = _queue_up(lock, order, "after")
        assert got == [False] and lock._abandoned
    before.join(5)
    after.join(5)
    assert order == ["before", "after"] and not lock._abandoned
    assert lock.acquire_if_free()              # the given-up ticket was skipped
    lock.__exit__()


def test_holding_waits_a_number_of_seconds_at_most() -> None:
    lock, got = FairLock(), []

    def hold() -> None:
        with lock.holding(0.05) as held:
            got.append(held)
    with lock:
        other = threading.Thread(target=hold)
        other.start()
        other.join(5)
    assert got == [False]
    with lock.holding(0.05) as held:
        assert held and lock.held()
    assert not lock.held()
