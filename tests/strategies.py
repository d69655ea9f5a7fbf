"""Hypothesis strategies shared by the differential tests: schemas, factors, windows and
queries (selections, joins, aggregates) as (psoup SQL, oracle spec) pairs, and whole
scenarios of interleaved inserts, registrations, invocations and unregistrations.

Each strategy draws the psoup statement and, beside it, what `tests/oracles.py` needs to
ask DuckDB the same question over the same window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeAlias

import hypothesis.strategies as st

from tests.support import Columns, Retain, Streams, sql_literal

#: A query as (psoup SQL, the oracle's description of the same question).
Query: TypeAlias = tuple[str, dict[str, Any]]
#: A scenario: its streams, and the operations to run in order (each a tuple whose
#: first item names the kind: "insert", "register", "invoke", ...).
Scenario: TypeAlias = tuple[Streams, list[tuple[Any, ...]]]
#: How a join query names FROM item i's column (item, column) -> SQL.
Ref: TypeAlias = Callable[[int, str], str]
#: A column of an aggregate's FROM items: (item, name, type).
ItemColumn: TypeAlias = tuple[int, str, str]

#: INT values beyond 2**53 (not exact as doubles) and at the ends of the int64 range,
#: where a column plus an offset leaves it.
BIG_INTS = st.sampled_from([2**53 + 1, 2**62, 2**62 + 1, 2**63 - 1, -2**63, -(2**53) - 1])
INTS = st.integers(-4, 12) | st.integers(-4, 12) | st.integers(-4, 12) | BIG_INTS
#: FLOAT values whose sums round (0.1 + 0.2 > 0.3; 1.575 + 1 is not 2.575 - 1 + 1).
FLOATS = st.sampled_from([-2.5, -1.0, 0.0, 0.5, 1.0, 2.0, 2.5, 3.0, 7.25, 10.0, 0.1, 0.2, 0.3,
                          1.575, 2.575])
#: Offsets of `column op column + offset`, some of which round in double arithmetic.
OFFSETS = [1, 2, 3, 0.5, 0.1, 0.2, 2.5, 1.575]
TEXTS = st.sampled_from(["", "a", "ab", "b", "ba", "B", "é", "zz"])
BOOLS = st.booleans()
VALUES = {"int": INTS, "float": FLOATS, "text": TEXTS, "bool": BOOLS}
OPS = ["=", "!=", "<>", "<", "<=", ">", ">="]


@st.composite
def schemas(draw: st.DrawFn) -> tuple[Columns, Retain]:
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
def factors(draw: st.DrawFn, columns: Columns) -> tuple[str, str]:
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
    offset = offset_text(draw, ctype)
    duck_other = duck_shifted(f'"{other}"', otype, offset)
    return f"{name} {op} {other}{offset}", f"{quoted} {op} {duck_other}"


def offset_text(draw: st.DrawFn, ctype: str) -> str:
    """` + c` or ` - c` after a numeric column, half of the time."""
    if family(ctype) == "num" and draw(st.booleans()):
        return f" {draw(st.sampled_from(['+', '-']))} {draw(st.sampled_from(OFFSETS))}"
    return ""


def duck_shifted(quoted: str, ctype: str, offset: str) -> str:
    """DuckDB SQL of the quoted column followed by `offset`, with psoup's exact INT
    arithmetic: DuckDB adds an integer to a BIGINT in 64 bits (and fails on overflow), so
    the column becomes a HUGEINT first; a fractional offset is a DECIMAL there, exact too."""
    if ctype == "int" and offset:
        return f"CAST({quoted} AS HUGEINT){offset}"
    return f"{quoted}{offset}"


@st.composite
def windows(draw: st.DrawFn, columns: Columns) -> tuple[str, str, tuple[Any, ...]]:
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
def queries(draw: st.DrawFn, stream: str, columns: Columns) -> Query:
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


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    streams = {"R": draw(schemas())}
    if draw(st.booleans()):
        streams["S"] = draw(schemas())
    nops = draw(st.integers(1, 14))
    ops: list[tuple[Any, ...]] = []
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



# joins

JINTS = st.integers(0, 4) | st.integers(0, 4) | st.integers(0, 4) | BIG_INTS
JFLOATS = st.sampled_from([0.0, 0.5, 1.0, 2.0, 2.5, 3.0, 0.1, 0.2, 0.3, 1.575, 2.575])
JTEXTS = st.sampled_from(["", "a", "b", "é"])
JVALUES = {"int": JINTS, "float": JFLOATS, "text": JTEXTS, "bool": st.booleans()}
STREAMS = ("R", "S", "T")


@st.composite
def join_schemas(draw: st.DrawFn, stream: str) -> tuple[Columns, Retain]:
    """Column 0 is always `k INT` (a join key every stream shares); the others are
    sometimes a shared name `v`, else a name of this stream only."""
    extra = draw(st.lists(st.sampled_from(["int", "int", "float", "text", "bool"]),
                          max_size=2))
    columns = [("k", "int")]
    for i, t in enumerate(extra):
        name = "v" if i == 0 and draw(st.booleans()) else f"{stream.lower()}c{i}"
        columns.append((name, t))
    retain = draw(st.sampled_from([None, None, ("rows", 4), ("rows", 12), ("secs", 3.0),
                                   ("secs", 10.0)]))
    return columns, retain


def all_columns(columns: Iterable[tuple[str, str]]) -> Columns:
    return list(columns) + [("ts", "float"), ("tupleID", "int")]


def constant(draw: st.DrawFn, name: str, ctype: str) -> object:
    if name == "ts":
        return draw(st.floats(995, 1040).map(lambda v: round(v * 2) / 2))
    if name == "tupleID":
        return draw(st.integers(-1, 60))
    if ctype == "int" and draw(st.booleans()):
        return draw(JFLOATS)
    return draw(JVALUES[ctype])


def scale(name: str, ctype: str) -> str:
    """Columns worth comparing with each other: ts with ts (seconds near 1000),
    tupleID with tupleID, declared numbers with numbers, TEXT with TEXT, BOOL with BOOL."""
    return name if name in ("ts", "tupleID") else family(ctype)


def pick_column(draw: st.DrawFn, columns: Columns) -> tuple[str, str]:
    """A declared column three times in four, else ts or tupleID."""
    if draw(st.integers(0, 3)):
        return draw(st.sampled_from(list(columns)))
    return draw(st.sampled_from([("ts", "float"), ("tupleID", "int")]))


def partner(draw: st.DrawFn, name: str, ctype: str,
            cols: list[tuple[str, str]]) -> tuple[str, str]:
    """A column of `cols` to compare with (name, ctype): mostly one of the same scale,
    sometimes any of the same family (k with ts: always or never true)."""
    same = [c for c in cols if scale(*c) == scale(name, ctype)]
    if not same or draw(st.integers(0, 9)) == 0:
        same = [c for c in cols if family(c[1]) == family(ctype)]
    equal = [c for c in same if c[0] == name]
    if bool(equal) and draw(st.booleans()):     # bool(): mypy infers draw's type from `equal`
        return equal[0]
    return draw(st.sampled_from(same))


@st.composite
def local_factor(draw: st.DrawFn, item: int, columns: Columns, ref: Ref) -> tuple[str, str]:
    """(psoup SQL, DuckDB SQL) of a factor on FROM item `item` alone."""
    cols = all_columns(columns)
    name, ctype = pick_column(draw, columns)
    duck = f'x{item}."{name}"'
    kind = draw(st.sampled_from(["cmp", "cmp", "between", "in", "colcmp"]))
    if name in ("ts", "tupleID") and kind != "colcmp":     # ts = c would rarely hold
        op, c = draw(st.sampled_from(["<", "<=", ">", ">="])), constant(draw, name, ctype)
        return f"{ref(item, name)} {op} {sql_literal(c)}", f"{duck} {op} {sql_literal(c)}"
    if kind == "cmp" or (kind == "between" and ctype == "bool"):
        op, c = draw(st.sampled_from(OPS)), constant(draw, name, ctype)
        return f"{ref(item, name)} {op} {sql_literal(c)}", f"{duck} {op} {sql_literal(c)}"
    if kind == "between":
        a, b = constant(draw, name, ctype), constant(draw, name, ctype)
        text = f"BETWEEN {sql_literal(a)} AND {sql_literal(b)}"
        return f"{ref(item, name)} {text}", f"{duck} {text}"
    if kind == "in":
        vals = [constant(draw, name, ctype) for _ in range(draw(st.integers(1, 3)))]
        text = "IN (" + ", ".join(sql_literal(v) for v in vals) + ")"
        return f"{ref(item, name)} {text}", f"{duck} {text}"
    others = [c for c in cols if c[0] != name and family(c[1]) == family(ctype)]
    other, otype = partner(draw, name, ctype, others) if others else (name, ctype)
    op = draw(st.sampled_from(OPS))
    offset = offset_text(draw, ctype)
    return (f"{ref(item, name)} {op} {ref(item, other)}{offset}",
            f"{duck} {op} " + duck_shifted(f'x{item}."{other}"', otype, offset))


@st.composite
def join_factor(draw: st.DrawFn, items: list[str], schemas: dict[str, Columns],
                ref: Ref) -> tuple[str, str]:
    """(psoup SQL, DuckDB SQL) of a factor between two FROM items (either side first)."""
    i, j = draw(st.permutations(range(len(items))))[:2]
    # half of the factors compare the join keys (k with k), so that joins match often
    if draw(st.booleans()):
        lname, ltype = "k", "int"
    else:
        lname, ltype = pick_column(draw, schemas[items[i]])
    right_cols = [c for c in all_columns(schemas[items[j]]) if family(c[1]) == family(ltype)]
    if not right_cols:
        lname, ltype = "k", "int"
        right_cols = [c for c in all_columns(schemas[items[j]]) if family(c[1]) == "num"]
    rname, rtype = partner(draw, lname, ltype, right_cols)
    op = draw(st.sampled_from(OPS + ["=", "=", "<=", ">="]))
    offset = offset_text(draw, ltype)
    return (f"{ref(i, lname)} {op} {ref(j, rname)}{offset}",
            f'x{i}."{lname}" {op} ' + duck_shifted(f'x{j}."{rname}"', rtype, offset))


@st.composite
def join_windows(draw: st.DrawFn, items: list[str],
                 schemas: Streams) -> tuple[list[str], str, list[tuple[Any, ...]]]:
    """(per-item FROM suffixes, BEGIN/END clause, per-item window specs) in the format
    of tests/test_differential.py's `windows`."""
    k = draw(st.integers(0, 12))
    a, b = draw(st.integers(995, 1030)), draw(st.integers(995, 1035))
    scope = draw(st.sampled_from(["none", "none", "global", "global", "items", "items"]))
    n = len(items)
    if scope == "none":
        return [""] * n, "", [("all",)] * n
    if scope == "global":
        clause, spec = _global_window(draw, k, a, b)
        return [""] * n, clause, [spec] * n
    suffixes, specs = [], []
    for stream in items:
        suffix, spec = _item_window(draw, schemas[stream][0])
        suffixes.append(suffix)
        specs.append(spec)
    return suffixes, "", specs


def _global_window(draw: st.DrawFn, k: int, a: int, b: int) -> tuple[str, tuple[Any, ...]]:
    """(BEGIN/END clause, window spec) of a window over all FROM items at once."""
    kind = draw(st.sampled_from(["sliding", "lagged", "landmark", "snapshot", "rows"]))
    if kind == "sliding":
        return f"BEGIN NOW - {k} END NOW", ("range", ("now", -k), ("now", 0))
    if kind == "lagged":
        return (f"BEGIN (NOW - {k + 2}) END (NOW - 1)",
                ("range", ("now", -k - 2), ("now", -1)))
    if kind == "landmark":
        return f"BEGIN {a} END NOW", ("range", ("abs", a), ("now", 0))
    if kind == "snapshot":
        lo, hi = min(a, b), max(a, b)
        return f"BEGIN {lo} END {hi}", ("range", ("abs", lo), ("abs", hi))
    return f"BEGIN (NOW - {k % 6 + 1} ROWS) END NOW", ("rows", k % 6 + 1)


def _item_window(draw: st.DrawFn, columns: Columns) -> tuple[str, tuple[Any, ...]]:
    """(FROM suffix, window spec) of one FROM item's own window."""
    kind = draw(st.sampled_from(["none", "none", "cql_range", "cql_range", "cql_rows",
                                 "partition", "unbounded", "cql_now"]))
    k = draw(st.integers(0, 8))
    if kind == "cql_range":
        return f" [RANGE {k} SECONDS]", ("range", ("now", -k), ("now", 0))
    if kind == "cql_rows":
        return f" [ROWS {k + 1}]", ("rows", k + 1)
    if kind == "partition":
        col = draw(st.sampled_from([c for c, _ in columns]))
        return f" [PARTITION BY {col} ROWS {k % 3 + 1}]", ("partition", col, k % 3 + 1)
    if kind == "unbounded":
        return " [RANGE UNBOUNDED]", ("all",)
    if kind == "cql_now":
        return " [NOW]", ("range", ("now", 0), ("now", 0))
    return "", ("all",)


@st.composite
def join_queries(draw: st.DrawFn, streams: Streams, base: dict[str, Any] | None = None) -> Query:
    """A 2- or 3-way join as (psoup SQL, oracle spec). Given the spec of an earlier
    one as `base`, a sibling: the same FROM list and join factors (so the engine puts
    both in one group) with other local factors, windows and outputs."""
    names = sorted(streams)
    schemas = {s: streams[s][0] for s in names}
    if base is not None:
        items, aliases, qualifier_choice = base["items"], base["aliases"], base["qualify"]
    else:
        items, aliases, qualifier_choice = _join_from(draw, names)
    n = len(items)
    item_names = [a or s for s, a in zip(items, aliases, strict=True)]

    def ref(i: int, column: str) -> str:
        """How the query names item i's column: qualified by its item name, by its
        stream's name when unambiguous, or bare when only one item has the column."""
        stream = items[i]
        holders = [j for j, s in enumerate(items) if column in dict(schemas[s])]
        if column not in ("ts", "tupleID") and holders == [i] and qualifier_choice[i]:
            return column
        if aliases[i] and items.count(stream) == 1 and qualifier_choice[i]:
            return f"{stream}.{column}"
        return f"{item_names[i]}.{column}"

    suffixes, clause, windows = draw(join_windows(items, streams))
    where: list[tuple[str, str]] = []
    for i, s in enumerate(items):
        if draw(st.integers(0, 2)) == 0:      # a third of the items have local factors
            where += draw(st.lists(local_factor(i, schemas[s], ref), min_size=1, max_size=2))
    if base is not None:
        joins = base["joins"]
    else:
        njoin = draw(st.sampled_from([1, 1, 2, 0] if n == 2 else [2, 2, 3, 1]))
        joins = draw(st.lists(join_factor(items, schemas, ref), min_size=njoin,
                              max_size=njoin))
    where += joins
    where = draw(st.permutations(where))
    select, outputs, out_names = _join_select(draw, items, item_names, schemas, ref)
    distinct = draw(st.booleans()) and draw(st.booleans())
    sql = (f"SELECT {'DISTINCT ' if distinct else ''}{select} FROM "
           + ", ".join(f"{s}{' ' + a if a else ''}{suffix}"
                       for s, a, suffix in zip(items, aliases, suffixes, strict=True)))
    if where:
        sql += " WHERE " + " AND ".join(p for p, _ in where)
    if clause:
        sql += " " + clause
    return sql, {"items": items, "windows": windows, "where": [d for _, d in where],
                 "outputs": outputs, "names": out_names, "distinct": distinct,
                 "aliases": aliases, "qualify": qualifier_choice, "joins": joins}


def _join_from(draw: st.DrawFn,
               names: list[str]) -> tuple[list[str], list[str | None], list[bool]]:
    """A new join's FROM list: (streams, their aliases or None, whether `ref` may name
    each item's columns by stream or bare)."""
    n = draw(st.sampled_from([2, 2, 3]))
    if len(names) >= n and draw(st.booleans()):       # distinct streams
        items = draw(st.permutations(names))[:n]
    else:                                              # any, so often a self-join
        items = draw(st.lists(st.sampled_from(names), min_size=n, max_size=n))
    aliases: list[str | None] = []
    for i, s in enumerate(items):
        repeated = items.count(s) > 1
        first = items.index(s) == i
        if repeated and not (first and draw(st.booleans())) or not repeated and draw(st.booleans()):
            aliases.append(f"{s.lower()}{i}")
        else:
            aliases.append(None)
    qualifier_choice = [draw(st.booleans()) for _ in items]
    return items, aliases, qualifier_choice


def _join_select(draw: st.DrawFn, items: list[str], item_names: list[str],
                 schemas: dict[str, Columns],
                 ref: Ref) -> tuple[str, list[tuple[int, str]], list[str]]:
    """The select list: *, one item's *, or columns (some renamed with AS), as (psoup
    select list, (item, column) of each output, output names)."""
    shape = draw(st.sampled_from(["star", "star", "item_star", "columns", "columns"]))
    if shape == "star":
        select = "*"
        outputs = [(i, c) for i, s in enumerate(items) for c, _ in schemas[s]]
        out_names = [f"{item_names[i]}.{c}" for i, c in outputs]
    elif shape == "item_star":
        i = draw(st.integers(0, len(items) - 1))
        select = f"{item_names[i]}.*"
        outputs = [(i, c) for c, _ in schemas[items[i]]]
        out_names = [f"{item_names[i]}.{c}" for _, c in outputs]
    else:
        pool = [(i, c) for i, s in enumerate(items) for c, _ in all_columns(schemas[s])]
        outputs = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
        renamed = [draw(st.booleans()) and draw(st.booleans()) for _ in outputs]
        bare = [c for (i, c), r in zip(outputs, renamed, strict=True) if not r]
        out_names, parts = [], []
        for pos, ((i, c), r) in enumerate(zip(outputs, renamed, strict=True)):
            if r:
                out_names.append(f"o{pos}")
                parts.append(f"{ref(i, c)} AS o{pos}")
            else:
                out_names.append(c if bare.count(c) == 1 else f"{item_names[i]}.{c}")
                parts.append(ref(i, c))
        select = ", ".join(parts)
    return select, outputs, out_names


def batch_rows(columns: Columns, max_size: int = 4) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    return st.lists(st.tuples(*(JVALUES[t] for _, t in columns)), min_size=1,
                    max_size=max_size)


@st.composite
def join_scenarios(draw: st.DrawFn) -> Scenario:
    nstreams = draw(st.integers(2, 3))
    streams = {s: draw(join_schemas(s)) for s in STREAMS[:nstreams]}
    ops: list[tuple[Any, ...]] = []
    if draw(st.booleans()):                # some data before anything else
        for stream in sorted(streams):
            rows = draw(batch_rows(streams[stream][0]))
            ops.append(("insert", stream, rows, [0.0] * len(rows), True))
    for _ in range(draw(st.integers(1, 16))):
        kind = draw(st.sampled_from(["insert", "insert", "insert", "insert", "register",
                                     "register", "select", "invoke", "invoke",
                                     "unregister"]))
        if kind == "insert":
            stream = draw(st.sampled_from(sorted(streams)))
            columns = streams[stream][0]
            n = draw(st.integers(1, 6))
            rows = [tuple(draw(JVALUES[t]) for _, t in columns) for _ in range(n)]
            steps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0]), min_size=n,
                                  max_size=n))
            # most producers stamp with the engine's clock; some lag behind the others
            ops.append(("insert", stream, rows, steps, draw(st.integers(0, 3)) > 0))
        elif kind == "register":
            earlier = [op[1][1] for op in ops if op[0] == "register"]
            if bool(earlier) and draw(st.booleans()):    # a sibling: same FROM list and joins
                base = draw(st.sampled_from(earlier))
                ops.append(("register", draw(join_queries(streams, base))))
            else:
                ops.append(("register", draw(join_queries(streams))))
        elif kind == "select":            # selection queries share the Query SteM slots
            stream = draw(st.sampled_from(sorted(streams)))
            ops.append(("select", draw(queries(stream, streams[stream][0]))))
        elif kind == "invoke":
            ops.append(("invoke", draw(st.integers(0, 20)), draw(st.integers(-8, 6)),
                        draw(st.booleans())))
        else:
            ops.append(("unregister", draw(st.integers(0, 20))))
    if not any(op[0] == "register" for op in ops):    # every scenario has a join query
        ops.insert(draw(st.integers(0, len(ops))), ("register", draw(join_queries(streams))))
    for stream in sorted(streams):       # top up every stream, so the last checks see data
        rows = draw(batch_rows(streams[stream][0]))
        ops.append(("insert", stream, rows, [draw(st.sampled_from([0.0, 0.5]))] * len(rows),
                    True))
    ops.append(("invoke_all", draw(st.integers(-3, 3))))
    ops.append(("invoke_all", draw(st.integers(-3, 3))))
    return streams, ops



# aggregates

FUNCTIONS = ("COUNT", "SUM", "AVG", "MIN", "MAX")


@st.composite
def aggregate_select(draw: st.DrawFn, columns: list[ItemColumn],
                     ref: Callable[[ItemColumn], str], duck: Callable[[ItemColumn], str],
                     pick: Callable[[ItemColumn, str | None], str],
                     alias_keys: bool = False) -> tuple[str, str, str, list[str], list[str]]:
    """(psoup select list, GROUP BY clause, DuckDB select list, DuckDB GROUP BY keys,
    output names) for columns [(owner, name, type)]; `ref`/`duck` spell a column in
    psoup/DuckDB, `pick` names an aggregate's default output; with `alias_keys` the
    group columns shown are renamed with AS."""
    numeric = [c for c in columns if c[2] in ("int", "float")]
    keys = draw(st.lists(st.sampled_from(columns), max_size=2, unique=True))
    shown = [k for k in keys if draw(st.booleans())]
    items: list[tuple[str, str | None]] = []      # (psoup expression, its alias)
    ducks: list[str] = []
    names: list[str] = []
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
def aggregate_queries(draw: st.DrawFn, stream: str, columns: Columns) -> Query:
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


@st.composite
def aggregate_scenarios(draw: st.DrawFn) -> Scenario:
    streams = {"R": draw(schemas())}
    ops: list[tuple[Any, ...]] = []
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


@st.composite
def join_aggregate_scenarios(draw: st.DrawFn) -> Scenario:
    """A join scenario (tests/test_joins.py) whose join queries aggregate instead."""
    streams, ops = draw(join_scenarios())
    out: list[tuple[Any, ...]] = []
    for op in ops:
        if op[0] == "register":
            out.append(("register", draw(as_aggregate(streams, op[1]))))
        elif op[0] != "select":
            out.append(op)
    return streams, out


@st.composite
def as_aggregate(draw: st.DrawFn, streams: Streams, query: Query) -> Query:
    """The join query with its select list replaced by aggregates and GROUP BY."""
    sql, spec = query
    items, aliases = spec["items"], spec["aliases"]
    names = [a or s for s, a in zip(items, aliases, strict=True)]
    cols = [(i, c, t) for i, s in enumerate(items)
            for c, t in streams[s][0] + [("ts", "float"), ("tupleID", "int")]]

    def pick(c: ItemColumn, fn: str | None) -> str:
        assert fn is not None       # with alias_keys, group keys are not named by pick
        return f"{fn.lower()}({names[c[0]]}.{c[1]})"

    select, group, dselect, dkeys, out = draw(aggregate_select(
        cols, lambda c: f"{names[c[0]]}.{c[1]}", lambda c: f'x{c[0]}."{c[1]}"',
        pick, alias_keys=True))
    rest = sql[sql.index(" FROM "):]
    clause = ""
    if " BEGIN " in rest:
        rest, clause = rest[:rest.index(" BEGIN ")], rest[rest.index(" BEGIN "):]
    new = f"SELECT {select}{rest}{group}{clause}"
    return new, dict(spec, select=dselect, keys=dkeys, names=out, distinct=False)


#: Columns as a schema declares them, and the steps of a scenario: ("register", where),
#: ("remove", a pick among the live slots) or ("probe", rows).
StemScenario = tuple[list[tuple[str, str]], list[tuple[str, Any]]]


@st.composite
def stem_scenarios(draw: st.DrawFn) -> StemScenario:
    columns, _ = draw(schemas())
    steps: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["register", "register", "register", "remove",
                                     "probe"]))
        if kind == "register":
            where = draw(st.lists(factors(columns), min_size=0, max_size=3))
            steps.append(("register", " AND ".join(p for p, _ in where)))
        elif kind == "remove":
            steps.append(("remove", draw(st.integers(0, 100))))
        else:
            rows = draw(st.lists(st.tuples(*(VALUES[t] for _, t in columns)), min_size=1,
                                 max_size=80))
            steps.append(("probe", rows))
    return columns, steps
