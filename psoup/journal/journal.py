"""The durable side of an engine: what `Engine(path=DIR)` writes and reads back.

Every acknowledged change (create stream, insert batch, register, unregister, drop
stream) becomes one
write-ahead log record before the call returns (nothing acknowledged is lost); on start
the log is replayed through the engine's ordinary paths, so the rebuilt Data SteMs,
Query SteM and Results Structure are the ones the original calls built (duality makes
the order of queries and data irrelevant to the result bits, but the replay keeps it).

A checkpoint bounds the log: once it outgrows `checkpoint_bytes`, what is retained is
written as a fresh log segment (stream definitions, retained tuples with their
tupleIDs, the tupleID counter, handles with their SQL) and the old segment is dropped.
Tuples that left retention go to the Parquet archive first, so nothing acknowledged
lives only in the dropped segment.

Layout: DIR/wal/wal-NNNNNNNN.log, DIR/archive/stream=NAME/date=YYYY-MM-DD/*.parquet,
the archive's windowed-aggregate copies under DIR/aggregates (psoup.archive.rollups),
and DIR/lock, held (flock) by the one process that has the directory open: two engines
appending to one log would corrupt it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from psoup.archive.parquet import Archive
from psoup.archive.rollups import folder_for
from psoup.archive.tiers import INCOMING
from psoup.codec import decode_array, decode_columns, encode_array, encode_columns
from psoup.errors import PSoupError
from psoup.fsync import make_dir
from psoup.journal.wal import Sync, WriteAheadLog
from psoup.options import SyncName
from psoup.strenum import StrEnum

#: Retained rows per insert record of a checkpoint (bounds one record's size).
CHECKPOINT_ROWS = 1 << 16

#: A checkpoint by time needs the log to have grown this much since the last one (a
#: quiet engine is not rewritten for a few records).
CHECKPOINT_MIN_GROWTH = 1 << 20


@dataclass
class StreamImage:
    """What a checkpoint keeps of one stream."""

    ddl: str                           # the CREATE STREAM statement
    columns: Sequence[tuple[str, str]]  # the schema, for the archive
    retained: Mapping[str, np.ndarray]  # retained rows: schema columns, ts, tupleID
    expired: Mapping[str, np.ndarray]   # rows past retention still held in memory
    at_latest: int = 0                  # rows ever stored at the latest ts (DataSteM)


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

    # ------------------------------------------------------------------ recovery

    def replay(self) -> Iterator[Record]:
        """The logged changes in order. O(size of the log)."""
        for raw in self.wal.replay():
            yield _decode(raw, self.path / "wal")

    # ------------------------------------------------------------------ logging

    def create(self, sql: str) -> None:
        self.wal.append({"op": RecordKind.CREATE.value, "sql": sql})

    def insert(self, stream: str, first_tid: int, ts: np.ndarray,
               columns: Mapping[str, np.ndarray], producer: str | None = None,
               seq: int | None = None) -> None:
        record: dict[str, Any] = {"op": RecordKind.INSERT.value, "stream": stream,
                                  "tid0": int(first_tid), "ts": encode_array(ts),
                                  "cols": encode_columns(columns)}
        if producer is not None:
            assert seq is not None, "a producer's batch carries its seq"
            record.update(producer=producer, seq=int(seq))
        self.wal.append(record)

    def register(self, handle: str, sql: str) -> None:
        self.wal.append({"op": RecordKind.REGISTER.value, "handle": handle, "sql": sql})

    def unregister(self, handle: str) -> None:
        self.wal.append({"op": RecordKind.UNREGISTER.value, "handle": handle})

    def history(self, handles: Sequence[str]) -> None:
        """These queries have an archive tier now: evaluate their history again after a
        restart, unless a `tiers` record brings their tiers back."""
        self.wal.append({"op": RecordKind.HISTORY.value, "handles": list(handles)})

    def tiers(self, tiers: Mapping[str, list[str]]) -> None:
        """These archive tiers (handle -> segment files under tiers/) are saved whole as
        of this point of the log: a restart restores them here."""
        self.wal.append({"op": RecordKind.TIERS.value,
                         "tiers": {h: list(f) for h, f in tiers.items()}})

    def drop(self, stream: str, handles: Sequence[str], next_tid: int) -> None:
        """Log DROP STREAM: one record for the stream and the queries it takes along,
        so that a crash leaves all of them or none."""
        self.wal.append({"op": RecordKind.DROP.value, "stream": stream, "handles": list(handles),
                         "next_tid": int(next_tid)})

    def expired(self, stream: str, columns: Sequence[tuple[str, str]],
                data: Mapping[str, np.ndarray]) -> None:
        """Tuples leaving retention, for the archive (duplicates after a replay are
        skipped by the archive's high-water mark)."""
        self.archive.add(stream, columns, data)

    # ------------------------------------------------------------------ checkpoint

    @property
    def checkpoint_due(self) -> bool:
        size = self.wal.size
        if size >= self.checkpoint_bytes:
            return True
        if self._base is None:
            self._base = size
        return (self.checkpoint_seconds is not None
                and size - self._base >= CHECKPOINT_MIN_GROWTH
                and time.monotonic() - self._last_checkpoint >= self.checkpoint_seconds)

    def checkpoint(self, streams: Mapping[str, StreamImage], next_tid: int,
                   handles: Iterable[tuple[str, str]], producers: list[Any] | None = None,
                   history: Sequence[str] = (),
                   tiers: Mapping[str, list[str]] | None = None) -> None:
        """Archive what left retention, then replace the log by the retained state
        (with the idempotent producers' table, psoup.producers, the archive tiers saved
        under tiers/ by handle, and the handles whose history is to be evaluated again),
        then remove the tier files the new log no longer names."""
        for name, image in streams.items():
            if len(image.expired["ts"]):
                self.archive.add(name, image.columns, image.expired)
        self.archive.flush()
        self.wal.rotate(_image_records(streams, next_tid, handles, producers or [],
                                       list(history), dict(tiers or {})))
        self._base, self._last_checkpoint = self.wal.size, time.monotonic()
        self._collect_tiers({name for files in (tiers or {}).values() for name in files})

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


def _image_records(streams: Mapping[str, StreamImage], next_tid: int,
                   handles: Iterable[tuple[str, str]], producers: list[Any], history: list[str],
                   tiers: dict[str, list[str]]) -> Iterator[dict[str, Any]]:
    for image in streams.values():
        yield {"op": RecordKind.CREATE.value, "sql": image.ddl}
    # Queries before data: replayed, each registration meets no tuples (O(cells)), and
    # each batch then probes all of them at once, O(rows x queries / 64), instead of
    # each query searching every retained tuple (duality: the same results).
    yield {"op": RecordKind.STATE.value, "next_tid": int(next_tid)}
    if producers:
        yield {"op": RecordKind.PRODUCERS.value, "table": producers}
    for handle, sql in handles:
        yield {"op": RecordKind.REGISTER.value, "handle": handle, "sql": sql}
    # the tiers before the data: their matches are those below the horizon, and the
    # retained tuples replayed below never move it
    if tiers:
        yield {"op": RecordKind.TIERS.value, "tiers": tiers}
    if history:
        yield {"op": RecordKind.HISTORY.value, "handles": history}
    for name, image in streams.items():
        data = image.retained
        names = [c for c, _ in image.columns]
        for a in range(0, len(data["ts"]), CHECKPOINT_ROWS):
            b = a + CHECKPOINT_ROWS
            yield {"op": RecordKind.INSERT.value, "stream": name,
                   "tids": encode_array(data["tupleID"][a:b]),
                   "ts": encode_array(data["ts"][a:b]),
                   "cols": encode_columns({c: data[c][a:b] for c in names})}
        if len(data["ts"]):
            yield {"op": RecordKind.LATEST.value, "stream": name, "rows": int(image.at_latest)}


def _decode(raw: Any, where: Path) -> Record:
    try:
        decode = _DECODERS.get(RecordKind(raw["op"]))
    except (KeyError, TypeError, ValueError):
        decode = None
    if decode is None:
        raise PSoupError(f"unknown record {_op(raw)!r} in the write-ahead log in {where}")
    try:
        return decode(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise PSoupError(f"unreadable record in the write-ahead log in {where}: {exc}") from exc


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
