"""Historical evaluation: standing queries over the archive, in one Spark pass.

"Remembrance of Streams Past" (Sect. 3-4): a query whose window reaches back past what
memory holds must see the archived data too. The archive (psoup.archive.parquet) is
Parquet by stream and day; this job reads one stream's files and, inside the executors,
probes each Arrow batch with psoup's own Query SteM holding *all* the queries to
evaluate (`mapInArrow`; the queries travel as SQL text and are compiled once per task),
so a thousand queries cost one pass over the data, not a thousand. Each match is one
row: the query's slot, and the tuple's tupleID, ts and columns. Spark shuffles them by
slot and sorts them by slot and tupleID, and the executors write them, one file per
query and at most SEGMENT_ROWS matches a file (`write_segments`), under a staging
directory in the archive, already as the segments of the queries' archive tiers
(psoup.archive.tiers: the sampled layout, the sample's metadata), with a manifest of
the files that Spark commits per task. No match is collected through Spark's driver
(whose results are bounded by spark.driver.maxResultSize, 1 GB by default: 3.9 GB of
matches for a billion archived tuples at an 8% match rate would fail there), and none
passes through psoup either: psoup reads the manifest and renames the files it names
into place (`receive`), O(files). The tiers keep an index of the segments and read the
part a window needs at invocation.

Spark is imported here only, and this runs only when the user asks for history
(`Engine.evaluate_history`), never on an invocation.
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from psoup.archive.layout import (
    ARROW_TYPES,
    SAMPLE_COLUMN,
    SPARK_TYPES,
    TS_COLUMN,
    TUPLE_ID_COLUMN,
    check_part,
    to_numpy,
)
from psoup.archive.policy import step_at
from psoup.archive.rates import GROUP_WIDTH, threshold
from psoup.archive.sampling import draws_of, write_runs
from psoup.errors import ArchiveError, PSoupError
from psoup.fsync import make_dir, sync_file_system, write_whole
from psoup.query.model import TS, TUPLE_ID, ColumnType, StreamSchema
from psoup.spark.session import spark_error

if TYPE_CHECKING:
    from psoup.archive.policy import Schedule
    from psoup.archive.tiers import Sampled, Segment

SLOT = "slot"
#: At most this many matches in one segment file the executors write: a task holds
#: one such segment at a time (a few MB with a few columns), and a window that reaches
#: a little way into the archive reads a segment of at most this many.
SEGMENT_ROWS = 1 << 16


@dataclass
class Job:
    """One stream's history job: its DDL and schema, the queries to evaluate as (slot,
    SQL), and the first tupleID still held in memory (the archive holds those below).
    `samples`: the slots that read a sample of the archive (TABLESAMPLE, an overload
    policy), with its schedule of rates (psoup.archive.policy); `until`: the ts of the
    first tuple held in memory (where their samples end)."""

    ddl: str
    schema: StreamSchema
    queries: list[tuple[int, str]]
    below: int
    samples: dict[int, Schedule] = field(default_factory=dict)
    until: float = math.inf
    archived_rows: int = 0

    @property
    def rows_read(self) -> int:
        """About how many archived rows the pass reads: all, unless every query samples."""
        if len(self.samples) < len(self.queries) or not self.samples:
            return self.archived_rows
        top = max(rate for steps in self.samples.values() for _, rate in steps)
        return int(self.archived_rows * top)


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
    spark = spark_session(master, conf, progress)
    if group is not None:
        spark.sparkContext.setJobGroup(group, "psoup history", interruptOnCancel=True)
    found = {}
    for job in jobs:
        if cancelled():
            raise JobCancelled("the history job was cancelled")
        found[job.schema.name] = evaluate(spark, root, job.ddl, job.schema, job.queries,
                                          job.below, into, progress, job.samples, job.until)
    return found


class JobCancelled(PSoupError):
    """A history job stopped because it was cancelled."""


def receive(staging: Path, into: Path, schema: StreamSchema, slots: Sequence[int],
            sampled: Mapping[int, Sampled] | None = None) -> dict[int, list[Segment]]:
    """Take the segment files the executors wrote under `staging` (`write_segments`:
    one file per slot and at most SEGMENT_ROWS of its matches, already in their final
    form) into `into`/SLOT/FIRST-LAST.parquet, made durable by one sync of the file
    system at the end: slot -> its segments (absolute paths as names) in tupleID order;
    a slot without matches gets none. Only the files named by the job's manifest are
    taken: Spark committed the manifest of one attempt per task, so the files of a
    failed or speculative attempt stay behind (and go with `staging`). O(files): psoup
    reads the manifest and renames files, it never opens a segment.

    `sampled`: the slots whose matches are from a sample of the archive, with how it
    was drawn (their files say so in their metadata, written by the executors); one
    without matches gets an empty file saying it (`sample_marker`), so that the tier
    knows its rate after a restart too."""
    from psoup.archive.tiers import Segment, sample_marker, segment_name

    sampled = sampled or {}
    out: dict[int, list[Segment]] = {slot: [] for slot in slots}
    for entry in read_manifest(staging):
        slot, first, last = int(entry["slot"]), int(entry["first"]), int(entry["last"])
        target = into / segment_name(str(slot), first, last)
        make_dir(target.parent, private=True)
        shutil.move(staging / str(entry["name"]), target)   # a rename on one file system
        out.setdefault(slot, []).append(Segment(str(target), first, last, float(entry["lo"]),
                                                float(entry["hi"]), int(entry["rows"]),
                                                sampled.get(slot)))
    for slot, how in sampled.items():
        if slot in out and not out[slot]:           # no match in the sample: a marker
            out[slot].append(sample_marker(into, str(slot), how, table_schema(schema)))
    if any(out.values()):
        sync_file_system(into)              # one journal commit, not one a file
    for slot, found in out.items():
        found.sort(key=lambda seg: seg.first)
        if any(x.last >= y.first for x, y in zip(found, found[1:], strict=False)):
            raise PSoupError(f"history: the matches of query slot {slot} overlap across "
                             f"the files under {staging}")
    return out


def read_manifest(staging: Path) -> list[dict[str, Any]]:
    """The rows of the manifest the job committed under `staging` (MANIFEST_SCHEMA),
    one per segment file. O(files)."""
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for path in sorted((staging / MANIFEST).glob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


#: One row per segment file the executors wrote: its slot, its path under the staging
#: folder, its first and last tupleIDs, lowest and highest ts, and its matches.
MANIFEST_SCHEMA = pa.schema([(SLOT, pa.int64()), ("name", pa.string()),
                             ("first", pa.int64()), ("last", pa.int64()),
                             ("lo", pa.float64()), ("hi", pa.float64()),
                             ("rows", pa.int64())])
_MANIFEST_SPARK = ("`slot` BIGINT, `name` STRING, `first` BIGINT, `last` BIGINT, "
                   "`lo` DOUBLE, `hi` DOUBLE, `rows` BIGINT")


def write_segments(batches: Iterator[pa.RecordBatch], staging: str, schema: pa.Schema,
                   segment_rows: int, sampled: Mapping[int, str]
                   ) -> Iterator[pa.RecordBatch]:
    """What each task of the write stage runs, in the executors: its matches (slot,
    tupleID, ts, the stream's columns, draw), sorted by slot and tupleID, written as
    the tier's segment files, one per slot and at most `segment_rows` matches, in their
    final form (`schema`, the sampled layout, and for the slots of `sampled` their
    psoup.archive.tiers.Sampled as JSON in the metadata), under a folder of this
    attempt's own in `staging`; yields their manifest rows (MANIFEST_SCHEMA), which
    Spark commits for one attempt of the task only. Holds one segment at a time.

    Example:
        >>> import tempfile, pyarrow.parquet as pq
        >>> target = pa.schema([("tupleID", pa.int64()), ("ts", pa.float64()),
        ...                     ("psoup_sample", pa.int16())])
        >>> batch = pa.record_batch({"slot": [1, 1, 4], "tupleID": [3, 5, 3],
        ...                          "ts": [0.5, 1.5, 0.5], "psoup_sample": [7, 8, 9]})
        >>> with tempfile.TemporaryDirectory() as d:
        ...     rows = next(write_segments(iter([batch]), d, target, 1, {})).to_pylist()
        ...     back = pq.read_table(f"{d}/{rows[1]['name']}").column("tupleID")
        >>> [(r["slot"], r["first"], r["last"], r["rows"]) for r in rows], back.to_pylist()
        ([(1, 3, 3, 1), (1, 5, 5, 1), (4, 3, 3, 1)], [5])
    """
    writer = _SegmentWriter(Path(staging), schema, segment_rows, sampled)
    for batch in batches:
        writer.add(batch)
    writer.flush()
    if writer.manifest:
        yield pa.RecordBatch.from_pylist(writer.manifest, schema=MANIFEST_SCHEMA)


class _SegmentWriter:
    """`write_segments`' state: the current slot's matches not yet written."""

    def __init__(self, staging: Path, schema: pa.Schema, segment_rows: int,
                 sampled: Mapping[int, str]):
        self.folder = Path(uuid.uuid4().hex)     # this attempt's, relative to staging
        self.staging, self.schema, self.segment_rows = staging, schema, segment_rows
        self.sampled = sampled
        self.rng = np.random.default_rng()       # draws for matches that come without one
        self.manifest: list[dict[str, Any]] = []
        self.held: list[pa.RecordBatch] = []
        self.rows = 0
        self.last = (-1, -1)                     # the (slot, tupleID) of the last match

    def add(self, batch: pa.RecordBatch) -> None:
        """Take a batch of matches, writing each segment it completes."""
        if not batch.num_rows:
            return
        slot_of = batch.column(SLOT).to_numpy()
        ids = batch.column(TUPLE_ID).to_numpy()
        self._check_order(slot_of, ids)
        self.last = (int(slot_of[-1]), int(ids[-1]))
        cuts = np.flatnonzero(np.diff(slot_of)) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(slot_of)], strict=False):
            if self.held and int(self.held[0].column(SLOT)[0].as_py()) != int(slot_of[a]):
                self.flush()
            while a < b:
                take = min(b - a, self.segment_rows - self.rows)
                self.held.append(batch.slice(a, take))
                self.rows += take
                a += take
                if self.rows >= self.segment_rows:
                    self.flush()

    def _check_order(self, slot_of: np.ndarray, ids: np.ndarray) -> None:
        """The shuffle sorted the matches by (slot, tupleID): a segment must hold a
        run of them, so anything else is a bug, not something to repair."""
        slot_of = np.concatenate([[self.last[0]], slot_of])
        ids = np.concatenate([[self.last[1]], ids])
        step = np.diff(slot_of)
        if (step < 0).any() or ((step == 0) & (np.diff(ids) <= 0)).any():
            raise ValueError("history: the matches reached the segment writer out of "
                             "(slot, tupleID) order")

    def flush(self) -> None:
        """Write the held matches as one segment file, and its manifest row."""
        from psoup.archive.tiers import SAMPLED_KEY, segment_name

        if not self.held:
            return
        table = pa.Table.from_batches(self.held)
        self.held, self.rows = [], 0
        slot = int(table.column(SLOT)[0].as_py())
        ids, ts = table.column(TUPLE_ID), table.column(TS)
        first, last = int(ids[0].as_py()), int(ids[-1].as_py())
        table = table.drop_columns([SLOT]).cast(self.schema)
        how = self.sampled.get(slot)
        if how is not None:
            table = table.replace_schema_metadata({SAMPLED_KEY: how})
        name = self.folder / segment_name(str(slot), first, last)
        make_dir((self.staging / name).parent, private=True)
        write_whole(self.staging / name, partial(write_runs, table, self.rng), private=True,
                    fsync=False)        # psoup syncs the file system once they are moved
        self.manifest.append({SLOT: slot, "name": str(name), "first": first, "last": last,
                              "lo": float(ts[0].as_py()), "hi": float(ts[-1].as_py()),
                              "rows": table.num_rows})


def table_schema(schema: StreamSchema) -> pa.Schema:
    """The columns of a tier's segment files: tupleID, ts, then the stream's."""
    return pa.schema([(TUPLE_ID, pa.int64()), (TS, pa.float64())]
                     + [(name, ARROW_TYPES[ctype]) for name, ctype in schema.columns])


def segment_schema(schema: StreamSchema) -> pa.Schema:
    """A segment file holding matches: `table_schema` and each match's draw."""
    return table_schema(schema).append(pa.field(SAMPLE_COLUMN, pa.int16()))


def out_schema(schema: StreamSchema) -> pa.Schema:
    """The match rows: slot, tuple_id, ts, the stream's columns, then the tuple's draw
    (psoup.archive.sampling: the tier keeps it, so that a sampled read of the tier
    takes the same tuples as one of the archive)."""
    return pa.schema([(SLOT, pa.int64()), (TUPLE_ID_COLUMN, pa.int64()),
                      (TS_COLUMN, pa.float64())]
                     + [(name, ARROW_TYPES[ctype]) for name, ctype in schema.columns]
                     + [(SAMPLE_COLUMN, pa.int16())])


def probe_batches(ddl: str, queries: Sequence[tuple[int, str]],
                  batches: Iterator[pa.RecordBatch],
                  thresholds: Mapping[int, Limits] | None = None
                  ) -> Iterator[pa.RecordBatch]:
    """What each Spark task runs: a Query SteM with `queries` (slot, SQL) over the
    stream declared by `ddl`, probed with every batch; yields the matches.

    `thresholds`: slot -> its sample's (from ts, threshold) steps: a row stamped ts is
    in the sample when its draw is below the threshold of the step holding ts (the
    rows of a batch carry their draws in SAMPLE_COLUMN, null for a part file written
    before the sampled layout: `draws_of` then draws from the tupleID).

    Example:
        >>> ddl = "CREATE STREAM R (a INT)"
        >>> batch = pa.record_batch({"ts": [1.0, 2.0], "tuple_id": [7, 8], "a": [5, 1]})
        >>> out = next(probe_batches(ddl, [(3, "SELECT * FROM R WHERE a > 2")], iter([batch])))
        >>> out.to_pydict()       # the draw: hashed from the tupleID, the batch has none
        {'slot': [3], 'tuple_id': [7], 'ts': [1.0], 'a': [5], 'psoup_sample': [471]}
    """
    from psoup.spark.executors import query_set

    schema, stem = query_set(ddl, queries)
    target = out_schema(schema)
    wanted = np.array(sorted(slot for slot, _ in queries), dtype=np.int64)
    masks = _sample_masks(thresholds or {})
    for batch in batches:
        if batch.num_rows == 0:
            continue
        columns = {name: to_numpy(batch.column(name), ctype) for name, ctype in schema.columns}
        columns["ts"] = batch.column(TS_COLUMN).to_numpy()
        columns["tupleID"] = batch.column(TUPLE_ID_COLUMN).to_numpy()
        raw = batch.column(SAMPLE_COLUMN) if SAMPLE_COLUMN in batch.schema.names else None
        if FILE in batch.schema.names:
            _check_order(columns["ts"], batch.column(FILE).to_numpy(zero_copy_only=False),
                         None if raw is None else
                         raw.fill_null(-GROUP_WIDTH).to_numpy() // GROUP_WIDTH)
        bits = stem.probe(schema.name, columns, batch.num_rows)
        drawn = draws_of(raw, columns["tupleID"])
        if masks:
            for limits, mask in masks:
                out = drawn >= step_at(limits, columns["ts"])
                if out.any():
                    width = min(bits.shape[1], len(mask))
                    bits[out, :width] &= ~mask[:width]
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
        arrays.append(pa.array(drawn[live[hit_rows]].astype(np.int16)))
        yield pa.RecordBatch.from_arrays(arrays, schema=target)


#: (from ts, draw threshold) steps of a sample, the first from -inf.
Limits = tuple[tuple[float, int], ...]


def limits_of(schedule: Schedule) -> Limits:
    """A schedule of rates as steps of draw thresholds (psoup.archive.sampling)."""
    return tuple((start, threshold(rate)) for start, rate in schedule)


def _sample_masks(thresholds: Mapping[int, Limits]) -> list[tuple[Limits, np.ndarray]]:
    """(thresholds, bit mask of the slots sampled at them) per distinct schedule."""
    out = []
    for limit in sorted(set(thresholds.values())):
        slots = [slot for slot, t in thresholds.items() if t == limit]
        mask = np.zeros(max(slots) // 64 + 1, dtype=np.uint64)
        for slot in slots:
            mask[slot // 64] |= np.uint64(1) << np.uint64(slot % 64)
        out.append((limit, mask))
    return out


def _check_order(ts: np.ndarray, files: np.ndarray, groups: np.ndarray | None = None
                 ) -> None:
    """A part file's rows are in tupleID order within each row group of the sampled
    layout (`groups`: each row's, -1 for a file without it), so their ts must not
    decrease there (the archive's invariant); names the first file where it does."""
    same = files[1:] == files[:-1]
    if groups is not None:
        same &= groups[1:] == groups[:-1]
    down = np.flatnonzero((np.diff(ts) < 0) & same)
    if len(down):
        i = int(down[0])
        name = str(files[i]).removeprefix("file://")
        raise ValueError(f"ts decreases within {name} (from {float(ts[i])} to "
                         f"{float(ts[i + 1])})")


def evaluate(spark: Any, root: Path, ddl: str, schema: StreamSchema,
             queries: Sequence[tuple[int, str]], below: int, into: Path,
             progress: Callable[[str], None] | None = None,
             samples: Mapping[int, Schedule] | None = None, until: float = math.inf
             ) -> dict[int, list[Segment]]:
    """The matches of `queries` over the archived tuples of `schema.name` with tupleID
    below `below`, as segment files per slot under `into` (`receive`); none when the
    stream has no archive. The executors write the segments and their manifest under
    `root/.history/` (removed before this returns or raises; psoup renames the files
    from there into `into`), so `root` must be writable by them and readable and
    writable here, like the archive itself.

    `samples`: the slots that read a sample of the archive, with its schedule of rates
    (a row is in it when its draw is below `threshold` of the rate at its ts). When
    every query samples, Spark is asked for the rows below the largest threshold of
    each ts range only, which its Parquet reader finds by skipping the row groups
    whose draw (and ts) statistics say they hold none (the sampled layout,
    psoup.archive.sampling): a 25% sample reads a quarter of the archive. Part files
    without draws are read whole (their draws hashed from the tupleID). `until`: the
    ts where the samples end (the first tuple in memory)."""
    from pyspark.sql import functions as F

    from psoup.archive.sampling import is_sampled
    from psoup.archive.tiers import Sampled

    root = Path(root).resolve()                 # the JVM's working directory may differ
    into = Path(into).resolve()                 # segment names are absolute (`receive`)
    folder = root / f"stream={schema.name}"
    slots = [slot for slot, _ in queries]
    files = sorted(folder.rglob("*.parquet"))
    if not queries or not files:
        return {slot: [] for slot in slots}
    samples = {slot: steps for slot, steps in (samples or {}).items()
               if any(rate < 1.0 for _, rate in steps)}
    limits = {slot: limits_of(steps) for slot, steps in samples.items()}
    layouts = [is_sampled(check_file(path, schema)) for path in files]
    names = [TS_COLUMN, TUPLE_ID_COLUMN, *[name for name, _ in schema.columns]]
    ddl_read = ", ".join(f"`{c}` {SPARK_TYPES[t]}" for c, t in
                         [(TS_COLUMN, ColumnType.FLOAT), (TUPLE_ID_COLUMN, ColumnType.INT),
                          *schema.columns])
    try:
        frame = (spark.read.schema(f"{ddl_read}, `{SAMPLE_COLUMN}` SMALLINT")
                 .parquet(str(folder))
                 .select(*names, SAMPLE_COLUMN, F.input_file_name().alias(FILE))
                 .where(F.col(TUPLE_ID_COLUMN) < below))
        if len(limits) == len(queries) and all(layouts):
            # every query samples: the row groups that hold no row of any sample are
            # not read (Spark pushes the filter down to Parquet's statistics)
            frame = frame.where(_pushdown(F, list(limits.values())))
    except Exception as exc:        # a schema that does not merge across the files
        raise PSoupError(f"history of stream {schema.name}: the archive under {folder} "
                         f"does not match the stream: {spark_error(exc)}") from None
    queries = list(queries)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        return probe_batches(ddl, queries, batches, limits)

    if progress is not None:
        progress(f"evaluating {len(queries)} queries over the archive of {schema.name}")
        if limits and not all(layouts):
            progress(f"{layouts.count(False)} of the {len(files)} part files of "
                     f"{schema.name} are not in the sampled layout and are read whole "
                     "(psoup archive reshape rewrites them)")
    spark_schema = ", ".join(f"`{name}` {SPARK_TYPES[ctype]}" for name, ctype in
                             [(SLOT, ColumnType.INT), (TUPLE_ID_COLUMN, ColumnType.INT),
                              (TS_COLUMN, ColumnType.FLOAT),
                              *schema.columns]) + f", `{SAMPLE_COLUMN}` SMALLINT"
    staging = root / STAGING / uuid.uuid4().hex
    sampled = {slot: Sampled(tuple(steps), below, until) for slot, steps in samples.items()}
    write = partial(write_segments, staging=str(staging), schema=segment_schema(schema),
                    segment_rows=SEGMENT_ROWS,
                    sampled={slot: how.to_json() for slot, how in sampled.items()})
    try:
        try:
            # the executors write the segments; Spark's committer writes the manifest
            # of one attempt per task, which is all that comes back to psoup
            (frame.mapInArrow(run, spark_schema).withColumnRenamed(TUPLE_ID_COLUMN, TUPLE_ID)
             .repartition(SLOT).sortWithinPartitions(SLOT, TUPLE_ID)
             .mapInArrow(write, _MANIFEST_SPARK)
             .write.parquet((staging / MANIFEST).as_uri()))
        except Exception as exc:        # a page that does not decode, ts out of order
            named = _UNSORTED.search(str(exc))
            raise PSoupError(f"history of stream {schema.name}: "
                             + (named.group(1) if named else f"the archive under {folder} "
                                f"cannot be read: {spark_error(exc)}")) from None
        return receive(staging, into, schema, slots, sampled)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            staging.parent.rmdir()          # empty once no job uses it


def _pushdown(F: Any, schedules: list[Limits]) -> Any:
    """The rows some sample of `schedules` may take, as a Spark filter Parquet can
    push down: per ts range between the schedules' steps, the draws below the largest
    of their thresholds there (OR of (ts range AND draw < t))."""
    starts = sorted({start for steps in schedules for start, _ in steps})
    ends = starts[1:] + [math.inf]
    ts, draw = F.col(TS_COLUMN), F.col(SAMPLE_COLUMN)
    keep = None
    for lo, hi in zip(starts, ends, strict=True):
        top = max(_threshold_at(steps, lo) for steps in schedules)
        part = draw < top
        if lo > -math.inf:
            part = part & (ts >= lo)
        if hi < math.inf:
            part = part & (ts < hi)
        keep = part if keep is None else keep | part
    return keep


def _threshold_at(steps: Limits, ts: float) -> int:
    """The threshold of the step of `steps` holding ts."""
    return [t for start, t in steps if start <= ts][-1]


def check_file(path: Path, schema: StreamSchema) -> pa.Schema:
    """A part file's footer: readable, with exactly the stream's columns in its types
    (PSoupError naming the file otherwise); its Arrow schema. O(footer)."""
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
    return found


_UNSORTED = re.compile(r"ValueError: (ts decreases within \S+ \(from [^)]*\))")
FILE = "_psoup_file"
#: Where under the archive root the executors write a job's matches (a directory the
#: archive's own layout, stream=NAME/date=DAY/, never matches).
STAGING = ".history"
#: The folder of a job's staging folder holding its manifest (`write_segments`).
MANIFEST = "manifest"

