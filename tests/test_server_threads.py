"""The server with more than one thread (`--threads`).

A read on the event loop that finds the engine lock taken waits for it a moment
(LOCK_WAIT_SECONDS) and runs there, instead of going to a read thread at once (a
handoff between cores costs more than a short write's wait); a wait that runs out
hands it over as before, and later reads do not wait until the loop finds the lock
free again. `psoup serve` starts front processes (psoup.server.front) that relay the
connections: one that dies loses nothing, and another takes its place. With one
thread nothing waits and no front starts: today's server. (Every op through a front
is tested by tests/test_server.py and tests/test_pieces.py, which run each test with
and without one.)"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np
import pytest
from numpy.typing import NDArray

from psoup import Client, Engine
from psoup.results.result import Result
from psoup.server import Server
from psoup.server import server as server_module
from psoup.server.front import ANSWER, MESSAGE, answer_frame
from psoup.server.fronts import Channel, _Sender, relayable
from psoup.server.protocol import PROTOCOL, encode_answer, ok_reply, pack_frame
from tests.support import Clock, read_reply

TOKEN = "test-token"
#: How long a client or a test waits for a reply or a thread: only a hang reaches it.
WAIT = 60.0
QUERY = "SELECT a FROM R WHERE a > 2"


class _Recording(Engine):
    """An Engine that records the thread each invocation ran on."""

    def __init__(self, threads: int):
        super().__init__(clock=Clock(1000.0), threads=threads)
        self.ran_on: list[str] = []

    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        self.ran_on.append(threading.current_thread().name)
        return super().invoke(*args, **kwargs)


Serve = Callable[[int], tuple[_Recording, Server, str, str]]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start a server over a recording engine of `threads` threads, holding R, QUERY and
    ten rows: (engine, server, address, the query's handle)."""
    started: list[Server] = []

    def start(threads: int) -> tuple[_Recording, Server, str, str]:
        engine = _Recording(threads)
        engine.execute("CREATE STREAM R (a INT)")
        handle = engine.register(QUERY)
        engine.insert("R", {"a": list(range(10))}, ts=[float(t) for t in range(10)])
        server = Server(engine, port=0, token=TOKEN)
        host, port = server.start_in_thread()
        started.append(server)
        return engine, server, f"{host}:{port}", handle
    yield start
    for server in started:
        server.stop()


def _wait_for(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _invoke_while_held(engine: _Recording, address: str, handle: str) -> Result:
    """Invoke `handle` from a client while this thread holds the engine lock; release it
    once the invocation waits for it."""
    got: list[Result] = []
    with Client(address, token=TOKEN, timeout=WAIT) as client:
        client.ping()
        with engine.locked():
            asking = threading.Thread(target=lambda: got.append(client.invoke(handle)))
            asking.start()
            _wait_for(lambda: engine._lock._waiting == 1)
        asking.join(WAIT)
    assert len(got) == 1
    return got[0]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_read_that_finds_the_lock_taken_waits_on_the_loop_only_with_threads(
        serve: Serve, monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """With two threads it waits for the lock on the event loop; with one it goes to a
    read thread, as before."""
    monkeypatch.setattr(server_module, "LOCK_WAIT_SECONDS", WAIT)
    engine, server, address, handle = serve(threads)
    answer = _invoke_while_held(engine, address, handle)
    assert answer.rows == [(a,) for a in range(3, 10)]
    if threads == 2:
        assert engine.ran_on == ["psoup-server"]
    else:
        assert len(engine.ran_on) == 1 and engine.ran_on[0].startswith("psoup-read")
        assert not server._lock_wait


def test_a_wait_that_runs_out_hands_the_reads_over_until_the_lock_is_free(
        serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "LOCK_WAIT_SECONDS", 0.05)
    engine, server, address, handle = serve(2)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        sock.sendall(pack_frame({"id": 0, "op": "hello",
                                 "args": {"token": TOKEN, "protocol": PROTOCOL}}))
        assert read_reply(sock)["ok"]
        with engine.locked():                 # a long write
            sock.sendall(b"".join(pack_frame({"id": i, "op": "invoke",
                                              "args": {"handle": handle}})
                                  for i in range(1, 4)) + pack_frame({"id": 4, "op": "ping"}))
            _wait_for(lambda: server._waited_out and engine._lock._waiting >= 1)
        replies = [read_reply(sock) for _ in range(4)]
        assert [r["id"] for r in replies] == [1, 2, 3, 4] and all(r["ok"] for r in replies)
        assert all(name.startswith("psoup-read") for name in engine.ran_on)
        sock.sendall(pack_frame({"id": 5, "op": "invoke", "args": {"handle": handle}}))
        assert read_reply(sock)["ok"]
    assert engine.ran_on[-1] == "psoup-server" and not server._waited_out


# ---------------------------------------------------------------- front processes


class _Started(Exception):
    """Raised by a fake Server in place of serving (run_server then stops)."""


@pytest.mark.parametrize(("threads", "asked", "fronts"),
                         [(1, None, 0), (2, None, 1), (3, None, 1), (2, 1, 1), (1, 2, 2),
                          (2, 0, 0)])
def test_serve_starts_the_fronts_it_is_told_and_one_by_default_beside_threads(
        monkeypatch: pytest.MonkeyPatch, threads: int, asked: int | None,
        fronts: int) -> None:
    """`psoup serve --fronts N` starts N front processes, whatever the threads; unless
    told, one when the server has more than one thread, else none."""
    seen: list[int] = []

    class Fake(Server):
        def start_in_thread(self) -> tuple[str, int]:
            seen.append(self.fronts)
            raise _Started
    monkeypatch.setattr(server_module, "Server", Fake)
    with pytest.raises(_Started):
        server_module.run_server(None, port=0, token=TOKEN, threads=threads,
                                 fronts=asked, echo=lambda _: None)
    assert seen == [fronts]


def _front_pids(server: Server) -> list[int]:
    assert server._fronts is not None
    return [proc.pid for proc in server._fronts.procs()]


def test_a_front_killed_mid_request_loses_nothing_and_is_replaced(
        engine_with_front: tuple[Engine, Server, str]) -> None:
    engine, server, address = engine_with_front
    host, port = address.rsplit(":", 1)
    with Client(address, token=TOKEN, timeout=WAIT) as client:
        client.execute("CREATE STREAM R (a INT)")
        handle = client.register(QUERY)
        client.insert("R", {"a": [5, 6]}, ts=[1.0, 2.0])
    (killed,) = _front_pids(server)
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        sock.sendall(pack_frame({"id": 0, "op": "hello",
                                 "args": {"token": TOKEN, "protocol": PROTOCOL}}))
        assert read_reply(sock)["ok"]
        with engine.locked():            # the insert reaches the writer, which waits
            sock.sendall(pack_frame({"id": 1, "op": "insert", "args": {
                "stream": "R", "columns": {"a": [7, 8, 9]}, "ts": [3.0, 4.0, 5.0]}}))
            _wait_for(lambda: engine._lock._waiting >= 1)
            os.kill(killed, signal.SIGKILL)
            # the connection drops with the front, its request still in the engine
            assert read_reply(sock) is None
    _wait_for(lambda: len(_front_pids(server)) == 1 and _front_pids(server) != [killed])
    with Client(address, token=TOKEN, timeout=WAIT) as again:    # through the new front
        assert again.invoke(handle).rows == [(5,), (6,), (7,), (8,), (9,)]


def test_the_fronts_exit_when_the_server_stops(
        engine_with_front: tuple[Engine, Server, str]) -> None:
    _, server, address = engine_with_front
    with Client(address, token=TOKEN, timeout=WAIT) as client:
        assert client.ping() == "pong"
    assert server._fronts is not None
    procs = server._fronts.procs()
    server.stop()
    assert procs and all(proc.poll() is not None for proc in procs)


@pytest.fixture
def engine_with_front(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Server, str]]:
    """A server whose every connection a front relays."""
    monkeypatch.setattr(server_module, "DIRECT_CONNECTIONS", 0)
    engine = Engine(clock=Clock(1000.0))
    server = Server(engine, port=0, token=TOKEN, fronts=1)
    host, port = server.start_in_thread()
    yield engine, server, f"{host}:{port}"
    server.stop()


def test_the_first_connections_are_served_directly_and_the_rest_through_a_front(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "DIRECT_CONNECTIONS", 2)
    server = Server(Engine(), port=0, token=TOKEN, fronts=1)
    host, port = server.start_in_thread()
    try:
        clients = [Client(f"{host}:{port}", token=TOKEN, timeout=WAIT) for _ in range(3)]
        assert all(client.ping() == "pong" for client in clients)
        assert server._fronts is not None
        (front,) = server._fronts.fronts.values()
        assert server._direct == 2 and len(front.channel.conns) == 1
        clients[0].close()                 # room again: the next one is served directly
        _wait_for(lambda: server._direct == 1)
        clients.append(Client(f"{host}:{port}", token=TOKEN, timeout=WAIT))
        assert clients[-1].ping() == "pong" and server._direct == 2
        for client in clients[1:]:
            client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("values", [
    [np.array([3, -1, 2**62]), np.array([0.5, -2.0, 1e300]), np.array([True, False, True])],
    [np.array([1, 2, 3], dtype=np.uint8), np.array([1.5, 2.5, 3.5], dtype=np.float32)],
    [np.zeros(0, dtype=np.int64)],
])
def test_an_answer_a_front_encodes_is_the_frame_the_server_would_send(
        values: list[NDArray[Any]]) -> None:
    n = len(values[0])
    answer = Result([f"c{i}" for i in range(len(values))], None,
                    np.arange(n, dtype=np.float64) + 0.25, np.arange(n) * 7, cursor="cur",
                    values=values)
    assert relayable(answer)
    want = pack_frame(ok_reply(41, encode_answer(answer)))

    async def relayed() -> bytes:
        mine, theirs = socket.socketpair()
        with mine, theirs:
            channel = Channel(cast(Any, None), cast(Any, None), lambda _: None)
            channel.sender = _Sender(mine, 1 << 20, lambda _: None)
            channel.send_answer(5, 41, answer)
            channel.flush()
            channel.sender.close()
            mine.close()                # (the sender wrote through a descriptor of its own)
            return _read_all(theirs)
    sent = asyncio.run(relayed())
    kind, conn, size = MESSAGE.unpack_from(sent)
    assert (kind, conn, len(sent)) == (ANSWER, 5, MESSAGE.size + size)
    assert answer_frame(sent[MESSAGE.size:]) == want


def _read_all(sock: socket.socket) -> bytes:
    """Everything `sock` receives until its peer closes."""
    sock.setblocking(True)
    got = bytearray()
    while chunk := sock.recv(1 << 16):
        got += chunk
    return bytes(got)


def test_a_channel_s_sender_keeps_order_and_pauses_past_its_limit() -> None:
    """What the socket does not take waits, in order, and goes when it has room; the
    writers are told to wait past the limit and to go on once a quarter of it waits."""
    told: list[bool] = []
    parts = [bytes([k]) * (50_000 + k) for k in range(60)]     # ~3 MB, past any buffer

    async def sent() -> tuple[bytes, list[bool], int]:
        mine, theirs = socket.socketpair()
        with mine, theirs:
            sender = _Sender(mine, 1 << 20, told.append)
            for k in range(0, len(parts), 3):
                sender.send([memoryview(parts[k]), parts[k + 1], parts[k + 2]])
            waited = sender.bytes
            reader = asyncio.get_running_loop().run_in_executor(None, _read_all, theirs)
            closed = asyncio.get_running_loop().create_future()

            def done() -> None:
                mine.close()
                closed.set_result(None)
            sender.close_after(done)
            await closed
            return await reader, list(told), waited
    got, said, waited = asyncio.run(sent())
    assert waited > 1 << 20, "the socket took only part of it at once"
    assert got == b"".join(parts)
    assert said == [True, False]


def test_answers_a_front_may_not_encode_are_encoded_by_the_server() -> None:
    ts, ids = np.array([1.0]), np.array([1])
    assert not relayable(Result(["a"], None, ts, ids, values=[np.array(["x"], dtype=object)]))
    assert not relayable(Result(["a"], [(1,)], ts, ids))                     # rows
    assert not relayable(Result(["a"], None, ts, ids, values=[np.array([1])], keys=[(1,)]))
    assert not relayable(Result(["a"], None, ts, np.array([[1, 2]]), values=[np.array([1])]))
    assert relayable(Result(["a"], None, ts, ids, values=[np.array([1])]))
