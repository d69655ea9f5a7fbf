"""`psoup archive import`: files of tuples (CSV, JSON lines, Parquet) as an archive.

The archive (psoup.archive.parquet) is what an engine writes as tuples leave retention;
this Spark job writes the same thing from files a producer kept, so history that never
went through an engine can be replayed (psoup.spark.replay) like any other:

1. each file is read by Spark and checked on its own, so an error names the file: every
   declared column present, of a type that casts to the column's (INT from integers or
   integer text, FLOAT from numbers or numeric text, TEXT from text, BOOL from booleans
   or true/false text), no missing value, no NaN (psoup has no NULLs, docs/language.md), and a
   timestamp per row (seconds since the epoch, or ISO 8601, UTC unless it says otherwise);
2. the rows of all files are sorted by (ts, file, row in file) and given tupleIDs in that
   order, continuing after the archive's high water mark for the stream; a stream's
   archived ts never decreases in tupleID order, so the input may not begin before the
   archive's latest ts;
3. each sorted partition is written inside the executors with pyarrow (`mapInArrow`), one
   file per UTC day it touches, named by its tupleID range, with psoup's schema in the
   metadata: exactly what `Archive` writes. Files appear (renamed from ``*.tmp``, in
   tupleID order) only when every task has succeeded, so a failed import leaves the
   archive as it was (a crash during the renames leaves a prefix of whole files).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from psoup.archive.layout import (
    SECONDS_PER_DAY,
    TS_COLUMN,
    TUPLE_ID_COLUMN,
    arrow_schema,
    part_path,
    stream_columns,
)
from psoup.archive.parquet import Archive
from psoup.archive.rollups import Rollups, folder_for
from psoup.archive.sampling import sampled_schema, write_run
from psoup.errors import ArchiveError
from psoup.formats import InputFormat, input_format
from psoup.fsync import fsync_dir
from psoup.query.model import ColumnType
from psoup.spark.session import spark_error

_INT, _FLOAT, _TEXT, _BOOL = ColumnType.INT, ColumnType.FLOAT, ColumnType.TEXT, ColumnType.BOOL
_NUMBERS = (_INT, _FLOAT)

#: The input formats, and the file name endings that imply them.
_FILE, _ROW, _PID, _MID = "_psoup_file", "_psoup_row", "_psoup_pid", "_psoup_mid"
_ROW_GROUP = 1 << 16          # rows per Parquet row group written
_FILE_ROWS = 1 << 20          # about the rows per sorted partition (and at most per file)
_ID_BITS = 33                 # monotonically_increasing_id: partition << 33 | row


@dataclass
class ImportReport:
    """What an import did: rows archived, files written, their tupleIDs, wall seconds."""

    rows: int
    files: list[Path]
    first_tid: int | None
    last_tid: int | None
    seconds: float

    @property
    def rate(self) -> float:
        return self.rows / max(self.seconds, 1e-9)


def parse_columns(stream: str, text: str) -> list[tuple[str, ColumnType]]:
    """A column list such as "lane INT, speed FLOAT, road TEXT", read by psoup's own
    CREATE STREAM grammar.

    Raises:
        QueryError: bad syntax, an unknown type, a duplicate column.

    Example:
        >>> parse_columns("traffic", "lane INT, road TEXT")
        [('lane', <ColumnType.INT: 'int'>), ('road', <ColumnType.TEXT: 'text'>)]
    """
    from psoup.query import compile_statement
    from psoup.query.model import StreamSchema

    schema = compile_statement(f"CREATE STREAM {stream} ({text})", {})
    assert isinstance(schema, StreamSchema), "CREATE STREAM compiles to a StreamSchema"
    return [(name, ctype) for name, ctype in schema.columns]


def import_files(files: Sequence[str | Path], stream: str,
                 columns: Sequence[tuple[str, str]], into: str | Path,
                 ts_column: str = "ts", fmt: str | None = None,
                 master: str | None = None, conf: Mapping[str, str] | None = None,
                 progress: Callable[[str], None] | None = None) -> ImportReport:
    """Archive the rows of `files` as stream `stream` under the archive root `into`.

    Args:
        files: input files, read in this order (ties in ts keep it).
        stream: the stream's name.
        columns: its schema, (name, type) pairs, each type a ColumnType or its name
            (checked); `parse_columns` reads the CLI's form.
        into: the archive root; created if missing.
        ts_column: the input column holding each row's timestamp.
        fmt: csv, jsonl (JSON lines; "json" and "ndjson" are accepted too) or parquet;
            None guesses from each file's name. CSV and JSON lines may be compressed
            (.gz, .bz2, .zst; psoup.formats), which Spark reads by the suffix.
        master: the Spark master URL (None: local[*], or the session already running).
        conf: Spark settings (psoup.spark.session.spark_session).
        progress: hears each phase as it begins ("…") and what it found (Spark's
            start, the rows read and checked, the rows written), for a person waiting.

    Raises:
        ArchiveError: a file that lacks a column or holds a value that does not fit
            (the message names the file and the column), input older than the
            archive's latest ts for the stream, or an archive stream of other columns.
            Nothing is written then. So is a format or a compression that is not
            supported (psoup.formats.input_format), before Spark starts.
    """
    began = time.perf_counter()
    schema = arrow_schema(stream, columns)         # checks the names and types
    declared = [(name, ColumnType(ctype)) for name, ctype in columns]
    if not files:
        raise ArchiveError("no input files")
    if ts_column in dict(declared):
        raise ArchiveError(f"'{ts_column}' cannot be both the timestamp column and a "
                           f"column of stream '{stream}'")
    try:
        formats = [input_format(f, fmt)[0] for f in files]
    except ValueError as exc:
        raise ArchiveError(str(exc)) from None
    for path, fm in zip(files, formats, strict=True):          # seconds, before Spark's start
        _preflight(Path(path), fm, declared, ts_column)
    archive = Archive(into)
    _check_archived_schema(archive, stream, declared)
    high, latest = archive.high_water(stream), archive.latest_ts(stream)

    say = progress or (lambda message: None)
    say(f"{len(files)} input file{'' if len(files) == 1 else 's'} checked (headers and "
        "first rows)")
    from psoup.spark.session import spark_session
    spark = spark_session(master, conf, progress)
    say("reading and checking every row (a Spark job)…")
    typed = [_typed(spark, Path(f), i, fm, declared, ts_column)
             for i, (f, fm) in enumerate(zip(files, formats, strict=True))]
    frame = typed[0]
    for other in typed[1:]:
        frame = frame.unionByName(other)
    rows, first_ts = _checked(frame, [Path(f) for f in files], declared, ts_column)
    say(f"{rows:,} row{'' if rows == 1 else 's'} read and checked")
    if rows == 0:
        return ImportReport(0, [], None, None, time.perf_counter() - began)
    if latest is not None and first_ts < latest:
        raise ArchiveError(f"{archive.root} holds stream '{stream}' up to ts {latest!r}, and "
                           f"the input begins at ts {first_ts!r}: an archived stream only "
                           "grows forward in time (import older data into another directory)")
    say(f"sorting and writing {rows:,} rows (a Spark job)…")
    written = _write(frame, rows, stream, declared, schema, archive.root, high + 1)
    say(f"{len(written)} part file{'' if len(written) == 1 else 's'} written")
    # the new part files' aggregate copies, beside the archive (psoup.archive.rollups)
    Rollups(archive.root, folder_for(archive.root)).build(stream)
    return ImportReport(rows, written, high + 1, high + rows, time.perf_counter() - began)


def _check_archived_schema(archive: Archive, stream: str,
                           columns: Sequence[tuple[str, ColumnType]]) -> None:
    """An archived stream keeps its columns: the new files must read with the old."""
    path = archive.last_part(stream)
    if path is None:
        return
    have = stream_columns(pq.read_schema(path))
    if have is not None and [tuple(c) for c in have] != list(columns):
        described = ", ".join(f"{c} {t.upper()}" for c, t in have)
        raise ArchiveError(f"{archive.root} holds stream '{stream}' with columns "
                           f"{described}; import with those columns or into another directory")


# ---------------------------------------------------------------------- reading

#: Rows of each file read by `_preflight` (its first block, at most).
PREFLIGHT_ROWS = 1000


def _preflight(path: Path, fmt: InputFormat, columns: Sequence[tuple[str, ColumnType]],
               ts_column: str) -> None:
    """Check a file's header (or first record) and the types of its first rows with
    pyarrow, so that a wrong header or a column of the wrong type is reported at once,
    not after Spark has started (tens of seconds). The Spark job still checks every
    value; this only fails early on what is plainly wrong.

    Raises:
        ArchiveError: unreadable, a missing column, or a first-rows value that cannot be
            the declared type; the message names the file and the column.
    """
    names = [ts_column, *(c for c, _ in columns)]
    try:
        have, head = _head(path, fmt, names)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ArchiveError(f"{path}: cannot be read as {fmt} ({exc})") from None
    for name in names:
        if name not in have:
            what = "timestamp column" if name == ts_column else "column"
            raise ArchiveError(f"{path}: no {what} '{name}' (its columns: "
                               f"{', '.join(have) or 'none'})")
    if head is None or head.num_rows == 0:
        return
    for name, ctype in columns:
        values = head.column(name)
        if ctype in _NUMBERS and not pa.types.is_integer(values.type) and \
                not (ctype == _FLOAT and pa.types.is_floating(values.type)):
            text = values.cast(pa.string()).to_pylist()
            for value in text:
                if value is None:
                    continue
                try:
                    number = float(value)
                except ValueError:
                    number = None
                if number is None or (ctype == _INT and not number.is_integer()):
                    raise ArchiveError(f"{path}: {_problem(name, ctype, value)} (in its "
                                       f"first {head.num_rows:,} rows)")


def _head(path: Path, fmt: InputFormat, names: Sequence[str]) -> tuple[list[str], pa.Table | None]:
    """(the file's column names, its first rows of `names` as text or typed columns;
    None when it has no rows)."""
    import json

    import pyarrow.csv as pacsv
    if fmt == "parquet":
        have = pq.read_schema(path).names
        batches = pq.ParquetFile(path).iter_batches(
            batch_size=PREFLIGHT_ROWS, columns=[n for n in names if n in have])
        first = next(batches, None)
        return have, None if first is None else pa.Table.from_batches([first])
    with pa.input_stream(str(path), compression="detect") as stream:
        if fmt == "csv":
            reader = pacsv.open_csv(stream, read_options=pacsv.ReadOptions(block_size=1 << 16),
                                    convert_options=pacsv.ConvertOptions(
                                        column_types={n: pa.string() for n in names}))
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return reader.schema.names, None
            return reader.schema.names, pa.Table.from_batches(
                [batch], reader.schema).slice(0, PREFLIGHT_ROWS)
        block = stream.read(1 << 16)
    lines = block.splitlines()
    if len(block) == 1 << 16:
        lines = lines[:-1]                      # the last line may be cut short
    rows = [json.loads(line) for line in lines if line.strip()][:PREFLIGHT_ROWS]
    if not rows:
        return [], None
    return list(rows[0]), pa.Table.from_pylist(
        [{n: None if r.get(n) is None else str(r.get(n)) for n in names} for r in rows])


def _typed(spark: Any, path: Path, index: int, fmt: InputFormat,
           columns: Sequence[tuple[str, ColumnType]], ts_column: str) -> Any:
    """The file as a DataFrame of ts, file index, row number (increasing in input order),
    the columns typed (NULL where a value does not fit) and, for the checks' messages,
    the columns as read."""
    from pyspark.sql import functions as F

    # absolute: the JVM resolves a relative path against its own working directory,
    # the one it started in, which need not be this process's now
    where = str(path.resolve())
    try:
        if fmt == "csv":
            # Every cell as text, typed below; a quoted "" stays an empty TEXT.
            raw = spark.read.options(header=True, nullValue="\u0000").csv(where)
        elif fmt == "jsonl":
            raw = spark.read.options(mode="FAILFAST").json(where)
        else:
            raw = spark.read.parquet(where)
        kinds = dict(raw.dtypes)
    except Exception as exc:   # Spark's errors come as py4j / PySpark classes of many kinds
        raise ArchiveError(f"{path}: Spark cannot read it as {fmt} ({spark_error(exc)})") \
            from exc
    for name in [ts_column, *(c for c, _ in columns)]:
        if name not in kinds:
            what = "timestamp column" if name == ts_column else "column"
            raise ArchiveError(f"{path}: no {what} '{name}' (its columns: "
                               f"{', '.join(kinds) or 'none'})")
    out = [_timestamps(F, ts_column, kinds[ts_column], path).alias(TS_COLUMN),
           F.lit(index).alias(_FILE), F.monotonically_increasing_id().alias(_ROW)]
    for name, ctype in columns:
        out.append(_cast(F, F.col(f"`{name}`"), kinds[name], ctype, path, name).alias(name))
    for name in [ts_column, *(c for c, _ in columns)]:
        out.append(F.col(f"`{name}`").cast("string").alias(f"_psoup_raw_{name}"))
    return raw.select(*out)


def _timestamps(F: Any, name: str, kind: str, path: Path) -> Any:
    column = F.col(f"`{name}`")
    if kind in ("timestamp", "timestamp_ntz"):
        return F.unix_micros(column.cast("timestamp")) / 1e6
    if kind == "string":
        return F.coalesce(F.expr(f"try_cast(`{name}` AS DOUBLE)"),
                          F.expr(f"unix_micros(try_cast(`{name}` AS TIMESTAMP))") / 1e6)
    if _numeric(kind):
        return column.cast("double")
    raise ArchiveError(f"{path}: timestamp column '{name}' holds {kind}; it needs seconds "
                       "since the epoch or ISO 8601 date-times")


def _numeric(kind: str) -> bool:
    return kind in ("tinyint", "smallint", "int", "bigint", "float", "double") or \
        kind.startswith("decimal")


def _cast(F: Any, column: Any, kind: str, ctype: ColumnType, path: Path, name: str) -> Any:
    """`column` (of Spark type `kind`) as psoup type `ctype`; NULL where a value does not
    fit. A type that can never fit is an error at once."""
    if kind == "string":
        if ctype == _TEXT:
            return column
        if ctype == _BOOL:
            lowered = F.lower(F.trim(column))
            return F.when(lowered == "true", True).when(lowered == "false", False)
        return F.expr(f"try_cast(`{name}` AS {'BIGINT' if ctype == _INT else 'DOUBLE'})")
    fits = {_INT: kind in ("tinyint", "smallint", "int", "bigint") or
            (kind.startswith("decimal") and kind.endswith(",0)")),
            _FLOAT: _numeric(kind), _BOOL: kind == "boolean", _TEXT: False}[ctype]
    if not fits:
        raise ArchiveError(f"{path}: column '{name}' holds {kind}, which does not cast to "
                           f"{ctype.upper()}")
    return column.cast({_INT: "bigint", _FLOAT: "double", _BOOL: "boolean"}[ctype])


def _checked(frame: Any, paths: Sequence[Path], columns: Sequence[tuple[str, ColumnType]],
             ts_column: str) -> tuple[int, float]:
    """(rows, smallest ts) of the typed files, after checking every value of every file
    in one Spark job (an aggregate per file).

    Raises:
        ArchiveError: in the first file with a bad value, the first column (ts first,
            then schema order) with a value that is missing, does not fit, or is NaN;
            the message names the file and quotes the value.
    """
    from pyspark.sql import functions as F

    checks = [(ts_column, TS_COLUMN, F.col(TS_COLUMN).isNull() | F.isnan(TS_COLUMN) |
               (F.abs(TS_COLUMN) == float("inf")))]
    for name, ctype in columns:
        bad = F.col(f"`{name}`").isNull()
        if ctype == _FLOAT:
            bad = bad | F.isnan(f"`{name}`")
        checks.append((name, name, bad))
    aggregates = [F.count(F.lit(1)), F.min(TS_COLUMN)]
    for name, _, bad in checks:
        raw = F.col(f"`_psoup_raw_{name}`")
        aggregates += [F.count_if(bad), F.min_by(raw, F.when(bad, F.col(_ROW)))]
    try:
        results = {r[0]: r[1:] for r in frame.groupBy(_FILE).agg(*aggregates).collect()}
    except Exception as exc:   # Spark's errors come as py4j / PySpark classes of many kinds
        named = [str(p) for p in paths if str(p.resolve()) in str(exc)] or map(str, paths)
        raise ArchiveError(f"{', '.join(named)}: {spark_error(exc)}") from exc
    for index, path in enumerate(paths):
        result = results.get(index)
        for i, (name, typed, _) in enumerate(checks):
            count, example = (result[2 + 2 * i], result[3 + 2 * i]) if result else (0, None)
            if count:
                declared = dict(columns).get(typed)
                raise ArchiveError(f"{path}: {_problem(name, declared, example)} "
                                   f"({count:,} row{'' if count == 1 else 's'} like it)")
    rows = sum(r[0] for r in results.values())
    return rows, min((r[1] for r in results.values()), default=float("inf"))


def _problem(name: str, ctype: ColumnType | None, example: Any) -> str:
    if ctype is None:
        if example is None:
            return f"timestamp column '{name}' has a missing value"
        return (f"timestamp column '{name}' holds {example!r}, neither a finite number of "
                "seconds since the epoch nor an ISO 8601 date-time")
    if example is None:
        return f"column '{name}' has a missing value (psoup has no NULLs)"
    if ctype == _FLOAT and str(example).strip().lower() == "nan":
        return f"column '{name}' holds NaN, which is not a value (psoup has no NULLs)"
    return f"column '{name}' holds {example!r}, which is not {ctype.upper()}"


# ---------------------------------------------------------------------- writing

def _write(frame: Any, rows: int, stream: str, columns: Sequence[tuple[str, ColumnType]],
           schema: pa.Schema, root: Path, first_tid: int) -> list[Path]:
    """Sort, number and write the rows; returns the part files, in tupleID order.

    The executors get the archive root as an absolute path (a relative one would be
    taken relative to each executor's own working directory). All or nothing: when the
    job or a rename fails, the ``.tmp`` files and the parts this import wrote are
    removed before the error is raised."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    root = Path(root).resolve()
    names = [c for c, _ in columns]
    keys = (TS_COLUMN, _FILE, _ROW)
    ordered = (frame.select(*keys, *(F.col(f"`{c}`") for c in names))
               .repartitionByRange(max(1, -(-rows // _FILE_ROWS)), *keys)
               .sortWithinPartitions(*keys)
               .withColumn(_PID, F.spark_partition_id())
               .withColumn(_MID, F.monotonically_increasing_id())
               .persist(StorageLevel.MEMORY_AND_DISK))
    try:
        sizes = dict(ordered.groupBy(_PID).count().collect())
        offsets, at = [], first_tid
        for pid in range(max(sizes) + 1):
            offsets.append(at)
            at += sizes.get(pid, 0)
        # the n-th row of sorted partition p gets offsets[p] + n
        tids = (F.element_at(F.array(*map(F.lit, offsets)), F.col(_PID) + 1)
                + F.col(_MID) - F.col(_PID).cast("bigint") * (1 << _ID_BITS))
        numbered = ordered.select(F.col(TS_COLUMN), tids.alias(TUPLE_ID_COLUMN),
                                  *(F.col(f"`{c}`") for c in names))
        try:    # mapInArrow itself needs pandas: its absence is reported here too
            done = numbered.mapInArrow(partial(_write_partition, str(root), stream, schema),
                                       "tmp STRING, final STRING, first BIGINT").collect()
        except Exception as exc:   # Spark's errors: py4j / PySpark classes of many kinds
            _remove_written(root, stream, first_tid, first_tid + rows - 1)
            raise ArchiveError(f"writing stream '{stream}' under {root} failed: "
                               f"{spark_error(exc)}") from exc
    finally:
        ordered.unpersist()
    written = []
    try:
        for row in sorted(done, key=lambda r: r["first"]):
            final = Path(row["final"])
            os.replace(row["tmp"], final)
            for directory in (final.parent, final.parent.parent, root):
                fsync_dir(directory)
            written.append(final)
    except OSError as exc:
        _remove_written(root, stream, first_tid, first_tid + rows - 1)
        raise ArchiveError(f"writing stream '{stream}' under {root} failed: {exc}; none of "
                           "the input was archived") from exc
    return written


def _remove_written(root: Path, stream: str, first: int, last: int) -> None:
    """Remove the part files and ``.tmp`` files of `stream` under `root` whose first
    tupleID lies in [first, last]: what a failed import wrote (tupleIDs below `first`
    are the archive's own), and the day directories left empty. Best effort: a file that
    cannot be removed is left."""
    for path in (root / f"stream={stream}").glob("date=*/part-*"):
        match = re.match(r"part-(\d{20})[-.]", path.name)
        if match and first <= int(match.group(1)) <= last:
            with suppress(OSError):
                path.unlink()
    for day in (root / f"stream={stream}").glob("date=*"):
        with suppress(OSError):
            day.rmdir()                 # only if the failed import left it empty


class _DayFile:
    """One UTC day of a task's rows, written to a ``.tmp`` file as they come, in runs of
    `_ROW_GROUP` rows in the sampled layout (psoup.archive.sampling: each run cut into
    row groups by a fresh uniform draw per row); named for its tupleID range when
    closed."""

    def __init__(self, root: str, stream: str, schema: pa.Schema, day: int, ts: float,
                 first: int):
        self.root, self.stream, self.schema, self.day = root, stream, schema, day
        self.ts, self.first, self.last = ts, first, first
        path = part_path(root, stream, ts, first, first)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = str(path.with_name(f"part-{first:020d}.parquet.tmp"))
        self.writer = pq.ParquetWriter(self.tmp, sampled_schema(schema))
        self.rng = np.random.default_rng()
        self.pending: list[pa.RecordBatch] = []
        self.held = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.held += batch.num_rows
        self.last = batch.column(1)[-1].as_py()
        if self.held >= _ROW_GROUP:
            self._flush()

    def close(self) -> pa.RecordBatch:
        """Write what is pending, close and fsync; returns (tmp, final, first)."""
        self._flush()
        self.writer.close()
        with open(self.tmp, "rb+") as f:
            os.fsync(f.fileno())
        final = part_path(self.root, self.stream, self.ts, self.first, self.last)
        return pa.RecordBatch.from_pydict({"tmp": [self.tmp], "final": [str(final)],
                                           "first": [self.first]})

    def _flush(self) -> None:
        if self.pending:
            write_run(self.writer, pa.Table.from_batches(self.pending, schema=self.schema),
                      self.rng)
        self.pending, self.held = [], 0


def _write_partition(root: str, stream: str, schema: pa.Schema,
                     batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """What each Spark task runs: its sorted, numbered rows as one ``.tmp`` Parquet file
    per UTC day; yields (tmp path, final path, first tupleID) per file."""
    current: _DayFile | None = None
    for batch in batches:
        if not batch.num_rows:
            continue
        batch = pa.RecordBatch.from_arrays(
            [col.cast(field.type) for col, field in zip(batch.columns, schema, strict=True)],
            schema=schema)
        ts = batch.column(0).to_numpy()
        days = np.floor_divide(ts, SECONDS_PER_DAY).astype(np.int64)
        cuts = [0, *(np.flatnonzero(days[1:] != days[:-1]) + 1).tolist(), len(days)]
        for a, b in zip(cuts, cuts[1:], strict=False):
            if current is not None and current.day != days[a]:
                yield current.close()
                current = None
            if current is None:
                current = _DayFile(root, stream, schema, int(days[a]), float(ts[a]),
                                   batch.column(1)[a].as_py())
            current.add(batch.slice(a, b - a))
    if current is not None:
        yield current.close()
