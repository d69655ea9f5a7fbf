"""Checkpoints: the engine's whole state as files read back at disk speed.

A checkpoint is a folder of raw array files and a manifest, DIR/checkpoint/:

* per stream and chunk of its Data SteM, the chunk's block of 8-byte columns (INT,
  FLOAT, ts, tupleID) as it is in memory (`d.*.raw`, (wide columns, chunk_rows) uint64),
  and its TEXT and BOOL columns (`n.*.mp`, msgpack), the rows retention has passed but
  memory still holds included;
* PSoup-P: per stream and chunk, the bitmap chunk as it is in memory (`b.*.raw`, word
  rows of chunk_rows + ROW_PAD words, each row's form in its first padding word);
  PSoup-C: every query's position list, one after the other (`c.*.raw`);
* `manifest-NNNNNNNN.mp`, written last (a temporary file fsynced and renamed): the
  streams' definitions and counters, the files, every handle with its SQL and Query SteM
  slots, the tupleID counter, the producers' table, the archive tiers, the queries whose
  history is due, and the first log segment after the checkpoint. The newest manifest is
  the checkpoint; files it does not name are left-overs, removed.

Taking one (`take`, under the engine's lock) costs O(chunks + queries): it keeps
references to the chunks, which do not change once full except for the bits a
registration or an unregistration sets or clears, and switches the log to a new segment.
The files are then written off the lock (`write`) while writes go on. A chunk that
changes meanwhile (the last one filling, bits of a query registered or unregistered
after the cut) is repaired at recovery by the log after the cut, which holds every such
change and is replayed in order into the same slots (`QuerySteM.allocate` is
deterministic): a registration sets its bits again, an unregistration clears them, a
batch's probe writes its rows whole. PSoup-P's bitmap is frozen while it is written (no
row turns bit-sliced in place, no expired chunk is reused: `PartialResults.frozen`).

A full chunk's data file and, when no query was registered or unregistered since the
previous checkpoint's cut, a full bitmap chunk's file are the previous checkpoint's,
named again rather than written again: an ingest-only engine writes its new chunks.

Recovery (`restore`) maps the files copy-on-write (MAP_PRIVATE: a page is read when
first touched, while a thread has the kernel read them all ahead, and a write changes
the process's copy, never the file; files are never written once named by a manifest),
creates the streams, registers the queries in their slots before the data (each meets
no tuples: O(factors)), puts the chunks of data and of the results structure in place,
and registers the queries whose structures are rebuilt from the data (aggregates,
joins) through the ordinary path. Then the log after the checkpoint is replayed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
from numpy.typing import NDArray

from psoup.codec import decode_array, encode_array
from psoup.errors import PSoupError
from psoup.fsync import file_mode, fsync_dir, make_dir
from psoup.plans import filed
from psoup.query import compile_statement
from psoup.query.model import TS, TUPLE_ID, Query, StreamSchema
from psoup.results.complete import CompleteResults
from psoup.results.partial import ROW_PAD, PartialResults
from psoup.stems.batch import make_batch
from psoup.stems.data_stem import StemImage

if TYPE_CHECKING:
    from psoup.core import Core

#: The manifest format this code writes and reads.
VERSION = 1

_MANIFEST = re.compile(r"manifest-(\d{8,})\.mp\Z")
_WRITE = 64 << 20          # bytes per write call (each releases the GIL)


def _manifest_name(number: int) -> str:
    return f"manifest-{number:08d}.mp"


@dataclass
class StreamCut:
    """One stream at the cut: its definition, its chunks, PSoup-P's bitmap chunks."""

    ddl: str
    wide: list[str]
    image: StemImage
    bits: tuple[int, dict[int, NDArray[np.uint64]]] | None = None


@dataclass
class Cut:
    """What one checkpoint writes, taken under the engine's lock (`take`)."""

    number: int                       # of its manifest
    wal: int                          # the first log segment after the cut
    edits: int                        # registrations etc. logged before the cut
    chunk_rows: int
    streams: dict[str, StreamCut]
    handles: list[tuple[str, str, tuple[int, ...]]]
    next_slot: int
    words: int
    next_tid: int
    producers: list[Any]
    history: list[str]
    tiers: dict[str, list[str]]
    complete: tuple[dict[int, list[NDArray[np.int64]]], dict[str, int]] | None = None
    frozen: PartialResults | None = None
    manifest: dict[str, Any] | None = None              # once written


def take(core: Core, number: int, wal: int, edits: int, producers: list[Any],
         history: list[str], tiers: dict[str, list[str]]) -> Cut:
    """The cut: references to the state of `core` (no array is copied). Under the
    engine's lock; PSoup-P's bitmap stays frozen until `release`. O(chunks +
    queries)."""
    selections = core.kept.selections
    bits = selections.image() if isinstance(selections, PartialResults) else {}
    streams = {}
    for name, stem in core.stems.items():
        streams[name] = StreamCut(core.ddl[name], stem.wide, stem.image(), bits.get(name))
    handles = [(h, plan.query.sql, tuple(slot for slot, _ in filed(plan)))
               for h, plan in core.handles.items()]
    cut = Cut(number, wal, edits, core.chunk_rows, streams, handles,
              core.query_stem.next_slot, core.query_stem.words, core.next_tid, producers,
              history, tiers)
    if isinstance(selections, CompleteResults):
        cut.complete = selections.image()
    if isinstance(selections, PartialResults):
        selections.frozen = True
        cut.frozen = selections
    return cut


def release(cut: Cut) -> None:
    """Unfreeze what the cut froze (under the engine's lock)."""
    if cut.frozen is not None:
        cut.frozen.frozen = False
        cut.frozen = None


# ---------------------------------------------------------------------- writing

def write(cut: Cut, folder: Path, previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """Write the cut's files and then its manifest into `folder`, reusing the unchanged
    files of the `previous` manifest; the manifest's rename makes the checkpoint valid.
    Returns the manifest. Off the engine's lock. O(state written).

    Raises:
        OSError: a file could not be written (the previous checkpoint stays valid).
    """
    make_dir(folder, private=True)
    same_queries = previous is not None and previous.get("edits") == cut.edits
    old = {} if previous is None else {s["name"]: s for s in previous["streams"]}
    streams = [_write_stream(cut, folder, name, stream, old.get(name), same_queries)
               for name, stream in cut.streams.items()]
    manifest: dict[str, Any] = {
        "version": VERSION, "number": cut.number, "wal": cut.wal, "edits": cut.edits,
        "chunk_rows": cut.chunk_rows, "streams": streams,
        "handles": [[h, sql, list(slots)] for h, sql, slots in cut.handles],
        "next_slot": cut.next_slot, "words": cut.words, "next_tid": cut.next_tid,
        "producers": cut.producers, "history": cut.history, "tiers": cut.tiers,
        "complete": None if cut.complete is None else _write_complete(cut, folder)}
    name = _manifest_name(cut.number)
    tmp = folder / (name + ".tmp")
    _write_file(tmp, msgpack.packb(manifest, use_bin_type=True))
    os.replace(tmp, folder / name)
    fsync_dir(folder)
    return manifest


def _write_stream(cut: Cut, folder: Path, name: str, stream: StreamCut,
                  old: Mapping[str, Any] | None, same_queries: bool) -> dict[str, Any]:
    image, cap = stream.image, cut.chunk_rows
    tid_row = stream.wide.index(TUPLE_ID)
    reusable = {} if old is None else {(c[0], c[1]): c for c in old["chunks"]}
    chunks, tid0s = [], {}
    for i, (block, narrow, rows) in enumerate(zip(image.blocks, image.narrow, image.rows,
                                                 strict=True)):
        k = image.chunk0 + i
        tid0 = tid0s[k] = int(block[tid_row, 0].view(np.int64))
        before = reusable.get((k, tid0))
        if before is not None and before[2] == cap == rows:
            chunks.append(before)
            continue
        stem = f"{name}.{k}.{tid0}.{cut.number}"
        data = f"d.{stem}.raw"
        _write_array(folder / data, block)
        text = ""
        if narrow:
            text = f"n.{stem}.mp"
            _write_file(folder / text, msgpack.packb(
                {c: encode_array(v[:rows]) for c, v in narrow.items()}, use_bin_type=True))
        chunks.append([k, tid0, rows, data, text])
    out: dict[str, Any] = {
        "name": name, "ddl": stream.ddl, "chunk0": image.chunk0, "n": image.n,
        "horizon": image.horizon, "last_ts": image.last_ts, "at_last_ts": image.at_last_ts,
        "rows_total": image.rows_total, "chunks": chunks, "bits": None}
    if stream.bits is not None:
        out["bits"] = _write_bits(cut, folder, name, stream.bits, tid0s,
                                  (old or {}).get("bits") if same_queries else None)
    return out


def _write_bits(cut: Cut, folder: Path, name: str,
                bits: tuple[int, dict[int, NDArray[np.uint64]]], tid0s: Mapping[int, int],
                old: Mapping[str, Any] | None) -> dict[str, Any]:
    written, chunks = bits
    cap = cut.chunk_rows
    reusable = {} if old is None else {(c[0], c[1]): c for c in old["chunks"]}
    out = []
    for k, padded in sorted(chunks.items()):
        tid0 = tid0s.get(k, -1)
        sealed = (k + 1) * cap <= written
        before = reusable.get((k, tid0))
        if sealed and tid0 >= 0 and before is not None and before[3] and \
                before[2] == padded.shape[0]:
            out.append(before)
            continue
        file = f"b.{name}.{k}.{tid0}.{cut.number}.raw"
        _write_array(folder / file, padded)
        out.append([k, tid0, int(padded.shape[0]), sealed, file])
    return {"written": written, "chunks": out}


def _write_complete(cut: Cut, folder: Path) -> dict[str, Any]:
    assert cut.complete is not None
    lists, horizons = cut.complete
    slots = sorted(lists)
    parts = [np.concatenate(lists[s]) if lists[s] else np.empty(0, np.int64) for s in slots]
    file = f"c.{cut.number}.raw"
    _write_array(folder / file, np.concatenate(parts) if parts else np.empty(0, np.int64))
    return {"file": file, "slots": slots, "counts": [len(p) for p in parts],
            "horizons": horizons}


def _write_array(path: Path, array: NDArray[Any]) -> None:
    assert array.flags.c_contiguous, "a checkpoint writes arrays as they are in memory"
    _write_file(path, array.data.cast("B"))


def _write_file(path: Path, data: bytes | memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode(True))
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view[:_WRITE]):]
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- reading

def newest(folder: Path) -> dict[str, Any] | None:
    """The newest manifest in `folder` (None: no checkpoint yet); removes left-over
    temporary ones.

    Raises:
        PSoupError: it cannot be read (the log before it is gone: psoup will not guess).
    """
    if not folder.is_dir():
        return None
    for tmp in folder.glob("manifest-*.tmp"):
        tmp.unlink()
    found = sorted((int(m.group(1)), p) for p in folder.iterdir()
                   if (m := _MANIFEST.match(p.name)))
    if not found:
        return None
    path = found[-1][1]
    try:
        manifest = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
        if not isinstance(manifest, dict) or manifest.get("version") != VERSION:
            raise ValueError(f"not a version {VERSION} manifest")
    except (OSError, ValueError, msgpack.UnpackException) as exc:
        raise PSoupError(f"checkpoint manifest {path} cannot be read ({exc}); refusing to "
                         "start without the state it names") from None
    return dict(manifest)


def collect(folder: Path, manifest: Mapping[str, Any] | None) -> None:
    """Remove the files and manifests of `folder` that `manifest` (the newest) does not
    name: older checkpoints', and those of a checkpoint cut short. Best effort."""
    if not folder.is_dir():
        return
    kept = set() if manifest is None else set(files_of(manifest))
    if manifest is not None:
        kept.add(_manifest_name(int(manifest["number"])))
    for path in folder.iterdir():
        if path.name not in kept:
            with contextlib.suppress(OSError):
                path.unlink()


def files_of(manifest: Mapping[str, Any]) -> list[str]:
    """Every file a manifest names."""
    out = []
    for stream in manifest["streams"]:
        out += [c[3] for c in stream["chunks"]] + [c[4] for c in stream["chunks"] if c[4]]
        if stream["bits"] is not None:
            out += [c[4] for c in stream["bits"]["chunks"]]
    if manifest.get("complete"):
        out.append(manifest["complete"]["file"])
    return out


def _mapped(path: Path, shape: tuple[int, ...], dtype: type[np.generic]) -> NDArray[Any]:
    """The file at `path`, which holds exactly an array of `shape`, mapped copy-on-write
    (MAP_PRIVATE): its pages are read when first touched (a `_Readahead` brings them in
    meanwhile), and a write changes this process's copy, never the file. O(1).

    Raises:
        PSoupError: the file is missing or not of that size."""
    want = int(np.prod(shape)) * np.dtype(dtype).itemsize
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size != want:
                raise ValueError(f"{size} bytes where {want} are expected")
            if not size:
                return np.empty(shape, dtype)
            view = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:
        raise PSoupError(f"checkpoint file {path} cannot be read ({exc})") from None
    out: NDArray[Any] = np.ndarray(shape, dtype, buffer=view)
    return out


class _Readahead(threading.Thread):
    """Asks the kernel to read a checkpoint's files into the page cache, one after the
    other (posix_fadvise WILLNEED, which releases the GIL), while the restart maps them
    and registers the queries; a file gone meanwhile is skipped."""

    def __init__(self, paths: list[Path]):
        super().__init__(name="psoup-checkpoint-readahead", daemon=True)
        self.paths = paths
        self.seconds = 0.0

    def run(self) -> None:
        began = time.perf_counter()
        advise = getattr(os, "posix_fadvise", None)     # not on macOS: pages read on use
        if advise is None:
            return
        for path in self.paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)
        self.seconds = time.perf_counter() - began


@dataclass
class Restore:
    """What `restore` did, for a caller that times it: seconds mapping the files, in the
    queries (Query SteM, windows, sinks), rebuilding structures from the data, and in
    all; the bytes mapped; the thread reading them ahead (join it to wait for it)."""

    read: float = 0.0
    queries: float = 0.0
    rebuilt: float = 0.0
    total: float = 0.0
    bytes: int = 0
    handles: int = 0
    readahead: threading.Thread | None = None     # still reading ahead, maybe


def restore(core: Core, manifest: Mapping[str, Any], folder: Path,
            create: Callable[[StreamSchema, str], None]) -> Restore:
    """Put the checkpoint of `manifest` into the empty `core`: streams (through
    `create`, as a live CREATE STREAM), the queries whose matches the files hold in
    their slots (before the data: each meets no tuples), the chunks (mapped, a thread
    having the kernel read them ahead meanwhile), the results structure's chunks, and
    then the queries whose structures are rebuilt from the data (aggregates, joins)
    through the ordinary registration (their bits, in the chunks read back already, are
    set again). The producers, tiers and history are the caller's
    (`manifest["producers"]`, ...). O(files + queries), plus the rebuilt queries'
    registrations over the data; the files' pages are read as they are touched.

    An engine opened with another `chunk_rows` than the checkpoint's takes its tuples
    through the ordinary path instead, every query registered first (`_reinsert`):
    O(retained tuples x queries / 64), as an ingest of them.

    Raises:
        PSoupError: a file is missing or damaged.
    """
    began = time.perf_counter()
    timing = Restore()
    timing.readahead = _Readahead([folder / name for name in files_of(manifest)])
    timing.readahead.start()
    for stream in manifest["streams"]:
        stmt = compile_statement(stream["ddl"], core.schemas())
        assert isinstance(stmt, StreamSchema)
        create(stmt, stream["ddl"])
    same = int(manifest["chunk_rows"]) == core.chunk_rows
    started = time.perf_counter()
    later = _register(core, manifest["handles"], rebuilt=not same)
    timing.queries = time.perf_counter() - started
    started = time.perf_counter()
    for stream in manifest["streams"]:
        if same:
            timing.bytes += _restore_stream(core, stream, folder)
        else:
            timing.bytes += _reinsert(core, stream, folder, int(manifest["chunk_rows"]))
    if same:
        timing.bytes += _restore_results(core, manifest, folder)
    timing.read = time.perf_counter() - started
    # over the results structure read back, which holds their bits already: each
    # registration sets them again in the chunks that are there, allocating none
    started = time.perf_counter()
    _register(core, later, rebuilt=True)
    timing.rebuilt = time.perf_counter() - started
    order = [h for h, _, _ in manifest["handles"]]
    core.handles = {h: core.handles[h] for h in order}
    core.query_stem.restore_slots(int(manifest["next_slot"]), int(manifest["words"]))
    core.next_tid = max(core.next_tid, int(manifest["next_tid"]))
    timing.handles = len(order)
    timing.total = time.perf_counter() - began
    return timing


def _reinsert(core: Core, stream: Mapping[str, Any], folder: Path, cap: int) -> int:
    """A stream's retained tuples, read from chunks of `cap` rows, inserted through the
    ordinary path (the rows retention had passed were archived at the cut); its
    counters as they were. Returns the bytes read."""
    stem = core.stem(stream["name"])
    names, wide = [c for c, _ in stem.schema.columns], stem.wide
    horizon, done = int(stream["horizon"]), 0
    for i, (_, _, rows, data, text) in enumerate(stream["chunks"]):
        block = _mapped(folder / data, (len(wide), cap), np.uint64)
        done += block.nbytes
        cols = {name: block[wide.index(name)].view(stem.dtype(name)) for name in wide}
        if text:
            cols.update({c: _column(v) for c, v in msgpack.unpackb(
                _read_bytes(folder / text), raw=False, strict_map_key=False).items()})
        first = max(0, horizon - (int(stream["chunk0"]) + i) * cap)
        if first >= int(rows):
            continue
        part = slice(first, int(rows))
        batch = make_batch(stem.schema, {c: cols[c][part] for c in names}, cols[TS][part],
                           0.0, stem.last_ts)
        core.append(stream["name"], batch, np.ascontiguousarray(cols[TUPLE_ID][part]))
    stem.at_last_ts = int(stream["at_last_ts"])
    stem.rows_total = int(stream["rows_total"])
    return done


def _register(core: Core, handles: Sequence[Sequence[Any]], rebuilt: bool
              ) -> list[Sequence[Any]]:
    """Register `handles` ([handle, sql, slots]) in their slots; without `rebuilt`, only
    those whose matches the checkpoint's files hold, returning the others."""
    later: list[Sequence[Any]] = []
    for handle, sql, slots in handles:
        query = compile_statement(sql, core.schemas())
        assert isinstance(query, Query)
        if not rebuilt and _rebuilt(core, query):
            later.append((handle, sql, slots))
            continue
        core.register(query, handle, in_slots=tuple(int(s) for s in slots))
    return later


def _rebuilt(core: Core, query: Query) -> bool:
    """Whether the query's structure is rebuilt from the data rather than read back:
    an aggregate's indexes and a join's group (PSoup-P's bits and PSoup-C's lists of a
    selection are read back; NoMat keeps nothing)."""
    return (core.kept.materializes and not query.contradiction
            and (len(query.sources) > 1 or query.aggregated))


def _restore_stream(core: Core, stream: Mapping[str, Any], folder: Path) -> int:
    """A stream's chunks into its (empty) Data SteM; returns the bytes mapped."""
    stem = core.stem(stream["name"])
    shape = (len(stem.wide), stem.chunk_rows)
    blocks, narrow, done = [], [], 0
    for _, _, _, data, text in stream["chunks"]:
        blocks.append(_mapped(folder / data, shape, np.uint64))
        done += blocks[-1].nbytes
        cols: dict[str, NDArray[Any]] = {}
        if text:
            raw = _read_bytes(folder / text)
            cols = {c: _column(v) for c, v in
                    msgpack.unpackb(raw, raw=False, strict_map_key=False).items()}
        narrow.append(cols)
    stem.restore(StemImage(
        int(stream["chunk0"]), int(stream["n"]), int(stream["horizon"]),
        float(stream["last_ts"]), int(stream["at_last_ts"]), int(stream["rows_total"]),
        blocks, narrow, [int(c[2]) for c in stream["chunks"]]))
    return done


def _restore_results(core: Core, manifest: Mapping[str, Any], folder: Path) -> int:
    """PSoup-P's bitmap chunks, or PSoup-C's lists, into the selection structure;
    returns the bytes mapped."""
    selections, cap, done = core.kept.selections, core.chunk_rows, 0
    if isinstance(selections, PartialResults):
        for stream in manifest["streams"]:
            if stream["bits"] is None:
                continue
            padded = {int(k): _mapped(folder / file, (int(words), cap + ROW_PAD), np.uint64)
                      for k, _, words, _, file in stream["bits"]["chunks"]}
            done += sum(array.nbytes for array in padded.values())
            selections.restore(stream["name"], int(stream["bits"]["written"]), padded)
    complete = manifest.get("complete")
    if complete and isinstance(selections, CompleteResults):
        counts = [int(c) for c in complete["counts"]]
        positions = _mapped(folder / complete["file"], (sum(counts),), np.int64)
        ends = np.cumsum(counts).tolist()
        lists = {int(slot): positions[end - count:end]
                 for slot, count, end in zip(complete["slots"], counts, ends, strict=True)}
        selections.restore(lists, {str(s): int(h) for s, h in complete["horizons"].items()})
        done += positions.nbytes
    return done


def _column(value: Any) -> NDArray[Any]:
    """A TEXT or BOOL column as `encode_array` wrote it."""
    decoded = decode_array(value)
    if isinstance(decoded, np.ndarray):
        return decoded
    out = np.empty(len(decoded), dtype=object)
    out[:] = decoded
    return out


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PSoupError(f"checkpoint file {path} cannot be read ({exc})") from None
