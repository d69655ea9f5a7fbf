"""Read replicas of the psoup server (`psoup serve --replicas N`).

The server's engine process (the primary) runs its Python on one core, whatever the
threads: the GIL serializes it. A read replica is another process that holds a copy of
the whole state and answers the reads of the connections the primary passes it, so that
invocations run on more cores than one.

* **Start.** The primary writes a snapshot of its state as checkpoint files
  (`Engine.snapshot`: its cut under the engine's lock, the files off it) into a private
  folder; the replica maps them (psoup.journal.checkpoint.restore) and removes the folder.
* **Changes.** Every change the primary logs after the cut (create, insert, register,
  unregister, drop, tiers, history) is given to the feed (`Engine.set_feed`), in the
  order of the log, and sent over a Unix socket to each replica, which applies it through
  recovery's own paths (psoup.journal.durable's `_Replay`): the same tupleIDs, handles
  and slots. O(record) each, on both sides.
* **Consistency.** The primary counts the records it has fed in a shared memory word
  (the commit number), written under its lock as each change is logged. A replica reads
  the word when a read begins and answers once it has applied that many records, so every
  read sees every write acknowledged before it began, wherever that write was sent (a
  client reads its own writes); the wait is usually nothing or one batch's apply.
* **Writes.** A replica applies nothing a client sends: every write (and stats, history
  status and cancel, and the invocations of handles with an archive tier or a history
  still due, whose files only the primary reads) goes to the primary over a connection of
  its own per client connection (`Upstream`), so a client's order, its inserts' chains
  and idempotency keys, and the ingest queue's refusals are the primary's, byte for byte.
  If that connection breaks, the client's connection is closed: a write's outcome is then
  unknown to the client exactly as when its own connection breaks.
* **Cursors** are signed with the primary's secret, so a cursor from either process is
  valid on the other. An answer that cannot be recomputed from the tuples (aggregates,
  joins) is kept by the process that gave it: a replica without the copy hands the poll
  to the primary (psoup.server.server, `_since_here_or_primary`); the primary, holding
  no copy a replica kept, raises CursorExpired, as after an eviction.
* **Failures.** A replica that dies, or falls more than MAX_LAG_BYTES of records behind,
  is dropped (its connections close; their clients reconnect, to a live process) and
  started again from a new snapshot 1, 2, 4 ... 60 s later. A replica whose primary goes
  away stops.

Costs: each replica holds the whole state (memory x (1 + N)) and applies every change
(ingest CPU x (1 + N)): replicas pay where reads outweigh writes. A registration is
scanned over the replica's retained rows off its lock once the primary has committed it
(psoup.server.replica_engine), so the replica's reads that begin after that commit wait
for the scan. The replica's side (its engine, its process) is
psoup.server.replica_engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Container, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from numpy.typing import NDArray

from psoup.engine import Engine
from psoup.errors import PSoupError
from psoup.journal.journal import RecordKind
from psoup.server.ops import OPS, Limits, OpName
from psoup.server.protocol import HEADER, PROTOCOL, pack_frame, unpack_payload

log = logging.getLogger("psoup.server")

#: A feed message's header: the length of the msgpack body that follows.
_FRAME = struct.Struct("<Q")

#: Bytes of records a replica may have queued and not yet taken before the primary
#: drops it (it is started again from a snapshot): a replica that cannot keep up with
#: the writes must not make the primary's memory grow without bound.
MAX_LAG_BYTES = 512 << 20

#: How long a replica the primary dropped (its feed ended) has to exit before it is killed.
KILL_SECONDS = 10.0

#: Longest wait between a replica's end and its next start (the waits double from 1 s).
_MOST_BACKOFF = 60.0

#: The ops a replica always sends to the primary besides every write: those whose answer
#: is the primary's (its ingest queue, its Spark jobs).
_PRIMARY_READS = frozenset({OpName.STATS, OpName.HISTORY_STATUS, OpName.HISTORY_CANCEL})


def send_message(sock: socket.socket, message: Any) -> int:
    """Send one feed message (blocking); returns its bytes."""
    body = msgpack.packb(message, use_bin_type=True)
    sock.sendmsg([_FRAME.pack(len(body)), body])
    return len(body)


def receive_message(sock: socket.socket) -> Any:
    """The next feed message (blocking), or None when the other side closed the socket.

    Raises:
        PSoupError: a message cut short or that does not decode."""
    head = _exactly(sock, _FRAME.size)
    if head is None:
        return None
    (size,) = _FRAME.unpack(head)
    body = _exactly(sock, size)
    if body is None:
        raise PSoupError("the replica's feed ended inside a message")
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise PSoupError(f"the replica's feed sent a message that does not decode: {exc}"
                         ) from None


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(min(n - len(buf), 1 << 24))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _record_bytes(record: Mapping[str, Any]) -> int:
    """About the bytes a record takes queued (an insert's arrays; others are small)."""
    if record.get("op") != RecordKind.INSERT.value:
        return 256
    ts = record.get("ts")
    rows = len(ts["data"]) // 8 if isinstance(ts, Mapping) else len(ts or ())
    return 256 + 8 * rows * (2 + len(record.get("cols") or ()))


# ---------------------------------------------------------------------- the primary


class _Link:
    """The primary's side of one replica: its process, its feed (records queued for the
    feed's sender thread, oldest first), and the socket client connections are passed
    on. The queue is appended to under the engine's lock and taken by the sender."""

    def __init__(self, number: int):
        self.number = number
        self.proc: subprocess.Popen[bytes] | None = None
        self.feed: socket.socket | None = None
        self.handoff: socket.socket | None = None
        self.queue: deque[tuple[dict[str, Any], int]] = deque()   # (record, its bytes)
        self.queued = 0                 # bytes (about) in the queue
        self.wake = threading.Condition()
        self.ready = False              # restored and caught up once: takes connections
        self.dead = False
        self.passed = 0                 # connections passed to it
        self.start_seq = 0              # the commit number at its snapshot's cut

    def put(self, record: dict[str, Any], size: int) -> None:
        """Queue a record of about `size` bytes (under the engine's lock); a replica
        too far behind is dropped. O(1)."""
        if self.dead:
            return
        if self.queued + size > MAX_LAG_BYTES:
            log.warning("read replica %d is over %d MiB of records behind; dropping it",
                        self.number, MAX_LAG_BYTES >> 20)
            self.end()
            return
        with self.wake:
            self.queue.append((record, size))
            self.queued += size
            self.wake.notify()

    def end(self) -> None:
        """Stop feeding it: its sockets close, so the replica ends and its connections
        with it; one that has not exited KILL_SECONDS later is killed."""
        if not self.dead and self.proc is not None:
            killer = threading.Timer(KILL_SECONDS, _kill_if_alive, (self.proc,))
            killer.daemon = True
            killer.start()
        self.dead, self.ready = True, False
        with self.wake:
            self.wake.notify()
        for sock in (self.feed, self.handoff):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class Replicas:
    """The primary's read replicas (see the module docstring): starts each from a
    snapshot, feeds it every change, passes it its share of the connections, and starts
    it again after it ends.

    Args:
        engine: the primary's engine.
        count: replicas to run (>= 1).
        token: the server's access token (the replicas' clients say hello with it).
        limits: the server's limits (each replica serves with the same).
        upstream: the Unix socket path where the primary serves the replicas' own
            connections (their clients' writes).
        server_id: the server's id, which its replicas' hellos say too (a client sees
            one server, whichever process its connection reached).

    Costs: each change O(record) per replica under the engine's lock (queued; packed
    and sent on the replica's sender thread); passing a connection O(1).
    """

    def __init__(self, engine: Engine, count: int, token: str, limits: Limits,
                 upstream: str, server_id: str):
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"replicas must be a count >= 1, not {count!r}")
        self.engine, self.count, self.token = engine, count, token
        self.limits, self.upstream, self.server_id = limits, upstream, server_id
        self._fd = os.memfd_create("psoup-commits", 0)
        os.ftruncate(self._fd, 8)
        self._map = mmap.mmap(self._fd, 8)
        self._counter: NDArray[np.int64] = np.ndarray((1,), np.int64, buffer=self._map)
        self.seq = 0                    # records fed so far (the commit number)
        self.links: tuple[_Link, ...] = ()      # fed now (swapped whole, never changed)
        self._all: list[_Link] = []
        self._turn = 0
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.starts = 0
        # where snapshots are written: a durable server's data directory (the files can
        # be large, and a temporary folder may be memory), else the system's temporary
        self._snapshots: Path | None = None if engine.path is None else engine.path / "replicas"

    # -- lifecycle

    async def start(self) -> None:
        """Start the replicas (each from a snapshot); returns once they take
        connections, or have failed to start (they are tried again later)."""
        self._loop = asyncio.get_running_loop()
        if self._snapshots is not None:     # a durable server's: on its disk
            shutil.rmtree(self._snapshots, ignore_errors=True)    # a crash's left-overs
            self._snapshots.mkdir(mode=0o700)
        self.engine.set_feed(self._fan)
        await asyncio.gather(*(self._run(number) for number in range(self.count)))

    async def stop(self) -> None:
        """Stop feeding, end every replica and wait for its process."""
        self._stopping = True
        self.engine.set_feed(None)
        for task in self._tasks:
            task.cancel()
        for link in self._all:
            link.end()
        for link in self._all:
            if link.proc is not None:
                await asyncio.get_running_loop().run_in_executor(None, _reap, link.proc)
        self._map.close()
        os.close(self._fd)
        if self._snapshots is not None:
            shutil.rmtree(self._snapshots, ignore_errors=True)

    # -- the feed (under the engine's lock)

    def _fan(self, record: dict[str, Any]) -> None:
        self.seq += 1
        size = _record_bytes(record)
        for link in self.links:
            link.put(record, size)
        self._counter[0] = self.seq

    # -- connections

    def pass_socket(self, conn: socket.socket) -> bool:
        """Pass an accepted connection to the replica whose turn it is (True: it is
        theirs, closed here); False on the primary's turn, or when none is ready. The
        turns go round the primary and the ready replicas."""
        ready = [link for link in self._all if link.ready]
        self._turn = (self._turn + 1) % (len(ready) + 1)
        if self._turn == 0 or not ready:
            return False
        link = ready[self._turn - 1]
        assert link.handoff is not None, "a ready replica has its socket"
        try:
            socket.send_fds(link.handoff, [b"c"], [conn.fileno()])
        except OSError:
            return False
        conn.close()
        link.passed += 1
        return True

    def stats(self) -> dict[str, Any]:
        return {"count": self.count, "ready": sum(link.ready for link in self._all),
                "starts": self.starts, "commit": self.seq,
                "lag_records": {link.number: len(link.queue) for link in self._all},
                "connections_passed": {link.number: link.passed for link in self._all}}

    def _check(self) -> None:
        """The invariants: the shared word is the commit number; every replica fed is
        one of this server's, and none taking connections has ended."""
        assert int(self._counter[0]) == self.seq
        assert all(link in self._all for link in self.links)
        assert all(not link.dead for link in self._all if link.ready)
        assert all(link.queued >= 0 for link in self._all)

    # -- one replica's life

    async def _run(self, number: int) -> None:
        """Start replica `number`; when it ends, start it again (backing off)."""
        link = _Link(number)
        self._all.append(link)
        try:
            await self._start(link)
        except Exception as exc:
            log.warning("read replica %d failed to start: %s", number, exc)
            link.end()
        self._watch(link, 1.0)

    def _watch(self, link: _Link, backoff: float) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._again(link, backoff))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _again(self, link: _Link, backoff: float) -> None:
        loop = asyncio.get_running_loop()
        if link.proc is not None:
            await loop.run_in_executor(None, _reap_when_gone, link, self)
        if self._stopping:
            return
        self._all.remove(link)
        await loop.run_in_executor(None, self._unlink, link)
        await asyncio.sleep(backoff)
        if self._stopping:
            return
        again = _Link(link.number)
        self._all.append(again)
        try:
            await self._start(again)
            backoff = 1.0
        except Exception as exc:
            log.warning("read replica %d failed to start again: %s", link.number, exc)
            again.end()
            backoff = min(_MOST_BACKOFF, backoff * 2)
        self._watch(again, backoff)

    def _unlink(self, link: _Link) -> None:
        """Stop feeding an ended replica (under the engine's lock, as `joined` adds)."""
        with self.engine.locked():
            self.links = tuple(x for x in self.links if x is not link)

    async def _start(self, link: _Link) -> None:
        loop = asyncio.get_running_loop()
        feed, their_feed = socket.socketpair()
        handoff, their_handoff = socket.socketpair()
        link.feed, link.handoff = feed, handoff
        # the process first: its imports overlap the snapshot's writing
        argv = [sys.executable, "-m", "psoup.server.replica_engine", str(their_feed.fileno()),
                str(their_handoff.fileno()), str(self._fd)]
        try:
            link.proc = subprocess.Popen(
                argv, pass_fds=(their_feed.fileno(), their_handoff.fileno(), self._fd),
                env=_child_env())
        finally:
            their_feed.close()
            their_handoff.close()
        self.starts += 1
        folder = Path(tempfile.mkdtemp(prefix=f"snapshot-{link.number}-",
                                       dir=self._snapshots))
        try:
            def joined() -> None:       # under the engine's lock, at the cut
                self.links = (*self.links, link)
                link.start_seq = self.seq

            manifest = await loop.run_in_executor(None, self.engine.snapshot, folder, joined)
            start = {"folder": str(folder), "manifest": manifest,
                     "seq": link.start_seq,
                     "secret": self.engine.cursor_secret, "token": self.token,
                     "upstream": self.upstream, "limits": asdict(self.limits),
                     "engine": self.engine.replica_settings(), "number": link.number,
                     "server_id": self.server_id}
            await loop.run_in_executor(None, send_message, feed, start)
            threading.Thread(target=_send_records, args=(link,), daemon=True,
                             name=f"psoup-replica-{link.number}-feed").start()
            said = await loop.run_in_executor(None, receive_message, feed)
            if said != "ready":
                raise PSoupError(f"it said {said!r} where 'ready' was expected")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        link.ready = not link.dead
        log.info("read replica %d serves (pid %d)", link.number, link.proc.pid)


def _send_records(link: _Link) -> None:
    """The sender thread of one replica's feed: the queued records, in order."""
    feed = link.feed
    assert feed is not None
    while True:
        with link.wake:
            while not link.queue and not link.dead:
                link.wake.wait()
            if link.dead:
                return
            batch = list(link.queue)
            link.queue.clear()
        try:
            for record, _ in batch:
                send_message(feed, record)
        except OSError:
            link.end()
            return
        with link.wake:
            link.queued -= sum(size for _, size in batch)


def _kill_if_alive(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        log.warning("read replica (pid %d) did not exit once its feed ended; killing it",
                    proc.pid)
        proc.kill()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _reap_when_gone(link: _Link, replicas: Replicas) -> None:
    """Wait (on a thread, blocked: Popen.wait with a timeout polls) for the replica's
    process to end, then end its link."""
    proc = link.proc
    assert proc is not None
    proc.wait()
    if not replicas._stopping:
        log.warning("read replica %d ended (exit %s); starting it again", link.number,
                    proc.returncode)
    link.end()


def _child_env() -> dict[str, str]:
    """The environment of a replica: this one, with psoup importable as here."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# ---------------------------------------------------------------------- a replica's links


class Upstream:
    """One client connection's link to the primary, made at its first forwarded request:
    a connection of its own to the primary's Unix socket, with hello said, over which
    requests go in the order they are submitted and replies come back in that order
    (pipelined). O(frame) a request."""

    def __init__(self, path: str, token: str):
        self.path, self.token = path, token
        self._writer: asyncio.StreamWriter | None = None
        self._out: list[bytes] = []
        self._waiting: deque[tuple[Any, asyncio.Future[bytes]]] = deque()
        self._next = 0
        self._task: asyncio.Task[None] | None = None
        self.broken: BaseException | None = None

    def submit(self, request_id: Any, op: str, args: Any) -> asyncio.Future[bytes]:
        """Send a request (in submission order); a future of the primary's reply frame,
        carrying `request_id`. The future raises ConnectionError if the link breaks."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        if self.broken is not None:
            future.set_exception(ConnectionResetError(f"the primary: {self.broken}"))
            return future
        self._next += 1
        frame = pack_frame({"id": self._next, "op": op, "args": args})
        self._waiting.append((request_id, future))
        if self._writer is not None:
            self._writer.write(frame)
        else:
            self._out.append(frame)
            if self._task is None:
                self._task = asyncio.ensure_future(self._run())
        return future

    async def _run(self) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(self.path)
            writer.write(pack_frame({"id": 0, "op": OpName.HELLO.value, "args": {
                "token": self.token, "protocol": PROTOCOL}}))
            hello = unpack_payload(await _frame(reader))
            if not (isinstance(hello, Mapping) and hello.get("ok")):
                raise ConnectionRefusedError(f"the primary refused the hello: {hello!r}")
            for frame in self._out:
                writer.write(frame)
            self._out.clear()
            self._writer = writer
            while True:
                payload = await _frame(reader)
                request_id, future = self._waiting.popleft()
                reply = unpack_payload(payload)
                if isinstance(reply, dict):
                    reply["id"] = request_id
                if not future.done():
                    future.set_result(pack_frame(reply))
        except (OSError, EOFError, asyncio.IncompleteReadError, IndexError,
                PSoupError) as exc:
            self._fail(exc)
        except asyncio.CancelledError:
            self._fail(ConnectionResetError("closed"))
            raise

    def _fail(self, exc: BaseException) -> None:
        self.broken = exc
        while self._waiting:
            _, future = self._waiting.popleft()
            if not future.done():
                future.set_exception(ConnectionResetError(f"the primary: {exc}"))
        if self._writer is not None:
            self._writer.close()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        elif self._writer is not None:
            self._writer.close()


async def _frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return await reader.readexactly(size)


def forwards(primary: Container[str], op: Any, args: Any) -> bool:
    """Whether a replica sends request `op` to its primary: every write, the primary's
    reads, and the invocations of the handles in `primary` (those whose answers only
    the primary reads: psoup.server.replica_engine.ReplicaEngine.primary). O(1)."""
    spec = OPS.get(op) if isinstance(op, str) else None
    if spec is None:
        return False
    if spec.write or spec.name in _PRIMARY_READS:
        return True
    if spec.name is OpName.INVOKE and isinstance(args, Mapping):
        return args.get("handle") in primary
    return False
