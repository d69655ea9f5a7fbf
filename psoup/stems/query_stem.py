"""The Query SteM: every standing query, indexed for shared probing (PSoup Sect. 4.2.2).

One Query SteM serves the whole engine. Each query gets a *slot*, its column in the
Results Structure; freed slots are reused, lowest first, so the bit rows stay narrow:
they are exactly ceil(slots in use / 64) words wide, never padded to a power of two.
A query's factors are filed per stream it reads:

* single-attribute factors, already folded into one `AttrPredicate` per column by the
  language, go to that (stream, column)'s `AttributeIndex`;
* multi-attribute factors go to the stream's predicateList, kept as distinct factors
  each with the slots that use it, so a factor shared by many queries is evaluated once
  per batch.

Probing with a batch of a stream's tuples yields one Results Structure row per tuple:
the interested slots, minus those some attribute index rejects, minus those whose
predicateList factors fail. This replaces the paper's per-query countdown array
(Sect. 4.2.2) with bitwise operations over 64 queries per machine word.

A large batch's probe is split by tuples over the engine's threads (`Workers`): each
thread probes its own tuples into their own words of the results, the compiled kernel
releasing the GIL, and the probe returns when all are done. Whatever changes the index
(a direct map widened for values it has not seen) happens on the calling thread,
between the threads' calls. Only a share of at least `PROBE_SPLIT` words is worth
handing to a thread. What the insert has left to do that touches nothing the probe
reads or writes (the Data SteM's copies of the batch's values, the row forms of a
reused results chunk: `probe_into`'s `beside`) runs among the shares rather than on
the calling thread alone before them.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial

import numpy as np

from psoup import kernels
from psoup.bits import DTYPE, bit_row, set_bit, widened, words_for
from psoup.kernels.layout import BLOCK_FROM_WORDS
from psoup.query.model import ColumnFactor, Query
from psoup.stems.predicate_index import AttributeIndex
from psoup.stems.predicates import factor_mask, source_mask
from psoup.workers import Workers

#: The least work (a batch's tuples x its bit rows' words) each share of a split
#: probe holds (a probe of less than twice this is not split): below it, waking a thread
#: and waiting for it (20-50 us here) costs about what the split saves. Measured with
#: bench/scale_cores.py's probe (Fig. 9 queries, 4 attributes, into PSoup-P's chunks;
#: 2-core AMD EPYC shared with other work, so the fastest of many alternated calls),
#: split in two against one thread: at 1,024 queries 0.74x at 2^16 words per thread,
#: 0.97-1.29x at 2^17, 1.19-1.29x at 2^18, 1.43-1.57x at 2^19; at 10^4 queries
#: 0.99x at 2^17, 1.29x at 2^18 (4,096 tuples), 1.37x at 2^19, 1.73x at 2^20 and
#: 1.77-1.88x at 2^21 (32,768 tuples). So from 2^18 a split gains a fifth or more.
PROBE_SPLIT = 1 << 18

#: A split probe's shares shrink as they are handed out (guided self-scheduling): each
#: takes 1/(2 x threads) of the tuples left, at most 1/(4 x threads) of the batch (an
#: equal share as they all were: a thread a busy core holds back keeps no more of the
#: batch than before; the threads take the shares in turn, so it takes fewer), so that
#: the thread that ends first waits only for the small share another is in (with equal
#: shares, up to 1/8 of the batch: at 10^5 queries the threads' ends were 0.39 ms apart
#: in an 8.5 ms batch on 2 cores, with shrinking shares 0.08 ms). A share cut smaller
#: than an equal share still holds 1/(SHARES_PER_THREAD x threads) of the batch and
#: SHRUNK_WORDS words of results: each share costs some microseconds of its own (a
#: compiled call and its arguments, under the GIL), and at 10^4 queries shares of 2^18
#: words (0.13 ms) made a batch 4% slower than equal ones.
SHARES_PER_THREAD = 16

#: The least work (tuples x words) of a share cut smaller than an equal share.
SHRUNK_WORDS = 3 << 18

#: Tuples of a share start on a multiple of this (8 words, a cache line, from where the
#: piece's rows are aligned), so no two threads write the same line of a result row.
_LINE_TUPLES = 8


class _StreamQueries:
    """The queries over one stream: their interest (a set and its bit row, kept in step),
    attribute indices and predicateList."""

    def __init__(self) -> None:
        self.slots: set[int] = set()
        self.interest = np.zeros(1, DTYPE)
        self.attrs: dict[str, AttributeIndex] = {}
        self.factors: dict[ColumnFactor, set[int]] = {}
        self._rows: dict[object, np.ndarray] = {}

    def interested(self, slot: int, on: bool) -> None:
        """Add or drop `slot` from the interest set and row. O(1) (O(words) to widen)."""
        if on:
            self.slots.add(slot)
            self.interest = widened(self.interest, words_for(slot + 1))
        else:
            self.slots.discard(slot)
        set_bit(self.interest, slot, on)

    def interest_row(self, words: int) -> np.ndarray:
        return widened(self.interest, words)[:words]

    def row(self, slots: Iterable[int], words: int) -> np.ndarray:
        """A bit row with `slots` set (cached per set of slots and width)."""
        key = (frozenset(slots), words)
        got = self._rows.get(key)
        if got is None:
            got = bit_row(slots, words)
            if len(self._rows) > 4 * (len(self.factors) + 1):
                self._rows.clear()
            self._rows[key] = got
        return got


class QuerySteM:
    """All standing queries, indexed per stream and attribute.

    Example:
        >>> from psoup.query.model import Source, Window, AttrPredicate
        >>> q = Query("...", (Source("R", "R", Window(), (AttrPredicate("a", "int", lo=5),)),), ())
        >>> stem = QuerySteM()
        >>> stem.insert(q)
        0
        >>> stem.probe("R", {"a": np.array([4, 9])}, 2)[:, 0].tolist()
        [0, 1]
    """

    def __init__(self, shared: bool = True, workers: Workers | None = None):
        self.shared = shared
        #: The threads a large batch's probe is split over (`PROBE_SPLIT`).
        self.workers = workers if workers is not None else Workers(1)
        self.queries: dict[int, Query] = {}
        self._free: list[int] = []
        self._next = 0
        self.words = 1
        self._streams: dict[str, _StreamQueries] = {}

    @property
    def capacity(self) -> int:
        """Slots addressable by the current bit-row width."""
        return self.words * 64

    def allocate(self) -> int:
        """Reserve the lowest free slot, widening the bit rows by a word when all are
        taken. O(log free slots)."""
        slot = heapq.heappop(self._free) if self._free else self._next
        if slot == self._next:
            self._next += 1
        self.words = max(self.words, words_for(slot + 1))
        return slot

    def peek(self, n: int) -> list[int]:
        """The n slots the next n `allocate` calls would hand out. O(n log free)."""
        free = heapq.nsmallest(n, self._free)
        return free + list(range(self._next, self._next + n - len(free)))

    def reserve(self, slot: int) -> None:
        """Make `slot` addressable, for a Query SteM that mirrors another's slots (the
        Spark tasks of psoup.spark.history)."""
        self.words = max(self.words, words_for(slot + 1))
        self._next = max(self._next, slot + 1)

    def restore_slots(self, next_slot: int, words: int) -> None:
        """After queries were inserted in the slots a checkpoint gave them (`reserve`):
        every slot below `next_slot` that holds none is free again, and the bit rows are
        `words` wide (at least), as they were at the checkpoint, so that the next
        `allocate` hands out what it would have. O(slots log slots)."""
        self._next = max(self._next, next_slot)
        self._free = sorted(set(range(self._next)) - set(self.queries))
        self.words = max(self.words, words)

    @property
    def next_slot(self) -> int:
        """One past the highest slot ever handed out (what `restore_slots` takes)."""
        return self._next

    def insert(self, query: Query, slot: int | None = None) -> int:
        """File `query`'s factors in `slot` (allocated if None) and return the slot.
        O(factors * log constants)."""
        if slot is None:
            slot = self.allocate()
        self.queries[slot] = query
        if query.contradiction:
            return slot
        for source in query.sources:
            sq = self._streams.get(source.stream) or \
                self._streams.setdefault(source.stream, _StreamQueries())
            sq.interested(slot, True)
            for pred in source.predicates:
                index = sq.attrs.get(pred.column)
                if index is None:
                    index = sq.attrs[pred.column] = AttributeIndex(pred.ctype)
                index.add(slot, pred)
            for factor in source.column_factors:
                sq.factors.setdefault(factor, set()).add(slot)
        return slot

    def remove(self, slot: int) -> Query:
        """Forget the query in `slot`; the slot is reused by a later insert."""
        query = self.queries.pop(slot)
        heapq.heappush(self._free, slot)
        if not query.contradiction:
            for source in query.sources:
                sq = self._streams[source.stream]
                sq.interested(slot, False)
                for pred in source.predicates:
                    sq.attrs[pred.column].remove(slot)
                for factor in source.column_factors:
                    users = sq.factors[factor]
                    users.discard(slot)
                    if not users:
                        del sq.factors[factor]
        return query

    def drop_stream(self, stream: str) -> None:
        """Forget the (empty) indices of a dropped stream; no query reads it any more."""
        sq = self._streams.pop(stream, None)
        assert sq is None or not sq.slots, "no standing query reads a dropped stream"

    def streams(self) -> set[str]:
        """The streams some index is kept for."""
        return set(self._streams)

    def interested(self, stream: str) -> bool:
        sq = self._streams.get(stream)
        return bool(sq and sq.slots)

    def splits(self, n: int) -> bool:
        """Whether a probe of n tuples is split over threads (`_shares`). O(1)."""
        return self.workers.threads > 1 and n >= 2 * -(-PROBE_SPLIT // self.words)

    def probe(self, stream: str, columns: Mapping[str, np.ndarray], n: int) -> np.ndarray:
        """Results Structure rows for n tuples of `stream` (PSoup Fig. 3: new data probing
        the Query SteM): bit q of row i is set when tuple i satisfies query slot q.

        Returns an (n, words) little-endian uint64 array (a transposed view of the
        word-major array `probe_into` fills). O(n * (attrs + factors) * words).
        """
        out = np.empty((self.words, n), dtype=DTYPE)
        self.probe_into(stream, columns, [(0, n, out)])
        transposed: np.ndarray = out.T
        return transposed

    def probe_into(self, stream: str, columns: Mapping[str, np.ndarray],
                   pieces: Sequence[tuple[int, int, np.ndarray]],
                   beside: list[Callable[[], None]] | None = None) -> None:
        """Write the probe of the batch's tuples a..b into each piece's (words, b - a)
        word-major array (tuple i's word w at [w, i - a]), e.g. straight into PSoup-P's
        chunks. One compiled pass over the rows; multi-attribute factors then clear the
        bits of the queries whose factor a tuple fails. The tasks of `beside` (work
        that touches nothing the probe reads or writes) run among the shares of a probe
        split over threads, else first, on this thread; either way `beside` is emptied.
        """
        words = self.words
        sq = self._streams.get(stream)
        if sq is None or not sq.slots:
            _run(beside)
            for _, _, out in pieces:
                out[:] = 0
            return
        if not self.shared:
            _run(beside)
            n = max(b for _, b, _ in pieces)
            flags = self._probe_unshared(stream, sq, columns, n)
            for a, b, out in pieces:
                out[:] = flags[a:b].T
            return
        self._probe_indexed(sq, columns, pieces, beside)
        for factor, users in sq.factors.items():
            fails = np.flatnonzero(~factor_mask(factor, columns[factor.left],
                                                columns[factor.right]))
            if len(fails):
                keep = ~sq.row(users, words)[:, None]
                for a, b, out in pieces:
                    here = fails[(fails >= a) & (fails < b)] - a
                    if len(here):
                        out[:, here] &= keep

    def _probe_indexed(self, sq: _StreamQueries, columns: Mapping[str, np.ndarray],
                       pieces: Sequence[tuple[int, int, np.ndarray]],
                       beside: list[Callable[[], None]] | None = None) -> None:
        """`probe_into`'s shared pass: the interest row less what the attribute indices
        reject, one compiled call per piece (a value a direct map has not seen sends
        the call back for that attribute's keys without one)."""
        words = self.words
        interest = sq.interest_row(words)
        indexed = [(index, columns[c]) for c, index in sq.attrs.items() if len(index)]
        if not indexed:
            _run(beside)
            for _, _, out in pieces:
                out[:] = interest[:, None]
            return
        tables = tuple([index.table(words) for index, _ in indexed])
        keys, firsts, maps = map(list, zip(*[index.keys(v) for index, v in indexed],
                                           strict=True))
        if self.workers.threads > 1 and len(shares := self._shares(pieces, words)) > 1:
            self._probe_shares(indexed, tables, keys, firsts, maps, interest, shares,
                               beside)
            return
        _run(beside)        # (before the probe, as a batch's values are read: in cache)
        for a, b, out in pieces:
            while (g := kernels.probe_into(tables, tuple([k[a:b] for k in keys]),
                                           tuple(firsts), tuple(maps), interest, out)) >= 0:
                index, values = indexed[g]      # a value its direct map has not seen
                keys[g], firsts[g], maps[g] = index.keys(values, direct_map=False)

    def _shares(self, pieces: Sequence[tuple[int, int, np.ndarray]],
                words: int) -> list[list[tuple[int, int, np.ndarray]]]:
        """The pieces cut into lists of tuples, shrinking (`SHARES_PER_THREAD`; one per
        thread from BLOCK_FROM_WORDS words a tuple), each holding at least PROBE_SPLIT
        words of results (one list: the probe is not split). A cut falls on a cache
        line of the piece's rows, so each share writes whole lines of its own.
        O(pieces + shares)."""
        n = sum(b - a for a, b, _ in pieces)
        threads = self.workers.threads
        least = -(-PROBE_SPLIT // words)
        if threads <= 1 or n < 2 * least:
            return [list(pieces)]
        if words >= BLOCK_FROM_WORDS:
            # a probe by blocks of words reads all the tables' rows once per share (12.8
            # MB at 10^5 queries): one share per thread. Engine ingest at 10^5 queries,
            # 16,384-tuple batches, 2 threads against 1 (alternated in one process):
            # 2 shares 1.91x, 4 1.79x, 8 1.70x. A thread held back by a busy core
            # leaves its share to the caller, which takes it next.
            most = small = max(least, -(-n // threads))
        else:
            most = max(least, n // (threads * 4))      # what each of 4 equal shares was
            small = min(most, max(-(-SHRUNK_WORDS // words),
                                  -(-n // (threads * SHARES_PER_THREAD))))
        leads = [a + _aligned_lead(out) for a, _, out in pieces]
        cuts: list[int] = []
        done = 0
        while True:
            size = min(most, max(small, (n - done) // (2 * threads)))
            if n - done - size < small // 2:    # (the rest is the last share)
                break
            at = _on_line(done + size, pieces, leads)
            if at >= n:
                break
            cuts.append(at)
            done = at
        shares: list[list[tuple[int, int, np.ndarray]]] = [[] for _ in range(len(cuts) + 1)]
        for a, b, out in pieces:
            bounds = [a] + [c for c in cuts if a < c < b] + [b]
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                shares[bisect.bisect_right(cuts, lo)].append((lo, hi, out[:, lo - a:hi - a]))
        # the largest first: the rest after the last cut may be larger than the shares
        # before it, and the last share taken should be small
        return sorted((share for share in shares if share),
                      key=lambda share: -sum(b - a for a, b, _ in share))

    def _probe_shares(self, indexed: list[tuple[AttributeIndex, np.ndarray]],
                      tables: tuple[np.ndarray, ...], keys: list[np.ndarray],
                      firsts: list[int], maps: list[np.ndarray], interest: np.ndarray,
                      shares: list[list[tuple[int, int, np.ndarray]]],
                      beside: list[Callable[[], None]] | None = None) -> None:
        """`_probe_indexed`'s calls, one list of pieces per thread (`_shares`: disjoint
        tuples, so disjoint words of the results). A piece whose keys fall outside a
        direct map wrote nothing; the keys are then looked up otherwise here, on the
        calling thread alone (it changes the index), and those pieces probed again."""
        # the tasks beside the probe first: the calling thread takes them while the
        # pool's wake up
        tasks: list[Callable[[], list[tuple[tuple[int, int, np.ndarray], int]]]] = []
        if beside:
            tasks = [partial(_beside, task) for task in beside]
            beside.clear()
        while shares:
            probe = partial(_probe_pieces, tables, tuple(keys), tuple(firsts), tuple(maps),
                            interest)
            tasks += [partial(probe, share) for share in shares]
            missed = self.workers.run(tasks)
            tasks = []
            for g in sorted({g for share in missed for _, g in share}):
                index, values = indexed[g]      # a value its direct map has not seen
                keys[g], firsts[g], maps[g] = index.keys(values, direct_map=False)
            shares = [[piece for piece, _ in share] for share in missed if share]

    def _probe_unshared(self, stream: str, sq: _StreamQueries,
                        columns: Mapping[str, np.ndarray], n: int) -> np.ndarray:
        """The paper's Unshrd variant (Sect. 5.2.4): each query evaluated on its own,
        O(n * queries * factors); kept to measure what the shared index saves."""
        flags = np.zeros((self.capacity, n), dtype=bool)     # one contiguous row per query
        for slot in sq.slots:
            source = next(s for s in self.queries[slot].sources if s.stream == stream)
            flags[slot] = source_mask(source, columns, n)
        packed = np.packbits(flags, axis=0, bitorder="little").T
        return np.ascontiguousarray(packed).view("<u8")

    def _check(self) -> None:
        """Assert the structure's invariants (for tests)."""
        assert not set(self._free) & set(self.queries), "a free slot holds no query"
        assert set(self._free) | set(self.queries) == set(range(self._next)), \
            "every slot below the next fresh one is free or taken"
        assert self._next <= self.capacity
        for stream, sq in self._streams.items():
            filed = {slot for slot, q in self.queries.items() if not q.contradiction
                     and any(source.stream == stream for source in q.sources)}
            assert sq.slots == filed, (stream, "interest is exactly the queries filed")
            assert (sq.interest_row(self.words) == bit_row(filed, self.words)).all(), \
                (stream, "the interest row is the interest set")
            for column, index in sq.attrs.items():
                index._check()
                assert set(index.slots()) <= sq.slots, (stream, column)
            for users in sq.factors.values():
                assert users and users <= sq.slots

    def nbytes(self) -> int:
        return sum(index.nbytes() for sq in self._streams.values()
                   for index in sq.attrs.values())


def _on_line(at: int, pieces: Sequence[tuple[int, int, np.ndarray]],
             starts: Sequence[int]) -> int:
    """Tuple `at` of the batch moved on to the next cut on a cache line of its piece's
    rows (`starts`: each piece's first tuple whose words start a line), at most to the
    piece's end (a cut between two pieces is on a line already)."""
    for (a, b, _), start in zip(pieces, starts, strict=True):
        if a < at < b:
            return min(start + -(-(at - start) // _LINE_TUPLES) * _LINE_TUPLES, b)
    return at


def _aligned_lead(out: np.ndarray) -> int:
    """Tuples of a word-major piece before the first whose words start a cache line (0
    where a tuple's words are not contiguous in a row)."""
    if out.ndim != 2 or out.shape[1] == 0 or out.strides[1] != out.itemsize:
        return 0
    return (-out.ctypes.data % 64) // out.itemsize


def _run(tasks: list[Callable[[], None]] | None) -> None:
    """Run and remove every task of `tasks` (None: none), in order."""
    if tasks:
        todo = list(tasks)
        tasks.clear()
        for task in todo:
            task()


def _beside(task: Callable[[], None]) -> list[tuple[tuple[int, int, np.ndarray], int]]:
    """A task run among a split probe's shares, as one: it leaves no piece unwritten."""
    task()
    return []


def _probe_pieces(tables: tuple[np.ndarray, ...], keys: tuple[np.ndarray, ...],
                  firsts: tuple[int, ...], maps: tuple[np.ndarray, ...],
                  interest: np.ndarray, pieces: Sequence[tuple[int, int, np.ndarray]]
                  ) -> list[tuple[tuple[int, int, np.ndarray], int]]:
    """One thread's share of a probe: each piece probed (the compiled kernel releases
    the GIL); returns the pieces left unwritten, each with the table whose keys fell
    outside its direct map."""
    missed = []
    for a, b, out in pieces:
        g = kernels.probe_into(tables, tuple([k[a:b] for k in keys]), firsts, maps,
                               interest, out)
        if g >= 0:
            missed.append(((a, b, out), g))
    return missed
