"""Aggregate queries through the engine (PSoup Sect. 6): COUNT, SUM, AVG, MIN, MAX and
GROUP BY over sliding, landmark, snapshot, ROWS and PARTITION BY windows, over joins,
with `since` cursors and across restarts, and a differential test of every mode
against DuckDB.

Answer semantics (docs/semantics.md, "Aggregates"): one row per group, ordered by the
group key; without GROUP BY exactly one row, even over an empty window (COUNT 0, the
others NULL, as SQL). SUM over INT is an exact Python int, AVG a float.

Float tolerance: PSoup-P and PSoup-C answer SUM and AVG from differences of prefix sums
(psoup/results/aggregates.py), which round differently from DuckDB's running sum; the
error is a few ulps of the prefix, so floats are compared with a relative tolerance of
1e-9 and an absolute one of 1e-6 (the prefixes here stay below 1e6: ts near 1000 times
at most a few hundred rows). Integers, NULLs and types must match exactly.

Expected answers in the unit tests are worked out by hand from the data in comments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

import hypothesis.strategies as st
import pytest
from hypothesis import event, given, settings

import psoup
from psoup.options import ModeName
from psoup.results.result import Changes
from tests.oracles import JoinOracle, Oracle, answer_aggregate, assert_changes_compose, rows_match
from tests.strategies import Scenario, aggregate_scenarios, join_aggregate_scenarios
from tests.support import Clock, create, insert_stepped

#: (cursor, answer rows) of the last poll of each mode's chain of since polls.
Cursors: TypeAlias = dict[str, tuple[str | None, list[tuple[Any, ...]]]]
#: A registered join query: (handles per mode, spec, sql, cursors).
JoinLive: TypeAlias = tuple[dict[str, str], dict[str, Any], str, Cursors]

TRAFFIC = [  # (lane, speed, road) at ts 1 .. 8
    (1, 50.0, "a"), (2, 30.0, "b"), (1, 70.0, "a"), (3, 20.0, "a"),
    (2, 90.0, "b"), (1, 10.0, "b"), (3, 60.0, "a"), (2, 40.0, "a"),
]


@pytest.fixture(params=psoup.MODES)
def eng(request: pytest.FixtureRequest) -> psoup.Engine:
    eng = psoup.Engine(mode=request.param, clock=Clock(8.0), chunk_rows=4)
    eng.execute("CREATE STREAM traffic (lane INT, speed FLOAT, road TEXT)")
    return eng


def fill(eng: psoup.Engine, rows: list[tuple[Any, ...]] = TRAFFIC, first_ts: float = 1.0) -> None:
    for i, row in enumerate(rows):
        eng.insert("traffic", [row], ts=first_ts + i)


FIVE = "SELECT COUNT(*), SUM(speed), AVG(speed), MIN(speed), MAX(speed) FROM traffic"


@pytest.mark.parametrize("window, want", [
    # ts 4..8: speeds 20, 90, 10, 60, 40
    ("BEGIN NOW - 4 END NOW", (5, 220.0, 44.0, 10.0, 90.0)),
    # landmark from ts 3: 70, 20, 90, 10, 60, 40
    ("BEGIN 3 END NOW", (6, 290.0, 290.0 / 6, 10.0, 90.0)),
    # snapshot ts 2..5: 30, 70, 20, 90
    ("BEGIN 2 END 5", (4, 210.0, 52.5, 20.0, 90.0)),
    # the last 3 tuples: 10, 60, 40
    ("BEGIN (NOW - 3 ROWS) END NOW", (3, 110.0, 110.0 / 3, 10.0, 60.0)),
    # the whole stream
    ("", (8, 370.0, 46.25, 10.0, 90.0)),
])
@pytest.mark.parametrize("register_first", [True, False])
def test_the_five_aggregates_over_each_kind_of_window(eng: psoup.Engine, window: str,
                                                      want: tuple[Any, ...],
                                                      register_first: bool) -> None:
    if not register_first:
        fill(eng)
    h = eng.register(f"{FIVE} {window}")
    if register_first:
        fill(eng)
    got = eng.invoke(h, now=8.0)
    assert got.columns == ["count(*)", "sum(speed)", "avg(speed)", "min(speed)",
                           "max(speed)"]
    assert len(got.rows) == 1
    assert got.rows[0][0] == want[0] and type(got.rows[0][0]) is int
    assert got.rows[0][1:] == pytest.approx(want[1:], rel=1e-12)


def test_an_empty_window_gives_one_row_of_count_zero_and_nulls(eng: psoup.Engine) -> None:
    fill(eng)
    h = eng.register(f"{FIVE} BEGIN NOW - 4 END NOW")
    assert eng.invoke(h, now=100.0).rows == [(0, None, None, None, None)]
    grouped = eng.register("SELECT lane, COUNT(*) FROM traffic GROUP BY lane "
                           "BEGIN NOW - 4 END NOW")
    assert eng.invoke(grouped, now=100.0).rows == []


def test_group_by_gives_a_row_per_group_in_key_order(eng: psoup.Engine) -> None:
    fill(eng)
    h = eng.register("SELECT lane, COUNT(*) AS n, SUM(speed), MAX(speed) AS top FROM traffic "
                     "GROUP BY lane BEGIN NOW - 4 END NOW")
    got = eng.invoke(h, now=8.0)
    assert got.columns == ["lane", "n", "sum(speed)", "top"]
    # ts 4..8: lane 3: 20, 60; lane 2: 90, 40; lane 1: 10
    assert got.rows == [(1, 1, 10.0, 10.0), (2, 2, 130.0, 90.0), (3, 2, 80.0, 60.0)]
    # each group's ts is its latest tuple's: lane 1 at 6, lane 2 at 8, lane 3 at 7
    assert got.ts.tolist() == [6.0, 8.0, 7.0]


def test_group_by_two_columns_and_a_text_key_with_where(eng: psoup.Engine) -> None:
    fill(eng)
    h = eng.register("SELECT road, lane, SUM(lane), MIN(speed) FROM traffic "
                     "WHERE speed >= 20 GROUP BY road, lane")
    # speed >= 20 drops (1, 10.0, b); a: lane 1 (50, 70), lane 2 (40), lane 3 (20, 60);
    # b: lane 2 (30, 90)
    assert eng.invoke(h, now=8.0).rows == [
        ("a", 1, 2, 50.0), ("a", 2, 2, 40.0), ("a", 3, 6, 20.0), ("b", 2, 4, 30.0)]


def test_int_sums_are_exact_ints_beyond_float_precision(eng: psoup.Engine) -> None:
    eng.execute("CREATE STREAM big (v INT)")
    h = eng.register("SELECT SUM(v), AVG(v), MAX(v), COUNT(v) FROM big")
    top = 2**62 + 1
    eng.insert("big", [(top,), (top,), (-5,)], ts=1.0)
    total, avg, biggest, n = eng.invoke(h, now=2.0).rows[0]
    assert total == 2 * top - 5 and type(total) is int     # beyond int64: exact
    assert biggest == top and type(biggest) is int and n == 3
    assert avg == pytest.approx((2 * top - 5) / 3)


def test_a_float_group_sum_rounds_only_its_own_values(eng: psoup.Engine) -> None:
    """Each group's SUM is its own values summed, whatever groups come before it in key
    order (a difference of one prefix over every group gave NoMat's group of one 2.0 the
    sum 1.9999999999999998, and a DISTINCT then kept a row too many)."""
    eng.execute("CREATE STREAM f (c0 FLOAT)")
    h = eng.register("SELECT c0, SUM(c0) FROM f GROUP BY c0")
    values = [-2.5, 0.2, 0.5, 0.1, 0.1, 0.2, 0.5, 2.0, 0.5, 0.5, 0.1, 1.0, -2.5, 1.575]
    eng.insert("f", [(v,) for v in values], ts=1.0)
    got = dict(eng.invoke(h, now=2.0).rows)
    assert got == {c: math.fsum(v for v in values if v == c) for c in set(values)}


def test_partition_windows_aggregate_the_latest_per_partition(eng: psoup.Engine) -> None:
    fill(eng)
    h = eng.register("SELECT COUNT(*), SUM(speed) FROM traffic [PARTITION BY lane ROWS 1]")
    # the latest of each lane: lane 1 at ts 6 (10), lane 3 at ts 7 (60), lane 2 at ts 8 (40)
    assert eng.invoke(h, now=8.0).rows == [(3, 110.0)]


def test_retention_expires_aggregated_results(eng: psoup.Engine) -> None:
    eng.execute("CREATE STREAM kept (v INT) RETAIN 3 ROWS")
    h = eng.register("SELECT COUNT(*), SUM(v), MIN(v), MAX(v) FROM kept")
    for i, v in enumerate([9, 1, 5, 7, 2]):
        eng.insert("kept", [(v,)], ts=float(i))
    # the last 3: 5, 7, 2
    assert eng.invoke(h, now=10.0).rows == [(3, 14, 2, 7)]


def test_aggregates_over_a_join(eng: psoup.Engine) -> None:
    fill(eng)
    eng.execute("CREATE STREAM S (lane INT, cap FLOAT)")
    eng.insert("S", [(1, 40.0), (2, 50.0)], ts=8.0)
    h = eng.register("SELECT T.lane, COUNT(*) AS n, MAX(T.speed), SUM(S.cap) "
                     "FROM traffic T, S WHERE T.lane = S.lane AND T.speed > S.cap "
                     "GROUP BY T.lane")
    # lane 1: 50, 70 over 40; lane 2: 90 over 50; lane 3 has no S row
    got = eng.invoke(h, now=8.0)
    assert got.columns == ["lane", "n", "max(T.speed)", "sum(S.cap)"]   # no clash: bare
    assert got.rows == [(1, 2, 70.0, 80.0), (2, 1, 90.0, 50.0)]
    total = eng.register("SELECT COUNT(*) FROM traffic T, S WHERE T.lane = S.lane")
    assert eng.invoke(total, now=8.0).rows == [(6,)]     # 3 lane-1 and 3 lane-2 tuples


def test_since_returns_only_the_groups_that_changed(eng: psoup.Engine) -> None:
    fill(eng)
    h = eng.register("SELECT lane, COUNT(*), MAX(speed) FROM traffic GROUP BY lane")
    first = eng.invoke(h, now=8.0)
    assert first.rows == [(1, 3, 70.0), (2, 3, 90.0), (3, 2, 60.0)]
    eng.insert("traffic", [(1, 99.0, "a"), (4, 1.0, "b")], ts=9.0)
    changes = eng.invoke(h, now=9.0, since=first.cursor)
    assert isinstance(changes, Changes)     # a str cursor (Result.cursor is Optional)
    # lane 1 changed (count 4, max 99), lane 4 appeared; lanes 2 and 3 did not change
    assert sorted(changes.inserted.rows) == [(1, 4, 99.0), (4, 1, 1.0)]
    assert changes.deleted.rows == [(1, 3, 70.0)]
    again = eng.invoke(h, now=9.0, since=changes.cursor)
    assert len(again) == 0


def test_since_counts_equal_rows_of_different_groups_separately() -> None:
    # COUNT(*) GROUP BY g without g: groups 1 and 2 both show (1,); the second group's
    # row is new even though an equal row was in the answer (a multiset, not a set)
    for mode in psoup.MODES:
        eng = psoup.Engine(mode=mode)
        eng.execute("CREATE STREAM R (g INT, x INT)")
        h = eng.register("SELECT COUNT(*) FROM R GROUP BY g BEGIN NOW - 10 END NOW")
        eng.insert("R", [(1, 0)], ts=1.0)
        first = eng.invoke(h, now=10)
        assert first.rows == [(1,)]
        eng.insert("R", [(2, 0)], ts=2.0)
        changes = eng.invoke(h, now=10, since=first.cursor)
        assert isinstance(changes, Changes)
        assert (changes.inserted.rows, changes.deleted.rows) == ([(1,)], []), mode
        # group 1 grows to 2: its old row (1,) leaves, (2,) enters; group 2 stays (1,)
        eng.insert("R", [(1, 5)], ts=3.0)
        again = eng.invoke(h, now=10, since=changes.cursor)
        assert (again.inserted.rows, again.deleted.rows) == ([(2,)], [(1,)]), mode
        # both groups leave the window: two rows leave
        gone = eng.invoke(h, now=100, since=again.cursor)
        assert sorted(gone.deleted.rows) == [(1,), (2,)] and gone.inserted.rows == [], mode


def test_contradictory_aggregate_counts_nothing(eng: psoup.Engine) -> None:
    fill(eng)
    h = eng.register("SELECT COUNT(*), SUM(lane) FROM traffic WHERE lane > 5 AND lane < 2")
    assert eng.invoke(h, now=8.0).rows == [(0, None)]


def test_unregistering_an_aggregate_query_frees_its_structure(eng: psoup.Engine) -> None:
    fill(eng)
    h = eng.register("SELECT COUNT(*) FROM traffic")
    eng.unregister(h)
    eng._check()                        # no structure is kept for a slot nobody has
    h2 = eng.register("SELECT SUM(lane) FROM traffic WHERE road = 'b'")   # reuses the slot
    eng.insert("traffic", [(5, 1.0, "b")], ts=9.0)
    assert eng.invoke(h2, now=9.0).rows == [(2 + 2 + 1 + 5,)]


def test_aggregate_handles_survive_a_restart(tmp_path: Path) -> None:
    with psoup.Engine(path=str(tmp_path / "d"), clock=Clock(8.0)) as eng:
        eng.execute("CREATE STREAM traffic (lane INT, speed FLOAT, road TEXT)")
        h = eng.register("SELECT lane, AVG(speed) FROM traffic GROUP BY lane "
                         "BEGIN NOW - 4 END NOW")
        fill(eng)
        before = eng.invoke(h, now=8.0).rows
    with psoup.Engine(path=str(tmp_path / "d"), clock=Clock(8.0)) as eng:
        assert eng.invoke(h, now=8.0).rows == before == [(1, 10.0), (2, 65.0), (3, 40.0)]


# ----------------------------------------------------------------------------------
# Differential: every mode against DuckDB

@given(aggregate_scenarios(), st.sampled_from([2, 3, 8, 8192]))
def test_aggregates_agree_with_duckdb_in_every_mode(scenario: Scenario, chunk_rows: int) -> None:
    streams, ops = scenario
    clock = Clock(1000.0)
    engines = {m: psoup.Engine(mode=m, clock=clock, chunk_rows=chunk_rows) for m in psoup.MODES}
    for eng in engines.values():
        create(eng, streams)
    oracle = Oracle(streams)
    last_ts = {"R": 1000.0}
    live: list[list[Any]] = []    # (handles per mode, spec, sql, (cursor, answer rows) per mode)

    for op in ops:
        if op[0] == "insert":
            _, rows, steps = op
            insert_stepped(engines, oracle, clock, last_ts, "R", rows, steps)
        elif op[0] == "register":
            sql, spec = op[1]
            live.append([{m: eng.register(sql) for m, eng in engines.items()}, spec, sql, {}])
        elif op[0] == "invoke" and live:
            _check_aggregate(engines, oracle, live[op[1] % len(live)], clock.now + op[2])
        elif op[0] == "unregister" and live:
            handles = live.pop(op[1] % len(live))[0]
            for mode, eng in engines.items():
                eng.unregister(handles[mode])
        elif op[0] == "invoke_all":
            for entry in live:
                _check_aggregate(engines, oracle, entry, clock.now + op[1])


def _check_aggregate(engines: Mapping[ModeName, psoup.Engine], oracle: Oracle, entry: list[Any],
                     now: float) -> None:
    handles, spec, sql, cursors = entry
    want = answer_aggregate(oracle.db, oracle.source(spec, now), spec)
    event(f"groups: {'0' if not want else '1' if len(want) == 1 else '2+'}")
    for mode, eng in engines.items():
        got = eng.invoke(handles[mode], now=now)
        assert got.columns == spec["names"], (mode, sql)
        assert rows_match(got.rows, want), (mode, sql, now, got.rows, want)
        if mode in cursors:     # a since chain: each poll from the last one's cursor
            cursor, before = cursors[mode]
            changes = eng.invoke(handles[mode], now=now, since=cursor)
            assert isinstance(changes, Changes)
            # psoup's own answers on both sides: exact, float bits included
            assert_changes_compose(before, changes, got.rows, (mode, sql, now))
            cursors[mode] = changes.cursor, got.rows
        else:
            cursors[mode] = got.cursor, got.rows


@settings(max_examples=max(10, settings().max_examples // 5))
@given(join_aggregate_scenarios())
def test_join_aggregates_agree_with_duckdb_in_every_mode(scenario: Scenario) -> None:
    streams, ops = scenario
    clock = Clock(1000.0)
    engines = {m: psoup.Engine(mode=m, clock=clock, chunk_rows=3) for m in psoup.MODES}
    for eng in engines.values():
        create(eng, streams)
    oracle = JoinOracle(streams)
    last_ts = {name: 1000.0 for name in streams}
    live: list[JoinLive] = []

    for op in ops:
        if op[0] == "insert":
            _, stream, rows, steps, synced = op
            insert_stepped(engines, oracle, clock, last_ts, stream, rows, steps, synced)
        elif op[0] == "register":
            sql, spec = op[1]
            live.append(({m: eng.register(sql) for m, eng in engines.items()}, spec, sql, {}))
        elif op[0] == "invoke" and live:
            _check_join_aggregate(engines, oracle, live[op[1] % len(live)], clock.now + op[2])
        elif op[0] == "unregister" and live:
            handles = live.pop(op[1] % len(live))[0]
            for mode, eng in engines.items():
                eng.unregister(handles[mode])
        elif op[0] == "invoke_all":
            for entry in live:
                _check_join_aggregate(engines, oracle, entry, clock.now + op[1])


def _check_join_aggregate(engines: Mapping[ModeName, psoup.Engine], oracle: JoinOracle,
                          entry: JoinLive, now: float) -> None:
    handles, spec, sql, cursors = entry
    sources = ", ".join(f"({oracle.windowed(s, w, now)}) AS x{i}"
                        for i, (s, w) in enumerate(zip(spec["items"], spec["windows"],
                                                       strict=True)))
    want = answer_aggregate(oracle.db, sources, spec)
    for mode, eng in engines.items():
        got = eng.invoke(handles[mode], now=now)
        assert got.columns == spec["names"], (mode, sql)
        assert rows_match(got.rows, want), (mode, sql, now, got.rows, want)
        if mode in cursors:
            cursor, before = cursors[mode]
            changes = eng.invoke(handles[mode], now=now, since=cursor)
            assert isinstance(changes, Changes)
            assert_changes_compose(before, changes, got.rows, (mode, sql, now))
        cursors[mode] = got.cursor, got.rows
