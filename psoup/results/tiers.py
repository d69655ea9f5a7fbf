"""The archive tier of the Results Structure: a query's matches among tuples that left
memory ("Remembrance of Streams Past", hybrid queries over archived and live data).

A query gets a tier when its history is evaluated (`Engine.evaluate_history`): a Spark
pass over the archive (psoup.spark.history) finds its matches among archived tuples,
and the tuples between the oldest one still held in memory and the retention horizon
are probed on the spot. From then on the tier grows with the horizon: the tuples that
leave retention are probed before they can be dropped, and the query's matches among
them are appended. So at every moment the tier holds exactly the query's matches with
tupleID below the stream's horizon, and memory the ones at or above it: an answer that
joins the two counts no tuple twice and misses none.

Matches are kept in tupleID (hence ts) order as column arrays, appended in blocks and
consolidated at the next read; a window selects a ts range of them by binary search
(how far each kind of window reaches: psoup.results.windows_table).

`ArchiveTiers` holds the tiers of one engine and owns the hook that keeps them equal to
"matches below the horizon"; the Spark pass that fills them is psoup.spark.history.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Mapping

import numpy as np

from psoup.bits import slot_rows
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

    def append(self, columns: Mapping[str, np.ndarray]) -> None:
        """Matches with tupleIDs above every stored one."""
        if len(columns[TUPLE_ID]):
            self._blocks.append(dict(columns))
            self._merged = None

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

    `install` gives queries their tiers (the Spark matches, then the tuples still held
    in memory below the horizon, probed here); from then on the Data SteM's `on_horizon`
    hook moves each query's matches among the tuples that leave retention into its
    tier, before their chunk can be dropped. O(matches) memory; an invocation reads a
    window's part in O(log n).

    Example:
        >>> from psoup.query.model import StreamSchema
        >>> from psoup.stems.batch import make_batch
        >>> stem = DataSteM(StreamSchema("R", (("a", "int"),), retain_rows=1), chunk_rows=4)
        >>> tiers = ArchiveTiers({"R": stem}, lambda s, cols, n: np.ones((n, 1), "<u8"))
        >>> tiers.install("R", {0: {"ts": np.array([0.5]), "tupleID": np.array([0]),
        ...                        "a": np.array([9])}})
        >>> _ = stem.append(make_batch(stem.schema, [(1,), (2,)], 1.0, 0, stem.last_ts),
        ...                 np.array([1, 2]))
        >>> tiers.part(0, Window(), 5.0)["a"].tolist()
        [9, 1]
    """

    def __init__(self, stems: Mapping[str, DataSteM], probe: Probe):
        self._stems = stems
        self._probe = probe
        self._tiers: dict[int, Tier] = {}
        self._stream_of: dict[int, str] = {}

    def __contains__(self, slot: int) -> bool:
        return slot in self._tiers

    def count(self, slot: int) -> int:
        """The archived matches of `slot` (0 without a tier)."""
        tier = self._tiers.get(slot)
        return 0 if tier is None else len(tier)

    def install(self, stream: str, found: Mapping[int, Mapping[str, np.ndarray]]) -> None:
        """Give each slot of `found` a tier holding its archived matches (in tupleID
        order), plus its matches among the tuples held in memory below the horizon."""
        stem = self._stems[stream]
        for slot, columns in found.items():
            self._tiers[slot] = Tier()
            self._tiers[slot].append(columns)
            self._stream_of[slot] = stream
        self._held(stream, stem.rows(stem.oldest, stem.horizon, expired=True), list(found))
        stem.on_horizon = partial(self._horizon_moved, stream)

    def forget(self, slot: int) -> None:
        """Drop `slot`'s tier; a stream left without tiers loses its hook."""
        if self._tiers.pop(slot, None) is None:
            return
        stream = self._stream_of.pop(slot)
        if stream not in self._stream_of.values():
            self._stems[stream].on_horizon = None

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

    def _check(self, slots: list[int]) -> None:
        """Assert the invariants (for tests): tiers only for live `slots`, in tupleID
        order, and a stream's horizon hook set exactly while some tier is on it."""
        assert set(self._tiers) <= set(slots) and set(self._tiers) == set(self._stream_of)
        for tier in self._tiers.values():
            ids = tier.columns.get(TUPLE_ID, np.empty(0, np.int64))
            assert (np.diff(ids) > 0).all(), "a tier is in tupleID order"
        for name, stem in self._stems.items():
            hooked = stem.on_horizon is not None
            assert hooked == (name in self._stream_of.values()), name

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
        for slot in slots:
            hit = slot_rows(bits, slot)
            self._tiers[slot].append({name: values[hit] for name, values in rows.items()})
