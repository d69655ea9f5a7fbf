"""Live overload: producers that send faster than the engine applies are held back by a
bounded ingest queue (Limits.max_queued_bytes): an insert beyond it gets a "busy"
reply with a retry_after and nothing applied, the client waits and sends it again by
itself, and nothing is lost, duplicated or reordered. A real Server on loopback, real
Clients, a raw socket for the wire reply."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias, cast

import numpy as np
import pytest

from psoup import Client, Engine
from psoup.errors import Busy
from psoup.server import Limits, Server
from psoup.server.protocol import PROTOCOL, pack_frame
from tests.support import Clock, read_reply

#: The `served` fixture: make(limits, seconds=0.0, gate=None) -> (engine, server, address).
Served: TypeAlias = Callable[..., tuple[Engine, Server, str]]

TOKEN = "bp-token"


def _until(predicate: Callable[[], bool], seconds: float = 60.0) -> None:
    """Wait for `predicate`: a bound only a hang reaches, where a fixed sleep would be a
    guess at how fast a loaded machine is."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _slowed(engine: Engine, seconds: float, gate: threading.Event | None = None) -> None:
    """Make each insert of `engine` take `seconds` longer (or wait for `gate`), as an
    engine that cannot keep up would."""
    insert = engine.insert

    def slow(*args: Any, **kwargs: Any) -> Any:
        if gate is not None:
            gate.wait(120)           # the tests open it; the bound only ends a hang
        time.sleep(seconds)
        return insert(*args, **kwargs)
    engine.insert = slow  # type: ignore[method-assign]  # this engine's inserts made slow


@pytest.fixture
def served() -> Iterator[Served]:
    servers: list[tuple[Server, threading.Event | None]] = []

    def make(limits: Limits, seconds: float = 0.0,
             gate: threading.Event | None = None) -> tuple[Engine, Server, str]:
        engine = Engine(clock=Clock(0.0))
        engine.execute("CREATE STREAM S (p INT, k INT)")
        _slowed(engine, seconds, gate)
        server = Server(engine, port=0, token=TOKEN, limits=limits)
        host, port = server.start_in_thread()
        servers.append((server, gate))
        return engine, server, f"{host}:{port}"
    yield make
    for server, gate in servers:
        if gate is not None:
            gate.set()
        server.stop()


def _stored(engine: Engine) -> dict[str, np.ndarray]:
    """The rows S holds, in the order they were applied (they share one ts), as a
    query over S answers them."""
    return engine.invoke(engine.register("SELECT p, k FROM S")).to_numpy()


def _batch(producer: int, start: int, n: int) -> dict[str, Any]:
    return {"p": np.full(n, producer), "k": np.arange(start, start + n)}


def test_producers_faster_than_ingest_are_held_back_and_lose_nothing(served: Served) -> None:
    """Three producers pipeline 120 batches each into an engine that takes 5 ms a batch
    (they could send ~10x faster): the queue never holds more than its limit, busy
    replies are sent, and every row arrives once, each producer's in order."""
    rows, batches = 20, 120
    frame = len(pack_frame({"id": 1, "op": "insert", "args": {
        "stream": "S", **_batch(0, 0, rows), "ts": 0.0, "chain": True, "producer": "x" * 32,
        "seq": 1}}))
    limit = 4 * frame
    engine, server, address = served(Limits(max_queued_bytes=limit), seconds=0.005)
    errors: list[BaseException] = []

    def produce(p: int) -> None:
        try:
            with Client(address, token=TOKEN, batch_rows=rows, busy_timeout=30) as client:
                client.insert("S", _batch(p, 0, rows * batches), ts=1.0)
        except BaseException as exc:           # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=produce, args=(p,)) for p in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    queue = server.queue_stats()
    assert queue["busy_replies"] > 0, "the producers were faster than the engine"
    assert queue["peak_bytes"] <= limit
    assert queue["inserts"] == queue["bytes"] == 0
    stored = _stored(engine)
    for p in range(3):
        keys = stored["k"][stored["p"] == p]
        assert keys.tolist() == list(range(rows * batches)), f"producer {p}"


def test_a_busy_reply_says_when_to_come_back_and_applies_nothing(served: Served) -> None:
    """Over the wire: with the writer held up, an insert past the limit gets "busy" with
    retry_after, the one chained after it "skipped", and neither is ever applied;
    stats show the queue (its inserts, bytes and lag) meanwhile."""
    gate = threading.Event()
    engine, server, address = served(Limits(max_queued_bytes=200), gate=gate)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        def send(request_id: int, op: str, args: dict[str, Any]) -> None:
            sock.sendall(pack_frame({"id": request_id, "op": op, "args": args}))
        send(0, "hello", {"token": TOKEN, "protocol": PROTOCOL})
        assert read_reply(sock)["ok"]
        send(1, "insert", {"stream": "S", "rows": [(1, 1)], "ts": 1.0})    # taken, held up
        send(2, "insert", {"stream": "S", "rows": [(2, i) for i in range(200)], "ts": 1.0})
        send(3, "insert", {"stream": "S", "rows": [(3, 3)], "ts": 1.0, "chain": True})
        with Client(address, token=TOKEN) as watcher:
            def seen() -> dict[str, Any]:
                return cast(dict[str, Any], watcher.stats()["ingest_queue"])
            _until(lambda: seen()["busy_replies"] == 1 and seen()["lag_s"] >= 0.1)
            queue = seen()
        assert queue["inserts"] == 1 and 0 < queue["bytes"] <= 200
        assert queue["lag_s"] >= 0.1 and queue["busy_replies"] == 1
        gate.set()
        first, busy, skipped = (read_reply(sock) for _ in range(3))
    assert first["ok"]
    assert busy["error"]["code"] == "busy" and 0 < busy["error"]["retry_after"] <= 5
    assert "max_queued_bytes=200" in busy["error"]["message"]
    assert skipped["error"]["code"] == "skipped"
    assert _stored(engine)["p"].tolist() == [1]


def test_the_client_gives_up_after_its_busy_timeout_and_nothing_is_applied(
        served: Served) -> None:
    gate = threading.Event()
    engine, server, address = served(Limits(max_queued_bytes=200), gate=gate)
    with Client(address, token=TOKEN) as first, \
            Client(address, token=TOKEN, busy_timeout=0.3) as second:
        held = threading.Thread(target=first.insert, args=("S", [(1, 1)], 1.0))
        held.start()
        _until(lambda: server.queue_stats()["inserts"] == 1)    # the first is held up
        t0 = time.monotonic()
        with pytest.raises(Busy, match="busy_timeout"):
            second.insert("S", [(2, i) for i in range(200)], ts=1.0)
        # gave up after its 0.3 s, not once the queue drained (the gate holds it 120 s)
        assert time.monotonic() - t0 < 20
        gate.set()
        held.join(5)
        second.insert("S", [(2, 0)], ts=1.0)    # the queue drained: taken at once
    assert _stored(engine)["p"].tolist() == [1, 2]


#: A server process whose engine takes 20 ms more per insert (an engine that cannot keep
#: up), with a stream B retaining 100,000 rows: argv port, token, max_queued_bytes.
SLOW_SERVER = """
import sys, threading, time
from psoup import Engine
from psoup.server import Limits, Server
engine = Engine()
engine.execute("CREATE STREAM B (p INT, k INT) RETAIN 100000 ROWS")
insert = engine.insert
def slow(*args, **kwargs):
    time.sleep(0.02)
    return insert(*args, **kwargs)
engine.insert = slow
server = Server(engine, host="127.0.0.1", port=int(sys.argv[1]), token=sys.argv[2],
                limits=Limits(max_queued_bytes=int(sys.argv[3])))
server.start_in_thread()
threading.Event().wait()
"""


def _rss(pid: int) -> int:
    """A process's resident set, in bytes (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _pushed(limit: int) -> tuple[int, int]:
    """Six producers on raw sockets each send 16 inserts of 1 MiB back to back, without
    waiting for replies (a producer that ignores busy), into a server process whose
    engine applies a batch in 20 ms: (how far the server's resident memory rose above
    where it was when they started, the busy replies they got)."""
    import subprocess
    import sys

    from tests.support import free_port, wait_listening

    rows, batches, producers = 1 << 16, 16, 6          # 2 INT columns: 1 MiB a batch
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SERVER, str(port), TOKEN, str(limit)])
    try:
        wait_listening(proc, port)
        frame = pack_frame({"id": 0, "op": "insert", "args": {
            "stream": "B", "columns": {"p": np.zeros(rows, np.int64),
                                       "k": np.arange(rows)}, "ts": 1.0}})
        socks = []
        for _ in range(producers):
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            sock.sendall(pack_frame({"id": 0, "op": "hello",
                                     "args": {"token": TOKEN, "protocol": PROTOCOL}}))
            assert read_reply(sock)["ok"]
            sock.sendall(frame)                     # warm: code paths, buffers
            assert read_reply(sock)["ok"]
            socks.append(sock)
        base, peak, stop = _rss(proc.pid), [0], threading.Event()

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], _rss(proc.pid))
                time.sleep(0.005)
        watcher = threading.Thread(target=watch)
        watcher.start()
        senders = [threading.Thread(target=lambda s=s: [s.sendall(frame)
                                                        for _ in range(batches)])
                   for s in socks]
        for t in senders:
            t.start()
        replies = [read_reply(s) for s in socks for _ in range(batches)]
        for t in senders:
            t.join()
        stop.set()
        watcher.join()
        for s in socks:
            s.close()
        busy = sum(not r["ok"] for r in replies)
        assert all(r["ok"] or r["error"]["code"] == "busy" for r in replies)
        return peak[0] - base, busy
    finally:
        proc.kill()
        proc.wait()


def test_memory_stays_bounded_while_producers_push_faster_than_ingest() -> None:
    """Producers that send far faster than the engine applies and never wait: with a
    4 MiB queue the server's memory rises by no more than the queue plus the frames it
    may have read and not answered (max_in_flight per connection), the rest refused
    busy; with an unbounded queue (1 GiB) it holds everything sent and not yet
    applied, several times that bound."""
    limit = 4 << 20
    bound = limit + 6 * Limits().max_in_flight * (1 << 20)
    bounded, busy = _pushed(limit)
    unbounded, none = _pushed(1 << 30)
    assert busy > 0 and none == 0
    assert bounded <= bound, f"rose {bounded / 2**20:.1f} MiB, bound {bound / 2**20:.0f}"
    assert unbounded > 2 * bound, (unbounded / 2**20, bounded / 2**20)
