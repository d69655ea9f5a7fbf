"""Sinks: where the eddy delivers a query's matches (PSoup Sect. 3.3, 4.3).

PSoup materializes the query-data join so that an invocation is a lookup. Every
structure that keeps matches -- PSoup-P's bitmap, PSoup-C's lists, an aggregated query's
prefix sums and ranked trees (Sect. 6), a join group's combinations (Sect. 5.4) -- is a
`Sink` with the same four events:

* `on_register(slot, stream, positions)`: a new query's Data SteM probe (Fig. 2: new
  query over old data), the retained positions matching the slot;
* `on_insert(stream, p0, bits, batch)`: a new batch's Query SteM probe (Fig. 3: new data
  over old queries), bit q of bits[i] set when tuple p0 + i matches slot q;
* `on_expire(stream, horizon)`: positions below `horizon` left retention;
* `on_unregister(slot)`: forget the slot, which may be reused.

A sink is attached to the slots whose matches it keeps (`SinkTable`); the eddy hands each
event to the sinks of its slot or stream and knows nothing of what they store. A batch
is delivered once per sink however many of its slots the sink keeps; a sink that keeps
bit rows whole (`keeps_rows`) gets them with the bits of other sinks' slots cleared. A
sink that stores the probe's rows as they are is a `ProbeTarget` (PSoup-P's bitmap): the
probe writes into its memory, and it gets no `on_insert`.

The three engine modes differ in the selection structure (Sect. 5): PSoup-P
(`partial.py`), PSoup-C (`complete.py`), NoMat (`nomat.py`, which keeps nothing).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from psoup.bits import DTYPE, bit_row, set_bit, widened, words_for
from psoup.query.model import Source
from psoup.stems.data_stem import DataSteM
from psoup.stems.span import Span


class Sink(ABC):
    """The four events; the defaults ignore them, and a sink overrides those it keeps."""

    #: Whether the sink stores probe rows whole, and so must not see other sinks' bits.
    keeps_rows: bool = False

    def on_register(self, slot: int, stream: str, positions: np.ndarray) -> None:
        """A new query's matches among the retained tuples of `stream` (sorted)."""
        return

    def on_insert(self, stream: str, p0: int, bits: np.ndarray,
                  batch: Mapping[str, np.ndarray]) -> None:
        """A batch's probe: bit q of bits[i] set = tuple p0 + i matches slot q. `batch`
        holds the batch's columns, ts and tupleID included."""
        return

    def on_expire(self, stream: str, horizon: int) -> None:
        """Positions of `stream` below `horizon` left retention."""
        return

    def on_unregister(self, slot: int) -> None:
        """Forget everything about `slot`; the slot may be reused."""
        return

    @abstractmethod
    def nbytes(self) -> int:
        """The memory the sink keeps, in bytes."""


class ProbeTarget(Sink):
    """A sink that stores the probe's rows as they are (PSoup-P's bitmap): the Eddy asks
    it where a batch's rows go and has the probe write there; it gets no `on_insert`.
    At most one per stream (`SinkTable.probe_target`)."""

    @abstractmethod
    def destination(self, stream: str, p0: int, n: int, words: int,
                    later: list[Callable[[], None]] | None = None
                    ) -> list[tuple[int, int, np.ndarray]]:
        """(a, b, a (words, b - a) word-major array) per piece of the batch's tuples
        a..b (positions p0 + a ..), for the probe to write into. With `later`, work on
        the arrays that the probe neither reads nor writes may be appended to it as
        callables, which the caller runs before anything reads them."""


class ResultsStructure(Sink):
    """A selection structure: the matches of every selection slot of one engine."""

    keeps_rows = True
    #: Whether `snapshot` takes every span, or only position ranges (the windows that
    #: are none, PARTITION BY's, are then answered under the lock).
    snapshots_arrays = True
    #: The threads a long step may be split over (psoup.stems.halves; None: the cores);
    #: the engine sets its own.
    threads: int | None = None

    def admission_bytes(self, words: int, rows: int) -> int:
        """The most memory that registering one more query can add here at once: its
        slot needs `words` words per row, and it may match all `rows` retained tuples of
        its streams. O(chunks). Nothing kept per query (NoMat): 0."""
        return 0

    def on_drop(self, stream: str) -> None:
        """Forget everything kept of `stream`, dropped once no query read it (a stream
        created again under its name starts at position 0)."""

    def streams(self) -> set[str]:
        """The streams something is kept for (for the engine's invariants)."""
        return set()

    def matches(self, slot: int, source: Source, stem: DataSteM, span: Span) -> np.ndarray:
        """Sorted positions within `span` of the tuples that satisfy query `slot` (valid
        until the structure's next read: a structure may reuse the buffer)."""
        raise NotImplementedError

    def snapshot(self, slot: int, source: Source, span: Span) -> Snapshot | None:
        """Under the engine's lock: what an invocation of query `slot` over `span` reads
        off the lock (psoup.results.reads), the matches as they are now whatever
        changes meanwhile; None when this structure answers `span` only under the lock.
        O(1) to O(chunks) here; the find is the snapshot's."""
        return None

    def fetch(self, slot: int, source: Source, stem: DataSteM, span: Span,
              names: Sequence[str]) -> dict[str, np.ndarray]:
        """The columns `names` of the tuples within `span` that satisfy query `slot`, in
        position order (an invocation's find and fetch): `matches`, then `stem.take`.
        O(find) plus O(len(names) x matches)."""
        return stem.take(names, self.matches(slot, source, stem, span))

    def fetch_deferred(self, slot: int, source: Source, stem: DataSteM, span: Span,
                       names: Sequence[str], later: Sequence[str]
                       ) -> tuple[dict[str, np.ndarray], Callable[[], dict[str, np.ndarray]]]:
        """`fetch` of `names` now, and a function that returns the columns `later` (8-byte
        columns not in `names`) of the same tuples when called, for the columns an
        answer may never be asked for: here they are taken now, in the same pass; a
        structure that can take them afterwards through the same matches defers them."""
        return taken_now(self.fetch(slot, source, stem, span, [*names, *later]), later)


def taken_now(got: dict[str, np.ndarray], later: Sequence[str]
              ) -> tuple[dict[str, np.ndarray], Callable[[], dict[str, np.ndarray]]]:
    """`fetch_deferred`'s answer when every column was taken at once (`got`): the
    columns `later` moved out of it, returned by the function."""
    rest = {name: got.pop(name) for name in later}
    return got, lambda: rest


class Snapshot:
    """A selection slot's matches as its structure held them at an invocation's cut
    (`ResultsStructure.snapshot`), read off the engine's lock together with a
    `DataSteM.snapshot` taken at the same moment; `release` once read."""

    __slots__ = ()

    def matches(self, slot: int, source: Source, stem: DataSteM, span: Span) -> np.ndarray:
        """Sorted positions within `span` of the slot's matches at the cut."""
        raise NotImplementedError

    def fetch(self, slot: int, source: Source, stem: DataSteM, span: Span,
              names: Sequence[str]) -> dict[str, np.ndarray]:
        """As `ResultsStructure.fetch`, at the cut."""
        return stem.take(names, self.matches(slot, source, stem, span))

    def fetch_deferred(self, slot: int, source: Source, stem: DataSteM, span: Span,
                       names: Sequence[str], later: Sequence[str]
                       ) -> tuple[dict[str, np.ndarray], Callable[[], dict[str, np.ndarray]]]:
        """As `ResultsStructure.fetch_deferred`, at the cut."""
        return taken_now(self.fetch(slot, source, stem, span, [*names, *later]), later)

    def release(self) -> None:
        """The read is over: the structure may change what it held in place again."""
        return


class SinkTable:
    """Which sinks keep which slots, per stream. O(1) per attach and detach; `deliver`
    lists a stream's sinks in attachment order.

    Example:
        >>> from psoup.results.nomat import NoMatResults
        >>> table, sink = SinkTable(), NoMatResults()
        >>> table.attach(3, "R", sink); table.attach(4, "R", sink)
        >>> [s is sink for s in table.of_stream("R")], table.slots_of(sink, "R")
        ([True], [3, 4])
        >>> table.detach(3) == [sink], table.slots_of(sink, "R")
        (True, [4])
    """

    def __init__(self) -> None:
        # stream -> sink id -> (sink, its slots on the stream, in attach order)
        self._streams: dict[str, dict[int, tuple[Sink, dict[int, None]]]] = {}
        self._slots: dict[int, list[tuple[str, Sink]]] = {}
        # bit rows kept in step with the above: (stream, sink id) -> its slots; stream ->
        # every attached slot, with (stream, slot) -> how many sinks keep it
        self._own: dict[tuple[str, int], np.ndarray] = {}
        self._all: dict[str, np.ndarray] = {}
        self._uses: dict[tuple[str, int], int] = {}
        self._targets: dict[str, ProbeTarget] = {}      # stream -> its ProbeTarget

    def attach(self, slot: int, stream: str, sink: Sink) -> None:
        """Deliver `slot`'s events on `stream` to `sink`. O(1) (O(words) to widen)."""
        if isinstance(sink, ProbeTarget):
            assert self._targets.setdefault(stream, sink) is sink, "one ProbeTarget a stream"
        entry = self._streams.setdefault(stream, {}).setdefault(id(sink), (sink, {}))
        entry[1][slot] = None
        self._slots.setdefault(slot, []).append((stream, sink))
        words = words_for(slot + 1)
        own = self._own.get((stream, id(sink)))
        own = self._own[stream, id(sink)] = widened(
            np.zeros(1, DTYPE) if own is None else own, words)
        set_bit(own, slot)
        every = self._all.get(stream)
        every = self._all[stream] = widened(
            np.zeros(1, DTYPE) if every is None else every, words)
        set_bit(every, slot)
        self._uses[stream, slot] = self._uses.get((stream, slot), 0) + 1

    def detach(self, slot: int) -> list[Sink]:
        """Stop delivering `slot`'s events; returns the sinks it had (each once)."""
        had: list[Sink] = []
        for stream, sink in self._slots.pop(slot, []):
            sinks = self._streams[stream]
            _, slots = sinks[id(sink)]
            slots.pop(slot, None)
            set_bit(self._own[stream, id(sink)], slot, False)
            if not slots:
                del sinks[id(sink)]
                del self._own[stream, id(sink)]
                if self._targets.get(stream) is sink:
                    del self._targets[stream]
            left = self._uses.pop((stream, slot)) - 1
            if left:
                self._uses[stream, slot] = left
            else:
                set_bit(self._all[stream], slot, False)
            if all(s is not sink for s in had):
                had.append(sink)
        return had

    def drop_stream(self, stream: str) -> None:
        """Forget a dropped stream, whose slots are all detached already. O(1)."""
        assert not self._streams.get(stream), "no slot on a dropped stream is attached"
        self._streams.pop(stream, None)
        self._all.pop(stream, None)
        self._targets.pop(stream, None)

    def streams(self) -> set[str]:
        """The streams some sink was attached on."""
        return set(self._streams) | set(self._all)

    def of_slot(self, slot: int) -> list[Sink]:
        """The sinks of `slot`, each once."""
        out: list[Sink] = []
        for _, sink in self._slots.get(slot, []):
            if all(s is not sink for s in out):
                out.append(sink)
        return out

    def probe_target(self, stream: str) -> ProbeTarget | None:
        """The sink of `stream` the probe writes into, if any. O(1)."""
        return self._targets.get(stream)

    def of_stream(self, stream: str) -> list[Sink]:
        """The sinks of some slot on `stream`, in attachment order."""
        return [sink for sink, _ in self._streams.get(stream, {}).values()]

    def attached(self) -> set[int]:
        """Every slot some sink keeps."""
        return set(self._slots)

    def slots_of(self, sink: Sink, stream: str) -> list[int]:
        entry = self._streams.get(stream, {}).get(id(sink))
        return list(entry[1]) if entry else []

    def _check(self) -> None:
        """Assert the invariants (for tests): the bit rows are the slot sets."""
        for stream, sinks in self._streams.items():
            every: set[int] = set()
            for sid, (_, slots) in sinks.items():
                own = self._own[stream, sid]
                assert (widened(own, words_for(len(own) * 64)) ==
                        bit_row(slots, len(own))).all(), (stream, "own row")
                every |= set(slots)
            row = self._all.get(stream, np.zeros(1, DTYPE))
            assert (row == bit_row(every, len(row))).all(), (stream, "every slot's row")
            assert {s for (st, s) in self._uses if st == stream} == every

    def rows_for(self, sink: Sink, stream: str, bits: np.ndarray) -> np.ndarray:
        """`bits` as `sink` should see them: for a sink that keeps rows whole, with the
        bits of other sinks' slots on `stream` cleared (a copy only when there are any)."""
        if not sink.keeps_rows:
            return bits
        words = bits.shape[1]
        every = self._all.get(stream)
        if every is None:
            return bits
        own = self._own.get((stream, id(sink)), np.zeros(1, DTYPE))
        others = widened(every, words)[:words] & ~widened(own, words)[:words]
        return bits & ~others if others.any() else bits
