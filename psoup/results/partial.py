"""PSoup-P's Results Structure: one two-dimensional bitmap per FROM list (Sect. 4.3).

Rows are a stream's tuples in physicalID order (their positions), columns are query
slots, 64 to a little-endian uint64 word. The bitmap is kept in chunks of the Data SteM's
chunk size, so expiry drops whole chunks in step with the Data SteM and a missing chunk
reads as all zeros (no query matched there). A batch's Query SteM probe is copied in as a
block of rows; a new query's Data SteM probe sets bits in one column. Windows are applied
only at invocation, by scanning the query's column over the window's rows: the cost the
paper measures in Fig. 7 grows with the window, not with the number of results.
"""

from __future__ import annotations

import numpy as np

from typing import Mapping

from psoup.bits import bit_of
from psoup.query.model import Source
from psoup.results.base import ResultsStructure
from psoup.stems.data_stem import DataSteM, chunk_runs
from psoup.stems.span import Span


class PartialResults(ResultsStructure):
    """Bitmaps per stream (selection queries have one-stream FROM lists).

    Example:
        >>> rs = PartialResults(chunk_rows=4)
        >>> rs.on_insert("R", 0, np.array([[1], [0], [1]], dtype="<u8"), {})
        >>> rs.column("R", 0, Span.range(0, 3)).tolist()
        [0, 2]
    """

    def __init__(self, chunk_rows: int = 8192):
        self.chunk_rows = chunk_rows
        self._bitmaps: dict[str, dict[int, np.ndarray]] = {}
        self._spare: list[np.ndarray] = []      # expired chunks, reused (no page faults)

    def _chunk(self, chunks: dict[int, np.ndarray], k: int, words: int,
               written_from: int = -1) -> np.ndarray:
        """Chunk k, at least `words` wide; a new one is zero except from row
        `written_from` on (rows the caller writes next, and later batches after it)."""
        chunk = chunks.get(k)
        if chunk is None:
            spare = self._spare
            while spare and spare[-1].shape[1] != words:
                spare.pop()
            if spare:
                chunk = chunks[k] = spare.pop()
                chunk[:written_from if written_from >= 0 else None] = 0
            else:
                chunk = chunks[k] = np.zeros((self.chunk_rows, words), dtype="<u8")
        elif chunk.shape[1] < words:
            chunk = chunks[k] = np.pad(chunk, ((0, 0), (0, words - chunk.shape[1])))
        return chunk

    def on_insert(self, stream: str, p0: int, bits: np.ndarray,
                  batch: Mapping[str, np.ndarray]) -> None:
        """Copy n probe rows in. O(n * words)."""
        chunks = self._bitmaps.setdefault(stream, {})
        n, words = bits.shape
        cap = self.chunk_rows
        done = 0
        while done < n:
            k, r = divmod(p0 + done, cap)
            take = min(cap - r, n - done)
            block = bits[done:done + take]
            if k in chunks or block.any():
                self._chunk(chunks, k, words, r)[r:r + take, :words] = block
            done += take

    def on_register(self, slot: int, stream: str, positions: np.ndarray) -> None:
        """Set the new query's column at `positions`. O(len(positions))."""
        chunks = self._bitmaps.setdefault(stream, {})
        word, mask = bit_of(slot)
        words = word + 1
        cap = self.chunk_rows
        for k, a, b in chunk_runs(positions, cap):
            self._chunk(chunks, k, words)[positions[a:b] - k * cap, word] |= mask

    def on_unregister(self, slot: int) -> None:
        """Clear the slot's column in every chunk. O(retained rows)."""
        word, mask = bit_of(slot)
        for chunks in self._bitmaps.values():
            for chunk in chunks.values():
                if chunk.shape[1] > word:
                    chunk[:, word] &= ~mask

    def on_expire(self, stream: str, horizon: int) -> None:
        chunks = self._bitmaps.get(stream, {})
        for k in [k for k in chunks if (k + 1) * self.chunk_rows <= horizon]:
            if len(self._spare) < 2:
                self._spare.append(chunks[k])
            del chunks[k]

    def matches(self, slot: int, source: Source, stem: DataSteM, span: Span) -> np.ndarray:
        return self.column(source.stream, slot, span)

    def column(self, stream: str, slot: int, span: Span) -> np.ndarray:
        """Positions in `span` whose bit `slot` is set. O(rows in span)."""
        chunks = self._bitmaps.get(stream, {})
        word, mask = bit_of(slot)
        cap = self.chunk_rows
        parts = []
        if span.is_range:
            p0, p1 = span.bounds()
            for k in range(p0 // cap, (p1 - 1) // cap + 1) if p1 > p0 else ():
                chunk = chunks.get(k)
                if chunk is None or chunk.shape[1] <= word:
                    continue
                r0, r1 = max(p0 - k * cap, 0), min(p1 - k * cap, cap)
                parts.append(np.flatnonzero(chunk[r0:r1, word] & mask) + (k * cap + r0))
        else:
            positions = span.array()
            for k, a, b in chunk_runs(positions, cap):
                chunk = chunks.get(k)
                if chunk is None or chunk.shape[1] <= word:
                    continue
                rows = positions[a:b] - k * cap
                parts.append(rows[(chunk[rows, word] & mask) != 0] + k * cap)
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def nbytes(self) -> int:
        return sum(c.nbytes for chunks in self._bitmaps.values() for c in chunks.values()) + \
            sum(c.nbytes for c in self._spare)

    def _check(self) -> None:
        """Assert the structure's invariants (for tests): whole chunks of chunk_rows rows."""
        for chunks in self._bitmaps.values():
            for chunk in chunks.values():
                assert chunk.shape[0] == self.chunk_rows and chunk.dtype == np.dtype("<u8")

