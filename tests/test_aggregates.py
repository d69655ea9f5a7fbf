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

import hypothesis.strategies as st
import pytest
from hypothesis import event, given, settings

import psoup
from tests.conftest import Clock
from tests.test_differential import (VALUES, Oracle, create, factors, insert_stepped,
                                     schemas, windows)
from tests.test_joins import JoinOracle, join_scenarios

TRAFFIC = [  # (lane, speed, road) at ts 1 .. 8
    (1, 50.0, "a"), (2, 30.0, "b"), (1, 70.0, "a"), (3, 20.0, "a"),
    (2, 90.0, "b"), (1, 10.0, "b"), (3, 60.0, "a"), (2, 40.0, "a"),
]


@pytest.fixture(params=psoup.MODES)
def eng(request):
    eng = psoup.Engine(mode=request.param, clock=Clock(8.0), chunk_rows=4)
    eng.execute("CREATE STREAM traffic (lane INT, speed FLOAT, road TEXT)")
    return eng


def fill(eng, rows=TRAFFIC, first_ts=1.0):
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
def test_the_five_aggregates_over_each_kind_of_window(eng, window, want, register_first):
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


def test_an_empty_window_gives_one_row_of_count_zero_and_nulls(eng):
    fill(eng)
    h = eng.register(f"{FIVE} BEGIN NOW - 4 END NOW")
    assert eng.invoke(h, now=100.0).rows == [(0, None, None, None, None)]
    grouped = eng.register("SELECT lane, COUNT(*) FROM traffic GROUP BY lane "
                           "BEGIN NOW - 4 END NOW")
    assert eng.invoke(grouped, now=100.0).rows == []


def test_group_by_gives_a_row_per_group_in_key_order(eng):
    fill(eng)
    h = eng.register("SELECT lane, COUNT(*) AS n, SUM(speed), MAX(speed) AS top FROM traffic "
                     "GROUP BY lane BEGIN NOW - 4 END NOW")
    got = eng.invoke(h, now=8.0)
    assert got.columns == ["lane", "n", "sum(speed)", "top"]
    # ts 4..8: lane 3: 20, 60; lane 2: 90, 40; lane 1: 10
    assert got.rows == [(1, 1, 10.0, 10.0), (2, 2, 130.0, 90.0), (3, 2, 80.0, 60.0)]
    # each group's ts is its latest tuple's: lane 1 at 6, lane 2 at 8, lane 3 at 7
    assert got.ts.tolist() == [6.0, 8.0, 7.0]


def test_group_by_two_columns_and_a_text_key_with_where(eng):
    fill(eng)
    h = eng.register("SELECT road, lane, SUM(lane), MIN(speed) FROM traffic "
                     "WHERE speed >= 20 GROUP BY road, lane")
    # speed >= 20 drops (1, 10.0, b); a: lane 1 (50, 70), lane 2 (40), lane 3 (20, 60);
    # b: lane 2 (30, 90)
    assert eng.invoke(h, now=8.0).rows == [
        ("a", 1, 2, 50.0), ("a", 2, 2, 40.0), ("a", 3, 6, 20.0), ("b", 2, 4, 30.0)]


def test_int_sums_are_exact_ints_beyond_float_precision(eng):
    eng.execute("CREATE STREAM big (v INT)")
    h = eng.register("SELECT SUM(v), AVG(v), MAX(v), COUNT(v) FROM big")
    top = 2**62 + 1
    eng.insert("big", [(top,), (top,), (-5,)], ts=1.0)
    total, avg, biggest, n = eng.invoke(h, now=2.0).rows[0]
    assert total == 2 * top - 5 and type(total) is int     # beyond int64: exact
    assert biggest == top and type(biggest) is int and n == 3
    assert avg == pytest.approx((2 * top - 5) / 3)


def test_partition_windows_aggregate_the_latest_per_partition(eng):
    fill(eng)
    h = eng.register("SELECT COUNT(*), SUM(speed) FROM traffic [PARTITION BY lane ROWS 1]")
    # the latest of each lane: lane 1 at ts 6 (10), lane 3 at ts 7 (60), lane 2 at ts 8 (40)
    assert eng.invoke(h, now=8.0).rows == [(3, 110.0)]


def test_retention_expires_aggregated_results(eng):
    eng.execute("CREATE STREAM kept (v INT) RETAIN 3 ROWS")
    h = eng.register("SELECT COUNT(*), SUM(v), MIN(v), MAX(v) FROM kept")
    for i, v in enumerate([9, 1, 5, 7, 2]):
        eng.insert("kept", [(v,)], ts=float(i))
    # the last 3: 5, 7, 2
    assert eng.invoke(h, now=10.0).rows == [(3, 14, 2, 7)]


def test_aggregates_over_a_join(eng):
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


def test_since_returns_only_the_groups_that_changed(eng):
    fill(eng)
    h = eng.register("SELECT lane, COUNT(*), MAX(speed) FROM traffic GROUP BY lane")
    first = eng.invoke(h, now=8.0)
    assert first.rows == [(1, 3, 70.0), (2, 3, 90.0), (3, 2, 60.0)]
    eng.insert("traffic", [(1, 99.0, "a"), (4, 1.0, "b")], ts=9.0)
    changes = eng.invoke(h, now=9.0, since=first.cursor)
    # lane 1 changed (count 4, max 99), lane 4 appeared; lanes 2 and 3 did not change
    assert sorted(changes.inserted.rows) == [(1, 4, 99.0), (4, 1, 1.0)]
    assert changes.deleted.rows == [(1, 3, 70.0)]
    again = eng.invoke(h, now=9.0, since=changes.cursor)
    assert len(again) == 0


def test_contradictory_aggregate_counts_nothing(eng):
    fill(eng)
    h = eng.register("SELECT COUNT(*), SUM(lane) FROM traffic WHERE lane > 5 AND lane < 2")
    assert eng.invoke(h, now=8.0).rows == [(0, None)]


def test_unregistering_an_aggregate_query_frees_its_structure(eng):
    fill(eng)
    h = eng.register("SELECT COUNT(*) FROM traffic")
    eng.unregister(h)
    assert eng._eddy.aggregates == {}
    h2 = eng.register("SELECT SUM(lane) FROM traffic WHERE road = 'b'")   # reuses the slot
    eng.insert("traffic", [(5, 1.0, "b")], ts=9.0)
    assert eng.invoke(h2, now=9.0).rows == [(2 + 2 + 1 + 5,)]


def test_aggregate_handles_survive_a_restart(tmp_path):
    with psoup.Engine(path=tmp_path / "d", clock=Clock(8.0)) as eng:
        eng.execute("CREATE STREAM traffic (lane INT, speed FLOAT, road TEXT)")
        h = eng.register("SELECT lane, AVG(speed) FROM traffic GROUP BY lane "
                         "BEGIN NOW - 4 END NOW")
        fill(eng)
        before = eng.invoke(h, now=8.0).rows
    with psoup.Engine(path=tmp_path / "d", clock=Clock(8.0)) as eng:
        assert eng.invoke(h, now=8.0).rows == before == [(1, 10.0), (2, 65.0), (3, 40.0)]


# ----------------------------------------------------------------------------------
# Differential: every mode against DuckDB

FUNCTIONS = ("COUNT", "SUM", "AVG", "MIN", "MAX")


def agg_value_ok(got, want) -> bool:
    if want is None or got is None:
        return got is None and want is None
    if isinstance(want, float) or isinstance(got, float):
        return (isinstance(got, float) and isinstance(want, float)
                and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6))
    return type(got) is type(want) and got == want


def rows_match(got, want) -> bool:
    return len(got) == len(want) and all(
        len(g) == len(w) and all(agg_value_ok(a, b) for a, b in zip(g, w))
        for g, w in zip(got, want))


@st.composite
def aggregate_select(draw, columns, ref, duck, pick, alias_keys=False):
    """(psoup select list, GROUP BY clause, DuckDB select list, DuckDB GROUP BY keys,
    output names) for columns [(owner, name, type)]; `ref`/`duck` spell a column in
    psoup/DuckDB, `pick` names an aggregate's default output; with `alias_keys` the
    group columns shown are renamed with AS."""
    numeric = [c for c in columns if c[2] in ("int", "float")]
    keys = draw(st.lists(st.sampled_from(columns), max_size=2, unique=True))
    shown = [k for k in keys if draw(st.booleans())]
    items, ducks, names = [], [], []        # items: (psoup expression, its alias)
    for pos, k in enumerate(shown):
        items.append((ref(k), f"k{pos}" if alias_keys else None))
        ducks.append(duck(k))
        names.append(f"k{pos}" if alias_keys else pick(k, None))
    for pos in range(draw(st.integers(0 if keys else 1, 3))):
        fn = draw(st.sampled_from(FUNCTIONS if numeric else ("COUNT",)))
        if fn == "COUNT" and draw(st.booleans()):
            arg, darg, name = "*", "*", "count(*)"
        else:
            col = draw(st.sampled_from(numeric if fn != "COUNT" else columns))
            arg, darg, name = ref(col), duck(col), pick(col, fn)
        alias = f"g{pos}" if draw(st.booleans()) else None
        items.append((f"{fn}({arg})", alias))
        ducks.append(f"{fn}({darg})")
        names.append(alias or name)
    if not items:                          # GROUP BY with no column shown: show a key
        items.append((ref(keys[0]), "k" if alias_keys else None))
        ducks.append(duck(keys[0]))
        names.append("k" if alias_keys else pick(keys[0], None))
    if len(set(names)) < len(names):       # the same default name twice: rename all
        items = [(expr, f"o{i}") for i, (expr, _) in enumerate(items)]
        names = [f"o{i}" for i in range(len(items))]
    select = ", ".join(expr + (f" AS {alias}" if alias else "") for expr, alias in items)
    group = (" GROUP BY " + ", ".join(ref(k) for k in keys)) if keys else ""
    return select, group, ", ".join(ducks), [duck(k) for k in keys], names


@st.composite
def aggregate_queries(draw, stream, columns):
    """A selection query with aggregates as (psoup SQL, spec for `answer_aggregate`)."""
    cols = [(0, n, t) for n, t in columns + [("ts", "float"), ("tupleID", "int")]]
    select, group, dselect, dkeys, names = draw(aggregate_select(
        cols, lambda c: c[1], lambda c: f'"{c[1]}"',
        lambda c, fn: c[1] if fn is None else f"{fn.lower()}({c[1]})"))
    where = draw(st.lists(factors(columns), max_size=3))
    suffix, clause, window = draw(windows(columns))
    distinct = draw(st.integers(0, 5)) == 0
    sql = f"SELECT {'DISTINCT ' if distinct else ''}{select} FROM {stream}{suffix}"
    if where:
        sql += " WHERE " + " AND ".join(p for p, _ in where)
    sql += group
    if clause:
        sql += " " + clause
    return sql, {"stream": stream, "where": [d for _, d in where], "window": window,
                 "select": dselect, "keys": dkeys, "names": names, "distinct": distinct}


def answer_aggregate(db, source, spec):
    where = " AND ".join(spec["where"]) or "TRUE"
    sql = f"SELECT {spec['select']} FROM {source} WHERE {where}"
    if spec["keys"]:
        keys = ", ".join(spec["keys"])
        sql += f" GROUP BY {keys} ORDER BY {keys}"
    rows = [tuple(r) for r in db.execute(sql).fetchall()]
    if spec["distinct"]:
        rows = list(dict.fromkeys(rows))
    return rows


@st.composite
def aggregate_scenarios(draw):
    streams = {"R": draw(schemas())}
    ops = []
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["insert", "insert", "insert", "register", "register",
                                     "invoke", "unregister"]))
        columns = streams["R"][0]
        if kind == "insert":
            n = draw(st.integers(1, 12))
            rows = [tuple(draw(VALUES[t]) for _, t in columns) for _ in range(n)]
            steps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0]), min_size=n,
                                  max_size=n))
            ops.append(("insert", rows, steps))
        elif kind == "register":
            ops.append(("register", draw(aggregate_queries("R", columns))))
        elif kind == "invoke":
            ops.append(("invoke", draw(st.integers(0, 20)), draw(st.integers(-12, 8))))
        else:
            ops.append(("unregister", draw(st.integers(0, 20))))
    ops.append(("register", draw(aggregate_queries("R", streams["R"][0]))))
    ops.append(("insert", [tuple(draw(VALUES[t]) for _, t in streams["R"][0])], [0.5]))
    ops.append(("invoke_all", draw(st.integers(-5, 5))))
    return streams, ops


@given(aggregate_scenarios(), st.sampled_from([2, 3, 8, 8192]))
def test_aggregates_agree_with_duckdb_in_every_mode(scenario, chunk_rows):
    streams, ops = scenario
    clock = Clock(1000.0)
    engines = {m: psoup.Engine(mode=m, clock=clock, chunk_rows=chunk_rows) for m in psoup.MODES}
    for eng in engines.values():
        create(eng, streams)
    oracle = Oracle(streams)
    last_ts = {"R": 1000.0}
    live = []        # (handles per mode, spec, sql, cursors per mode, last answer)

    def check(entry, now):
        handles, spec, sql, cursors, last = entry
        want = answer_aggregate(oracle.db, oracle.source(spec, now), spec)
        event(f"groups: {'0' if not want else '1' if len(want) == 1 else '2+'}")
        for mode, eng in engines.items():
            if mode in cursors:
                changes = eng.invoke(handles[mode], now=now, since=cursors[mode])
                gone = [r for r in last if not any(rows_match([r], [w]) for w in want)]
                new = [w for w in want if not any(rows_match([w], [r]) for r in last)]
                assert len(changes.inserted) == len(new), (mode, sql, now)
                assert len(changes.deleted) == len(gone), (mode, sql, now)
            got = eng.invoke(handles[mode], now=now)
            assert got.columns == spec["names"], (mode, sql)
            assert rows_match(got.rows, want), (mode, sql, now, got.rows, want)
            cursors[mode] = got.cursor
        entry[4] = want

    for op in ops:
        if op[0] == "insert":
            _, rows, steps = op
            insert_stepped(engines, oracle, clock, last_ts, "R", rows, steps)
        elif op[0] == "register":
            sql, spec = op[1]
            live.append([{m: eng.register(sql) for m, eng in engines.items()}, spec, sql,
                         {}, []])
        elif op[0] == "invoke" and live:
            check(live[op[1] % len(live)], clock.now + op[2])
        elif op[0] == "unregister" and live:
            handles = live.pop(op[1] % len(live))[0]
            for mode, eng in engines.items():
                eng.unregister(handles[mode])
        elif op[0] == "invoke_all":
            for entry in live:
                check(entry, clock.now + op[1])


@st.composite
def join_aggregate_scenarios(draw):
    """A join scenario (tests/test_joins.py) whose join queries aggregate instead."""
    streams, ops = draw(join_scenarios())
    out = []
    for op in ops:
        if op[0] == "register":
            out.append(("register", draw(as_aggregate(streams, op[1]))))
        elif op[0] != "select":
            out.append(op)
    return streams, out


@st.composite
def as_aggregate(draw, streams, query):
    """The join query with its select list replaced by aggregates and GROUP BY."""
    sql, spec = query
    items, aliases = spec["items"], spec["aliases"]
    names = [a or s for s, a in zip(items, aliases)]
    cols = [(i, c, t) for i, s in enumerate(items)
            for c, t in streams[s][0] + [("ts", "float"), ("tupleID", "int")]]
    select, group, dselect, dkeys, out = draw(aggregate_select(
        cols, lambda c: f"{names[c[0]]}.{c[1]}", lambda c: f'x{c[0]}."{c[1]}"',
        lambda c, fn: f"{fn.lower()}({names[c[0]]}.{c[1]})", alias_keys=True))
    rest = sql[sql.index(" FROM "):]
    clause = ""
    if " BEGIN " in rest:
        rest, clause = rest[:rest.index(" BEGIN ")], rest[rest.index(" BEGIN "):]
    new = f"SELECT {select}{rest}{group}{clause}"
    return new, dict(spec, select=dselect, keys=dkeys, names=out, distinct=False)


@settings(max_examples=max(10, settings.default.max_examples // 5))
@given(join_aggregate_scenarios())
def test_join_aggregates_agree_with_duckdb_in_every_mode(scenario):
    streams, ops = scenario
    clock = Clock(1000.0)
    engines = {m: psoup.Engine(mode=m, clock=clock, chunk_rows=3) for m in psoup.MODES}
    for eng in engines.values():
        create(eng, streams)
    oracle = JoinOracle(streams)
    last_ts = {name: 1000.0 for name in streams}
    live = []

    def check(handles, spec, sql, now):
        sources = ", ".join(f"({oracle.windowed(s, w, now)}) AS x{i}"
                            for i, (s, w) in enumerate(zip(spec["items"], spec["windows"])))
        want = answer_aggregate(oracle.db, sources, spec)
        for mode, eng in engines.items():
            got = eng.invoke(handles[mode], now=now)
            assert got.columns == spec["names"], (mode, sql)
            assert rows_match(got.rows, want), (mode, sql, now, got.rows, want)

    for op in ops:
        if op[0] == "insert":
            _, stream, rows, steps, synced = op
            insert_stepped(engines, oracle, clock, last_ts, stream, rows, steps, synced)
        elif op[0] == "register":
            sql, spec = op[1]
            live.append(({m: eng.register(sql) for m, eng in engines.items()}, spec, sql))
        elif op[0] == "invoke" and live:
            check(*live[op[1] % len(live)], clock.now + op[2])
        elif op[0] == "unregister" and live:
            handles = live.pop(op[1] % len(live))[0]
            for mode, eng in engines.items():
                eng.unregister(handles[mode])
        elif op[0] == "invoke_all":
            for entry in live:
                check(*entry, clock.now + op[1])
