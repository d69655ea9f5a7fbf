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

Matches are kept in tupleID (hence ts) order as column arrays, appended in blocks and
consolidated at the next read; a window selects a ts range of them by binary search
(how far each kind of window reaches: psoup.results.windows_table).

`ArchiveTiers` holds the tiers of one engine and owns the hook that keeps them equal to
"matches below the horizon"; the Spark pass that fills them is psoup.spark.history.
Tiers are saved as Parquet segment files, each holding the matches a tier gained since
its previous save (after its job, then at each checkpoint), and restored from them when
the engine reopens (docs/durability.md, "What is on disk").
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from psoup.fsync import fsync_dir, make_dir, write_whole
from psoup.query.model import TS, TUPLE_ID, Window
from psoup.results.windows_table import archive_reach
from psoup.stems.data_stem import DataSteM

#: Probe n rows of a stream's columns against the standing queries: bit rows (n, words).
Probe = Callable[[str, Mapping[str, np.ndarray], int], np.ndarray]


class Tier:
    """One query's archived matches: `columns` (every stream column, ts and tupleID
    included) in tupleID order.

    Example:
        >>> t = Tier()
        >>> t.append({"ts": np.array([1.0, 2.0]), "tupleID": np.array([4, 9]),
        ...           "a": np.array([7, 8])})
        >>> t.between(1.5, 3.0)["a"].tolist(), len(t)
        ([8], 2)
    """

    def __init__(self) -> None:
        self._blocks: list[dict[str, np.ndarray]] = []
        self._merged: dict[str, np.ndarray] | None = None
        self.saved = 0                    # leading matches already in segment files
        self.files: list[str] = []        # those files, oldest first (`ArchiveTiers.save`)

    def append(self, columns: Mapping[str, np.ndarray]) -> None:
        """Matches with tupleIDs above every stored one."""
        if len(columns[TUPLE_ID]):
            self._blocks.append(dict(columns))
            self._merged = None

    def extend(self, later: Tier) -> None:
        """Append the blocks of `later`, whose tupleIDs are above every stored one."""
        for block in later._blocks:
            self.append(block)

    @property
    def columns(self) -> dict[str, np.ndarray]:
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

    def between(self, begin: float, end: float) -> dict[str, np.ndarray]:
        """The matches with begin <= ts <= end. O(log n) plus the copy-free slice."""
        columns = self.columns
        if not columns:
            return {}
        if begin == -np.inf and end == np.inf:
            return columns
        a = int(np.searchsorted(columns[TS], begin, side="left"))
        b = int(np.searchsorted(columns[TS], end, side="right"))
        return {name: values[a:b] for name, values in columns.items()}

    def __len__(self) -> int:
        return sum(len(b[TUPLE_ID]) for b in self._blocks)

    def nbytes(self) -> int:
        return sum(v.nbytes for b in self._blocks for v in b.values())


class ArchiveTiers:
    """The archive tiers of one engine's selection queries, by slot.

    `begin` gives queries pending tiers (the tuples still held in memory below the
    horizon, probed here); from then on the Data SteM's `on_horizon` hook moves each
    query's matches among the tuples that leave retention into its tier, pending or
    not, before their chunk can be dropped. `finish` puts the Spark matches in front of
    the pending tiers and makes them visible; `abort` drops them. `save` writes what
    each tier gained since its last save as one more Parquet file (O(those matches)),
    `restore` reads a tier back (O(its matches)). O(matches) memory; an invocation
    reads a window's part in O(log n).

    Example:
        >>> from psoup.query.model import StreamSchema
        >>> from psoup.stems.batch import make_batch
        >>> stem = DataSteM(StreamSchema("R", (("a", "int"),), retain_rows=1), chunk_rows=4)
        >>> tiers = ArchiveTiers({"R": stem}, lambda s, cols, n: np.ones((n, 1), "<u8"))
        >>> tiers.begin("R", [0])
        >>> _ = stem.append(make_batch(stem.schema, [(1,), (2,)], 1.0, 0, stem.last_ts),
        ...                 np.array([1, 2]))
        >>> 0 in tiers, tiers.pending
        (False, [0])
        >>> tiers.finish({"R": {0: {"ts": np.array([0.5]), "tupleID": np.array([0]),
        ...                         "a": np.array([9])}}})
        >>> tiers.part(0, Window(), 5.0)["a"].tolist()
        [9, 1]
    """

    def __init__(self, stems: Mapping[str, DataSteM], probe: Probe):
        self._stems = stems
        self._probe = probe
        self._tiers: dict[int, Tier] = {}
        self._pending: dict[int, Tier] = {}
        self._stream_of: dict[int, str] = {}      # of visible and pending tiers

    def __contains__(self, slot: int) -> bool:
        return slot in self._tiers

    def count(self, slot: int) -> int:
        """The archived matches of `slot` (0 without a tier)."""
        tier = self._tiers.get(slot)
        return 0 if tier is None else len(tier)

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

    def finish(self, found: Mapping[str, Mapping[int, Mapping[str, np.ndarray]]]) -> None:
        """Make the pending tiers visible, each with `found[stream][slot]` (the Spark
        matches, in tupleID order) in front; a slot no longer pending (its query was
        unregistered meanwhile) is skipped, a pending one without matches dropped."""
        for matches in found.values():
            for slot, columns in matches.items():
                held = self._pending.pop(slot, None)
                if held is not None:
                    tier = self._tiers[slot] = Tier()
                    tier.append(columns)
                    tier.extend(held)
        self.abort()

    def abort(self) -> None:
        """Drop every pending tier (a history job failed or was cancelled)."""
        for slot in list(self._pending):
            self.forget(slot)

    def forget(self, slot: int) -> None:
        """Drop `slot`'s tier, visible or pending; a stream left without tiers loses
        its hook."""
        if self._tiers.pop(slot, None) is None and self._pending.pop(slot, None) is None:
            return
        self._hook(self._stream_of.pop(slot))

    def part(self, slot: int, window: Window, now: float) -> dict[str, np.ndarray] | None:
        """The slot's archived matches that `window` selects at `now` (all columns, ts
        and tupleID included), or None when there are none or the window counts tuples
        in memory only."""
        tier = self._tiers.get(slot)
        reach = archive_reach(window, now)
        if tier is None or not len(tier) or reach is None:
            return None
        got = tier.between(*reach)
        return got if got and len(got[TUPLE_ID]) else None

    def nbytes(self) -> int:
        return sum(t.nbytes() for t in self._tiers.values())

    def save(self, folder: Path, handle_of: Mapping[int, str]) -> dict[str, list[str]]:
        """Write the matches each tier of `handle_of` (slot -> handle) gained since it
        was last saved as one more segment file (`unsaved`, `write`, `mark_saved`), and
        return handle -> its segment files (relative to `folder`), oldest first; a tier
        without matches has none. For a checkpoint, under the engine's lock: the tiers
        then outlive a restart (`restore`). O(matches not yet saved).

        Raises:
            OSError: a file could not be written (those written stay, and count as saved).
        """
        self.mark_saved(self.write(folder, self.unsaved(handle_of)))
        return {handle: list(self._tiers[slot].files) for slot, handle in handle_of.items()
                if slot in self._tiers}

    def unsaved(self, handle_of: Mapping[int, str]
                ) -> list[tuple[int, str, dict[str, np.ndarray], int]]:
        """(slot, handle, its matches not yet saved, its matches in all) per tier of
        `handle_of` with some: arrays that later appends leave alone, so `write` may
        run off the engine's lock. O(tiers), plus consolidating each tier's blocks."""
        out = []
        for slot, handle in handle_of.items():
            tier = self._tiers.get(slot)
            if tier is not None and len(tier) > tier.saved:
                n = len(tier)
                out.append((slot, handle, {name: values[tier.saved:n]
                                           for name, values in tier.columns.items()}, n))
        return out

    @staticmethod
    def write(folder: Path, parts: list[tuple[int, str, dict[str, np.ndarray], int]]
              ) -> list[tuple[int, str, int]]:
        """Write each part of `unsaved` as `folder/HANDLE/FIRST-LAST.parquet` (tupleIDs;
        written whole: a .tmp renamed, fsync'ed); returns (slot, file name, matches in
        all) for `mark_saved`. Needs no lock. O(matches written).

        Raises:
            OSError: a file could not be written.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        out = []
        for slot, handle, part, n in parts:
            ids = part[TUPLE_ID]
            name = f"{handle}/{int(ids[0]):020d}-{int(ids[-1]):020d}.parquet"
            path = folder / name
            make_dir(folder, private=True)      # a data directory's files are owner-only
            make_dir(path.parent, private=True)
            table = pa.table({c: pa.array(v) for c, v in part.items()})
            write_whole(path, partial(pq.write_table, table), private=True)
            fsync_dir(path.parent)
            out.append((slot, name, n))
        return out

    def mark_saved(self, written: list[tuple[int, str, int]]) -> None:
        """Record files `write` wrote as saved parts of their tiers (a tier forgotten
        meanwhile, or saved further by then, ignores them: unnamed files are removed by
        the next checkpoint)."""
        for slot, name, n in written:
            tier = self._tiers.get(slot)
            if tier is not None and tier.saved < n:
                tier.files.append(name)
                tier.saved = n

    def restore(self, stream: str, slot: int, folder: Path, files: list[str]) -> None:
        """Make `slot`'s tier (a selection query on `stream`) visible, holding the
        matches `save` wrote to `files` under `folder`; from then on it follows the
        horizon as any tier. O(its matches)."""
        import pyarrow.parquet as pq

        tier = Tier()
        for name in files:
            table = pq.read_table(folder / name)
            tier.append({c: table.column(c).to_numpy(zero_copy_only=False)
                         for c in table.column_names})
        tier.saved, tier.files = len(tier), list(files)
        self._tiers[slot] = tier
        self._stream_of[slot] = stream
        self._hook(stream)

    def _check(self, slots: list[int]) -> None:
        """Assert the invariants (for tests): tiers only for live `slots`, in tupleID
        order, their saved matches a prefix kept in files, and a stream's horizon hook
        set exactly while some tier is on it."""
        tiers = {**self._tiers, **self._pending}
        assert len(tiers) == len(self._tiers) + len(self._pending), "visible or pending"
        assert set(tiers) <= set(slots) and set(tiers) == set(self._stream_of)
        for tier in tiers.values():
            ids = tier.columns.get(TUPLE_ID, np.empty(0, np.int64))
            assert (np.diff(ids) > 0).all(), "a tier is in tupleID order"
            assert 0 <= tier.saved <= len(tier), "saved matches are a prefix of the tier"
            assert bool(tier.files) == (tier.saved > 0), "saved matches are in files"
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
