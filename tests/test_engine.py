"""The embedded engine's behaviour: windows, retention, the insert forms, handles, errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

import psoup
from psoup import QueryError, SchemaError, UnknownHandle
from psoup.options import ModeName
from psoup.results.result import Result
from tests.support import Clock


@pytest.fixture(params=psoup.MODES)
def mode(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def make(mode: ModeName, ddl: str = "CREATE STREAM R (a INT, b FLOAT, name TEXT)",
         chunk_rows: int = 4) -> tuple[psoup.Engine, Clock]:
    clock = Clock(1000.0)
    eng = psoup.Engine(mode=mode, clock=clock, chunk_rows=chunk_rows)
    eng.execute(ddl)
    return eng, clock


def fill(eng: psoup.Engine, n: int = 20, t0: float = 1000.0) -> NDArray[np.int64]:
    """Tuples a = 0..n-1 at ts = t0 + a."""
    rows = [(i, i / 2, f"n{i % 3}") for i in range(n)]
    return eng.insert("R", rows, ts=[t0 + i for i in range(n)])


# ---------------------------------------------------------------- windows

def test_sliding_window_follows_now(mode: ModeName) -> None:
    eng, _ = make(mode)
    h = eng.register("SELECT a FROM R BEGIN NOW - 3 END NOW")
    fill(eng)
    assert [r[0] for r in eng.invoke(h, now=1010.0)] == [7, 8, 9, 10]
    assert [r[0] for r in eng.invoke(h, now=1015.5)] == [13, 14, 15]


def test_landmark_window_grows_from_a_fixed_point(mode: ModeName) -> None:
    eng, _ = make(mode)
    h = eng.register("SELECT a FROM R WHERE a < 100 BEGIN 1016 END NOW")
    fill(eng)
    assert [r[0] for r in eng.invoke(h, now=1017.0)] == [16, 17]
    fill(eng, n=3, t0=1030.0)
    assert [r[0] for r in eng.invoke(h, now=1040.0)] == [16, 17, 18, 19, 0, 1, 2]


def test_snapshot_window_is_fixed(mode: ModeName) -> None:
    eng, _ = make(mode)
    h = eng.register("SELECT a FROM R BEGIN 1002 END 1004")
    fill(eng)
    assert eng.invoke(h, now=5000.0).rows == [(2,), (3,), (4,)]


def test_iso_timestamp_window(mode: ModeName) -> None:
    eng, _ = make(mode)
    h = eng.register("SELECT a FROM R BEGIN '1970-01-01 00:16:45' END '1970-01-01T00:16:46Z'")
    fill(eng)
    assert eng.invoke(h).rows == [(5,), (6,)]


def test_rows_window_takes_last_tuples_before_where(mode: ModeName) -> None:
    eng, _ = make(mode)
    h = eng.register("SELECT a FROM R WHERE a < 17 BEGIN (NOW - 5 ROWS) END NOW")
    fill(eng)
    assert eng.invoke(h).rows == [(15,), (16,)]


def test_cql_windows(mode: ModeName) -> None:
    eng, _ = make(mode)
    rng = eng.register("SELECT a FROM R [RANGE 2 SECONDS]")
    rows = eng.register("SELECT a FROM R [ROWS 2]")
    now = eng.register("SELECT a FROM R [NOW]")
    part = eng.register("SELECT name, a FROM R [PARTITION BY name ROWS 1]")
    fill(eng)
    assert eng.invoke(rng, now=1005.0).rows == [(3,), (4,), (5,)]
    assert eng.invoke(rows).rows == [(18,), (19,)]
    assert eng.invoke(now, now=1007.0).rows == [(7,)]
    assert eng.invoke(part).rows == [("n2", 17), ("n0", 18), ("n1", 19)]


def test_no_window_means_everything_retained(mode: ModeName) -> None:
    eng, _ = make(mode, "CREATE STREAM R (a INT, b FLOAT, name TEXT) RETAIN 6 ROWS")
    h = eng.register("SELECT a FROM R WHERE a >= 10")
    fill(eng)
    assert [r[0] for r in eng.invoke(h)] == [14, 15, 16, 17, 18, 19]


# ---------------------------------------------------------------- retention, expiry

def test_expired_tuples_leave_results(mode: ModeName) -> None:
    eng, _ = make(mode, "CREATE STREAM R (a INT, b FLOAT, name TEXT) RETAIN 5 SECONDS")
    h = eng.register("SELECT a FROM R WHERE a >= 0")
    fill(eng, n=10)
    assert [r[0] for r in eng.invoke(h)] == [4, 5, 6, 7, 8, 9]
    eng.insert("R", [(100, 0.0, "x")], ts=1100.0)
    assert eng.invoke(h).rows == [(100,)]
    assert eng.stats()["streams"]["R"]["rows"] == 1


def test_new_query_sees_only_retained_data(mode: ModeName) -> None:
    eng, _ = make(mode, "CREATE STREAM R (a INT, b FLOAT, name TEXT) RETAIN 3 ROWS")
    fill(eng, n=10)
    h = eng.register("SELECT a FROM R")
    assert eng.invoke(h).rows == [(7,), (8,), (9,)]


# ---------------------------------------------------------------- results

def test_projection_distinct_and_aliases(mode: ModeName) -> None:
    eng, _ = make(mode)
    h = eng.register("SELECT DISTINCT name AS who FROM R WHERE a >= 2")
    fill(eng, n=6)
    res = eng.invoke(h)
    assert res.columns == ["who"]
    assert res.rows == [("n2",), ("n0",), ("n1",)]
    assert res.ts.tolist() == [1002.0, 1003.0, 1004.0]


def test_ts_and_tuple_id_are_columns(mode: ModeName) -> None:
    eng, _ = make(mode)
    h = eng.register("SELECT tupleID, ts FROM R WHERE ts > 1003 AND tupleID < 6")
    ids = fill(eng, n=8)
    assert eng.invoke(h).rows == [(ids[4], 1004.0), (ids[5], 1005.0)]


def test_multi_attribute_factor(mode: ModeName) -> None:
    eng, _ = make(mode, "CREATE STREAM R (a INT, b INT)")
    h = eng.register("SELECT a, b FROM R WHERE a < b - 1 AND a >= 0")
    eng.insert("R", [(0, 1), (0, 2), (3, 9), (-1, 5)], ts=1000.0)
    assert eng.invoke(h).rows == [(0, 2), (3, 9)]


def test_results_are_ordered_by_ts_then_tuple_id(mode: ModeName) -> None:
    eng, _ = make(mode, "CREATE STREAM R (a INT)")
    h = eng.register("SELECT a FROM R")
    ids = eng.insert("R", [(3,), (1,), (2,)], ts=[5.0, 5.0, 6.0])
    res = eng.invoke(h, now=10.0)
    assert res.tuple_ids.tolist() == ids.tolist()
    assert res.rows == [(3,), (1,), (2,)]
    assert res.to_dicts() == [{"a": 3}, {"a": 1}, {"a": 2}]


# ---------------------------------------------------------------- insert forms

def test_insert_accepts_tuples_dicts_and_columns(mode: ModeName) -> None:
    eng, _ = make(mode, "CREATE STREAM R (a INT, name TEXT)")
    h = eng.register("SELECT a, name FROM R")
    eng.insert("R", [(1, "x")], ts=1.0)
    eng.insert("R", [{"name": "y", "a": 2}], ts=2.0)
    eng.insert("R", {"a": np.array([3, 4]), "name": ["z", "w"]}, ts=[3.0, 4.0])
    assert eng.invoke(h, now=5.0).rows == [(1, "x"), (2, "y"), (3, "z"), (4, "w")]


def test_insert_without_ts_uses_the_engine_clock(mode: ModeName) -> None:
    eng, clock = make(mode, "CREATE STREAM R (a INT)")
    clock.now = 1234.5
    eng.insert("R", [(1,)])
    h = eng.register("SELECT a FROM R")
    assert eng.invoke(h).ts.tolist() == [1234.5]


def test_tuple_ids_increase_across_streams(mode: ModeName) -> None:
    eng, _ = make(mode, "CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (a INT)")
    first = eng.insert("R", [(1,), (2,)], ts=1.0)
    second = eng.insert("S", [(1,)], ts=1.0)
    assert first.dtype == np.int64
    assert first.tolist() + second.tolist() == sorted(set(first.tolist() + second.tolist()))


def test_create_stream_from_python_matches_ddl(mode: ModeName) -> None:
    eng = psoup.Engine(mode=mode, clock=lambda: 0.0)
    eng.create_stream("S", {"b": "int", "c": "float"}, retain="2 rows")
    h = eng.register("SELECT b, c FROM S")
    eng.insert("S", [(1, 1.5), (2, 2.5), (3, 3.5)], ts=0.0)
    assert eng.invoke(h).rows == [(2, 2.5), (3, 3.5)]


# ---------------------------------------------------------------- handles

def test_handles_are_long_and_unguessable(mode: ModeName) -> None:
    eng, _ = make(mode)
    handles = {eng.register("SELECT a FROM R") for _ in range(20)}
    assert len(handles) == 20
    assert all(len(h) >= 32 for h in handles)       # 24 random bytes, base64url


def test_handle_randomness_is_never_handed_out_twice_even_across_a_fork() -> None:
    """Handles come from OS randomness read a page at a time (psoup.entropy): tokens
    across several pages are all distinct, and a forked child does not repeat the
    tokens its parent hands out next."""
    import os

    from psoup.entropy import POOL_BYTES, token_hex
    tokens = [token_hex(20) for _ in range(3 * POOL_BYTES // 20)]
    assert len(set(tokens)) == len(tokens)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                    # the child: its next tokens, to the parent
        os.close(read)
        os.write(write, "".join(token_hex(20) for _ in range(5)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 1000).decode()
    os.close(read)
    os.waitpid(pid, 0)
    mine = "".join(token_hex(20) for _ in range(5))
    assert len(child) == len(mine) == 200 and child != mine
    assert not {child[i:i + 40] for i in range(0, 200, 40)} & \
        {mine[i:i + 40] for i in range(0, 200, 40)}


def test_unregistered_handle_stops_working_and_slot_is_reused(mode: ModeName) -> None:
    eng, _ = make(mode)
    fill(eng, n=5)
    old = eng.register("SELECT a FROM R WHERE a > 2")
    eng.unregister(old)
    with pytest.raises(UnknownHandle):
        eng.invoke(old)
    new = eng.register("SELECT a FROM R WHERE a < 2")
    assert eng.invoke(new).rows == [(0,), (1,)]
    fill(eng, n=5, t0=2000.0)
    assert eng.invoke(new).rows == [(0,), (1,), (0,), (1,)]
    assert eng.queries() == [(new, "SELECT a FROM R WHERE a < 2")]


def test_unknown_handle_is_a_key_error_naming_it(mode: ModeName) -> None:
    eng, _ = make(mode)
    with pytest.raises(UnknownHandle, match="unknown handle 'nope'"):
        eng.invoke("nope")
    with pytest.raises(KeyError):
        eng.unregister("nope")
    gone = eng.register("SELECT a FROM R")
    eng.unregister(gone)
    with pytest.raises(UnknownHandle, match=f"unknown handle '{gone}': not issued"):
        eng.invoke(gone)                                  # the whole handle, not a prefix


def test_contradiction_registers_and_matches_nothing(mode: ModeName) -> None:
    eng, _ = make(mode)
    h = eng.register("SELECT a FROM R WHERE a > 5 AND a < 3")
    fill(eng)
    assert eng.invoke(h).rows == []


def test_stats_report_streams_queries_and_memory(mode: ModeName) -> None:
    eng, _ = make(mode)
    h = eng.register("SELECT a FROM R WHERE a < 3")
    fill(eng)
    stats = eng.stats()
    assert stats["mode"] == mode
    assert stats["streams"]["R"]["rows"] == 20
    assert stats["streams"]["R"]["latest_ts"] == 1019.0
    assert stats["queries"][h]["results"] == 3
    assert stats["memory"]["total"] >= stats["memory"]["data"] > 0


# ---------------------------------------------------------------- bad input changes nothing

def snapshot(eng: psoup.Engine, handles: list[str]) -> tuple[object, ...]:
    return ([eng.invoke(h, now=2000.0).rows for h in handles], eng.queries(),
            {k: v["rows"] for k, v in eng.stats()["streams"].items()})


@pytest.mark.parametrize("rows, ts, message", [
    ([(1, 1.0)], 1.0, "row 0: expected 3 values"),
    ([(1, 1.0, "x"), (2, 2.0)], 1.0, "row 1: expected 3 values"),
    ([("1", 1.0, "x")], 1.0, "row 0, column 'a': expected INT, got str"),
    ([(True, 1.0, "x")], 1.0, "row 0, column 'a': expected INT, got bool"),
    ([(1, 1.0, 5)], 1.0, "column 'name': expected TEXT, got int"),
    ([(1, float("nan"), "x")], 1.0, "NaN"),
    ([(2**70, 1.0, "x")], 1.0, "64-bit INT"),
    ([{"a": 1, "b": 1.0}], 1.0, "row 0 has no column 'name'"),
    ([{"a": 1, "b": 1.0, "name": "x", "zzz": 0}], 1.0,
     "row 0 has column 'zzz', which the stream lacks"),
    ({"a": [1], "b": [1.0]}, 1.0, "the dict of columns has no column 'name'"),
    ({"a": np.array([1.5]), "b": [1.0], "name": ["x"]}, 1.0, "got an array of float64"),
    ({"a": [1, 2], "b": [1.0], "name": ["x"]}, 1.0, "different lengths"),
    ([(1, 1.0, "x")] * 2, [1.0], "got 1 timestamps for 2 rows"),
    ([(1, 1.0, "x")] * 2, [3000.0, 2999.0], "row 1: ts 2999.0 is older than row 0"),
    ([(1, 1.0, "x")], 999.0, "older than the stream's latest ts 1019.0"),
    ([(1, 1.0, "x")], float("inf"), "not a finite number"),
    ("abc", 1.0, "rows must be"),
])
def test_bad_batch_is_rejected_whole(mode: ModeName, rows: Any, ts: Any, message: str) -> None:
    eng, _ = make(mode)
    handles = [eng.register("SELECT a FROM R")]
    fill(eng)
    before = snapshot(eng, handles)
    with pytest.raises(SchemaError, match=message):
        eng.insert("R", rows, ts=ts)
    assert snapshot(eng, handles) == before
    eng.insert("R", [(99, 0.0, "ok")], ts=1019.0)           # the stream still accepts data
    assert eng.invoke(handles[0], now=2000.0).rows[-1] == (99,)


@pytest.mark.parametrize("sql, message", [
    ("SELECT a FROM Q", "unknown stream 'Q'"),
    ("SELECT speeed FROM R", "unknown column 'speeed'"),
    ("SELECT a FROM R WHERE name > 3", "TEXT"),
    ("SELECT a FROM R WHERE a > 1 OR a < 0", "not supported"),
    ("SELECT a, COUNT(*) FROM R", "must appear in GROUP BY"),
    ("SELECT a FROM R BEGIN 10 END 5", "BEGIN"),
    ("SELECT a FROM R WHERE", "line 1"),
    ("CREATE STREAM R (a INT)", "already exists"),
])
def test_bad_statement_is_rejected_and_registers_nothing(mode: ModeName, sql: str,
                                                        message: str) -> None:
    eng, _ = make(mode)
    handles = [eng.register("SELECT a FROM R")]
    fill(eng)
    before = snapshot(eng, handles)
    with pytest.raises(QueryError, match=message):
        eng.execute(sql)
    assert snapshot(eng, handles) == before


def test_insert_into_unknown_stream_names_the_known_ones(mode: ModeName) -> None:
    eng, _ = make(mode)
    with pytest.raises(QueryError, match=r"unknown stream 'X' \(streams: R\)"):
        eng.insert("X", [(1,)])


def test_a_stream_or_statement_that_is_not_a_string_is_a_query_error(mode: ModeName) -> None:
    eng, _ = make(mode)
    handles = [eng.register("SELECT * FROM R WHERE a > 1")]
    eng.insert("R", [(2, 1.0, "x")], ts=1000.0)
    before = snapshot(eng, handles)
    for call in (  # the tested calls pass what is no str, past the type checker
            lambda: eng.insert(np.array([1, 2]), [(1,)]),  # type: ignore[arg-type]  # see above
            lambda: eng.register(5),  # type: ignore[arg-type]  # see above
            lambda: eng.execute(None),  # type: ignore[arg-type]  # see above
            lambda: eng.register(b"SELECT * FROM R")):  # type: ignore[arg-type]  # see above
        with pytest.raises(QueryError, match="is a string|by a string"):
            call()
    assert snapshot(eng, handles) == before


def test_registrations_beyond_max_queries_are_refused_and_change_nothing(mode: ModeName,
                                                                        tmp_path: Path) -> None:
    eng = psoup.Engine(mode=mode, path=str(tmp_path), max_queries=2, clock=Clock(1000.0))
    eng.execute("CREATE STREAM R (a INT)")
    first = eng.register("SELECT * FROM R WHERE a > 1")
    eng.execute("SELECT * FROM R WHERE a > 2")
    calls: list[Callable[[], object]] = [lambda: eng.register("SELECT * FROM R WHERE a > 3"),
                                         lambda: eng.execute("SELECT * FROM R WHERE a > 3")]
    for call in calls:
        with pytest.raises(psoup.LimitError, match=r"2 standing queries.*max_queries=2"):
            call()
    assert len(eng.queries()) == 2
    limits = eng.stats()["limits"]
    assert (limits["queries"], limits["max_queries"], limits["max_factors"]) == (2, 2, None)
    eng.unregister(first)
    eng.register("SELECT * FROM R WHERE a > 3")       # room again
    eng.close()
    reopened = psoup.Engine(mode=mode, path=str(tmp_path), max_queries=1)   # a lower limit
    assert len(reopened.queries()) == 2               # recovery keeps what was admitted
    with pytest.raises(psoup.LimitError):
        reopened.register("SELECT * FROM R")
    reopened.close()


@pytest.mark.parametrize("retain", ["", "RETAIN 50 ROWS", "RETAIN 10 SECONDS"])
def test_a_batch_beyond_max_stream_bytes_is_refused_and_changes_nothing(tmp_path: Path,
                                                                       retain: str) -> None:
    """The limit counts what the stream retains after the batch, its RETAIN rule applied:
    a batch that stays within it after expiry is stored, one that would not is refused
    whole, and recovery replays what was admitted whatever the limit is now."""
    per_row = 8 + 1 + 58 + 16                     # INT, BOOL, TEXT, ts and tupleID
    eng = psoup.Engine(path=str(tmp_path), max_stream_bytes=60 * per_row)
    eng.execute(f"CREATE STREAM R (a INT, b BOOL, c TEXT) {retain}")
    handle = eng.register("SELECT a FROM R")

    def rows(n: int, start: int) -> dict[str, Any]:
        return {"a": np.arange(start, start + n), "b": np.zeros(n, bool), "c": ["x"] * n}
    eng.insert("R", rows(40, 0), ts=np.linspace(0.0, 5.0, 40))
    before = eng.stats()
    assert before["limits"]["stream_bytes"] == {"R": 40 * per_row}
    big = rows(30, 40)
    if retain == "":                              # 70 rows retained: refused whole
        with pytest.raises(psoup.LimitError, match=r"stream 'R'.*70 rows.*max_stream_bytes"):
            eng.insert("R", big, ts=np.arange(40.0, 70.0))
        keys = ("rows", "rows_total", "bytes", "latest_ts")
        assert [eng.stats()["streams"]["R"][k] for k in keys] == \
            [before["streams"]["R"][k] for k in keys]
        assert len(eng.invoke(handle, now=100.0)) == 40
    else:                                         # expiry keeps it within: stored
        eng.insert("R", big, ts=np.arange(40.0, 70.0))
        assert eng.stats()["limits"]["stream_bytes"]["R"] <= 60 * per_row
        eng.insert("R", rows(61, 100), ts=np.arange(100.0, 161.0))    # expiry bounds it
    if retain == "":
        with pytest.raises(psoup.LimitError):
            eng.insert("R", rows(61, 100), ts=np.arange(100.0, 161.0))    # alone too big
    stored = len(eng.invoke(handle, now=200.0))
    eng.close()
    reopened = psoup.Engine(path=str(tmp_path), max_stream_bytes=per_row)   # a lower limit
    assert len(reopened.invoke(handle, now=200.0)) == stored   # recovery keeps it all
    reopened.close()


def test_registrations_beyond_max_results_bytes_are_refused_and_change_nothing() -> None:
    """PSoup-P: the 65th query needs a second word in every retained row; the limit
    refuses it before anything changes, and the bound it checked is what registering
    it and the next batch really cost."""
    chunk, retained = 64, 512
    free = psoup.Engine(chunk_rows=chunk)
    free.execute("CREATE STREAM R (a INT)")
    free.insert("R", {"a": np.arange(retained)}, ts=0.0)
    for i in range(64):
        free.register(f"SELECT * FROM R WHERE a > {i}")
    one_word = free.stats()["memory"]["results"]
    free.register("SELECT * FROM R WHERE a > 64")
    free.insert("R", {"a": np.arange(1)}, ts=1.0)
    two_words = free.stats()["memory"]["results"]
    assert two_words > one_word

    eng = psoup.Engine(chunk_rows=chunk, max_results_bytes=one_word)
    eng.execute("CREATE STREAM R (a INT)")
    eng.insert("R", {"a": np.arange(retained)}, ts=0.0)
    handles = [eng.register(f"SELECT * FROM R WHERE a > {i}") for i in range(64)]
    before = eng.stats()
    with pytest.raises(psoup.LimitError, match=r"results memory from .* past its limit"):
        eng.register("SELECT * FROM R WHERE a > 64")
    after = eng.stats()
    assert after["queries"] == before["queries"] and after["memory"] == before["memory"]
    assert after["limits"]["results_bytes"] == one_word
    eng.unregister(handles[0])                    # a free slot in the first word: room
    eng.register("SELECT * FROM R WHERE a > 64")
    eng._check()
    roomy = psoup.Engine(chunk_rows=chunk, max_results_bytes=two_words)
    roomy.execute("CREATE STREAM R (a INT)")
    roomy.insert("R", {"a": np.arange(retained)}, ts=0.0)
    for i in range(65):                           # the bound is not above the real cost
        roomy.register(f"SELECT * FROM R WHERE a > {i}")


def test_a_timestamp_in_milliseconds_is_refused_with_advice_and_changes_nothing() -> None:
    """A ms clock read as seconds would put the stream thousands of years ahead and
    refuse every correct ts after it: refused by default, the unit named."""
    eng = psoup.Engine()
    eng.execute("CREATE STREAM R (a INT)")
    handle = eng.register("SELECT a FROM R")
    eng.insert("R", [(1,)], ts=1_795_353_000.0)
    stamps = np.array([1_795_353_001.0, 1_795_353_067_184.0])
    with pytest.raises(SchemaError, match=r"row 1: ts 1795353067184.0 is past max_ts.*"
                                          r"milliseconds since the epoch \(2026-11-22\).*"
                                          r"--ts-unit ms"):
        eng.insert("R", [(2,), (3,)], ts=stamps)
    eng.insert("R", [(4,)], ts=1_795_353_002.0)              # the stream is unharmed
    assert [r[0] for r in eng.invoke(handle, now=1_795_353_010.0).rows] == [1, 4]
    free = psoup.Engine(max_ts=None)                          # asked for: accepted
    free.execute("CREATE STREAM R (a INT)")
    free.insert("R", [(1,)], ts=1_795_353_067_184.0)


def test_limits_must_be_positive_integers() -> None:
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="max_stream_bytes must be a positive integer"):
            psoup.Engine(max_stream_bytes=bad)  # type: ignore[arg-type]  # tested


def test_bad_mode_and_sync_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        psoup.Engine(mode="fast")  # type: ignore[arg-type]  # wrong on purpose
    with pytest.raises(ValueError, match="unknown sync"):
        psoup.Engine(sync="sometimes")  # type: ignore[arg-type]  # wrong on purpose


@pytest.mark.parametrize("mode", ["partial", "complete"])
def test_a_slot_a_join_left_reads_only_its_new_querys_matches(mode: ModeName) -> None:
    """PSoup-P's chunks hold the probe's bits of every slot on the stream (a join's
    local slots too); a slot reused by a selection must not inherit them."""
    eng = psoup.Engine(mode=mode, chunk_rows=16)
    eng.execute("CREATE STREAM R (a INT, b INT)")
    join = eng.register("SELECT r1.a FROM R r1, R r2 WHERE r1.a = r2.b AND r1.a > 0")
    eng.insert("R", {"a": np.arange(40), "b": np.arange(40)}, ts=np.arange(40.0))
    eng.unregister(join)
    handle = eng.register("SELECT a FROM R WHERE a < 3")      # takes the join's slot
    eng.insert("R", {"a": np.arange(5), "b": np.zeros(5, np.int64)}, ts=40.0)
    assert sorted(eng.invoke(handle, now=50).rows) == [(0,), (0,), (1,), (1,), (2,), (2,)]
    eng._check()


def test_many_queries_widen_the_bitmap_by_exact_words() -> None:
    eng = psoup.Engine(chunk_rows=64)
    eng.execute("CREATE STREAM R (a INT)")
    eng.insert("R", {"a": np.arange(100)}, ts=np.arange(100.0))
    handles = [eng.register(f"SELECT a FROM R WHERE a = {i}") for i in range(130)]
    eng.insert("R", {"a": np.arange(100)}, ts=100.0)
    # at most 3 words (130 slots) per row in 4 chunks of 64 rows; never 4 (a power of 2)
    from psoup.results.partial import ROW_PAD
    row = 8 * (64 + ROW_PAD)
    assert 2 * row * 4 < eng.stats()["memory"]["results"] <= 3 * row * 4
    for i in (0, 64, 99, 129):
        assert len(eng.invoke(handles[i], now=200).rows) == (2 if i < 100 else 0)
    eng._check()


# ---------------------------------------------------------------- the catalog

def test_show_streams_lists_every_stream_with_its_counts(mode: ModeName) -> None:
    eng, _ = make(mode, "CREATE STREAM R (a INT, b FLOAT, name TEXT) RETAIN 2 HOURS")
    eng.execute("CREATE STREAM S (c BOOL) RETAIN 10 ROWS")
    eng.register("SELECT a FROM R WHERE a > 3")
    fill(eng, 5)
    res = eng.execute("SHOW STREAMS")
    assert isinstance(res, psoup.Result)
    assert res.to_dicts() == [
        {"stream": "R", "columns": "a INT, b FLOAT, name TEXT", "retain": "2 HOURS",
         "rows": 5, "rows_total": 5, "latest_ts": 1004.0, "queries": 1, "source": None,
         "source_state": None, "source_batches": None},
        {"stream": "S", "columns": "c BOOL", "retain": "10 ROWS", "rows": 0,
         "rows_total": 0, "latest_ts": None, "queries": 0, "source": None,
         "source_state": None, "source_batches": None}]
    assert eng.streams() == ["R", "S"]


def test_describe_is_one_stream_of_show_streams(mode: ModeName) -> None:
    eng, _ = make(mode)
    fill(eng, 3)
    described = eng.execute("DESCRIBE R")
    assert isinstance(described, Result)
    assert described.to_dicts() == [eng.describe("R")]
    assert eng.describe("R")["latest_ts"] == 1002.0


def test_show_queries_lists_handles_and_sql(mode: ModeName) -> None:
    eng, _ = make(mode)
    h = eng.register("SELECT a FROM R WHERE a > 3")
    shown = eng.execute("SHOW QUERIES")
    assert isinstance(shown, Result)
    assert shown.rows == [(h, "SELECT a FROM R WHERE a > 3")]


def test_drop_stream_refused_while_queries_read_it_changes_nothing(mode: ModeName) -> None:
    eng, _ = make(mode)
    eng.execute("CREATE STREAM S (c INT)")
    h = eng.register("SELECT * FROM R, S WHERE R.a = S.c")
    fill(eng, 5)
    with pytest.raises(QueryError) as info:
        eng.execute("DROP STREAM S")
    assert h in str(info.value) and "use DROP STREAM S CASCADE to" in str(info.value)
    with pytest.raises(QueryError, match=r"use drop_stream\('S', cascade=True\) to"):
        eng.drop_stream("S")
    assert eng.streams() == ["R", "S"] and [q for q, _ in eng.queries()] == [h]
    assert eng.describe("R")["rows"] == 5
    eng._check()


def test_drop_stream_cascade_unregisters_its_queries_only(mode: ModeName) -> None:
    eng, _ = make(mode)
    eng.execute("CREATE STREAM S (c INT)")
    keep = eng.register("SELECT a FROM R WHERE a > 3")
    join = eng.register("SELECT * FROM R, S WHERE R.a = S.c")
    agg = eng.register("SELECT count(*) FROM S")
    fill(eng)
    eng.insert("S", [(4,), (5,)], ts=1020.0)
    assert eng.execute("DROP STREAM S CASCADE") is None
    assert [q for q, _ in eng.queries()] == [keep] and eng.streams() == ["R"]
    for gone in (join, agg):
        with pytest.raises(UnknownHandle):
            eng.invoke(gone)
    assert [r[0] for r in eng.invoke(keep)] == list(range(4, 20))
    eng._check()


def test_a_stream_created_after_its_drop_starts_empty(mode: ModeName) -> None:
    eng, _ = make(mode)
    eng.register("SELECT a FROM R WHERE a > 3")
    fill(eng)
    eng.drop_stream("R", cascade=True)
    eng._check()
    eng.execute("CREATE STREAM R (z TEXT)")
    h = eng.register("SELECT z FROM R")
    assert eng.invoke(h).rows == [] and eng.describe("R")["rows_total"] == 0
    eng.insert("R", [("x",)], ts=990.0)         # the old stream's latest ts is forgotten
    assert eng.invoke(h).rows == [("x",)]
    eng._check()


def test_drop_of_an_unknown_stream_is_an_error(mode: ModeName) -> None:
    eng, _ = make(mode)
    with pytest.raises(QueryError, match="unknown stream 'S' \\(streams: R\\)"):
        eng.execute("DROP STREAM S")
    with pytest.raises(QueryError, match="unknown stream 'S'"):
        eng.drop_stream("S")
    with pytest.raises(QueryError, match="unknown stream 'S'"):
        eng.describe("S")
