"""The psoup service end to end: a real Server on loopback, real Clients, raw sockets for
what a well-behaved client never sends (docs/protocol.md)."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from numpy.typing import NDArray

import psoup
from psoup import Client, Engine
from psoup.client import OutcomeUnknown
from psoup.config import token_path
from psoup.errors import CursorExpired, PSoupError, QueryError, SchemaError, UnknownHandle
from psoup.results.result import Changes, Result
from psoup.server import Limits, Server
from psoup.server import server as server_module
from psoup.server.protocol import HEADER, PROTOCOL, ProtocolError, decode_answer, pack_frame
from tests.support import Clock, read_reply

TOKEN = "test-token"
#: How long a test's client or raw socket waits for a reply: only a hang should reach it.
WAIT = 60.0
LIMITS = Limits(max_frame_bytes=1 << 20, max_batch_rows=5_000, max_query_chars=2_000,
                max_factors=8, read_timeout=0.5)
QUERY = "SELECT a, name FROM R WHERE a > 2 AND b <= 40 BEGIN NOW - 50 END NOW"

#: A fixture's client factory: Client(address, token, timeout) with these keywords added.
Connect = Callable[..., Client]
#: What `populated` holds: the handle of QUERY, and snapshot() of the server's state.
Snapshot = tuple[list[tuple[str, str]], list[tuple[Any, ...]], list[Any]]
Populated = tuple[str, Callable[[], Snapshot]]


@pytest.fixture
def engine() -> Engine:
    return Engine(clock=Clock(1000.0))


@pytest.fixture(params=[0, 1], ids=["in-process", "front"])
def fronts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """A server under test serves its connections itself, and has a front process
    (psoup.server.front) relay every one of them, which must not change what a client
    sees."""
    monkeypatch.setattr(server_module, "DIRECT_CONNECTIONS", 0)
    count: int = request.param
    return count


@pytest.fixture
def server(engine: Engine, fronts: int) -> Iterator[Server]:
    srv = Server(engine, port=0, token=TOKEN, limits=LIMITS, fronts=fronts)
    srv.start_in_thread()
    yield srv
    srv.stop()


@pytest.fixture
def address(server: Server) -> str:
    assert server.address is not None
    host, port = server.address
    return f"{host}:{port}"


@pytest.fixture
def connect(address: str) -> Iterator[Connect]:
    clients = []

    def make(**kwargs: Any) -> Client:
        client = Client(address, token=TOKEN, timeout=WAIT, **kwargs)
        clients.append(client)
        return client
    yield make
    for client in clients:
        client.close()


def _rows(start: int, n: int) -> tuple[list[tuple[int, int, str]], list[float]]:
    """n rows of R (a INT, b INT, name TEXT), with one timestamp each."""
    a = [(start + i) % 7 for i in range(n)]
    b = [(start + i) * 3 % 50 for i in range(n)]
    names = [f"n{start + i}" for i in range(n)]
    ts = [100.0 + start + i for i in range(n)]
    return list(zip(a, b, names, strict=True)), ts


def _setup(target: Engine | Client) -> str:
    """The same stream and query on an Engine or a Client; returns the handle."""
    target.execute("CREATE STREAM R (a INT, b INT, name TEXT)")
    return target.register(QUERY)


def client_address(client: Client) -> str:
    return f"{client.host}:{client.port}"


def _same(got: Result, want: Result) -> None:
    assert type(got) is type(want)
    assert got.columns == want.columns
    assert got.rows == want.rows
    assert got.ts.tolist() == want.ts.tolist()
    assert got.tuple_ids.tolist() == want.tuple_ids.tolist()


def _decoded(wire: dict[str, Any]) -> Result:
    """The answer of an `invoke` reply given no cursor."""
    answer = decode_answer(wire)
    assert isinstance(answer, Result)
    return answer


class Raw:
    """A socket that speaks the frame format and nothing else."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, op: str, args: dict[str, Any] | None = None, request_id: int = 1) -> Any:
        self.send(pack_frame({"id": request_id, "op": op, "args": args or {}}))
        return self.reply()

    def hello(self) -> dict[str, Any]:
        reply = self.request("hello", {"token": TOKEN, "protocol": PROTOCOL}, request_id=0)
        assert reply["ok"], reply
        info: dict[str, Any] = reply["result"]
        return info

    def reply(self) -> Any:
        """The next reply as msgpack decoded it; None once the server closed."""
        return read_reply(self.sock)

    def at_eof(self) -> bool:
        return self.sock.recv(1) == b""

    def close(self) -> None:
        self.sock.close()


OpenRaw = Callable[[], Raw]


@pytest.fixture
def open_raw(address: str) -> Iterator[OpenRaw]:
    """Open raw connections to the server; closed after the test."""
    opened = []

    def open_raw() -> Raw:
        host, port = address.rsplit(":", 1)
        opened.append(Raw(socket.create_connection((host, int(port)), timeout=WAIT)))
        return opened[-1]
    yield open_raw
    for conn in opened:
        conn.close()


@pytest.fixture
def populated(connect: Connect) -> Populated:
    """A server holding R, QUERY and 30 rows; returns (handle, snapshot())."""
    client = connect()
    handle = _setup(client)
    rows, ts = _rows(0, 30)
    client.insert("R", rows, ts=ts)

    def snapshot() -> Snapshot:
        with Client(client_address(client), token=TOKEN) as fresh:
            answer = fresh.invoke(handle, now=140.0)
            return fresh.queries(), answer.rows, answer.tuple_ids.tolist()
    return handle, snapshot


# ---------------------------------------------------------------------- hello

def test_wrong_token_is_refused(address: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="psoup.server"), \
            pytest.raises(PSoupError) as err:
        Client(address, token="not-the-token")
    assert err.value.code == "auth"
    # the peer as the request lines name it (docs/cli.md, "Logging"): HOST:PORT
    assert re.fullmatch(r"127\.0\.0\.1:\d+: auth: wrong access token; closing",
                        caplog.messages[-1])


def test_a_refused_token_says_where_the_right_one_is(
        address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    host, port = address.rsplit(":", 1)
    monkeypatch.setenv("PSOUP_TOKEN", "stale")
    with pytest.raises(PSoupError) as err:
        Client(address)
    message = str(err.value)
    assert "pass the server's token as Client(..., token=...) or in the PSOUP_TOKEN " \
        "environment variable" in message
    assert str(token_path(host, int(port))) in message


def test_no_op_is_served_before_hello(open_raw: OpenRaw) -> None:
    raw = open_raw()
    reply = raw.request("queries")
    assert reply["ok"] is False and reply["error"]["code"] == "auth"
    assert raw.at_eof()


def test_hello_names_the_server_and_its_limits(open_raw: OpenRaw) -> None:
    import psoup
    info = open_raw().hello()
    assert info["server"] == "psoup" and info["version"] == psoup.__version__
    assert isinstance(info["server_id"], str) and info["server_id"]
    assert info["limits"]["max_batch_rows"] == LIMITS.max_batch_rows


def test_a_hello_of_another_protocol_version_is_refused_and_closed(open_raw: OpenRaw) -> None:
    raw = open_raw()
    reply = raw.request("hello", {"token": TOKEN}, request_id=0)      # version 1: rows
    assert reply["ok"] is False and reply["error"]["code"] == "protocol"
    assert "protocol 1" in reply["error"]["message"] and raw.at_eof()


def test_a_client_and_server_of_other_protocol_versions_do_not_talk(
        monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    import psoup.client
    monkeypatch.setattr(psoup.client, "PROTOCOL", PROTOCOL + 1)
    with pytest.raises(PSoupError, match="protocol"):
        Client(address, token=TOKEN)


def test_token_comes_from_the_environment(address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSOUP_TOKEN", TOKEN)
    with Client(address) as client:
        assert client.ping() == "pong"


# ---------------------------------------------------------------------- answers

def test_disconnected_client_gets_the_embedded_answer(connect: Connect) -> None:
    embedded = Engine(clock=Clock(1000.0))
    handle_here = _setup(embedded)
    registrar = connect()
    handle = _setup(registrar)
    registrar.close()                     # the registering client goes away
    producer = connect()
    for start in (0, 40, 80):
        rows, ts = _rows(start, 40)
        producer.insert("R", rows, ts=ts)
        embedded.insert("R", rows, ts=ts)
    producer.close()
    later = connect()                     # and comes back on a new connection
    for now in (130.0, 160.0, 250.0):
        _same(later.invoke(handle, now=now), embedded.invoke(handle_here, now=now))
    assert len(later.invoke(handle, now=160.0)) > 0


def test_columns_fast_path_and_rows_give_the_same_answer(connect: Connect) -> None:
    client = connect()
    client.execute("CREATE STREAM P (a INT, x FLOAT, ok BOOL, name TEXT)")
    client.execute("CREATE STREAM Q (a INT, x FLOAT, ok BOOL, name TEXT)")
    hp = client.register("SELECT a, x, ok, name FROM P WHERE x < 0.5 AND a >= 2")
    hq = client.register("SELECT a, x, ok, name FROM Q WHERE x < 0.5 AND a >= 2")
    rng = np.random.default_rng(3)
    cols = {"a": rng.integers(0, 5, 500), "x": rng.random(500), "ok": rng.random(500) < 0.5,
            "name": np.array([f"s{i}" for i in range(500)], dtype=object)}
    ts = np.arange(500, dtype=np.float64)
    client.insert("P", cols, ts=ts)
    client.insert("Q", [tuple(v[i].item() if hasattr(v[i], "item") else v[i]
                              for v in cols.values()) for i in range(500)], ts=ts.tolist())
    p, q = client.invoke(hp, now=600.0), client.invoke(hq, now=600.0)
    assert len(p) > 50
    assert p.rows == q.rows and p.ts.tolist() == q.ts.tolist()


def test_insert_returns_the_tuple_ids(connect: Connect) -> None:
    client = connect()
    _setup(client)
    first = client.insert("R", *_rows(0, 3))
    second = client.insert("R", {"a": np.array([1]), "b": np.array([2]),
                                 "name": ["z"]}, ts=200.0)
    assert first.dtype == np.int64 and first.tolist() == [0, 1, 2]
    assert second.tolist() == [3]


def test_insert_beyond_the_server_batch_limit_is_split(connect: Connect) -> None:
    client = connect()
    client.execute("CREATE STREAM S (a INT)")
    handle = client.register("SELECT a FROM S WHERE a >= 0")
    n = 2 * LIMITS.max_batch_rows + 123
    ids = client.insert("S", {"a": np.arange(n)}, ts=np.arange(n, dtype=np.float64))
    assert ids.tolist() == list(range(n))
    assert client.invoke(handle, now=float(n)).tuple_ids.tolist() == list(range(n))


def test_failure_in_a_later_batch_names_the_stored_rows(connect: Connect) -> None:
    client = connect(batch_rows=10)
    client.execute("CREATE STREAM S (a INT)")
    with pytest.raises(SchemaError, match=r"rows 10\.\.19 of an insert of 25; rows 0\.\.9 "
                                          r"were stored"):
        client.insert("S", [(1,)] * 15 + [("x",)] + [(1,)] * 9, ts=1.0)
    assert client.stats()["streams"]["S"]["rows"] == 10


def test_pipelined_requests_are_answered_in_order_and_reads_see_earlier_writes(
        open_raw: OpenRaw, populated: Populated) -> None:
    handle, _ = populated
    raw = open_raw()
    raw.hello()
    frames = [pack_frame({"id": 10, "op": "insert",
                          "args": {"stream": "R", "rows": [[5, 1, "late"]], "ts": 139.0}}),
              pack_frame({"id": 11, "op": "invoke", "args": {"handle": handle, "now": 140.0}}),
              pack_frame({"id": 12, "op": "ping", "args": {}})]
    raw.send(b"".join(frames))                  # all three before reading any reply
    replies = [raw.reply() for _ in frames]
    assert [r["id"] for r in replies] == [10, 11, 12]
    assert all(r["ok"] for r in replies), replies
    assert (5, "late") in _decoded(replies[1]["result"]).rows


def test_chained_batch_after_a_rejected_one_is_skipped(
        open_raw: OpenRaw, populated: Populated) -> None:
    _, snapshot = populated
    before = snapshot()
    raw = open_raw()
    raw.hello()
    bad = {"stream": "R", "rows": [["not an int", 1, "x"]], "ts": 150.0}
    good = {"stream": "R", "rows": [[6, 1, "y"]], "ts": 151.0}
    raw.send(pack_frame({"id": 1, "op": "insert", "args": bad}) +
             pack_frame({"id": 2, "op": "insert", "args": dict(good, chain=True)}))
    first, second = raw.reply(), raw.reply()
    assert first["error"]["code"] == "schema"
    assert second["error"]["code"] == "skipped"
    assert snapshot() == before
    assert raw.request("insert", dict(good, chain=True), request_id=3)["error"]["code"] == \
        "skipped"
    assert raw.request("insert", good, request_id=4)["ok"]     # an unchained write resets


def test_queries_and_stats_over_the_wire_equal_the_engines(
        engine: Engine, connect: Connect, populated: Populated) -> None:
    client = connect()
    assert client.queries() == engine.queries()
    stats = client.stats()
    queue = stats.pop("ingest_queue")             # the server's, beside the engine's
    assert stats == engine.stats()
    assert stats["streams"]["R"]["rows"] == 30
    assert queue["inserts"] == queue["bytes"] == queue["busy_replies"] == 0
    assert 0 < queue["peak_bytes"] < queue["limit_bytes"] == LIMITS.max_queued_bytes


# ---------------------------------------------------------------------- bad frames

@pytest.mark.parametrize("frame, code", [
    (HEADER.pack(1) + b"\xc1", "bad_frame"),                         # not msgpack
    (pack_frame([1, 2, 3]), "bad_frame"),                            # not a map
    (pack_frame({"id": 5, "args": {}}), "bad_frame"),                # no op
    (HEADER.pack(LIMITS.max_frame_bytes + 1), "frame_too_large"),    # announced, not sent
])
def test_bad_frame_gets_one_error_then_the_connection_closes(
        open_raw: OpenRaw, populated: Populated, frame: bytes, code: str) -> None:
    _, snapshot = populated
    before = snapshot()
    raw = open_raw()
    raw.hello()
    raw.send(frame)
    reply = raw.reply()
    assert reply["ok"] is False and reply["id"] is None and reply["error"]["code"] == code
    assert raw.at_eof()
    assert snapshot() == before


def test_garbage_before_hello_is_refused(open_raw: OpenRaw, populated: Populated) -> None:
    _, snapshot = populated
    before = snapshot()
    raw = open_raw()
    raw.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")   # 'GET ' reads as a 1.2 GB length
    assert raw.reply()["error"]["code"] == "frame_too_large"
    assert raw.at_eof()
    assert snapshot() == before


def test_truncated_frame_then_eof_changes_nothing(open_raw: OpenRaw, populated: Populated) -> None:
    handle, snapshot = populated
    before = snapshot()
    raw = open_raw()
    raw.hello()
    frame = pack_frame({"id": 1, "op": "unregister", "args": {"handle": handle}})
    raw.send(frame[: len(frame) // 2])
    raw.close()
    assert snapshot() == before


def test_half_frame_times_out_and_closes(open_raw: OpenRaw) -> None:
    raw = open_raw()
    raw.hello()
    raw.send(HEADER.pack(100) + b"x" * 10)
    started = time.monotonic()
    assert raw.at_eof()
    # closed by this server's read_timeout (0.5 s), not by the default one (30 s)
    assert time.monotonic() - started < Limits().read_timeout


def test_unknown_op_is_an_error_and_the_connection_stays(
        open_raw: OpenRaw, populated: Populated) -> None:
    _, snapshot = populated
    before = snapshot()
    raw = open_raw()
    raw.hello()
    reply = raw.request("drop_everything", {}, request_id=9)
    assert reply == {"id": 9, "ok": False, "error": reply["error"]}
    assert reply["error"]["code"] == "unknown_op"
    assert raw.request("ping", request_id=10) == {"id": 10, "ok": True, "result": "pong"}
    assert snapshot() == before


@pytest.mark.parametrize("op, args", [
    ("insert", {"stream": "R", "rows": "abc"}),
    ("insert", {"stream": "R", "rows": [[1, 2, "x"]], "columns": {"a": [1]}}),
    ("insert", {"stream": "R", "columns": {"a": {"dtype": "<i8", "data": b"123"}}}),
    ("insert", {"stream": "R", "rows": [[1, 2, "x"]], "producer": "p"}),
    ("insert", {"stream": "R", "rows": [[1, 2, "x"]], "producer": "p", "seq": "0"}),
    ("invoke", {"handle": 7}),
    ("create_stream", {"name": "T", "columns": [["a"]]}),
    ("register", {}),
])
def test_bad_arguments_are_an_error_and_the_connection_stays(
        open_raw: OpenRaw, populated: Populated, op: str, args: dict[str, Any]) -> None:
    _, snapshot = populated
    before = snapshot()
    raw = open_raw()
    raw.hello()
    reply = raw.request(op, args)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_args"
    assert raw.request("ping")["ok"]
    assert snapshot() == before


def test_limits_refuse_long_sql_too_many_factors_and_big_batches(
        open_raw: OpenRaw, connect: Connect, populated: Populated) -> None:
    _, snapshot = populated
    before = snapshot()
    client = connect()
    long_sql = "SELECT a FROM R WHERE a > 1" + " " * LIMITS.max_query_chars
    many = "SELECT a FROM R WHERE " + " AND ".join(["a > 1"] * (LIMITS.max_factors + 1))
    raw = open_raw()
    raw.hello()
    big = raw.request("insert", {"stream": "R", "rows": [[1, 1, "x"]] *
                                 (LIMITS.max_batch_rows + 1), "ts": 500.0})
    codes = []
    for sql in (long_sql, many):
        with pytest.raises(PSoupError) as err:
            client.register(sql)
        codes.append(err.value.code)
    assert codes == ["limit", "limit"] and big["error"]["code"] == "limit"
    assert snapshot() == before


def test_registrations_beyond_the_servers_max_queries_are_a_limit_error(engine: Engine,
                                                                        fronts: int) -> None:
    srv = Server(engine, port=0, token=TOKEN, limits=Limits(max_queries=1), fronts=fronts)
    host, port = srv.start_in_thread()
    try:
        with Client(f"{host}:{port}", token=TOKEN) as client:
            client.execute("CREATE STREAM R (a INT)")
            client.register("SELECT * FROM R WHERE a > 1")
            with pytest.raises(psoup.LimitError, match="max_queries=1"):
                client.register("SELECT * FROM R WHERE a > 2")
            assert len(client.queries()) == 1
            assert client.stats()["limits"]["max_queries"] == 1
    finally:
        srv.stop()


def test_a_batch_beyond_the_servers_max_stream_bytes_is_a_limit_error(engine: Engine,
                                                                      fronts: int) -> None:
    srv = Server(engine, port=0, token=TOKEN, limits=Limits(max_stream_bytes=24 * 10),
                 fronts=fronts)
    host, port = srv.start_in_thread()
    try:
        with Client(f"{host}:{port}", token=TOKEN) as client:
            client.execute("CREATE STREAM R (a INT)")           # 24 bytes a row
            client.insert("R", [(i,) for i in range(10)], ts=1.0)
            with pytest.raises(psoup.LimitError, match="max_stream_bytes=240"):
                client.insert("R", [(10,)], ts=2.0)
            stats = client.stats()
            assert stats["streams"]["R"]["rows"] == 10
            assert stats["limits"]["stream_bytes"] == {"R": 240}
    finally:
        srv.stop()


def test_connections_beyond_the_limit_are_refused(engine: Engine,
                                                  fronts: int) -> None:
    srv = Server(engine, port=0, token=TOKEN, limits=Limits(max_connections=1), fronts=fronts)
    host, port = srv.start_in_thread()
    try:
        with Client(f"{host}:{port}", token=TOKEN) as first:
            with pytest.raises(PSoupError) as err:
                Client(f"{host}:{port}", token=TOKEN)
            assert err.value.code == "limit"
            assert first.ping() == "pong"
    finally:
        srv.stop()


def test_before_hello_a_frame_may_hold_only_a_few_kib(open_raw: OpenRaw) -> None:
    raw = open_raw()
    raw.send(HEADER.pack(60 << 20))            # announces 60 MiB, under max_frame_bytes
    reply = raw.reply()
    assert reply["ok"] is False and reply["error"]["code"] == "frame_too_large"
    assert "before hello" in reply["error"]["message"] and raw.at_eof()


def test_a_silent_connection_is_closed_after_the_hello_timeout(engine: Engine,
                                                               fronts: int) -> None:
    srv = Server(engine, port=0, token=TOKEN, limits=Limits(hello_timeout=0.3), fronts=fronts)
    host, port = srv.start_in_thread()
    try:
        silent = Raw(socket.create_connection((host, port), timeout=WAIT))
        started = time.monotonic()
        silent.send(b"\x00")                   # a started header, then nothing
        # closed by this server's hello_timeout (0.3 s), not by the default one (5 s)
        assert silent.at_eof() and time.monotonic() - started < Limits().hello_timeout
        silent.close()
    finally:
        srv.stop()


def test_silent_connections_never_keep_a_client_out(engine: Engine, fronts: int) -> None:
    """Sockets that never say hello count apart from authenticated connections, and
    beyond their own quota the oldest is closed: a client still gets in, and one
    already in is never disturbed."""
    srv = Server(engine, port=0, token=TOKEN,
                 limits=Limits(max_connections=2, max_unauthenticated=3, hello_timeout=30.0),
                 fronts=fronts)
    host, port = srv.start_in_thread()
    try:
        with Client(f"{host}:{port}", token=TOKEN) as first:
            silent = [Raw(socket.create_connection((host, port), timeout=WAIT))
                      for _ in range(6)]
            with Client(f"{host}:{port}", token=TOKEN) as second:
                assert first.ping() == second.ping() == "pong"
            assert sum(raw.at_eof() for raw in silent[:3]) == 3   # the oldest made room
            for raw in silent:
                raw.close()
    finally:
        srv.stop()


# ---------------------------------------------------------------------- engine errors

def test_bad_sql_raises_the_engines_query_error(connect: Connect, populated: Populated) -> None:
    _, snapshot = populated
    before = snapshot()
    client = connect()
    bad = "SELECT nope FROM R WHERE a > 1"
    with pytest.raises(QueryError) as over_wire:
        client.register(bad)
    embedded = Engine()
    embedded.execute("CREATE STREAM R (a INT, b INT, name TEXT)")
    with pytest.raises(QueryError) as here:
        embedded.register(bad)
    assert str(over_wire.value) == str(here.value)
    assert snapshot() == before


@pytest.mark.parametrize("rows, ts", [
    ([(1, 2)], 500.0),                    # wrong arity
    ([(1, 2, "x")], 50.0),                # ts below the stream's latest
    ({"a": [1], "b": ["no"], "name": ["x"]}, 500.0),
])
def test_bad_tuples_raise_the_engines_schema_error(
        connect: Connect, populated: Populated, rows: list[tuple[Any, ...]] | dict[str, list[Any]],
        ts: float) -> None:
    _, snapshot = populated
    before = snapshot()
    with pytest.raises(SchemaError) as over_wire:
        connect().insert("R", rows, ts=ts)
    embedded = Engine()
    _setup(embedded)
    embedded.insert("R", *_rows(0, 30))
    with pytest.raises(SchemaError) as here:
        embedded.insert("R", rows, ts=ts)
    assert str(over_wire.value) == str(here.value)
    assert snapshot() == before


def test_unknown_handle_raises_unknown_handle(connect: Connect, populated: Populated) -> None:
    _, snapshot = populated
    before = snapshot()
    client = connect()
    with pytest.raises(UnknownHandle, match="unknown handle"):
        client.invoke("not-a-handle")
    with pytest.raises(UnknownHandle):
        client.unregister("not-a-handle")
    assert snapshot() == before


def test_unregistered_handle_stops_working(connect: Connect, populated: Populated) -> None:
    handle, _ = populated
    client = connect()
    client.unregister(handle)
    assert client.queries() == []
    with pytest.raises(UnknownHandle):
        client.invoke(handle)


# ---------------------------------------------------------------------- cursors

def test_changes_since_a_cursor_compose_to_the_new_answer(connect: Connect) -> None:
    client = connect()
    handle = _setup(client)
    answer = client.invoke(handle, now=100.0)
    assert isinstance(answer, Result) and answer.cursor
    seen = dict(zip(answer.tuple_ids.tolist(), answer.rows, strict=True))
    cursor = answer.cursor
    for start in (0, 40, 80, 120):
        client.insert("R", *_rows(start, 40))
        now = 140.0 + start
        changes = client.invoke(handle, now=now, since=cursor)
        assert isinstance(changes, Changes)
        for tid in changes.deleted.tuple_ids.tolist():
            del seen[tid]
        seen.update(zip(changes.inserted.tuple_ids.tolist(), changes.inserted.rows, strict=True))
        full = client.invoke(handle, now=now)
        assert sorted(seen.items()) == sorted(zip(full.tuple_ids.tolist(), full.rows, strict=True))
        assert len(changes.inserted) > 0
        cursor = changes.cursor
    assert len(changes.deleted) > 0


def test_aggregate_changes_over_the_wire_count_equal_rows_of_two_groups(connect: Connect) -> None:
    client = connect()
    client.execute("CREATE STREAM G (g INT, x INT)")
    handle = client.register("SELECT COUNT(*) FROM G GROUP BY g BEGIN NOW - 50 END NOW")
    client.insert("G", [(1, 0)], ts=1.0)
    first = client.invoke(handle, now=10.0)
    assert first.cursor is not None
    client.insert("G", [(2, 0)], ts=2.0)
    changes = client.invoke(handle, now=10.0, since=first.cursor)
    assert (changes.inserted.rows, changes.deleted.rows) == ([(1,)], [])
    gone = client.invoke(handle, now=60.0, since=changes.cursor)
    assert (gone.inserted.rows, gone.deleted.rows) == ([], [(1,), (1,)])


def test_unknown_cursor_raises_cursor_expired(connect: Connect, populated: Populated) -> None:
    handle, _ = populated
    with pytest.raises(CursorExpired):
        connect().invoke(handle, now=140.0, since="no-such-cursor")


# ---------------------------------------------------------------------- reconnection

@pytest.fixture
def restart(engine: Engine, server: Server) -> Iterator[Callable[[], None]]:
    """Stop the server (closing every connection) and serve the same engine again on the
    same port."""
    servers = []

    def again() -> None:
        assert server.address is not None
        host, port = server.address
        server.stop()
        servers.append(Server(engine, host, port, token=TOKEN, limits=LIMITS))
        servers[-1].start_in_thread()
    yield again
    for srv in servers:
        srv.stop()


def test_client_reconnects_for_a_read_after_the_server_drops_it(
        connect: Connect, restart: Callable[[], None]) -> None:
    client = connect()
    handle = _setup(client)
    client.insert("R", *_rows(0, 20))
    before = client.invoke(handle, now=130.0)
    restart()
    _same(client.invoke(handle, now=130.0), before)


def test_client_reconnects_for_a_write_after_the_server_drops_it(
        connect: Connect, restart: Callable[[], None]) -> None:
    client = connect()
    _setup(client)
    client.insert("R", *_rows(0, 20))
    restart()
    time.sleep(0.05)                      # let the server's close reach the client
    assert client.insert("R", *_rows(20, 5)).tolist() == [20, 21, 22, 23, 24]


class LosingServer:
    """Answers hello, then loses the connection after reading the first request; later
    connections are answered normally. Records every request it read."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests: list[str] = []
        self.args: list[dict[str, Any]] = []
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn, self.connections), daemon=True).start()

    def _talk(self, conn: socket.socket, number: int) -> None:
        raw = Raw(conn)
        with conn:
            while True:
                message = raw.reply()
                if message is None:
                    return
                result: object
                if message["op"] == "hello":
                    result = {"server": "psoup", "server_id": "x", "protocol": PROTOCOL,
                              "limits": {"max_frame_bytes": 1 << 20, "max_batch_rows": 1000}}
                else:
                    self.requests.append(message["op"])
                    self.args.append(message["args"])
                    if number == 1:
                        return                          # the reply is lost
                    result = {"first": 0, "n": 1} if message["op"] == "insert" else "pong"
                conn.sendall(pack_frame({"id": message["id"], "ok": True, "result": result}))

    def close(self) -> None:
        self.listener.close()


def test_read_whose_reply_is_lost_is_retried_once() -> None:
    fake = LosingServer()
    try:
        with Client(fake.address, token="t") as client:
            assert client.ping() == "pong"
        assert fake.requests == ["ping", "ping"] and fake.connections == 2
    finally:
        fake.close()


def test_write_whose_reply_is_lost_has_an_unknown_outcome() -> None:
    fake = LosingServer()
    try:
        with Client(fake.address, token="t") as client:
            with pytest.raises(OutcomeUnknown, match="may or may not"):
                client.register("SELECT a FROM R")
            assert isinstance(OutcomeUnknown("x"), ConnectionError)
        assert fake.requests == ["register"]
    finally:
        fake.close()


def test_insert_whose_reply_is_lost_is_resent_with_the_same_key() -> None:
    fake = LosingServer()
    try:
        with Client(fake.address, token="t") as client:
            assert client.insert("R", [(1,)]).tolist() == [0]
            key = (client.producer, 0)
        assert fake.requests == ["insert", "insert"]
        assert [(a["producer"], a["seq"]) for a in fake.args] == [key, key]
    finally:
        fake.close()


def test_server_unreachable_is_a_connection_error() -> None:
    port = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{port.getsockname()[1]}"
    port.close()
    with pytest.raises(ConnectionError):
        Client(address, token=TOKEN)


# ---------------------------------------------------------------------- concurrency

def test_concurrent_invocations_never_see_half_a_batch(connect: Connect) -> None:
    producer = connect()
    producer.execute("CREATE STREAM S (a INT)")
    handle = producer.register("SELECT a FROM S WHERE a >= 0")
    batches, size = 40, 100
    failures: list[int] = []
    sizes: list[int] = []
    done = threading.Event()
    polling = threading.Barrier(4)

    def poll() -> None:
        with Client(client_address(producer), token=TOKEN) as reader:
            last, first = 0, True
            while True:
                finished = done.is_set()
                n = len(reader.invoke(handle, now=1e9))
                if n % size or n < last:
                    failures.append(n)
                last = n
                sizes.append(n)
                if first:
                    polling.wait()
                    first = False
                if finished:
                    return

    readers = [threading.Thread(target=poll) for _ in range(3)]
    for t in readers:
        t.start()
    polling.wait()                        # every reader has seen the empty answer
    for i in range(batches):
        producer.insert("S", {"a": np.arange(size)}, ts=float(i))
    done.set()
    for t in readers:
        t.join()
    assert failures == []
    assert 0 in sizes and batches * size in sizes


def test_reads_that_find_the_engine_busy_wait_for_it_and_answer_in_order(
        engine: Engine, open_raw: OpenRaw, populated: Populated) -> None:
    handle, _ = populated
    want = engine.invoke(handle, now=140.0).rows
    raw = open_raw()
    raw.hello()
    with engine.locked():                  # as a long write would: the reads are parked
        raw.send(b"".join(pack_frame({"id": i, "op": "invoke",
                                      "args": {"handle": handle, "now": 140.0}})
                          for i in range(5)) + pack_frame({"id": 5, "op": "ping"}))
        time.sleep(0.1)
    replies = [raw.reply() for _ in range(6)]
    assert [r["id"] for r in replies] == list(range(6)) and all(r["ok"] for r in replies)
    assert all(_decoded(r["result"]).rows == want for r in replies[:5])


def test_a_slow_read_moves_off_the_event_loop_and_still_answers(
        connect: Connect, populated: Populated, monkeypatch: pytest.MonkeyPatch) -> None:
    handle, snapshot = populated
    monkeypatch.setattr(server_module, "INLINE_SECONDS", -1.0)   # every read is "slow"
    client = connect()
    first = client.invoke(handle, now=140.0)        # inline, then marked slow
    again = client.invoke(handle, now=140.0)        # on the read pool
    _same(again, first)
    assert first.rows == snapshot()[1]


def test_an_in_memory_commit_does_not_wait_for_the_engine_lock(engine: Engine) -> None:
    with engine.locked():
        done = threading.Thread(target=engine.commit)
        done.start()
        done.join(5)
        assert not done.is_alive()


class CommitCountingEngine(Engine):
    """An Engine whose commits take a while and are counted, with the writes they cover."""

    def __init__(self) -> None:
        super().__init__(clock=Clock(1000.0))
        self.events: list[str] = []

    def insert(self, *args: Any, **kwargs: Any) -> NDArray[np.int64]:
        ids = super().insert(*args, **kwargs)
        self.events.append("insert")
        return ids

    def commit(self) -> None:
        time.sleep(0.02)
        self.events.append("commit")


def test_writes_are_committed_in_groups_before_they_are_acknowledged() -> None:
    engine = CommitCountingEngine()
    engine.execute("CREATE STREAM S (a INT)")
    srv = Server(engine, port=0, token=TOKEN)
    host, port = srv.start_in_thread()
    acknowledged = []

    def produce() -> None:
        with Client(f"{host}:{port}", token=TOKEN) as client:
            for _ in range(5):
                client.insert("S", [(1,)], ts=1.0)
                acknowledged.append(engine.events.count("commit"))

    try:
        threads = [threading.Thread(target=produce) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        srv.stop()
    assert engine.events.count("insert") == 40
    assert engine.events[-1] == "commit"
    assert engine.events.count("commit") < 40            # groups formed
    assert min(acknowledged) >= 1                       # no reply before a commit


# ---------------------------------------------------------------------- psoup serve

def _start_service(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str, int, str]:
    env = dict(os.environ, PSOUP_CONFIG_DIR=str(tmp_path / "config"))
    env.pop("PSOUP_TOKEN", None)
    code = ("import sys; from psoup.server import run_server; "
            "run_server(*sys.argv[1:2] or [None], port=0, echo=lambda s: print(s, flush=True))")
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    while line.startswith("recovering "):       # replay progress, on a slow machine
        line = proc.stdout.readline()
    match = re.search(r"serving on ([\d.]+):(\d+)", line)
    assert match, line
    return proc, match.group(1), int(match.group(2)), line


def _stop_service(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None
    proc.stdout.close()
    assert proc.wait(timeout=WAIT) == 0


def test_serve_writes_a_private_token_file_and_removes_it_on_sigterm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSOUP_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("PSOUP_TOKEN", raising=False)
    proc, host, port, line = _start_service(tmp_path)
    try:
        path = token_path(host, port)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text() not in line                # the token is never printed
        with Client(f"{host}:{port}") as client:           # finds the token file
            assert client.ping() == "pong"
    finally:
        _stop_service(proc)
    assert not path.exists()


def test_serve_with_a_data_dir_keeps_handles_and_token_across_restarts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, host, port, _ = _start_service(tmp_path, str(data))
    try:
        token = (data / "token").read_text()
        with Client(f"{host}:{port}", token=token) as client:
            handle = _setup(client)
            client.insert("R", *_rows(0, 30))
            answer = client.invoke(handle, now=140.0)
    finally:
        _stop_service(proc)
    proc, host, port, _ = _start_service(tmp_path, str(data))
    try:
        assert (data / "token").read_text() == token
        with Client(f"{host}:{port}", token=token) as client:
            assert [h for h, _ in client.queries()] == [handle]
            _same(client.invoke(handle, now=140.0), Result(
                answer.columns, answer.rows, answer.ts, answer.tuple_ids))
    finally:
        _stop_service(proc)


def test_frames_are_msgpack_with_a_big_endian_length() -> None:
    frame = pack_frame({"id": 1, "op": "ping", "args": {}})
    assert frame[:4] == len(frame[4:]).to_bytes(4, "big")
    assert msgpack.unpackb(frame[4:], raw=False) == {"id": 1, "op": "ping", "args": {}}


def test_join_answers_and_changes_cross_the_wire_with_a_tupleid_per_item(connect: Connect) -> None:
    client = connect()
    client.execute("CREATE STREAM R (a INT)")
    client.execute("CREATE STREAM S (b INT)")
    handle = client.register("SELECT * FROM R, S WHERE R.a = S.b")
    client.insert("R", [(1,), (2,)], ts=1.0)
    client.insert("S", [(2,), (1,)], ts=2.0)
    answer = client.invoke(handle, now=3.0)
    assert answer.columns == ["R.a", "S.b"]
    assert answer.rows == [(1, 1), (2, 2)]
    assert answer.tuple_ids.tolist() == [[0, 3], [1, 2]]
    assert answer.cursor is not None
    client.insert("S", [(1,)], ts=4.0)
    changes = client.invoke(handle, now=5.0, since=answer.cursor)
    assert changes.inserted.tuple_ids.tolist() == [[0, 4]] and len(changes.deleted) == 0


def test_aggregates_travel_with_nulls_and_big_sums_and_too_big_ones_fail_alone(
        connect: Connect) -> None:
    client = connect()
    client.execute("CREATE STREAM G (k INT, v INT, f FLOAT)")
    grouped = client.register("SELECT k, COUNT(*), SUM(v), AVG(f) FROM G GROUP BY k")
    empty = client.register("SELECT COUNT(*), MAX(f) FROM G BEGIN NOW - 1 END NOW")
    client.insert("G", [(1, 2**62, 0.5), (1, 2**62, 1.5), (2, -3, 2.0)], ts=1000.0)
    got = client.invoke(grouped, now=1000.0)
    # group 1: 2**63 exceeds INT but fits the wire's unsigned 64 bits
    assert got.columns == ["k", "count(*)", "sum(v)", "avg(f)"]
    assert got.rows == [(1, 2, 2**63, 1.0), (2, 1, -3, 2.0)]
    assert got.tuple_ids.tolist() == [-1, -1]
    assert client.invoke(empty, now=5000.0).rows == [(0, None)]
    client.insert("G", [(1, 2**63 - 1, 0.0)] * 2, ts=1001.0)       # now beyond 2**64
    with pytest.raises(ProtocolError, match="does not fit the protocol's 64-bit integers"):
        client.invoke(grouped, now=1001.0)
    assert client.invoke(empty, now=1001.0).rows == [(5, 2.0)]     # the connection lives


# ---------------------------------------------------------------------- the catalog

def test_show_and_describe_travel_as_results(connect: Connect, engine: Engine) -> None:
    client = connect()
    handle = _setup(client)
    client.insert("R", *_rows(0, 3))
    for statement in ("SHOW STREAMS", "DESCRIBE R", "SHOW QUERIES"):
        got = client.execute(statement)
        assert isinstance(got, Result)
        want = engine.execute(statement)
        assert isinstance(want, Result)
        assert (got.columns, got.rows) == (want.columns, want.rows)
    shown = client.execute("SHOW QUERIES")
    assert isinstance(shown, Result) and shown.rows == [(handle, QUERY)]
    assert client.streams() == ["R"] and client.describe("R") == engine.describe("R")


def test_drop_stream_over_the_protocol(connect: Connect, engine: Engine) -> None:
    client = connect()
    handle = _setup(client)
    with pytest.raises(QueryError, match=handle) as info:
        client.drop_stream("R")
    assert "use drop_stream('R', cascade=True) to" in str(info.value)
    assert client.execute("DROP STREAM R CASCADE") is None
    assert client.streams() == [] and client.queries() == []
    client.create_stream("R", {"z": "int"})
    client.drop_stream("R")
    assert engine.streams() == []
    engine._check()


def test_client_refuses_a_stream_name_that_is_not_one_name(connect: Connect) -> None:
    client = connect()
    _setup(client)
    with pytest.raises(QueryError, match="not a stream name"):
        client.drop_stream("R CASCADE")
    assert client.streams() == ["R"]


#: A process that allocates 64 blocks of 1 MiB (a round of large answers held at once),
#: frees them, and does it again; prints whether the allocator was told to keep freed
#: memory and the page faults of the last round.
_ROUNDS = """
import resource, sys
import numpy as np
from psoup.server.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
def round_():
    held = [np.ones(1 << 17) for _ in range(64)]
    del held
for _ in range(3):
    round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
round_()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_a_server_process_keeps_the_memory_it_frees() -> None:
    """`psoup serve` has glibc keep the memory its answers free: a round of large blocks
    allocated again faults no page in, where by default each round faults them all in
    again (the allocator handed them back to the kernel)."""
    env = {k: v for k, v in os.environ.items()
           if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}

    def faults(how: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", _ROUNDS, how], capture_output=True,
                             text=True, check=True, env=env, timeout=120)
        kept, count = out.stdout.split()
        return kept, int(count)
    kept, keeping = faults("keep")
    _, default = faults("default")
    assert kept == "True"
    assert keeping < 64                     # not a page per block, let alone 256
    assert default > 64 * 128               # the control: glibc's default refaults them
