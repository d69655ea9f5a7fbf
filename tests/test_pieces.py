"""Large answers in bounded pieces (docs/protocol.md, "Large answers"): an answer above
the server's piece_bytes reaches psoup.Client whole and equal, in several frames; a
client that did not ask for pieces still gets one frame; other clients are answered
while a large answer is on its way; garbage in the new frames is refused cleanly."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psoup import Client, Engine
from psoup.errors import PSoupError
from psoup.results.result import Changes, Result
from psoup.server import Limits, Server
from psoup.server import server as server_module
from psoup.server.protocol import (
    PROTOCOL,
    ProtocolError,
    answer_pieces,
    decode_answer,
    encode_answer,
    join_answers,
    pack_frame,
    unpack_payload,
)
from tests.support import Clock, read_reply

TOKEN = "pieces-token"
WAIT = 60.0
#: Small pieces, so that a few thousand rows make many of them.
PIECE_BYTES = 4096
ROWS = 3_000


@pytest.fixture
def engine() -> Engine:
    engine = Engine(clock=Clock(1000.0))
    engine.execute("CREATE STREAM R (a INT, b FLOAT, name TEXT)")
    gen = np.random.default_rng(5)
    names = np.empty(ROWS, dtype=object)
    names[:] = [f"name {i}" * int(gen.integers(0, 4)) for i in range(ROWS)]
    engine.insert("R", {"a": np.arange(ROWS) % 97, "b": gen.random(ROWS), "name": names},
                  ts=np.arange(ROWS, dtype=np.float64))
    return engine


@pytest.fixture(params=[0, 1], ids=["in-process", "front"])
def address(engine: Engine, request: pytest.FixtureRequest,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int]]:
    """The server serving its connections itself, and through a front process."""
    monkeypatch.setattr(server_module, "DIRECT_CONNECTIONS", 0)
    server = Server(engine, port=0, token=TOKEN, limits=Limits(piece_bytes=PIECE_BYTES),
                    fronts=request.param)
    yield server.start_in_thread()
    server.stop()


def _client(address: tuple[str, int]) -> Client:
    return Client(f"{address[0]}:{address[1]}", token=TOKEN, timeout=WAIT)


def _same(got: Result, want: Result) -> None:
    assert got.columns == want.columns
    assert got.rows == want.rows
    assert got.ts.tolist() == want.ts.tolist()
    assert got.tuple_ids.tolist() == want.tuple_ids.tolist()
    assert got.keys == want.keys
    assert got.cursor == want.cursor


def _raw(address: tuple[str, int], pieces: bool) -> socket.socket:
    sock = socket.create_connection(address, timeout=WAIT)
    args: dict[str, Any] = {"token": TOKEN, "protocol": PROTOCOL}
    if pieces:
        args["pieces"] = True
    sock.sendall(pack_frame({"id": 0, "op": "hello", "args": args}))
    hello = read_reply(sock)
    assert hello["ok"] and hello["result"]["pieces"] is True
    return sock


def _frames(sock: socket.socket, request_id: int) -> list[dict[str, Any]]:
    """The frames of one reply: up to the first without `more`."""
    frames = [read_reply(sock)]
    while frames[-1].get("more"):
        frames.append(read_reply(sock))
    assert all(f["id"] == request_id for f in frames)
    return frames


def test_a_large_answer_arrives_whole_and_equal(engine: Engine,
                                                address: tuple[str, int]) -> None:
    selection = engine.register("SELECT a, b, name FROM R WHERE a > 3")
    grouped = engine.register("SELECT name, COUNT(*), AVG(b) FROM R GROUP BY name")
    with _client(address) as client:
        for handle in (selection, grouped):
            _same(client.invoke(handle, now=ROWS), engine.invoke(handle, now=ROWS))
        old = client.invoke(selection, now=ROWS)
        engine.insert("R", {"a": np.arange(ROWS) % 89, "b": np.zeros(ROWS),
                            "name": np.array(["x"] * ROWS, dtype=object)},
                      ts=np.arange(ROWS, 2 * ROWS, dtype=np.float64))
        changes = client.invoke(selection, now=2 * ROWS, since=old.cursor)
        assert isinstance(changes, Changes) and len(changes.inserted) > ROWS // 2
        new = engine.invoke(selection, now=2 * ROWS)
        assert old.rows + changes.inserted.rows == new.rows and not changes.deleted.rows
        assert client.ping() == "pong"          # the connection is in step after them


def test_the_answer_came_in_pieces_of_about_the_bound(engine: Engine,
                                                      address: tuple[str, int]) -> None:
    handle = engine.register("SELECT a, b FROM R")
    sock = _raw(address, pieces=True)
    sock.sendall(pack_frame({"id": 1, "op": "invoke", "args": {"handle": handle,
                                                               "now": ROWS}}))
    frames = _frames(sock, 1)
    assert len(frames) >= ROWS * 32 // PIECE_BYTES      # a, b, ts, tupleID: 32 bytes a row
    assert all(len(pack_frame(f)) < 2 * PIECE_BYTES for f in frames)
    whole = decode_answer(join_answers([f["result"] for f in frames]))
    assert isinstance(whole, Result)
    _same(whole, engine.invoke(handle, now=ROWS))
    sock.close()


def test_a_client_that_did_not_ask_for_pieces_gets_one_frame(
        engine: Engine, address: tuple[str, int]) -> None:
    handle = engine.register("SELECT a, b, name FROM R")
    sock = _raw(address, pieces=False)
    sock.sendall(pack_frame({"id": 1, "op": "invoke", "args": {"handle": handle,
                                                               "now": ROWS}}))
    frames = _frames(sock, 1)
    assert len(frames) == 1 and "more" not in frames[0]
    answer = decode_answer(frames[0]["result"])
    assert isinstance(answer, Result)
    _same(answer, engine.invoke(handle, now=ROWS))
    sock.close()


@pytest.mark.parametrize("pieces", [True, False])
def test_pipelined_replies_after_a_large_answer_keep_their_order(
        engine: Engine, address: tuple[str, int], pieces: bool) -> None:
    large = engine.register("SELECT a, b, name FROM R")
    small = engine.register("SELECT a FROM R BEGIN (NOW - 2 ROWS) END NOW")
    sock = _raw(address, pieces=pieces)
    sock.sendall(b"".join(pack_frame({"id": i, "op": op, "args": args}) for i, op, args in (
        (1, "invoke", {"handle": large, "now": ROWS}), (2, "ping", {}),
        (3, "invoke", {"handle": small, "now": ROWS}), (4, "invoke", {"handle": large,
                                                                       "now": ROWS}))))
    replies = [_frames(sock, request_id) for request_id in (1, 2, 3, 4)]
    assert [len(r) > 1 for r in replies] == [pieces, False, False, pieces]
    assert replies[1][0]["result"] == "pong"
    recent = decode_answer(replies[2][0]["result"])
    assert isinstance(recent, Result)
    assert recent.rows == [(a % 97,) for a in (ROWS - 2, ROWS - 1)]
    for frames in (replies[0], replies[3]):
        whole = decode_answer(join_answers([f["result"] for f in frames]))
        assert isinstance(whole, Result)
        _same(whole, engine.invoke(large, now=ROWS))
    sock.close()


def test_another_client_is_answered_while_a_large_answer_is_on_its_way(
        engine: Engine, address: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The second piece of the large answer is held until the small invocation has been
    answered: if that invocation waited for the large answer to be sent, it would time
    out (the server would send it only after the held piece), so its arrival is the
    ordering evidence."""
    large = engine.register("SELECT a, b, name FROM R")
    small = engine.register("SELECT a FROM R BEGIN (NOW - 3 ROWS) END NOW")
    first_sent, release = threading.Event(), threading.Event()

    def gated(answer: Any, piece_bytes: int) -> list[Callable[[], dict[str, Any]]]:
        pieces = answer_pieces(answer, piece_bytes)

        def held(piece: Callable[[], dict[str, Any]]) -> dict[str, Any]:
            first_sent.set()
            assert release.wait(WAIT), "the small invocation was never answered"
            return piece()
        return pieces[:1] + [partial(held, p) for p in pieces[1:]]

    monkeypatch.setattr(server_module, "answer_pieces", gated)
    got: list[Result] = []
    with _client(address) as reader, _client(address) as poller:
        thread = threading.Thread(target=lambda: got.append(reader.invoke(large, now=ROWS)))
        thread.start()
        assert first_sent.wait(WAIT)
        poller.timeout = 10.0
        assert poller.invoke(small, now=ROWS).rows == [(a,) for a in
                                                       (np.arange(ROWS - 3, ROWS) % 97)]
        assert thread.is_alive()                # the large answer is still on its way
        release.set()
        thread.join(WAIT)
    assert len(got) == 1
    _same(got[0], engine.invoke(large, now=ROWS))


def test_an_answer_that_fails_in_a_later_piece_is_an_error_and_the_connection_lives(
        engine: Engine, address: tuple[str, int]) -> None:
    engine.execute("CREATE STREAM G (k INT, v INT)")
    grouped = engine.register("SELECT k, SUM(v) FROM G GROUP BY k")
    keys = np.arange(2_000)
    engine.insert("G", {"k": keys, "v": np.ones(2_000, dtype=np.int64)}, ts=1.0)
    engine.insert("G", [(1_999, 2**63 - 1)] * 3, ts=2.0)     # the last group's sum > 2**64
    with _client(address) as client:
        with pytest.raises(ProtocolError, match="does not fit the protocol's 64-bit"):
            client.invoke(grouped, now=3.0)
        assert client.ping() == "pong"


# ---------------------------------------------------------------------- fuzz

def _answer(data: st.DataObject) -> Result | Changes:
    """A random answer: numeric, text or Python-valued columns, group keys, a tupleID
    per FROM item, sampled errors, or changes."""
    n = data.draw(st.integers(0, 60))
    ts = np.arange(n, dtype=np.float64)
    width = data.draw(st.sampled_from([1, 2]))
    tids = np.arange(n * width, dtype=np.int64).reshape((n, width) if width > 1 else (n,))
    kind = data.draw(st.sampled_from(["columns", "rows", "changes"]))
    if kind == "rows":
        values = st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                           st.text(max_size=5))
        rows = [tuple(data.draw(st.lists(values, min_size=2, max_size=2))) for _ in range(n)]
        keys = [(i,) for i in range(n)]
        return Result(["k", "v"], rows, ts, tids, "c", keys=keys)
    text = np.empty(n, dtype=object)
    text[:] = [data.draw(st.one_of(st.none(), st.text(max_size=8))) for _ in range(n)]
    result = Result(["a", "t", "f"], None, ts, tids, "c",
                    values=[np.arange(n) * 3, text, np.arange(n) % 2 == 0])
    if kind == "changes":
        return Changes(result.columns, result, result.take(np.arange(n) % 3 == 0), "c2")
    if data.draw(st.booleans()):
        result.fidelity = ((0.0, 10.0, 0.5),)
        result.error = {"count(*)": np.arange(n, dtype=np.float64)}
    return result


def _over_the_wire(value: dict[str, Any]) -> Any:
    return unpack_payload(pack_frame(value)[4:])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(1, 400))
def test_pieces_join_to_the_whole_answer(data: st.DataObject, piece_bytes: int) -> None:
    answer = _answer(data)
    whole = decode_answer(_over_the_wire(encode_answer(answer)))
    joined = decode_answer(join_answers([_over_the_wire(p())
                                         for p in answer_pieces(answer, piece_bytes)]))
    assert type(joined) is type(whole)
    parts = ([(joined.inserted, whole.inserted), (joined.deleted, whole.deleted)]
             if isinstance(joined, Changes) and isinstance(whole, Changes)
             else [(joined, whole)])
    for got, want in parts:
        assert isinstance(got, Result) and isinstance(want, Result)
        assert repr(got.rows) == repr(want.rows)            # NaN, and int vs float
        assert got.ts.tolist() == want.ts.tolist()
        assert got.tuple_ids.tolist() == want.tuple_ids.tolist()
        assert got.keys == want.keys and got.cursor == want.cursor
        assert {k: v.tolist() for k, v in got.error.items()} == \
            {k: v.tolist() for k, v in want.error.items()}


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                    st.floats(allow_nan=True), st.text(max_size=6), st.binary(max_size=9))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(
        st.sampled_from(["kind", "columns", "cursor", "values", "ts", "tuple_ids", "keys",
                         "rows", "dtype", "data", "inserted", "deleted", "fidelity",
                         "error"]), inner, max_size=5)), max_leaves=16)


@settings(max_examples=500, deadline=None)
@given(st.lists(VALUES, min_size=1, max_size=4))
def test_pieces_that_do_not_fit_together_are_a_protocol_error(pieces: list[Any]) -> None:
    try:
        decode_answer(join_answers(pieces))
    except ProtocolError as exc:
        assert exc.code == "bad_frame"
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        pass        # decode_answer of a malformed whole answer fails as it always did


class _PieceServer:
    """A fake server that answers hello, then any request with `frames` (a first frame
    with "more", then whatever the test gives), to fuzz the client's reassembly."""

    def __init__(self, frames: list[Any]):
        self.frames = frames
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):   # the client hangs up as it likes
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        hello = read_reply(conn)
        conn.sendall(pack_frame({"id": hello["id"], "ok": True, "result": {
            "protocol": PROTOCOL, "limits": {"max_frame_bytes": 1 << 20}}}))
        request = read_reply(conn)
        if request is None:
            return
        piece = {"kind": "answer", "columns": ["a"], "cursor": None,
                 "values": [[1]], "ts": [0.0], "tuple_ids": [0]}
        out = [{"id": request["id"], "ok": True, "result": piece, "more": True}]
        out += [{**frame, "id": request["id"]} if isinstance(frame, dict) else frame
                for frame in self.frames]
        conn.sendall(b"".join(pack_frame(f) for f in out))
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(1 << 16):
            pass

    def close(self) -> None:
        self.listener.close()


FRAMES = st.lists(st.one_of(
    VALUES, st.fixed_dictionaries({"ok": st.booleans(), "more": st.one_of(st.booleans(),
                                                                           VALUES)},
                                  optional={"result": VALUES, "error": VALUES})),
    max_size=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FRAMES)
def test_a_client_given_garbage_pieces_raises_a_psoup_error(frames: list[Any]) -> None:
    fake = _PieceServer(frames)
    try:
        with Client(fake.address, token="t", timeout=5.0) as client:
            try:
                client.invoke("h")
            except PSoupError:
                pass
            except (KeyError, TypeError, ValueError, AttributeError, IndexError):
                pass    # a last frame whose answer is malformed, as for one frame
    finally:
        fake.close()


def test_the_server_takes_any_pieces_value_in_hello(address: tuple[str, int]) -> None:
    for value in (1, "yes", None, [True], {"a": 1}):
        sock = socket.create_connection(address, timeout=WAIT)
        sock.sendall(pack_frame({"id": 0, "op": "hello", "args": {
            "token": TOKEN, "protocol": PROTOCOL, "pieces": value}}))
        assert read_reply(sock)["ok"]
        sock.sendall(pack_frame({"id": 1, "op": "ping"}))
        assert read_reply(sock)["result"] == "pong"
        sock.close()
