"""The psoup service's transport: one Engine behind the TCP protocol of docs/protocol.md.

Disconnected clients are the point of PSoup (Sect. 1): a client registers a query, goes
away, and invokes the handle later from another connection. The server only translates
between frames and the Engine API (it never reaches into the SteMs).

Concurrency: one asyncio loop owns the sockets. Every mutating request (create_stream,
execute, insert, register, unregister) goes through one queue to one writer thread, which
applies a group of queued writes one by one and then calls `Engine.commit()` once before
replying to any of them (group commit: one fsync per group, and no reply before its
change is on disk). A registration (register, or execute of a SELECT) first scans the
retained rows on a registration thread (Engine.prepare_register: the engine lock held
only to copy the stream), after its connection's earlier writes are applied; then only
its short end (checked again, logged, applied with the rows that arrived meanwhile:
Engine.finish_register) goes through the writer's queue, so the inserts of other
clients are applied while it scans, and its connection's later writes join the queue
after it. A read (invoke, queries, stats, ping) runs on the event loop itself
when the engine lock is free and nobody waits for it: a thread hop costs more than a
typical invocation (profiled under 100 polling clients, over half of the server's
active time was that plumbing). An invocation that finds the lock taken goes to a read
thread of its own: the engine holds its lock for the invocation's short first step
only (psoup.results.reads), so invocations run beside the writer and each other, each
on the snapshot of its cut. Any other read that finds the lock taken is parked; one read
thread takes the lock in turn and answers every parked read under that one hold (one
hop for all of them, at most BATCH_SECONDS before a waiting write). A read that took
over INLINE_SECONDS of CPU runs on a read thread of its own for a second, so large
answers do not stall the loop. The read threads are as many as the engine's threads
(`--threads`, by default the cores). Each invocation sees the engine between two
writes, never half of a batch. Replies to one connection that are ready together leave
in one write.

An answer larger than Limits.piece_bytes is not encoded where it was read: the
connection's sender encodes it on the encoding thread, outside the engine lock, a piece
at a time (to a client that takes pieces; else whole), writing each piece before the
next is encoded, so the loop serves other connections between pieces.

With `fronts` (`psoup serve --fronts N`), this process accepts the
connections and passes their sockets (DIRECT_CONNECTIONS of them excepted) to front
processes that relay their bytes (psoup.server.front, psoup.server.fronts):
each is served here as one held here, and the whole requests of one that waits for
its next request are answered as they arrive (`_take_frames`), without a turn of its
coroutine each; an answer of numeric columns written at once goes to the front raw,
which encodes it (`_Relayed`).

What each operation takes and does is in psoup.server.ops; this module moves frames,
authenticates, pipelines, and groups commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Container, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, overload

import msgpack

from psoup.config import DEFAULT_HOST, DEFAULT_PORT, token_path, write_private
from psoup.engine import DEFAULT_ANSWER_CACHE, Engine
from psoup.errors import CursorExpired, PSoupError
from psoup.options import ModeName, SyncName
from psoup.results.result import Changes, Result
from psoup.server.allocator import keep_freed_memory
from psoup.server.fronts import Fronts, Virtual, relay_bytes
from psoup.server.ops import OPS, Limits, Op, OpName, plain
from psoup.server.protocol import (
    HEADER,
    PROTOCOL,
    ErrorCode,
    ProtocolError,
    answer_bytes,
    answer_pieces,
    encode_answer,
    error_fields,
    error_reply,
    ok_reply,
    pack_frame,
    request,
    unpack_payload,
)
from psoup.server.replica import Replicas, Upstream, forwards
from psoup.version import __version__

log = logging.getLogger("psoup.server")

#: How long a refused connection's input is read and dropped before the socket closes.
_LINGER_SECONDS = 1.0

#: Addresses that listen on every interface; local clients reach them as 127.0.0.1.
_WILDCARDS = ("", "0.0.0.0", "::")

#: A read that took more CPU seconds than this runs on the read pool (a thread of its
#: own) for a second, so that it does not hold up the event loop or a batch of reads.
INLINE_SECONDS = 0.005
_POOLED_SECONDS = 1.0

#: How long a batch of parked reads may hold the engine lock before a waiting write.
BATCH_SECONDS = 0.005

#: With more than one thread (`--threads`), how long a read on the event loop waits in
#: turn for the engine lock before it is handed to a read thread or parked. The writer
#: then runs on another core, and a read handed over costs GIL handoffs between cores
#: that also stretch the writer's hold of the lock (measured under 100 polling
#: clients and a producer: 30% of the invocations handed over instead of 1% on one
#: core, and 0.6-0.75x the invocations of one core); a small write is over sooner.
LOCK_WAIT_SECONDS = 0.002

#: Front processes of a server with more than one thread, unless told (`run_server`):
#: the engine's process answers at most what one core does, so one front relieves it
#: of the sockets' work and of encoding, and more add processes, not answers. Measured
#: on 2 cores, 100 polling clients and a producer: 1.16-1.38x the invokes/s of none.
DEFAULT_FRONTS = 1

#: With front processes, how many connections at a time the server's process still
#: serves itself (and all of them while no front runs). A relay adds tens of
#: microseconds to a round trip, which a lone client sees; but a connection served
#: here costs this process about 1.3x the CPU of a relayed one a request, and, its
#: round trips being shorter, takes more than its share: with 4 of 100 polling
#: connections served here, they took a third of this process's time and the server
#: answered 0.75-0.95x the invocations it did with none (measured, bench/scale_cores.py).
DIRECT_CONNECTIONS = 0

#: Threads that scan registrations over a large store: two, so that a small registration
#: does not wait behind one long scan (and a third scan waits rather than taking more
#: memory for its copy and matches).
REGISTER_THREADS = 2

_R = TypeVar("_R")


class _Large:
    """The reply to request `request_id` whose `answer` is too large for one frame of
    Limits.piece_bytes: the connection's sender encodes and sends it, in pieces to a
    client that takes them (`frames`), else in one frame (`whole`), on the encoding
    thread."""

    def __init__(self, request_id: Any, answer: Result | Changes):
        self.request_id = request_id
        self.answer = answer

    def whole(self) -> bytes:
        """The answer in one frame (a client that did not ask for pieces)."""
        return _encoded_reply(self.request_id, lambda: pack_frame(ok_reply(
            self.request_id, encode_answer(self.answer))))

    def frames(self, piece_bytes: int) -> Iterator[bytes]:
        """The answer's frames, each encoded when asked for: every piece but the last
        marked `"more": true`. A piece that cannot be encoded ends the reply with an
        error frame of the same id (the client drops the pieces before it)."""
        pieces = _encoded_reply(self.request_id, partial(answer_pieces, self.answer,
                                                          piece_bytes))
        if isinstance(pieces, bytes):       # the error reply: nothing to cut
            yield pieces
            return
        last = len(pieces) - 1
        for i, piece in enumerate(pieces):
            frame = _encoded_reply(self.request_id, partial(self._piece, piece, i < last))
            yield frame
            if not _is_ok(frame):
                return

    def _piece(self, piece: Callable[[], dict[str, Any]], more: bool) -> bytes:
        reply = ok_reply(self.request_id, piece())
        if more:
            reply["more"] = True
        return pack_frame(reply)


class _Relayed:
    """The reply to request `request_id` (an int) whose `answer` a front encodes: an
    answer `relayable` accepts, its cursor issued; only ever written at once, never
    queued (`_take_frames`)."""

    __slots__ = ("request_id", "answer")

    def __init__(self, request_id: int, answer: Result):
        self.request_id, self.answer = request_id, answer


#: A reply as a connection's sender takes it: a frame, or a large answer to encode.
_Reply = bytes | _Large
#: A write queued for the writer thread: its call, the future of its outcome (ok, value
#: or exception), and its bytes in the ingest queue.
_Write = tuple[Callable[[], Any], asyncio.Future[tuple[bool, Any]], int]
#: A write's turn to join the writer's queue (`_turn`): the future of the connection's
#: write before it joining it (None: it has), and its own.
_Turn = tuple[asyncio.Future[None] | None, asyncio.Future[None]]
#: What a batch of parked reads gives back: (reply future, reply, read key, CPU seconds).
_Batch = list[tuple[asyncio.Future[_Reply], _Reply, tuple[str, Any], float]]


class _Conversation:
    """One connection's pipeline: replies leave in request order; `last_write` is the
    dispatch of its last write, which later reads wait for; `chain_ok` (touched only by
    the writer thread) says whether this connection's last write succeeded, so the later
    batches of a rejected multi-batch insert are skipped, not applied."""

    def __init__(self, limit: int):
        # None: the last reply was queued, the sender stops
        self.replies: asyncio.Queue[asyncio.Future[_Reply] | None] = asyncio.Queue(limit)
        self.sender: asyncio.Task[None] | None = None
        self.last_write: asyncio.Future[_Reply] | None = None
        # set once its last write that keeps its turn by hand joined the writer's queue
        self.queued: asyncio.Future[None] | None = None
        self.pieces = False     # its hello said it takes a large answer in pieces
        self.chain_ok = True
        # its last insert was refused "busy": the ones it chained after it are refused
        # too, until one that does not chain (set and read on the event loop)
        self.refused = False
        self.hello_by = 0.0     # time.monotonic() by which the hello must have arrived
        # on a read replica: its link to the primary, made at its first forwarded request
        self.upstream: Upstream | None = None
        self.writer: Any = None
        # the sender waits for a reply and holds none: a ready reply may be written at once
        self.idle = False
        # through its hello; waiting for its next request (both for _take_frames)
        self.authenticated = False
        self.waiting = False

    def owes_nothing(self) -> bool:
        """Whether every reply to an earlier request has been written (so the next one
        may be written now, in order)."""
        return self.idle and self.replies.empty()

    async def finish(self, timeout: float) -> None:
        """Send every reply still owed, then stop the sender; give up after `timeout`
        seconds (a peer that pipelines requests and never reads the replies)."""
        sender = self.sender
        if sender is None or sender.done():
            return
        try:
            await asyncio.wait_for(self._last(sender), timeout)
        except (ConnectionError, OSError, asyncio.TimeoutError):
            sender.cancel()

    async def _last(self, sender: asyncio.Task[None]) -> None:
        await self.replies.put(None)
        await sender


@dataclass
class _Listening:
    """What a serving server listens with (`Server._listen`), ended when it stops."""

    listener: asyncio.AbstractServer | None = None
    sockets: list[socket.socket] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    upstream_dir: str | None = None


class Server:
    """Serve one Engine over TCP.

    Args:
        engine: the engine to serve; the server does not close it.
        host: the address to listen on.
        port: the port; 0 picks a free one (see `address` once started).
        token: the access token every connection's hello must carry.
        limits: request and connection limits.
        fronts: front processes that accept the connections and do their socket work
            on other cores (psoup.server.front); 0: this process does it all.
        replicas: read replica processes that each hold a copy of the state and answer
            the reads of the connections passed to them (psoup.server.replica); 0: none.
        handoff, upstream: a read replica's own server (psoup.server.replica_engine.main): the
            socket its primary passes connections on, instead of listening, and the
            Unix socket path of the primary, where it sends its clients' writes.

    Example:
        >>> from psoup.client import Client
        >>> server = Server(Engine(), port=0, token="secret")
        >>> host, port = server.start_in_thread()
        >>> with Client(f"{host}:{port}", token="secret") as client:
        ...     client.ping()
        'pong'
        >>> server.stop()
    """

    def __init__(self, engine: Engine, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
                 token: str, limits: Limits | None = None, fronts: int = 0,
                 replicas: int = 0, handoff: socket.socket | None = None,
                 upstream: str | None = None):
        if not isinstance(token, str) or not token:
            raise ValueError("the server needs a non-empty access token")
        self.engine = engine
        # every answer goes out with its ts and tupleIDs: take them in the find's pass
        engine._core.answers.defer_identity = False
        self.host = host
        self.port = port
        self.limits = limits or Limits()
        self.server_id = secrets.token_hex(8)
        #: a read replica's number, said in its hello (None: not a replica)
        self.replica: int | None = None
        self.address: tuple[str, int] | None = None
        self._token = token.encode()
        if not isinstance(fronts, int) or fronts < 0:
            raise ValueError(f"fronts must be a count of processes >= 0, not {fronts!r}")
        self.fronts = fronts
        self._fronts: Fronts | None = None
        if not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas must be a count of processes >= 0, not {replicas!r}")
        self.replicas = replicas
        self._replicas: Replicas | None = None
        self._handoff = handoff
        self._upstream = upstream
        # a replica's handles whose invocations its primary answers (the engine's own
        # set, which its feed changes: psoup.server.replica_engine.ReplicaEngine.primary)
        self._primary_handles: Container[str] = getattr(engine, "primary", frozenset())
        self._token_text = token
        self._direct = 0                # connections served here though there are fronts
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[asyncio.Task[Any]] = set()    # authenticated
        # not yet through their hello, oldest first (a dict keeps the order)
        self._pending: dict[asyncio.Task[Any], None] = {}
        self._writes: asyncio.Queue[_Write] | None = None
        self._read_pool: ThreadPoolExecutor | None = None
        self._write_pool: ThreadPoolExecutor | None = None
        # encodes large answers, a piece at a time (_Large), outside the engine lock
        self._encode_pool: ThreadPoolExecutor | None = None
        # scans registrations over a large store (Engine.prepare_register), so that
        # the writer thread only ends them (Engine.finish_register)
        self._register_pool: ThreadPoolExecutor | None = None
        # reads that took over INLINE_SECONDS: (op, handle) -> run them on the pool
        # until this perf_counter time
        self._pooled: dict[tuple[str, Any], float] = {}
        # reads waiting for the engine lock, answered together by one read thread (a
        # deque: the loop appends while that thread takes from the front)
        self._parked: deque[tuple[Any, Op, Mapping[str, Any], tuple[str, Any],
                                  asyncio.Future[_Reply]]] = deque()
        self._batching = False
        # reads on the loop wait for the engine lock (LOCK_WAIT_SECONDS) with more than
        # one thread; not again once a wait ran out, until the loop finds the lock free
        self._lock_wait = engine.threads > 1
        self._waited_out = False
        self.requests = 0                # answered or refused since start, for the log
        # the ingest queue: inserts received and not yet applied (bytes, and when each
        # was queued, oldest first: writes apply in order), the most it held, the busy
        # replies sent, and the writer's rate (bytes a second, smoothed) for retry_after
        self._queued_bytes = 0
        self._queued_at: dict[int, float] = {}     # insert's token -> when it was queued
        self._queued_token = 0
        self._queued_peak = 0
        self._busy_replies = 0
        self._apply_rate = 64e6
        # the factor limit is the compiler's: the engine refuses longer WHERE clauses
        if (engine.limits.max_factors is None
                or engine.limits.max_factors > self.limits.max_factors):
            engine.limits.max_factors = self.limits.max_factors
        for name in ("max_queries", "max_stream_bytes", "max_results_bytes"):
            if getattr(self.limits, name) is not None:
                setattr(engine.limits, name, getattr(self.limits, name))

    # ------------------------------------------------------------------ lifecycle

    async def serve_forever(self) -> None:
        """Listen and serve on the running loop until `stop()` (or cancellation)."""
        await self._serve(lambda: None)

    def start_in_thread(self) -> tuple[str, int]:
        """Serve on a new event loop in a daemon thread; returns the bound (host, port)
        once the socket listens. Raises what binding raised (e.g. OSError: in use)."""
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self._serve(started.set))
            except BaseException as exc:  # reported to the starter, or logged if later
                if started.is_set():
                    log.exception("psoup server stopped on an error")
                failure.append(exc)
                started.set()

        thread = threading.Thread(target=run, name="psoup-server", daemon=True)
        thread.start()
        started.wait()
        if failure:
            thread.join()
            raise failure[0]
        self._thread = thread
        assert self.address is not None
        return self.address

    def stop(self) -> None:
        """Stop listening, close every connection, and wait until no engine call of this
        server is running. Idempotent; callable from any thread."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):     # the loop already closed
                loop.call_soon_threadsafe(stopping.set)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
            self._thread = None

    async def _serve(self, on_start: Callable[[], None]) -> None:
        if self._loop is not None:
            raise RuntimeError("this server is already serving")
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._writes = asyncio.Queue()
        self._read_pool = ThreadPoolExecutor(self._read_threads(),
                                             thread_name_prefix="psoup-read")
        self._write_pool = ThreadPoolExecutor(1, thread_name_prefix="psoup-write")
        self._encode_pool = ThreadPoolExecutor(1, thread_name_prefix="psoup-encode")
        self._register_pool = ThreadPoolExecutor(REGISTER_THREADS,
                                                 thread_name_prefix="psoup-register")
        writer_task = None
        where = _Listening()
        try:
            await self._listen(where)
            writer_task = asyncio.create_task(self._write_loop())
            on_start()
            await self._stopping.wait()
        finally:
            if where.listener is not None:
                where.listener.close()
            if self._fronts is not None:
                self._fronts.serving = False        # no front is started again
            for accepter in where.tasks:
                accepter.cancel()
            tasks = [*self._connections, *self._pending] + ([writer_task] if writer_task
                                                             else [])
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if where.listener is not None:
                await where.listener.wait_closed()
            await self._stop_processes(where)
            # wait=True: no engine call of this server outlives stop(), so the caller
            # may close the engine right after.
            self._read_pool.shutdown(wait=True, cancel_futures=True)
            self._write_pool.shutdown(wait=True, cancel_futures=True)
            self._encode_pool.shutdown(wait=True, cancel_futures=True)
            self._register_pool.shutdown(wait=True, cancel_futures=True)
            self._loop = None

    async def _listen(self, where: _Listening) -> None:
        """Start taking connections, filling `where` with what `_serve` ends: listen
        (or, on a replica, take the connections its primary passes), start the fronts
        and the replicas, and the primary's Unix socket for its replicas' writes."""
        if self._handoff is not None:
            self.address = ("replica", 0)
            where.tasks.append(asyncio.create_task(self._accept_handed(self._handoff)))
            return
        if not (self.fronts or self.replicas):
            where.listener = await asyncio.start_server(self._connection, self.host,
                                                        self.port)
            self.address = tuple(where.listener.sockets[0].getsockname()[:2])
            return
        where.sockets = _listening(self.host, self.port)
        self.address = tuple(where.sockets[0].getsockname()[:2])
        if self.fronts:
            self._fronts = Fronts(self.fronts, self._connection, self._take_frames)
            await self._fronts.start()
        if self.replicas:
            where.upstream_dir = tempfile.mkdtemp(prefix="psoup-primary-")
            path = str(Path(where.upstream_dir) / "primary.sock")
            where.listener = await asyncio.start_unix_server(self._connection, path)
            self._replicas = Replicas(self.engine, self.replicas, self._token_text,
                                      self.limits, path, self.server_id)
            # they start from a snapshot while this serves; each takes connections
            # once it is ready
            where.tasks.append(asyncio.create_task(self._replicas.start()))
        where.tasks += [asyncio.create_task(self._accept(sock)) for sock in where.sockets]

    async def _stop_processes(self, where: _Listening) -> None:
        """End the fronts and the replicas, and close what `_listen` opened."""
        if self._fronts is not None:
            await self._fronts.stop()
            self._fronts = None
        if self._replicas is not None:
            await self._replicas.stop()
            self._replicas = None
        if where.upstream_dir is not None:
            shutil.rmtree(where.upstream_dir, ignore_errors=True)
        for sock in where.sockets:
            sock.close()

    async def _accept(self, listening: socket.socket) -> None:
        """With fronts: accept every connection and pass it to a front, unless
        DIRECT_CONNECTIONS are not yet open here or no front takes it: then serve it
        here."""
        loop = asyncio.get_running_loop()
        listening.setblocking(False)
        fronts, replicas = self._fronts, self._replicas
        while True:
            try:
                conn, _ = await loop.sock_accept(listening)
            except OSError as exc:          # out of file descriptors, say: the next one
                log.warning("accepting a connection failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            if replicas is not None and replicas.pass_socket(conn):
                continue
            if (fronts is not None and self._direct >= DIRECT_CONNECTIONS
                    and fronts.pass_socket(conn)):
                continue
            self._direct += 1
            asyncio.ensure_future(self._serve_direct(conn))

    async def _accept_handed(self, handoff: socket.socket) -> None:
        """A read replica's accepting: serve each connection its primary passes on
        `handoff` (SCM_RIGHTS); the primary closing it stops the server."""
        loop = asyncio.get_running_loop()
        handoff.setblocking(False)
        while True:
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(handoff.fileno(), _settle, readable)
            try:
                await readable
            finally:
                loop.remove_reader(handoff.fileno())
            try:
                _, fds, _, _ = socket.recv_fds(handoff, 64, 64)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                fds = []
            if not fds:
                self.stop()
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                conn.setblocking(False)
                asyncio.ensure_future(self._serve_direct(conn))

    async def _serve_direct(self, conn: socket.socket) -> None:
        """Serve an accepted connection here, as asyncio.start_server would have."""
        try:
            reader, writer = await asyncio.open_connection(sock=conn)
            await self._connection(reader, writer)
        except OSError as exc:
            log.info("a connection failed as it opened: %s", exc)
            conn.close()
        finally:
            self._direct -= 1

    def _read_threads(self) -> int:
        """The read pool's threads: the engine's (`--threads`, by default one per core),
        at least 2: one may wait for the lock while another reads."""
        return max(2, self.engine.threads)

    # ------------------------------------------------------------------ connections

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        peer = _peer_text(writer.get_extra_info("peername"))
        task = asyncio.current_task()
        assert task is not None, "asyncio runs each connection's callback in its own task"
        try:
            if len(self._pending) >= self.limits.max_unauthenticated:
                # the oldest silent connection makes room: a flood of them cannot keep a
                # client out, whose hello arrives long before theirs would time out
                oldest = next(iter(self._pending))
                del self._pending[oldest]
                oldest.cancel()
                log.warning("%s: %d connections waiting for their hello; closed the oldest",
                            peer, self.limits.max_unauthenticated)
            self._pending[task] = None
            await self._converse(reader, writer, peer)
        except (ConnectionError, OSError) as exc:
            log.info("%s: connection lost (%s)", peer, exc)
        except asyncio.CancelledError:
            # stop() cancels; ending normally keeps asyncio's stream callback (which
            # asks the task for its exception) from reporting the cancellation as an error.
            pass
        finally:
            self._pending.pop(task, None)
            self._connections.discard(task)
            writer.close()

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        peer: Any) -> None:
        # Requests are read while earlier ones are still being applied (a client may
        # pipeline them): the next batch's bytes arrive and decode while the writer
        # thread applies the previous one. Replies go out in request order.
        conv = _Conversation(self.limits.max_in_flight)
        conv.hello_by = time.monotonic() + self.limits.hello_timeout
        conv.sender = asyncio.create_task(self._send_replies(writer, conv))
        conv.writer = writer
        if isinstance(writer, Virtual):
            writer.conv = conv
        authenticated = False
        cancelled = False
        try:
            while not conv.sender.done():
                payload = await self._read_frame(reader, writer, peer, authenticated, conv)
                if payload is None:
                    return
                began = time.perf_counter()
                self.requests += 1
                try:
                    request_id, op, args = request(payload)
                except ProtocolError as exc:
                    await self._refuse(reader, writer, peer, None, exc.code, str(exc), conv)
                    return
                if op == OpName.HELLO or not authenticated:
                    authenticated = await self._greet(reader, writer, peer, request_id, op,
                                                      args, began, conv)
                    if not authenticated:
                        return
                    conv.authenticated = True
                    continue
                reply = self._take(request_id, op, args, len(payload), conv, peer, began)
                if isinstance(reply, asyncio.Future):
                    await conv.replies.put(reply)
                elif isinstance(reply, bytes) and conv.owes_nothing():
                    writer.write(reply)
                    await writer.drain()
                else:
                    await conv.replies.put(_ready(reply))
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            if cancelled or conv.sender.done():
                conv.sender.cancel()
            else:
                await conv.finish(self.limits.read_timeout)
            if conv.upstream is not None:
                conv.upstream.close()

    def _take_frames(self, virtual: Virtual, data: bytes) -> int:
        """Take the whole requests at the start of `data`, bytes a front relayed for a
        connection that waits for its next request with nothing buffered, as `_converse`
        would, without a turn of its coroutine per request: the count of bytes taken.
        What it leaves (a part of a frame, a frame over the limit, one that does not
        decode, a hello, a request the connection's queue of replies has no room for)
        goes to the connection's reader, and so to `_converse`."""
        conv: _Conversation = virtual.conv
        if not conv.authenticated or conv.sender is None:
            return 0
        most, end, pos = self.limits.max_frame_bytes, len(data), 0
        replies = conv.replies
        while end - pos >= HEADER.size and not conv.sender.done() and not replies.full():
            (size,) = HEADER.unpack_from(data, pos)
            start = pos + HEADER.size
            if size > most or end - start < size:
                break
            payload = data[start:start + size]
            began = time.perf_counter()
            try:
                request_id, op, args = request(payload)
            except ProtocolError:
                break
            if op == OpName.HELLO:
                break
            self.requests += 1
            pos = start + size
            # a reply written at once may be left to the front to encode
            free = conv.owes_nothing()
            reply = self._take(request_id, op, args, size, conv, virtual.peer, began, free)
            if isinstance(reply, asyncio.Future):
                replies.put_nowait(reply)
            elif isinstance(reply, _Relayed):
                virtual.write_answer(reply.request_id, reply.answer)
            elif isinstance(reply, bytes) and free:
                virtual.write(reply)
            else:
                replies.put_nowait(_ready(reply))
        return pos

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     peer: Any, request_id: Any, op: Any, args: Any, began: float,
                     conv: _Conversation) -> bool:
        """Answer a hello (or refuse the request of a connection that has not said one):
        whether the connection is now authenticated; if not, it was refused and is to
        be closed."""
        if not self._hello_ok(op, args):
            await self._refuse(
                reader, writer, peer, request_id, ErrorCode.AUTH,
                "wrong access token" if op == OpName.HELLO else
                f"the first request must be hello with the access token, not "
                f"{op!r}", conv)
            return False
        if len(self._connections) >= self.limits.max_connections:
            await self._refuse(
                reader, writer, peer, request_id, ErrorCode.LIMIT,
                f"the server has {self.limits.max_connections} connections open, "
                "its limit; try again later", conv)
            return False
        spoken = args.get("protocol", 1)
        if spoken != PROTOCOL:
            await self._refuse(
                reader, writer, peer, request_id, ErrorCode.PROTOCOL,
                f"this client speaks protocol {spoken!r}, the server {PROTOCOL}: "
                "install the same psoup version on both sides", conv)
            return False
        conv.pieces = args.get("pieces") is True
        task = asyncio.current_task()
        assert task is not None, "a connection runs in its own task"
        self._pending.pop(task, None)
        self._connections.add(task)
        hello = _ready(pack_frame(ok_reply(request_id, self._hello())))
        _log_request(peer, op, began, hello)
        await conv.replies.put(hello)
        return True

    @overload
    def _take(self, request_id: Any, op: Any, args: Any, size: int, conv: _Conversation,
              peer: Any, began: float) -> _Reply | asyncio.Future[_Reply]: ...

    @overload
    def _take(self, request_id: Any, op: Any, args: Any, size: int, conv: _Conversation,
              peer: Any, began: float, relay: bool
              ) -> _Reply | _Relayed | asyncio.Future[_Reply]: ...

    def _take(self, request_id: Any, op: Any, args: Any, size: int, conv: _Conversation,
              peer: Any, began: float, relay: bool = False
              ) -> _Reply | _Relayed | asyncio.Future[_Reply]:
        """The reply to an authenticated request of `size` bytes: a frame when a read
        was answered here and now (`_read_now`; with `relay`, an answer a front may
        encode is left to it), else a future of it (a parked read, an insert the
        ingest queue refused, or a dispatched request). On a read replica, what its
        primary answers goes there (`_forward`)."""
        if self._upstream is not None:
            if forwards(self._primary_handles, op, args):
                forwarded = asyncio.ensure_future(self._forward(request_id, op, args, conv))
                _log_request(peer, op, began, forwarded)
                return forwarded
            if op == OpName.INVOKE and isinstance(args, Mapping) and args.get("since"):
                polled = asyncio.ensure_future(self._since_here_or_primary(
                    request_id, op, args, conv))
                _log_request(peer, op, began, polled)
                return polled
        now = self._read_now(request_id, op, args, conv, relay)
        _log_request(peer, op, began, now)
        if now is not None:
            return now
        if op != OpName.INSERT:
            size = 0
        refused = self._refusal(request_id, args, size, conv) if size else None
        if refused is not None:
            _log_request(peer, op, began, refused)
            return _ready(refused)
        spec = OPS.get(op) if isinstance(op, str) else None
        write = spec is not None and spec.write
        turn = _turn(conv, op) if write else None
        dispatched = asyncio.ensure_future(self._dispatch(
            request_id, op, args, conv, conv.last_write, size, self._queued_token, turn))
        _log_request(peer, op, began, dispatched)
        if write:
            conv.last_write = dispatched
        return dispatched

    async def _send_replies(self, writer: asyncio.StreamWriter, conv: _Conversation) -> None:
        """Write the replies in request order; those that are ready together leave in
        one write (a pipelining client's replies cost one system call, not one each); a
        large answer after the frames before it, as `_send_large` does."""
        replies = conv.replies
        frames: list[bytes] = []
        while True:
            if replies.empty():
                if frames:
                    writer.write(b"".join(frames))
                    frames.clear()
                    await writer.drain()
                    continue
                conv.idle = True
                pending = await replies.get()
                conv.idle = False
            else:
                pending = replies.get_nowait()
            if pending is None:
                break
            if frames and not pending.done():
                writer.write(b"".join(frames))
                frames.clear()
                await writer.drain()
            reply = await pending
            if isinstance(reply, bytes):
                frames.append(reply)
                continue
            if frames:
                writer.write(b"".join(frames))
                frames.clear()
            await self._send_large(writer, conv, reply)
        if frames:
            writer.write(b"".join(frames))
            await writer.drain()

    async def _send_large(self, writer: asyncio.StreamWriter, conv: _Conversation,
                          large: _Large) -> None:
        """Encode a large answer on the encoding thread and send it: in pieces, each
        encoded while the one before it is being written (at most two in memory), or in
        one frame to a client that did not ask for pieces."""
        loop = asyncio.get_running_loop()
        pool = self._encode_pool
        assert pool is not None, "replies are sent only while serving"
        if not conv.pieces:
            # written a piece's worth at a time too: the transport copies what the socket
            # does not take at once, on the loop
            whole = memoryview(await loop.run_in_executor(pool, large.whole))
            step = max(self.limits.piece_bytes, 1 << 16)
            for start in range(0, len(whole), step):
                writer.write(whole[start:start + step])
                await writer.drain()
            return
        frames = large.frames(self.limits.piece_bytes)
        following = loop.run_in_executor(pool, next, frames, None)
        while (frame := await following) is not None:
            following = loop.run_in_executor(pool, next, frames, None)
            writer.write(frame)
            await writer.drain()

    async def _read_frame(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          peer: Any, idle: bool, conv: _Conversation) -> bytes | None:
        """The next payload, or None when the connection is to be closed. Before its
        hello a connection gets hello_timeout in all and frames of hello_frame_bytes."""
        limits = self.limits
        timeout = limits.read_timeout if idle else max(0.0, conv.hello_by - time.monotonic())
        most = limits.max_frame_bytes if idle else limits.hello_frame_bytes
        head = b""
        try:
            # An authenticated client may stay quiet between requests for as long as it
            # likes; a started frame, or a connection that has not said hello, may not.
            if idle:
                conv.waiting = True
                try:
                    head = await reader.readexactly(1)
                finally:
                    conv.waiting = False
            head += await _within(reader, 4 - len(head), timeout)
            (size,) = HEADER.unpack(head)
            if size > most:
                await self._refuse(reader, writer, peer, None, ErrorCode.FRAME_TOO_LARGE,
                                   f"a frame of {size} bytes exceeds the limit of {most} "
                                   f"bytes{'' if idle else ' before hello'}", conv)
                return None
            if not idle:
                timeout = max(0.0, conv.hello_by - time.monotonic())
            return await _within(reader, size, timeout)
        except asyncio.IncompleteReadError as exc:
            if head or exc.partial:
                log.info("%s: closed in the middle of a frame", peer)
            return None
        except asyncio.TimeoutError:
            log.warning("%s: no complete frame within %gs; closing", peer, timeout)
            return None

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      peer: Any, request_id: Any, code: str, message: str,
                      conv: _Conversation | None = None) -> None:
        """Send the replies still owed and one error reply before the connection is
        closed, then discard what the peer still sends for a moment: closing a socket
        with unread input resets the connection, and the reset could destroy the reply
        before the peer reads it."""
        log.warning("%s: %s: %s; closing", peer, code, message)
        if conv is not None:
            await conv.finish(self.limits.read_timeout)
        await self._send(writer, error_reply(request_id, code, message))
        if writer.can_write_eof():
            writer.write_eof()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(_discard(reader), _LINGER_SECONDS)

    async def _send(self, writer: asyncio.StreamWriter, message: Any) -> None:
        await self._send_frame(writer, pack_frame(message))

    @staticmethod
    async def _send_frame(writer: asyncio.StreamWriter, frame: bytes) -> None:
        writer.write(frame)
        await writer.drain()

    def _hello_ok(self, op: Any, args: Any) -> bool:
        token = args.get("token") if op == OpName.HELLO and isinstance(args, Mapping) else None
        return isinstance(token, str) and hmac.compare_digest(token.encode(), self._token)

    def _hello(self) -> dict[str, Any]:
        limits = asdict(self.limits)
        hello = {"server": "psoup", "version": __version__, "protocol": PROTOCOL,
                 "server_id": self.server_id, "pieces": True,
                 "limits": {k: limits[k] for k in
                            ("max_frame_bytes", "max_batch_rows", "max_query_chars",
                             "max_factors")}}
        if self.replica is not None:
            hello["replica"] = self.replica
        return hello

    # ------------------------------------------------------------------ requests

    def _read_now(self, request_id: Any, op: Any, args: Any, conv: _Conversation,
                  relay: bool = False) -> _Reply | _Relayed | asyncio.Future[_Reply] | None:
        """A read without a task or a thread of its own: its reply frame, run here on the
        event loop when the engine lock is free and nobody waits for it (or, with more
        than one thread, once it is, within LOCK_WAIT_SECONDS); else a future
        of it, parked for the next batch of reads. None when `_dispatch` must take it: a
        write or an unknown op, a read after a write of its connection that is still
        pending, a read that took over INLINE_SECONDS here lately, or an invocation that
        finds the lock taken (on a read thread, it waits for the lock only for its
        first step, then reads beside the writer)."""
        spec = OPS.get(op) if isinstance(op, str) else None
        if spec is None or spec.write or not isinstance(args, Mapping):
            return None
        if conv.last_write is not None and not conv.last_write.done():
            return None
        handle = args.get("handle")
        key = (op, handle if isinstance(handle, str) else None)
        pooled = self._pooled.get(key)
        if pooled is not None:
            if time.perf_counter() < pooled:
                return None
            del self._pooled[key]
        start = time.thread_time()
        wait = LOCK_WAIT_SECONDS if self._lock_wait and not self._waited_out else False
        with self.engine.locked(wait=wait) as held:
            if held:
                frame = self._run_read(request_id, spec, args, relay)
        if self._lock_wait:
            self._waited_out = not held
        if not held:
            if spec.name is OpName.INVOKE:
                return None             # to a read thread: it holds the lock briefly
            assert self._loop is not None, "reads are taken only while serving"
            parked = self._loop.create_future()
            self._parked.append((request_id, spec, args, key, parked))
            if not self._batching:
                self._next_batch()
            return parked
        self._timed(key, time.thread_time() - start)
        return frame

    @overload
    def _run_read(self, request_id: Any, spec: Op, args: Mapping[str, Any]) -> _Reply: ...

    @overload
    def _run_read(self, request_id: Any, spec: Op, args: Mapping[str, Any],
                  relay: bool) -> _Reply | _Relayed: ...

    def _run_read(self, request_id: Any, spec: Op, args: Mapping[str, Any],
                  relay: bool = False) -> _Reply | _Relayed:
        """A read's reply; with `relay`, an answer a front may encode is left to it."""
        reply = self._relayed_reply if relay else self._reply
        return reply(request_id, lambda: (True, self._run(
            spec, spec.parse(args, self.limits))))

    def _run(self, spec: Op, parsed: dict[str, Any]) -> Any:
        """Run an operation on the engine; stats also tell the ingest queue's state."""
        value = spec.run(self.engine, parsed)
        if spec.name is OpName.STATS:
            value = {**value, "ingest_queue": self.queue_stats()}
            if self._replicas is not None:
                value["replicas"] = plain(self._replicas.stats())
        return value

    def _timed(self, key: tuple[str, Any], seconds: float) -> None:
        """Send a read that took too long (CPU seconds of its thread, so that waiting for
        the GIL does not count) to the read pool for a while."""
        if seconds > INLINE_SECONDS:
            if len(self._pooled) >= self.limits.max_connections:
                self._pooled.clear()
            self._pooled[key] = time.perf_counter() + _POOLED_SECONDS

    def _next_batch(self) -> None:
        """Run the parked reads on a read thread under one hold of the engine lock (one
        thread hop for all of them); reads parked meanwhile join it or the next batch."""
        assert self._loop is not None and self._read_pool is not None, "only while serving"
        self._batching = True
        done = self._loop.run_in_executor(self._read_pool, self._run_batch)
        done.add_done_callback(self._batch_done)

    def _run_batch(self) -> _Batch:
        """On a read thread: take the engine lock (in turn, behind the calls already
        waiting for it), then answer parked reads until none is left or BATCH_SECONDS
        have passed, so that a waiting write is held up by at most that."""
        parked, cpu, out = self._parked, time.thread_time, []
        with self.engine.locked():
            deadline = time.perf_counter() + BATCH_SECONDS
            while parked and time.perf_counter() < deadline:
                start = cpu()
                request_id, spec, args, key, reply = parked.popleft()
                out.append((reply, self._run_read(request_id, spec, args), key, cpu() - start))
        return out

    def _batch_done(self, done: asyncio.Future[_Batch]) -> None:
        self._batching = False
        if done.cancelled():                 # the server is stopping
            return
        for reply, frame, key, seconds in done.result():   # _run_read raises nothing
            self._timed(key, seconds)
            if not reply.done():
                reply.set_result(frame)
        if self._parked:
            self._next_batch()

    async def _forward(self, request_id: Any, op: str, args: Any,
                       conv: _Conversation) -> _Reply:
        """A read replica's request that its primary answers: sent on the connection's
        own link to the primary (in order: the link is given it now, before any await),
        its reply passed back as the primary gave it. A link that breaks closes the
        client's connection: the outcome of a write is then unknown to the client, as
        when its own connection breaks."""
        if conv.upstream is None:
            assert self._upstream is not None, "only a replica forwards"
            conv.upstream = Upstream(self._upstream, self._token_text)
        try:
            return await conv.upstream.submit(request_id, op, args)
        except ConnectionError as exc:
            log.info("a read replica lost its link to the primary (%s); closing the "
                     "client's connection", exc)
            if conv.writer is not None:
                conv.writer.close()
            raise

    async def _since_here_or_primary(self, request_id: Any, op: str, args: Any,
                                     conv: _Conversation) -> _Reply:
        """A read replica's poll with a cursor: answered here, unless the cursor names
        an answer only the primary kept (a client that polled there and reconnected
        here): then the primary answers it (its reply, whatever it is)."""
        reply = await self._dispatch(request_id, op, args, conv, conv.last_write)
        if isinstance(reply, bytes) and _outcome(reply) == CursorExpired.code:
            return await self._forward(request_id, op, args, conv)
        return reply

    async def _dispatch(self, request_id: Any, op: Any, args: Any, conv: _Conversation,
                        after: asyncio.Future[_Reply] | None, size: int = 0, token: int = 0,
                        turn: _Turn | None = None) -> _Reply:
        """The reply frame of one authenticated request. A read waits for `after`, the
        last write its connection sent before it (a client reads its own writes); an
        insert counts its `size` bytes in the ingest queue under `token` (`_refusal`
        took them) until it is answered; a write with a `turn` joins the writer's queue
        in it (`_turn`)."""
        try:
            return await self._dispatched(request_id, op, args, conv, after, size, turn)
        finally:
            if turn is not None:
                _pass_turn(turn)
            if size:
                self._queued_bytes -= size
                del self._queued_at[token]

    def _refusal(self, request_id: Any, args: Any, size: int,
                 conv: _Conversation) -> bytes | None:
        """Take an insert of `size` bytes into the ingest queue (None; its token is
        then `_queued_token`), or the reply refusing it: "busy" when the queue would
        pass max_queued_bytes (unless it is empty), with the seconds after which to send
        it again; "skipped" for an insert chained after one refused so. O(1)."""
        chained = isinstance(args, Mapping) and bool(args.get("chain"))
        if chained and conv.refused:
            return pack_frame(error_reply(request_id, ErrorCode.SKIPPED, "not applied: an earlier "
                                          "batch of the same insert was refused (busy)"))
        limit = self.limits.max_queued_bytes
        if self._queued_bytes and self._queued_bytes + size > limit:
            conv.refused = True
            self._busy_replies += 1
            wait = min(5.0, max(0.02, (self._queued_bytes + size - limit) / self._apply_rate))
            return pack_frame(error_reply(
                request_id, ErrorCode.BUSY, f"the server is applying {self._queued_bytes:,} bytes "
                f"of earlier inserts, its limit (max_queued_bytes={limit:,}); nothing was "
                f"applied: send it again in {wait:.2f}s", retry_after=round(wait, 3)))
        conv.refused = False
        self._queued_bytes += size
        self._queued_peak = max(self._queued_peak, self._queued_bytes)
        self._queued_token += 1
        self._queued_at[self._queued_token] = time.monotonic()
        return None

    def queue_stats(self) -> dict[str, Any]:
        """The ingest queue: inserts waiting (and their bytes), the limit, how long the
        oldest has waited (the lag), the most bytes it held, busy replies sent."""
        try:            # read by a read thread too, while the loop changes the queue
            waited = time.monotonic() - next(iter(self._queued_at.values()))
        except (StopIteration, RuntimeError):
            waited = 0.0
        return {"inserts": len(self._queued_at), "bytes": self._queued_bytes,
                "limit_bytes": self.limits.max_queued_bytes, "lag_s": round(waited, 4),
                "peak_bytes": self._queued_peak, "busy_replies": self._busy_replies}

    async def _dispatched(self, request_id: Any, op: Any, args: Any, conv: _Conversation,
                          after: asyncio.Future[_Reply] | None, size: int,
                          turn: _Turn | None) -> _Reply:
        try:
            spec = OPS.get(op) if isinstance(op, str) else None
            if spec is None:
                raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {op!r} (ops: hello, "
                                                          f"{', '.join(OPS)})")
            if not isinstance(args, Mapping):
                raise ProtocolError(ErrorCode.BAD_ARGS,
                                    f"args must be a map, not {type(args).__name__}")
            parsed = spec.parse(args, self.limits)
        except ProtocolError as exc:
            return pack_frame(error_reply(request_id, exc.code, str(exc)))
        write = spec.write
        apply: Callable[[], Any] = partial(self._run, spec, parsed)
        loop = asyncio.get_running_loop()
        if not write:
            if after is not None:
                await asyncio.wait([after])
            return await loop.run_in_executor(self._read_pool, self._reply, request_id,
                                              lambda: (True, apply()))
        if turn is not None:
            if _scans(spec, parsed):
                apply = await self._prepared(spec, parsed, after)
            if turn[0] is not None:
                await asyncio.wait([turn[0]])
        done = loop.create_future()
        chained = op == OpName.INSERT and bool(args.get("chain"))
        assert self._writes is not None, "requests are dispatched only while serving"
        await self._writes.put((partial(_in_chain, conv, chained, apply), done, size))
        if turn is not None:
            _pass_turn(turn)
        outcome = await done
        return self._reply(request_id, lambda: outcome)

    async def _prepared(self, spec: Op, parsed: dict[str, Any],
                        after: asyncio.Future[_Reply] | None) -> Callable[[], Any]:
        """The write that applies a registration (register, or execute of a SELECT) once
        its scan has run on a registration thread (Engine.prepare_register), after the
        connection's earlier writes (it compiles against them): ending it
        (Engine.finish_register), or the whole op where the engine registers in one
        hold, or raising what the scan raised (nothing changed; the writer's queue keeps
        the connection's writes in order and replies after the commit)."""
        if after is not None:
            await asyncio.wait([after])
        assert self._register_pool is not None, "requests are dispatched only while serving"
        try:
            prepared = await asyncio.get_running_loop().run_in_executor(
                self._register_pool, self.engine.prepare_register, parsed["sql"])
        except Exception as exc:
            return partial(_raise, exc)
        if prepared is None:
            return partial(self._run, spec, parsed)
        return partial(self.engine.finish_register, prepared)

    def _reply(self, request_id: Any, run: Callable[[], tuple[bool, Any]]) -> _Reply:
        """The reply to a request whose outcome `run` gives: its frame, or an answer
        (invoke's Result or Changes) too large for one frame of piece_bytes, which the
        connection's sender encodes (cheap to tell: an estimate, O(columns))."""
        def encoded() -> _Reply:
            ok, value = run()
            if not ok:
                raise value
            if isinstance(value, (Result, Changes)):
                if answer_bytes(value) > self.limits.piece_bytes:
                    return _Large(request_id, value)
                value = encode_answer(value)
            return pack_frame(ok_reply(request_id, value))
        return _encoded_reply(request_id, encoded)

    def _relayed_reply(self, request_id: Any,
                       run: Callable[[], tuple[bool, Any]]) -> _Reply | _Relayed:
        """`_reply`, but an answer that a front may encode (`relayable`, to a request
        of an int id) is left to it, its cursor issued here (engine state)."""
        def relayed() -> _Reply | _Relayed:
            ok, value = run()
            if not ok:
                raise value
            if (type(request_id) is int
                    and 0 <= relay_bytes(value) <= self.limits.piece_bytes):
                assert isinstance(value, Result), "relay_bytes says it is one"
                _ = value.cursor
                return _Relayed(request_id, value)
            return self._reply(request_id, lambda: (True, value))
        return _encoded_reply(request_id, relayed)

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        writes = self._writes
        assert writes is not None, "_serve makes the queue before it starts this loop"
        while True:
            group = [await writes.get()]
            while len(group) < self.limits.max_group_writes and not writes.empty():
                group.append(writes.get_nowait())
            began = time.perf_counter()
            outcomes = await loop.run_in_executor(self._write_pool, self._apply_group,
                                                  [apply for apply, _, _ in group])
            applied, took = sum(size for _, _, size in group), time.perf_counter() - began
            if applied and took > 0:          # smoothed, for a busy reply's retry_after
                self._apply_rate = 0.8 * self._apply_rate + 0.2 * applied / took
            for (_, done, _), outcome in zip(group, outcomes, strict=True):
                if not done.done():
                    done.set_result(outcome)

    def _apply_group(self, applies: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
        """Apply writes one by one, then commit once; runs on the writer thread."""
        outcomes: list[tuple[bool, Any]] = []
        for apply in applies:
            try:
                outcomes.append((True, apply()))
            except Exception as exc:
                outcomes.append((False, exc))
        if any(ok for ok, _ in outcomes):
            try:
                self.engine.commit()
            except Exception as exc:
                log.exception("commit failed")
                failed = ProtocolError(ErrorCode.INTERNAL,
                                       f"the change was applied but could not be "
                                       f"made durable: {type(exc).__name__}: {exc}")
                outcomes = [(False, failed) if ok else (ok, v) for ok, v in outcomes]
        return outcomes


def _listening(host: str, port: int) -> list[socket.socket]:
    """The listening TCP sockets of a server with fronts, which accepts on them itself
    (`Server._accept`): one for each address `host` names, as asyncio.start_server
    binds them ("" and "::": every interface, IPv6 and IPv4 where the system allows
    both); with port 0, all on the port the first one got."""
    if host in ("", "::") and socket.has_dualstack_ipv6():
        return [socket.create_server(("::", port), family=socket.AF_INET6,
                                     dualstack_ipv6=True, backlog=1024)]
    infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM,
                               0, socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, _, _, _, address in dict.fromkeys(
                (i[0], i[1], i[2], i[3], i[4]) for i in infos):
            if sockets:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sockets.append(socket.create_server(address, family=family, backlog=1024))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _settle(future: asyncio.Future[None]) -> None:
    """Set `future` done, unless it is (a reader's callback may run again before the
    coroutine that awaits it removes the reader)."""
    if not future.done():
        future.set_result(None)


def _ready(frame: _Reply) -> asyncio.Future[_Reply]:
    """A reply that is ready, as the future the conversation's queue holds."""
    ready: asyncio.Future[_Reply] = asyncio.get_running_loop().create_future()
    ready.set_result(frame)
    return ready


def _encoded_reply(request_id: Any, encode: Callable[[], _R]) -> _R | bytes:
    """What `encode` returns, or the error reply to request `request_id` for what it
    raised (an engine error by its code; anything else is "internal", and logged)."""
    try:
        return encode()
    except PSoupError as exc:
        return pack_frame(error_reply(request_id, exc.code, str(exc), **error_fields(exc)))
    except Exception as exc:
        log.exception("request %r failed", request_id)
        return pack_frame(error_reply(request_id, ErrorCode.INTERNAL,
                                      f"internal error: {type(exc).__name__}: {exc}"))


def _turn(conv: _Conversation, op: Any) -> _Turn | None:
    """The place of a write in its connection's order for the writer's queue, when that
    order needs keeping by hand: a registration scans before it joins the queue (on a
    registration thread), and the connection's later writes must not join it first (a
    client could see it: a drop applied before the registration sent earlier, a limit
    taken by a later query). None for a write that joins the queue in its turn anyway
    (none of its connection's writes is still scanning): the dispatches of one
    connection put their writes in the order they were read."""
    earlier = conv.queued
    if earlier is not None and earlier.done():
        earlier = conv.queued = None
    if earlier is None and op not in (OpName.REGISTER, OpName.EXECUTE):
        return None
    mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conv.queued = mine
    return earlier, mine


def _pass_turn(turn: _Turn) -> None:
    """The connection's next write may join the writer's queue: now if the one before
    this (`turn[0]`) has joined it, else once it has (idempotent)."""
    earlier, mine = turn
    if mine.done():
        return
    if earlier is None or earlier.done():
        mine.set_result(None)
    else:
        earlier.add_done_callback(lambda _: None if mine.done() else mine.set_result(None))


def _scans(spec: Op, parsed: Mapping[str, Any]) -> bool:
    """Whether a write registers a query, so that its scan runs on a registration
    thread: register, and an execute whose statement starts with SELECT (a comment
    before it, say, leaves it to the writer thread whole, which is only slower)."""
    if spec.name is OpName.REGISTER:
        return True
    return spec.name is OpName.EXECUTE and parsed["sql"].lstrip()[:6].upper() == "SELECT"


def _raise(exc: Exception) -> None:
    """On the writer thread: the outcome of a registration whose scan raised `exc`."""
    raise exc


def _in_chain(conv: _Conversation, chained: bool, apply: Callable[[], Any]) -> Any:
    """Apply one write on the writer thread, unless it continues an insert whose earlier
    batch was rejected (insert's "chain" argument)."""
    if chained and not conv.chain_ok:
        raise ProtocolError(ErrorCode.SKIPPED, "not applied: an earlier batch of the same insert "
                                               "was rejected")
    conv.chain_ok = False
    result = apply()
    conv.chain_ok = True
    return result


def _log_request(peer: Any, op: Any, began: float,
                 reply: _Reply | _Relayed | asyncio.Future[_Reply] | None) -> None:
    """One line when `reply` (a frame, or a future of one) is ready: the peer, the op,
    the outcome ("ok" or the error code) and the milliseconds since the request was
    read. Successes log at DEBUG, errors at INFO, so a server at its default level
    (WARNING) logs none; nothing is decoded unless the line would be written."""
    if reply is None or not log.isEnabledFor(logging.INFO):
        return
    if isinstance(reply, asyncio.Future):
        reply.add_done_callback(
            lambda done: None if done.cancelled() or done.exception() is not None
            else _log_request(peer, op, began, done.result()))
        return
    outcome = "ok" if isinstance(reply, (_Large, _Relayed)) else _outcome(reply)
    level = logging.DEBUG if outcome == "ok" else logging.INFO
    if log.isEnabledFor(level):
        log.log(level, "%s %s %s %.1fms", peer, op, outcome,
                (time.perf_counter() - began) * 1000)


def _peer_text(peer: Any) -> str:
    """A connection's peer as every log line names it: HOST:PORT ([HOST]:PORT for IPv6).

    Example:
        >>> _peer_text(("127.0.0.1", 45746)), _peer_text(("::1", 7070, 0, 0))
        ('127.0.0.1:45746', '[::1]:7070')
    """
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return str(peer)


def _is_ok(frame: bytes) -> bool:
    """Whether a reply frame is a success (reads its head only)."""
    return _outcome(frame) == "ok"


def _outcome(frame: bytes) -> str:
    """"ok", or the error code, of a reply frame; reads only the head of a successful
    reply (its answer may be large), all of an error reply (small)."""
    head = msgpack.Unpacker(raw=False, strict_map_key=False)
    head.feed(frame[HEADER.size:HEADER.size + 64])
    try:
        for _ in range(head.read_map_header()):
            key, value = head.unpack(), head.unpack()
            if key == "ok" and value:
                return "ok"
            if key == "ok":
                break
    except (msgpack.OutOfData, ValueError):
        pass
    reply = unpack_payload(frame[HEADER.size:])
    error = reply.get("error") if isinstance(reply, Mapping) else None
    return str(error.get("code", "error")) if isinstance(error, Mapping) else "error"


async def _within(reader: asyncio.StreamReader, n: int, timeout: float) -> bytes:
    """The next `n` bytes, or asyncio.TimeoutError after `timeout` seconds; with
    `asyncio.timeout` where it exists (3.11), which, unlike `wait_for`, makes no task
    per read. Bytes already received are taken without a timer: the rest of a frame
    has usually come with its first byte, and arming and cancelling a timer per read
    was ~9% of a busy server's time (the reader's buffer is CPython's `_buffer`; where
    it is missing, every read is timed)."""
    buffered = getattr(reader, "_buffer", None)
    if buffered is not None and len(buffered) >= n:
        return await reader.readexactly(n)         # returns at once: nothing to wait for
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await reader.readexactly(n)
    return await asyncio.wait_for(reader.readexactly(n), timeout)


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(1 << 16):
        pass


def run_server(data_dir: str | Path | None = None, host: str = DEFAULT_HOST,
               port: int = DEFAULT_PORT, token: str | None = None, mode: ModeName = "partial",
               sync: SyncName = "group", limits: Limits | None = None,
               spark_master: str | None = None, echo: Callable[[str], Any] = print,
               spark_conf: Mapping[str, str] | None = None,
               archive_budget: float | None = None,
               answer_cache_bytes: int = DEFAULT_ANSWER_CACHE,
               threads: int | None = None, fronts: int | None = None,
               replicas: int = 0) -> None:
    """Run the psoup service until SIGINT or SIGTERM (what `psoup serve` does). Blocking.

    Args:
        data_dir: the durable state's directory; None serves from memory only.
        host, port: where to listen (port 0 picks a free one).
        token: the access token; None reuses `data_dir/token` if it exists, else
            generates one and writes it, owner-readable only, to `data_dir/token` (when
            there is a data dir) and to `psoup.config.token_path(host, port)`, where
            local clients look for it. The token itself is never printed.
        mode: the engine mode (psoup.options.ModeName).
        sync: when the log reaches the disk (psoup.options.SyncName); "group" commits
            once per group of writes, before any of them is acknowledged.
        limits: request and connection limits.
        spark_master: the Spark master of history jobs (default local[*]); a client
            cannot choose it.
        spark_conf: Spark settings of history jobs (`Engine`'s spark_conf).
        archive_budget: seconds a history job may spend reading the archive before it
            reads a sample instead (`Engine`'s archive_budget; None: read it all).
        answer_cache_bytes: memory for the queries' last answers, which their next
            invocations reuse (`Engine`'s answer_cache_bytes; 0 keeps none).
        threads: the threads a large batch's probe is split over (`Engine`'s threads;
            None: the cores this process may run on).
        fronts: front processes that accept the connections and do their socket work
            (`Server`'s fronts; they inherit descriptors and speak over a Unix socket,
            so not on Windows); 0: none, the whole server in this process; None:
            DEFAULT_FRONTS with more than one thread and no replicas, else none. Measured on 2 cores
            with 100 polling clients and a producer, one front gave 1.16-1.38x the
            invokes/s of none; each adds tens of microseconds to a round trip.
        replicas: read replica processes (`Server`'s replicas; Linux only); 0: none.
            Measured on 2 cores with 100 polling clients and a producer, one replica
            and no front gave 1.53-1.79x the invokes/s of one core in five runs (one
            front, no replica: 1.17-1.38x).
        echo: where the startup line (and the shutdown line, after a clean stop) goes.

    The process's C allocator keeps the memory it frees (psoup.server.allocator).
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("run_server stops on SIGINT/SIGTERM, so it must run in the main "
                           "thread; elsewhere use Server(...).start_in_thread()")
    keep_freed_memory()                 # answers' memory reused, not faulted in again
    stop = threading.Event()
    # Handlers first: a signal that arrives while the log is replayed must stop, not kill.
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    written: list[Path] = []
    created = _first_missing(data_dir)
    serving = False
    try:
        shown: list[int] = []
        began = time.monotonic()

        def recovering(done: int, total: int) -> None:
            # silent unless the replay takes a while (a short one is the usual start)
            if shown or (done < total and time.monotonic() - began >= 2.0):
                shown.append(done)
                echo(f"recovering {data_dir}: {done / max(total, 1):.0%} of "
                     f"{total / 2**20:.1f} MiB of log")
        engine = Engine(path=None if data_dir is None else str(data_dir), mode=mode, sync=sync,
                        progress=recovering, spark_master=spark_master,
                        spark_conf=spark_conf, archive_budget=archive_budget,
                        answer_cache_bytes=answer_cache_bytes, threads=threads)
        try:
            # what exists by now (the modules, numba's compiler, the recovered engine)
            # lives as long as the process: full collections skip it from here on (one
            # over ~100,000 such objects took ~70 ms, in the middle of a client's insert);
            # the garbage of start-up and recovery is collected first, not kept for good
            gc.collect()
            gc.freeze()
            generated = token is None
            if token is None:
                token = _stored_or_new_token(data_dir)
            if fronts is None:      # one front where there is a core beside this one
                fronts = DEFAULT_FRONTS if engine.threads > 1 and not replicas else 0
            server = Server(engine, host, port, token=token, limits=limits, fronts=fronts,
                            replicas=replicas)
            bound_host, bound_port = server.start_in_thread()
            serving = True
            try:
                if generated:
                    # local clients of a server on every interface connect to 127.0.0.1
                    path = token_path("127.0.0.1" if host in _WILDCARDS else host, bound_port)
                    write_private(path, token)
                    written.append(path)
                where = ("in memory only (not durable)" if data_dir is None
                         else f"data in {data_dir}")
                secret = f"token in {written[0]}" if written else "token as given"
                if replicas:
                    where += f", {replicas} read replica{'s' if replicas > 1 else ''}"
                echo(f"psoup {__version__} serving on {bound_host}:{bound_port}, "
                     f"{where}, mode {mode}, {secret}; Ctrl-C stops")
                while not stop.wait(0.5):
                    pass
            finally:
                server.stop()
        finally:
            engine.close()
        up = time.monotonic() - began
        with contextlib.suppress(OSError):  # the startup line's reader has gone (a pipe)
            echo(f"psoup on {bound_host}:{bound_port} stopped after {up // 3600:.0f}h"
                 f"{up % 3600 // 60:02.0f}m{up % 60:02.0f}s and {server.requests:,} requests"
                 f"{'' if data_dir is None else f'; data in {data_dir} closed cleanly'}")
    finally:
        for path in written:
            path.unlink(missing_ok=True)
        if created is not None and not serving:
            # a server that never served (the port was taken) leaves no state behind
            shutil.rmtree(created, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _first_missing(data_dir: str | Path | None) -> Path | None:
    """The outermost directory of `data_dir` that does not exist yet (what the engine
    will create), or None."""
    if data_dir is None:
        return None
    path = Path(data_dir).absolute()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def _stored_or_new_token(data_dir: str | Path | None) -> str:
    """The data dir's token if it has one (remote clients keep working across restarts),
    else a new one, saved owner-readable only in the data dir when there is one."""
    stored = None if data_dir is None else Path(data_dir) / "token"
    if stored is not None and stored.is_file():
        return stored.read_text().strip()
    token = secrets.token_urlsafe(32)
    if stored is not None:
        write_private(stored, token)
    return token
