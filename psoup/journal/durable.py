"""Durability as a service of the engine: its log before each change, the change applied
all or nothing, checkpoints, and recovery by replaying the log into a `Core`.

The rules this module keeps (docs/durability.md):

* a change is logged before it is applied, and applied before the call returns;
* a logged change that fails to apply stops the engine (`ApplyFailed` on every later
  call) rather than let it answer from a state that is neither before nor after: the
  change is durable, and a new engine on the same path applies it whole;
* an automatic checkpoint that fails never fails the write before it (that write is
  applied and logged; a caller retrying it would duplicate it); it runs beside the
  writer: its cut under the engine's lock, its files on a thread of its own, its end
  under the lock again (psoup.journal.checkpoint);
* recovery reads the newest checkpoint back and redoes each record after it through
  the same effects as the live calls.

An engine in memory has a `Durability` too, with no journal: its log calls do nothing,
and a failed apply stops it all the same.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from numpy.typing import NDArray

from psoup.errors import ApplyFailed, disk_full, is_disk_full
from psoup.journal import checkpoint as checkpoints
from psoup.journal.journal import (
    Journal,
    Record,
    RecordKind,
    create_record,
    drop_record,
    insert_record,
    register_record,
    unregister_record,
)
from psoup.options import SyncName
from psoup.plans import SelectionPlan
from psoup.producers import ProducerTable
from psoup.query import compile_statement
from psoup.query.model import TS, Query, StreamSchema
from psoup.stems.batch import make_batch

if TYPE_CHECKING:
    from psoup.core import Core

log = logging.getLogger("psoup.engine")


class Effects(Protocol):
    """The engine's changes that reach past its `Core` (cursors, history jobs, the
    archive): recovery applies a record through these, as a live call does."""

    def create(self, schema: StreamSchema, sql: str) -> None: ...

    def unregistered(self, handle: str) -> None: ...

    def dropped(self, name: str, handles: Sequence[str], bound: int) -> None: ...

    def history_due(self, handles: Sequence[str]) -> None: ...


class Durability:
    """The log of one engine, or none (`path` None: in memory).

    Args:
        path: the engine's directory; None keeps nothing.
        sync, checkpoint_bytes, checkpoint_seconds: as `psoup.engine.Engine` takes them.

    Attributes:
        journal: the log and archive (None in memory).
        failure: why the engine stopped (None while it runs).
        checkpoint_error: what made the last automatic checkpoint fail (None: it did not).

    Costs: each log call O(record); a checkpoint's cut O(chunks + queries) under the
    lock, its files O(state) off it; `recover` O(checkpoint files + log after them).
    """

    def __init__(self, path: str | os.PathLike[str] | None, sync: SyncName,
                 checkpoint_bytes: int,
                 checkpoint_seconds: float | None):
        self.path = None if path is None else Path(path)
        self.journal = (None if path is None else
                        Journal(path, sync, checkpoint_bytes, checkpoint_seconds))
        self.failure: str | None = None
        self.checkpoint_error: str | None = None
        self._failures = 0          # automatic checkpoints failed in a row
        self._retry_at = 0.0        # none is tried before (monotonic)
        #: what reading the checkpoint back took at recovery (None: no checkpoint)
        self.restored: checkpoints.Restore | None = None
        self._cut: checkpoints.Cut | None = None     # the checkpoint being written
        self._thread: threading.Thread | None = None  # the background one's
        self._stopped = False                          # closing: no new background one
        #: in memory, what each change's record is given to (psoup.server.replica); a
        #: journal gives its records itself, once logged (`set_feed`)
        self._feed: Callable[[dict[str, Any]], None] | None = None

    def attach(self, core: Core) -> None:
        """Give `core` what it keeps on disk: where tiers are saved, the archive's
        aggregate copies."""
        if self.journal is not None:
            core.tiers.folder = self.journal.tiers_path
            core.answers.rollups = self.journal.archive.rollups

    def expiry(self, schema: StreamSchema) -> Callable[..., None] | None:
        """What a stream's Data SteM calls with the tuples that leave memory: the
        archive's writer (None in memory: they are forgotten)."""
        if self.journal is None:
            return None
        return partial(self.journal.expired, schema.name, schema.columns)

    # ------------------------------------------------------------------ the log

    def set_feed(self, feed: Callable[[dict[str, Any]], None] | None) -> None:
        """Give every change's record to `feed` from now on, in the order of the log,
        once it is logged (None: stop). Under the engine's lock. For read replicas
        (psoup.server.replica), which apply them as recovery does."""
        if self.journal is not None:
            self.journal.feed = feed
        else:
            self._feed = feed

    def log_create(self, sql: str) -> None:
        if self.journal is not None:
            self.journal.create(sql)
        elif self._feed is not None:
            self._feed(create_record(sql))

    def log_insert(self, stream: str, first: int, ts: NDArray[np.float64],
                   columns: dict[str, NDArray[Any]], producer: str | None,
                   seq: int | None) -> None:
        if self.journal is not None:
            self.journal.insert(stream, first, ts, columns, producer, seq)
        elif self._feed is not None:
            self._feed(insert_record(stream, first, ts, columns, producer, seq))

    def log_register(self, handle: str, sql: str) -> None:
        if self.journal is not None:
            self.journal.register(handle, sql)
        elif self._feed is not None:
            self._feed(register_record(handle, sql))

    def log_unregister(self, handle: str) -> None:
        if self.journal is not None:
            self.journal.unregister(handle)
        elif self._feed is not None:
            self._feed(unregister_record(handle))

    def log_drop(self, stream: str, handles: Sequence[str], bound: int) -> None:
        if self.journal is not None:
            self.journal.drop(stream, handles, bound)
        elif self._feed is not None:
            self._feed(drop_record(stream, handles, bound))

    def drop_archive(self, stream: str, bound: int) -> None:
        """Remove a dropped stream's archived tuples (those numbered below `bound`)."""
        if self.journal is not None:
            self.journal.archive.drop(stream, bound)

    # ------------------------------------------------------------------ applying

    def apply(self, what: str, change: Callable[[], None]) -> None:
        """Apply a change that is already in the log (or, in memory, checked). Nothing
        checkable fails here; if something does all the same, part of the change may be
        in memory, so the engine stops (ApplyFailed now and on every later call).

        Raises:
            ApplyFailed: the change failed part way.
        """
        try:
            change()
        except Exception as exc:
            cause = f"{type(exc).__name__}: {exc}"
            if self.journal is not None:
                self.failure = (f"applying {what} failed after it was logged ({cause}); "
                                "it is durable and is applied when the engine is "
                                "reopened on its path: do not send it again")
            else:
                self.failure = (f"applying {what} failed part way ({cause}); the "
                                "engine's state is unknown and it keeps no log: start "
                                "a new Engine")
            log.error("engine stopped: %s", self.failure)
            raise ApplyFailed(self.failure) from exc

    def check_running(self) -> None:
        """Raises ApplyFailed if a change failed part way."""
        if self.failure is not None:
            raise ApplyFailed(f"this engine stopped: {self.failure}")

    def after_write(self, take: Callable[[], checkpoints.Cut | None],
                    lock: AbstractContextManager[Any]) -> None:
        """The automatic checkpoint after a write, when due and none runs: `take` makes
        its cut now (under the engine's lock, which the caller holds), and a thread
        writes its files and then ends it under `lock`. The write is applied and in the
        log by now, so it stands whatever happens here: a failed checkpoint (a full
        disk, say) is logged and shown in stats()["durability"], never raised as if the
        write had failed; a later write tries again, and after failures in a row the
        first write 1, 2, 4 ... (at most 60) seconds later."""
        journal = self.journal
        if journal is None or self._cut is not None or self._stopped \
                or not journal.checkpoint_due or time.monotonic() < self._retry_at:
            return
        try:
            cut = take()
        except Exception as exc:    # the write stands, whatever the cause
            self._failed(exc)
            return
        if cut is None:
            return
        self._thread = threading.Thread(target=self._background, args=(cut, lock),
                                        name="psoup-checkpoint", daemon=True)
        self._thread.start()

    def _background(self, cut: checkpoints.Cut, lock: AbstractContextManager[Any]) -> None:
        assert self.journal is not None
        error: Exception | None = None
        try:
            self.journal.checkpoint(cut)
        except Exception as exc:    # reported, as the write that started it stands
            error = exc
        with lock:
            try:
                self._end(cut)
            except Exception as exc:
                error = error or exc
            if error is None:
                self.checkpoint_error, self._failures, self._retry_at = None, 0, 0.0
            else:
                self._failed(error)

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, OSError) and is_disk_full(exc):   # name where, at least
            assert self.journal is not None
            exc = disk_full(exc, exc.filename or self.journal.path,
                            "the checkpoint was not made")
        self.checkpoint_error = f"{type(exc).__name__}: {exc}"
        log.warning("automatic checkpoint failed (the write before it is applied and "
                    "logged): %s", self.checkpoint_error)
        # each attempt writes up to the whole state before it fails: on a disk that
        # stays full, try again at growing intervals, not on every write
        self._failures += 1
        delay = 0.0 if self._failures == 1 else min(60.0, 2.0 ** (self._failures - 2))
        self._retry_at = time.monotonic() + delay

    def _end(self, cut: checkpoints.Cut) -> None:
        self._cut = None
        assert self.journal is not None
        self.journal.finish(cut)

    @property
    def checkpointing(self) -> bool:
        """Whether a checkpoint is being written (under the engine's lock)."""
        return self._cut is not None

    def wait_checkpoint(self) -> None:
        """Wait for the background checkpoint, if one runs. Without the engine's lock
        (its end takes it)."""
        thread = self._thread
        if thread is not None:
            thread.join()

    def stop(self) -> None:
        """Start no more background checkpoints (the engine closes)."""
        self._stopped = True

    def cut(self, core: Core, producers: ProducerTable,
            pending: Callable[[str], bool]) -> checkpoints.Cut | None:
        """Take a checkpoint's cut (under the engine's lock, none running): the tiers that
        are visible are saved, and the handles whose history is `pending` are evaluated
        again after a restart. None in memory. O(chunks + queries)."""
        journal = self.journal
        if journal is None:
            return None
        assert self._cut is None, "one checkpoint at a time"
        for name, stem in core.stems.items():     # left retention, still held: archived
            held = stem.rows(0, stem.horizon, expired=True)
            if len(held[TS]):
                journal.archive.add(name, stem.schema.columns, held)
        saved = core.tiers.save(journal.tiers_path,
                                {plan.id: h for h, plan in core.handles.items()
                                 if plan.id in core.tiers})
        history = [h for h in core.handles if pending(h)]
        self._cut = journal.cut(core, producers.image(), history, saved)
        return self._cut

    def snapshot_cut(self, core: Core, producers: ProducerTable,
                     primary: list[str]) -> checkpoints.Cut:
        """A read replica's snapshot: a cut of `core` (under the engine's lock, no
        checkpoint running) as a checkpoint takes it, naming `primary` (the handles the
        replica leaves to this engine) as its history; automatic checkpoints wait until
        `snapshot_end`. In memory too. O(chunks + queries)."""
        assert self._cut is None, "one cut at a time"
        self._cut = checkpoints.take(core, 1, 0, 0, producers.image(), primary, {})
        return self._cut

    @staticmethod
    def snapshot_write(cut: checkpoints.Cut, folder: Path) -> dict[str, Any]:
        """The snapshot's files, off the engine's lock. O(state)."""
        return checkpoints.write(cut, folder, None)

    def snapshot_end(self, cut: checkpoints.Cut) -> None:
        """Under the engine's lock, once the snapshot's files are written (or failed)."""
        checkpoints.release(cut)
        self._cut = None

    def checkpoint(self, cut: checkpoints.Cut, lock: AbstractContextManager[Any]) -> None:
        """Write the files of `cut` (taken by `Durability.cut`) in the calling thread, off
        `lock`, and end it under `lock`: Engine.checkpoint, which returns once it is valid.

        Raises:
            OSError: a file could not be written (the previous checkpoint stays valid).
        """
        assert self.journal is not None
        try:
            self.journal.checkpoint(cut)
        finally:
            with lock:
                self._end(cut)
        self.checkpoint_error = None

    def commit(self) -> None:
        """Force the log to disk (what sync="group" defers)."""
        if self.journal is not None:
            self.journal.commit()

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()

    def stats(self) -> dict[str, Any] | None:
        """stats()["durability"] (None in memory)."""
        journal = self.journal
        if journal is None:
            return None
        out: dict[str, Any] = {"path": str(self.path), "sync": journal.wal.sync.value,
                               "log_bytes": journal.wal.size,
                               "checkpoint_error": self.checkpoint_error,
                               "archive_error": journal.archive.error,
                               "archive_buffered_rows": journal.archive.buffered_rows}
        if journal.archive.rollups is not None:
            out["aggregates"] = journal.archive.rollups.stats()
        return out

    # ------------------------------------------------------------------ recovery

    def recover(self, core: Core, producers: ProducerTable, effects: Effects,
                progress: Callable[[int, int], None] | None) -> None:
        """Read the newest checkpoint back into `core` (psoup.journal.checkpoint.restore)
        and replay the log after it (O(checkpoint files + that log)), calling
        `progress(bytes replayed, log bytes)` about every half second and at the end."""
        journal = self.journal
        if journal is None:
            return
        replay = _Replay(core, producers, effects, journal.tiers_path)
        manifest = journal.load()
        if manifest is not None:
            self.restored = checkpoints.restore(core, manifest, journal.checkpoint_path,
                                                effects.create)
            producers.restore(manifest["producers"])
            if manifest["tiers"]:
                replay.apply(Record(RecordKind.TIERS, tiers={
                    str(h): [str(f) for f in files] for h, files in manifest["tiers"].items()}))
            if manifest["history"]:
                effects.history_due([str(h) for h in manifest["history"]])
            done = self.restored
            log.info("checkpoint %s read back in %.2f s: %.0f MB of files in %.2f s, %d "
                     "queries in %.2f s, structures rebuilt in %.2f s", manifest["number"],
                     done.total, done.bytes / 1e6, done.read, done.handles, done.queries,
                     done.rebuilt)
        wal, shown = journal.wal, time.monotonic()
        for record in journal.replay():
            replay.apply(record)
            if progress is not None and time.monotonic() - shown >= 0.5:
                progress(*wal.replayed)
                shown = time.monotonic()
        if progress is not None:
            progress(wal.size, wal.size)
        core.recovered = {name: stem.rows_total for name, stem in core.stems.items()}


class _Replay:
    """Redoes log records through the ordinary paths, one method per record kind."""

    def __init__(self, core: Core, producers: ProducerTable, effects: Effects,
                 tiers_path: Path):
        self.core, self.producers, self.effects = core, producers, effects
        self.tiers_path = tiers_path
        self._by_kind: dict[RecordKind, Callable[[Record], None]] = {
            RecordKind.CREATE: self._create, RecordKind.INSERT: self._insert,
            RecordKind.REGISTER: self._register,
            RecordKind.UNREGISTER: lambda r: effects.unregistered(r.handle),
            RecordKind.DROP: lambda r: effects.dropped(r.stream, r.handles, r.next_tid),
            RecordKind.HISTORY: lambda r: effects.history_due(r.handles),
            RecordKind.STATE: self._state, RecordKind.PRODUCERS: self._producers,
            RecordKind.TIERS: self._tiers, RecordKind.LATEST: self._latest}

    def apply(self, record: Record) -> None:
        self._by_kind[record.op](record)

    def _create(self, record: Record) -> None:
        stmt = compile_statement(record.sql, self.core.schemas())
        assert isinstance(stmt, StreamSchema)
        self.effects.create(stmt, record.sql)

    def _insert(self, record: Record) -> None:
        assert record.tuple_ids is not None, "an insert record carries its tupleIDs"
        stem = self.core.stem(record.stream)
        n = len(record.tuple_ids)
        if n:
            batch = make_batch(stem.schema, record.columns, record.ts, 0.0, stem.last_ts)
            self.core.append(record.stream, batch, record.tuple_ids)
        if record.producer is not None:
            first = int(record.tuple_ids[0]) if n else 0
            self.producers.record(record.producer, record.seq, first, n)

    def _register(self, record: Record) -> None:
        query = compile_statement(record.sql, self.core.schemas())
        assert isinstance(query, Query)
        self.core.register(query, record.handle)

    def _state(self, record: Record) -> None:
        self.core.next_tid = max(self.core.next_tid, record.next_tid)

    def _producers(self, record: Record) -> None:
        self.producers.restore(record.producers or [])

    def _latest(self, record: Record) -> None:
        self.core.stem(record.stream).at_last_ts = record.count

    def _tiers(self, record: Record) -> None:
        assert record.tiers is not None
        core = self.core
        for handle, files in record.tiers.items():
            plan = core.plan(handle)
            assert isinstance(plan, SelectionPlan), "tiers are of selection queries"
            try:
                core.tiers.restore(plan.query.sources[0].stream, plan.slot,
                                   self.tiers_path, files)
            except (OSError, ValueError) as exc:   # a file gone or damaged
                core.tiers.forget(plan.slot)
                self.effects.history_due([handle])
                log.warning("the archive tier of %s could not be read back (%s); its "
                            "history is evaluated again", handle, exc)

