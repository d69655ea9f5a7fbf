"""PSoup-P's Results Structure: one two-dimensional bitmap per FROM list (Sect. 4.3).

Rows are a stream's tuples in physicalID order (their positions), columns are query
slots, 64 to a little-endian uint64 word. The bitmap is kept in chunks of the Data SteM's
chunk size, so expiry drops whole chunks in step with the Data SteM and a missing chunk
reads as all zeros (no query matched there).

A chunk is stored *word-major*: `chunk[w]` holds word w (slots 64 w .. 64 w + 63) of
every row of the chunk, contiguously. So an invocation's find reads one contiguous run
of words, W x 8 bytes for a window of W tuples, whatever the number of queries (a
row-major bitmap would touch a cache line per tuple); and the Eddy's probe writes a
batch straight into the chunk (`destination`), with no copy. A new query's Data SteM
probe sets bits in one word row; windows are applied only at invocation, so the cost
the paper measures in Fig. 7 grows with the window, not with the number of results.

Once the probe has written a whole chunk (it is *sealed*: its positions lie below
`_written`), the first find that reads one of its word rows turns that row
*bit-sliced* in place (`kernels.slice_row`, 64 x 64 bit blocks transposed): each of
its 64 slots' bits then lie in chunk_rows / 64 words of their own, so every later find
reads W / 8 bytes of the query's own bits rather than W words (the bit-sliced results
of issue 14, without the probe paying for them: the probe never writes a sealed row).
A row's form sits in its first padding word (`kernels.WORD_MAJOR` or `SLICED`); the
kernels that set and clear bits (`set_bits`, `clear_bit`) and find them read either, and
widening carries the forms along.

The chunk holds the probe's bits of every slot on the stream, not only the slots
attached here (a join's local slots, say): a slot is cleared when it is attached
(`on_register`) and when it leaves (`on_unregister`), so a slot attached here reads
exactly its own matches.

Costs: find O(W) words, O(W / 64) over sliced rows (the first find over a sealed row
pays O(chunk_rows) to slice it: 30 us for 8,192 tuples, once per word row, shared
by its 64 slots); batch O(n x words) (the probe's own writes); register O(retained) to
clear the slot's word row (O(retained / 64) where sliced) plus its matches; unregister
O(retained);
memory ceil(slots / 64) words per retained tuple, plus at most 1/32 (chunks widen
ahead as slots grow), plus whole chunks (the oldest, partly expired; one kept for
reuse): 1.07x at 1,024 queries with 200,000 tuples retained.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial

import numpy as np

from psoup import kernels
from psoup.bits import DTYPE, bit_of
from psoup.query.model import Source
from psoup.results.base import ProbeTarget, ResultsStructure, Snapshot
from psoup.stems import halves
from psoup.stems.data_stem import DataSteM, chunk_runs
from psoup.stems.span import Span

#: Padding words after each word row of a chunk (see PartialResults._new_chunk); the
#: first holds the row's form (kernels.WORD_MAJOR or SLICED).
ROW_PAD = 8


def _padded(chunk: np.ndarray) -> np.ndarray:
    """The padded array a chunk is a view of: its rows' first padding words hold their
    forms (kernels.WORD_MAJOR or SLICED)."""
    base = chunk.base
    assert base is not None, "a chunk is a view of its padded rows"
    return base


def _rows_for(words: int) -> int:
    """Word rows to give a chunk that needs `words`: 1/32 more (at most 3.1% of memory),
    so that a stream of registrations widens the retained chunks (a copy of each) once
    per 32 words of new slots rather than once per word. (1/12 took the results to 1.13x
    and 1.15x their exact width per retained tuple at 1,024 and 4,096 queries with the
    chunks' granularity, 1/32 to 1.07x and 1.10x; the register bench's steps, a word at
    a time below 32 words, measured the same either way.)

    Example:
        >>> _rows_for(11), _rows_for(64), _rows_for(157)
        (11, 66, 161)
    """
    return words + words // 32


def _unheld(chunk: np.ndarray) -> bool:
    """Whether nothing but the chunk itself references its padded array (no address
    table of a snapshot being read, say), so that it can be reused."""
    return sys.getrefcount(chunk.base) <= 2


class _BitmapCut(Snapshot):
    """A slot's bits as a snapshot reads them (`PartialResults.snapshot`): the bitmap as
    the compiled finds take it, with nothing sealed, so that they slice no row."""

    __slots__ = ("owner", "stream", "bitmap")

    def __init__(self, owner: PartialResults, stream: str,
                 bitmap: tuple[int, kernels.AddressTable, int]):
        self.owner, self.stream, self.bitmap = owner, stream, bitmap

    def fetch(self, slot: int, source: Source, stem: DataSteM, span: Span,
              names: Sequence[str]) -> dict[str, np.ndarray]:
        word, mask = bit_of(slot)
        p0, p1 = span.bounds()
        return stem.take_marked(names, self.bitmap, p0, p1, word, mask)[0]

    def fetch_deferred(self, slot: int, source: Source, stem: DataSteM, span: Span,
                       names: Sequence[str], later: Sequence[str]
                       ) -> tuple[dict[str, np.ndarray], Callable[[], dict[str, np.ndarray]]]:
        word, mask = bit_of(slot)
        p0, p1 = span.bounds()
        return stem.take_marked(names, self.bitmap, p0, p1, word, mask, later)

    def release(self) -> None:
        self.owner._close(self)


class PartialResults(ResultsStructure, ProbeTarget):
    """Bitmaps per stream (selection queries have one-stream FROM lists).

    Example:
        >>> rs = PartialResults(chunk_rows=4)
        >>> rs.on_insert("R", 0, np.array([[1], [0], [1]], dtype="<u8"), {})
        >>> rs.column("R", 0, Span.range(0, 3)).tolist()
        [0, 2]
    """

    snapshots_arrays = False

    def __init__(self, chunk_rows: int = 8192):
        self.chunk_rows = chunk_rows
        self._bitmaps: dict[str, dict[int, np.ndarray]] = {}
        self._spare: list[np.ndarray] = []      # expired chunks, reused (no page faults)
        self._spares = 2                        # how many to keep: a batch's chunks
        self._found = np.empty(0, np.int64)     # the find's output, reused (see column)
        # per stream, (first chunk number, its chunks as a kernels.address_table, gaps
        # as chunks of no rows) for the compiled find; dropped whenever a chunk of it
        # changes (the chunks themselves are kept alive by _bitmaps)
        self._lists: dict[str, tuple[int, kernels.AddressTable]] = {}
        # per stream, the end of the positions the probe has written: chunks wholly
        # below it are sealed, and a find turns their rows bit-sliced (kernels._ready)
        self._written: dict[str, int] = {}
        # the invocations reading off the engine's lock (`snapshot`), per stream: a
        # chunk one of them may read is never sliced in place (it is copied first) nor
        # reused; the lock because a reader leaves from its own thread
        self._open: dict[str, list[_BitmapCut]] = {}
        self._open_lock = threading.Lock()
        # (stream, word) -> chunk numbers [lo, hi) whose word row is sliced (or is
        # missing), so that a snapshot slices only the chunks sealed since
        self._sliced: dict[tuple[str, int], tuple[int, int]] = {}
        #: while a checkpoint writes the chunks out (psoup.journal.checkpoint): no find
        #: turns a row bit-sliced in place and no expired chunk is reused, so that the
        #: chunks it holds change only where the log after its cut repairs them
        self.frozen = False

    def _chunk(self, stream: str, k: int, words: int, written_from: int = -1,
               later: list[Callable[[], None]] | None = None) -> np.ndarray:
        """Chunk k of `stream`, (>= words, chunk_rows); a new one is zero except from row
        `written_from` on (rows the caller writes next, and later batches after it).
        With `later`, a reused chunk's rows are marked WORD_MAJOR by a callable appended
        to it (one word per row, a cache miss each: 50 us at 10^5 queries)."""
        chunks = self._bitmaps.setdefault(stream, {})
        chunk = chunks.get(k)
        if chunk is None or chunk.shape[0] < words:
            self._lists.pop(stream, None)
            self._unsliced(stream, k)
        if chunk is None:
            spare = self._spare
            while spare and not (words <= spare[-1].shape[0] <= _rows_for(words)
                                 and _unheld(spare[-1])):
                spare.pop()
            if spare:
                chunk = chunks[k] = spare.pop()
                chunk[:, :written_from if written_from >= 0 else None] = 0
                forms = _padded(chunk)[:, self.chunk_rows]      # each row's form
                if later is None:
                    forms[:] = kernels.WORD_MAJOR
                else:
                    later.append(partial(forms.fill, kernels.WORD_MAJOR))
            else:
                chunk = chunks[k] = self._new_chunk(words)
        elif chunk.shape[0] < words:
            wider = self._new_chunk(words)
            _padded(wider)[:chunk.shape[0]] = _padded(chunk)    # the rows and their forms
            chunk = chunks[k] = wider
        return chunk

    def _new_chunk(self, words: int) -> np.ndarray:
        """A zero chunk of `_rows_for(words)` word rows of chunk_rows words, the rows
        ROW_PAD words further apart than their length: with chunk_rows a power of two,
        rows exactly 64 KiB apart would all fall in the same cache sets, and the probe,
        which writes one word to each row per tuple, would miss on every write."""
        base = np.zeros((_rows_for(words), self.chunk_rows + ROW_PAD), dtype=DTYPE)
        return base[:, :self.chunk_rows]

    def destination(self, stream: str, p0: int, n: int, words: int,
                    later: list[Callable[[], None]] | None = None
                    ) -> list[tuple[int, int, np.ndarray]]:
        """Where the probe of n tuples from position p0 goes: (a, b, the (words, b - a)
        word-major slice of the chunk holding tuples a..b of the batch); with `later`,
        a reused chunk's row forms are set by a callable appended to it (see
        ProbeTarget.destination), the probe writing none of them."""
        cap = self.chunk_rows
        self._spares = max(self._spares, -(-n // cap) + 1)
        self._written[stream] = max(self._written.get(stream, 0), p0 + n)
        pieces = []
        done = 0
        while done < n:
            k, r = divmod(p0 + done, cap)
            take = min(cap - r, n - done)
            chunk = self._chunk(stream, k, words, r, later)
            pieces.append((done, done + take, chunk[:words, r:r + take]))
            done += take
        return pieces

    def on_insert(self, stream: str, p0: int, bits: np.ndarray,
                  batch: Mapping[str, np.ndarray]) -> None:
        """Copy n probe rows in (when the probe was not written in place). O(n * words)."""
        n, words = bits.shape
        for a, b, out in self.destination(stream, p0, n, words):
            out[:] = bits[a:b].T

    def on_register(self, slot: int, stream: str, positions: np.ndarray) -> None:
        """Set the new query's bits at `positions`, in one compiled call. A slot no query
        holds has no bit set anywhere (the probe writes only the slots filed, and
        `on_unregister` clears a slot that leaves: `_check_free`), so nothing is cleared
        first. O(len(positions)), plus O(chunks) to widen chunks too narrow for it; in
        parts on the cores for a long run (psoup.stems.halves)."""
        word, mask = bit_of(slot)
        cap = self.chunk_rows
        chunks = self._bitmaps.setdefault(stream, {})
        if len(positions):
            first, last = int(positions[0]) // cap, int(positions[-1]) // cap
            cuts = np.searchsorted(positions, np.arange(first, last + 2) * cap)
            for k in (np.flatnonzero(np.diff(cuts)) + first).tolist():  # holding a match
                chunk = chunks.get(k)
                if chunk is None or chunk.shape[0] <= word:
                    self._chunk(stream, k, word + 1)    # made wide enough for the bit
        if chunks:
            k_first, listed = self._listed(stream)
            # parts on the cores for a long run, no chunk in two (a sliced chunk keeps
            # 64 rows' bits in one word)
            halves.each(lambda ab: kernels.set_bits(listed.handle, k_first, cap, word, mask,
                                                    positions[ab[0]:ab[1]]),
                        halves.split_aligned(positions, cap, self.threads))

    def on_unregister(self, slot: int) -> None:
        """Clear the slot's bits in every chunk. O(retained rows), retained / 64 words
        where rows are sliced."""
        word, mask = bit_of(slot)
        for stream, chunks in self._bitmaps.items():
            if chunks:
                kernels.clear_bit(self._listed(stream)[1].handle, self.chunk_rows, word, mask)

    def on_expire(self, stream: str, horizon: int) -> None:
        chunks = self._bitmaps.get(stream, {})
        for k in [k for k in chunks if (k + 1) * self.chunk_rows <= horizon]:
            if len(self._spare) < self._spares and not self.frozen:
                self._spare.append(chunks[k])
            del chunks[k]
            self._lists.pop(stream, None)

    def on_drop(self, stream: str) -> None:
        self._bitmaps.pop(stream, None)
        self._lists.pop(stream, None)
        self._written.pop(stream, None)     # a stream made again starts at position 0
        for key in [key for key in self._sliced if key[0] == stream]:
            del self._sliced[key]

    def _listed(self, stream: str) -> tuple[int, kernels.AddressTable]:
        """(first chunk number, the stream's chunks from it on as a kernels.address_table
        of the padded arrays they are views of, a gap as a chunk of no rows), rebuilt
        after a chunk came, widened or left: O(chunks), about once per chunk_rows
        tuples."""
        got = self._lists.get(stream)
        if got is None:
            chunks = self._bitmaps.get(stream, {})
            first = min(chunks, default=0)
            # the padded arrays: C-contiguous, so that a word row is contiguous in the
            # compiled find (and its loop vectorized)
            got = self._lists[stream] = (first, kernels.address_table(
                [None if (chunk := chunks.get(k)) is None else chunk.base
                 for k in range(first, max(chunks, default=-1) + 1)]))
        return got

    def _bitmap(self, stream: str, word: int, p0: int, p1: int
                ) -> tuple[int, kernels.AddressTable, int]:
        """`_listed`, and the end of the positions the probe has written (the chunks
        wholly below it are sealed), as the compiled finds over [p0, p1) of word row
        `word` take them; they slice the sealed rows they read, so while a snapshot
        is being read, the rows are sliced here first (a chunk it reads copied)."""
        if self._open.get(stream):
            self._slice_rows(stream, word, p0, p1, whole=True)
        first, listed = self._listed(stream)
        return first, listed, 0 if self.frozen else self._written.get(stream, 0)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self, slot: int, source: Source, span: Span) -> Snapshot | None:
        """Under the engine's lock: the slot's bits as they are now, for a find off
        the lock over a position range (None for other spans). The slot's word row is
        sliced now in the sealed chunks of the span, so that the find off the lock
        changes nothing (its kernels are told nothing is sealed); until the snapshot is
        released, a chunk it holds is copied before a row of it is sliced, and not
        reused once expired. O(chunks sealed since the last snapshot of the row)."""
        if not span.is_range:
            return None
        stream = source.stream
        word, _ = bit_of(slot)
        p0, p1 = span.bounds()
        self._slice_rows(stream, word, p0, p1)
        first, listed = self._listed(stream)
        cut = _BitmapCut(self, stream, (first, listed, 0))
        with self._open_lock:
            self._open.setdefault(stream, []).append(cut)
        return cut

    def _close(self, cut: _BitmapCut) -> None:
        with self._open_lock:
            self._open[cut.stream].remove(cut)      # (a cut equals only itself)

    def _slice_rows(self, stream: str, word: int, p0: int, p1: int,
                    whole: bool = False) -> None:
        """Slice word row `word` of the sealed chunks meeting [p0, p1) (what the
        compiled finds do on the way), copying first a chunk a snapshot holds; only
        those sealed since the last call unless `whole`. O(chunks sliced)."""
        cap = self.chunk_rows
        chunks = self._bitmaps.get(stream)
        if p1 <= p0 or cap % 64 or not chunks:
            return
        k0, k1 = p0 // cap, min((p1 - 1) // cap + 1, self._written.get(stream, 0) // cap)
        lo, hi = self._sliced.get((stream, word), (0, 0))
        if lo <= k0 and k1 <= hi and not whole:
            return                      # (an invocation's usual case)
        start = hi if lo <= k0 <= hi and not whole else k0
        for k in range(start, k1):
            chunk = chunks.get(k)
            if chunk is None or chunk.shape[0] <= word or \
                    _padded(chunk)[word, cap] != kernels.WORD_MAJOR:
                continue
            if self._held(stream, k, chunk):
                chunk = chunks[k] = _padded(chunk).copy()[:, :cap]
                self._lists.pop(stream, None)
            kernels.slice_row(_padded(chunk)[word], cap)
        if k1 > start:          # [k0, k1) is sliced now; with [lo, hi) where they meet
            meet = lo <= k0 <= hi or k0 < lo <= k1
            self._sliced[stream, word] = (min(lo, k0), max(hi, k1)) if meet else (k0, k1)

    def _unsliced(self, stream: str, k: int) -> None:
        """Chunk k of `stream` is new or wider: its rows may not be sliced."""
        for key, (lo, hi) in list(self._sliced.items()):
            if key[0] == stream and lo <= k < hi:
                self._sliced[key] = (lo, k)

    def _held(self, stream: str, k: int, chunk: np.ndarray) -> bool:
        """Whether a snapshot being read holds chunk k of `stream`. O(snapshots)."""
        with self._open_lock:
            cuts = list(self._open.get(stream, ()))
        base = _padded(chunk)
        for cut in cuts:
            first, listed, _ = cut.bitmap
            if 0 <= k - first < len(listed) and listed.arrays[k - first] is base:
                return True
        return False

    def streams(self) -> set[str]:
        return set(self._bitmaps)

    def matches(self, slot: int, source: Source, stem: DataSteM, span: Span) -> np.ndarray:
        return self.column(source.stream, slot, span)

    def fetch(self, slot: int, source: Source, stem: DataSteM, span: Span,
              names: Sequence[str]) -> dict[str, np.ndarray]:
        """For a position range, the find and the fetch in one compiled pass over the
        slot's word row and the Data SteM's chunks (`DataSteM.take_marked`): dense runs of
        matches are copied without a position per value (measured, 6 columns of a 32K
        window, 64 queries in turn: 36/71/87-95 us where the find then `take` took
        46/114/142, at 2,240/9,370/15,764 matches); other spans as `matches` then
        `take`. O(rows in span) plus O(len(names) x matches)."""
        if not span.is_range:
            return super().fetch(slot, source, stem, span, names)
        assert stem.chunk_rows == self.chunk_rows, "bitmap chunks follow the stem's"
        word, mask = bit_of(slot)
        p0, p1 = span.bounds()
        return stem.take_marked(names, self._bitmap(source.stream, word, p0, p1), p0, p1,
                                word, mask)[0]

    def fetch_deferred(self, slot: int, source: Source, stem: DataSteM, span: Span,
                       names: Sequence[str], later: Sequence[str]
                       ) -> tuple[dict[str, np.ndarray], Callable[[], dict[str, np.ndarray]]]:
        """`fetch` of `names`; for a position range, the columns `later` are taken only
        when the returned function is called, through the matches the find made now
        (`DataSteM.take_marked`): an invocation whose caller never reads the answer's ts
        and tupleIDs does not copy them (measured, Table 2's queries over a 32K window:
        a fifth to a third of the invocation)."""
        if not span.is_range:
            return super().fetch_deferred(slot, source, stem, span, names, later)
        word, mask = bit_of(slot)
        p0, p1 = span.bounds()
        return stem.take_marked(names, self._bitmap(source.stream, word, p0, p1), p0, p1,
                                word, mask, later)

    def column(self, stream: str, slot: int, span: Span) -> np.ndarray:
        """Positions in `span` whose bit `slot` is set. O(rows in span).

        For a range the positions are a view of a buffer the next call overwrites (an
        invocation fetches its columns from them at once; a fresh buffer per call would
        cost a page fault per 512 positions): copy them to keep them."""
        chunks = self._bitmaps.get(stream, {})
        word, mask = bit_of(slot)
        cap = self.chunk_rows
        parts = []
        if span.is_range:
            p0, p1 = span.bounds()
            if p1 <= p0 or not chunks:
                return np.empty(0, np.int64)
            if len(self._found) < p1 - p0:
                self._found = np.empty(p1 - p0, np.int64)
            first, listed, sealed = self._bitmap(stream, word, p0, p1)
            found = kernels.chunk_positions(listed.handle, first, cap, p0, p1, word, mask, sealed,
                                            self._found)
            return self._found[:found]
        positions = span.array()
        for k, a, b in chunk_runs(positions, cap):
            chunk = chunks.get(k)
            if chunk is None or chunk.shape[0] <= word:
                continue
            rows = positions[a:b] - k * cap
            row = _padded(chunk)[word]
            if row[cap] == kernels.SLICED:      # the slot's bits in its own cap / 64 words
                at = row[slot % 64 * (cap // 64) + (rows >> 6)] >> (rows & 63).astype(DTYPE)
                parts.append(rows[(at & np.uint64(1)) != 0] + k * cap)
            else:
                parts.append(rows[(row[rows] & mask) != 0] + k * cap)
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def image(self) -> dict[str, tuple[int, dict[int, np.ndarray]]]:
        """stream -> (the end of the positions the probe has written, chunk number -> the
        chunk's padded array (rows' forms included)), by reference: a checkpoint's cut.
        O(chunks)."""
        return {stream: (self._written.get(stream, 0),
                         {k: _padded(chunk) for k, chunk in chunks.items()})
                for stream, chunks in self._bitmaps.items()}

    def restore(self, stream: str, written: int, padded: Mapping[int, np.ndarray]) -> None:
        """Take back a stream's chunks from a checkpoint: each a padded array as `image`
        gave it ((word rows, chunk_rows + ROW_PAD) uint64, C-contiguous, its own memory
        or a mapped file's). O(chunks)."""
        for k, base in padded.items():
            assert base.shape[1] == self.chunk_rows + ROW_PAD and base.flags.c_contiguous
            self._bitmaps.setdefault(stream, {})[k] = base[:, :self.chunk_rows]
        self._written[stream] = written
        self._lists.pop(stream, None)

    def admission_bytes(self, words: int, rows: int) -> int:
        """The widening a slot needing `words` words brings, once every retained chunk
        holds it (its own matches widen some at once, later batches the rest); the
        matches themselves are bits of rows that exist. O(chunks)."""
        wider = (self.chunk_rows + ROW_PAD) * 8
        return sum((_rows_for(words) - c.shape[0]) * wider
                   for by_k in self._bitmaps.values() for c in by_k.values()
                   if c.shape[0] < words)

    def nbytes(self) -> int:
        chunks = [c for by_k in self._bitmaps.values() for c in by_k.values()] + self._spare
        return sum(c.shape[0] * (self.chunk_rows + ROW_PAD) * 8 for c in chunks)

    def _check_free(self, held: set[int]) -> None:
        """Assert that no chunk has a bit set for a slot outside `held` (the slots of the
        queries registered) at a position the probe has written, in either form of a
        word row (for tests; O(retained x words)). Past those positions a reused chunk
        holds what it held before, until the probe writes them."""
        cap = self.chunk_rows
        for stream, chunks in self._bitmaps.items():
            for k, chunk in chunks.items():
                end = min(max(self._written.get(stream, 0) - k * cap, 0), cap)
                for w in range(chunk.shape[0]):
                    row = _padded(chunk)[w]
                    free = np.array([64 * w + b not in held for b in range(64)])
                    if row[cap] == kernels.SLICED:      # slot b's bits: its cap / 64 words
                        used = row[:cap].reshape(64, cap // 64).any(axis=1)
                    else:
                        ored = int(np.bitwise_or.reduce(row[:end])) if end else 0
                        used = np.array([(ored >> b) & 1 == 1 for b in range(64)])
                    assert not (used & free).any(), ("a free slot has bits", stream, k, w,
                                                     np.flatnonzero(used & free).tolist())

    def _check(self) -> None:
        """Assert the structure's invariants (for tests): whole chunks of chunk_rows rows;
        a word row is WORD_MAJOR or SLICED, SLICED only in a sealed chunk (the probe
        writes WORD_MAJOR rows); a stream's listed chunks (the compiled find's) are its
        chunks, gaps empty."""
        cap = self.chunk_rows
        for stream, chunks in self._bitmaps.items():
            for k, chunk in chunks.items():
                assert chunk.shape[1] == cap and chunk.dtype == DTYPE
                assert chunk.strides[1] == 8, "a chunk's word rows are contiguous"
                forms = _padded(chunk)[:, cap]
                assert np.isin(forms, (kernels.WORD_MAJOR, kernels.SLICED)).all()
                assert not (forms == kernels.SLICED).any() or \
                    (cap % 64 == 0 and (k + 1) * cap <= self._written.get(stream, 0)), \
                    ("a row is SLICED in a chunk the probe still writes", stream, k)
            if stream in self._lists:
                first, listed = self._lists[stream]
                assert len(listed) == max(chunks, default=first - 1) - first + 1
                for i, (address, rows, width) in enumerate(listed.table.tolist()):
                    have = chunks.get(first + i)
                    assert (rows == 0 if have is None else
                            address == have.ctypes.data and
                            (rows, width) == (have.shape[0], self.chunk_rows + ROW_PAD)), \
                        ("a listed chunk is stale", stream, first + i)

