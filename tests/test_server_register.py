"""A registration over a large store through the server (issue 37, "no client stalls
another"): its scan runs on a registration thread, not the writer's, so another
client's inserts are applied (and answered) while it scans; the registration still
answers as one made on a quiet stream, its connection's writes keep their order, and
an error in its scan is its error reply with nothing registered."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from psoup import Client, Engine
from psoup.core import OFF_LOCK_ROWS, Ahead
from psoup.errors import LimitError, PSoupError
from psoup.results.result import Result
from psoup.server import Server
from psoup.server.protocol import PROTOCOL, pack_frame
from tests.support import read_reply

TOKEN = "test-token"
#: How long a client waits for a reply, or a test for a thread: only a hang reaches it.
WAIT = 60.0
#: How long an insert may take while a registration scans before the test calls it stalled.
APPLIED_WITHIN = 10.0
N = OFF_LOCK_ROWS + 20_000       # above it, a registration scans off the engine lock
MORE = 1_000
CREATE = "CREATE STREAM traffic (lane INT, zone INT, speed FLOAT)"
SELECTION = "SELECT lane, speed FROM traffic WHERE speed < 30 AND lane = 3"
GROUPED = "SELECT lane, COUNT(*), SUM(zone), MAX(speed) FROM traffic GROUP BY lane"

Columns = dict[str, NDArray[Any]]


def _columns(n: int, seed: int) -> Columns:
    rng = np.random.default_rng(seed)
    return {"lane": rng.integers(0, 8, n), "zone": rng.integers(-2, 2, n),
            "speed": rng.random(n) * 100}


def _ts(start: int, n: int) -> NDArray[np.float64]:
    return np.arange(start, start + n, dtype=np.float64)


class Gate:
    """Ahead.run made to wait until `release`: `entered` once a scan waits, `threads`
    the names of the threads the scans ran on."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[str] = []


@pytest.fixture
def engine() -> Engine:
    return Engine()


@pytest.fixture
def address(engine: Engine) -> Iterator[str]:
    server = Server(engine, port=0, token=TOKEN)
    host, port = server.start_in_thread()
    yield f"{host}:{port}"
    server.stop()


@pytest.fixture
def connect(address: str) -> Iterator[Callable[[], Client]]:
    clients: list[Client] = []

    def make() -> Client:
        clients.append(Client(address, token=TOKEN, timeout=WAIT))
        return clients[-1]
    yield make
    for client in clients:
        client.close()


@pytest.fixture
def gate(address: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """Scans wait at the gate (set up after the server, so released before it stops)."""
    gate, run = Gate(), Ahead.run

    def gated(self: Ahead) -> None:
        gate.threads.append(threading.current_thread().name)
        gate.entered.set()
        assert gate.release.wait(WAIT), "the test never released the scan"
        run(self)
    monkeypatch.setattr(Ahead, "run", gated)
    yield gate
    gate.release.set()


def _filled(client: Client, rows: Columns) -> None:
    client.execute(CREATE)
    client.insert("traffic", rows, ts=_ts(0, N))


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """`call` running on a thread of its own; the dict gets its "value" or "error"."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except Exception as exc:    # handed to the test, which asserts on it
            out["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _quiet(sql: str, parts: list[tuple[Columns, NDArray[np.float64]]]) -> Result:
    """The answer of `sql` registered on an engine holding `parts`, nothing else going on."""
    quiet = Engine()
    quiet.execute(CREATE)
    for rows, ts in parts:
        quiet.insert("traffic", rows, ts=ts)
    return quiet.invoke(quiet.register(sql))


def _same(got: Result, want: Result, exact_ids: bool) -> None:
    assert got.columns == want.columns
    assert sorted(got.rows) == sorted(want.rows)
    if exact_ids:
        assert sorted(got.tuple_ids.tolist()) == sorted(want.tuple_ids.tolist())


@pytest.mark.parametrize("how", ["register", "execute"])
@pytest.mark.parametrize("sql", [SELECTION, GROUPED])
def test_inserts_are_applied_while_a_registration_scans(
        engine: Engine, connect: Callable[[], Client], gate: Gate, how: str,
        sql: str) -> None:
    registrar, producer = connect(), connect()
    rows, more = _columns(N, 7), _columns(MORE, 8)
    _filled(registrar, rows)
    registering, registered = _in_thread(lambda: getattr(registrar, how)(sql))
    assert gate.entered.wait(WAIT)
    with engine.locked(wait=False) as held:
        assert held, "the scan runs off the engine lock"
    inserting, inserted = _in_thread(lambda: producer.insert("traffic", more,
                                                             ts=_ts(N, MORE)))
    inserting.join(APPLIED_WITHIN)
    assert "error" not in inserted
    assert len(inserted.get("value", ())) == MORE, "the insert waited for the scan"
    assert registering.is_alive(), "the registration ended before its scan"
    assert producer.queries() == [], "a handle is published only as its registration ends"
    gate.release.set()
    registering.join(WAIT)
    handle = registered["value"]
    assert [h for h, _ in producer.queries()] == [handle]
    assert gate.threads and all(t.startswith("psoup-register") for t in gate.threads)
    # the rows inserted during the scan are in its answer, once
    _same(registrar.invoke(handle), _quiet(sql, [(rows, _ts(0, N)), (more, _ts(N, MORE))]),
          exact_ids=sql == SELECTION)


def test_a_connection_s_later_writes_follow_its_registration(
        engine: Engine, connect: Callable[[], Client], address: str, gate: Gate) -> None:
    rows = _columns(N, 7)
    _filled(connect(), rows)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        sock.sendall(pack_frame({"id": 0, "op": "hello",
                                 "args": {"token": TOKEN, "protocol": PROTOCOL}}))
        assert read_reply(sock)["ok"]
        extra = [[3, 0, 1.5], [3, 1, 2.5]]
        sock.sendall(b"".join(pack_frame(frame) for frame in (
            {"id": 1, "op": "register", "args": {"sql": SELECTION}},
            {"id": 2, "op": "insert", "args": {"stream": "traffic", "rows": extra,
                                                "ts": [float(N), float(N + 1)]}},
            {"id": 3, "op": "execute", "args": {"sql": "DROP STREAM traffic"}})))
        assert gate.entered.wait(WAIT)
        assert not gate.release.wait(0.3)      # time for a later write to overtake it
        assert engine.streams() == ["traffic"]
        assert engine.describe("traffic")["rows"] == N, "the insert waits for its turn"
        gate.release.set()
        replies = [read_reply(sock) for _ in range(3)]
    assert [r["id"] for r in replies] == [1, 2, 3]
    assert replies[0]["ok"] and replies[1]["ok"], replies
    # the drop came after the registration, which now reads the stream
    assert not replies[2]["ok"] and replies[2]["error"]["code"] == "query"
    handle = replies[0]["result"]
    want = _quiet(SELECTION, [(rows, _ts(0, N)), (
        {"lane": np.array([3, 3]), "zone": np.array([0, 1]), "speed": np.array([1.5, 2.5])},
        _ts(N, 2))])
    _same(engine.invoke(handle), want, exact_ids=True)


@pytest.mark.parametrize("error, code", [(RuntimeError("the scan broke"), "internal"),
                                         (LimitError("too much for the scan"), "limit")])
def test_an_error_in_the_scan_is_the_registration_s_reply(
        engine: Engine, connect: Callable[[], Client], monkeypatch: pytest.MonkeyPatch,
        error: Exception, code: str) -> None:
    client = connect()
    _filled(client, _columns(N, 7))
    run = Ahead.run

    def broken(self: Ahead) -> None:
        raise error
    monkeypatch.setattr(Ahead, "run", broken)
    with pytest.raises(PSoupError) as raised:
        client.register(GROUPED)
    assert raised.value.code == code and str(error) in str(raised.value)
    assert client.queries() == [] and engine.queries() == []
    monkeypatch.setattr(Ahead, "run", run)
    handle = client.register(GROUPED)          # the server goes on as before
    assert [h for h, _ in client.queries()] == [handle]


def test_a_registration_made_beside_inserts_is_durable(tmp_path: Path) -> None:
    rows, more = _columns(N, 7), _columns(MORE, 8)
    engine = Engine(tmp_path / "state", sync="group")
    server = Server(engine, port=0, token=TOKEN)
    host, port = server.start_in_thread()
    try:
        with Client(f"{host}:{port}", token=TOKEN, timeout=WAIT) as a, \
                Client(f"{host}:{port}", token=TOKEN, timeout=WAIT) as b:
            _filled(a, rows)
            registering, registered = _in_thread(lambda: a.register(GROUPED))
            b.insert("traffic", more, ts=_ts(N, MORE))
            registering.join(WAIT)
            handle = registered["value"]
    finally:
        server.stop()
        engine.close()
    with Engine(tmp_path / "state") as again:
        assert [h for h, _ in again.queries()] == [handle]
        _same(again.invoke(handle), _quiet(GROUPED, [(rows, _ts(0, N)), (more, _ts(N, MORE))]),
              exact_ids=False)
