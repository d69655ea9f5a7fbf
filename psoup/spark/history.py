"""Historical evaluation: standing queries over the archive, in one Spark pass.

"Remembrance of Streams Past" (Sect. 3-4): a query whose window reaches back past what
memory holds must see the archived data too. The archive (psoup.archive.parquet) is
Parquet by stream and day; this job reads one stream's files and, inside the executors,
probes each Arrow batch with psoup's own Query SteM holding *all* the queries to
evaluate (`mapInArrow`; the queries travel as SQL text and are compiled once per task),
so a thousand queries cost one pass over the data, not a thousand. Each match comes back
as one row: the query's slot, and the tuple's tupleID, ts and columns. The driver
groups them by slot for the archive tier of the Results Structure
(psoup.results.history).

Spark is imported here only, and this runs only when the user asks for history
(`Engine.evaluate_history`), never on an invocation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from psoup.archive.parquet import ARROW_TYPES, TS_COLUMN, TUPLE_ID_COLUMN
from psoup.query.model import StreamSchema

SLOT = "slot"


def out_schema(schema: StreamSchema) -> pa.Schema:
    """The match rows: slot, tuple_id, ts, then the stream's columns."""
    return pa.schema([(SLOT, pa.int64()), (TUPLE_ID_COLUMN, pa.int64()),
                      (TS_COLUMN, pa.float64())]
                     + [(name, ARROW_TYPES[ctype]) for name, ctype in schema.columns])


def probe_batches(ddl: str, queries: Sequence[tuple[int, str]],
                  batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """What each Spark task runs: a Query SteM with `queries` (slot, SQL) over the
    stream declared by `ddl`, probed with every batch; yields the matches.

    Example:
        >>> ddl = "CREATE STREAM R (a INT)"
        >>> batch = pa.record_batch({"ts": [1.0, 2.0], "tuple_id": [7, 8], "a": [5, 1]})
        >>> out = next(probe_batches(ddl, [(3, "SELECT * FROM R WHERE a > 2")], iter([batch])))
        >>> out.to_pydict()
        {'slot': [3], 'tuple_id': [7], 'ts': [1.0], 'a': [5]}
    """
    from psoup.query import compile_statement
    from psoup.query.model import Query
    from psoup.stems.query_stem import QuerySteM

    schema = compile_statement(ddl, {})
    stem = QuerySteM()
    for slot, sql in queries:
        query = compile_statement(sql, {schema.name: schema})
        assert isinstance(query, Query)
        stem.reserve(slot)
        stem.insert(query, slot)
    target = out_schema(schema)
    wanted = np.array(sorted(slot for slot, _ in queries), dtype=np.int64)
    for batch in batches:
        if batch.num_rows == 0:
            continue
        columns = {name: _numpy(batch.column(name), ctype) for name, ctype in schema.columns}
        columns["ts"] = batch.column(TS_COLUMN).to_numpy()
        columns["tupleID"] = batch.column(TUPLE_ID_COLUMN).to_numpy()
        bits = stem.probe(schema.name, columns, batch.num_rows)
        live = np.flatnonzero(bits.any(axis=1))
        if not len(live):
            continue
        # every (row, slot) match at once: a bool per slot for the rows matching any
        flags = np.unpackbits(np.ascontiguousarray(bits[live]).view(np.uint8), axis=1,
                              bitorder="little")[:, wanted]
        hit_rows, hit_slots = np.nonzero(flags)
        take = pa.array(live[hit_rows])
        arrays = [pa.array(wanted[hit_slots]), batch.column(TUPLE_ID_COLUMN).take(take),
                  batch.column(TS_COLUMN).take(take)]
        arrays += [batch.column(name).take(take).cast(ARROW_TYPES[ctype])
                   for name, ctype in schema.columns]
        yield pa.RecordBatch.from_arrays(arrays, schema=target)


def _numpy(column: pa.Array, ctype: str) -> np.ndarray:
    if ctype == "text":
        return np.array(column.to_pylist(), dtype=object)
    return column.to_numpy(zero_copy_only=False)


def evaluate(spark, root: Path, ddl: str, schema: StreamSchema,
             queries: Sequence[tuple[int, str]], below: int,
             progress: Callable[[str], None] | None = None) -> pa.Table:
    """The matches of `queries` over the archived tuples of `schema.name` with tupleID
    below `below`, as one Arrow table (slot, tuple_id, ts, columns...) sorted by slot,
    then tupleID. An empty table when the stream has no archive."""
    from pyspark.sql import functions as F

    folder = Path(root) / f"stream={schema.name}"
    target = out_schema(schema)
    if not queries or not any(folder.rglob("*.parquet")):
        return target.empty_table()
    frame = (spark.read.parquet(str(folder))
             .select(TS_COLUMN, TUPLE_ID_COLUMN, *[name for name, _ in schema.columns])
             .where(F.col(TUPLE_ID_COLUMN) < below))
    queries = list(queries)

    def run(batches):
        return probe_batches(ddl, queries, batches)

    if progress is not None:
        progress(f"evaluating {len(queries)} queries over the archive of {schema.name}")
    spark_schema = ", ".join(f"`{field.name}` {_SPARK_TYPES[str(field.type)]}"
                             for field in target)
    matches = frame.mapInArrow(run, spark_schema).toArrow()
    if matches.num_rows == 0:
        return target.empty_table()
    matches = matches.cast(target)
    return matches.sort_by([(SLOT, "ascending"), (TUPLE_ID_COLUMN, "ascending")])


_SPARK_TYPES = {"int64": "BIGINT", "double": "DOUBLE", "string": "STRING", "bool": "BOOLEAN"}
