"""`psoup ingest`: files of tuples (CSV, JSON lines, Parquet) as column batches for a stream.

A producer's file becomes a sequence of batches of at most `batch_rows` rows, each a dict
of column -> numpy array (numbers, booleans) or list of str (text), the fast path of
`insert` (docs/api.md). The server applies each batch whole or not at all, so a bad batch
stops the ingest with an exact account: how many rows went in before it, and which rows
it held.

Types: Parquet columns keep their types. JSON values keep theirs (a column of integers
and floats becomes FLOAT). CSV cells are text: a column the stream declares TEXT stays
text (zip codes stay "02134"); any other column of each batch becomes INT if every cell
parses as an integer, else FLOAT if every cell parses as a number, else BOOL if every
cell is true or false (any case), else TEXT. The stream's schema decides what is
accepted: the server rejects a batch whose column does not fit and names the row.

The timestamp column (`ts` unless told otherwise), when the file has one, becomes the
tuples' ts: seconds since the epoch, or ISO 8601 date-times (UTC unless they carry an
offset). Without it the server's clock stamps each batch.

Exactly once: the client keys every batch with its producer id and a batch number
(psoup.producers), so a batch resent after a lost reply or a server restart is applied
once. A `ResumeFile` keeps the producer id of an ingest of a named file, so
`psoup ingest --resume` continues after the last batch the server applied. Ctrl-C waits
for the reply to the batch in flight, so an interrupted ingest knows what is stored.

Progress: a `Position` follows how far through the input the batches handed out reach
(not how far the readers have read ahead), and `RateMeter` makes the line a terminal
shows from it: rows, rows/s and the time left at the pace of the last seconds.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import io
import json
import math
import os
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Set
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from types import FrameType
from typing import IO, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from psoup.client import ConnectionFailed, OutcomeUnknown
from psoup.config import config_dir, write_private
from psoup.errors import Busy, DiskFull, PSoupError
from psoup.formats import TS_UNITS, compression

_CSV_BLOCK = 1 << 20          # bytes per CSV read; batches are cut from blocks by row count
_BOOLS = pa.array(["true", "false"])


class IngestError(PSoupError):
    """An ingest stopped: the input could not be read, or the server rejected a batch.

    Attributes:
        rows_done: rows applied before the failure (all of them stay in the stream).
        resumable: the same ingest with --resume can continue (the server was away,
            busy or out of disk space, or the ingest was interrupted); else the input
            or the stream has to change first (a rejected batch, bad input).
    """

    code = "ingest"

    def __init__(self, message: str, rows_done: int, resumable: bool = False):
        super().__init__(message)
        self.rows_done = rows_done
        self.resumable = resumable


class IngestInterrupted(IngestError):
    """Ctrl-C stopped an ingest between batches, or (a second Ctrl-C) while one was in
    flight.

    Attributes:
        rows_done: input rows stored, counted from the first row of the input (a resumed
            ingest's skipped rows included).
        in_doubt: the batch in flight, e.g. "batch 3 (input rows 7-9)", when the
            interruption came before its reply: it may or may not have been applied.
        exact: False when a resumed ingest was stopped before it had read past the rows
            already stored: then more than `rows_done` are.
    """

    def __init__(self, rows_done: int, in_doubt: str | None = None, exact: bool = True):
        doubt = f"; {in_doubt}, in flight, may or may not have been applied" \
            if in_doubt else ""
        least = "" if exact else "at least "
        super().__init__(f"interrupted: {least}{rows_done:,} input rows were stored{doubt}",
                         rows_done, resumable=True)
        self.in_doubt = in_doubt
        self.exact = exact


@dataclass
class IngestReport:
    """What an ingest did: rows applied, batches sent, wall seconds, and the rows a
    resumed ingest found already stored (not sent again)."""

    rows: int
    batches: int
    seconds: float
    skipped: int = 0

    @property
    def rate(self) -> float:
        return self.rows / max(self.seconds, 1e-9)


class Position:
    """How far through its input the batches `read_batches` has handed out reach.

    `done` is in bytes of the file as stored (compressed, if it is), for Parquet in
    rows; the reader sets it before it hands out each batch. `total` is the input's
    size in the same unit (None: unknown, as for stdin). `tell` gives the file's
    position (None: the reader counts the bytes it takes from its stream).

    A reader may be well ahead of `done`: Arrow's CSV reader reads blocks ahead of the
    rows it has parsed, so the file's own position says how much was read, not how much
    went out.
    """

    def __init__(self, total: int | None = None, tell: Callable[[], int] | None = None):
        self.total = total
        self.tell = tell
        self.done = 0


class RateMeter:
    """The progress line of an ingest: rows sent, rows/s, and when the input's size is
    known the share of it consumed and the time left (the input left at the rate it was
    consumed lately).

    Rates are measured over the last `window` seconds (between the last two samples, if
    further apart), so they follow the pace of the moment, not of the start.

    Example:
        >>> now = [0.0]
        >>> meter = RateMeter(1000, clock=lambda: now[0])
        >>> now[0] = 2.0
        >>> meter.update(500, 200)
        '500 rows  20%  ETA 00:00:08  250 rows/s'
    """

    def __init__(self, total: int | None, clock: Callable[[], float] = time.monotonic,
                 window: float = 10.0):
        self.total = total or None
        self._clock = clock
        self._window = window
        self._samples: deque[tuple[float, int, int]] = deque()
        self.restart(0)

    def restart(self, done: int) -> None:
        """Measure from now on, with `done` of the input consumed and no row sent (a
        resumed ingest, once past the rows it skipped)."""
        self._samples = deque([(self._clock(), 0, done)])

    def update(self, rows: int, done: int) -> str:
        """The line once `rows` rows are sent and `done` of the input consumed."""
        now = self._clock()
        self._samples.append((now, rows, done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window:
            self._samples.popleft()
        return self.line()

    def line(self) -> str:
        (then, rows_then, done_then), (now, rows, done) = self._samples[0], self._samples[-1]
        span = now - then
        rate = f"{(rows - rows_then) / span:,.0f}" if span > 0 else "?"
        if self.total is None:
            return f"{rows:,} rows  {rate} rows/s"
        left = max(self.total - done, 0)
        speed = (done - done_then) / span if span > 0 else 0.0
        eta = "?" if left and speed <= 0 else _hms(left / speed if left else 0)
        # floored: 100% only once the whole input is consumed
        share = min(done, self.total) * 100 // self.total
        return f"{rows:,} rows  {share}%  ETA {eta}  {rate} rows/s"


def _hms(seconds: float) -> str:
    """Seconds as hours:minutes:seconds (hours past 24 too), rounded up: 00:00:00 only
    when nothing is left.

    Example:
        >>> _hms(90061.4)
        '25:01:02'
    """
    whole = math.ceil(seconds)
    return f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def read_batches(source: str | IO[bytes], fmt: str, batch_rows: int,
                 declared: dict[str, str] | None = None,
                 path: str | None = None,
                 position: Position | None = None) -> Iterator[dict[str, Any]]:
    """Batches of at most `batch_rows` rows from a file name or binary stream.

    `declared` (column -> psoup type, from the server's stats) keeps CSV columns the
    stream declares TEXT as text. `path`, the file a stream `source` reads, lets an error
    in a CSV input name its line (the file is read again to find it). `position`, if
    given, follows how far through the input the batches handed out reach (for a file
    name it learns the file's size and position itself).

    Each batch maps column name -> numpy array or list; every column has the same length.
    Errors in the input raise IngestError (rows_done 0: the caller knows the real count).
    """
    readers: dict[str, Callable[[str | IO[bytes], int, Position],
                                Iterator[dict[str, Any]]]]
    readers = {"csv": partial(_csv_batches, text={c for c, t in (declared or {}).items()
                                                   if t == "text"},
                              path=source if isinstance(source, str) else path),
               "jsonl": _jsonl_batches, "parquet": _parquet_batches}
    try:
        yield from readers[fmt](source, batch_rows, position or Position())
    except (pa.ArrowException, ValueError, UnicodeDecodeError) as exc:
        raise IngestError(f"bad {fmt} input: {exc}", 0) from None


def ingest(client: Any, stream: str, batches: Iterator[dict[str, Any]],
           ts_column: str = "ts", ts_required: bool = False,
           progress: Callable[[int, float], None] | None = None, skip: int = 0,
           applied: Callable[[int, int], None] | None = None,
           ts_unit: str = "s", declared: Set[str] | None = None) -> IngestReport:
    """Send `batches` to `stream` one insert each; the ts column, if present, becomes ts.

    Args:
        client: a `psoup.client.Client` (anything with insert(stream, columns, ts)).
        stream: the stream's name.
        batches: from `read_batches`.
        ts_column: the column holding timestamps; when the input has none, the server's
            clock stamps each batch.
        ts_required: the input must have `ts_column` (the user named it).
        ts_unit: the unit of numeric timestamps: "s", "ms", "us" or "ns" (converted to
            seconds, which psoup takes).
        progress: called after each batch sent with (rows sent so far, seconds so far),
            and by a resumed ingest once with (0, seconds) when it has read past the
            skipped batches and starts sending.
        skip: non-empty batches at the start that are already stored (a resumed
            ingest): read, counted in `skipped`, not sent.
        applied: called after each stored batch with (batches, rows) of the input so
            far, the skipped ones included.
        declared: the stream's columns, when known: the input's columns are checked
            against them before anything is sent.

    Ctrl-C (SIGINT, in the main thread) while a batch is in flight is held until its
    reply is in, so that the batch is known to be applied or not; a second one is not
    held.

    Raises:
        IngestError: a batch was rejected, its outcome stayed unknown, or the input broke
            off; the message says how many rows were ingested before and which rows of the
            input the batch held.
        IngestInterrupted: Ctrl-C (KeyboardInterrupt); it says how many rows are stored.
    """
    began = time.perf_counter()
    tally = _Tally()
    flight = _Flight()
    try:
        with flight.armed():
            while (batch := _next_batch(batches, tally.rows)) is not None:
                n = len(next(iter(batch.values()))) if batch else 0
                if n == 0:
                    continue
                if tally.count == 0:
                    _check_columns(stream, list(batch), declared, ts_column, ts_required)
                if tally.count < skip:
                    tally.add(n, skipped=True)
                    continue
                if progress is not None and skip and tally.count == skip:
                    progress(0, time.perf_counter() - began)
                with flight.carrying(f"batch {tally.count + 1} (input rows "
                                     f"{tally.rows + 1:,}-{tally.rows + n:,})"):
                    _send(client, stream, batch, ts_column, ts_unit, flight.batch, tally.rows)
                    flight.landed()
                    tally.add(n)
                    if applied is not None:
                        applied(tally.count, tally.rows)
                if flight.held:
                    raise KeyboardInterrupt
                if progress is not None:
                    progress(tally.rows - tally.skipped, time.perf_counter() - began)
    except KeyboardInterrupt:
        raise IngestInterrupted(tally.rows, flight.batch if flight.doubt else None,
                                exact=tally.count >= skip) from None
    return IngestReport(tally.rows - tally.skipped, max(tally.count - skip, 0),
                        time.perf_counter() - began, tally.skipped)


@dataclass
class _Tally:
    """The input an ingest has got through: batches and rows, the skipped ones (stored
    by the run a resumed ingest continues) included."""

    count: int = 0
    rows: int = 0
    skipped: int = 0

    def add(self, n: int, skipped: bool = False) -> None:
        self.count += 1
        self.rows += n
        if skipped:
            self.skipped += n


class _Flight:
    """Ctrl-C while a batch is in flight: held until the batch's reply is in (then the
    batch is known to be stored or not); a second Ctrl-C, or one between batches,
    interrupts at once."""

    def __init__(self) -> None:
        self.batch = ""              # the batch in flight, or the last one sent
        self.active = False          # from sending a batch to its bookkeeping done
        self.sending = False         # from sending a batch to its reply
        self.held = False            # a Ctrl-C came while a batch was in flight
        self.doubt = False           # an interruption cut a batch's round trip short

    @contextmanager
    def armed(self) -> Iterator[None]:
        """Hold SIGINT while a batch is in flight, if this is the main thread and SIGINT
        raises KeyboardInterrupt as usual (a caller's own handler is left alone)."""
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            yield
            return
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if not self.active or self.held:
            raise KeyboardInterrupt
        self.held = True

    @contextmanager
    def carrying(self, batch: str) -> Iterator[None]:
        """`batch` in flight: from sending it (`landed` once its reply is in) to the
        bookkeeping after it."""
        self.batch, self.active, self.sending = batch, True, True
        try:
            yield
        except KeyboardInterrupt:
            self.doubt = self.sending
            raise
        finally:
            self.active = self.sending = False

    def landed(self) -> None:
        self.sending = False


def _next_batch(batches: Iterator[dict[str, Any]], rows: int) -> dict[str, Any] | None:
    """The next batch of the input (None at its end), its errors saying where they are."""
    try:
        return next(batches, None)
    except IngestError as exc:
        raise IngestError(f"{exc} (somewhere after input row {rows:,}; {rows:,} rows "
                          "ingested before it)", rows) from None


def _send(client: Any, stream: str, batch: dict[str, Any], ts_column: str, ts_unit: str,
          where: str, rows: int) -> None:
    """Insert one batch, `where` in the input, after `rows` rows stored; failures as
    IngestError saying what is stored and whether --resume can continue."""
    try:
        ts = timestamps(batch.pop(ts_column), ts_unit) if ts_column in batch else None
        client.insert(stream, batch, ts=ts)
    except OutcomeUnknown as exc:
        raise IngestError(
            f"{where}: the server did not answer, so it may or may not have been "
            f"applied; {rows:,} rows were ingested before it. Run the same command "
            f"with --resume to continue without duplicating: {exc}", rows,
            resumable=True) from None
    except ConnectionFailed as exc:
        raise IngestError(f"{where} could not be sent, none of it applied; {rows:,} "
                          f"rows ingested before it: {exc}", rows, resumable=True) from None
    except DiskFull as exc:         # refused until space is freed, not for good
        raise IngestError(
            f"{where} was refused, none of it applied; {rows:,} rows ingested before it: "
            f"{exc}. Once space is freed there, run the same command with --resume to "
            "continue", rows, resumable=True) from None
    except PSoupError as exc:
        raise IngestError(          # a busy server refuses for a while, not for good
            f"{where} was rejected, none of it applied; {rows:,} rows ingested before "
            f"it: {_input_rows(str(exc), rows)}{_text_hint(batch, str(exc), rows)}",
            rows, resumable=isinstance(exc, Busy)) from None


class ResumeFile:
    """Where an ingest of a named file keeps what `--resume` needs: its producer id and
    how far it got. One file per (stream, file path, file size, batch rows), under the
    config directory (a file that changed size is a new input). `psoup ingest` removes
    it when the ingest completes or is refused, and keeps it when --resume can continue
    (IngestError.resumable).

    The server's last applied seq of the producer says where to resume; the file's own
    count (written after each batch) only tells how seqs map to batches when the client
    had to split one.
    """

    def __init__(self, stream: str, file: str, batch_rows: int):
        real = os.path.realpath(file)
        key = f"{stream}\0{real}\0{os.path.getsize(real)}\0{batch_rows}"
        self.path = config_dir() / "ingest" / (hashlib.sha256(key.encode()).hexdigest()[:32]
                                               + ".json")
        self.describe = f"{file} into {stream} with --batch-rows {batch_rows}"

    def start(self, producer: str) -> None:
        self.save({"producer": producer, "batches": 0, "next_seq": 0})

    def load(self) -> dict[str, Any]:
        """The saved state; IngestError when there is nothing to resume."""
        try:
            state: dict[str, Any] = json.loads(self.path.read_text())
            return state
        except FileNotFoundError:
            raise IngestError(f"nothing to resume: no unfinished ingest of {self.describe} "
                              "(it completed, or never started here)", 0) from None
        except ValueError as exc:
            raise IngestError(f"the resume state {self.path} is damaged: {exc}", 0) from None

    def save(self, state: dict[str, Any]) -> None:
        write_private(self.path, json.dumps(state))

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    @staticmethod
    def resume_point(state: dict[str, Any], last_seq: int) -> int:
        """The batches of the input already stored, given the server's last seq of the
        producer.

        Example:
            >>> ResumeFile.resume_point({"batches": 3, "next_seq": 3}, 4)
            5
        """
        batches, next_seq = int(state["batches"]), int(state["next_seq"])
        if last_seq + 1 < next_seq:
            raise IngestError(f"the server remembers batch {last_seq} as this ingest's last, "
                              f"but {next_seq} were stored: it forgot the producer (a server "
                              "without its data directory, or too many producers since); "
                              "resuming could duplicate rows", 0)
        if next_seq == batches:          # one seq per batch so far: seq = batch number
            return last_seq + 1
        if last_seq + 1 == next_seq:
            return batches
        raise IngestError("cannot tell where to resume: a batch was split and the server "
                          f"applied seq {last_seq} after batch {batches}", 0)


def _check_columns(stream: str, columns: list[str], declared: Set[str] | None,
                   ts_column: str, ts_required: bool) -> None:
    """Refuse an input whose columns are not the stream's (plus the timestamp column),
    naming each stray and missing one, and suggesting --ts-column when the input has
    no `ts_column` but has a column that is not the stream's.

    Example:
        >>> _check_columns("s", ["a", "time"], {"a"}, "ts", False)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        psoup.cli.ingest.IngestError: the input has no ... pass --ts-column time
    """
    extra = [] if declared is None else [c for c in columns
                                         if c not in declared and c != ts_column]
    if ts_column not in columns and (ts_required or extra):
        guess = ([c for c in extra if any(w in c.lower() for w in ("time", "date", "ts"))]
                 or extra)[:1]
        if guess:
            raise IngestError(f"the input has no timestamp column '{ts_column}' but a column "
                              f"'{guess[0]}' that stream '{stream}' does not have: if it "
                              f"holds the timestamps, pass --ts-column {guess[0]}", 0)
        raise IngestError(f"the input has no timestamp column '{ts_column}' (columns: "
                          f"{', '.join(columns)})", 0)
    if extra:
        missing = sorted(set(declared or ()) - set(columns))
        lacks = f"; it lacks {', '.join(missing)}" if missing else ""
        raise IngestError(f"the input has column{'s' * (len(extra) > 1)} "
                          f"{', '.join(map(repr, extra))}, which stream '{stream}' does not "
                          f"have (its "
                          f"columns: {', '.join(sorted(declared or ()))}{lacks}); remove "
                          f"{'them' if len(extra) > 1 else 'it'} from the input or add "
                          f"{'them' if len(extra) > 1 else 'it'} to the stream", 0)


def _input_rows(message: str, before: int) -> str:
    """The server's `message` about an insert with its rows (counted from 0 in the
    insert, as Python indexes a list) named as input rows (counted from 1 in the file),
    the way every other ingest message counts them.

    Example:
        >>> _input_rows("stream 's', row 1: ts 2.0 is older than row 0's ts 3.0", 6)
        "stream 's', input row 8: ts 2.0 is older than input row 7's ts 3.0"
        >>> _input_rows("x (in rows 2..3 of an insert of 5; rows 0..1 were stored)", 0)
        'x (in input rows 3-4 of an insert of 5; input rows 1-2 were stored)'
    """
    def shown(match: re.Match[str]) -> str:
        first = f"input {match[1]} {before + int(match[2]) + 1:,}"
        return first if match[3] is None else f"{first}-{before + int(match[3]) + 1:,}"
    return _INSERT_ROWS.sub(shown, message)


_INSERT_ROWS = re.compile(r"(?<!input )\b(rows?) (\d+)(?:\.\.(\d+))?\b")


def _text_hint(batch: dict[str, Any], message: str, before: int) -> str:
    """Where a CSV column that went as TEXT stops looking numeric, when the server's
    `message` is about that column: the server names the first str it met, which is
    usually a good cell; the user needs the bad one."""
    for name, values in batch.items():
        if not (isinstance(values, list) and f"column '{name}'" in message):
            continue
        numeric = [_is_number(v) for v in values]
        if any(numeric) and not all(numeric):
            bad = numeric.index(False)
            return (f" (column '{name}' was read as text: input row {before + bad + 1:,} "
                    f"holds {values[bad]!r})")
    return ""


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def timestamps(values: Any, unit: str = "s") -> np.ndarray:
    """A timestamp column as float seconds since the epoch.

    Accepts numbers (in `unit`: s, ms, us or ns), or ISO 8601 strings all without an
    offset (read as UTC) or all with one.

    Raises:
        IngestError: values that are neither.

    Example:
        >>> timestamps(["2026-01-01T00:00:01.5", "2026-01-01 00:00:02"]).tolist()
        [1767225601.5, 1767225602.0]
        >>> timestamps(["2026-01-01T01:00:00+01:00"]).tolist()
        [1767225600.0]
        >>> timestamps(np.array([5, 6])).tolist()
        [5.0, 6.0]
        >>> timestamps(np.array([1795353067184]), "ms").tolist()
        [1795353067.184]
    """
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        return values.astype(np.float64) / TS_UNITS[unit] if unit != "s" else \
            values.astype(np.float64)
    if all(isinstance(v, str) for v in values):
        if unit != "s":
            raise IngestError(f"--ts-unit {unit} is for numeric timestamps; these are "
                              f"date-times (e.g. {values[0]!r}), which carry their own", 0)
        arr = pa.array(values, type=pa.string())
        for target in (pa.timestamp("us"), pa.timestamp("us", tz="UTC")):
            try:
                return _epoch_seconds(pc.cast(arr, target))
            except pa.ArrowInvalid:
                pass
    sample = next((v for v in values if not isinstance(v, (int, float))), values[0])
    raise IngestError(f"timestamps must be numbers of seconds or ISO 8601 date-times "
                      f"(all with a UTC offset or all without); got {sample!r}", 0)


def _epoch_seconds(arr: pa.Array) -> NDArray[np.float64]:
    micros = pc.cast(pc.cast(arr, pa.timestamp("us", tz=arr.type.tz)), pa.int64())
    return cast(NDArray[np.float64], micros.to_numpy(zero_copy_only=False) / 1e6)


# ---------------------------------------------------------------------- readers

def decompressed(raw: IO[bytes], codec: str | None) -> IO[bytes]:
    """The bytes of `raw` decompressed with `codec` (psoup.formats.COMPRESSIONS; None:
    `raw` itself). Reading it moves `raw.tell()`, which is how far through the file an
    ingest has got. Closing it leaves `raw` open.

    Example:
        >>> import io
        >>> decompressed(io.BytesIO(gzip.compress(b"ts,a\\n1,2\\n")), "gzip").readline()
        b'ts,a\\n'
    """
    if codec is None:
        return raw
    if codec == "gzip":
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))
    if codec == "bz2":
        return cast(IO[bytes], bz2.BZ2File(raw))
    return io.BufferedReader(pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), codec))


@contextmanager
def _open(source: str | IO[bytes], position: Position | None = None) -> Iterator[IO[bytes]]:
    """A file name opened (and decompressed by suffix), or a caller's stream left open.
    A `position` without a `tell` learns the opened file's size and position."""
    if not isinstance(source, str):
        yield source
        return
    with open(source, "rb") as raw, decompressed(raw, compression(source)) as stream:
        if position is not None and position.tell is None:
            position.tell = raw.tell
            position.total = position.total or os.fstat(raw.fileno()).st_size
        yield stream


class _Marked(io.RawIOBase):
    """A stream for Arrow's CSV reader that notes, after each read, how far through the
    input it is. Arrow reads in a thread, blocks ahead of the batches it hands out, one
    read per block: the block it hands out next ends at the oldest mark not taken."""

    def __init__(self, stream: IO[bytes], tell: Callable[[], int] | None, header: int):
        super().__init__()
        self._stream = stream
        self._tell = tell
        self._read = header              # the position, when there is no `tell`
        self._marks: deque[int] = deque()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self._read += len(data)
        self._marks.append(self.now())
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def now(self) -> int:
        """The input's position now (past what Arrow has read ahead)."""
        return self._tell() if self._tell is not None else self._read

    def next_block_end(self) -> int:
        """Where the block Arrow hands out next ends in the input."""
        return self._marks.popleft() if self._marks else self.now()


def _csv_batches(source: str | IO[bytes], batch_rows: int, position: Position,
                 text: Set[str] = frozenset(),
                 path: str | None = None) -> Iterator[dict[str, Any]]:
    import pyarrow.csv as pcsv

    with _open(source, position) as stream:
        header = stream.readline()
        if not header.strip():
            return
        names = next(csv.reader([header.decode("utf-8-sig")]))
        if len(set(names)) != len(names) or not all(names):
            raise ValueError(f"the CSV header needs distinct, non-empty column names; "
                             f"got {names}")
        # Every column is read as text and typed per batch (module docstring): Arrow's own
        # inference looks at the first block only and fails on a later "62.5" in an INT guess.
        pending: list[pa.RecordBatch] = []
        held = done = 0
        marked = _Marked(stream, position.tell, len(header))
        start = end = marked.now()     # the input the rows held span (spread evenly)
        try:
            for block in pcsv.open_csv(   # reads its first block at once
                    marked,
                    read_options=pcsv.ReadOptions(column_names=names, block_size=_CSV_BLOCK),
                    convert_options=pcsv.ConvertOptions(
                        column_types={n: pa.string() for n in names})):
                pending.append(block)
                held += block.num_rows
                end = marked.next_block_end()
                while held >= batch_rows:
                    table = pa.Table.from_batches(pending)
                    start += (end - start) * batch_rows // held
                    position.done = start
                    yield _typed_csv(table.slice(0, batch_rows), text, path, done)
                    done += batch_rows
                    rest = table.slice(batch_rows)
                    pending, held = rest.to_batches(), rest.num_rows
        except pa.ArrowInvalid as exc:
            if not str(exc).startswith("CSV parse error") or path is None:
                raise
            raise ValueError(_ragged_row(path, len(names)) or str(exc)) from None
        if held:
            position.done = end
            yield _typed_csv(pa.Table.from_batches(pending), text, path, done)


def _ragged_row(path: str, fields: int) -> str | None:
    """Which line of CSV file `path` has a number of cells other than `fields` (read
    again, by Python's csv module: only after Arrow has failed, which does not say)."""
    with _open(path) as stream:
        rows = csv.reader(io.TextIOWrapper(stream, encoding="utf-8-sig", newline=""))
        next(rows, None)
        for row in rows:
            if row and len(row) != fields:
                return (f"line {rows.line_num} has {len(row)} cell{'s' * (len(row) != 1)}, "
                        f"the header {fields}: {','.join(row)!r}")
    return None


def _csv_line(path: str | None, row: int) -> str:
    """Where data row `row` (0-based) of a CSV input is: its line in file `path` (read
    again, as a cell may span lines), else its row number."""
    if path is not None:
        with _open(path) as stream:
            rows = csv.reader(io.TextIOWrapper(stream, encoding="utf-8-sig", newline=""))
            next(rows, None)
            for number, _ in enumerate(rows):
                if number == row:
                    return f"line {rows.line_num}"
    return f"row {row + 1:,} after the header"


def _typed_csv(table: pa.Table, text: Set[str], path: str | None,
               before: int) -> dict[str, Any]:
    """A batch of CSV rows (rows `before`.. of the input) typed per column; an empty
    cell of a column that is not TEXT raises ValueError naming its line and column."""
    for name in table.column_names:
        if name in text:
            continue
        empty = pc.equal(table.column(name), "")
        if pc.any(empty).as_py():
            first = pc.index(empty, True).as_py()
            raise ValueError(f"{_csv_line(path, before + first)}, column '{name}': an "
                             f"empty cell, and psoup has no NULLs: every row needs a value "
                             f"in every column (or drop the column if the stream lacks it)")
    return {name: (table.column(name).to_pylist() if name in text
                   else _typed_text(table.column(name).combine_chunks()))
            for name in table.column_names}


def _typed_text(arr: pa.Array) -> Any:
    for target in (pa.int64(), pa.float64()):
        try:
            return pc.cast(arr, target).to_numpy()
        except pa.ArrowInvalid:
            pass
    lowered = pc.utf8_lower(arr)
    if len(arr) and pc.all(pc.is_in(lowered, value_set=_BOOLS)).as_py():
        return pc.equal(lowered, "true").to_numpy(zero_copy_only=False)
    return arr.to_pylist()


def _jsonl_batches(source: str | IO[bytes], batch_rows: int,
                   position: Position) -> Iterator[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with _open(source, position) as stream:
        for number, raw in enumerate(stream, 1):
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"line {number}: not JSON ({exc.msg}, column {exc.colno})") \
                    from None
            if not isinstance(row, dict):
                raise ValueError(f"line {number}: expected a JSON object per line, got "
                                 f"{type(row).__name__}")
            if rows and row.keys() != rows[0].keys():
                differ = sorted(set(rows[0]) ^ set(row))
                raise ValueError(f"line {number}: its keys differ from those of the lines "
                                 f"before it (not in both: {', '.join(differ)})")
            rows.append(row)
            if len(rows) == batch_rows:
                _reached(position)
                yield _json_columns(rows)
                rows = []
        if rows:
            _reached(position)
            yield _json_columns(rows)


def _reached(position: Position) -> None:
    """The reader's position as the input consumed, where it has one (not a pipe)."""
    if position.tell is not None:
        position.done = position.tell()


def _json_columns(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {name: _typed_values([r[name] for r in rows]) for name in rows[0]}


def _typed_values(values: list[Any]) -> Any:
    types = set(map(type, values))
    if types == {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            return values
    if types <= {int, float}:
        return np.array(values, dtype=np.float64)
    if types == {bool}:
        return np.array(values, dtype=bool)
    return values


def _parquet_batches(source: str | IO[bytes], batch_rows: int,
                     position: Position) -> Iterator[dict[str, Any]]:
    """The batches of a Parquet file, `position` counted in rows (its footer has the
    total: the file's bytes are pages of compressed columns, read in row groups)."""
    import pyarrow.parquet as pq

    if not isinstance(source, str):
        source = pa.BufferReader(source.read())      # Parquet needs to seek: its footer
    parquet = pq.ParquetFile(source)
    position.total = position.total or parquet.metadata.num_rows
    for batch in parquet.iter_batches(batch_size=batch_rows):
        position.done += batch.num_rows
        yield {name: _typed_arrow(batch.column(i)) for i, name in enumerate(batch.schema.names)}


def _typed_arrow(arr: pa.Array) -> Any:
    kind = arr.type
    if arr.null_count:
        return arr.to_pylist()         # None is no psoup value: the server names the row
    if pa.types.is_timestamp(kind):
        return _epoch_seconds(arr)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return arr.to_numpy(zero_copy_only=False)
    if pa.types.is_dictionary(kind):
        return arr.dictionary_decode().to_pylist()
    return arr.to_pylist()
