"""The durable side of an engine: what `Engine(path=DIR)` writes and reads back.

Every acknowledged change (create stream, insert batch, register, unregister, drop
stream) becomes one
write-ahead log record before the call returns (nothing acknowledged is lost); on start
the log is replayed through the engine's ordinary paths, so the rebuilt Data SteMs,
Query SteM and Results Structure are the ones the original calls built (duality makes
the order of queries and data irrelevant to the result bits, but the replay keeps it).

A checkpoint bounds the log: once it outgrows `checkpoint_bytes`, the whole state is
written as files (psoup.journal.checkpoint: the chunks of data and results as they are
in memory, the handles, the counters) while the log goes on in a new segment, and the
segments before the checkpoint are dropped once its manifest makes it valid; recovery
reads the files back and replays the log after them. Tuples that left retention go to
the Parquet archive first, so nothing acknowledged lives only in a dropped segment.

Layout: DIR/wal/wal-NNNNNNNN.log, DIR/checkpoint/ (manifest-NNNNNNNN.mp and the files it
names), DIR/archive/stream=NAME/date=YYYY-MM-DD/*.parquet,
the archive's windowed-aggregate copies under DIR/aggregates (psoup.archive.rollups),
and DIR/lock, held (flock) by the one process that has the directory open: two engines
appending to one log would corrupt it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from psoup.archive.parquet import Archive
from psoup.archive.rollups import folder_for
from psoup.archive.tiers import INCOMING
from psoup.codec import decode_array, decode_columns, encode_array, encode_columns
from psoup.errors import PSoupError
from psoup.fsync import make_dir
from psoup.journal import checkpoint as checkpoints
from psoup.journal.wal import Sync, WriteAheadLog
from psoup.options import SyncName
from psoup.strenum import StrEnum

if TYPE_CHECKING:
    from psoup.core import Core

#: A checkpoint by time needs the log to have grown this much since the last one (a
#: quiet engine is not rewritten for a few records).
CHECKPOINT_MIN_GROWTH = 1 << 20


class RecordKind(StrEnum):
    """What a log record does; its value is the record's "op" on disk."""

    CREATE = "create"
    INSERT = "insert"
    REGISTER = "register"
    UNREGISTER = "unregister"
    DROP = "drop"
    STATE = "state"
    PRODUCERS = "producers"
    TIERS = "tiers"
    HISTORY = "history"
    LATEST = "latest"


@dataclass
class Record:
    """One decoded log record. `op` is create, insert, register, unregister, drop, state,
    producers, tiers (handle -> the segment files of its archive tier, under tiers/),
    history (the handles whose history is to be evaluated again) or latest (`count`: how
    many rows the stream ever stored at its latest ts, retention may have dropped some of
    them from a checkpoint's image). An insert's idempotency key is `producer` and `seq`;
    a drop names the handles it unregistered with the stream (CASCADE) and the next
    tupleID when it was dropped (the archive keeps what is numbered from there)."""

    op: RecordKind
    sql: str = ""
    stream: str = ""
    handle: str = ""
    handles: tuple[str, ...] = ()
    tuple_ids: np.ndarray | None = None
    ts: np.ndarray | None = None
    columns: dict[str, Any] | None = None
    next_tid: int = 0
    producer: str | None = None
    seq: int = -1
    producers: list[Any] | None = None
    count: int = 0
    tiers: dict[str, list[str]] | None = None


class Journal:
    """Write-ahead log plus archive of one durable engine directory.

    Args:
        path: the engine's data directory (created if missing).
        sync: "always", "group" or "off" (see WriteAheadLog).
        checkpoint_bytes: log size that triggers a checkpoint.
        checkpoint_seconds: time after the last checkpoint (or the start) that triggers
            one, when the log has grown by CHECKPOINT_MIN_GROWTH since (None: by size
            only): a slowly growing log is compacted too, so a restart replays about the
            retained state, not days of records.
    """

    def __init__(self, path: str | os.PathLike[str], sync: SyncName | Sync = "always",
                 checkpoint_bytes: int = 64 << 20, checkpoint_seconds: float | None = 3600.0):
        self.path = Path(path)
        make_dir(self.path, private=True)                           # tuples are private
        self._lock_fd = _lock(self.path / "lock")
        self.wal = WriteAheadLog(self.path / "wal", Sync(sync))
        # its flusher writes expired rows beside the writer (docs/durability.md)
        self.archive = Archive(self.path / "archive", private=True,
                               aggregates=folder_for(self.path / "archive"), background=True)
        shutil.rmtree(self.tiers_path / INCOMING, ignore_errors=True)   # of a job cut short
        self.checkpoint_bytes = checkpoint_bytes
        self.checkpoint_seconds = checkpoint_seconds
        self._last_checkpoint = time.monotonic()
        self._base: int | None = None       # log size after the last checkpoint (or replay)
        #: registrations, unregistrations, creates and drops logged so far (a checkpoint
        #: reuses the bitmap files of the one before when none came between their cuts)
        self.edits = 0
        #: the newest valid checkpoint's manifest (None: none yet), read at recovery
        self.manifest: dict[str, Any] | None = None
        self._tier_files: set[str] | None = None    # tier files logged since a cut
        #: what each record logged is also given to, once logged (psoup.server.replica)
        self.feed: Callable[[dict[str, Any]], None] | None = None

    # ------------------------------------------------------------------ recovery

    @property
    def checkpoint_path(self) -> Path:
        """Where checkpoints are written (psoup.journal.checkpoint)."""
        return self.path / "checkpoint"

    def load(self) -> dict[str, Any] | None:
        """The newest checkpoint's manifest (None: none), left-overs removed.

        Raises:
            PSoupError: the manifest cannot be read."""
        self.manifest = checkpoints.newest(self.checkpoint_path)
        checkpoints.collect(self.checkpoint_path, self.manifest)
        if self.manifest is not None:
            self.edits = int(self.manifest["edits"])
        return self.manifest

    def replay(self) -> Iterator[Record]:
        """The logged changes after the checkpoint `load` found (all of them without
        one), in order. O(size of that log)."""
        first = 0 if self.manifest is None else int(self.manifest["wal"])
        for raw in self.wal.replay(first):
            record = _decode(raw, f"the write-ahead log in {self.path / 'wal'}")
            if record.op in _EDITS:
                self.edits += 1
            yield record

    # ------------------------------------------------------------------ logging

    def create(self, sql: str) -> None:
        self._append(create_record(sql))
        self.edits += 1

    def insert(self, stream: str, first_tid: int, ts: np.ndarray,
               columns: Mapping[str, np.ndarray], producer: str | None = None,
               seq: int | None = None) -> None:
        self._append(insert_record(stream, first_tid, ts, columns, producer, seq))

    def register(self, handle: str, sql: str) -> None:
        self._append(register_record(handle, sql))
        self.edits += 1

    def unregister(self, handle: str) -> None:
        self._append(unregister_record(handle))
        self.edits += 1

    def history(self, handles: Sequence[str]) -> None:
        """These queries have an archive tier now: evaluate their history again after a
        restart, unless a `tiers` record brings their tiers back."""
        self._append({"op": RecordKind.HISTORY.value, "handles": list(handles)})

    def tiers(self, tiers: Mapping[str, list[str]]) -> None:
        """These archive tiers (handle -> segment files under tiers/) are saved whole as
        of this point of the log: a restart restores them here."""
        self._append({"op": RecordKind.TIERS.value,
                      "tiers": {h: list(f) for h, f in tiers.items()}})
        if self._tier_files is not None:            # a checkpoint is being written
            self._tier_files.update(name for files in tiers.values() for name in files)

    def drop(self, stream: str, handles: Sequence[str], next_tid: int) -> None:
        """Log DROP STREAM: one record for the stream and the queries it takes along,
        so that a crash leaves all of them or none."""
        self._append(drop_record(stream, handles, next_tid))
        self.edits += 1

    def _append(self, record: dict[str, Any]) -> None:
        """Log `record`, then give it to the feed (read replicas), once it is logged:
        a record the log refused is not applied, so no replica sees it."""
        self.wal.append(record)
        if self.feed is not None:
            self.feed(record)

    def expired(self, stream: str, columns: Sequence[tuple[str, str]],
                data: Mapping[str, np.ndarray]) -> None:
        """Tuples leaving retention, for the archive (duplicates after a replay are
        skipped by the archive's high-water mark)."""
        self.archive.add(stream, columns, data)

    # ------------------------------------------------------------------ checkpoint

    @property
    def checkpoint_due(self) -> bool:
        """Whether the log since the last valid checkpoint has outgrown
        `checkpoint_bytes`, or grown by CHECKPOINT_MIN_GROWTH and `checkpoint_seconds`
        passed. O(1)."""
        size = self.wal.total
        if size >= self.checkpoint_bytes:
            return True
        if self._base is None:
            self._base = size
        return (self.checkpoint_seconds is not None
                and size - self._base >= CHECKPOINT_MIN_GROWTH
                and time.monotonic() - self._last_checkpoint >= self.checkpoint_seconds)

    def cut(self, core: Core, producers: list[Any], history: Sequence[str],
            tiers: Mapping[str, list[str]]) -> checkpoints.Cut:
        """A checkpoint's cut, under the engine's lock: what left retention is flushed to
        the archive, the log switches to a new segment (the records after the cut), and
        the state is taken by reference (psoup.journal.checkpoint.take). O(chunks +
        queries), plus the archive's flush."""
        self.archive.flush()
        number = 1 + (0 if self.manifest is None else int(self.manifest["number"]))
        seq = self.wal.switch()
        self._tier_files = set()
        return checkpoints.take(core, number, seq, self.edits, producers, list(history),
                                {h: list(f) for h, f in tiers.items()})

    def checkpoint(self, cut: checkpoints.Cut) -> None:
        """Write the cut's files and manifest (off the engine's lock): from then on the
        checkpoint is valid. O(state written).

        Raises:
            OSError: a file could not be written; the previous checkpoint and the log
                after it stay valid.
        """
        try:
            cut.manifest = checkpoints.write(cut, self.checkpoint_path, self.manifest)
        except BaseException:
            # its own files, which may be what filled the disk (the previous
            # checkpoint's stay: no other checkpoint runs until `finish`)
            checkpoints.collect(self.checkpoint_path, self.manifest)
            raise
        # the older checkpoint's files
        checkpoints.collect(self.checkpoint_path, cut.manifest)

    def finish(self, cut: checkpoints.Cut) -> None:
        """After the cut's files (under the engine's lock): once its manifest is written,
        the log before the cut and the tier files no longer named are removed. Either way
        the cut is released. O(files)."""
        checkpoints.release(cut)
        kept, self._tier_files = self._tier_files or set(), None
        if cut.manifest is None:
            return
        self.manifest = cut.manifest
        self.wal.drop_before(cut.wal)
        self._base, self._last_checkpoint = self.wal.total, time.monotonic()
        self._collect_tiers(kept | {name for files in cut.tiers.values() for name in files})

    @property
    def tiers_path(self) -> Path:
        """Where archive tiers are saved (psoup.archive.tiers.ArchiveTiers.save)."""
        return self.path / "tiers"

    def _collect_tiers(self, kept: set[str]) -> None:
        """Remove the files under tiers/ that are not in `kept` (of queries unregistered
        since, or of a checkpoint that failed after writing them), and emptied folders;
        not the segments a running history job is moving in (INCOMING). Best effort."""
        root = self.tiers_path
        if not root.is_dir():
            return
        for path in sorted(root.rglob("*"), reverse=True):
            if path.relative_to(root).parts[0] == INCOMING:
                continue
            try:
                if path.is_dir():
                    if not any(path.iterdir()):
                        path.rmdir()
                elif path.relative_to(root).as_posix() not in kept:
                    path.unlink()
            except OSError:
                pass

    def commit(self) -> None:
        self.wal.commit()

    def close(self) -> None:
        try:
            self.archive.flush()    # what fails stays in the log, archived after a restart
        finally:
            try:
                self.archive.close()        # its flusher, idle by now
                self.wal.close()
            finally:
                os.close(self._lock_fd)     # releases the flock


#: The records that change the queries or streams (`Journal.edits` counts them).
_EDITS = frozenset((RecordKind.CREATE, RecordKind.REGISTER, RecordKind.UNREGISTER,
                    RecordKind.DROP))


# ---------------------------------------------------------------------- records

def create_record(sql: str) -> dict[str, Any]:
    """The record of a CREATE STREAM (as the log and a replica's feed carry it)."""
    return {"op": RecordKind.CREATE.value, "sql": sql}


def insert_record(stream: str, first_tid: int, ts: np.ndarray,
                  columns: Mapping[str, np.ndarray], producer: str | None = None,
                  seq: int | None = None) -> dict[str, Any]:
    """The record of a batch inserted with tupleIDs from `first_tid`. O(batch)."""
    record: dict[str, Any] = {"op": RecordKind.INSERT.value, "stream": stream,
                              "tid0": int(first_tid), "ts": encode_array(ts),
                              "cols": encode_columns(columns)}
    if producer is not None:
        assert seq is not None, "a producer's batch carries its seq"
        record.update(producer=producer, seq=int(seq))
    return record


def register_record(handle: str, sql: str) -> dict[str, Any]:
    return {"op": RecordKind.REGISTER.value, "handle": handle, "sql": sql}


def unregister_record(handle: str) -> dict[str, Any]:
    return {"op": RecordKind.UNREGISTER.value, "handle": handle}


def drop_record(stream: str, handles: Sequence[str], next_tid: int) -> dict[str, Any]:
    return {"op": RecordKind.DROP.value, "stream": stream, "handles": list(handles),
            "next_tid": int(next_tid)}


def decode(raw: Any, where: str) -> Record:
    """A record as msgpack unpacked it (from the log, or a replica's feed), `where`
    saying where it was read for the error.

    Raises:
        PSoupError: an unknown or unreadable record."""
    return _decode(raw, where)


def _lock(path: Path) -> int:
    """Hold an exclusive lock on `path` for this process, or say who holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise PSoupError(f"the data directory {path.parent} is in use by another psoup "
                         f"engine (pid {holder}); stop it first, or use another directory") \
            from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _decode(raw: Any, where: str) -> Record:
    try:
        decode = _DECODERS.get(RecordKind(raw["op"]))
    except (KeyError, TypeError, ValueError):
        decode = None
    if decode is None:
        raise PSoupError(f"unknown record {_op(raw)!r} in {where}")
    try:
        return decode(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise PSoupError(f"unreadable record in {where}: {exc}") from exc


def _insert(raw: Any) -> Record:
    ts = np.asarray(decode_array(raw["ts"]), dtype=np.float64)
    if "tids" in raw:
        tids = np.asarray(decode_array(raw["tids"]), dtype=np.int64)
    else:
        tids = np.arange(raw["tid0"], raw["tid0"] + len(ts), dtype=np.int64)
    return Record(RecordKind.INSERT, stream=raw["stream"], tuple_ids=tids, ts=ts,
                  columns=decode_columns(raw["cols"]), producer=raw.get("producer"),
                  seq=int(raw.get("seq", -1)))


#: Each record kind's decoder, from the record as msgpack gave it.
_DECODERS: dict[RecordKind, Callable[[Any], Record]] = {
    RecordKind.CREATE: lambda raw: Record(RecordKind.CREATE, sql=raw["sql"]),
    RecordKind.INSERT: _insert,
    RecordKind.REGISTER: lambda raw: Record(RecordKind.REGISTER, handle=raw["handle"],
                                            sql=raw.get("sql", "")),
    RecordKind.UNREGISTER: lambda raw: Record(RecordKind.UNREGISTER, handle=raw["handle"],
                                              sql=raw.get("sql", "")),
    RecordKind.STATE: lambda raw: Record(RecordKind.STATE, next_tid=int(raw["next_tid"])),
    RecordKind.TIERS: lambda raw: Record(RecordKind.TIERS, tiers={
        str(h): [str(f) for f in files] for h, files in raw["tiers"].items()}),
    RecordKind.LATEST: lambda raw: Record(RecordKind.LATEST, stream=raw["stream"],
                                          count=int(raw["rows"])),
    RecordKind.PRODUCERS: lambda raw: Record(RecordKind.PRODUCERS,
                                             producers=list(raw["table"])),
    RecordKind.HISTORY: lambda raw: Record(RecordKind.HISTORY, handles=tuple(raw["handles"])),
    RecordKind.DROP: lambda raw: Record(RecordKind.DROP, stream=raw["stream"],
                                        handles=tuple(raw["handles"]),
                                        next_tid=int(raw["next_tid"])),
}


def _op(raw: Any) -> Any:
    """The "op" of an undecodable record, for the message (None if it has none)."""
    return raw.get("op") if isinstance(raw, dict) else None
