"""psoup's answers against DuckDB running the same SQL over the same window.

Hypothesis draws a schema, a retention, and an interleaving of inserts, registrations,
invocations at random NOW (earlier or later than the data), and unregistrations. Every
invocation is answered by all three engine modes and compared with DuckDB over a table
holding every tuple ever inserted, where the retention and the window are spelled out
in SQL. Registering before or after the data (PSoup's duality, ARCHITECTURE.md invariant
2) happens in both orders by construction.
"""

from __future__ import annotations

import duckdb
import hypothesis.strategies as st
from hypothesis import given

import psoup
from tests.conftest import Clock

INTS = st.integers(-4, 12)
FLOATS = st.sampled_from([-2.5, -1.0, 0.0, 0.5, 1.0, 2.0, 2.5, 3.0, 7.25, 10.0])
TEXTS = st.sampled_from(["", "a", "ab", "b", "ba", "B", "é", "zz"])
BOOLS = st.booleans()
VALUES = {"int": INTS, "float": FLOATS, "text": TEXTS, "bool": BOOLS}
OPS = ["=", "!=", "<>", "<", "<=", ">", ">="]


def sql_literal(value) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


@st.composite
def schemas(draw):
    ncols = draw(st.integers(1, 4))
    types = draw(st.lists(st.sampled_from(["int", "int", "float", "text", "bool"]),
                          min_size=ncols, max_size=ncols))
    columns = [(f"c{i}", t) for i, t in enumerate(types)]
    retain = draw(st.sampled_from([None, None, ("rows", 7), ("rows", 25), ("secs", 4.0),
                                   ("secs", 15.0)]))
    return columns, retain


def family(ctype: str) -> str:
    return "num" if ctype in ("int", "float") else ctype


@st.composite
def factors(draw, columns):
    """(psoup SQL, DuckDB SQL) of one WHERE factor."""
    name, ctype = draw(st.sampled_from(columns + [("ts", "float"), ("tupleID", "int")]))
    quoted = f'"{name}"'
    kind = draw(st.sampled_from(["cmp", "cmp", "cmp", "between", "in", "colcmp"]))
    value = VALUES[ctype] if ctype != "int" or draw(st.booleans()) else FLOATS
    if name == "ts":
        value = st.floats(995, 1040).map(lambda v: round(v * 2) / 2)
    if name == "tupleID":
        value = st.integers(-1, 60)
    if kind == "cmp" or (ctype == "bool" and kind == "between"):
        op = draw(st.sampled_from(OPS))
        c = draw(value)
        if draw(st.booleans()):
            flipped = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)
            return f"{sql_literal(c)} {flipped} {name}", f"{sql_literal(c)} {flipped} {quoted}"
        return f"{name} {op} {sql_literal(c)}", f"{quoted} {op} {sql_literal(c)}"
    if kind == "between":
        a, b = draw(value), draw(value)
        text = f"BETWEEN {sql_literal(a)} AND {sql_literal(b)}"
        return f"{name} {text}", f"{quoted} {text}"
    if kind == "in":
        vals = draw(st.lists(value, min_size=1, max_size=4))
        text = "IN (" + ", ".join(sql_literal(v) for v in vals) + ")"
        return f"{name} {text}", f"{quoted} {text}"
    same = [(n, t) for n, t in columns + [("ts", "float"), ("tupleID", "int")]
            if family(t) == family(ctype)]
    other, otype = draw(st.sampled_from(same))
    op = draw(st.sampled_from(OPS))
    offset = ""
    if family(ctype) == "num" and draw(st.booleans()):
        offset = f" {draw(st.sampled_from(['+', '-']))} {draw(st.sampled_from([1, 2, 0.5, 3]))}"
    return f"{name} {op} {other}{offset}", f'{quoted} {op} "{other}"{offset}'


@st.composite
def windows(draw, columns):
    """(psoup FROM suffix, psoup BEGIN/END clause, window spec for the oracle)."""
    kind = draw(st.sampled_from(["none", "sliding", "landmark", "snapshot", "rows",
                                 "cql_range", "cql_rows", "partition", "unbounded",
                                 "cql_now", "lagged"]))
    k = draw(st.integers(0, 12))
    a = draw(st.integers(995, 1030))
    b = draw(st.integers(995, 1035))
    if kind == "sliding":
        return "", f"BEGIN NOW - {k} END NOW", ("range", ("now", -k), ("now", 0))
    if kind == "lagged":
        return "", f"BEGIN (NOW - {k + 2}) END (NOW - 1)", ("range", ("now", -k - 2), ("now", -1))
    if kind == "landmark":
        return "", f"BEGIN {a} END NOW", ("range", ("abs", a), ("now", 0))
    if kind == "snapshot":
        lo, hi = min(a, b), max(a, b)
        return "", f"BEGIN {lo} END {hi}", ("range", ("abs", lo), ("abs", hi))
    if kind == "rows":
        return "", f"BEGIN (NOW - {k + 1} ROWS) END NOW", ("rows", k + 1)
    if kind == "cql_range":
        return f" [RANGE {k} SECONDS]", "", ("range", ("now", -k), ("now", 0))
    if kind == "cql_rows":
        return f" [ROWS {k + 1}]", "", ("rows", k + 1)
    if kind == "partition":
        col = draw(st.sampled_from([n for n, _ in columns]))
        return f" [PARTITION BY {col} ROWS {k % 4 + 1}]", "", ("partition", col, k % 4 + 1)
    if kind == "unbounded":
        return " [RANGE UNBOUNDED]", "", ("all",)
    if kind == "cql_now":
        return " [NOW]", "", ("range", ("now", 0), ("now", 0))
    return "", "", ("all",)


@st.composite
def queries(draw, stream, columns):
    """A query as (psoup SQL, oracle description)."""
    names = [n for n, _ in columns]
    if draw(st.booleans()):
        select, outputs = "*", names
    else:
        outputs = draw(st.lists(st.sampled_from(names + ["ts", "tupleID"]), min_size=1,
                                max_size=4, unique=True))
        select = ", ".join(outputs)
    distinct = draw(st.booleans()) and draw(st.booleans())
    where = draw(st.lists(factors(columns), max_size=4))
    suffix, clause, window = draw(windows(columns))
    sql = f"SELECT {'DISTINCT ' if distinct else ''}{select} FROM {stream}{suffix}"
    if where:
        sql += " WHERE " + " AND ".join(p for p, _ in where)
    if clause:
        sql += " " + clause
    return sql, {"outputs": outputs, "distinct": distinct, "stream": stream,
                 "where": [d for _, d in where], "window": window}


class Oracle:
    """DuckDB holding every tuple ever inserted; retention and windows spelled in SQL."""

    def __init__(self, streams):
        self.db = duckdb.connect()
        self.retain = {}
        for name, (columns, retain) in streams.items():
            types = {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "bool": "BOOLEAN"}
            cols = ", ".join(f'"{c}" {types[t]}' for c, t in columns)
            self.db.execute(f'CREATE TABLE {name} (ts DOUBLE, "tupleID" BIGINT, {cols})')
            self.retain[name] = retain

    def insert(self, stream, rows, ts, tids):
        width = len(rows[0]) + 2
        marks = ", ".join("?" * width)
        self.db.executemany(f"INSERT INTO {stream} VALUES ({marks})",
                            [(t, i, *r) for t, i, r in zip(ts, tids, rows)])

    def answer(self, spec, now):
        source = self.source(spec, now)
        where = " AND ".join(spec["where"]) or "TRUE"
        outs = ", ".join(f'"{c}"' for c in spec["outputs"])
        if spec["distinct"]:
            sql = (f'SELECT {outs} FROM {source} WHERE {where} GROUP BY {outs} '
                   f'ORDER BY min("tupleID")')
        else:
            sql = f'SELECT {outs} FROM {source} WHERE {where} ORDER BY ts, "tupleID"'
        return [tuple(r) for r in self.db.execute(sql).fetchall()]

    def source(self, spec, now):
        """The query's stream as DuckDB FROM text: retained, then windowed at `now`."""
        stream = spec["stream"]
        retained = f"SELECT * FROM {stream}"
        retain = self.retain[stream]
        if retain and retain[0] == "rows":
            retained += f' ORDER BY "tupleID" DESC LIMIT {retain[1]}'
        elif retain:
            retained += f" WHERE ts >= (SELECT max(ts) FROM {stream}) - {retain[1]}"
        window = spec["window"]
        source = f"({retained}) AS kept"
        if window[0] == "range":
            edge = [now + v if kind == "now" else v for kind, v in window[1:]]
            source = f"(SELECT * FROM {source} WHERE ts BETWEEN {edge[0]!r} AND {edge[1]!r}) AS w"
        elif window[0] == "rows":
            source = f'(SELECT * FROM {source} ORDER BY "tupleID" DESC LIMIT {window[1]}) AS w'
        elif window[0] == "partition":
            source = (f'(SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY "{window[1]}" '
                      f'ORDER BY "tupleID" DESC) AS rn FROM {source}) WHERE rn <= {window[2]}) AS w')
        return source


@st.composite
def scenarios(draw):
    streams = {"R": draw(schemas())}
    if draw(st.booleans()):
        streams["S"] = draw(schemas())
    nops = draw(st.integers(1, 14))
    ops = []
    for _ in range(nops):
        kind = draw(st.sampled_from(["insert", "insert", "register", "register", "invoke",
                                     "invoke", "unregister"]))
        stream = draw(st.sampled_from(sorted(streams)))
        columns = streams[stream][0]
        if kind == "insert":
            n = draw(st.integers(1, 12))
            rows = [tuple(draw(VALUES[t]) for _, t in columns) for _ in range(n)]
            steps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0]), min_size=n,
                                  max_size=n))
            ops.append(("insert", stream, rows, steps))
        elif kind == "register":
            ops.append(("register", draw(queries(stream, columns))))
        elif kind == "invoke":
            ops.append(("invoke", draw(st.integers(0, 20)), draw(st.integers(-12, 8))))
        else:
            ops.append(("unregister", draw(st.integers(0, 20))))
    ops.append(("invoke_all", draw(st.integers(-5, 5))))
    return streams, ops


def insert_everywhere(engines, oracle, stream, rows, ts):
    """Insert one batch into every engine, which must hand out the same tupleIDs, and
    into the oracle."""
    tids = None
    for eng in engines.values():
        got = eng.insert(stream, rows, ts=ts).tolist()
        assert tids is None or got == tids
        tids = got
    oracle.insert(stream, rows, ts, tids)


def insert_stepped(engines, oracle, clock, last_ts, stream, rows, steps, synced=False):
    """Insert one batch everywhere, its ts advancing by `steps` from the stream's last ts
    (from the clock's NOW too, when `synced`); moves `last_ts` and the clock along."""
    ts, t = [], max(last_ts[stream], clock.now) if synced else last_ts[stream]
    for step in steps:
        t += step
        ts.append(t)
    last_ts[stream] = t
    clock.now = max(clock.now, t)
    insert_everywhere(engines, oracle, stream, rows, ts)


def create(engine, streams):
    for name, (columns, retain) in streams.items():
        cols = ", ".join(f"{c} {t.upper()}" for c, t in columns)
        clause = ""
        if retain:
            clause = f" RETAIN {retain[1]} ROWS" if retain[0] == "rows" else \
                f" RETAIN {retain[1]} SECONDS"
        engine.execute(f"CREATE STREAM {name} ({cols}){clause}")


@given(scenarios(), st.sampled_from([2, 3, 8, 8192]))
def test_every_mode_agrees_with_duckdb(scenario, chunk_rows):
    streams, ops = scenario
    clock = Clock(1000.0)
    engines = {m: psoup.Engine(mode=m, clock=clock, chunk_rows=chunk_rows) for m in psoup.MODES}
    for eng in engines.values():
        create(eng, streams)
    oracle = Oracle(streams)
    last_ts = {name: 1000.0 for name in streams}
    live: list[tuple[dict, dict]] = []    # (handles per mode, oracle spec)

    def check(entry, now):
        handles, spec = entry
        want = oracle.answer(spec, now)
        for mode, eng in engines.items():
            got = eng.invoke(handles[mode], now=now)
            assert got.rows == want, (mode, spec, now)
            assert got.columns == spec["outputs"]

    for op in ops:
        if op[0] == "insert":
            _, stream, rows, steps = op
            insert_stepped(engines, oracle, clock, last_ts, stream, rows, steps)
        elif op[0] == "register":
            sql, spec = op[1]
            live.append(({m: eng.register(sql) for m, eng in engines.items()}, spec))
        elif op[0] == "invoke" and live:
            check(live[op[1] % len(live)], clock.now + op[2])
        elif op[0] == "unregister" and live:
            handles, _ = live.pop(op[1] % len(live))
            for mode, eng in engines.items():
                eng.unregister(handles[mode])
        elif op[0] == "invoke_all":
            for entry in live:
                check(entry, clock.now + op[1])
