"""Every error psoup raises on purpose.

A failed call changes nothing (docs/design.md, "Invariants"), so each error is raised
before any structure is touched, and its message names the problem and where it is.
"""

from __future__ import annotations

import errno
import os

#: The errnos of a write the file system refused for want of space: the disk is full, or
#: the user's quota is used up.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class PSoupError(Exception):
    """Base class of psoup's errors."""

    code = "error"


class QueryError(PSoupError, ValueError):
    """A statement was rejected: bad syntax, unknown stream or column, type mismatch.

    Attributes:
        line: 1-based line of the offending token, when known.
        column: 1-based column of the offending token, when known.
    """

    code = "query"

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.line = line
        self.column = column
        if line is not None and column is not None:
            message = f"line {line}, column {column}: {message}"
        super().__init__(message)


class SchemaError(PSoupError, ValueError):
    """A batch of tuples was rejected: wrong arity or type, missing column, decreasing ts."""

    code = "schema"


class LimitError(PSoupError, ValueError):
    """A request beyond a configured limit (a WHERE clause of too many factors, a batch
    of too many rows); the message names the limit. Nothing was applied."""

    code = "limit"


class UnknownHandle(PSoupError, KeyError):
    """A handle that this engine did not issue, or that was unregistered."""

    code = "unknown_handle"

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown handle"


class ApplyFailed(PSoupError):
    """A change that failed *after* it was logged (a bug, or memory running out while it
    was applied): with a path it is durable, and the reopened engine applies it, so it
    must not be sent again. The engine stops (every later call raises this) because its
    memory may hold part of the change; reopen it on the same path."""

    code = "apply_failed"


class DiskFull(PSoupError):
    """A write refused because the file system holding `path` is full (or a disk quota
    is used up). Nothing of the write was applied, and nothing of it is applied later;
    reads go on, and the same write succeeds once space is freed there (no restart).

    Attributes:
        path: the file or folder that could not be written, on the engine's machine
            (a client's DiskFull has the server's; "" when not known).
    """

    code = "disk_full"

    def __init__(self, message: str, path: str | os.PathLike[str] = ""):
        super().__init__(message)
        self.path = str(path)


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` is the operating system refusing a write for want of space.

    Example:
        >>> [is_disk_full(OSError(code, os.strerror(code)))
        ...  for code in (errno.ENOSPC, errno.EDQUOT, errno.EACCES)]
        [True, True, False]
    """
    return isinstance(exc, DiskFull) or (isinstance(exc, OSError)
                                         and exc.errno in DISK_FULL_ERRNOS)


def disk_full(exc: OSError, path: str | os.PathLike[str], outcome: str) -> DiskFull:
    """The DiskFull for `exc` (a disk-full OSError) met writing `path`; `outcome` says
    what became of the write.

    Example:
        >>> str(disk_full(OSError(errno.ENOSPC, "No space left on device"), "/d/wal.log",
        ...               "nothing was applied"))
        'the disk is full: No space left on device writing /d/wal.log; nothing was applied'
    """
    reason = exc.strerror or os.strerror(exc.errno or errno.ENOSPC)
    return DiskFull(f"the disk is full: {reason} writing {path}; {outcome}", path)


class CursorExpired(PSoupError):
    """A `since` cursor whose answer this engine can no longer rebuild (its tuples left
    memory and its stored copy was dropped, or was lost in a restart); invoke without
    `since` to get the whole answer and a fresh cursor."""

    code = "cursor_expired"


class CursorInvalid(CursorExpired):
    """A `since` string that is no cursor this engine issued for the handle: garbled,
    forged, or meant for another handle (its integrity check fails). Like an expired
    cursor (same wire code), the remedy is to invoke without `since`."""


class HistoryPending(PSoupError):
    """A query whose history was evaluated before a restart, and is being evaluated
    again (or failed to be): its answer would lack the archived part, so it is refused
    until the job is done rather than answered short. Also a query over a stream
    probed in Spark's executors whose history pass over the committed micro-batches
    its window meets has not committed yet (psoup.archive.batches): try again in a
    moment."""

    code = "history_pending"


class ArchiveError(PSoupError):
    """An archive or an input file that cannot be imported or replayed: unreadable or cut
    short, a missing or mistyped column, a NULL or NaN, timestamps out of tupleID order.
    The message names the file (and the column or tupleID) at fault."""

    code = "archive"


class ReplayError(PSoupError):
    """A replay refused before delivering anything (it would not append: see
    docs/durability.md, "Replay"), or stopped part way because the target rejected
    a batch or Spark failed.

    Attributes:
        rows_done: rows delivered before the failure (they stay in the target).
    """

    code = "replay"

    def __init__(self, message: str, rows_done: int = 0):
        super().__init__(message)
        self.rows_done = rows_done


class SequenceError(PSoupError, ValueError):
    """An insert whose (producer, seq) is neither that producer's next batch nor one of
    its last few batches (psoup.producers says the rule); the message names the
    producer, the seq expected and the seq received. Nothing was applied."""

    code = "sequence"


class Busy(PSoupError):
    """The server is applying as many bytes of earlier inserts as it may hold
    (`max_queued_bytes`), so it refused this one: nothing was applied. Send it again
    after `retry_after` seconds (the client does, for up to its `busy_timeout`)."""

    code = "busy"

    def __init__(self, message: str, retry_after: float = 1.0):
        super().__init__(message)
        self.retry_after = retry_after
