"""The oracles of the differential tests: DuckDB holding every tuple ever inserted, with
retention and windows spelled out in SQL, answering the same question psoup answers;
and the comparisons (float tolerance for aggregates, Istream/Dstream of two answers).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import duckdb

from tests.support import Retain, Streams

if TYPE_CHECKING:
    from psoup.results.result import Changes, Result

#: A join's answer in answer order: (rows, earliest ts of each, tupleIDs of each).
JoinAnswer: TypeAlias = tuple[list[tuple[Any, ...]], list[float], list[tuple[int, ...]]]
#: One row of a join's answer as (row, earliest ts, tupleIDs).
Triple: TypeAlias = tuple[tuple[Any, ...], float, tuple[int, ...]]


class Oracle:
    """DuckDB holding every tuple ever inserted; retention and windows spelled in SQL."""

    def __init__(self, streams: Streams) -> None:
        self.db = duckdb.connect()
        self.retain: dict[str, Retain] = {}
        for name, (columns, retain) in streams.items():
            types = {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "bool": "BOOLEAN"}
            cols = ", ".join(f'"{c}" {types[t]}' for c, t in columns)
            self.db.execute(f'CREATE TABLE {name} (ts DOUBLE, "tupleID" BIGINT, {cols})')
            self.retain[name] = retain

    def insert(self, stream: str, rows: list[tuple[Any, ...]], ts: list[float],
               tids: list[int]) -> None:
        width = len(rows[0]) + 2
        marks = ", ".join("?" * width)
        self.db.executemany(f"INSERT INTO {stream} VALUES ({marks})",
                            [(t, i, *r) for t, i, r in zip(ts, tids, rows, strict=True)])

    def answer(self, spec: dict[str, Any], now: float) -> list[tuple[Any, ...]]:
        source = self.source(spec, now)
        where = " AND ".join(spec["where"]) or "TRUE"
        outs = ", ".join(f'"{c}"' for c in spec["outputs"])
        if spec["distinct"]:
            sql = (f'SELECT {outs} FROM {source} WHERE {where} GROUP BY {outs} '
                   f'ORDER BY min("tupleID")')
        else:
            sql = f'SELECT {outs} FROM {source} WHERE {where} ORDER BY ts, "tupleID"'
        return [tuple(r) for r in self.db.execute(sql).fetchall()]

    def source(self, spec: dict[str, Any], now: float) -> str:
        """The query's stream as DuckDB FROM text: retained, then windowed at `now`."""
        return f"({self.windowed(spec['stream'], spec['window'], now)}) AS w"

    def windowed(self, stream: str, window: tuple[Any, ...], now: float) -> str:
        """A SELECT of the stream's retained tuples in `window` at `now`."""
        retained = f"SELECT * FROM {stream}"
        retain = self.retain[stream]
        if retain and retain[0] == "rows":
            retained += f' ORDER BY "tupleID" DESC LIMIT {retain[1]}'
        elif retain:
            retained += f" WHERE ts >= (SELECT max(ts) FROM {stream}) - {retain[1]}"
        source = f"({retained}) AS kept"
        if window[0] == "range":
            edge = [now + v if kind == "now" else v for kind, v in window[1:]]
            return f"SELECT * FROM {source} WHERE ts BETWEEN {edge[0]!r} AND {edge[1]!r}"
        if window[0] == "rows":
            return f'SELECT * FROM {source} ORDER BY "tupleID" DESC LIMIT {window[1]}'
        if window[0] == "partition":
            return (f'SELECT * EXCLUDE (rn) FROM (SELECT *, row_number() OVER (PARTITION BY '
                    f'"{window[1]}" ORDER BY "tupleID" DESC) AS rn FROM {source}) '
                    f"WHERE rn <= {window[2]}")
        return f"SELECT * FROM {source}"


class JoinOracle(Oracle):
    """DuckDB holding every tuple ever inserted (as the selection Oracle); each FROM
    item's retained, windowed tuples are a subquery, and DuckDB joins them."""

    def join_answer(self, spec: dict[str, Any], now: float) -> JoinAnswer:
        """(rows, earliest ts, tupleID tuples) in answer order, DISTINCT applied."""
        items = spec["items"]
        n = len(items)
        sources = ", ".join(f"({self.windowed(s, w, now)}) AS x{i}"
                            for i, (s, w) in enumerate(zip(items, spec["windows"], strict=True)))
        outs = [f'x{i}."{c}"' for i, c in spec["outputs"]]
        earliest = "least(" + ", ".join(f"x{i}.ts" for i in range(n)) + ")"
        tids = [f'x{i}."tupleID"' for i in range(n)]
        where = " AND ".join(spec["where"]) or "TRUE"
        sql = (f"SELECT {', '.join(outs + [earliest] + tids)} FROM {sources} WHERE {where} "
               f"ORDER BY {', '.join([earliest] + tids)}")
        rows: list[tuple[Any, ...]] = []
        ts: list[float] = []
        ids: list[tuple[int, ...]] = []
        seen: set[tuple[Any, ...]] = set()
        m = len(outs)
        for r in self.db.execute(sql).fetchall():
            row = tuple(r[:m])
            if spec["distinct"]:
                if row in seen:
                    continue
                seen.add(row)
            rows.append(row)
            ts.append(r[m])
            ids.append(tuple(r[m + 1:]))
        return rows, ts, ids


def agg_value_ok(got: object, want: object) -> bool:
    if want is None or got is None:
        return got is None and want is None
    if isinstance(want, float) or isinstance(got, float):
        return (isinstance(got, float) and isinstance(want, float)
                and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6))
    return type(got) is type(want) and got == want


def rows_match(got: Sequence[Sequence[object]], want: Sequence[Sequence[object]]) -> bool:
    return len(got) == len(want) and all(
        len(g) == len(w) and all(agg_value_ok(a, b) for a, b in zip(g, w, strict=True))
        for g, w in zip(got, want, strict=True))


def answer_aggregate(db: duckdb.DuckDBPyConnection, source: str,
                     spec: dict[str, Any]) -> list[tuple[Any, ...]]:
    where = " AND ".join(spec["where"]) or "TRUE"
    sql = f"SELECT {spec['select']} FROM {source} WHERE {where}"
    if spec["keys"]:
        keys = ", ".join(spec["keys"])
        sql += f" GROUP BY {keys} ORDER BY {keys}"
    rows = [tuple(r) for r in db.execute(sql).fetchall()]
    if spec["distinct"]:
        rows = list(dict.fromkeys(rows))
    return rows


def expected_changes(old: JoinAnswer, new: JoinAnswer,
                     distinct: bool) -> tuple[list[Triple], list[Triple]]:
    """Istream/Dstream of two (rows, ts, ids) answers, keyed like psoup's cursors."""
    def entries(answer: JoinAnswer) -> list[tuple[Any, tuple[Any, ...], float, tuple[int, ...]]]:
        rows, ts, ids = answer
        keys = rows if distinct else ids
        return list(zip(keys, rows, ts, ids, strict=True))
    old_e, new_e = entries(old), entries(new)
    old_k, new_k = {e[0] for e in old_e}, {e[0] for e in new_e}
    return [e[1:] for e in new_e if e[0] not in old_k], [e[1:] for e in old_e
                                                         if e[0] not in new_k]


def as_triples(result: Result) -> list[Triple]:
    return list(zip(result.rows, result.ts.tolist(),
                    [tuple(r) for r in result.tuple_ids.tolist()], strict=True))


#: A join scenario runs six engines (3 modes x 2 routings) and checks since-cursors too;


def assert_changes_compose(before: list[tuple[Any, ...]], changes: Changes,
                           after: list[tuple[Any, ...]], context: object) -> None:
    """The `since` contract: applying a poll's `deleted` rows and then its `inserted`
    rows to the previous answer, as multisets, gives the new answer."""
    bag = Counter(before)
    for row in changes.deleted.rows:
        assert bag[row] > 0, ("deleted a row the previous answer did not have", row, context)
        bag[row] -= 1
    bag.update(changes.inserted.rows)
    assert +bag == Counter(after), ("changes do not compose", context)


def binomial_p_value(k: int, n: int, p: float) -> float:
    """The exact two-sided p-value of k successes in n Bernoulli(p) trials: the total
    probability of the outcomes no more likely than k (the binomial test)."""
    def log_pmf(i: int) -> float:
        return (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                + i * math.log(p) + (n - i) * math.log1p(-p))

    observed = log_pmf(k) + 1e-9
    return min(1.0, sum(math.exp(lp) for lp in map(log_pmf, range(n + 1)) if lp <= observed))
