"""The retained store of a stream probed in Spark's executors: its committed micro-batches.

A stream created FROM a source WITH (probe = 'executors') keeps nothing in the psoup
process. Each micro-batch is probed where Spark runs it (psoup.spark.executors): every
task writes its rows as one Parquet *part file* holding the stream's columns, ts, and
the batch's Results Structure as columns of 64-bit words (`psoup_w0`, `psoup_w1` ...:
bit b of word w is the query the batch's manifest maps to slot 64w + b). psoup then
commits the batch: the manifest (the files, their rows, ts ranges and first tupleIDs,
and handle -> slot of the queries the batch was probed with) is written into the
batch's staging folder, which is renamed to BATCH_ID/. A folder named by a batch id is
a committed batch, so a batch Spark runs again after a failure finds itself committed
and is not applied twice, across restarts of psoup, the driver and the executors.

A query registered after a batch was probed lacks a bit there; a history pass
(psoup.spark.executors.cover) probes such batches for the queries they lack and writes
*sidecar* word files beside the part files, committed by their own JSON file. A batch
thus answers for exactly the handles its manifest or a committed sidecar names: an
invocation that meets a batch lacking its query is refused (HistoryPending) until the
pass is done, never answered short. Registration and a batch's probe both take the
engine's lock to read the query set, so each batch is probed with a query either in
the batch itself or by the history pass: no gap and no duplicate at the boundary.

Invocation (`BatchStore.part`) reads the batches whose ts range meets the window's
reach: per part file, the ts column, the query's word column and the columns the answer
needs (Parquet column pruning), kept decoded in a cache of CACHE_BYTES. A match's
tupleID is its file's first tupleID plus its row in the file, so tupleIDs are dense and
assigned at commit, from the row counts the executors report.

Costs: a commit is O(part files); `part` is O(rows of the batches the reach meets) in
vectorized numpy, O(batches) to find them; the index holds O(batches + files) entries.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import threading
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from psoup.archive.layout import to_numpy
from psoup.errors import HistoryPending, PSoupError
from psoup.fsync import fsync_dir, make_dir, write_whole
from psoup.query.model import TS, TUPLE_ID, ColumnType

#: A committed batch's manifest, in its folder.
MANIFEST = "manifest.json"
#: Where batches being written wait; emptied when a store opens.
STAGING = ".staging"
#: The prefix of a sidecar's JSON and of its files: SIDECAR + id.
SIDECAR = "cover-"
#: Decoded columns kept for the next invocations, at most this many bytes in all.
CACHE_BYTES = 64 << 20


#: A part file's totals for one query (as psoup.results.aggregates' `with_totals` takes
#: them): {"count": n, "ts_max": t, "sum": {c: s}, "min": {c: m}, "max": {c: m}}.
Totals = dict[str, Any]


def word_column(word: int) -> str:
    """The name of the part file's column holding slots 64*word .. 64*word + 63."""
    return f"psoup_w{word}"


def batch_name(batch_id: int) -> str:
    return f"{batch_id:012d}"


@dataclass(frozen=True)
class PartFile:
    """One task's part of a batch: its file (under the batch's folder), rows, first
    tupleID and ts range (lo > hi for no rows)."""

    name: str
    rows: int
    first: int
    lo: float
    hi: float


@dataclass
class Batch:
    """A committed micro-batch: where it is, its files, and handle -> (sidecar id or
    "" for the part files themselves, slot) of every query it answers for."""

    batch_id: int
    folder: Path
    first: int                      # the tupleID of its first row (the next, if none)
    files: list[PartFile]
    covers: dict[str, tuple[str, int]]
    late: int = 0
    rejected: int = 0
    committed_at: float = 0.0
    sidecars: list[str] = field(default_factory=list)
    #: part file -> handle -> the totals of its matches (aggregates without GROUP BY)
    totals: dict[str, dict[str, Totals]] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def lo(self) -> float:
        return min((f.lo for f in self.files if f.rows), default=math.inf)

    @property
    def hi(self) -> float:
        return max((f.hi for f in self.files if f.rows), default=-math.inf)


class BatchStore:
    """The committed batches of one stream probed in the executors (see the module).

    Args:
        folder: the stream's batches folder (created here; made private).
        types: the stream's columns and their types (the part files hold them, ts and
            words).
        retain_seconds: the stream's RETAIN as a time: answers see the rows with a ts
            at least the latest ts less it, as in memory (`expire` removes the batches
            wholly older).

    Thread-safe: the index is guarded by a lock held for O(batches) at most; files are
    read outside it.
    """

    def __init__(self, folder: Path, types: Mapping[str, ColumnType],
                 retain_seconds: float | None = None):
        self.folder = Path(folder)
        self.types = dict(types)
        self.retain_seconds = retain_seconds
        self._lock = threading.Lock()
        self._batches: list[Batch] = []
        self._cache: OrderedDict[tuple[str, str], NDArray[Any]] = OrderedDict()
        self._cached = 0
        self._latest: float | None = None
        self._covered: Counter[str] = Counter()
        self._full = 0
        make_dir(self.folder, private=True)
        shutil.rmtree(self.folder / STAGING, ignore_errors=True)
        for sub in sorted(self.folder.iterdir()):
            if sub.name.isdigit() and (sub / MANIFEST).exists():
                self._batches.append(_load(sub))
                _tidy(self._batches[-1])
            elif sub.name.isdigit():        # a batch folder without manifest: never
                shutil.rmtree(sub, ignore_errors=True)      # committed (a crash)
        self._update_latest()
        for b in self._batches:
            self._count(b, b.covers, 1)

    # ------------------------------------------------------------------ what it holds

    @property
    def next_tid(self) -> int:
        """The tupleID the next batch's first row gets."""
        with self._lock:
            return self._next_tid()

    def _next_tid(self) -> int:
        last = self._batches[-1] if self._batches else None
        return 0 if last is None else last.first + last.rows

    @property
    def latest_ts(self) -> float | None:
        """The latest ts committed; None before the first row. O(1)."""
        with self._lock:
            return self._latest

    def _update_latest(self) -> None:
        self._latest = max((b.hi for b in self._batches if b.rows), default=None)

    @property
    def rows(self) -> int:
        with self._lock:
            return sum(b.rows for b in self._batches)

    def batches(self) -> list[Batch]:
        with self._lock:
            return list(self._batches)

    def committed(self, batch_id: int) -> bool:
        """Whether batch `batch_id` was committed (or was and left by retention: the
        last committed batch is never removed, so ids up to its are committed)."""
        with self._lock:
            return bool(self._batches) and batch_id <= self._batches[-1].batch_id

    def staging(self) -> Path:
        """A fresh staging folder for one attempt at a batch or a sidecar."""
        path = self.folder / STAGING / uuid.uuid4().hex
        make_dir(path, private=True)
        return path

    # ------------------------------------------------------------------ writes

    def commit(self, batch_id: int, staging: Path, reports: Iterable[Mapping[str, Any]],
               queries: Mapping[str, int], *, committed_at: float) -> Batch:
        """Commit batch `batch_id` from `staging`, where the executors wrote the part
        files named by `reports` (one per task: partition, file, rows, lo, hi, late,
        rejected; a file not named there is a failed attempt's and is removed), probed
        with `queries` (handle -> slot). The tupleIDs follow the last batch's, in
        partition order. Durable on return. O(files).

        Raises:
            PSoupError: batch ids went backwards (a restored data directory).
        """
        reports = sorted(reports, key=lambda r: int(r["partition"]))
        with self._lock:
            if self._batches and batch_id <= self._batches[-1].batch_id:
                raise PSoupError(f"batch {batch_id} is not after the last committed "
                                 f"({self._batches[-1].batch_id})")
            first = tid = self._next_tid()
        files = []
        for r in reports:
            if int(r["rows"]):
                files.append(PartFile(str(r["file"]), int(r["rows"]), tid, float(r["lo"]),
                                      float(r["hi"])))
                tid += int(r["rows"])
        named = {f.name for f in files}
        for path in staging.iterdir():
            if path.name not in named:
                path.unlink()
        manifest = {"batch": batch_id, "committed_at": committed_at, "first": first,
                    "files": [[f.name, f.rows, f.first, f.lo, f.hi] for f in files],
                    "queries": dict(queries), "totals": _by_handle(reports, queries),
                    "late": sum(int(r["late"]) for r in reports),
                    "rejected": sum(int(r["rejected"]) for r in reports)}
        write_whole(staging / MANIFEST, lambda f: f.write(json.dumps(manifest).encode()),
                    private=True)
        fsync_dir(staging)              # (the tasks made their files durable)
        final = self.folder / batch_name(batch_id)
        staging.rename(final)
        fsync_dir(self.folder)
        batch = _load(final)
        with self._lock:
            self._batches.append(batch)
            self._update_latest()
            self._count(batch, batch.covers, 1)
        return batch

    def _count(self, batch: Batch, handles: Iterable[str], sign: int) -> None:
        """Keep `_covered` (handle -> batches with rows answering for it) and `_full`
        (batches with rows), so that `lacking` costs O(handles) when none lacks."""
        if not batch.rows:
            return
        self._full += sign
        for handle in handles:
            self._covered[handle] += sign

    def lacking(self, handles: Iterable[str]) -> dict[int, list[str]]:
        """Batch id -> the handles among `handles` it does not answer for yet (those a
        history pass must probe it with). O(handles), plus O(batches) per handle some
        batch lacks."""
        with self._lock:
            wanted = [h for h in handles if self._covered[h] < self._full]
            if not wanted:
                return {}
            out = {}
            for b in self._batches:
                missing = [h for h in wanted if h not in b.covers]
                if missing and b.rows:
                    out[b.batch_id] = missing
            return out

    def cover(self, batch_id: int, staging: Path, names: Mapping[str, str],
              queries: Mapping[str, int],
              totals: Mapping[str, Mapping[str, Totals]] | None = None) -> None:
        """Commit a sidecar of batch `batch_id`: `names` maps each part file to the
        sidecar file (in `staging`) holding its words for `queries` (handle -> slot),
        and `totals` each part file to its matches' totals per handle (the aggregates
        without GROUP BY among them). A batch left by retention meanwhile is skipped.
        Durable on return. O(files)."""
        with self._lock:
            batch = next((b for b in self._batches if b.batch_id == batch_id), None)
        if batch is None or not batch.folder.exists():
            shutil.rmtree(staging, ignore_errors=True)
            return
        sid = uuid.uuid4().hex[:12]
        moved = {}
        for part, name in names.items():
            target = f"{SIDECAR}{sid}-{part}"
            (staging / name).rename(batch.folder / target)
            moved[part] = target
        kept = {part: dict(per) for part, per in (totals or {}).items()}
        record = {"files": moved, "queries": dict(queries), "totals": kept}
        write_whole(batch.folder / f"{SIDECAR}{sid}.json",
                    lambda f: f.write(json.dumps(record).encode()), private=True)
        fsync_dir(batch.folder)
        shutil.rmtree(staging, ignore_errors=True)
        with self._lock:
            batch.sidecars.append(sid)
            _merge_totals(batch.totals, kept)
            new = [h for h in queries if h not in batch.covers]
            for handle, slot in queries.items():
                batch.covers.setdefault(handle, (sid, int(slot)))
            if batch.rows and any(b is batch for b in self._batches):   # (still kept)
                self._covered.update(new)

    def expire(self, before: float) -> int:
        """Remove the batches whose every row is older than `before` (retention), and
        the empty ones among them; how many. O(batches)."""
        with self._lock:
            # up to the last batch wholly older (an empty batch before it goes too);
            # never the last batch, whose id says which ids were committed
            older = [i for i, b in enumerate(self._batches[:-1]) if b.rows and b.hi < before]
            cut = older[-1] + 1 if older else 0
            gone, self._batches = self._batches[:cut], self._batches[cut:]
            for b in gone:
                self._count(b, b.covers, -1)
        for b in gone:
            shutil.rmtree(b.folder, ignore_errors=True)
        if gone:
            with contextlib.suppress(OSError):
                fsync_dir(self.folder)
        return len(gone)

    # ------------------------------------------------------------------ reads

    def part(self, handle: str, reach: tuple[float, float], columns: Sequence[str]
             ) -> dict[str, NDArray[Any]]:
        """`handle`'s matches with begin <= ts <= end (`reach`) among the retained
        rows: `columns` of the stream, ts and tupleID. O(rows of the batches the reach
        meets).

        Raises:
            HistoryPending: a batch the reach meets does not answer for the handle yet
                (its history pass has not committed).
            PSoupError: a part file is damaged.
        """
        return self._read(handle, reach, columns, False)[0]

    def summarized(self, handle: str, reach: tuple[float, float], columns: Sequence[str]
                   ) -> tuple[dict[str, NDArray[Any]], Totals | None]:
        """As `part`, but the part files wholly inside the reach whose totals for the
        handle were kept (an aggregate without GROUP BY) are not read: their totals
        come summed instead (None when there are none). O(files) plus the rows of the
        files at the reach's edges (and of those without totals)."""
        return self._read(handle, reach, columns, True)

    def _read(self, handle: str, reach: tuple[float, float], columns: Sequence[str],
              summarize: bool) -> tuple[dict[str, NDArray[Any]], Totals | None]:
        begin, end = reach
        wanted = [c for c in dict.fromkeys(columns) if c not in (TS, TUPLE_ID)]
        with self._lock:
            if self.retain_seconds is not None and self._latest is not None:
                begin = max(begin, self._latest - self.retain_seconds)
            meeting = [b for b in self._batches if b.rows and b.hi >= begin and b.lo <= end]
        missing = [b.batch_id for b in meeting if handle not in b.covers]
        if missing:
            raise HistoryPending(
                f"query {handle}: its history over {len(missing)} committed micro-batch"
                f"{'es' if len(missing) > 1 else ''} of its stream is being evaluated in "
                "Spark's executors; try again in a moment")
        pieces = []
        totals = None
        for b in meeting:
            sid, slot = b.covers[handle]
            for f in b.files:
                if not (f.rows and f.hi >= begin and f.lo <= end):
                    continue
                kept = b.totals.get(f.name, {}).get(handle) if summarize else None
                if kept is not None and begin <= f.lo and f.hi <= end:
                    totals = add_totals(totals, kept)
                else:
                    pieces.append(self._matches(b, f, sid, slot, begin, end, wanted))
        out: dict[str, NDArray[Any]] = {}
        for name in [*wanted, TS, TUPLE_ID]:
            arrays = [p[name] for p in pieces]
            out[name] = np.concatenate(arrays) if arrays else self._empty(name)
        return out, totals

    def _matches(self, batch: Batch, f: PartFile, sid: str, slot: int, begin: float,
                 end: float, wanted: list[str]) -> dict[str, NDArray[Any]]:
        path = batch.folder / f.name
        words_path = path if not sid else batch.folder / f"{SIDECAR}{sid}-{f.name}"
        word = self._column(words_path, word_column(slot // 64))
        ts = self._column(path, TS)
        hit = ((word >> np.uint64(slot % 64)) & np.uint64(1)).astype(bool)
        hit &= (ts >= begin) & (ts <= end)
        rows = np.flatnonzero(hit)
        got = {name: self._column(path, name)[rows] for name in wanted}
        got[TS] = ts[rows]
        got[TUPLE_ID] = rows.astype(np.int64) + f.first
        return got

    def _column(self, path: Path, name: str) -> NDArray[Any]:
        import pyarrow.parquet as pq

        key = (str(path), name)
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
                return got
        try:
            table = pq.read_table(path, columns=[name])
        except (OSError, ValueError) as exc:
            if not path.exists():       # left by retention while this read
                raise HistoryPending(f"{path.parent.name}: the batch left retention "
                                     "during the read; try again") from None
            raise PSoupError(f"cannot read {path}: {exc}") from exc
        col = table.column(name)
        ctype = self.types.get(name)
        got = (to_numpy(col, ctype) if ctype is not None
               else np.asarray(col.to_numpy(zero_copy_only=False)))
        with self._lock:
            self._cache[key] = got
            self._cached += got.nbytes
            while self._cached > CACHE_BYTES and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cached -= old.nbytes
        return got

    def _empty(self, name: str) -> NDArray[Any]:
        from psoup.stems.batch import DTYPES
        ctype = self.types.get(name)
        return np.empty(0, np.int64 if name == TUPLE_ID else
                        np.float64 if ctype is None else DTYPES[ctype])

    def _check(self) -> None:
        """Batch ids increase; tupleIDs are dense from the first kept batch on; every
        file has its ts range and exists; the latest ts and the cache's byte count are
        right."""
        with self._lock:
            assert self._latest == max((b.hi for b in self._batches if b.rows), default=None)
            ids = [b.batch_id for b in self._batches]
            assert ids == sorted(set(ids)), ids
            tid = self._batches[0].first if self._batches else 0
            for b in self._batches:
                assert b.first == tid, (b.batch_id, b.first, tid)
                for f in b.files:
                    assert f.first == tid and f.rows > 0 and f.lo <= f.hi, (b.batch_id, f)
                    assert (b.folder / f.name).exists(), f.name
                    tid += f.rows
                for sid, _ in b.covers.values():
                    assert not sid or sid in b.sidecars, sid
            assert self._cached == sum(a.nbytes for a in self._cache.values())
            full = [b for b in self._batches if b.rows]
            assert self._full == len(full)
            assert +self._covered == Counter(h for b in full for h in b.covers)


def _load(folder: Path) -> Batch:
    """A committed batch's index entry from its manifest and sidecars."""
    manifest = json.loads((folder / MANIFEST).read_text())
    files = [PartFile(n, int(r), int(f), float(lo), float(hi))
             for n, r, f, lo, hi in manifest["files"]]
    covers = {h: ("", int(s)) for h, s in manifest["queries"].items()}
    batch = Batch(int(manifest["batch"]), folder, int(manifest["first"]), files, covers,
                  int(manifest["late"]), int(manifest["rejected"]),
                  float(manifest["committed_at"]))
    _merge_totals(batch.totals, manifest.get("totals", {}))
    for path in sorted(folder.glob(f"{SIDECAR}*.json")):
        sid = path.stem.removeprefix(SIDECAR)
        record = json.loads(path.read_text())
        batch.sidecars.append(sid)
        _merge_totals(batch.totals, record.get("totals", {}))
        for handle, slot in record["queries"].items():
            batch.covers.setdefault(handle, (sid, int(slot)))
    return batch


def _tidy(batch: Batch) -> None:
    """Remove what a committed batch's folder holds that nothing names: a part file of
    a task attempt still writing when the batch was committed (Spark's speculation),
    the word files of a sidecar whose JSON was never written (a crash), .tmp files."""
    named = {MANIFEST, *(f.name for f in batch.files)}
    for sid in batch.sidecars:
        named.add(f"{SIDECAR}{sid}.json")
        named.update(f"{SIDECAR}{sid}-{f.name}" for f in batch.files)
    for path in batch.folder.iterdir():
        if path.name not in named:
            path.unlink(missing_ok=True)


def _by_handle(reports: Sequence[Mapping[str, Any]], queries: Mapping[str, int]
               ) -> dict[str, dict[str, Totals]]:
    """The tasks' totals (JSON by slot, per report) as part file -> handle -> totals."""
    handle_of = {str(slot): handle for handle, slot in queries.items()}
    out = {}
    for r in reports:
        raw = r.get("totals")
        if r["file"] and raw:
            out[str(r["file"])] = {handle_of[s]: t for s, t in json.loads(raw).items()}
    return out


def _merge_totals(into: dict[str, dict[str, Totals]],
                  more: Mapping[str, Mapping[str, Totals]]) -> None:
    for part, per_handle in more.items():
        for handle, totals in per_handle.items():
            into.setdefault(part, {}).setdefault(handle, totals)


def fsync_file(path: Path) -> None:
    """Make a file's bytes durable (the executors call it on what they write)."""
    import os
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- aggregate totals

def add_totals(a: Totals | None, b: Totals) -> Totals:
    """The totals of the rows of `a` and of `b` together."""
    if a is None:
        return b
    if not b["count"]:
        return a
    if not a["count"]:
        return b
    return {"count": a["count"] + b["count"], "ts_max": max(a["ts_max"], b["ts_max"]),
            "sum": {c: a["sum"][c] + b["sum"][c] for c in a["sum"]},
            "min": {c: min(a["min"][c], b["min"][c]) for c in a["min"]},
            "max": {c: max(a["max"][c], b["max"][c]) for c in a["max"]}}
