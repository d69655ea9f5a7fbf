"""The write-ahead log: what makes an acknowledged insert survive a crash.

PSoup is a main-memory system (PSoup paper, Sect. 4.2, footnote 3); psoup puts a
write-ahead log between the Data SteMs and the archive so that a restarted engine rebuilds
its SteMs, Query SteM and Results Structure by replaying what it acknowledged.

The log is a directory of segments ``wal-{seq:08d}.log``; only the newest one is live.
Each record is a frame::

    4 bytes  payload length, big-endian
    4 bytes  zlib.crc32 of the payload, big-endian
    n bytes  payload = msgpack.packb(record, use_bin_type=True)

written by a single ``os.write`` to a file opened ``O_APPEND``, so a killed process leaves
at most one incomplete frame, at the end: a *torn tail*, which replay cuts off. A bad
frame with good data after it cannot come from a crash, so replay refuses to guess and
raises instead of dropping acknowledged records.

A checkpoint of the engine (psoup.journal.checkpoint) *switches* the log at its cut
(`switch`): later records go to segment seq+1 while the checkpoint's files are written,
and once it is valid the segments before the cut are dropped (`drop_before`); replay then
starts at the segment its checkpoint names (`replay(first=...)`). `rotate` is the older
checkpoint, the state written as one segment renamed into place (a crash leaves either
the old log or the new one, never a mix).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import msgpack

from psoup.errors import DISK_FULL_ERRNOS, PSoupError, disk_full
from psoup.fsync import file_mode, fsync_dir, make_dir
from psoup.options import SYNC_NAMES, SyncName
from psoup.strenum import StrEnum

log = logging.getLogger("psoup.archive")

class Sync(StrEnum):
    """The durability modes: fsync per append, fsync per commit(), or never fsync."""

    ALWAYS = "always"
    GROUP = "group"
    OFF = "off"

_HEADER = struct.Struct(">II")
_SEGMENT = re.compile(r"wal-(\d{8,})\.log\Z")
_TMP_SUFFIX = ".tmp"
_BLOCK = 1 << 20   # replay reads, and rotate writes, this much at a time
_MAX_PAYLOAD = (1 << 32) - 1


def _segment_name(seq: int) -> str:
    return f"wal-{seq:08d}.log"


def _frame(record: Any) -> bytes:
    payload = msgpack.packb(record, use_bin_type=True)
    if len(payload) > _MAX_PAYLOAD:
        raise ValueError(f"a write-ahead log record is at most {_MAX_PAYLOAD} bytes packed, "
                         f"not {len(payload)}")
    header: bytes = _HEADER.pack(len(payload), zlib.crc32(payload))
    return header + bytes(payload)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class WriteAheadLog:
    """An append-only, checksummed log of msgpack records, with checkpoints.

    Not thread-safe: the engine serializes calls under its own lock.

    Args:
        directory: where the segments live; created if missing.
        sync: "always" fsyncs before `append` returns; "group" leaves each record with the
            OS at once (a killed process loses nothing) and fsyncs on `commit`; "off" never
            fsyncs (survives a process crash, not a power loss).

    Raises:
        ValueError: an unknown sync mode.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     wal = WriteAheadLog(d)
        ...     list(wal.replay())
        ...     wal.append({"op": "insert", "rows": b"\\x01\\x02"})
        ...     wal.close()
        ...     again = WriteAheadLog(d)
        ...     list(again.replay())
        ...     again.close()
        []
        [{'op': 'insert', 'rows': b'\\x01\\x02'}]
    """

    def __init__(self, directory: str | Path, sync: SyncName | Sync = "always"):
        if sync not in SYNC_NAMES:
            raise ValueError(f"unknown sync mode {sync!r}: expected one of "
                             f"{', '.join(SYNC_NAMES)}")
        self.directory = Path(directory)
        self.sync = Sync(sync)
        make_dir(self.directory, private=True)
        self._fd: int | None = None
        self._seq = 0
        self._size = 0
        self._earlier = 0         # bytes in the segments older than the live one
        #: (bytes read, bytes in the segments replayed) while replay runs, for progress
        self.replayed = (0, 0)
        self._dirty = False       # bytes written since the last fsync
        self._torn = False        # bytes past `_size` from a refused append, to cut off
        self._closed = False

    # ------------------------------------------------------------------ replay

    def replay(self, first: int | None = None) -> Iterator[Any]:
        """The records of the newest segment (or, given `first`, of every segment from
        number `first` on, in order), in append order; then the log is open.

        Cleans up after a crash first: leftover temp files and segments older than the
        newest (a checkpoint renamed but not yet pruned) are deleted, or with `first` the
        segments before it (a checkpoint valid but not yet pruned), and a torn tail is
        truncated (and a warning logged). Must be exhausted once before `append`.
        O(size of the log), read in blocks of 1 MiB.

        Raises:
            RuntimeError: the log was already replayed, or is closed.
            PSoupError: a bad record with data after it: the log is corrupt. Raised when
                the iteration reaches it; the file is left as it was and the log is not
                opened for appending.

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     wal = WriteAheadLog(d, sync="off")
            ...     _ = list(wal.replay())
            ...     wal.append([1, "two", {"three": 3.0}])
            ...     wal.close()
            ...     wal = WriteAheadLog(d, sync="off")
            ...     list(wal.replay())
            ...     wal.close()
            [[1, 'two', {'three': 3.0}]]
        """
        if self._closed:
            raise RuntimeError("the write-ahead log is closed")
        if self._fd is not None:
            raise RuntimeError("the write-ahead log was already replayed")
        return self._replay(first)

    def _replay(self, first: int | None) -> Iterator[Any]:
        directory = self.directory
        for tmp in directory.glob(f"wal-*.log{_TMP_SUFFIX}"):
            tmp.unlink()
        segments = self._segments()
        # Without `first`, the newest segment exists only once its checkpoint was
        # complete and renamed into place, so the older ones are already superseded.
        keep = segments[-1:] if first is None else [s for s in segments if s[0] >= first]
        for seq, older in segments:
            if (seq, older) not in keep:
                older.unlink()
        sizes = [path.stat().st_size for _, path in keep]
        done = 0
        for (seq, path), size in zip(keep, sizes, strict=True):
            self._seq = seq
            for record, at in self._read_segment(path):
                self.replayed = (done + at, sum(sizes))
                yield record
            done += size
        if keep:
            path = keep[-1][1]
            self._earlier = sum(p.stat().st_size for _, p in keep[:-1])
        else:
            self._seq = max(1, first or 1)
            path = directory / _segment_name(self._seq)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, file_mode(True))
        os.fchmod(self._fd, 0o600)                  # a segment an older version made 0644
        self._size = os.fstat(self._fd).st_size
        fsync_dir(directory)

    def _segments(self) -> list[tuple[int, Path]]:
        """(number, path) of every segment in the directory, oldest first."""
        return sorted((int(m.group(1)), p) for p in self.directory.iterdir()
                      if (m := _SEGMENT.match(p.name)))

    def _read_segment(self, path: Path) -> Iterator[tuple[Any, int]]:
        """(record, offset after it) of each whole record of the segment at `path`."""
        file_size = path.stat().st_size
        offset = 0   # start of the next frame
        with open(path, "rb", buffering=_BLOCK) as f:
            while offset < file_size:
                header = f.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    break
                length, crc = _HEADER.unpack(header)
                end = offset + _HEADER.size + length
                if end > file_size:
                    break
                payload = f.read(length)
                if length == 0 or zlib.crc32(payload) != crc:
                    # A crash tears only the last frame; anything after a bad frame means
                    # the bytes were damaged some other way, and dropping them would lose
                    # acknowledged records. Zeros to EOF are a tail the filesystem
                    # extended before the data reached the disk (power loss), not data.
                    if end == file_size or _zeros_to_eof(f, payload):
                        break
                    raise PSoupError(
                        f"write-ahead log {path} is corrupt: the record at byte {offset} "
                        f"fails its checksum and {file_size - end} bytes follow it; "
                        f"refusing to drop acknowledged data")
                try:
                    record = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                except (ValueError, TypeError, msgpack.UnpackException) as e:
                    raise PSoupError(f"write-ahead log {path} is corrupt: the record at byte "
                                     f"{offset} passes its checksum but does not decode "
                                     f"({e})") from None
                yield record, end
                offset = end
        if offset < file_size:
            self._truncate(path, offset, file_size)

    @staticmethod
    def _truncate(path: Path, offset: int, file_size: int) -> None:
        log.warning("write-ahead log %s: torn tail at byte %d (%d bytes of an incomplete "
                    "record), truncated", path, offset, file_size - offset)
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, offset)
            os.fsync(fd)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ append

    def append(self, record: Any) -> None:
        """Log one record; fsynced before returning when sync is "always". O(record).

        Map keys must stay hashable once unpacked (str, int, bytes), as replay decodes
        arrays as lists.

        Raises:
            RuntimeError: the log was not replayed yet, or is closed.
            TypeError: the record is not msgpack-able (nothing is written).
            ValueError: the packed record exceeds 4 GiB (nothing is written).
            DiskFull: the file system is full (ENOSPC, EDQUOT); OSError: another write
                or fsync failure. Either way the log is cut back to where it was, so the
                record is not in it; the next append tries again.

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     wal = WriteAheadLog(d)
            ...     _ = list(wal.replay())
            ...     wal.append({"op": "insert", "n": 1})
            ...     wal.size
            ...     wal.close()
            22
        """
        fd = self._open_fd()
        frame = _frame(record)
        if self._torn:
            self._cut(fd)
        try:
            _write_all(fd, frame)
            self._dirty = True
            if self.sync is Sync.ALWAYS:
                self._fsync()
        except OSError as exc:
            self._refuse(fd, exc)
        self._size += len(frame)

    def _refuse(self, fd: int, exc: OSError) -> NoReturn:
        """After a failed write or fsync of the frame at `self._size`: cut the log back
        to that offset, so that a replay never finds the refused record (nor a partial
        frame followed by later appends: corruption in the middle of the log); if the
        cut fails too, the next append makes it first. Raises DiskFull for a full disk,
        else `exc`."""
        self._torn = True
        with contextlib.suppress(OSError):
            self._cut(fd)
        if exc.errno in DISK_FULL_ERRNOS:
            raise disk_full(exc, self.directory / _segment_name(self._seq),
                            "this write was refused and nothing of it was applied; it "
                            "succeeds once space is freed there (reads go on)") from exc
        raise exc

    def _cut(self, fd: int) -> None:
        """Truncate the log to its last whole record; the next fsync makes it durable."""
        os.ftruncate(fd, self._size)
        self._torn, self._dirty = False, True

    def commit(self) -> None:
        """Fsync what was appended since the last fsync (no-op when sync is "off"). O(1)
        calls, O(unsynced bytes) disk work.

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     wal = WriteAheadLog(d, sync="group")
            ...     _ = list(wal.replay())
            ...     for i in range(3):
            ...         wal.append(i)
            ...     wal.commit()
            ...     wal.close()
        """
        if self._dirty and self.sync is not Sync.OFF and self._fd is not None:
            self._fsync()

    def _fsync(self) -> None:
        assert self._fd is not None, "callers fsync only an open log"
        os.fsync(self._fd)
        self._dirty = False

    def _open_fd(self) -> int:
        if self._closed:
            raise RuntimeError("the write-ahead log is closed")
        if self._fd is None:
            raise RuntimeError("replay() the write-ahead log to its end before appending")
        return self._fd

    @property
    def size(self) -> int:
        """Bytes in the current segment. O(1).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     wal = WriteAheadLog(d)
            ...     _ = list(wal.replay())
            ...     wal.size
            ...     wal.close()
            0
        """
        return self._size

    # ------------------------------------------------------------------ checkpoint

    def rotate(self, records: Iterable[Any]) -> None:
        """Checkpoint: replace the log by a new segment holding exactly `records`.

        The new segment is written to a temp file, fsynced, renamed into place and the
        directory fsynced; only then are the older segments deleted. A crash at any point
        leaves replay either the old log or exactly `records`. O(size of `records`).

        Raises:
            RuntimeError: the log was not replayed yet, or is closed.
            TypeError: a record is not msgpack-able (the old log stays in use).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     wal = WriteAheadLog(d)
            ...     _ = list(wal.replay())
            ...     for i in range(5):
            ...         wal.append({"op": "insert", "i": i})
            ...     wal.rotate([{"op": "snapshot", "n": 5}])
            ...     wal.append({"op": "insert", "i": 5})
            ...     wal.close()
            ...     wal = WriteAheadLog(d)
            ...     list(wal.replay())
            ...     wal.close()
            [{'op': 'snapshot', 'n': 5}, {'op': 'insert', 'i': 5}]
        """
        old_fd = self._open_fd()
        directory = self.directory
        seq = self._seq + 1
        path = directory / _segment_name(seq)
        tmp = path.with_name(path.name + _TMP_SUFFIX)
        size = 0
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode(True))
        try:
            pending: list[bytes] = []
            pending_bytes = 0
            for record in records:
                frame = _frame(record)
                pending.append(frame)
                pending_bytes += len(frame)
                if pending_bytes >= _BLOCK:
                    _write_all(fd, b"".join(pending))
                    size += pending_bytes
                    pending, pending_bytes = [], 0
            _write_all(fd, b"".join(pending))
            size += pending_bytes
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink()
            raise
        os.close(fd)
        os.replace(tmp, path)
        fsync_dir(directory)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.close(old_fd)
        self._seq, self._size, self._dirty, self._earlier = seq, size, False, 0
        for p in directory.iterdir():
            m = _SEGMENT.match(p.name)
            if m and int(m.group(1)) < seq:
                p.unlink()
        fsync_dir(directory)

    @property
    def seq(self) -> int:
        """The number of the live segment. O(1)."""
        return self._seq

    @property
    def total(self) -> int:
        """Bytes in every segment kept: the live one and those a checkpoint that is not
        yet valid still needs. O(1)."""
        return self._earlier + self._size

    def switch(self) -> int:
        """Start segment seq+1, empty, for the records that follow; the older segments
        stay (replay reads them in order) until `drop_before`. What was appended to the
        old one is fsynced first (unless sync is "off"), so that a power loss never keeps
        a later record and loses an earlier one. Returns the new segment's number. O(1).

        Raises:
            RuntimeError: the log was not replayed yet, or is closed.

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     wal = WriteAheadLog(d)
            ...     _ = list(wal.replay())
            ...     wal.append({"i": 0})
            ...     wal.switch()
            ...     wal.append({"i": 1})
            ...     wal.close()
            ...     wal = WriteAheadLog(d)
            ...     list(wal.replay(first=1))
            ...     wal.close()
            2
            [{'i': 0}, {'i': 1}]
        """
        old_fd = self._open_fd()
        self.commit()
        seq = self._seq + 1
        path = self.directory / _segment_name(seq)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC,
                     file_mode(True))
        fsync_dir(self.directory)
        self._fd = fd
        os.close(old_fd)
        self._earlier += self._size
        self._seq, self._size, self._dirty = seq, 0, False
        return seq

    def drop_before(self, seq: int) -> None:
        """Delete the segments numbered below `seq` (a checkpoint holds what they
        logged). O(segments)."""
        for number, path in self._segments():
            if number < seq:
                path.unlink(missing_ok=True)
        fsync_dir(self.directory)
        self._earlier = sum(p.stat().st_size for number, p in self._segments()
                            if number < self._seq)

    def close(self) -> None:
        """Commit and close; calling it again does nothing. O(1).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     wal = WriteAheadLog(d)
            ...     _ = list(wal.replay())
            ...     wal.close()
            ...     wal.close()
        """
        if self._closed:
            return
        if self._fd is not None:
            self.commit()
            os.close(self._fd)
            self._fd = None
        self._closed = True


def _zeros_to_eof(f: BinaryIO, head: bytes) -> bool:
    """Whether `head` and everything left in the open file `f` are zero bytes."""
    if head.count(0) != len(head):
        return False
    while block := f.read(_BLOCK):
        if block.count(0) != len(block):
            return False
    return True
