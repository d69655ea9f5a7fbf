"""Streams fed by a Spark source (CREATE STREAM ... FROM FILES | RATE | KAFKA), supervised.

For each such stream the engine runs one Spark Structured Streaming query on the
process's session (psoup.spark.session: the engine's master, local[*] by default), with
its checkpoint under the engine's data directory, DIR/sources/NAME.TOKEN/checkpoint (a
TOKEN per incarnation of the stream: one created again under the name starts afresh).
Each micro-batch reaches the engine through foreachBatch as one insert keyed by
(producer "spark:NAME.TOKEN", seq = the batch id): the engine's idempotent-producer
table (psoup.producers) makes a batch Spark runs again after a failure (its id is in
Spark's offset log but not its commit log) return the tupleIDs and ts it got the first
time instead of being applied twice, and the insert is forced to disk before Spark
commits the batch. So each source row is applied exactly once across failures of the
query and restarts of psoup.

By default (WITH (probe = 'engine')) the micro-batch passes through the psoup process
(collected with toArrow) and is probed there, by the ordinary insert path. With
WITH (probe = 'executors') it never does: each task probes its partition with the
stream's query set and writes its rows and Results Structure words to the stream's
batch store, which psoup commits by batch id (psoup.spark.executors,
psoup.archive.batches); a second thread per such source runs the history pass of the
queries registered after batches were probed (`_cover`).

A supervisor thread per source starts the query, restarts it from its checkpoint after
a failure (1, 2, 4 ... 60 s apart), and keeps its progress for `stats()` and SHOW
STREAMS. Nothing here runs on the per-tuple path of ordinary streams.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
from numpy.typing import NDArray

from psoup.errors import PSoupError, QueryError, SequenceError
from psoup.query.checker import TRIGGER_OPTION
from psoup.query.model import (
    PROBE_OPTION,
    TS,
    TUPLE_ID,
    ColumnType,
    Query,
    SourceFormat,
    SourceKind,
    StreamSchema,
)

if TYPE_CHECKING:
    from psoup.archive.batches import BatchStore

log = logging.getLogger("psoup.sources")

#: The Spark SQL type each column type is read as.
SPARK_TYPES = {ColumnType.INT: "BIGINT", ColumnType.FLOAT: "DOUBLE",
               ColumnType.TEXT: "STRING", ColumnType.BOOL: "BOOLEAN"}

#: The trigger interval of a source whose WITH gives none (TRIGGER_OPTION).
DEFAULT_TRIGGER = "1 second"

#: Reader options psoup sets unless WITH gives them.
_DEFAULT_OPTIONS = {SourceFormat.CSV: {"header": "true"}}

_FOLDER = "sources"
_DROPPED = "DROPPED"            # a marker: the folder's stream was dropped
_MAX_DELAY = 60.0
_COVER_PERIOD = 5.0             # the history pass looks at least this often (seconds)


class Target(Protocol):
    """What a source needs of its engine (psoup.engine.Engine has each)."""

    path: Path | None

    def insert(self, stream: str, rows: Any, ts: Any = None, *, producer: str | None = None,
               seq: int | None = None) -> NDArray[np.int64]: ...

    def locked(self, wait: bool | float = True) -> contextlib.AbstractContextManager[bool]: ...

    def commit(self) -> None: ...

    def last_seq(self, producer: str) -> int: ...

    def latest_ts(self, name: str) -> float | None: ...

    def probe_set(self, name: str) -> tuple[str, dict[str, Query]]: ...


@dataclass
class SourceRun:
    """One source's query and what it has done (fields written by its threads, read
    by stats(); each is one assignment, so a reader sees one value or the next)."""

    schema: StreamSchema
    folder: Path
    producer: str
    stopping: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    query: Any = None
    state: str = "starting"
    batches: int = 0                # micro-batches applied (duplicates not counted)
    replayed: int = 0               # micro-batches Spark ran again, answered as duplicates
    rows: int = 0
    late_rows: int = 0              # rows whose ts was raised to the stream's latest
    rejected_rows: int = 0          # rows with a missing or unreadable value
    last_batch_id: int | None = None
    last_commit: float | None = None   # time.time() of the last applied batch
    restarts: int = 0
    last_error: str | None = None
    fatal: bool = False             # an error a restart cannot mend (a gap in batch ids)
    progress: dict[str, Any] = field(default_factory=dict)   # Spark's lastProgress
    store: BatchStore | None = None     # WITH (probe = 'executors'): the batch store
    wake: threading.Event = field(default_factory=threading.Event)  # the history pass's
    covered: int = 0                    # batches the history pass probed again
    registrations: int = 0              # queries registered on it (under the engine lock)

    @property
    def name(self) -> str:
        return self.schema.name

    def stats(self) -> dict[str, Any]:
        source = self.schema.source
        assert source is not None
        lag = None if self.last_commit is None else max(0.0, time.time() - self.last_commit)
        return {"source": source.describe(), "state": self.state, "batches": self.batches,
                "replayed_batches": self.replayed, "rows": self.rows,
                "last_batch_id": self.last_batch_id,
                "input_rows_per_s": self.progress.get("inputRowsPerSecond"),
                "processed_rows_per_s": self.progress.get("processedRowsPerSecond"),
                "batch_seconds": _batch_seconds(self.progress),
                "lag_seconds": lag, "late_rows": self.late_rows,
                "rejected_rows": self.rejected_rows, "restarts": self.restarts,
                "last_error": self.last_error,
                "checkpoint": str(self.folder / "checkpoint"),
                "probe": "engine" if self.store is None else "executors",
                **({} if self.store is None else {
                    "retained_rows": self.store.rows,
                    "retained_batches": len(self.store.batches()),
                    "history_batches": self.covered})}


class LiveSources:
    """The engine's Spark sources (docs/language.md, "Sources").

    Args:
        target: the engine the batches are inserted into.
        master, conf: the Spark master and settings (the engine's spark_master and
            spark_conf).
        clock: the engine's clock: a micro-batch's commit time, the ts of its rows
            that give none.
    """

    #: For tests: batch ids after whose insert the callback fails once (as a crash
    #: between psoup applying a batch and Spark committing it would).
    fail_after_insert: set[int] = set()

    def __init__(self, target: Target, master: str | None, conf: Mapping[str, str],
                 clock: Callable[[], float]):
        self.target, self.master, self.conf, self.clock = target, master, dict(conf), clock
        self._runs: dict[str, SourceRun] = {}

    # ------------------------------------------------------------------ the engine's calls

    def check(self, schema: StreamSchema) -> None:
        """Refuse a CREATE STREAM ... FROM this engine cannot run (before it is logged).

        Raises:
            QueryError: the engine keeps no data directory, the folder is missing, or
                pyspark is not installed.
        """
        source = schema.source
        if source is None:
            return
        if self.target.path is None:
            raise QueryError(f"CREATE STREAM ... FROM {source.kind.upper()} needs a durable "
                             "engine (Engine(path=DIR), or psoup serve --data-dir DIR): "
                             "the source's Spark checkpoint is kept there")
        if source.in_executors and schema.retain_rows is not None:
            raise QueryError("a stream probed in Spark's executors (probe = 'executors') "
                             "keeps whole micro-batches: give RETAIN as a time (RETAIN 30 "
                             "DAYS), not as rows")
        if source.kind == SourceKind.FILES:
            assert source.path is not None
            if not Path(source.path).is_dir():
                raise QueryError(f"FROM FILES: folder '{source.path}' does not exist (or is "
                                 "not a folder); create it first")
        try:
            import pyspark  # noqa: F401
        except ImportError:
            raise QueryError("a stream FROM a Spark source needs Spark: pip install "
                             "'psoup[spark]' (pyspark, with Java 17 or newer)") from None

    def store(self, name: str) -> BatchStore | None:
        """The batch store of stream `name` when it is probed in the executors."""
        run = self._runs.get(name)
        return None if run is None else run.store

    def stored(self, name: str) -> tuple[int, int, float | None] | None:
        """DESCRIBE's (rows retained, rows ever, latest ts) of stream `name` when it is
        probed in the executors (its batch store's); None for the others."""
        store = self.store(name)
        return None if store is None else (store.rows, store.next_tid, store.latest_ts)

    def admit(self, query: Query) -> None:
        """Refuse, before it is logged, a query a stream probed in the executors cannot
        answer: a join over it, TABLESAMPLE, a WHERE on tupleID, or a window that
        counts rows.

        Raises:
            QueryError: naming the stream and why.
        """
        from psoup.results.windows_table import archive_reach

        live = [s.stream for s in query.sources if self.store(s.stream) is not None]
        if not live:
            return
        why = (f"stream '{live[0]}' is probed in Spark's executors "
               "(WITH (probe = 'executors')), so the psoup process holds none of its rows")
        if len(query.sources) > 1:
            raise QueryError(f"{why}: a join over it is not supported (a join pairs rows "
                             "of both sides as they arrive); create the stream with "
                             "probe = 'engine' to join it")
        source = query.sources[0]
        if source.sample is not None:
            raise QueryError(f"{why}: TABLESAMPLE is not supported (it samples the "
                             "archive of a stream whose window is in memory; every "
                             "committed batch of this one is read whole)")
        if any(p.column == TUPLE_ID for p in source.predicates) or any(
                TUPLE_ID in (f.left, f.right) for f in source.column_factors):
            raise QueryError(f"{why}: a WHERE on tupleID is not supported (tupleIDs are "
                             "given when a micro-batch commits, after its probe); "
                             "select tupleID, or filter on ts")
        if archive_reach(source.window, 0.0) is None:
            raise QueryError(f"{why}: a window that counts rows ([ROWS n], PARTITION BY) "
                             "is not supported; use a time window ([RANGE 10 MINUTES], "
                             "BEGIN ... END)")

    def check_insert(self, name: str) -> None:
        """Refuse an INSERT into a stream probed in the executors (fed by its source
        alone: its tupleIDs are assigned by batch).

        Raises:
            QueryError: it is one.
        """
        if self.store(name) is not None:
            raise QueryError(f"stream '{name}' is fed by its source and probed in "
                             "Spark's executors (WITH (probe = 'executors')): it takes "
                             "no INSERT")

    def registered(self, query: Query) -> None:
        """A query was registered: wake the history pass of the streams it reads that
        are probed in the executors (their committed batches lack it)."""
        for source in query.sources:
            run = self._runs.get(source.stream)
            if run is not None and run.store is not None:
                run.registrations += 1
                run.wake.set()

    def resume(self, schemas: Mapping[str, StreamSchema]) -> None:
        """At the engine's start: start the sources of `schemas`, each on its existing
        checkpoint, and remove the folders of dropped streams."""
        if self.target.path is None:
            return
        root = self.target.path / _FOLDER
        found: dict[str, Path] = {}
        for folder in sorted(root.iterdir()) if root.is_dir() else ():
            name = folder.name.rpartition(".")[0]
            schema = schemas.get(name)
            if schema is None or schema.source is None or (folder / _DROPPED).exists() \
                    or name in found:
                shutil.rmtree(folder, ignore_errors=True)
            else:
                found[name] = folder
        for name, schema in schemas.items():
            if schema.source is not None:
                self._start(schema, found.get(name))

    def start(self, schema: StreamSchema) -> None:
        """A stream created FROM a source: start its query (on a new checkpoint)."""
        if schema.source is not None and self.target.path is not None:
            self._start(schema, None)

    def drop(self, name: str) -> None:
        """Stream `name` was dropped (under the engine's lock): stop its query without
        waiting (its last batch may wait for the lock) and remove its folder after."""
        run = self._runs.pop(name, None)
        if run is None:
            return
        run.stopping.set()              # a batch waiting for the lock applies nothing
        with contextlib.suppress(OSError):  # marked now: never taken for a stream's again
            run.folder.mkdir(parents=True, exist_ok=True)
            (run.folder / _DROPPED).touch()
        threading.Thread(target=self._stop, args=(run, True), daemon=True,
                         name=f"psoup-source-stop-{name}").start()

    def close(self, wait: bool) -> None:
        """The engine closes: stop every query (waiting for each, unless the caller
        holds the engine's lock, which a batch being applied may wait for)."""
        runs, self._runs = list(self._runs.values()), {}
        for run in runs:
            run.stopping.set()
            if wait:
                self._stop(run, False)
            else:
                threading.Thread(target=self._stop, args=(run, False), daemon=True).start()

    def stats(self) -> dict[str, dict[str, Any]]:
        """stats()["sources"]: per stream, its source's state and progress."""
        return {name: run.stats() for name, run in self._runs.items()}

    def state(self, name: str) -> tuple[str | None, int | None]:
        """(state, batches) of stream `name`'s source for SHOW STREAMS; (None, None)
        for a stream without one. A state with an error carries it: "restarting: ..."."""
        run = self._runs.get(name)
        if run is None:
            return None, None
        error = f": {run.last_error}" if run.last_error and run.state != "running" else ""
        return run.state + error, run.batches

    # ------------------------------------------------------------------ supervision

    def _start(self, schema: StreamSchema, folder: Path | None) -> None:
        assert self.target.path is not None
        if folder is None:      # made by the query's thread: a CREATE logged stands
            folder = self.target.path / _FOLDER / f"{schema.name}.{secrets.token_hex(6)}"
        run = SourceRun(schema, folder, f"spark:{folder.name}")
        assert schema.source is not None
        if schema.source.in_executors:
            from psoup.archive.batches import BatchStore
            run.store = BatchStore(folder / "batches", dict(schema.columns),
                                   schema.retain_seconds)
            threading.Thread(target=self._cover, args=(run,), daemon=True,
                             name=f"psoup-history-{schema.name}").start()
        self._runs[schema.name] = run
        run.thread = threading.Thread(target=self._supervise, args=(run,), daemon=True,
                                      name=f"psoup-source-{schema.name}")
        run.thread.start()

    def _stop(self, run: SourceRun, remove: bool) -> None:
        run.stopping.set()
        run.wake.set()
        query = run.query
        if query is not None:
            with contextlib.suppress(Exception):    # stopped or failed already
                query.stop()
        if run.thread is not None and run.thread is not threading.current_thread():
            run.thread.join(120.0)
        run.state = "stopped"
        if remove:
            shutil.rmtree(run.folder, ignore_errors=True)

    def _supervise(self, run: SourceRun) -> None:
        """Run the query until stopped; after a failure start it again from its
        checkpoint, 1, 2, 4 ... 60 s later (never after a fatal error)."""
        failures = 0
        while not run.stopping.is_set():
            began = time.monotonic()
            try:
                self._run_once(run)
            except Exception as exc:
                from psoup.spark.session import spark_error
                run.last_error = spark_error(exc)
                log.warning("source of stream '%s' failed: %s", run.name, run.last_error)
            if run.stopping.is_set():
                break
            if run.fatal:
                run.state = "failed"
                return
            failures = 1 if time.monotonic() - began > _MAX_DELAY else failures + 1
            run.state = "restarting"
            run.restarts += 1
            run.stopping.wait(min(_MAX_DELAY, 2.0 ** (failures - 1)))
        run.state = "stopped"

    def _run_once(self, run: SourceRun) -> None:
        """Start the query and watch it until it ends (raising its failure)."""
        from psoup.spark.session import spark_session
        if run.stopping.is_set():
            return
        run.folder.mkdir(parents=True, exist_ok=True)
        session = spark_session(self.master, self.conf)
        if run.stopping.is_set():
            return
        run.query = query = _writer(session, run, partial_batch(self, run)).start()
        run.state = "running"
        try:
            while not run.stopping.is_set():
                if query.awaitTermination(1.0):
                    break
                progress = query.lastProgress
                if progress:
                    run.progress = dict(progress)
        finally:
            if run.stopping.is_set():
                with contextlib.suppress(Exception):
                    query.stop()
        query.awaitTermination(0.1)     # raises the query's failure, if it failed

    def _cover(self, run: SourceRun) -> None:
        """The history pass of a stream probed in the executors, until it stops: when
        woken (a registration, a batch committed without a query registered while it
        was probed) or every few seconds, probe the committed batches that lack a
        registered query with it (psoup.spark.executors.cover); after a failure, again
        1, 2, 4 ... 60 s later."""
        from psoup.spark.executors import cover, spark_runner, summed_of
        from psoup.spark.session import spark_error, spark_session

        store = run.store
        assert store is not None
        failures = 0
        while not run.stopping.is_set():
            run.wake.wait(_COVER_PERIOD if not failures else
                          min(_MAX_DELAY, 2.0 ** (failures - 1)))
            run.wake.clear()
            if run.stopping.is_set():
                break
            try:
                with self.target.locked():
                    if run.stopping.is_set():
                        break
                    ddl, queries = self.target.probe_set(run.name)
                lacking = store.lacking(queries)
                if lacking:
                    spark = spark_session(self.master, self.conf)
                    run.covered += cover(spark_runner(spark), store, ddl,
                                         {h: q.sql for h, q in queries.items()}, lacking,
                                         summed_of(run.schema, queries))
                failures = 0
            except Exception as exc:
                failures += 1
                run.last_error = f"history pass: {spark_error(exc)}"
                log.warning("history pass of stream '%s' failed: %s", run.name,
                            run.last_error)

    # ------------------------------------------------------------------ one micro-batch

    def apply(self, run: SourceRun, frame: Any, batch_id: int) -> None:
        """foreachBatch: insert micro-batch `batch_id` as (run.producer, batch_id).

        A batch that meets its source stopping fails rather than return: returning
        would let Spark commit a batch the engine never applied (after a close, the
        engine opened again would never see it)."""
        _check_going(run, batch_id)
        if run.store is not None:
            self._apply_in_executors(run, run.store, frame, batch_id)
            return
        columns, ts, rejected = _collect(frame, run.schema)
        target = self.target
        with target.locked():
            _check_going(run, batch_id)     # dropped or closed while this waited
            replayed = target.last_seq(run.producer) >= batch_id
            columns, ts = _in_order(columns, np.where(np.isnan(ts), self.clock(), ts))
            late = 0 if replayed else _raise_late(ts, target, run.name)
            try:
                target.insert(run.name, columns, ts, producer=run.producer, seq=batch_id)
            except SequenceError as exc:
                run.fatal = True
                raise PSoupError(f"source of stream '{run.name}': {exc} (psoup's log lost "
                                 "batches Spark committed: its data directory was restored "
                                 "or written with sync='off'?)") from exc
            target.commit()             # on disk before Spark commits the batch
        if replayed:
            run.replayed += 1
        else:
            run.batches += 1
            run.rows += len(ts)
            run.late_rows += late
            run.rejected_rows += rejected
        run.last_batch_id = batch_id
        run.last_commit = time.time()
        if batch_id in LiveSources.fail_after_insert:
            LiveSources.fail_after_insert.discard(batch_id)
            raise RuntimeError(f"test fault after batch {batch_id} was inserted")


    def _apply_in_executors(self, run: SourceRun, store: BatchStore, frame: Any,
                            batch_id: int) -> None:
        """foreachBatch of a stream probed in the executors: probe the batch there with
        the query set registered now (taken under the engine's lock, so that each
        registration falls before or after it) and commit it to the batch store by
        its id; a batch committed already (Spark runs it again) is skipped."""
        from psoup.spark.executors import probe_batch, summed_of

        if store.committed(batch_id):
            run.replayed += 1
            run.last_batch_id = batch_id
            return
        with self.target.locked():
            _check_going(run, batch_id)
            ddl, queries = self.target.probe_set(run.name)
            registrations = run.registrations
        latest = store.latest_ts
        staging, reports, slots = probe_batch(
            frame, store, ddl, {h: q.sql for h, q in queries.items()},
            -np.inf if latest is None else latest, self.clock(),
            summed_of(run.schema, queries))
        _check_going(run, batch_id)
        batch = store.commit(batch_id, staging, reports, slots, committed_at=time.time())
        run.batches += 1
        run.rows += batch.rows
        run.late_rows += batch.late
        run.rejected_rows += batch.rejected
        run.last_batch_id = batch_id
        run.last_commit = time.time()
        retain = run.schema.retain_seconds
        if retain is not None and (latest := store.latest_ts) is not None:
            store.expire(latest - retain)
        if run.registrations != registrations:
            run.wake.set()          # registered while the batch was probed
        if batch_id in LiveSources.fail_after_insert:
            LiveSources.fail_after_insert.discard(batch_id)
            raise RuntimeError(f"test fault after batch {batch_id} was committed")


class SourceStopped(PSoupError):
    """A micro-batch arrived as its source was being stopped: it is not applied, and
    not committed by Spark either (the next start runs it again)."""


def _check_going(run: SourceRun, batch_id: int) -> None:
    if run.stopping.is_set():
        raise SourceStopped(f"source of stream '{run.name}' stopped before batch "
                            f"{batch_id} was applied")


def partial_batch(sources: LiveSources, run: SourceRun) -> Callable[[Any, int], None]:
    """The foreachBatch function of `run` (a closure: Spark calls it with the batch's
    DataFrame and id, in this process)."""
    def each(frame: Any, batch_id: int) -> None:
        sources.apply(run, frame, int(batch_id))
    return each


def _batch_seconds(progress: Mapping[str, Any]) -> float | None:
    took = (progress.get("durationMs") or {}).get("triggerExecution")
    return None if took is None else float(took) / 1000.0


def _raise_late(ts: NDArray[np.float64], target: Target, stream: str) -> int:
    """Raise the ts below the stream's latest to it (timestamps may not decrease);
    how many were raised."""
    latest = _latest_ts(target, stream)
    late = int(np.count_nonzero(ts < latest))
    if late:
        np.maximum(ts, latest, out=ts)
    return late


def _latest_ts(target: Target, stream: str) -> float:
    latest = target.latest_ts(stream)
    return -np.inf if latest is None else latest


# ---------------------------------------------------------------------- Spark's side

def reader_schema(schema: StreamSchema) -> str:
    """The DDL schema a FILES or KAFKA source is read with: the declared columns, then
    ts as a string (a number of seconds or ISO-8601; a DOUBLE in Parquet files).

    Example:
        >>> from psoup.query.model import SourceKind, StreamSource
        >>> reader_schema(StreamSchema("t", [("lane", "int"), ("speed", "float")],
        ...               source=StreamSource(SourceKind.FILES, "/x", SourceFormat.CSV)))
        '`lane` BIGINT, `speed` DOUBLE, `ts` STRING'
    """
    source = schema.source
    ts_type = "DOUBLE" if source is not None and source.format == SourceFormat.PARQUET \
        else "STRING"
    cols = [f"`{c}` {SPARK_TYPES[t]}" for c, t in schema.columns]
    return ", ".join([*cols, f"`{TS}` {ts_type}"])


def _options(schema: StreamSchema) -> dict[str, str]:
    source = schema.source
    assert source is not None
    options = dict(_DEFAULT_OPTIONS.get(source.format, {})) if source.format else {}
    options.update((k, v) for k, v in source.options
                   if k.lower() not in (TRIGGER_OPTION, PROBE_OPTION))
    return options


def _trigger(schema: StreamSchema) -> str:
    assert schema.source is not None
    return next((v for k, v in schema.source.options if k.lower() == TRIGGER_OPTION),
                DEFAULT_TRIGGER)


def stream_frame(session: Any, schema: StreamSchema) -> Any:
    """The streaming DataFrame of a stream's source: its declared columns (typed) and a
    ts column, a DOUBLE of seconds or null (then the batch's commit time)."""
    from pyspark.sql import functions as F

    source = schema.source
    assert source is not None
    reader = session.readStream.options(**_options(schema))
    if source.kind == SourceKind.RATE:
        frame = reader.format("rate").load()
        cols = [F.col("value").cast(SPARK_TYPES[t]).alias(c) for c, t in schema.columns]
        return frame.select(*cols, F.col("timestamp").cast("double").alias(TS))
    if source.kind == SourceKind.KAFKA:
        frame = reader.format("kafka").load()
        value = F.from_json(F.col("value").cast("string"), reader_schema(schema))
        frame = frame.select(value.alias("v"), F.col("timestamp").alias("_kafka_ts"))
        ts = F.coalesce(_seconds(F.col("v.ts")), F.col("_kafka_ts").cast("double"))
        return frame.select(*[F.col(f"v.`{c}`").alias(c) for c in schema.names],
                            ts.alias(TS))
    assert source.path is not None and source.format is not None
    frame = reader.schema(reader_schema(schema)).format(source.format.value).load(source.path)
    return frame.select(*[F.col(f"`{c}`") for c in schema.names],
                        _seconds(F.col(TS)).alias(TS))


def _seconds(column: Any) -> Any:
    """A ts column as seconds: a number as it is, an ISO-8601 text through Spark's
    timestamp (UTC when it names no zone); null when neither."""
    from pyspark.sql import functions as F
    return F.coalesce(column.try_cast("double"),
                      column.try_cast("timestamp").cast("double"))


def _writer(session: Any, run: SourceRun, each: Callable[[Any, int], None]) -> Any:
    frame = stream_frame(session, run.schema)
    return (frame.writeStream.foreachBatch(each)
            .option("checkpointLocation", str(run.folder / "checkpoint"))
            .trigger(processingTime=_trigger(run.schema))
            .queryName(f"psoup_{run.producer.replace(':', '_').replace('.', '_')}"))


def _collect(frame: Any, schema: StreamSchema
             ) -> tuple[dict[str, NDArray[Any]], NDArray[np.float64], int]:
    """A micro-batch's rows in the psoup process: (columns, ts, rows left out for a
    missing value); ts NaN where the source gave none."""
    import pyarrow as pa

    from psoup.spark.executors import valid_rows

    table, rejected = valid_rows(cast(pa.Table, frame.toArrow()), schema)
    ts = table.column(TS).to_numpy(zero_copy_only=False).astype(np.float64)
    columns = {c: np.asarray(table.column(c).to_numpy(zero_copy_only=False))
               for c in schema.names}
    return columns, ts, rejected


def _in_order(columns: dict[str, NDArray[Any]], ts: NDArray[np.float64]
              ) -> tuple[dict[str, NDArray[Any]], NDArray[np.float64]]:
    """The rows sorted by ts (stable: ties keep the source's order)."""
    order = np.argsort(ts, kind="stable")
    return {c: v[order] for c, v in columns.items()}, np.ascontiguousarray(ts[order])
