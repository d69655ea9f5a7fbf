"""A front process of the psoup server (`psoup serve --threads N`, N > 1).

The engine process owns the engine, the protocol and every connection's state; it runs
on one core because the GIL serializes its Python. A front takes the socket work off
it: the engine process accepts each connection and, past its first few, passes the
socket to a front (SCM_RIGHTS over a Unix socket), which relays the connection's bytes
both ways over another Unix socket, its channel; the engine process serves the
connection as if it held it (psoup.server.fronts: `Virtual`). The engine's event loop
then reads and writes one socket in large chunks instead of a hundred, and the system
calls and transports of the connections run on other cores.

A front keeps no state that matters: if it dies, the engine process sees its channel
close, ends its connections as closed by their peers (every write they sent before is
applied or not, as when any connection drops), starts another front, and the clients
reconnect.

Channel messages, both ways: a header (kind, connection number, length of the body),
then the body. A front sends OPEN (body: the peer's address, "host:port"), DATA (bytes
the client sent), SHUT (the client will send nothing more; replies still go to it),
CLOSED (the connection is gone), PAUSE and RESUME (its socket's send buffer is full /
has room again: the engine stops and restarts writing to it). The engine sends DATA
(bytes for the client), EOF (shut the sending side: a refused connection's last
reply), CLOSE (close the connection), HOLD and READ (stop / restart reading the client:
the engine's buffer of its unread requests is full), and ANSWER: an invocation's answer
of numeric columns as raw arrays, which the front encodes into the reply frame with
the protocol's own encoder (psoup.server.protocol), so that the engine process does
not spend its core on it and the client gets the bytes it would have got.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from psoup.results.result import Result
from psoup.server.protocol import encode_answer, ok_reply, pack_frame, unpack_payload

#: kind (1 byte), connection number, body length; little-endian
MESSAGE = struct.Struct("<BII")


def messages(buf: bytearray) -> Iterator[tuple[int, int, bytes]]:
    """The whole messages at the start of `buf` as (kind, connection, payload), each
    taken out of it as it is yielded; a partial message is left for more bytes. O(bytes
    taken)."""
    pos, end = 0, len(buf)
    try:
        while end - pos >= MESSAGE.size:
            kind, conn, size = MESSAGE.unpack_from(buf, pos)
            start = pos + MESSAGE.size
            if end - start < size:
                break
            pos = start + size
            yield kind, conn, bytes(buf[start:pos])
    finally:
        del buf[:pos]

OPEN, DATA, SHUT, CLOSED, PAUSE, RESUME, EOF, CLOSE, HOLD, READ, ANSWER = range(1, 12)

#: An ANSWER's body: the length of its head (msgpack: request id, columns, cursor,
#: the values' dtypes and byte counts, rows, fresh_to), then the raw values, ts and
#: tupleIDs.
ANSWER_HEAD = struct.Struct("<I")

#: The bytes a channel's transport may hold unsent before the clients are paused.
CHANNEL_BUFFER = 1 << 23

#: Most bytes of a client's data relayed in one message (larger reads are cut).
_MOST = 1 << 20


class _Channel(asyncio.Protocol):
    """The front's end of its channel to the engine process."""

    def __init__(self, front: _Front):
        self.front = front
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        conns = self.front.conns
        for kind, conn, payload in messages(self.buf):
            client = conns.get(conn)
            if client is None:
                continue
            if kind == DATA:
                client.transport.write(payload)
            elif kind == ANSWER:
                try:
                    frame = answer_frame(payload)
                except Exception:       # a bug: drop the connection (the engine hears)
                    client.transport.abort()
                    continue
                client.transport.write(frame)
            else:
                client.command(kind)

    def connection_lost(self, exc: Exception | None) -> None:
        # the engine process has gone or stopped: so does this front
        self.front.gone.set()

    def pause_writing(self) -> None:
        self.front.pause_clients()

    def resume_writing(self) -> None:
        self.front.resume_clients()


class _Client(asyncio.Protocol):
    """One client connection, relayed to the engine process."""

    def __init__(self, front: _Front):
        self.front = front
        self.conn = 0
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set at once
        self.held = False       # the engine asked to stop reading
        self.paused = False     # the channel is full

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = self.front.open(self)
        peer = transport.get_extra_info("peername")
        self.front.send(OPEN, self.conn, _peer_text(peer).encode())
        if self.front.paused:
            self.pause()

    def data_received(self, data: bytes) -> None:
        for start in range(0, len(data), _MOST):
            self.front.send(DATA, self.conn, data[start:start + _MOST])

    def eof_received(self) -> bool:
        self.front.send(SHUT, self.conn, b"")
        return True             # half open: the engine still writes its replies

    def connection_lost(self, exc: Exception | None) -> None:
        if self.front.conns.pop(self.conn, None) is not None:
            self.front.send(CLOSED, self.conn, b"")

    def pause_writing(self) -> None:
        self.front.send(PAUSE, self.conn, b"")

    def resume_writing(self) -> None:
        self.front.send(RESUME, self.conn, b"")

    def command(self, kind: int) -> None:
        if kind == EOF:
            if self.transport.can_write_eof():
                self.transport.write_eof()
        elif kind == CLOSE:
            self.front.conns.pop(self.conn, None)
            self.transport.close()
        elif kind == HOLD:
            self.held = True
            self.transport.pause_reading()
        elif kind == READ:
            self.held = False
            if not self.paused:
                self.transport.resume_reading()

    def pause(self) -> None:
        self.paused = True
        self.transport.pause_reading()

    def resume(self) -> None:
        self.paused = False
        if not self.held:
            self.transport.resume_reading()


class _Front:
    def __init__(self) -> None:
        self.conns: dict[int, _Client] = {}
        self.next = 0
        self.out: list[bytes] = []
        self.channel: asyncio.Transport | None = None
        self.gone = asyncio.Event()
        self.paused = False

    def open(self, client: _Client) -> int:
        self.next += 1
        self.conns[self.next] = client
        return self.next

    def send(self, kind: int, conn: int, body: bytes) -> None:
        """Queue a message for the channel; the messages queued in one turn of the loop
        leave in one write."""
        if not self.out:
            asyncio.get_running_loop().call_soon(self.flush)
        self.out.append(MESSAGE.pack(kind, conn, len(body)))
        if body:
            self.out.append(body)

    def flush(self) -> None:
        if self.channel is not None and not self.channel.is_closing():
            self.channel.write(b"".join(self.out))
        self.out.clear()

    def pause_clients(self) -> None:
        self.paused = True
        for client in self.conns.values():
            client.pause()

    def resume_clients(self) -> None:
        self.paused = False
        for client in self.conns.values():
            client.resume()


def answer_frame(body: bytes) -> bytes:
    """The reply frame of an ANSWER message's body: what the engine process would have
    sent, encoded by the same functions."""
    (size,) = ANSWER_HEAD.unpack_from(body)
    pos = ANSWER_HEAD.size + size
    request_id, columns, cursor, dtypes, sizes, rows, fresh_to = unpack_payload(
        body[ANSWER_HEAD.size:pos])
    values = []
    for dtype, nbytes in zip(dtypes, sizes, strict=True):
        values.append(np.frombuffer(body, dtype=dtype, count=nbytes // np.dtype(dtype).itemsize,
                                    offset=pos))
        pos += nbytes
    ts = np.frombuffer(body, dtype="<f8", count=rows, offset=pos)
    tuple_ids = np.frombuffer(body, dtype="<i8", count=rows, offset=pos + 8 * rows)
    answer = Result(columns, None, ts, tuple_ids, cursor=cursor, values=values,
                    fresh_to=fresh_to)
    return pack_frame(ok_reply(request_id, encode_answer(answer)))


def _peer_text(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return str(peer)


async def serve(sockets: socket.socket, channel: socket.socket) -> None:
    """Relay the connections whose sockets arrive on `sockets` over `channel` until the
    engine process closes the channel."""
    loop = asyncio.get_running_loop()
    front = _Front()
    transport, _ = await loop.create_unix_connection(lambda: _Channel(front), sock=channel)
    transport.set_write_buffer_limits(CHANNEL_BUFFER)
    front.channel = transport

    def received() -> None:
        try:
            _, fds, _, _ = socket.recv_fds(sockets, 64, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            front.gone.set()
            return
        if not fds:                     # the engine process closed it
            front.gone.set()
        for fd in fds:
            client = socket.socket(fileno=fd)
            client.setblocking(False)
            loop.create_task(loop.connect_accepted_socket(lambda: _Client(front), client))
    loop.add_reader(sockets.fileno(), received)
    try:
        await front.gone.wait()
    finally:
        loop.remove_reader(sockets.fileno())
        for client in list(front.conns.values()):
            client.transport.abort()


def main(argv: list[str]) -> None:
    """`python -m psoup.server.front SOCKETS_FD CHANNEL_FD`: the fds are inherited."""
    # Ctrl-C reaches the whole process group: the engine process stops the server (its
    # last replies still pass through here), then closes the channel, which ends this
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sockets = socket.socket(fileno=int(argv[0]))
    channel = socket.socket(fileno=int(argv[1]))
    sockets.setblocking(False)
    channel.setblocking(False)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(sockets, channel))
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
