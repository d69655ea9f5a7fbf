"""The server with more than one thread (`--threads`): a read on the event loop that
finds the engine lock taken waits for it a moment (LOCK_WAIT_SECONDS) and runs there,
instead of going to a read thread at once (a handoff between cores costs more than a
short write's wait); a wait that runs out hands it over as before, and later reads do
not wait until the loop finds the lock free again. With one thread nothing waits:
today's server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from psoup import Client, Engine
from psoup.results.result import Result
from psoup.server import Server
from psoup.server import server as server_module
from psoup.server.protocol import PROTOCOL, pack_frame
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


def test_with_two_threads_a_read_waits_for_the_lock_on_the_loop(
        serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "LOCK_WAIT_SECONDS", WAIT)
    engine, _, address, handle = serve(2)
    answer = _invoke_while_held(engine, address, handle)
    assert answer.rows == [(a,) for a in range(3, 10)]
    assert engine.ran_on == ["psoup-server"]


def test_with_one_thread_a_read_that_finds_the_lock_taken_goes_to_a_read_thread(
        serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "LOCK_WAIT_SECONDS", WAIT)
    engine, server, address, handle = serve(1)
    answer = _invoke_while_held(engine, address, handle)
    assert answer.rows == [(a,) for a in range(3, 10)]
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
