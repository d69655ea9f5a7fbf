"""Historical evaluation: standing queries over the archive, in one Spark pass.

"Remembrance of Streams Past" (Sect. 3-4): a query whose window reaches back past what
memory holds must see the archived data too. The archive (psoup.archive.parquet) is
Parquet by stream and day; this job reads one stream's files and, inside the executors,
probes each Arrow batch with psoup's own Query SteM holding *all* the queries to
evaluate (`mapInArrow`; the queries travel as SQL text and are compiled once per task),
so a thousand queries cost one pass over the data, not a thousand. Each match is one
row: the query's slot, and the tuple's tupleID, ts and columns. Spark shuffles them by
slot and sorts them by slot and tupleID, and the executors write them as Parquet under
a staging directory in the archive, at most SEGMENT_ROWS a file; nothing is collected
through Spark's driver (whose results are bounded by spark.driver.maxResultSize, 1 GB
by default: 3.9 GB of matches for a billion archived tuples at an 8% match rate would
fail there). psoup then splits each file into one per query (`receive`), a file at a
time, as the segments of the queries' archive tiers (psoup.results.tiers), which keep
an index of them and read the part a window needs at invocation.

Spark is imported here only, and this runs only when the user asks for history
(`Engine.evaluate_history`), never on an invocation.
"""

from __future__ import annotations

import re
import shutil
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from psoup.archive.layout import (ARROW_TYPES, SPARK_TYPES, TS_COLUMN, TUPLE_ID_COLUMN,
                                  check_part, to_numpy)
from psoup.errors import ArchiveError, PSoupError
from psoup.fsync import make_dir, sync_file_system, write_whole
from psoup.spark.session import spark_error
from psoup.query.model import TS, TUPLE_ID, StreamSchema

if TYPE_CHECKING:
    from psoup.results.tiers import Segment

SLOT = "slot"
#: At most this many matches in one file the executors write: psoup holds one such file
#: at a time while it splits it per query (a few MB with a few columns; with 1 << 20 its
#: peak memory grew 1.5x from 1M to 30M archived tuples, with 1 << 18 1.45x), and a
#: window that reaches a little way into the archive reads a segment of at most this
#: many. (Spark writes a file in ~13 ms: 10 files a million matches.)
SEGMENT_ROWS = 1 << 16


@dataclass
class Job:
    """One stream's history job: its DDL and schema, the queries to evaluate as (slot,
    SQL), and the first tupleID still held in memory (the archive holds those below)."""

    ddl: str
    schema: StreamSchema
    queries: list[tuple[int, str]]
    below: int


def evaluate_jobs(root: Path, jobs: Sequence[Job], master: str | None = None,
                  progress: Callable[[str], None] | None = None, group: str | None = None,
                  cancelled: Callable[[], bool] = lambda: False,
                  conf: Mapping[str, str] | None = None, *, into: Path
                  ) -> dict[str, dict[int, list[Segment]]]:
    """Every job's matches as segment files (`evaluate`) under `into` per stream and
    slot, from the archive under `root` (flushed by the caller). All jobs run before
    anything is returned, so a failure in one leaves the caller with nothing to install
    (and files under `into` to remove).

    Args:
        group: the Spark job group the jobs run in (psoup.spark.session.cancel_group
            stops them from another thread).
        cancelled: checked before each stream; True stops with JobCancelled.
        master, conf: the Spark master and settings (psoup.spark.session.spark_session).
    """
    from psoup.spark.session import spark_session
    spark = spark_session(master, conf)
    if group is not None:
        spark.sparkContext.setJobGroup(group, "psoup history", interruptOnCancel=True)
    found = {}
    for job in jobs:
        if cancelled():
            raise JobCancelled("the history job was cancelled")
        found[job.schema.name] = evaluate(spark, root, job.ddl, job.schema, job.queries,
                                          job.below, into, progress)
    return found


class JobCancelled(PSoupError):
    """A history job stopped because it was cancelled."""


def receive(staging: Path, into: Path, schema: StreamSchema, slots: Sequence[int]
            ) -> dict[int, list[Segment]]:
    """Split the match files the executors wrote under `staging` (each sorted by slot
    and tupleID, at most SEGMENT_ROWS matches) into one file per slot and file,
    `into`/SLOT/FIRST-LAST.parquet (owner-only, made durable by one sync of the file
    system at the end): slot -> its segments
    (absolute paths as names) in tupleID order; a slot without matches gets none.
    O(matches), one file in memory at a time. (Spark writing a file per slot itself,
    with `partitionBy`, costs ~13 ms a file: 13 s for 1,024 queries; pyarrow, ~1 ms.)"""
    import pyarrow.parquet as pq

    from psoup.results.tiers import Segment, segment_name

    out: dict[int, list[Segment]] = {slot: [] for slot in slots}
    for path in sorted(staging.glob("*.parquet")):
        table = pq.read_table(path)
        if not table.num_rows:                  # an empty partition's file
            continue
        slot_of = table.column(SLOT).to_numpy()
        ids = table.column(TUPLE_ID).to_numpy()
        step = np.diff(slot_of)
        if (step < 0).any() or ((step == 0) & (np.diff(ids) <= 0)).any():
            table = table.sort_by([(SLOT, "ascending"), (TUPLE_ID, "ascending")])
            slot_of, ids = table.column(SLOT).to_numpy(), table.column(TUPLE_ID).to_numpy()
        ts = table.column(TS).to_numpy()
        table = table.drop_columns([SLOT])
        cuts = np.flatnonzero(np.diff(slot_of)) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(slot_of)]):
            slot, first, last = int(slot_of[a]), int(ids[a]), int(ids[b - 1])
            target = into / segment_name(str(slot), first, last)
            make_dir(target.parent, private=True)
            write_whole(target, partial(pq.write_table, table.slice(a, b - a)), private=True,
                        fsync=False)
            out.setdefault(slot, []).append(Segment(str(target), first, last, float(ts[a]),
                                                    float(ts[b - 1]), b - a))
    if any(out.values()):
        sync_file_system(into)              # one journal commit, not one a file
    for slot, found in out.items():
        found.sort(key=lambda seg: seg.first)
        if any(x.last >= y.first for x, y in zip(found, found[1:])):
            raise PSoupError(f"history: the matches of query slot {slot} overlap across "
                             f"the files under {staging}")
    return out


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
    assert isinstance(schema, StreamSchema), "the ddl is a CREATE STREAM statement"
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
        columns = {name: to_numpy(batch.column(name), ctype) for name, ctype in schema.columns}
        columns["ts"] = batch.column(TS_COLUMN).to_numpy()
        columns["tupleID"] = batch.column(TUPLE_ID_COLUMN).to_numpy()
        if FILE in batch.schema.names:
            _check_order(columns["ts"], batch.column(FILE).to_numpy(zero_copy_only=False))
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


def _check_order(ts: np.ndarray, files: np.ndarray) -> None:
    """A file's rows are in tupleID order, so their ts must not decrease (the archive's
    invariant); names the first file where it does."""
    down = np.flatnonzero((np.diff(ts) < 0) & (files[1:] == files[:-1]))
    if len(down):
        i = int(down[0])
        name = str(files[i]).removeprefix("file://")
        raise ValueError(f"ts decreases within {name} (from {float(ts[i])} to "
                         f"{float(ts[i + 1])})")


def evaluate(spark, root: Path, ddl: str, schema: StreamSchema,
             queries: Sequence[tuple[int, str]], below: int, into: Path,
             progress: Callable[[str], None] | None = None) -> dict[int, list[Segment]]:
    """The matches of `queries` over the archived tuples of `schema.name` with tupleID
    below `below`, as segment files per slot under `into` (`receive`); none when the
    stream has no archive. The executors write the matches under `root/.history/`
    (removed before this returns or raises), so `root` must be writable by them and
    readable here, like the archive itself."""
    from pyspark.sql import functions as F

    root = Path(root).resolve()                 # the JVM's working directory may differ
    into = Path(into).resolve()                 # segment names are absolute (`receive`)
    folder = root / f"stream={schema.name}"
    slots = [slot for slot, _ in queries]
    files = sorted(folder.rglob("*.parquet"))
    if not queries or not files:
        return {slot: [] for slot in slots}
    for path in files:
        check_file(path, schema)
    try:
        frame = (spark.read.parquet(str(folder))
                 .select(TS_COLUMN, TUPLE_ID_COLUMN, *[name for name, _ in schema.columns],
                         F.input_file_name().alias(FILE))
                 .where(F.col(TUPLE_ID_COLUMN) < below))
    except Exception as exc:        # a schema that does not merge across the files
        raise PSoupError(f"history of stream {schema.name}: the archive under {folder} "
                         f"does not match the stream: {spark_error(exc)}") from None
    queries = list(queries)

    def run(batches):
        return probe_batches(ddl, queries, batches)

    if progress is not None:
        progress(f"evaluating {len(queries)} queries over the archive of {schema.name}")
    spark_schema = ", ".join(f"`{name}` {SPARK_TYPES[ctype]}" for name, ctype in
                             [(SLOT, "int"), (TUPLE_ID_COLUMN, "int"), (TS_COLUMN, "float"),
                              *schema.columns])
    staging = root / STAGING / uuid.uuid4().hex
    try:
        try:
            (frame.mapInArrow(run, spark_schema).withColumnRenamed(TUPLE_ID_COLUMN, TUPLE_ID)
             .repartition(SLOT).sortWithinPartitions(SLOT, TUPLE_ID)
             .write.option("maxRecordsPerFile", SEGMENT_ROWS).parquet(staging.as_uri()))
        except Exception as exc:        # a page that does not decode, ts out of order
            named = _UNSORTED.search(str(exc))
            raise PSoupError(f"history of stream {schema.name}: "
                             + (named.group(1) if named else f"the archive under {folder} "
                                f"cannot be read: {spark_error(exc)}")) from None
        return receive(staging, into, schema, slots)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        try:
            staging.parent.rmdir()          # empty once no job uses it
        except OSError:
            pass


def check_file(path: Path, schema: StreamSchema) -> None:
    """A part file's footer: readable, with exactly the stream's columns in its types
    (PSoupError naming the file otherwise). O(footer)."""
    import pyarrow.parquet as pq
    try:
        found = pq.ParquetFile(path).schema_arrow
    except Exception as exc:
        raise PSoupError(f"history of stream {schema.name}: {path} is not a readable "
                         f"Parquet file ({spark_error(exc)})") from None
    try:
        check_part(found, path, schema.name, schema.columns)
    except ArchiveError as exc:
        raise PSoupError(f"history of stream {schema.name}: {exc}") from None


_UNSORTED = re.compile(r"ValueError: (ts decreases within \S+ \(from [^)]*\))")
FILE = "_psoup_file"
#: Where under the archive root the executors write a job's matches (a directory the
#: archive's own layout, stream=NAME/date=DAY/, never matches).
STAGING = ".history"

