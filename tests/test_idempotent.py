"""Idempotent inserts (psoup.producers): a batch keyed (producer, seq) is applied once,
however often it is sent, and the producer table survives restarts and checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import psoup
from psoup.errors import SchemaError, SequenceError
from psoup.producers import REMEMBERED

DDL = "CREATE STREAM R (a INT)"


def _engine(path: Path | None = None, **kw: Any) -> psoup.Engine:
    eng = psoup.Engine(path=None if path is None else str(path), **kw)
    eng.execute(DDL)
    return eng


def _count(eng: psoup.Engine) -> int:
    h = eng.register("SELECT a FROM R")
    rows = eng.invoke(h, now=1e9).tuple_ids.tolist()
    eng.unregister(h)
    return len(rows)


def test_duplicate_batch_returns_the_first_tuple_ids_and_changes_nothing() -> None:
    eng = _engine()
    first = eng.insert("R", [(1,), (2,)], ts=1.0, producer="p", seq=0).tolist()
    again = eng.insert("R", [(1,), (2,)], ts=1.0, producer="p", seq=0).tolist()
    assert first == again == [0, 1]
    assert _count(eng) == 2
    assert eng.last_seq("p") == 0


def test_each_producer_counts_on_its_own() -> None:
    eng = _engine()
    eng.insert("R", [(1,)], ts=1.0, producer="p", seq=0)
    assert eng.insert("R", [(2,)], ts=1.0, producer="q", seq=0).tolist() == [1]
    assert (eng.last_seq("p"), eng.last_seq("q"), eng.last_seq("never")) == (0, 0, -1)


def test_a_gap_raises_naming_producer_expected_and_got() -> None:
    eng = _engine()
    eng.insert("R", [(1,)], ts=1.0, producer="p", seq=0)
    with pytest.raises(SequenceError, match=r"producer 'p': expected seq 1, got 3"):
        eng.insert("R", [(2,)], ts=2.0, producer="p", seq=3)
    assert _count(eng) == 1 and eng.last_seq("p") == 0


def test_a_new_producer_starts_at_zero() -> None:
    eng = _engine()
    with pytest.raises(SequenceError, match="expected seq 0, got 1"):
        eng.insert("R", [(2,)], ts=2.0, producer="p", seq=1)


def test_a_seq_older_than_what_is_remembered_raises() -> None:
    eng = _engine()
    for seq in range(REMEMBERED + 2):
        eng.insert("R", [(seq,)], ts=float(seq), producer="p", seq=seq)
    assert eng.insert("R", [(2,)], ts=99.0, producer="p", seq=2).tolist() == [2]
    with pytest.raises(SequenceError, match=f"expected seq {REMEMBERED + 2}, got 1"):
        eng.insert("R", [(1,)], ts=99.0, producer="p", seq=1)
    assert _count(eng) == REMEMBERED + 2
    eng._check()
    # the last REMEMBERED batches are answered as duplicates, the ones before refused
    for seq in range(2, REMEMBERED + 2):
        assert eng.insert("R", [(0,)], ts=99.0, producer="p", seq=seq).tolist() == [seq]
    for seq in (0, 1):
        with pytest.raises(SequenceError, match=f"got {seq}"):
            eng.insert("R", [(0,)], ts=99.0, producer="p", seq=seq)
    assert _count(eng) == REMEMBERED + 2


def test_a_rejected_batch_does_not_use_up_its_seq() -> None:
    eng = _engine()
    with pytest.raises(SchemaError):
        eng.insert("R", [("x",)], ts=1.0, producer="p", seq=0)
    assert eng.last_seq("p") == -1
    assert eng.insert("R", [(1,)], ts=1.0, producer="p", seq=0).tolist() == [0]


def test_an_empty_keyed_batch_takes_its_seq() -> None:
    eng = _engine()
    assert eng.insert("R", [], ts=1.0, producer="p", seq=0).tolist() == []
    assert eng.last_seq("p") == 0
    assert eng.insert("R", [(1,)], ts=1.0, producer="p", seq=1).tolist() == [0]


@pytest.mark.parametrize("key", [{"producer": "p"}, {"seq": 0}, {"producer": "", "seq": 0},
                                 {"producer": "p", "seq": -1}, {"producer": "p", "seq": True}])
def test_half_or_bad_key_is_rejected(key: dict[str, Any]) -> None:
    eng = _engine()
    with pytest.raises(SequenceError):
        eng.insert("R", [(1,)], ts=1.0, **key)
    assert _count(eng) == 0


def test_the_producer_idle_longest_is_forgotten_beyond_max_producers() -> None:
    eng = _engine(max_producers=2)
    for p in ("a", "b"):
        eng.insert("R", [(1,)], ts=1.0, producer=p, seq=0)
    eng.insert("R", [(1,)], ts=1.0, producer="a", seq=1)    # b is now idle longest
    eng.insert("R", [(1,)], ts=1.0, producer="c", seq=0)
    assert (eng.last_seq("a"), eng.last_seq("b"), eng.last_seq("c")) == (1, -1, 0)


def test_a_restart_keeps_the_producer_table(tmp_path: Path) -> None:
    with _engine(tmp_path) as eng:
        eng.insert("R", [(1,), (2,)], ts=1.0, producer="p", seq=0)
        eng.insert("R", [(3,)], ts=2.0, producer="p", seq=1)
    with psoup.Engine(path=str(tmp_path)) as eng:
        assert eng.last_seq("p") == 1
        assert eng.insert("R", [(3,)], ts=2.0, producer="p", seq=1).tolist() == [2]
        assert eng.insert("R", [(1,), (2,)], ts=1.0, producer="p", seq=0).tolist() == [0, 1]
        assert _count(eng) == 3
        assert eng.insert("R", [(4,)], ts=3.0, producer="p", seq=2).tolist() == [3]


def test_a_checkpoint_keeps_the_producer_table(tmp_path: Path) -> None:
    with _engine(tmp_path, max_producers=3) as eng:
        for p in ("a", "b", "c"):
            eng.insert("R", [(1,)], ts=1.0, producer=p, seq=0)
        eng.insert("R", [(1,)], ts=1.0, producer="a", seq=1)
        eng.checkpoint()
    with psoup.Engine(path=str(tmp_path), max_producers=3) as eng:
        assert [eng.last_seq(p) for p in "abc"] == [1, 0, 0]
        assert eng.insert("R", [(1,)], ts=1.0, producer="a", seq=1).tolist() == [3]
        eng.insert("R", [(1,)], ts=1.0, producer="d", seq=0)   # b was idle longest
        assert [eng.last_seq(p) for p in "abcd"] == [1, -1, 0, 0]
        assert _count(eng) == 5


def test_a_client_forgotten_by_the_server_starts_again_at_seq_zero() -> None:
    from psoup.client import Client
    from psoup.server import Server

    server = Server(psoup.Engine(max_producers=1), port=0, token="t")
    host, port = server.start_in_thread()
    try:
        with Client(f"{host}:{port}", token="t") as a, Client(f"{host}:{port}", token="t") as b:
            a.execute(DDL)
            a.insert("R", [(1,)], ts=1.0)
            b.insert("R", [(2,)], ts=1.0)                 # a is forgotten
            assert a.insert("R", [(3,)], ts=1.0).tolist() == [2]
            assert a.last_seq() == 0
    finally:
        server.stop()
