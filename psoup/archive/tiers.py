"""The archive tier of the Results Structure: a query's matches among tuples that left
memory ("Remembrance of Streams Past", hybrid queries over archived and live data).

A query gets a tier when its history is evaluated (`Engine.history`), in two halves
that meet at the oldest tuple held in memory when the job starts. Under the engine's
lock, a *pending* tier (invisible to answers) takes the query's matches among the tuples
from that one to the retention horizon, probed on the spot, and from then on grows with
the horizon: the tuples that leave retention are probed before they can be dropped, and
the query's matches among them are appended. Off the lock, a Spark pass over the archive
(psoup.spark.history) finds its matches among the tuples below that oldest one, however
long it takes and however far the horizon moves meanwhile. When it ends, its matches go
in front of the pending blocks and the tier becomes visible, at once. So at every moment
a visible tier holds exactly the query's matches with tupleID below the stream's
horizon, and memory the ones at or above it: an answer that joins the two counts no
tuple twice and misses none.

A tier is kept mostly on disk, as Parquet *segment* files under the engine's tiers/
folder, each a run of matches in tupleID order: the Spark pass's output (written by
its executors one file per query and at most SEGMENT_ROWS, and renamed into place by
psoup) and, at each save, what
the tier gained since (the matches of the tuples that left retention meanwhile, held in
memory until then as the tier's *tail*). The engine keeps only an index of the segments
(tupleID and ts range, row count: `Segment`), so its memory does not grow with the
archive; an invocation reads the segments whose ts range meets the window's reach
(the ts range the caller's window selects among archived matches), slices them by
binary search, and appends the tail's part. The segments read last stay decoded in a
small cache (CACHE_BYTES), so a client polling a window that reaches into the archive
reads its files once, not at each poll.

`ArchiveTiers` holds the tiers of one engine and owns the hook that keeps them equal to
"matches below the horizon"; the Spark pass that fills them is psoup.spark.history.
Segments survive a restart: a log record or checkpoint names them, and `restore` reads
their footers back (docs/durability.md, "What is on disk").
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from psoup.archive.policy import step_at
from psoup.archive.rates import SAMPLE_SPACE
from psoup.errors import PSoupError
from psoup.fsync import make_dir, sync_file_system, write_whole
from psoup.query.model import TS, TUPLE_ID, ColumnType
from psoup.stems.data_stem import DataSteM

if TYPE_CHECKING:
    from psoup.archive.rollups import Substitute

#: Probe n rows of a stream's columns against the standing queries: bit rows (n, words).
Probe = Callable[[str, Mapping[str, np.ndarray], int], np.ndarray]

#: The folder under the tiers folder where a history job's segments wait to be moved
#: into place (`ArchiveTiers.finish`); a checkpoint leaves it alone, an opening empties it.
INCOMING = ".incoming"

#: The ts range [begin, end] that a window selects among archived matches at some NOW,
#: or None for a window that counts tuples in memory only.
Reach = tuple[float, float] | None

#: Decoded segments kept for the next invocations, at most this many bytes in all.
CACHE_BYTES = 64 << 20

#: A save rewrites a tier's last segments together with its tail into one file while
#: each is no larger than what goes in with it and the whole stays within this many
#: matches (the size of the files a history job writes): a tier that gains a few
#: matches at every checkpoint keeps O(log) files per this many matches, not one per
#: checkpoint, and each match is rewritten O(log) times.
MERGE_ROWS = 1 << 16


class Sampled(NamedTuple):
    """How a tier's matches from the archive were found when they come from a sample of
    it (TABLESAMPLE, or an overload policy, psoup.archive.policy): among a uniform
    sample of the archived tuples with tupleID below `below` (the first tuple held in
    memory at the time, stamped `until`), at the rates of `steps`, (from ts, rate) in
    ts order, the first from -inf; the matches from `below` on are all there (found in
    memory).

    Example:
        >>> s = Sampled(((-math.inf, 0.25), (10.0, 1.0)), 40, 20.0)
        >>> s.rates(np.array([3.0, 10.0])).tolist()
        [0.25, 1.0]
        >>> Sampled.from_json(s.to_json()) == s
        True
    """

    steps: tuple[tuple[float, float], ...]
    below: int
    until: float

    def rates(self, ts: np.ndarray) -> np.ndarray:
        """The rate each archived tuple stamped `ts` was sampled at. O(n log steps)."""
        return step_at(self.steps, ts)

    def to_json(self) -> str:
        return json.dumps({"steps": [list(s) for s in self.steps], "below": self.below,
                           "until": self.until})

    @classmethod
    def from_json(cls, raw: str | bytes) -> Sampled:
        got = json.loads(raw)
        return cls(tuple((float(a), float(r)) for a, r in got["steps"]), int(got["below"]),
                   float(got["until"]))


#: The key of a segment file's metadata that holds its `Sampled` (JSON).
SAMPLED_KEY = "psoup.sampled"


class Segment(NamedTuple):
    """One segment file of a tier: its name under the tiers folder, its first and last
    tupleIDs, its lowest and highest ts, its number of matches, and how they were
    sampled (None: not). A *marker* is a segment of no matches (first = last = -1),
    kept only to say how a tier that found none in its sample was sampled."""

    name: str
    first: int
    last: int
    lo: float
    hi: float
    rows: int
    sample: Sampled | None = None


class Unsaved(NamedTuple):
    """What a save writes for one tier: its slot and handle, its tail (arrays later
    appends leave alone), its matches in all, the column types, and the segments at its
    end to rewrite together with the tail (`MERGE_ROWS`)."""

    slot: int
    handle: str
    tail: dict[str, np.ndarray]
    n: int
    types: dict[str, ColumnType]
    merged: tuple[Segment, ...]


class Written(NamedTuple):
    """A segment file a save wrote: the slot, the matches its tier had in all, the new
    segment, and the segments it replaces (their matches are in it too)."""

    slot: int
    n: int
    segment: Segment
    merged: tuple[Segment, ...]


def segment_name(handle: str, first: int, last: int) -> str:
    """Where a segment of `handle`'s tier holding tupleIDs first..last is kept (a
    marker, first = -1: HANDLE/sample.parquet)."""
    if first < 0:
        return f"{handle}/sample.parquet"
    return f"{handle}/{first:020d}-{last:020d}.parquet"


def sample_marker(folder: Path, handle: str, sample: Sampled, schema: Any) -> Segment:
    """Write the marker segment of `handle`'s tier (no match, `sample` in its metadata)
    under `folder`; not made durable here (the caller syncs the file system)."""
    import pyarrow.parquet as pq

    name = segment_name(handle, -1, -1)
    make_dir((folder / name).parent, private=True)
    table = schema.empty_table().replace_schema_metadata({SAMPLED_KEY: sample.to_json()})
    write_whole(folder / name, partial(pq.write_table, table), private=True, fsync=False)
    return Segment(str(folder / name), -1, -1, math.inf, -math.inf, 0, sample)


def read_footer(folder: Path, name: str, columns: list[str]) -> Segment:
    """The index entry of the segment file `folder/name`, from its Parquet footer
    (O(footer)): ValueError when it lacks one of `columns` or its statistics, OSError
    when it cannot be read."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(folder / name).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"{folder / name} lacks the column(s) {', '.join(missing)}")
    raw = (meta.metadata or {}).get(SAMPLED_KEY.encode())
    sample = None if raw is None else Sampled.from_json(raw)
    if not meta.num_rows and sample is not None:
        return Segment(name, -1, -1, math.inf, -math.inf, 0, sample)
    if not meta.num_rows:
        raise ValueError(f"{folder / name} holds no match")
    lows, highs = {}, {}
    for column in (TUPLE_ID, TS):
        j = names.index(column)
        stats = [meta.row_group(g).column(j).statistics for g in range(meta.num_row_groups)]
        if any(s is None or not s.has_min_max for s in stats):
            raise ValueError(f"{folder / name} has no statistics of {column}")
        lows[column] = min(s.min for s in stats)
        highs[column] = max(s.max for s in stats)
    return Segment(name, int(lows[TUPLE_ID]), int(highs[TUPLE_ID]), float(lows[TS]),
                   float(highs[TS]), int(meta.num_rows), sample)


#: The key of `ArchiveTiers.part`'s answer holding the rate each row was read at
#: (present only when some segment was read as a sample, `reads`).
READ_RATE = "_read_rate"

#: How a segment is read as a sample: (from ts, draw limit) steps in ts order, the
#: first from -inf: a match is read when its draw is below the limit of its ts
#: (psoup.archive.policy.step_at), so a segment that spans a boundary of the policy's
#: schedule reads each side at its own rate.
Limits = tuple[tuple[float, int], ...]

#: A whole read.
ALL: Limits = ((-math.inf, SAMPLE_SPACE),)


def file_limit(limits: Limits) -> int:
    """The draw limit a read of `limits` reads the segment's file at: the highest (the
    rows of the lower steps are filtered from it by their draws)."""
    return max(limit for _, limit in limits)


def load_segment(folder: Path, seg: Segment, types: Mapping[str, ColumnType],
                 limit: int = SAMPLE_SPACE, keep_draws: bool = False
                 ) -> dict[str, np.ndarray]:
    """The columns of segment `seg` under `folder` (`types`: column -> its type) in
    tupleID order, checked against its index entry; only its matches whose draw is
    below `limit` (psoup.archive.sampling: the row groups that hold them) when it is
    below SAMPLE_SPACE; with `keep_draws`, their draws too (SAMPLE_COLUMN). Needs no
    lock: a segment file never changes once written. O(what it reads).

    Raises:
        PSoupError: the file is gone, damaged, or holds another number of matches.
    """
    from psoup.archive.layout import SAMPLE_COLUMN, to_numpy
    from psoup.archive.sampling import read_below
    path = folder / seg.name
    try:
        table = read_below(path, list(types), limit, TUPLE_ID, keep_draws)
        got = {name: to_numpy(table.column(name), ctype) for name, ctype in types.items()}
        if keep_draws:
            got[SAMPLE_COLUMN] = table.column(SAMPLE_COLUMN).to_numpy()
    except Exception as exc:
        raise PSoupError(f"the archive tier file {path} cannot be read ({exc}); "
                         "evaluate the query's history again (psoup history "
                         "HANDLE)") from None
    if limit >= SAMPLE_SPACE and len(got[TUPLE_ID]) != seg.rows:
        raise PSoupError(f"the archive tier file {path} holds {len(got[TUPLE_ID])} "
                         f"matches, not {seg.rows}; evaluate the query's history "
                         "again (psoup history HANDLE)")
    return got


def load_segments(folder: Path, wanted: list[tuple[Segment, dict[str, ColumnType], Limits]]
                  ) -> dict[str, dict[str, np.ndarray]]:
    """`load_segment` of each of `wanted` (as `ArchiveTiers.unread` lists them: the
    segment, its types, the draw limits of its read) by cache key (`cache_key`), leaving
    out the ones that fail: reading them again under the lock raises the error where
    the answer needs it. O(what they read)."""
    out = {}
    for seg, types, limits in wanted:
        with contextlib.suppress(PSoupError):
            out[cache_key(seg.name, limits)] = load_segment(
                folder, seg, types, file_limit(limits), keep_draws=len(limits) > 1)
    return out


def cache_key(name: str, limits: Limits) -> str:
    """The cache's key of segment `name` read at `limits`: its name for a whole read,
    NAME@LIMIT for a sample of one rate, NAME@LIMIT+draws for a read at the highest
    limit of several that keeps the draws to filter by."""
    limit = file_limit(limits)
    if len(limits) > 1:
        return f"{name}@{limit}+draws"
    return name if limit >= SAMPLE_SPACE else f"{name}@{limit}"


def _sampled(columns: Mapping[str, np.ndarray], limits: Limits) -> dict[str, np.ndarray]:
    """The rows of `columns` read at `limits` (its draws kept when they are several
    steps), with the rate each was read at (READ_RATE), the draws dropped. O(n log
    steps)."""
    if len(limits) == 1:
        rate = np.full(len(columns[TUPLE_ID]), limits[0][1] / SAMPLE_SPACE)
        return {**columns, READ_RATE: rate}
    from psoup.archive.layout import SAMPLE_COLUMN
    limit = step_at(limits, columns[TS])
    keep = columns[SAMPLE_COLUMN] < limit
    got = {name: values[keep] for name, values in columns.items() if name != SAMPLE_COLUMN}
    got[READ_RATE] = limit[keep] / SAMPLE_SPACE
    return got


def _between(columns: Mapping[str, np.ndarray], begin: float, end: float
             ) -> dict[str, np.ndarray]:
    """The rows of ts-ordered `columns` with begin <= ts <= end: O(log n), no copy."""
    ts = columns[TS]
    a = int(np.searchsorted(ts, begin, side="left"))
    b = int(np.searchsorted(ts, end, side="right"))
    return {name: values[a:b] for name, values in columns.items()}


def _meeting(segments: list[Segment], begin: float, end: float,
             skip: Substitute | None) -> list[Segment]:
    """The segments with matches of ts in [begin, end] that `skip` does not answer."""
    return [seg for seg in segments if seg.hi >= begin and seg.lo <= end and not (
        skip is not None and skip.whole(seg.lo, seg.hi, seg.first, seg.last))]


def _masked(columns: Mapping[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    """The rows of `columns` where `keep` is True (no copy when all are)."""
    if keep.all():
        return dict(columns)
    return {name: values[keep] for name, values in columns.items()}


class Tier:
    """One query's archived matches, in tupleID order: the `segments` saved in files
    (an index, O(1) memory each), then the `tail` held in memory, not yet saved.

    Example:
        >>> t = Tier()
        >>> t.append({"ts": np.array([1.0, 2.0]), "tupleID": np.array([4, 9]),
        ...           "a": np.array([7, 8])})
        >>> t.tail["a"].tolist(), len(t), t.saved
        ([7, 8], 2, 0)
    """

    def __init__(self, segments: list[Segment] | None = None) -> None:
        self.segments: list[Segment] = list(segments or [])
        self.saved = sum(s.rows for s in self.segments)     # matches in the segments
        self._blocks: list[dict[str, np.ndarray]] = []
        self._merged: dict[str, np.ndarray] | None = None
        self._in_tail = 0                                       # matches in the tail

    @property
    def files(self) -> list[str]:
        """The segment files, oldest first."""
        return [s.name for s in self.segments]

    @property
    def sample(self) -> Sampled | None:
        """How the tier's archived matches were sampled (None: read whole). O(1): the
        Spark pass's segments, which carry it, come first."""
        return self.segments[0].sample if self.segments else None

    def append(self, columns: Mapping[str, np.ndarray]) -> None:
        """Matches with tupleIDs above every stored one, to the tail."""
        n = len(columns[TUPLE_ID])
        if n:
            self._blocks.append(dict(columns))
            self._merged = None
            self._in_tail += n

    def extend(self, later: Tier) -> None:
        """Append the tail of `later` (which has no segments), whose tupleIDs are above
        every stored one."""
        assert not later.segments, "a pending tier is all tail"
        for block in later._blocks:
            self.append(block)

    @property
    def tail(self) -> dict[str, np.ndarray]:
        """The matches held in memory (consolidated into one array a column on first
        use after appends; arrays handed out before are left alone)."""
        if self._merged is None:
            if len(self._blocks) == 1:
                self._merged = self._blocks[0]
            elif self._blocks:
                self._merged = {name: np.concatenate([b[name] for b in self._blocks])
                                for name in self._blocks[0]}
                self._blocks = [self._merged]
            else:
                self._merged = {}
        return self._merged

    def saved_as(self, segment: Segment, merged: int = 0) -> None:
        """The last `merged` segments' matches and then the tail's first ones are now
        in `segment`'s file: index it in their place, and drop those of the tail from
        memory (copying the rest, so their arrays are freed)."""
        replaced = sum(s.rows for s in self.segments[len(self.segments) - merged:])
        del self.segments[len(self.segments) - merged:]
        self.saved -= replaced
        k = segment.rows - replaced         # the tail's matches in the file
        tail = self.tail
        self.segments.append(segment)
        self.saved += segment.rows
        self._in_tail -= k
        rest = {name: values[k:].copy() for name, values in tail.items()}
        self._blocks = [rest] if self._in_tail else []
        self._merged = None

    def __len__(self) -> int:
        return self.saved + self._in_tail

    def nbytes(self) -> int:
        """Bytes held in memory (the tail)."""
        return sum(v.nbytes for b in self._blocks for v in b.values())


class ArchiveTiers:
    """The archive tiers of one engine's selection queries, by slot.

    `begin` gives queries pending tiers (the tuples still held in memory below the
    horizon, probed here); from then on the Data SteM's `on_horizon` hook moves each
    query's matches among the tuples that leave retention into its tier's tail, pending
    or not, before their chunk can be dropped. `finish` puts the Spark pass's segment
    files in front of the pending tiers and makes them visible; `abort` drops them.
    `save` writes each tier's tail as one more segment, or with the last small segments
    as one that replaces them (O(the tail), as much again read back), `restore` indexes
    a tier's segments from their footers (O(segments)). Memory: O(segments + tails +
    CACHE_BYTES). An invocation reads a window's part in O(log n) per segment it meets,
    plus the reading of those segments not in the cache.

    Example:
        >>> import tempfile
        >>> from psoup.query.model import StreamSchema
        >>> from psoup.stems.batch import make_batch
        >>> stem = DataSteM(StreamSchema("R", (("a", "int"),), retain_rows=1), chunk_rows=4)
        >>> tiers = ArchiveTiers({"R": stem}, lambda s, cols, n: np.ones((n, 1), "<u8"),
        ...                      Path(tempfile.mkdtemp()))
        >>> tiers.begin("R", [0])
        >>> _ = stem.append(make_batch(stem.schema, [(1,), (2,)], 1.0, 0, stem.last_ts),
        ...                 np.array([1, 2]))
        >>> 0 in tiers, tiers.pending
        (False, [0])
        >>> spark = {"ts": np.array([0.5]), "tupleID": np.array([0]), "a": np.array([9])}
        >>> types = {"ts": "float", "tupleID": "int", "a": "int"}
        >>> found = ArchiveTiers.write(tiers.folder,
        ...                            [Unsaved(0, ".incoming/0", spark, 1, types, ())])
        >>> tiers.finish({"R": {0: [found[0].segment]}}, {0: "h"})
        >>> tiers.files(0), tiers.part(0, (-math.inf, math.inf))["a"].tolist()
        (['h/00000000000000000000-00000000000000000000.parquet'], [9, 1])
    """

    def __init__(self, stems: Mapping[str, DataSteM], probe: Probe,
                 folder: Path | None = None):
        self._stems = stems
        self._probe = probe
        self.folder = folder                       # where segments are; set by the engine
        self._tiers: dict[int, Tier] = {}
        self._pending: dict[int, Tier] = {}
        self._stream_of: dict[int, str] = {}      # of visible and pending tiers
        self._cache: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()
        self._cached = 0                            # bytes in the cache

    def __contains__(self, slot: int) -> bool:
        return slot in self._tiers

    def count(self, slot: int) -> int:
        """The archived matches of `slot` (0 without a tier)."""
        tier = self._tiers.get(slot)
        return 0 if tier is None else len(tier)

    def files(self, slot: int) -> list[str]:
        """The segment files of `slot`'s tier, oldest first (none without a tier)."""
        tier = self._tiers.get(slot)
        return [] if tier is None else tier.files

    def sampled(self, slot: int) -> Sampled | None:
        """How `slot`'s tier was sampled (None: read whole, or no tier). O(1)."""
        tier = self._tiers.get(slot)
        return None if tier is None else tier.sample

    @property
    def pending(self) -> list[int]:
        """The slots whose tiers wait for a history job's Spark matches."""
        return list(self._pending)

    def begin(self, stream: str, slots: list[int]) -> None:
        """Give `slots` (selection queries on `stream`) pending tiers holding their
        matches among the tuples held in memory below the horizon; the Spark pass must
        bring their matches among the tuples below `stem.oldest`."""
        stem = self._stems[stream]
        for slot in slots:
            self._pending[slot] = Tier()
            self._stream_of[slot] = stream
        self._held(stream, stem.rows(stem.oldest, stem.horizon, expired=True), slots)
        self._hook(stream)

    def finish(self, found: Mapping[str, Mapping[int, list[Segment]]],
               handle_of: Mapping[int, str]) -> None:
        """Make the pending tiers visible, each with the segments `found[stream][slot]`
        (the Spark pass's files under `folder`, in tupleID order) in front, renamed to
        their places under their handle (`handle_of`: slot -> handle); a slot no longer
        pending (its query was unregistered meanwhile) is skipped, a pending one not in
        `found` dropped. O(segments) renames, made durable by `sync`.

        Raises:
            OSError: a file could not be renamed (every pending tier is dropped then).
        """
        assert self.folder is not None, "tiers are kept under the engine's folder"
        try:
            for matches in found.values():
                for slot, segments in matches.items():
                    if slot not in self._pending:
                        continue
                    placed = []
                    for seg in segments:
                        name = segment_name(handle_of[slot], seg.first, seg.last)
                        make_dir((self.folder / name).parent, private=True)
                        (self.folder / seg.name).replace(self.folder / name)
                        self._cache_drop(name)
                        placed.append(seg._replace(name=name))
                    tier = self._tiers[slot] = Tier(placed)
                    tier.extend(self._pending.pop(slot))
        finally:
            self.abort()

    def sync(self, slots: list[int]) -> None:
        """Make the renames of `finish` durable: one sync of the file system (an fsync a
        folder of `slots`' tiers would be a journal commit each). Needs no lock."""
        assert self.folder is not None
        if any(self.files(slot) for slot in slots):
            sync_file_system(self.folder)

    def abort(self) -> None:
        """Drop every pending tier (a history job failed or was cancelled)."""
        for slot in list(self._pending):
            self.forget(slot)

    def forget(self, slot: int) -> None:
        """Drop `slot`'s tier, visible or pending; a stream left without tiers loses
        its hook. (Its files stay until a checkpoint no longer names them.)"""
        if self._tiers.pop(slot, None) is None and self._pending.pop(slot, None) is None:
            return
        self._hook(self._stream_of.pop(slot))

    def part(self, slot: int, reach: Reach,
             reads: Mapping[str, Limits] | None = None, skip: Substitute | None = None
             ) -> dict[str, np.ndarray] | None:
        """The slot's archived matches with a ts in `reach` (all columns, ts and
        tupleID included), or None when there are none or the window counts tuples in
        memory only (`reach` None). Reads the segments whose ts range meets `reach`, but for
        those whose every match the aggregate copies `skip` answer, and leaves out the
        matches `skip` answers; the segments named in `reads` it reads only for their
        matches with a draw below the limit given there for their ts (a sample,
        psoup.archive.sampling: `Limits`), and then the answer says at what rate each
        row was read (READ_RATE; 1 for the tail, which is in memory).

        Raises:
            PSoupError: a segment file is gone or damaged (naming it).
        """
        tier = self._tiers.get(slot)
        if tier is None or not len(tier) or reach is None:
            return None
        begin, end = reach
        reads = reads or {}
        pieces = []
        for seg in self.meeting(slot, reach, skip):
            limits = reads.get(seg.name, ALL)
            got = _between(self._read(self._stream_of[slot], seg, limits), begin, end)
            pieces.append(_sampled(got, limits) if reads else got)
        if tier.tail:
            got = _between(tier.tail, begin, end)
            if reads:
                got[READ_RATE] = np.ones(len(got[TUPLE_ID]))
            pieces.append(got)
        if skip is not None:
            pieces = [_masked(p, skip.keep(p[TS], p[TUPLE_ID])) for p in pieces]
        pieces = [p for p in pieces if len(p[TUPLE_ID])]
        if len(pieces) <= 1:
            return pieces[0] if pieces else None
        return {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}

    def meeting(self, slot: int, reach: Reach, skip: Substitute | None = None
                ) -> list[Segment]:
        """The segments of `slot`'s tier holding matches whose ts range meets `reach`,
        but for those whose every match the aggregate copies `skip` answer (none without
        a tier, or for a window of memory only, `reach` None). O(segments)."""
        tier = self._tiers.get(slot)
        if tier is None or reach is None:
            return []
        begin, end = reach
        return [seg for seg in _meeting(tier.segments, begin, end, skip) if seg.rows]

    def _read(self, stream: str, seg: Segment, limits: Limits = ALL
              ) -> dict[str, np.ndarray]:
        """A segment's columns (its matches with a draw below the highest of `limits`,
        with their draws when there are several), from the cache or from its file (kept
        in the cache, the least recently read ones leaving it beyond CACHE_BYTES)."""
        key = cache_key(seg.name, limits)
        got = self._cache.get(key)
        if got is not None:
            self._cache.move_to_end(key)
            return got
        assert self.folder is not None
        got = load_segment(self.folder, seg, self._types(stream), file_limit(limits),
                           keep_draws=len(limits) > 1)
        self._cache_put(key, got)
        return got

    def unread(self, slot: int, reach: Reach,
               reads: Mapping[str, Limits] | None = None, skip: Substitute | None = None
               ) -> list[tuple[Segment, dict[str, ColumnType], Limits]]:
        """The segments (their column types, the draw limits of their read: `part`'s
        `reads`; the copies `skip` answer left out) `part` would read from their files
        now, not being in the cache: for a caller to `load_segments` them off the
        engine's lock and `prime` the cache with them. O(segments)."""
        reads = reads or {}
        types = self._types(self._stream_of[slot]) if slot in self._stream_of else {}
        wanted = []
        for seg in self.meeting(slot, reach, skip):
            limits = reads.get(seg.name, ALL)
            if cache_key(seg.name, limits) not in self._cache:
                wanted.append((seg, types, limits))
        return wanted

    def cached(self, name: str) -> bool:
        """Whether segment `name` is in the cache, read whole."""
        return name in self._cache

    def prime(self, loaded: Mapping[str, dict[str, np.ndarray]]) -> None:
        """Put segments read by `load_segments` in the cache (by `cache_key`), unless it
        has them."""
        for name, got in loaded.items():
            if name not in self._cache:
                self._cache_put(name, got)

    def _types(self, stream: str) -> dict[str, ColumnType]:
        """Column -> type of the segments of a tier on `stream` (ts, tupleID, then the
        stream's columns, in that order)."""
        return {TS: ColumnType.FLOAT, TUPLE_ID: ColumnType.INT,
                **dict(self._stems[stream].schema.columns)}

    def _cache_put(self, name: str, got: dict[str, np.ndarray]) -> None:
        size = sum(v.nbytes for v in got.values())
        if size <= CACHE_BYTES:
            self._cache[name] = got
            self._cached += size
            while self._cached > CACHE_BYTES:
                _, old = self._cache.popitem(last=False)
                self._cached -= sum(v.nbytes for v in old.values())

    def _cache_drop(self, name: str) -> None:
        """Drop segment `name` from the cache, its sampled reads too."""
        for key in [k for k in self._cache if k == name or k.startswith(name + "@")]:
            old = self._cache.pop(key)
            self._cached -= sum(v.nbytes for v in old.values())

    def nbytes(self) -> int:
        """Bytes held in memory: the tails and the cache."""
        return sum(t.nbytes() for t in self._tiers.values()) + self._cached

    def save(self, folder: Path, handle_of: Mapping[int, str]) -> dict[str, list[str]]:
        """Write the tail of each tier of `handle_of` (slot -> handle) as one more
        segment file, or together with the last small segments as one file that
        replaces them (`unsaved`, `write`, `mark_saved`), and return handle -> its
        segment files (relative to `folder`), oldest first; a tier without matches has
        none. For a checkpoint, under the engine's lock: the tiers then outlive a
        restart (`restore`). O(matches not yet saved), and at most as much again read
        back from the segments rewritten.

        Raises:
            OSError: a file could not be written (those written stay, and count as saved).
        """
        self.mark_saved(self.write(folder, self.unsaved(handle_of)))
        return {handle: self._tiers[slot].files for slot, handle in handle_of.items()
                if slot in self._tiers}

    def unsaved(self, handle_of: Mapping[int, str]) -> list[Unsaved]:
        """What to write for each tier of `handle_of` with a tail: arrays that later
        appends leave alone, so `write` may run off the engine's lock. O(tiers), plus
        consolidating each tail's blocks."""
        out = []
        for slot, handle in handle_of.items():
            tier = self._tiers.get(slot)
            if tier is None or len(tier) == tier.saved:
                continue
            rows, k, segments = len(tier) - tier.saved, 0, tier.segments
            while k < len(segments) and segments[-1 - k].sample is None and \
                    segments[-1 - k].rows <= rows and rows + segments[-1 - k].rows <= MERGE_ROWS:
                rows += segments[-1 - k].rows
                k += 1
            types = self._types(self._stream_of[slot])
            out.append(Unsaved(slot, handle, tier.tail, len(tier), types,
                               tuple(segments[len(segments) - k:])))
        return out

    @staticmethod
    def write(folder: Path, parts: list[Unsaved]) -> list[Written]:
        """Write each part of `unsaved` as `folder/HANDLE/FIRST-LAST.parquet` (tupleIDs;
        the segments it merges read back first; written whole: a .tmp renamed; then all
        made durable by one sync of the file system, not an fsync a file and folder),
        for `mark_saved`. A part whose merged segments are gone (a checkpoint meanwhile
        rewrote them) is skipped. Needs no lock. O(matches written).

        Raises:
            OSError: a file could not be written.
            PSoupError: a segment to merge is there but cannot be read.
        """
        import pyarrow as pa

        from psoup.archive.layout import SAMPLE_COLUMN
        from psoup.archive.sampling import draws, write_runs

        out = []
        rng = np.random.default_rng()
        for part in parts:
            columns = dict(part.tail)
            columns[SAMPLE_COLUMN] = draws(len(columns[TUPLE_ID]), rng)   # fresh: exact rows
            if part.merged:
                if not all((folder / seg.name).is_file() for seg in part.merged):
                    continue
                merged = [load_segment(folder, seg, part.types, keep_draws=True)
                          for seg in part.merged]
                columns = {name: np.concatenate([m[name] for m in merged] + [columns[name]])
                           for name in [*part.types, SAMPLE_COLUMN]}
            ids, ts = columns[TUPLE_ID], columns[TS]
            name = segment_name(part.handle, int(ids[0]), int(ids[-1]))
            path = folder / name
            make_dir(folder, private=True)      # a data directory's files are owner-only
            make_dir(path.parent, private=True)
            table = pa.table({c: pa.array(v) for c, v in columns.items()})
            write_whole(path, partial(write_runs, table, rng), private=True, fsync=False)
            out.append(Written(part.slot, part.n, Segment(
                name, int(ids[0]), int(ids[-1]), float(ts.min()), float(ts.max()),
                len(ids)), part.merged))
        if out:
            sync_file_system(folder)
        return out

    def mark_saved(self, written: list[Written]) -> None:
        """Index the files `write` wrote as segments of their tiers, in place of the
        segments they merge, and drop their matches from the tails (a tier forgotten
        meanwhile, or saved further by then, ignores them: unnamed files are removed by
        the next checkpoint, the ones replaced here too)."""
        for slot, n, segment, merged in written:
            tier = self._tiers.get(slot)
            k = len(merged)
            if tier is not None and tier.saved == n - segment.rows + sum(
                    seg.rows for seg in merged) and tuple(tier.segments[len(tier.segments)
                                                          - k:]) == merged:
                for seg in merged:
                    self._cache_drop(seg.name)
                tier.saved_as(segment, k)

    def restore(self, stream: str, slot: int, folder: Path, files: list[str]) -> None:
        """Make `slot`'s tier (a selection query on `stream`) visible, indexing the
        segment files `files` under `folder` from their footers; from then on it follows
        the horizon as any tier. O(segments).

        Raises:
            OSError, ValueError: a file is gone, damaged or not a segment of the stream.
        """
        columns = list(self._types(stream))
        tier = Tier([read_footer(folder, name, columns) for name in files])
        self._tiers[slot] = tier
        self._stream_of[slot] = stream
        self._hook(stream)

    def _check(self, slots: list[int]) -> None:
        """Assert the invariants (for tests): tiers only for live `slots`; a tier's
        segments and then its tail in increasing tupleID order, `saved` their count,
        the cache within its bytes; a stream's horizon hook set exactly while some tier
        is on it."""
        tiers = {**self._tiers, **self._pending}
        assert len(tiers) == len(self._tiers) + len(self._pending), "visible or pending"
        assert set(tiers) <= set(slots) and set(tiers) == set(self._stream_of)
        for tier in tiers.values():
            ids = tier.tail.get(TUPLE_ID, np.empty(0, np.int64))
            assert (np.diff(ids) > 0).all(), "a tail is in tupleID order"
            assert len(ids) == len(tier) - tier.saved, "the tail holds what is not saved"
            bounds = [b for seg in tier.segments for b in (seg.first, seg.last)]
            bounds += ids[:1].tolist()
            assert all(a < b for a, b in zip(bounds[1::2], bounds[2::2], strict=False)), \
                "segments, then the tail, in tupleID order"
            assert all(seg.first <= seg.last and seg.lo <= seg.hi and seg.rows > 0
                       or seg.rows == 0 and seg.first == -1 and seg.sample is not None
                       for seg in tier.segments), "a segment holds matches, or is a marker"
            assert all(seg.sample is None for seg in tier.segments[1:]
                       if tier.segments[0].sample is None), "the sampled segments lead"
            assert tier.saved == sum(seg.rows for seg in tier.segments)
        assert self._cached == sum(v.nbytes for got in self._cache.values()
                                   for v in got.values()) <= CACHE_BYTES
        for name, stem in self._stems.items():
            hooked = stem.on_horizon is not None
            assert hooked == (name in self._stream_of.values()), name

    def _hook(self, stream: str) -> None:
        """The stream's horizon hook, set exactly while some tier is on the stream."""
        on = stream in self._stream_of.values()
        self._stems[stream].on_horizon = partial(self._horizon_moved, stream) if on else None

    def _horizon_moved(self, stream: str, old: int, new: int) -> None:
        """Retention passed [old, new): the matches there move to the tiers."""
        slots = [slot for slot, s in self._stream_of.items() if s == stream]
        if slots:
            self._held(stream, self._stems[stream].rows(old, new, expired=True), slots)

    def _held(self, stream: str, rows: dict[str, np.ndarray], slots: list[int]) -> None:
        """Probe tuples still held in memory but past retention for `slots`."""
        n = len(rows[TS])
        if not n:
            return
        bits = self._probe(stream, rows, n)
        # every (slot, row) match at once, by slot then row: a search and a copy per
        # slot cost ~2 ms an insert with 200 queries, on the writer's path, holding the
        # engine lock (and a 2-d np.nonzero is ~10x slower than flatnonzero)
        octets = np.ascontiguousarray(np.ascontiguousarray(bits).view(np.uint8).T)
        flags = np.unpackbits(octets, axis=0, bitorder="little").view(bool)  # (slots, n)
        inside = [slot for slot in slots if slot < len(flags)]
        which, hit = np.divmod(np.flatnonzero(flags[inside]), n)
        taken = {name: values[hit] for name, values in rows.items()}
        bounds = np.searchsorted(which, np.arange(len(inside) + 1)).tolist()
        for k, slot in enumerate(inside):
            a, b = bounds[k], bounds[k + 1]
            if a == b:
                continue
            tier = self._tiers[slot] if slot in self._tiers else self._pending[slot]
            tier.append({name: values[a:b] for name, values in taken.items()})
