"""A stream's micro-batches probed in Spark's executors (WITH (probe = 'executors')).

PSoup's duality on Spark in the shape of Flink's broadcast rules: the data partitioned
across the executors, the standing queries sent to each task as a versioned query set
(the batch's handle -> slot map and the queries' SQL, compiled once per task), and every
partition probed with psoup's own Query SteM. Each task writes its partition's rows
and their Results Structure words as one part file of the stream's batch store
(psoup.archive.batches) and reports one small row (file, rows, ts range, late and
rejected rows): that is all that reaches the driver. psoup commits the batch by its id.

`cover` is the history pass of the queries a committed batch lacks (registered after
the batch was probed): one task per part file reads its columns back, probes them with
those queries and writes a sidecar of words; no match passes through the driver either.

Spark is imported only in the functions the driver calls; the task functions run in the
executors (psoup's code reaches them as the session's zip, or a packed environment).
"""

from __future__ import annotations

import json
import math
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from psoup.archive.batches import (
    BatchStore,
    Totals,
    add_totals,
    fsync_file,
    word_column,
)
from psoup.archive.layout import ARROW_TYPES, to_numpy
from psoup.query.model import TS, TUPLE_ID, Query, StreamSchema
from psoup.results.aggregates import exact_sum

#: The row each probe task reports to the driver (Spark takes it as
#: pyspark.sql.pandas.types.from_arrow_schema of this).
REPORT_SCHEMA = pa.schema([("partition", pa.int32()), ("file", pa.string()),
                           ("rows", pa.int64()), ("lo", pa.float64()), ("hi", pa.float64()),
                           ("late", pa.int64()), ("rejected", pa.int64()),
                           ("totals", pa.string())])
#: The row each history task yields per part file it covered.
COVER_SCHEMA = pa.schema([("batch", pa.int64()), ("part", pa.string()),
                          ("file", pa.string()), ("totals", pa.string())])

#: (slot, the columns its totals sum): the aggregates without GROUP BY of a query set.
Summed = Sequence[tuple[int, Sequence[str]]]


def totals_of(ts: NDArray[np.float64], columns: Mapping[str, NDArray[Any]],
              names: Sequence[str]) -> Totals:
    """The totals of some rows (their ts and `columns`) over the columns `names`: SUMs
    exact for INT (as the engine sums), None MIN and MAX without rows. O(rows)."""
    n = len(ts)
    out: Totals = {"count": n, "ts_max": float(ts.max()) if n else None,
                   "sum": {}, "min": {}, "max": {}}
    for name in names:
        values = columns[name]
        out["sum"][name] = exact_sum(values) if n else (0 if values.dtype.kind in "iu"
                                                        else 0.0)
        out["min"][name] = values.min().item() if n else None
        out["max"][name] = values.max().item() if n else None
    return out


class _Summing:
    """The totals of each summed slot's matches over the rows a task has seen
    (`totals_of`), as JSON by slot for its report."""

    def __init__(self, summed: Summed):
        self.summed = [(slot, list(names)) for slot, names in summed]
        self.totals: dict[int, Totals] = {}

    def add(self, bits: np.ndarray, ts: np.ndarray, columns: Mapping[str, np.ndarray]
            ) -> None:
        for slot, names in self.summed:
            hit = ((bits[slot // 64] >> np.uint64(slot % 64)) & np.uint64(1)).astype(bool)
            got = totals_of(ts[hit], {c: columns[c][hit] for c in names}, names)
            self.totals[slot] = add_totals(self.totals.get(slot), got)

    def json(self) -> str:
        return json.dumps({str(slot): t for slot, t in self.totals.items()})


#: The query sets compiled in this Python worker, by (ddl, queries): Spark reuses its
#: Python workers across tasks, so a query set is compiled once per worker and version
#: (a registration or unregistration makes a new one), not at every micro-batch (10^4
#: queries take about a second to compile).
_COMPILED: dict[tuple[str, tuple[tuple[int, str], ...]], tuple[StreamSchema, Any]] = {}
_KEEP = 2


def query_set(ddl: str, queries: Sequence[tuple[int, str]]) -> tuple[StreamSchema, Any]:
    """The stream declared by `ddl` and a Query SteM holding `queries` (slot, SQL), from
    this worker's cache when it compiled the same set before (the stem is only probed,
    never changed, so a cached one can be shared)."""
    key = (ddl, tuple(queries))
    got = _COMPILED.get(key)
    if got is None:
        got = _compile(ddl, queries)
        while len(_COMPILED) >= _KEEP:
            del _COMPILED[next(iter(_COMPILED))]
        _COMPILED[key] = got
    return got


def _compile(ddl: str, queries: Sequence[tuple[int, str]]) -> tuple[StreamSchema, Any]:
    from psoup.query import compile_statement
    from psoup.query.model import Query
    from psoup.stems.query_stem import QuerySteM

    schema = compile_statement(ddl, {})
    assert isinstance(schema, StreamSchema), "the ddl is a CREATE STREAM statement"
    stem = QuerySteM()
    for slot, sql in queries:
        query = compile_statement(sql, {schema.name: schema})
        assert isinstance(query, Query)
        stem.reserve(slot)
        stem.insert(query, slot)
    return schema, stem


def words_of(stem: Any, schema: StreamSchema, columns: Mapping[str, np.ndarray], n: int,
             words: int) -> np.ndarray:
    """The (words, n) Results Structure of n rows: word w of row i holds slots
    64w .. 64w + 63 (zero past the stem's own width)."""
    out = np.zeros((max(words, stem.words), n), dtype=np.uint64)
    if n and stem.words:
        stem.probe_into(schema.name, columns, [(0, n, out[:stem.words])])
    return out[:words]


def word_encoding(columns: Sequence[str]) -> dict[str, Any]:
    """Parquet settings of a part or sidecar file: the stream's `columns` dictionary-
    encoded and compressed (Parquet's defaults), ts compressed, the words neither. Words are bits at
    about a quarter density for the paper's queries: encoding and compressing them took
    2.6x the bytes' time to write (202 against 76 ms for 50,000 rows of 157 words,
    single-threaded) to save 60% of the bytes, and made a one-word read 3x slower."""
    return {"use_dictionary": list(columns) or False,
            "compression": {c: "snappy" for c in [*columns, TS]} if columns else "none"}


def file_schema(schema: StreamSchema, words: int) -> pa.Schema:
    """A part file's columns: the stream's, ts, then `words` words."""
    return pa.schema([(c, ARROW_TYPES[t]) for c, t in schema.columns]
                     + [(TS, pa.float64())]
                     + [(word_column(w), pa.uint64()) for w in range(words)])


def probe_part(batches: Iterator[pa.RecordBatch], *, ddl: str,
               queries: Sequence[tuple[int, str]], words: int, staging: str,
               latest: float, commit_ts: float, summed: Summed = ()
               ) -> Iterator[pa.RecordBatch]:
    """What a task runs on its partition of a micro-batch: rows with a missing value
    left out, ts filled with `commit_ts` where the source gave none and raised to
    `latest` where below it (a stream's ts never decrease), probed with `queries`, and
    written with their words to one part file under `staging`; yields its report,
    with the totals of the `summed` slots' matches.

    Example:
        >>> import tempfile, pyarrow.parquet as pq
        >>> d = tempfile.mkdtemp()
        >>> rows = pa.record_batch({"a": [5, None, 1], "ts": [None, 2.0, 0.5]})
        >>> got = next(probe_part(iter([rows]), ddl="CREATE STREAM R (a INT)",
        ...            queries=[(0, "SELECT * FROM R WHERE a > 2")], words=1, staging=d,
        ...            latest=1.0, commit_ts=9.0)).to_pylist()[0]
        >>> got["rows"], got["rejected"], got["late"], got["lo"], got["hi"]
        (2, 1, 1, 1.0, 9.0)
        >>> pq.read_table(f"{d}/{got['file']}").column("psoup_w0").to_pylist()
        [1, 0]
    """
    import pyarrow.parquet as pq
    from pyspark import TaskContext

    schema, stem = query_set(ddl, queries)
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    name = f"part-{partition:05d}-{uuid.uuid4().hex[:8]}.parquet"
    target = file_schema(schema, words)
    writer = None
    rows = late = rejected = 0
    lo, hi = math.inf, -math.inf
    summing = _Summing(summed)
    try:
        for batch in batches:
            table, dropped = valid_rows(pa.Table.from_batches([batch]), schema)
            rejected += dropped
            n = table.num_rows
            if not n:
                continue
            ts = table.column(TS).to_numpy(zero_copy_only=False).astype(np.float64)
            ts = np.where(np.isnan(ts), commit_ts, ts)
            below = ts < latest
            late += int(np.count_nonzero(below))
            ts[below] = latest
            columns = {c: to_numpy(table.column(c), t) for c, t in schema.columns}
            columns[TS] = ts
            columns[TUPLE_ID] = np.arange(n, dtype=np.int64)
            bits = words_of(stem, schema, columns, n, words)
            summing.add(bits, ts, columns)
            arrays = [table.column(c).cast(ARROW_TYPES[t]) for c, t in schema.columns]
            arrays += [pa.array(ts)] + [pa.array(bits[w]) for w in range(words)]
            out = pa.Table.from_arrays(arrays, schema=target)
            if writer is None:
                writer = pq.ParquetWriter(str(Path(staging) / name), target,
                                          **word_encoding(schema.names))
            writer.write_table(out)
            rows += n
            lo, hi = min(lo, float(ts.min())), max(hi, float(ts.max()))
    finally:
        if writer is not None:
            writer.close()
    if rows:
        fsync_file(Path(staging) / name)    # durable before it is reported
    yield pa.RecordBatch.from_pylist(
        [{"partition": partition, "file": name if rows else "", "rows": rows, "lo": lo,
          "hi": hi, "late": late, "rejected": rejected, "totals": summing.json()}],
        schema=REPORT_SCHEMA)


def valid_rows(table: pa.Table, schema: StreamSchema) -> tuple[pa.Table, int]:
    """The rows with every declared column given, and how many were not (a micro-batch
    probed in a task, or collected to the psoup process: psoup.spark.live)."""
    import pyarrow.compute as pc

    valid = None
    for c in schema.names:
        ok = pc.is_valid(table.column(c))
        valid = ok if valid is None else pc.and_(valid, ok)
    if valid is None:
        return table, 0
    kept = table.filter(valid)
    return kept, table.num_rows - kept.num_rows


def _spark_schema(schema: pa.Schema) -> Any:
    """An Arrow schema as the Spark schema mapInArrow takes."""
    from pyspark.sql.pandas.types import from_arrow_schema
    return from_arrow_schema(schema)


def probe_batch(frame: Any, store: BatchStore, ddl: str, queries: Mapping[str, str],
                latest: float, commit_ts: float,
                summed: Mapping[str, Sequence[str]] | None = None
                ) -> tuple[Path, list[dict[str, Any]], dict[str, int]]:
    """Run one micro-batch's probe on the executors: (its staging folder, the tasks'
    reports, handle -> slot of the query set it was probed with). `summed`: handle ->
    the columns whose totals its matches keep per part file (`summed_columns`)."""
    slots = {handle: slot for slot, handle in enumerate(sorted(queries))}
    listed = [(slot, queries[handle]) for handle, slot in slots.items()]
    words = (len(slots) + 63) // 64
    staging = store.staging()
    run = partial(probe_part, ddl=ddl, queries=listed, words=words, staging=str(staging),
                  latest=latest, commit_ts=commit_ts,
                  summed=[(slots[h], list(c)) for h, c in (summed or {}).items()
                          if h in slots])
    rows = frame.mapInArrow(run, _spark_schema(REPORT_SCHEMA)).collect()
    return staging, [r.asDict() for r in rows], slots


def summed_columns(schema: StreamSchema, query: Query) -> list[str] | None:
    """The columns whose totals a query's matches keep per part file, or None when its
    answer cannot be made from totals: an aggregate without GROUP BY whose arguments
    are INT or FLOAT columns or ts (COUNT(*) needs none), as the archive's aggregate
    copies answer (psoup.archive.rollups). O(select list)."""
    from psoup.query.model import ColumnType
    from psoup.results.aggregates import Aggregator

    if not query.aggregated or query.group_by:
        return None
    types = dict(schema.columns)
    names = [c for _, c in Aggregator(query).needed]
    if any(c != TS and types.get(c) not in (ColumnType.INT, ColumnType.FLOAT)
           for c in names):
        return None                 # tupleID (given at commit), TEXT, BOOL
    return names


def summed_of(schema: StreamSchema, queries: Mapping[str, Query]) -> dict[str, list[str]]:
    """Handle -> `summed_columns` of each of `queries` whose totals are kept."""
    got = {h: summed_columns(schema, q) for h, q in queries.items()}
    return {h: names for h, names in got.items() if names is not None}


# ---------------------------------------------------------------------- history

def cover_part(batches: Iterator[pa.RecordBatch], *, ddl: str,
               queries: Sequence[tuple[int, str]], words: int, columns: Sequence[str],
               summed: Summed = ()) -> Iterator[pa.RecordBatch]:
    """What a history task runs: for each (batch, part file, sidecar path) row, read
    the part file's columns, probe them with `queries` and write their words to the
    sidecar path; yields (batch, part, sidecar file name, the `summed` slots' totals
    as JSON)."""
    import pyarrow.parquet as pq

    schema, stem = query_set(ddl, queries)
    target = pa.schema([(word_column(w), pa.uint64()) for w in range(words)])
    for batch in batches:
        for job in batch.to_pylist():
            table = pq.read_table(job["path"], columns=[*columns, TS])
            n = table.num_rows
            cols = {c: to_numpy(table.column(c), t) for c, t in schema.columns}
            cols[TS] = table.column(TS).to_numpy()
            cols[TUPLE_ID] = np.arange(n, dtype=np.int64)
            bits = words_of(stem, schema, cols, n, words)
            summing = _Summing(summed)
            summing.add(bits, cols[TS], cols)
            out = pa.Table.from_arrays([pa.array(bits[w]) for w in range(words)],
                                       schema=target)
            pq.write_table(out, job["out"], **word_encoding(()))
            fsync_file(Path(job["out"]))
            yield pa.RecordBatch.from_pylist(
                [{"batch": job["batch"], "part": job["part"],
                  "file": Path(job["out"]).name, "totals": summing.json()}],
                schema=COVER_SCHEMA)


#: Runs a history task over its jobs (one dict per part file): the rows it yields.
Runner = Callable[[list[dict[str, Any]], Callable[..., Iterator[pa.RecordBatch]]],
                  list[dict[str, Any]]]


def spark_runner(spark: Any) -> Runner:
    """Run history tasks on Spark: one task per part file, up to the default
    parallelism at once; only their (batch, part, file) rows come back."""
    def run(jobs: list[dict[str, Any]], task: Callable[..., Iterator[pa.RecordBatch]]
            ) -> list[dict[str, Any]]:
        frame = spark.createDataFrame(jobs, "batch BIGINT, part STRING, path STRING, "
                                            "out STRING")
        frame = frame.repartition(max(1, min(len(jobs),
                                             spark.sparkContext.defaultParallelism)))
        return [r.asDict() for r in
                frame.mapInArrow(task, _spark_schema(COVER_SCHEMA)).collect()]
    return run


def cover(run: Runner, store: BatchStore, ddl: str, queries: Mapping[str, str],
          lacking: Mapping[int, Sequence[str]],
          summed: Mapping[str, Sequence[str]] | None = None) -> int:
    """The history pass: probe each batch in `lacking` (batch id -> handles) with the
    queries it lacks (those still in `queries`, handle -> SQL), the part files' tasks
    run by `run` (`spark_runner`), and commit each batch's sidecar (with the totals of
    the `summed` handles, as `probe_batch`); how many batches were covered. Batches
    lacking the same handles share one run."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for batch_id, handles in lacking.items():
        wanted = tuple(sorted(h for h in handles if h in queries))
        if wanted:
            groups.setdefault(wanted, []).append(batch_id)
    by_id = {b.batch_id: b for b in store.batches()}
    done = 0
    for handles, ids in groups.items():
        slots = {h: i for i, h in enumerate(handles)}
        staging = store.staging()
        try:
            jobs = [{"batch": b, "part": f.name, "path": str(by_id[b].folder / f.name),
                     "out": str(staging / f"{b}-{f.name}")}
                    for b in ids if b in by_id for f in by_id[b].files]
            task = partial(cover_part, ddl=ddl,
                           queries=[(s, queries[h]) for h, s in slots.items()],
                           words=(len(slots) + 63) // 64, columns=list(store.types),
                           summed=[(slots[h], list(c)) for h, c in (summed or {}).items()
                                   if h in slots])
            handle_of = {str(s): h for h, s in slots.items()}
            per_batch: dict[int, dict[str, str]] = {}
            totals: dict[int, dict[str, dict[str, Totals]]] = {}
            for row in run(jobs, task) if jobs else []:
                b, part = int(row["batch"]), row["part"]
                per_batch.setdefault(b, {})[part] = row["file"]
                totals.setdefault(b, {})[part] = {
                    handle_of[s]: t for s, t in json.loads(row["totals"]).items()}
            for batch_id, names in per_batch.items():
                moved = store.staging()
                for name in names.values():
                    (staging / name).rename(moved / name)
                store.cover(batch_id, moved, names, slots, totals[batch_id])
                done += 1
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return done
