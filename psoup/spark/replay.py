"""Replay: archived tuples delivered to a live engine in timestamp order (issue 6).

"Remembrance of Streams Past" (Sect. 5) feeds a stream's history back through the
operators that process it live. Here those operators are psoup's own: a Spark job reads
the archive (psoup.archive.parquet's layout), keeps a time range, and hands the rows, in
(ts, archived tupleID) order, to `insert` of an `Engine` or a `Client`, so every
standing query sees them through the same eddy path as live data (docs/design.md,
"Archive and history", route (a)). The target stamps fresh tupleIDs; archived ones only
order ties.

Three stages; nothing is delivered unless the first two succeed:

1. **plan** (`plan_replay`, psoup's process, pyarrow): list the part files of the
   requested streams; check each footer against the target stream's schema; scan every
   file that overlaps the time range, decoding each column once: no NULLs, no NaN,
   tupleIDs increasing, ts non-decreasing in tupleID order within and across files. The
   scan keeps every k-th timestamp in the range, which cuts the range into *slices* of
   about `slice_rows` rows. Every row reaches psoup anyway; checking the order in Spark
   instead (a window over tupleIDs per file) cost more than the replay's own read on a
   2-core machine, psoup's scan about a twentieth of it.
2. **the ordering rule**: replay only appends. A stream that already holds data up to
   ts L takes replayed rows with ts >= L only; a range (or, without `start`, an archive)
   that begins before L is refused, naming the stream and L (docs/durability.md, "Replay").
   `resume` starts each stream at its own L instead and skips as many of the archive's
   rows at L as the target holds there (it counts every row it stored at its latest ts:
   `rows_at_latest_ts` in stats), so a replay that stopped part way continues exactly.
3. **deliver** (`ordered_runs`): per slice and stream, Spark's executors read the
   slice, sort each of their partitions by (ts, tupleID) and write it as Parquet to a
   staging folder (`.replay/` in the archive directory); psoup reads those files, one
   slice in memory at a time, merges them in (ts, tupleID) order (taking the files in
   the order of their first rows is the whole merge when their ranges do not
   interleave, as the archive's files do not), removes them, merges the streams, and
   inserts runs of at most `batch_rows` rows. No row passes through Spark's driver,
   whose JVM grew with the slices it collected (`toArrow`) before. Merging in psoup,
   which holds the slice anyway, beats Spark's global sort (a sampling job and a
   shuffle per slice, measured 2-3x slower than sorting the slice in psoup).

Spark starts (once, psoup.spark.session) only for stage 3, so a bad archive or a refused
range is reported in well under a second.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

from psoup.archive.layout import (
    ARROW_TYPES,
    PART_NAME,
    SPARK_TYPES,
    TS_COLUMN,
    TUPLE_ID_COLUMN,
    check_part,
    stream_columns,
)
from psoup.archive.sampling import in_order, is_sampled
from psoup.config import REPLAY_SLICE_ROWS
from psoup.errors import ArchiveError, PSoupError, ReplayError
from psoup.fsync import make_dir
from psoup.query.model import ColumnType
from psoup.spark.session import spark_error

#: Rows per slice: the most psoup holds at once (about; see `plan_replay`).
SLICE_ROWS = REPLAY_SLICE_ROWS
#: Rows per insert.
BATCH_ROWS = 1 << 16
#: Timestamps kept per slice by the scan; a slice's size is off by at most
#: slice_rows / _SAMPLES per stream.
_SAMPLES = 16
_SCAN_ROWS = 1 << 16


@dataclass
class Part:
    """One part file, and what the scan found of it in the time range."""

    path: Path
    first: int                    # the tupleIDs its name gives
    last: int
    rows: int = 0                 # rows in the range
    ts_lo: float = math.inf       # ts of its first and last row in the range
    ts_hi: float = -math.inf


@dataclass
class StreamPlan:
    """One stream of a replay: its schema, the target's state and the files to read."""

    name: str
    columns: list[tuple[str, ColumnType]]
    create: bool                  # the target lacks the stream: create it first
    latest_ts: float | None       # the target stream's latest ts (None: empty)
    start: float = -math.inf      # its rows with ts >= start are replayed ...
    skip: int = 0                 # ... but the first `skip` of them (resume)
    parts: list[Part] = field(default_factory=list)   # with rows in range, tupleID order
    rows: int = 0
    samples: list[np.ndarray] = field(default_factory=list)
    # of the rows scanned, for the ordering rule's message: how many have ts equal to
    # latest_ts, the first ts after it, and the last ts of all
    at_latest: int = 0
    after_latest: float = math.inf
    last_ts: float = -math.inf

    @property
    def first_ts(self) -> float | None:
        return self.parts[0].ts_lo if self.parts else None

    @property
    def begins(self) -> float | None:
        """The ts its replay starts at: `start` (--from, or the latest ts on resume),
        else its first row in range (None without one)."""
        return self.first_ts if self.start == -math.inf else self.start


@dataclass
class ReplayPlan:
    """What `replay` will deliver: checked streams and the slices of the time range."""

    streams: dict[str, StreamPlan]
    slices: list[tuple[float, float, bool]]   # [lo, hi), or [lo, hi] when the flag is set
    roots: list[Path] = field(default_factory=list)   # the archive directories, as given

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.streams.values())


@dataclass
class ReplayReport:
    """What a replay did: rows delivered (in all and per stream), inserts, wall seconds,
    and why nothing was, when the archive ends before `start`."""

    rows: int
    inserts: int
    seconds: float
    streams: dict[str, int]
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rows / max(self.seconds, 1e-9)


# ---------------------------------------------------------------------- stage 1: plan

def plan_replay(archives: Sequence[str | Path], targets: Mapping[str, Mapping[str, Any]],
                streams: Sequence[str] | None = None, start: float | None = None,
                end: float | None = None, slice_rows: int = SLICE_ROWS,
                resume: bool = False) -> ReplayPlan:
    """Check the archive and the ordering rule, and cut the time range into slices.

    Reads every part file that overlaps [start, end] once, with pyarrow: O(rows in the
    range + files). Touches neither Spark nor the target.

    Args:
        archives: archive roots (the layout of psoup.archive.parquet).
        targets: the target's streams, as in `Engine.stats()["streams"]`: name ->
            {"columns": {column: type}, "latest_ts": float or None,
            "rows_at_latest_ts": int}.
        streams: the streams to replay; None replays every stream in the archives.
        start, end: keep rows with start <= ts <= end (None: unbounded).
        slice_rows: about how many rows each slice holds. Rows with one ts are never
            split, so a slice grows past this when more rows than that share one ts.
        resume: continue where the target stops: each stream from its latest ts L on
            (or `start`, if later), skipping as many of the archive's rows at ts L as the
            target holds at L: those a replay that stopped part way delivered.

    Raises:
        ArchiveError: a file that is unreadable, mistyped, holds NULLs or NaN, or
            breaks tupleID / ts order (the message names it); an unknown stream.
        ReplayError: the ordering rule: the replay would not append.

    Example:
        >>> import tempfile
        >>> from psoup.archive.parquet import Archive
        >>> with tempfile.TemporaryDirectory() as d:
        ...     arc = Archive(d)
        ...     arc.add("R", [("a", "int")], {"ts": np.array([1.0, 2.0, 3.0]),
        ...             "tupleID": np.array([0, 1, 2]), "a": np.array([7, 8, 9])})
        ...     _ = arc.flush()
        ...     plan = plan_replay([d], {}, start=2.0)
        ...     plan.rows, plan.streams["R"].create, plan.streams["R"].first_ts
        (2, True, 2.0)
    """
    if slice_rows < 1:
        raise ValueError(f"slice_rows must be at least 1, not {slice_rows}")
    lo = -math.inf if start is None else float(start)
    hi = math.inf if end is None else float(end)
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ArchiveError(f"empty time range: from {start} to {end}")
    found: dict[str, list[Path]] = {}
    for root in archives:
        root = Path(root)
        if not root.is_dir():
            raise ArchiveError(f"{root}: no such archive directory")
        for name, paths in _parts_by_stream(root).items():
            found.setdefault(name, []).extend(paths)
    wanted = sorted(found) if streams is None else list(dict.fromkeys(streams))
    for name in wanted:
        if name not in found:
            where = ", ".join(str(a) for a in archives)
            raise ArchiveError(f"no stream '{name}' in {where} (streams there: "
                               f"{', '.join(sorted(found)) or 'none'})")
    every = max(1, slice_rows // _SAMPLES)
    plans = {name: _scan_stream(name, found[name], targets.get(name), lo, hi, every, resume)
             for name in wanted}
    _check_appends(plans)
    return ReplayPlan(plans, _slices(plans, every, slice_rows, lo, hi),
                      [Path(root) for root in archives])


def _parts_by_stream(root: Path) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for path in root.glob("stream=*/date=*/part-*.parquet"):
        if PART_NAME.match(path.name):
            out.setdefault(path.parent.parent.name[len("stream="):], []).append(path)
    return out


def _scan_stream(name: str, paths: list[Path], target: Mapping[str, Any] | None,
                 lo: float, hi: float, every: int, resume: bool) -> StreamPlan:
    parts = sorted((_part(p) for p in paths), key=lambda part: (part.first, part.last))
    for a, b in zip(parts, parts[1:], strict=False):
        if b.first <= a.last:
            raise ArchiveError(f"{b.path}: its tupleIDs {b.first}..{b.last} overlap those "
                               f"of {a.path} ({a.first}..{a.last})")
    columns: list[tuple[str, ColumnType]] | None
    if target is not None:          # Engine.stats(): the types by name over a connection
        columns = [(c, ColumnType(t)) for c, t in target["columns"].items()]
    else:
        with _open(parts[0].path) as pf:
            columns = stream_columns(pf.schema_arrow)
        if columns is None:
            raise ArchiveError(f"{parts[0].path}: no psoup schema in its metadata (key "
                               f"psoup.columns); create stream '{name}' on the target first")
    plan = StreamPlan(name, columns, target is None,
                      None if target is None else target.get("latest_ts"), lo)
    if resume and plan.latest_ts is not None and plan.latest_ts >= lo:
        assert target is not None
        plan.start, plan.skip = plan.latest_ts, int(target.get("rows_at_latest_ts", 0))
    scan = _Scan(name, columns, plan.start, hi, every, plan)
    for part in parts:
        with _open(part.path) as pf:
            check_part(pf.schema_arrow, part.path, name, columns)
            span = _ts_span(pf)
            if span is not None and (span[1] < lo or span[0] > hi):
                scan.skip(part, span)          # no row in range: its footer is enough
                continue
            try:
                for batch in _in_order(pf):
                    scan.batch(part, batch)
            except (pa.ArrowException, OSError) as exc:
                raise ArchiveError(f"{part.path}: damaged Parquet data ({exc})") from None
        if part.rows:
            plan.parts.append(part)
    plan.skip = min(plan.skip, plan.at_latest) if plan.start <= hi else 0
    plan.rows -= plan.skip
    return plan


def _part(path: Path) -> Part:
    match = PART_NAME.match(path.name)
    assert match is not None, "_parts_by_stream keeps only the files named as parts"
    return Part(path, *map(int, match.groups()))


def _open(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise ArchiveError(f"{path}: not a readable Parquet file ({exc})") from None


def _in_order(pf: pq.ParquetFile) -> Iterator[pa.RecordBatch]:
    """A part file's rows in tupleID order, in batches of at most _SCAN_ROWS: a file in
    the sampled layout (row groups each in tupleID order) is read whole and merged
    (psoup.archive.sampling.in_order), any other streamed as it is."""
    if not is_sampled(pf.schema_arrow):
        yield from pf.iter_batches(batch_size=_SCAN_ROWS)
        return
    yield from in_order(pf.read()).to_batches(max_chunksize=_SCAN_ROWS)


def _ts_span(pf: pq.ParquetFile) -> tuple[float, float] | None:
    """(min, max) ts from the footer's statistics; None when a row group lacks them."""
    meta = pf.metadata
    index = pf.schema_arrow.get_field_index(TS_COLUMN)
    lows, highs = [], []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if meta.row_group(g).num_rows == 0:
            continue
        if stats is None or not stats.has_min_max:
            return None
        lows.append(stats.min)
        highs.append(stats.max)
    return (min(lows), max(highs)) if lows else (math.inf, -math.inf)


class _Scan:
    """The order and value checks of one stream's files, batch by batch, and the
    sampling of its in-range timestamps."""

    def __init__(self, stream: str, columns: Sequence[tuple[str, ColumnType]], lo: float,
                 hi: float, every: int, plan: StreamPlan):
        self.stream, self.lo, self.hi, self.every, self.plan = stream, lo, hi, every, plan
        self.floats = [c for c, t in columns if t == ColumnType.FLOAT]
        self.last: tuple[float, int, Path] | None = None   # ts, tupleID, file of the last row

    def skip(self, part: Part, span: tuple[float, float]) -> None:
        if self.last is not None and span[0] < self.last[0]:
            self._decreasing(part.path, span[0], None)
        if span[1] >= span[0]:
            self.last = (span[1], part.last, part.path)
            plan = self.plan
            plan.last_ts = max(plan.last_ts, span[1])
            if plan.latest_ts is not None and span[0] > plan.latest_ts:
                plan.after_latest = min(plan.after_latest, span[0])

    def batch(self, part: Part, batch: pa.RecordBatch) -> None:
        self._check_nulls(part.path, batch)
        tids = batch.column(TUPLE_ID_COLUMN).to_numpy()
        ts = batch.column(TS_COLUMN).to_numpy()
        if not len(ts):
            return
        self._check_values(part, batch, ts, tids)
        self._check_order(part.path, ts, tids)
        self.last = (float(ts[-1]), int(tids[-1]), part.path)
        self._count_latest(ts)
        self._sample(part, ts)

    @staticmethod
    def _check_nulls(path: Path, batch: pa.RecordBatch) -> None:
        tids = batch.column(TUPLE_ID_COLUMN)
        for column, values in zip(batch.schema.names, batch.columns, strict=True):
            if values.null_count:
                row = int(pc.index(pc.is_null(values), True).as_py())
                where = f" at tuple_id {tids[row]}" if column != TUPLE_ID_COLUMN else ""
                raise ArchiveError(f"{path}: column '{column}' is NULL{where} (psoup has "
                                   "no NULLs)")

    def _check_values(self, part: Part, batch: pa.RecordBatch, ts: NDArray[np.float64],
                      tids: NDArray[np.int64]) -> None:
        """Finite ts, no NaN in a FLOAT column, and tupleIDs in the range the part's
        name gives."""
        path = part.path
        bad = np.flatnonzero(~np.isfinite(ts))
        if len(bad):
            raise ArchiveError(f"{path}: ts {ts[bad[0]]} at tuple_id {tids[bad[0]]} is not a "
                               "finite number of seconds")
        for column in self.floats:
            nan = np.flatnonzero(np.isnan(batch.column(column).to_numpy()))
            if len(nan):
                raise ArchiveError(f"{path}: column '{column}' is NaN at tuple_id "
                                   f"{tids[nan[0]]} (NaN is not a value: psoup has no NULLs)")
        outside = np.flatnonzero((tids < part.first) | (tids > part.last))
        if len(outside):
            raise ArchiveError(f"{path}: holds tuple_id {tids[outside[0]]}, outside the "
                               f"range {part.first}..{part.last} its name gives")

    def _check_order(self, path: Path, ts: NDArray[np.float64],
                     tids: NDArray[np.int64]) -> None:
        """Increasing tupleIDs and non-decreasing ts, from the last row read on."""
        prev_ts, prev_tid = (self.last[0], self.last[1]) if self.last else (-math.inf, -1)
        up = np.flatnonzero(np.diff(tids, prepend=prev_tid) <= 0)
        if len(up):
            i = up[0]
            raise ArchiveError(f"{path}: tuple_ids do not increase: {tids[i]} follows "
                               f"{tids[i - 1] if i else prev_tid}")
        down = np.flatnonzero(np.diff(ts, prepend=prev_ts) < 0)
        if len(down):
            i = down[0]
            before = None if i == 0 else (float(ts[i - 1]), int(tids[i - 1]))
            self._decreasing(path, ts[i], int(tids[i]), before)

    def _count_latest(self, ts: NDArray[np.float64]) -> None:
        plan = self.plan
        plan.last_ts = max(plan.last_ts, float(ts[-1]))
        if plan.latest_ts is not None:
            at, after = np.searchsorted(ts, plan.latest_ts, "left"), \
                np.searchsorted(ts, plan.latest_ts, "right")
            plan.at_latest += int(after - at)
            if after < len(ts):
                plan.after_latest = min(plan.after_latest, float(ts[after]))

    def _sample(self, part: Part, ts: NDArray[np.float64]) -> None:
        """Every `every`-th in-range timestamp, counted across batches."""
        plan = self.plan
        a, b = np.searchsorted(ts, self.lo, "left"), np.searchsorted(ts, self.hi, "right")
        if a >= b:
            return
        first = a + (-plan.rows) % self.every     # in-range ranks 0, every, 2*every, ...
        if first < b:
            plan.samples.append(ts[first:b:self.every].copy())
        plan.rows += int(b - a)
        part.rows += int(b - a)
        part.ts_lo = min(part.ts_lo, float(ts[a]))
        part.ts_hi = float(ts[b - 1])

    def _decreasing(self, path: Path, ts: float, tid: int | None,
                    before: tuple[float, int] | None = None) -> None:
        at = "" if tid is None else f" at tuple_id {tid}"
        if before is None:
            # no row before it in its batch: it is older than the last row read
            assert self.last is not None, "the first row read is older than nothing"
            prev_ts, prev_tid, prev_path = self.last
            where = "" if prev_path == path else f" in {prev_path}"
            before_text = f"ts {prev_ts!r} at tuple_id {prev_tid}{where}"
        else:
            before_text = f"ts {before[0]!r} at tuple_id {before[1]}"
        raise ArchiveError(f"{path}: ts {float(ts)!r}{at} is older than {before_text}; a "
                           f"stream's ts may not decrease in tupleID order")


def _check_appends(plans: Mapping[str, StreamPlan]) -> None:
    """The ordering rule (module docstring, stage 2). The refusal says exactly what each
    way on means for the archive's rows at the target's latest ts L: `start=L` delivers
    all of them (after whatever the target holds at L: a replay that stopped part way may
    have delivered some, which would then be doubled); `start=` the archive's next ts
    after L skips all of them; and when the archive has nothing after L it says so. It
    names replay()'s arguments; `psoup replay` puts its options in their place."""
    late: list[StreamPlan] = []
    for plan in plans.values():
        if plan.rows == 0 or plan.latest_ts is None:
            continue
        begin = plan.begins
        assert begin is not None, "a stream with rows in range has parts"
        if begin < plan.latest_ts:
            late.append(plan)
    if not late:
        return
    where = "; ".join(f"stream '{p.name}' holds data up to ts {p.latest_ts!r}, the "
                      f"replay would start at ts {p.begins!r}" for p in late)
    done = [p for p in late if p.after_latest == math.inf and not p.at_latest]
    if len(done) == len(late):
        raise ReplayError(f"replay only appends: {where}. The archive ends at ts "
                          f"{max(p.last_ts for p in late)!r}, before that: the target "
                          "already holds data as new as all of it, and there is nothing "
                          "to append (older rows are for historical evaluation)")
    latest = max(late, key=lambda p: p.latest_ts or -math.inf)
    resume, count = latest.latest_ts, latest.at_latest
    ways = [f"resume=True skips those '{latest.name}' holds",
            f"start={resume!r} replays all of them (any a stopped replay delivered are "
            "doubled)"]
    if latest.after_latest < math.inf:
        ways.append(f"start={latest.after_latest!r}, the archive's next ts, skips them all")
    else:
        ways.append(f"the archive has no later row of '{latest.name}' (it ends at ts "
                    f"{latest.last_ts!r})")
    raise ReplayError(f"replay only appends: {where}. The archive has {count:,} "
                      f"row{'s' * (count != 1)} of '{latest.name}' at ts {resume!r}: "
                      f"{'; '.join(ways)}. Older rows are for historical evaluation")


def _slices(plans: Mapping[str, StreamPlan], every: int, slice_rows: int, lo: float,
            hi: float) -> list[tuple[float, float, bool]]:
    samples = [s for plan in plans.values() for s in plan.samples]
    if not samples:
        return []
    step = max(1, slice_rows // every)
    cuts = np.unique(np.sort(np.concatenate(samples))[step::step]).tolist()
    bounds = [lo, *(c for c in cuts if c > lo), hi]
    return [(a, b, i == len(bounds) - 2)
            for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))]


# ---------------------------------------------------------------------- stage 3: deliver

def ordered_runs(plan: ReplayPlan, spark: Any, batch_rows: int = BATCH_ROWS,
                 staging: Path | None = None
                 ) -> Generator[tuple[str, dict[str, np.ndarray], np.ndarray], None, None]:
    """The planned rows as (stream, {column: array}, ts), in (ts, archived tupleID)
    order over all streams, at most `batch_rows` rows each; one slice in memory at a time.

    `staging`: the folder Spark's executors write each slice to (`_collect`), one the
    executors and psoup both reach; None: `.replay/` in the first archive directory
    (`staging_folder`). It is removed when the rows run out or the caller stops.

    Raises:
        ArchiveError: Spark could not read a slice (a file damaged past its footer).
    """
    folder = staging_folder(plan) if staging is None else Path(staging).resolve()
    skip = {name: stream.skip for name, stream in plan.streams.items()}
    try:
        for n, (lo, hi, closed) in enumerate(plan.slices):
            pieces: list[tuple[StreamPlan, dict[str, np.ndarray]]] = []
            for stream in plan.streams.values():
                paths = [p.path for p in stream.parts
                         if p.ts_hi >= lo and (p.ts_lo < hi or (closed and p.ts_lo <= hi))]
                if not paths:
                    continue
                cols = _collect(spark, stream, paths, max(lo, stream.start), hi, closed,
                                folder / f"{n}-{len(pieces)}")
                if skip[stream.name] and len(cols[TS_COLUMN]) and \
                        cols[TS_COLUMN][0] == stream.latest_ts:
                    # resume: the first rows at the target's latest ts are those it holds
                    # (a slice never splits one ts, so they are all in this slice)
                    drop, skip[stream.name] = skip[stream.name], 0
                    cols = {c: v[drop:] for c, v in cols.items()}
                if len(cols[TS_COLUMN]):
                    pieces.append((stream, cols))
            if pieces:
                yield from _merged(pieces, batch_rows)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if staging is None:
            with contextlib.suppress(OSError):
                folder.parent.rmdir()           # empty once no replay uses it


#: Where in an archive directory a replay's executors write its slices (a folder the
#: archive's own layout, stream=NAME/date=DAY/, never matches).
STAGING = ".replay"


def staging_folder(plan: ReplayPlan) -> Path:
    """A new folder for a replay's slices: under STAGING in the first archive directory
    (the executors read the archive there, so they reach it), or, where psoup may not
    write there (an archive on a read-only mount), a temporary folder of this machine,
    which only executors on this machine reach (local mode)."""
    roots = plan.roots or [part.path.parents[2] for stream in plan.streams.values()
                           for part in stream.parts[:1]]
    if roots:
        folder = roots[0].resolve() / STAGING / uuid.uuid4().hex
        try:
            make_dir(folder)
            return folder
        except OSError:
            pass
    return Path(tempfile.mkdtemp(prefix="psoup-replay-")).resolve()


def _collect(spark: Any, stream: StreamPlan, paths: Sequence[Path], lo: float, hi: float,
             closed: bool, folder: Path) -> dict[str, np.ndarray]:
    """One slice of one stream, by Spark, as numpy columns in (ts, tupleID) order. The
    executors read it, sort each of their partitions and write it as Parquet under
    `folder`; psoup reads those files, merges them (`_read_slice`) and removes them, so
    no row passes through Spark's driver (whose JVM would hold each slice on the way)."""
    from pyspark.sql import functions as F

    ts = F.col(TS_COLUMN)
    keep = F.lit(True)
    if lo > -math.inf:
        keep = keep & (ts >= lo)
    if hi < math.inf:
        keep = keep & (ts <= hi if closed else ts < hi)
    names = [TS_COLUMN, TUPLE_ID_COLUMN, *(c for c, _ in stream.columns)]
    ddl = ", ".join(f"`{c}` {SPARK_TYPES[t]}" for c, t in
                    [(TS_COLUMN, ColumnType.FLOAT), (TUPLE_ID_COLUMN, ColumnType.INT),
                     *stream.columns])
    try:
        try:
            (spark.read.schema(ddl).parquet(*(str(p.resolve()) for p in paths))
             .where(keep)
             .select(*(F.col(f"`{c}`") for c in names))
             .sortWithinPartitions(TS_COLUMN, TUPLE_ID_COLUMN)
             .write.parquet(folder.as_uri()))
        except Exception as exc:   # Spark's errors: py4j / PySpark classes of many kinds
            named = [str(p) for p in paths if str(p.resolve()) in str(exc)] or \
                [f"{len(paths)} file(s) from {paths[0]}"]
            raise ArchiveError(f"{', '.join(named)}: Spark could not read stream "
                               f"'{stream.name}' ({spark_error(exc)})") from exc
        return _read_slice(folder, stream, names)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _read_slice(folder: Path, stream: StreamPlan, names: list[str]
                ) -> dict[str, np.ndarray]:
    """The files the executors wrote under `folder`, each sorted by (ts, tupleID), as
    numpy columns in that order: the files taken in the order of their first rows,
    which is the whole order when their ranges do not interleave (the archive's files
    are in ts order); otherwise sorted here. O(rows)."""
    try:
        tables = [pq.read_table(path) for path in sorted(folder.glob("*.parquet"))]
    except (pa.ArrowException, OSError) as exc:
        raise ArchiveError(f"{folder}: the slice of stream '{stream.name}' that Spark "
                           f"wrote cannot be read ({exc})") from None
    tables = sorted((t for t in tables if t.num_rows),
                    key=lambda t: (t.column(TS_COLUMN)[0].as_py(),
                                   t.column(TUPLE_ID_COLUMN)[0].as_py()))
    if not tables:
        empty = [(TS_COLUMN, ColumnType.FLOAT), (TUPLE_ID_COLUMN, ColumnType.INT),
                 *stream.columns]
        return {c: pa.array([], ARROW_TYPES[t]).to_numpy(zero_copy_only=False)
                for c, t in empty}
    table = pa.concat_tables(tables)
    tids = table.column(TUPLE_ID_COLUMN).to_numpy()
    stamps = table.column(TS_COLUMN).to_numpy()
    step = np.diff(stamps)
    if (step < 0).any() or ((step == 0) & (np.diff(tids) < 0)).any():
        order = np.lexsort((tids, stamps))
        return {c: table.column(c).to_numpy(zero_copy_only=False)[order] for c in names}
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in names}


def _merged(pieces: list[tuple[StreamPlan, dict[str, np.ndarray]]], batch_rows: int
            ) -> Iterator[tuple[str, dict[str, np.ndarray], np.ndarray]]:
    """Runs of one stream each, in (ts, tupleID) order over all `pieces`."""
    if len(pieces) == 1:
        bounds = [(0, 0, len(pieces[0][1][TS_COLUMN]))]
    else:
        ts = np.concatenate([cols[TS_COLUMN] for _, cols in pieces])
        tids = np.concatenate([cols[TUPLE_ID_COLUMN] for _, cols in pieces])
        which = np.concatenate([np.full(len(cols[TS_COLUMN]), i)
                                for i, (_, cols) in enumerate(pieces)])
        order = which[np.lexsort((which, tids, ts))]
        cuts = [0, *(np.flatnonzero(order[1:] != order[:-1]) + 1).tolist(), len(order)]
        at = [0] * len(pieces)
        bounds = []
        for a, b in zip(cuts, cuts[1:], strict=False):
            i = int(order[a])
            bounds.append((i, at[i], at[i] + b - a))
            at[i] += b - a
    for i, a, b in bounds:
        stream, cols = pieces[i]
        for p in range(a, b, batch_rows):
            q = min(p + batch_rows, b)
            yield (stream.name, {c: cols[c][p:q] for c, _ in stream.columns},
                   cols[TS_COLUMN][p:q])


def replay(archives: Sequence[str | Path], target: Any, streams: Sequence[str] | None = None,
           start: float | None = None, end: float | None = None, master: str | None = None,
           slice_rows: int = SLICE_ROWS, batch_rows: int = BATCH_ROWS,
           progress: Callable[[int, int, float], None] | None = None,
           resume: bool = False, conf: Mapping[str, str] | None = None,
           notes: Callable[[str], None] | None = None) -> ReplayReport:
    """Deliver the archived rows with start <= ts <= end to `target`, in (ts, archived
    tupleID) order over all the streams.

    The archive is checked and the ordering rule applied first (`plan_replay`); only
    then is Spark started and are the streams the target lacks created (with the
    archive's columns, no RETAIN). The target stamps fresh tupleIDs. Spark's executors
    write each slice under `.replay/` in the first archive directory (`ordered_runs`),
    removed as psoup reads it.

    Args:
        archives: archive roots.
        target: an `Engine` or a `Client` (anything with stats, create_stream, insert).
        streams: the streams to replay (None: all in the archives).
        start, end: the inclusive time range (None: unbounded).
        master: the Spark master URL; None: local[*], or the session already running.
        conf: Spark settings (psoup.spark.session.spark_session).
        slice_rows: about the most rows psoup holds at once.
        batch_rows: rows per insert.
        progress: called after each insert with (rows delivered, rows in all, seconds).
        resume: continue exactly where the target stops (see `plan_replay`): after a
            refusal, or a replay that stopped part way, nothing is doubled or skipped,
            provided the target's rows at its latest ts came from this archive, in order.
        notes: hears the phases (the archive checked: rows and part files to replay;
            Spark's start), for a person waiting; `progress` counts the rows.

    Raises:
        ArchiveError: the archive failed a check (nothing was delivered).
        ReplayError: the ordering rule (nothing was delivered), or a failure part way:
            `rows_done` rows were delivered and stay.

    Example:
        >>> import tempfile, psoup
        >>> from psoup.archive.parquet import Archive
        >>> eng = psoup.Engine()
        >>> eng.execute("CREATE STREAM R (a INT)")
        >>> _ = eng.insert("R", [(1,)], ts=5.0)
        >>> with tempfile.TemporaryDirectory() as d:
        ...     arc = Archive(d)
        ...     arc.add("R", [("a", "int")], {"ts": np.array([1.0, 9.0]),
        ...             "tupleID": np.array([0, 1]), "a": np.array([2, 3])})
        ...     _ = arc.flush()
        ...     try:
        ...         replay([d], eng)
        ...     except ReplayError as exc:
        ...         print(str(exc)[:73])
        replay only appends: stream 'R' holds data up to ts 5.0, the replay would
    """
    began = time.perf_counter()
    plan = plan_replay(archives, target.stats()["streams"], streams, start, end, slice_rows,
                       resume)
    if notes is not None:
        parts = sum(len(p.parts) for p in plan.streams.values())
        notes(f"archive checked: {plan.rows:,} row{'' if plan.rows == 1 else 's'} to replay "
              f"from {parts:,} part file{'' if parts == 1 else 's'}")
    if plan.slices:
        from psoup.spark.session import spark_session
        spark = spark_session(master, conf, notes)
    for stream in plan.streams.values():
        if stream.create:
            target.create_stream(stream.name, stream.columns)
    done = inserts = 0
    per_stream = dict.fromkeys(plan.streams, 0)
    if plan.slices:
        try:
            with contextlib.closing(ordered_runs(plan, spark, batch_rows)) as runs:
                for name, columns, ts in runs:
                    try:
                        target.insert(name, columns, ts=ts)
                    except PSoupError as exc:
                        raise ReplayError(
                            f"stream '{name}' rejected replayed rows at ts {float(ts[0])!r} "
                            f"after {done:,} rows were delivered (they stay): {exc}",
                            done) from exc
                    done += len(ts)
                    inserts += 1
                    per_stream[name] += len(ts)
                    if progress is not None:
                        progress(done, plan.rows, time.perf_counter() - began)
        except ArchiveError as exc:
            raise ReplayError(f"replay stopped after {done:,} rows were delivered (they "
                              f"stay): {exc}", done) from exc
    ends = max((p.last_ts for p in plan.streams.values()), default=-math.inf)
    note = ""
    if start is not None and not plan.rows and -math.inf < ends < start:
        note = f"the archive ends at ts {ends!r}, before the start {float(start)!r}"
    elif resume and not plan.rows:
        note = "nothing to resume: " + "; ".join(
            f"stream '{p.name}' holds data up to ts {p.latest_ts!r}, the archive's rows "
            f"end at ts {p.last_ts!r}" for p in plan.streams.values())
    return ReplayReport(done, inserts, time.perf_counter() - began, per_stream, note)
