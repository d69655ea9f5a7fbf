"""Freshness (issue 38, item 5): every answer over a stream fed by a Spark source says
up to which ts it is complete (`Result.fresh_to`, docs/language.md "Freshness"), and
the answer carries it everywhere it goes: `Changes`, the wire (directly and through a
front process), `psoup.Client`, the CLI and the shell. Answers over other streams have
None, and their wire and printed forms are as before.

The streams here are declared FROM FILES but fed by inserts (`quiet_sources`: no Spark
runs), so that each step is exact and fast; tests/test_spark_live.py checks the same
values on streams Spark feeds."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import psoup
from psoup.cli import shell
from psoup.cli.main import main
from psoup.results.result import Changes, Result
from psoup.server import Server
from psoup.server import server as server_module
from psoup.server.protocol import (
    answer_pieces,
    decode_answer,
    encode_answer,
    join_answers,
    pack_frame,
    unpack_payload,
)
from tests.support import Clock, quiet_sources

T0 = 1_767_225_600.0          # 2026-01-01T00:00:00Z
TOKEN = "fresh-token"
WAIT = 60.0


@pytest.fixture
def fed(tmp_path: Path) -> Iterator[psoup.Engine]:
    """A durable engine with `fed` and `also` (streams FROM FILES, fed by inserts here)
    and `plain` (an ordinary stream)."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    with quiet_sources(), psoup.Engine(path=tmp_path / "data", clock=Clock(T0)) as eng:
        for name in ("fed", "also"):
            eng.execute(f"CREATE STREAM {name} (a INT, b FLOAT) FROM FILES '{inbox}' "
                        "FORMAT CSV")
        eng.execute("CREATE STREAM plain (a INT, b FLOAT)")
        yield eng


def put(eng: psoup.Engine, stream: str, ts: list[float]) -> None:
    eng.insert(stream, {"a": list(range(len(ts))), "b": [0.5] * len(ts)}, ts=ts)


# ---------------------------------------------------------------------- the engine

def test_an_answer_over_a_fed_stream_is_complete_to_its_latest_ts(fed: psoup.Engine) -> None:
    queries = [fed.register(sql) for sql in (
        "SELECT a FROM fed WHERE a >= 0",
        "SELECT a, COUNT(*) FROM fed GROUP BY a",
        "SELECT DISTINCT b FROM fed",
        "SELECT a FROM fed BEGIN NOW - 5 END NOW")]
    # nothing has arrived: no ts is complete yet
    assert all(fed.invoke(h).fresh_to == -math.inf for h in queries)
    put(fed, "fed", [T0 - 30, T0 - 20, T0 - 10])
    assert [fed.invoke(h).fresh_to for h in queries] == [T0 - 10] * 4
    put(fed, "fed", [T0 - 10, T0 - 2])          # a tie with the latest, then later
    assert [fed.invoke(h).fresh_to for h in queries] == [T0 - 2] * 4
    assert len(fed.invoke(queries[0])) == 5


def test_answers_over_ordinary_streams_have_none(fed: psoup.Engine) -> None:
    h = fed.register("SELECT a FROM plain WHERE a >= 0")
    put(fed, "plain", [T0 - 1])
    answer = fed.invoke(h)
    assert answer.fresh_to is None and len(answer) == 1
    changes = fed.invoke(h, since=answer.cursor)
    assert changes.fresh_to is None
    assert "fresh_to" not in encode_answer(answer)         # its wire form as before
    assert fed.execute("SHOW STREAMS").fresh_to is None    # type: ignore[union-attr]


def test_a_join_is_complete_to_the_least_of_its_fed_streams(fed: psoup.Engine) -> None:
    both = fed.register("SELECT f.a, g.a FROM fed f, also g WHERE f.a = g.a")
    half = fed.register("SELECT f.a, p.a FROM fed f, plain p WHERE f.a = p.a")
    self_join = fed.register("SELECT x.a, y.a FROM fed x, fed y WHERE x.a = y.a")
    put(fed, "fed", [T0 - 5])
    put(fed, "plain", [T0 + 50])                # ordinary streams do not hold it back
    assert fed.invoke(both).fresh_to == -math.inf       # `also` has sent nothing
    assert fed.invoke(half).fresh_to == T0 - 5
    assert fed.invoke(self_join).fresh_to == T0 - 5
    put(fed, "also", [T0 - 8])
    assert fed.invoke(both).fresh_to == T0 - 8
    put(fed, "also", [T0 + 1])
    assert fed.invoke(both).fresh_to == T0 - 5


def test_changes_and_derived_answers_carry_it(fed: psoup.Engine) -> None:
    h = fed.register("SELECT a FROM fed")
    put(fed, "fed", [T0 - 3])
    first = fed.invoke(h)
    put(fed, "fed", [T0 - 1])
    changes = fed.invoke(h, since=first.cursor)
    assert isinstance(changes, Changes) and changes.fresh_to == T0 - 1
    assert len(changes.inserted) == 1
    answer = fed.invoke(h)
    assert answer.distinct().fresh_to == answer.take(np.array([True, False])).fresh_to \
        == T0 - 1


@pytest.mark.parametrize("mode", psoup.MODES)
def test_every_mode_and_a_reopened_engine_say_it(tmp_path: Path, mode: str) -> None:
    inbox, data = tmp_path / "in", tmp_path / "data"
    inbox.mkdir()
    with quiet_sources():
        with psoup.Engine(path=data, mode=mode, clock=Clock(T0)) as eng:  # type: ignore[arg-type]  # a MODES name
            eng.execute(f"CREATE STREAM fed (a INT) FROM FILES '{inbox}' FORMAT JSON")
            h = eng.register("SELECT a FROM fed WHERE a > 0")
            eng.insert("fed", {"a": [1, 2, 3]}, ts=[T0 - 9, T0 - 8, T0 - 7])
            assert eng.invoke(h).fresh_to == T0 - 7
        with psoup.Engine(path=data, mode=mode, clock=Clock(T0)) as back:  # type: ignore[arg-type]  # a MODES name
            assert back.invoke(h).fresh_to == T0 - 7


# ---------------------------------------------------------------------- the wire

def wire_trip(answer: Result | Changes) -> Result | Changes:
    return decode_answer(unpack_payload(pack_frame(encode_answer(answer))[4:]))


@pytest.mark.parametrize("fresh_to", [T0 + 0.25, -math.inf, None])
def test_the_protocol_carries_it_whole_and_in_pieces(fresh_to: float | None) -> None:
    values = [np.arange(50)]
    answer = Result(["a"], None, np.arange(50.0), np.arange(50), cursor="c", values=values,
                    fresh_to=fresh_to)
    empty = Result(["a"], None, np.empty(0), np.empty(0, np.int64), values=[np.empty(0, int)])
    changes = Changes(["a"], answer, empty, "c2", fresh_to)
    for sent in (answer, changes):
        back = wire_trip(sent)
        assert back.fresh_to == fresh_to and type(back) is type(sent)
        pieces = answer_pieces(sent, piece_bytes=200)
        assert len(pieces) > 1
        joined = decode_answer(join_answers([unpack_payload(pack_frame(p())[4:])
                                             for p in pieces]))
        assert joined.fresh_to == fresh_to and len(joined) == 50


@pytest.fixture(params=["direct", "front"])
def served(request: pytest.FixtureRequest, fed: psoup.Engine,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The address of a server over `fed`: each connection served by the engine's
    process ("direct"), or relayed by a front process, which encodes answers of numeric
    columns itself ("front")."""
    if request.param == "front":
        monkeypatch.setattr(server_module, "DIRECT_CONNECTIONS", 0)
        server = Server(fed, port=0, token=TOKEN, fronts=1)
    else:
        server = Server(fed, port=0, token=TOKEN)
    host, port = server.start_in_thread()
    yield f"{host}:{port}"
    server.stop()


def test_a_client_gets_it_directly_and_through_a_front(fed: psoup.Engine, served: str) -> None:
    with psoup.Client(served, token=TOKEN, timeout=WAIT) as client:
        h = client.register("SELECT a, b FROM fed WHERE a >= 0")
        counted = client.register("SELECT COUNT(*) FROM fed")
        plain = client.register("SELECT a FROM plain")
        assert client.invoke(h).fresh_to == -math.inf
        client.insert("fed", [(1, 2.5), (2, 3.5)], ts=[T0 - 4, T0 - 3])
        client.insert("plain", [(1, 2.5)], ts=T0)
        first = client.invoke(h)                # a front encodes this one itself
        assert first.fresh_to == T0 - 3 and len(first) == 2
        assert client.invoke(counted).fresh_to == T0 - 3
        assert client.invoke(plain).fresh_to is None
        client.insert("fed", [(3, 4.5)], ts=T0 - 1)
        assert first.cursor is not None
        changes = client.invoke(h, since=first.cursor)
        assert changes.fresh_to == T0 - 1 and len(changes.inserted) == 1


# ---------------------------------------------------------------------- CLI and shell

def test_psoup_invoke_and_watch_show_it(fed: psoup.Engine, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSOUP_CONFIG_DIR", str(tmp_path / "config"))
    server = Server(fed, port=0, token=TOKEN)
    host, port = server.start_in_thread()
    try:
        def psoup_cli(*args: str) -> str:
            done = CliRunner().invoke(main, ["--server", f"{host}:{port}", "--token", TOKEN,
                                             *args])
            assert done.exit_code == 0, (done.output, done.exception)
            return done.stdout

        h = fed.register("SELECT a FROM fed")
        plain = fed.register("SELECT a FROM plain")
        assert psoup_cli("invoke", h).splitlines()[-1] == \
            "(0 rows; complete to no ts yet (its source has sent nothing))"
        assert json.loads(psoup_cli("invoke", h, "-o", "json"))["fresh_to"] is None
        put(fed, "fed", [T0 + 1.5])
        assert psoup_cli("invoke", h).splitlines()[-1] == \
            "(1 row; complete to 2026-01-01T00:00:01.500Z)"
        assert json.loads(psoup_cli("invoke", h, "-o", "json"))["fresh_to"] == T0 + 1.5
        put(fed, "fed", [T0 + 2])
        assert psoup_cli("invoke", h, "--changes").splitlines()[-1] == \
            "(1 inserted, 0 deleted; complete to 2026-01-01T00:00:02.000Z)"
        assert json.loads(psoup_cli("invoke", h, "--changes", "-o", "json"))["fresh_to"] \
            == T0 + 2
        polled = psoup_cli("watch", h, "--every", "1s", "--count", "1").splitlines()[0]
        assert polled.endswith("] 2 rows; complete to 2026-01-01T00:00:02.000Z")
        # an ordinary stream's answers print as they did
        put(fed, "plain", [T0])
        assert psoup_cli("invoke", plain).splitlines()[-1] == "(1 row)"
        assert "fresh_to" not in json.loads(psoup_cli("invoke", plain, "-o", "json"))
    finally:
        server.stop()


def test_the_shell_shows_it(fed: psoup.Engine) -> None:
    printed: list[str] = []
    session = shell.Session(fed, None, printed.append, printed.append)
    session.run(iter(["SELECT a FROM fed;"]))
    h = session.last_handle
    plain = fed.register("SELECT a FROM plain")
    put(fed, "fed", [T0 + 3])
    put(fed, "plain", [T0 + 3])
    for command, footer in ((f"\\invoke {h}", "(1 row; complete to 2026-01-01T00:00:03.000Z)"),
                            (f"\\changes {h}", "(0 inserted, 0 deleted; complete to "
                                               "2026-01-01T00:00:03.000Z)"),
                            (f"\\invoke {plain}", "(1 row)")):
        printed.clear()
        session.run_one(command)
        assert printed[-1].splitlines()[-1] == footer, printed
    session.expanded = True                     # \x: records, then the same footer
    printed.clear()
    session.run_one(f"\\invoke {h}")
    assert printed[-1].splitlines()[-1] == "(1 row; complete to 2026-01-01T00:00:03.000Z)"
    session.fmt = "json"
    printed.clear()
    session.run_one(f"\\invoke {h}")
    assert json.loads(printed[-1])["fresh_to"] == T0 + 3
