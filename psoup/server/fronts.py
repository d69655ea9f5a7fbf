"""The engine process's side of its front processes (psoup.server.front).

Each front has a channel (a Unix socketpair) to the engine process, and a Unix socket
that the engine process passes accepted connections' sockets on. A connection a front
relays is served here by the same code as one the engine process accepted
itself (`Server._connection`), given a `Virtual`: the StreamReader it reads is fed
with the bytes the front relays, and writing to it sends bytes back through the front.
Everything the protocol does (hello, the token, limits, timeouts, pipelining, pieces,
refusals) is thus done as before; only the sockets are elsewhere.

A front that dies ends its connections as closed by their peers, and a new front is
started in its place while the server serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from itertools import islice
from typing import Any, TypeGuard

import msgpack
import numpy as np

from psoup.results.result import Result
from psoup.server.front import (
    ANSWER,
    ANSWER_HEAD,
    CLOSE,
    CLOSED,
    DATA,
    EOF,
    HOLD,
    MESSAGE,
    OPEN,
    PAUSE,
    READ,
    RESUME,
    SHUT,
    messages,
)

log = logging.getLogger("psoup.server")

#: A StreamReader's limit, as asyncio.start_server gives one (it pauses past twice it).
_READ_LIMIT = 1 << 16

#: The bytes a channel's sender may hold unsent before writers wait (asyncio's default
#: for a transport, 64 KiB, is three typical answers: the writers would wait at every
#: turn).
CHANNEL_BUFFER = 1 << 23

#: Answers queued for a front past which they leave at once, not at the end of the
#: loop's turn: the front encodes and sends the first answers of a burst of requests
#: while the engine answers the rest, instead of the two processes taking turns
#: (measured on 2 cores, 100 polling clients: 1 answer a write 9.4K invokes/s, 2
#: 10.9K, 4 10.3K, 8 7.9K, a whole turn's 7.8K-9K).
FLUSH_ANSWERS = 2

#: The wire dtype of each numpy kind that travels raw (as psoup.codec.encode_array has it).
_WIRE = {"i": np.dtype("<i8"), "u": np.dtype("<i8"), "f": np.dtype("<f8"), "b": np.dtype("|b1")}

#: How long after a front that ended within a second of its start another is started.
_RESTART_SECONDS = 1.0

#: How long a stopping server waits for a front to exit before it kills it.
_EXIT_SECONDS = 5.0

#: What serves one connection: `Server._connection(reader, writer)`.
Serve = Callable[[asyncio.StreamReader, Any], Coroutine[Any, Any, None]]
#: What answers the whole frames at the start of bytes a front relayed, while the
#: connection waits for its next request: `Server._take_frames(virtual, data)`, the
#: count of bytes it took (the rest goes to the connection's reader).
Take = Callable[["Virtual", bytes], int]


class Virtual:
    """A connection a front relays: the writer `Server._connection` writes to (the
    parts of asyncio.StreamWriter it uses) and the transport of its reader (which
    pauses and resumes reading when its buffer fills and empties)."""

    def __init__(self, channel: Channel, conn: int, peer: str):
        self.channel, self.conn, self.peer = channel, conn, peer
        self.reader = asyncio.StreamReader(limit=_READ_LIMIT)
        self.reader.set_transport(self)     # type: ignore[arg-type]  # pause/resume_reading
        self.closed = False
        self.full = False                   # the front's socket send buffer is full
        self._room: asyncio.Future[None] | None = None
        # the connection's conversation (psoup.server.server), once it has one: while
        # it waits for a request with nothing buffered, whole requests are taken at once
        self.conv: Any = None

    # -- the writer

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self.closed:
            self.channel.send(DATA, self.conn, bytes(data))

    def write_answer(self, request_id: int, answer: Result) -> None:
        """Write the reply carrying `answer` (`relayable`), which the front encodes."""
        if not self.closed:
            self.channel.send_answer(self.conn, request_id, answer)

    async def drain(self) -> None:
        while True:
            if self.closed:
                raise ConnectionResetError("connection lost")
            if not self.full and not self.channel.full:
                return
            if self._room is None or self._room.done():
                self._room = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._room)

    def can_write_eof(self) -> bool:
        return not self.closed

    def write_eof(self) -> None:
        self._tell(EOF)

    def close(self) -> None:
        if not self.closed:
            self._tell(CLOSE)
            self.lost()

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    # -- the reader's transport

    def pause_reading(self) -> None:
        self._tell(HOLD)

    def resume_reading(self) -> None:
        self._tell(READ)

    def _tell(self, kind: int) -> None:
        """Send the front a message of `kind` without a body for this connection,
        unless it is gone."""
        if not self.closed:
            self.channel.send(kind, self.conn, b"")

    # -- what the front says

    def lost(self) -> None:
        """The connection is gone: what is written is dropped, a drain raises, and the
        reader ends (as when a peer closes)."""
        self.closed = True
        self.channel.conns.pop(self.conn, None)
        self.reader.feed_eof()
        self.room()

    def room(self) -> None:
        if self._room is not None and not self._room.done():
            self._room.set_result(None)


#: Most buffers one sendmsg call takes (Linux's IOV_MAX).
_IOV = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class _Sender:
    """Writes a channel's bytes to its socket without asyncio's transport buffer: the
    parts the socket takes at once are sent from where they lie (sendmsg, no copy); the
    rest waits as chunks in a deque, sent when the socket has room. asyncio's transport
    (Python 3.11) keeps what waits in one bytearray and deletes each sent prefix from
    it, moving all the rest: with a front's answers queued behind each other (2.7 MB on
    average at 100 polling clients) every send moved megabytes on the engine's core.

    `full(True)` is called once more than `high` bytes wait, `full(False)` once at
    most a quarter of it does (a transport's pause_writing and resume_writing).

    Costs: `send` O(its bytes) once for what must wait (one copy), O(parts) for what
    the socket takes; each time the socket has room, O(chunks sent).
    """

    def __init__(self, sock: socket.socket, high: int, full: Callable[[bool], None]):
        # its own descriptor of the socket: the event loop allows no writer on the
        # transport's, and this one is watched only while chunks wait
        self.sock = socket.socket(fileno=os.dup(sock.fileno()))
        self.sock.setblocking(False)
        self.high, self.full = high, full
        self.waiting: deque[memoryview] = deque()
        self.bytes = 0
        self.paused = False
        self.closed = False
        self.then_close: Callable[[], None] | None = None

    def send(self, parts: Sequence[bytes | memoryview]) -> None:
        """Send `parts` in order, after whatever waits."""
        if self.closed:
            return
        if not self.waiting:
            try:
                sent = self.sock.sendmsg(parts[:_IOV])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.close()            # the front is gone: its channel says so too
                return
            parts = _unsent(parts, sent)
            if not parts:
                return
            asyncio.get_running_loop().add_writer(self.sock.fileno(), self._room)
        chunk = memoryview(b"".join(parts))
        self.waiting.append(chunk)
        self.bytes += len(chunk)
        if self.bytes > self.high and not self.paused:
            self.paused = True
            self.full(True)

    def _room(self) -> None:
        """The socket has room: send what waits, as much as it takes."""
        waiting = self.waiting
        while waiting:
            try:
                sent = self.sock.sendmsg(list(islice(waiting, _IOV)))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.close()
                return
            self.bytes -= sent
            while sent:
                head = waiting[0]
                if len(head) > sent:
                    waiting[0] = head[sent:]
                    break
                sent -= len(head)
                waiting.popleft()
            if self.paused and self.bytes <= self.high // 4:
                self.paused = False
                self.full(False)
        asyncio.get_running_loop().remove_writer(self.sock.fileno())
        if self.then_close is not None:
            self.close()

    def close_after(self, then: Callable[[], None]) -> None:
        """Close once what waits is sent (at once if nothing does), then call `then`."""
        self.then_close = then
        if not self.waiting:
            self.close()

    def close(self) -> None:
        """Drop what waits and close this descriptor; `then` of `close_after`, if any."""
        if self.closed:
            return
        self.closed = True
        if self.waiting:
            with contextlib.suppress(RuntimeError):     # (a loop already closed)
                asyncio.get_running_loop().remove_writer(self.sock.fileno())
        self.waiting.clear()
        self.bytes = 0
        self.sock.close()
        then, self.then_close = self.then_close, None
        if then is not None:
            then()


def _unsent(parts: Sequence[bytes | memoryview], sent: int) -> list[bytes | memoryview]:
    """What of `parts` a send of `sent` bytes left, the first part cut where it
    stopped. O(parts)."""
    for k, part in enumerate(parts):
        size = len(part)
        if sent < size:
            rest = list(parts[k:])
            if sent:
                rest[0] = memoryview(part)[sent:]
            return rest
        sent -= size
    return []


class Channel(asyncio.Protocol):
    """The engine process's end of one front's channel: it reads through its asyncio
    transport and writes through a `_Sender`."""

    def __init__(self, serve: Serve, take: Take, on_lost: Callable[[Channel], None]):
        self.serve, self.take, self.on_lost = serve, take, on_lost
        self.conns: dict[int, Virtual] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.buf = bytearray()
        self.out: list[bytes | memoryview] = []
        self.transport: asyncio.Transport | None = None
        self.sender: _Sender | None = None
        self.full = False
        self.answers = 0            # ANSWER messages in `out`

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sender = _Sender(transport.get_extra_info("socket"), CHANNEL_BUFFER,
                              self._full)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        for kind, conn, payload in messages(self.buf):
            if kind == DATA:
                virtual = self.conns.get(conn)
                if virtual is not None:
                    self._data(virtual, payload)
                    if self.answers >= FLUSH_ANSWERS:
                        self.flush()
            elif kind == OPEN:
                self._open(conn, payload.decode())
            else:
                self._event(kind, conn)

    def _data(self, virtual: Virtual, data: bytes) -> None:
        conv, reader = virtual.conv, virtual.reader
        # CPython's StreamReader keeps what it holds in _buffer; without it, no shortcut
        buffered = getattr(reader, "_buffer", None)
        if (conv is not None and conv.waiting and not self.full and not virtual.full
                and buffered is not None and not buffered):
            taken = self.take(virtual, data)
            if taken:
                data = data[taken:]
        if data:
            reader.feed_data(data)

    def _open(self, conn: int, peer: str) -> None:
        virtual = Virtual(self, conn, peer)
        self.conns[conn] = virtual
        task = asyncio.ensure_future(self.serve(virtual.reader, virtual))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _event(self, kind: int, conn: int) -> None:
        virtual = self.conns.get(conn)
        if virtual is None:
            return
        if kind == SHUT:
            virtual.reader.feed_eof()
        elif kind == CLOSED:
            virtual.lost()
        elif kind == PAUSE:
            virtual.full = True
        elif kind == RESUME:
            virtual.full = False
            virtual.room()

    def send(self, kind: int, conn: int, body: bytes) -> None:
        """Queue a message to the front; those queued in one turn of the loop leave in
        one write."""
        if not self.out:
            asyncio.get_running_loop().call_soon(self.flush)
        self.out.append(MESSAGE.pack(kind, conn, len(body)))
        if body:
            self.out.append(body)

    def send_answer(self, conn: int, request_id: int, answer: Result) -> None:
        """Send an answer that `relayable` accepted for the front to encode: its arrays
        as raw bytes, not copied until the flush joins them."""
        arrays = [np.ascontiguousarray(v, dtype=_WIRE[v.dtype.kind]) for v in answer.values or ()]
        ts = np.ascontiguousarray(answer.ts, dtype=np.float64)
        tuple_ids = np.ascontiguousarray(answer.tuple_ids, dtype=np.int64)
        head = msgpack.packb([request_id, answer.columns, answer.cursor,
                              [a.dtype.str for a in arrays], [a.nbytes for a in arrays],
                              len(ts), answer.fresh_to], use_bin_type=True)
        parts = [ANSWER_HEAD.pack(len(head)), head, *(a.data.cast("B") for a in arrays),
                 ts.data.cast("B"), tuple_ids.data.cast("B")]
        if not self.out:
            asyncio.get_running_loop().call_soon(self.flush)
        self.out.append(MESSAGE.pack(ANSWER, conn, sum(map(len, parts))))
        self.out.extend(parts)
        self.answers += 1

    def flush(self) -> None:
        if self.out and self.sender is not None:
            self.sender.send(self.out)
        self.out = []
        self.answers = 0

    def _full(self, full: bool) -> None:
        """More than CHANNEL_BUFFER bytes wait for the front (writers wait), or a
        quarter of it at most does again."""
        self.full = full
        if not full:
            for virtual in list(self.conns.values()):
                virtual.room()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.sender is not None:
            self.sender.close()
        for virtual in list(self.conns.values()):
            virtual.lost()
        self.on_lost(self)

    def close(self) -> None:
        """Close the channel once what waits for the front is sent (its last replies)."""
        transport, sender = self.transport, self.sender
        if transport is not None and sender is not None:    # (made together)
            self.flush()
            sender.close_after(transport.close)


class _Front:
    """One front process: its channel, the socket its connections' sockets are passed
    on, and the process."""

    def __init__(self, channel: Channel, sockets: socket.socket,
                 proc: subprocess.Popen[bytes]):
        self.channel, self.sockets, self.proc = channel, sockets, proc
        self.started = time.monotonic()


class Fronts:
    """The front processes of a server; one that dies is replaced while `serving`."""

    def __init__(self, count: int, serve: Serve, take: Take):
        self.count, self.serve, self.take = count, serve, take
        self.fronts: dict[Channel, _Front] = {}
        self.serving = False
        self._turn = 0

    async def start(self) -> None:
        self.serving = True
        for _ in range(self.count):
            await self._start_one()

    async def _start_one(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        passing, passed = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            fds = (passed.fileno(), theirs.fileno())
            proc = subprocess.Popen([sys.executable, "-m", "psoup.server.front",
                                     *map(str, fds)], pass_fds=fds, env=_environment())
        except BaseException:
            mine.close()
            passing.close()
            raise
        finally:
            theirs.close()
            passed.close()
        mine.setblocking(False)
        _, channel = await asyncio.get_running_loop().create_unix_connection(
            lambda: Channel(self.serve, self.take, self._lost), sock=mine)
        self.fronts[channel] = _Front(channel, passing, proc)

    def pass_socket(self, conn: socket.socket) -> bool:
        """Hand an accepted connection to a front, in turn (True), and close it here;
        False when no front takes it (none is running), the socket left open."""
        fronts = [front for front in self.fronts.values() if front.channel.transport]
        while fronts:
            self._turn += 1
            front = fronts[self._turn % len(fronts)]
            try:
                socket.send_fds(front.sockets, [b"s"], [conn.fileno()])
            except OSError:
                fronts.remove(front)
                continue
            conn.close()
            return True
        return False

    def _lost(self, channel: Channel) -> None:
        front = self.fronts.pop(channel, None)
        if front is None:
            return
        front.sockets.close()
        if self.serving:
            log.warning("front process %d ended (exit %s); starting another", front.proc.pid,
                        front.proc.poll())
            # one that failed at once (say, it could not start) is not restarted in a loop
            wait = _RESTART_SECONDS if time.monotonic() - front.started < 1.0 else 0.0
            asyncio.get_running_loop().call_later(wait, self._restart)

    def _restart(self) -> None:
        if self.serving:
            asyncio.ensure_future(self._start_one())

    def procs(self) -> list[subprocess.Popen[bytes]]:
        return [front.proc for front in self.fronts.values()]

    async def stop(self) -> None:
        """Close every channel (the fronts exit) and wait for the processes."""
        self.serving = False
        fronts = list(self.fronts.values())
        for front in fronts:
            front.channel.close()
            front.sockets.close()
        loop = asyncio.get_running_loop()
        for front in fronts:
            try:
                await loop.run_in_executor(None, front.proc.wait, _EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                front.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await loop.run_in_executor(None, front.proc.wait, _EXIT_SECONDS)
        self.fronts.clear()


def relayable(answer: Any) -> TypeGuard[Result]:
    """Whether a front may encode `answer` (Channel.send_answer): a Result, exact, of
    numeric columns, one tupleID a row, no group keys; anything else is encoded by
    the engine process."""
    return relay_bytes(answer) >= 0


def relay_bytes(answer: Any) -> int:
    """The bytes of `answer` on the wire, at most, if it is `relayable`; else -1. One
    pass over its columns' types (every relayed invocation asks: `answer_bytes`'
    general estimate cost as much as the rest of the check)."""
    if type(answer) is not Result or answer.keys is not None or not answer.exact:
        return -1
    values = answer.values
    if values is None:
        return -1
    for v in values:
        if not isinstance(v, np.ndarray) or v.dtype.kind not in _WIRE:
            return -1
    if np.ndim(answer.tuple_ids) != 1:
        return -1
    return len(answer) * 8 * (2 + len(values) + len(answer.error))


def _environment() -> dict[str, str]:
    """The front's environment: this process's, with psoup importable as it is here."""
    import psoup
    root = os.path.dirname(os.path.dirname(os.path.abspath(psoup.__file__)))
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = root if not path else f"{root}{os.pathsep}{path}"
    return env
