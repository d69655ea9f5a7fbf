"""The Pathway side of bench/peers.py, run in its own process by the interpreter that has
Pathway (Pathway pins versions psoup's environment may not share, and builds one global
dataflow per process).

Reads the tuples from a folder of CSV files (tid,a,b,c,d) and the queries from a JSON
file of factor lists [[column, op, constant], ...], builds one of two dataflows, runs it
to the end of the (static) input and prints one JSON object: seconds to build the
graph, seconds to run it, and each query's match count.

- filters: one `filter` per query over the input table, each reduced to its count, the
  counts concatenated into one table (N operators: the form a Pathway user writes first);
- data: the queries as a table of per-attribute bounds [lo, hi] (an inequality `a < 37`
  is `a` in [0, 36]), joined to every tuple and filtered by the bounds, then counted per
  query (queries as data: one operator whatever N is).

Usage: python bench/peers_pathway.py filters|data CSV_DIR QUERIES_JSON
"""

from __future__ import annotations

import functools
import json
import operator
import sys
import time
from typing import Any

import pathway as pw

OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
       "=": operator.eq}
COLUMNS = ("a", "b", "c", "d")
DOMAIN = 256


class Tuples(pw.Schema):  # type: ignore[misc]  # pathway is untyped here (Any)
    tid: int
    a: int
    b: int
    c: int
    d: int


def filters(data: pw.Table, queries: list[list[Any]]) -> pw.Table:
    """One filter and one count per query."""
    counts: list[pw.Table] = []
    for qid, factors in enumerate(queries):
        match = functools.reduce(operator.and_, [OPS[op](data[c], v) for c, op, v in factors])
        counts.append(data.filter(match).reduce(qid=qid, n=pw.reducers.count()))
    return pw.Table.concat_reindex(*counts)


def bounds(queries: list[list[Any]]) -> list[dict[str, int]]:
    """Each query as one row of inclusive bounds per attribute.

    Example:
        >>> row = bounds([[["a", "<", 37], ["c", ">=", 128]]])[0]
        >>> row["lo_a"], row["hi_a"], row["lo_c"], row["hi_c"]
        (0, 36, 128, 255)
    """
    rows: list[dict[str, int]] = []
    for qid, factors in enumerate(queries):
        row = {"qid": qid, "key": 0}
        row.update({f"lo_{c}": 0 for c in COLUMNS} | {f"hi_{c}": DOMAIN - 1 for c in COLUMNS})
        for c, op, v in factors:
            if op in ("<", "<=", "="):
                row[f"hi_{c}"] = min(row[f"hi_{c}"], v - 1 if op == "<" else v)
            if op in (">", ">=", "="):
                row[f"lo_{c}"] = max(row[f"lo_{c}"], v + 1 if op == ">" else v)
        rows.append(row)
    return rows


def queries_as_data(data: pw.Table, queries: list[list[Any]]) -> pw.Table:
    """The queries as a table joined to the data, one count per query."""
    import pandas as pd
    table = pw.debug.table_from_pandas(pd.DataFrame(bounds(queries)))
    keyed = data.with_columns(key=0)
    limits = {name: table[name] for c in COLUMNS for name in (f"lo_{c}", f"hi_{c}")}
    pairs = keyed.join(table, keyed.key == table.key).select(
        qid=table.qid, **{c: keyed[c] for c in COLUMNS}, **limits)
    match = functools.reduce(operator.and_, [
        (pairs[c] >= pairs[f"lo_{c}"]) & (pairs[c] <= pairs[f"hi_{c}"]) for c in COLUMNS])
    matched = pairs.filter(match)
    return matched.groupby(matched.qid).reduce(matched.qid, n=pw.reducers.count())


def main() -> None:
    variant, folder, queries_path = sys.argv[1:4]
    with open(queries_path) as f:
        queries = json.load(f)
    began = time.perf_counter()
    data = pw.io.fs.read(folder, format="csv", schema=Tuples, mode="static")
    counts = (filters if variant == "filters" else queries_as_data)(data, queries)
    got: dict[int, int] = {}

    def on_change(key: Any, row: dict[str, Any], time: int, is_addition: bool) -> None:
        if is_addition:
            got[row["qid"]] = row["n"]
        elif got.get(row["qid"]) == row["n"]:
            del got[row["qid"]]
    pw.io.subscribe(counts, on_change)
    built = time.perf_counter()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    ran = time.perf_counter()
    print(json.dumps({"build_s": built - began, "run_s": ran - built,
                      "counts": [got.get(q, 0) for q in range(len(queries))]}))


if __name__ == "__main__":
    main()
