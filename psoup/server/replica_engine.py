"""A read replica's process (`python -m psoup.server.replica_engine`, started by its
primary: psoup.server.replica has the design): its engine, restored from the primary's
snapshot and kept current by its feed, serving the connections the primary passes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from psoup.engine import Engine
from psoup.errors import PSoupError
from psoup.journal import checkpoint as checkpoints
from psoup.journal.durable import _Replay
from psoup.journal.journal import Record, RecordKind, decode
from psoup.locks import Holding
from psoup.query import compile_statement
from psoup.query.model import Query
from psoup.server.ops import Limits
from psoup.server.replica import receive_message, send_message
from psoup.server.server import Server

log = logging.getLogger("psoup.server")

#: How long a read waits for its replica to apply what the primary committed before it
#: began; past this the replica is too far behind, and the read fails (an internal error)
#: rather than answer from an older state.
CATCH_UP_SECONDS = 30.0


class ReplicaEngine(Engine):
    """A replica's engine: in memory, restored from the primary's snapshot and kept
    current by its feed (`apply`), answering reads once it has applied what the
    primary committed before each began (`locked`, `_before_read`). Writes are the primary's:
    the replica's server sends them there (psoup.server.server, `upstream`), and one
    called here raises.

    Costs: a read's wait O(records the primary committed and this has not applied);
    `apply` O(record), as recovery replays it.
    """

    def __init__(self, counter: NDArray[np.int64], applied: int, primary: Iterable[str],
                 secret: bytes, settings: Mapping[str, Any]):
        super().__init__(**settings)
        self._cursors.use_secret(secret)
        self._counter = counter
        self.applied = applied
        self._caught = threading.Condition()
        self.ended = False
        #: handles whose invocations the primary answers (their tiers are its files)
        self.primary = set(primary)
        self._replay = _Replay(self._core, self._producers, self._effects, Path())

    def restore(self, manifest: Mapping[str, Any], folder: Path) -> None:
        """Read the snapshot back (before serving)."""
        with self._lock:
            checkpoints.restore(self._core, manifest, folder, self._effects.create)
            self._producers.restore(manifest["producers"])

    def apply(self, raw: Any) -> None:
        """Apply one record of the feed, under the lock, then count it. A record that
        fails to apply stops the replica (the caller exits; the primary starts another)."""
        record = decode(raw, "the replica's feed")
        if record.op is RecordKind.REGISTER:
            self._replay_register(record.handle, record.sql)
        else:
            self._apply(record)
        with self._caught:
            self.applied += 1
            self._caught.notify_all()

    def _replay_register(self, handle: str, sql: str) -> None:
        """A registration, as the primary ends one: over a large store its scan runs
        off the lock (reads go on meanwhile; this thread applies nothing else), and
        only its end holds it."""
        with self._lock:
            schemas = self._core.schemas()
            query = compile_statement(sql, schemas)
            assert isinstance(query, Query), "a register record holds a SELECT"
            if any((source := schemas[s.stream].source) is not None and source.in_executors
                   for s in query.sources):
                self.primary.add(handle)    # its batch store is the primary's
            ahead = self._core.ahead(query)
            if ahead is None:
                self._core.register(query, handle)
                return
        ahead.run()
        with self._lock:
            self._core.register(query, handle, ahead)

    def _apply(self, record: Record) -> None:
        with self._lock:
            if record.op in (RecordKind.TIERS, RecordKind.HISTORY):
                self.primary.update(record.tiers or record.handles)
            else:
                self._replay.apply(record)
                if record.op is RecordKind.UNREGISTER:
                    self.primary.discard(record.handle)
                elif record.op is RecordKind.DROP:
                    self.primary.difference_update(record.handles)

    def end(self) -> None:
        """The feed ended: reads waiting for it fail."""
        with self._caught:
            self.ended = True
            self._caught.notify_all()

    def caught_up(self, wait: bool | float) -> bool:
        """Whether this replica has applied every record the primary had committed when
        this was called, waiting up to `wait` seconds for it (True: CATCH_UP_SECONDS,
        False: not at all). O(1) when it has."""
        target = int(self._counter[0])
        if self.applied >= target:
            return True
        if wait is False:
            return False
        deadline = time.monotonic() + (CATCH_UP_SECONDS if wait is True else float(wait))
        with self._caught:
            while self.applied < target and not self.ended:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._caught.wait(left)
        return self.applied >= target

    def _check(self) -> None:
        """The engine's invariants, and: nothing applied past what the primary fed."""
        assert self.applied <= int(self._counter[0])
        super()._check()

    def _before_read(self) -> None:
        """Before an invocation, `queries` or `last_seq` (outside the lock): wait until
        this replica has applied what the primary had committed."""
        if not self._lock.held() and not self.caught_up(True):
            raise PSoupError("this read replica is behind the primary by more than "
                             f"{CATCH_UP_SECONDS:g}s of its writes (or lost its feed); "
                             "the read was not answered: send it again")

    def locked(self, wait: bool | float = True) -> Holding:
        """As `Engine.locked`, once this replica has caught up with the primary (within
        `wait`): a block that gets False otherwise."""
        if not self.caught_up(wait):
            return _NOT_HELD
        return super().locked(wait)

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        raise PSoupError("a read replica applies only its primary's changes")

    register = execute = create_stream = drop_stream = unregister = history = insert


class _NotHeld(Holding):
    """A block that never holds the lock."""

    def __init__(self) -> None:
        pass

    def __enter__(self) -> bool:
        return False

    def __exit__(self, *exc: Any) -> None:
        pass


_NOT_HELD = _NotHeld()


def _apply_feed(feed: socket.socket, engine: ReplicaEngine, server: Server) -> None:
    """The replica's feed thread: apply records until the primary closes the feed (or a
    record fails), then stop the server."""
    try:
        while True:
            raw = receive_message(feed)
            if raw is None:
                log.info("the primary closed the feed; this replica stops")
                break
            engine.apply(raw)
    except Exception:
        log.exception("this read replica failed to apply its primary's change; it stops")
    finally:
        engine.end()
        server.stop()


def main(argv: list[str]) -> None:
    """`python -m psoup.server.replica_engine FEED_FD HANDOFF_FD COUNTER_FD` (the fds are
    inherited from the primary, which starts it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the primary stops it (its feed ends)
    logging.basicConfig(level=logging.WARNING, format="psoup replica: %(message)s")
    feed = socket.socket(fileno=int(argv[0]))
    handoff = socket.socket(fileno=int(argv[1]))
    view = mmap.mmap(int(argv[2]), 8)
    counter: NDArray[np.int64] = np.ndarray((1,), np.int64, buffer=view)
    start = receive_message(feed)
    if not isinstance(start, Mapping):
        os._exit(1)
    engine = ReplicaEngine(counter, int(start["seq"]), start["manifest"]["primary"],
                           bytes(start["secret"]), start["engine"])
    engine.restore(start["manifest"], Path(start["folder"]))
    server = Server(engine, token=start["token"], limits=Limits(**start["limits"]),
                    handoff=handoff, upstream=start["upstream"])
    server.server_id, server.replica = start["server_id"], int(start["number"])
    threading.Thread(target=_apply_feed, args=(feed, engine, server), daemon=True,
                     name="psoup-replica-feed").start()
    send_message(feed, "ready")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(server.serve_forever())
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])

