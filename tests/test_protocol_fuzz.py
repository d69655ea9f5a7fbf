"""Garbage over the wire: random requests of every operation (bar `history`, which starts
Spark) with random arguments, on an authenticated connection, never get an `internal`
reply, and the server keeps serving a well-behaved client. The connection takes answers
in pieces, and the pieces are tiny, so an invocation of the one known handle (sometimes
drawn as an argument) comes back as a sequence of frames."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psoup import Client, Engine
from psoup.server import Limits, Server
from psoup.server.ops import OPS
from psoup.server.protocol import HEADER, PROTOCOL, pack_frame
from tests.support import Clock, read_reply

TOKEN = "fuzz-token"
LIMITS = Limits(max_frame_bytes=1 << 16, max_batch_rows=100, max_query_chars=500,
                max_factors=8, read_timeout=1.0, piece_bytes=64)
#: Drawn as any argument; the connection sends the registered query's handle instead.
KNOWN_HANDLE = "$known-handle"

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                    st.floats(allow_nan=True), st.text(max_size=12), st.binary(max_size=12))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
ARG_NAMES = ["sql", "stream", "rows", "columns", "ts", "handle", "now", "since", "name",
             "retain", "chain", "handles"]
SQL = st.sampled_from(["SELECT a FROM R WHERE a > 1", "CREATE STREAM R (a INT)",
                       "SELECT * FROM R WHERE a = 'x'", "SELECT nope", ""])
ARGS = st.dictionaries(st.sampled_from(ARG_NAMES),
                      st.one_of(VALUES, SQL, st.just(KNOWN_HANDLE)), max_size=4)
OP_NAMES = sorted(set(OPS) - {"history"}) + ["hello", "nope", ""]
REQUEST = st.fixed_dictionaries(
    {"id": st.one_of(st.integers(0, 2**31), st.text(max_size=4)),
     "op": st.one_of(st.sampled_from(OP_NAMES), VALUES),
     "args": st.one_of(ARGS, VALUES)})


class _Wire:
    def __init__(self, address: tuple[str, int], handle: str):
        self.address = address
        self.handle = handle
        self.sock: socket.socket | None = None

    def request(self, message: object) -> dict[str, Any] | None:
        """Send one request and read its reply (the last frame of one in pieces, the
        earlier ones checked to be successes of the same id); None when the server
        closed the connection (as it does after a frame-level error), which then
        reconnects."""
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=5.0)
            self.sock.sendall(pack_frame({"id": 0, "op": "hello", "args": {
                "token": TOKEN, "protocol": PROTOCOL, "pieces": True}}))
            assert read_reply(self.sock)["ok"]
        if isinstance(message, dict) and isinstance(message.get("args"), dict):
            message["args"] = {k: self.handle if v == KNOWN_HANDLE else v
                               for k, v in message["args"].items()}
        try:
            payload = msgpack.packb(message, use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            return None
        self.sock.sendall(HEADER.pack(len(payload)) + payload)
        reply: dict[str, Any] | None = read_reply(self.sock)
        sent = message.get("id") if isinstance(message, dict) else None
        while reply is not None and reply.get("more") is True:
            assert reply["ok"] and reply["id"] == sent, reply
            reply = read_reply(self.sock)
        if reply is None:
            self.sock.close()
            self.sock = None
        return reply


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[tuple[str, int], _Wire]]:
    engine = Engine(clock=Clock(1000.0))
    engine.execute("CREATE STREAM R (a INT, b FLOAT, name TEXT)")
    handle = engine.register("SELECT a, name FROM R WHERE a > 1")
    engine.insert("R", [(a, a / 2, f"row {a}") for a in range(40)], ts=900.0)
    srv = Server(engine, port=0, token=TOKEN, limits=LIMITS)
    address = srv.start_in_thread()
    wire = _Wire(address, handle)
    yield address, wire
    srv.stop()


@settings(max_examples=2000, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(REQUEST)
def test_no_request_gets_an_internal_error(served: tuple[tuple[str, int], _Wire],
                                           message: object) -> None:
    _, wire = served
    reply = wire.request(message)
    if reply is not None and not reply.get("ok"):
        assert reply["error"]["code"] != "internal", (message, reply)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.one_of(st.none(), st.floats(allow_nan=True), st.integers(-(2**63), 2**64 - 1),
                 VALUES),
       st.one_of(st.none(), st.text(max_size=40), VALUES))
def test_invocations_answered_in_pieces_get_no_internal_error(
        served: tuple[tuple[str, int], _Wire], now: object, since: object) -> None:
    _, wire = served
    reply = wire.request({"id": 9, "op": "invoke",
                          "args": {"handle": KNOWN_HANDLE, "now": now, "since": since}})
    assert reply is not None
    if not reply.get("ok"):
        assert reply["error"]["code"] != "internal", (now, since, reply)


def test_a_client_is_served_after_the_garbage(served: tuple[tuple[str, int], _Wire]) -> None:
    address, _ = served
    with Client(f"{address[0]}:{address[1]}", token=TOKEN) as client:
        assert client.ping() == "pong"
        client.execute("CREATE STREAM AfterTheGarbage (a INT)")     # a name no fuzz makes
        handle = client.register("SELECT a FROM AfterTheGarbage WHERE a > 1")
        client.insert("AfterTheGarbage", [(5,), (0,)], ts=2000.0)
        assert client.invoke(handle, now=2001.0).rows == [(5,)]
