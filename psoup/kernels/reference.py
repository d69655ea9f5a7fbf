"""The numpy twins of the compiled kernels (`psoup.kernels.compiled`): one function of
the same name and signature per public kernel, computing the same outputs (values,
dtypes, shapes and writes into output arguments) with plain numpy, and importing no
numba. They are what `PSOUP_KERNELS=numpy` runs (platforms numba lacks, debugging with
bounds-checked arrays, no compile time), and the oracle the kernel tests compare the
compiled kernels against. Clarity first: vectorized per chunk or per table, a Python
loop only over chunks, tables or intervals, never over rows.

Where a compiled kernel leaves scratch in an output argument past the count it returns
(a dense run of `word_positions` writes one position past its matches), the twin writes
only what the count covers: callers read out[:count] and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from psoup.kernels.layout import SLICED, TILE_WORDS, WORD_MAJOR, AddressTable, Handle, address_table

__all__ = ["SLICED", "TILE_WORDS", "WORD_MAJOR", "AddressTable", "Handle", "address_table",
           "block_fold", "block_prefix", "chunk_gather", "interval_fold", "chunk_key_counts",
           "chunk_key_range",
           "chunk_positions",
           "chunk_scatter", "chunk_select", "clear_bit", "fingerprint", "float_prefix",
           "interval_gather", "interval_scan", "marked_copy", "probe_into", "set_bits",
           "slice_row", "ts_fault", "word_positions", "write_column"]

_U64 = 2**64 - 1


def _trailing_zeros(mask: np.uint64) -> int:
    """The number of trailing zero bits of `mask` (64 for zero, as the compiled cttz)."""
    value = int(mask)
    return (value & -value).bit_length() - 1 if value else 64


def _own(handle: Handle) -> AddressTable:
    """The AddressTable a handle is (under this backend `AddressTable.handle` is the
    table itself; an int64 table here is a call site passing `.table` by mistake)."""
    if not isinstance(handle, AddressTable):
        raise TypeError("the numpy kernels take AddressTable.handle, not its int64 table")
    return handle


def _array_at(table: AddressTable, i: int) -> NDArray[np.uint64]:
    """arrays[i] of the table, a gap as an array of no rows; an index outside the table
    raises (the compiled kernels read whatever memory is there)."""
    if not 0 <= i < len(table.arrays):
        raise IndexError(f"chunk {i} outside an address table of {len(table.arrays)}")
    array = table.arrays[i]
    return np.zeros((0, 0), np.uint64) if array is None else array


def _unpack(words: NDArray[np.uint64]) -> NDArray[np.bool_]:
    """The bits of `words`, bit b of words[i] at 64 i + b."""
    little = np.ascontiguousarray(words, dtype="<u8")
    return np.unpackbits(little.view(np.uint8), bitorder="little").astype(bool)


def _pack(bits: NDArray[np.bool_]) -> NDArray[np.uint64]:
    """`_unpack`'s inverse: 64-bit words of `bits` (zero past their end)."""
    padded = np.zeros(-(-len(bits) // 64) * 64, bool)
    padded[:len(bits)] = bits
    return np.packbits(padded, bitorder="little").view("<u8").astype(np.uint64)


def _runs(positions: NDArray[np.int64], cap: int) -> Iterator[tuple[int, int, int]]:
    """(chunk number, a, b) for each run positions[a:b] of sorted positions in one chunk."""
    if len(positions) == 0:
        return
    chunk = positions // cap
    edges = np.flatnonzero(np.diff(chunk)) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [len(positions)]))
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        yield int(chunk[a]), a, b


def probe_into(tables: tuple[NDArray[np.uint64], ...], keys: tuple[NDArray[np.int64], ...],
               firsts: tuple[int, ...], maps: tuple[NDArray[np.int64], ...],
               interest: NDArray[np.uint64], out: NDArray[np.uint64]) -> int:
    """out[:, i] = ~(tables[0][maps[0][keys[0][i] - firsts[0]]] | ...) & interest; -1, or
    (writing nothing) the first table g one of whose keys falls outside maps[g]. A range
    check per table, then each table's rows gathered and ORed into an (n, words) array:
    O(n * tables * words) time and n * words words of memory."""
    words, n = out.shape
    for g, (key, first, lookup) in enumerate(zip(keys, firsts, maps, strict=True)):
        at = key.astype(np.int64) - first
        if n and ((at < 0) | (at >= len(lookup))).any():
            return g
    rejected = np.zeros((n, words), np.uint64)
    for table, key, first, lookup in zip(tables, keys, firsts, maps, strict=True):
        rejected |= table[lookup[key.astype(np.int64) - first], :words]
    out[:] = (~rejected & interest[:words]).T
    return -1


def ts_fault(stamps: NDArray[np.float64], last: float) -> int:
    """The first row whose ts is not finite, or is below the one before it (row 0: below
    `last`); -1 when there is none. O(n)."""
    if len(stamps) == 0:
        return -1
    before = np.concatenate(([last], stamps[:-1]))
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(stamps) | (stamps < before)
    return int(np.argmax(bad)) if bad.any() else -1


def word_positions(words: NDArray[np.uint64], mask: np.uint64, r0: int, r1: int, base: int,
                   out: NDArray[np.int64]) -> int:
    """Write base + r for every row r0 <= r < r1 with words[r] & mask into out; returns
    how many. O(r1 - r0)."""
    found = np.flatnonzero(words[r0:r1] & mask) + (base + r0) if r1 > r0 else \
        np.empty(0, np.int64)
    out[:len(found)] = found
    return len(found)


def slice_row(row: NDArray[np.uint64], cap: int) -> None:
    """Turn a WORD_MAJOR chunk row (cap words, cap a multiple of 64, then its form word)
    SLICED in place: its (tuple, slot) bit matrix transposed and repacked. O(cap)."""
    bits = _unpack(row[:cap]).reshape(cap, 64)
    row[:cap] = _pack(bits.T.reshape(-1))
    row[cap] = SLICED


def _ready(chunk: NDArray[np.uint64], word: int, c: int, cap: int,
           sealed: int) -> NDArray[np.uint64]:
    """Chunk c's word row `word`, first made SLICED when it is WORD_MAJOR, cap is a
    multiple of 64 and all its positions are below `sealed` (as the compiled `_ready`)."""
    row: NDArray[np.uint64] = chunk[word]
    if row[cap] == WORD_MAJOR and cap % 64 == 0 and (c + 1) * cap <= sealed:
        slice_row(row, cap)
    return row


def _row_bits(row: NDArray[np.uint64], cap: int, mask: np.uint64, r0: int,
              r1: int) -> NDArray[np.bool_]:
    """Whether the bit `mask` is set at rows r0 ... r1 - 1 of a chunk row of either form
    (SLICED: the slot of mask's lowest bit, its cap / 64 words)."""
    if row[cap] == SLICED:
        start = _trailing_zeros(mask) * (cap // 64)
        return _unpack(row[start:start + cap // 64])[r0:r1]
    tested: NDArray[np.bool_] = (row[r0:r1] & mask) != 0
    return tested


def chunk_positions(chunks: Handle, k_first: int, cap: int, p0: int, p1: int,
                    word: int, mask: np.uint64, sealed: int, out: NDArray[np.int64]) -> int:
    """The positions p0 <= p < p1 of a chunked bitmap (chunk k is arrays[k - k_first];
    none outside the list, a gap, or a chunk of `word` rows or fewer) whose bit is set,
    written to out; returns how many. Sealed WORD_MAJOR rows read are made SLICED first,
    as the compiled kernel does. O(p1 - p0)."""
    listed = _own(chunks)
    k = 0
    for c in range(p0 // cap, (p1 - 1) // cap + 1) if p1 > p0 else ():
        i = c - k_first
        if not 0 <= i < len(listed.arrays):
            continue
        chunk = _array_at(listed, i)
        if chunk.shape[0] <= word:
            continue
        row = _ready(chunk, word, c, cap, sealed)
        r0, r1 = max(p0 - c * cap, 0), min(p1 - c * cap, cap)
        found = np.flatnonzero(_row_bits(row, cap, mask, r0, r1)) + (c * cap + r0)
        out[k:k + len(found)] = found
        k += len(found)
    return k


def chunk_gather(blocks: Handle, k_first: int, cap: int, rows_of: NDArray[np.int64],
                 positions: NDArray[np.int64], out: NDArray[np.uint64]) -> None:
    """out[j, i] = the value of block row rows_of[j] at sorted position positions[i],
    chunk k's block being arrays[k - k_first]. O(len(rows_of) * len(positions))."""
    held = _own(blocks)
    for c, a, b in _runs(positions, cap):
        block = _array_at(held, c - k_first)
        out[:, a:b] = block[rows_of][:, positions[a:b] - c * cap]


def interval_scan(blocks: Handle, k_first: int, cap: int, p0: int, p1: int,
                  ints: NDArray[np.int64], floats: NDArray[np.float64],
                  out: NDArray[np.int64]) -> int:
    """The positions p0 <= p < p1 whose value in block row ints[0, j] lies in
    [ints[2, j], ints[3, j]] as int64 or, where ints[1, j] is 1, in
    [floats[0, j], floats[1, j]] as float64, for every j; written to out, returns how
    many. O((p1 - p0) x intervals).

    With no intervals at all the compiled kernel writes whole 64-row groups, past p1;
    this twin writes the window's positions (the engine always passes an interval)."""
    held = _own(blocks)
    k = 0
    for c in range(p0 // cap, (p1 - 1) // cap + 1) if p1 > p0 else ():
        block = _array_at(held, c - k_first)
        r0, r1 = max(p0 - c * cap, 0), min(p1 - c * cap, cap)
        inside = np.ones(r1 - r0, bool)
        for j in range(ints.shape[1]):
            row = block[ints[0, j], r0:r1]
            if ints[1, j]:
                values = row.view(np.float64)
                inside &= (values >= floats[0, j]) & (values <= floats[1, j])
            else:
                signed = row.view(np.int64)
                inside &= (signed >= ints[2, j]) & (signed <= ints[3, j])
        found = np.flatnonzero(inside) + (c * cap + r0)
        out[k:k + len(found)] = found
        k += len(found)
    return k


def interval_gather(blocks: Handle, k_first: int, cap: int, p0: int, p1: int,
                    ints: NDArray[np.int64], floats: NDArray[np.float64],
                    rows_of: NDArray[np.int64], out: NDArray[np.uint64]) -> int:
    """`interval_scan`'s positions into out[0] and the values of block rows rows_of at
    them into out[1:]; returns how many. O((p1 - p0) x intervals + matches x rows)."""
    found = np.empty(max(p1 - p0, 0), np.int64)
    k = interval_scan(blocks, k_first, cap, p0, p1, ints, floats, found)
    out[0, :k] = found[:k].view(np.uint64)
    values = np.empty((len(rows_of), k), np.uint64)
    chunk_gather(blocks, k_first, cap, rows_of, found[:k], values)
    out[1:, :k] = values
    return k


def _select_masks(chunks: AddressTable, k_first: int, p0: int, p1: int, word: int,
                  mask: np.uint64, sealed: int, blocks: AddressTable, b_first: int,
                  cap: int) -> NDArray[np.uint64]:
    """`chunk_select`'s match masks: one row per chunk the window touches, mask q of it
    the matches of rows r0 + 64 q ... (r0 the window's first row in the chunk), zero
    where the chunk has no bitmap row or no data block."""
    c0 = p0 // cap
    c1 = (p1 - 1) // cap + 1 if p1 > p0 else c0
    masks = np.zeros((max(c1 - c0, 0), (cap + 63) // 64), np.uint64)
    for c in range(c0, c1):
        i, b = c - k_first, c - b_first
        if not 0 <= i < len(chunks.arrays) or _array_at(chunks, i).shape[0] <= word or \
                not 0 <= b < len(blocks.arrays):
            continue
        row = _ready(_array_at(chunks, i), word, c, cap, sealed)
        r0, r1 = max(p0 - c * cap, 0), min(p1 - c * cap, cap)
        packed = _pack(_row_bits(row, cap, mask, r0, r1))
        masks[c - c0, :len(packed)] = packed
    return masks


def _copy_marked(masks: NDArray[np.uint64], p0: int, p1: int, blocks: AddressTable,
                 b_first: int, cap: int, rows_of: NDArray[np.int64],
                 positions: NDArray[np.int64]) -> NDArray[np.uint64]:
    """The values of block rows `rows_of` at the matches of `masks`, as a new
    (len(rows_of), matches) array; the positions too, into `positions` unless empty."""
    c0 = p0 // cap
    picked: list[NDArray[np.uint64]] = []
    at: list[NDArray[np.int64]] = []
    for q, c in enumerate(range(c0, c0 + masks.shape[0])):
        if not 0 <= c - b_first < len(blocks.arrays):
            continue                    # its masks are zero
        r0, r1 = max(p0 - c * cap, 0), min(p1 - c * cap, cap)
        rows = np.flatnonzero(_unpack(masks[q])[:max(r1 - r0, 0)]) + r0
        picked.append(_array_at(blocks, c - b_first)[rows_of][:, rows])
        at.append(rows + c * cap)
    out = np.concatenate(picked, axis=1) if picked else np.empty((len(rows_of), 0), np.uint64)
    if len(positions) and at:
        found = np.concatenate(at)
        positions[:len(found)] = found
    return out.astype(np.uint64, copy=False)


def chunk_select(chunks: Handle, k_first: int, p0: int, p1: int, word: int,
                 mask: np.uint64, sealed: int, blocks: Handle, b_first: int, cap: int,
                 rows_of: NDArray[np.int64], positions: NDArray[np.int64]
                 ) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
    """The find and the fetch of an invocation: the values of block rows `rows_of` at
    the positions p0 <= p < p1 whose bit is set (and that have a data block), as a new
    (len(rows_of), matches) array, with the (chunks, 64-row) match masks `marked_copy`
    takes; the positions written to `positions` unless it is empty. Sealed rows read are
    made SLICED first. O(p1 - p0 + columns x matches)."""
    listed = _own(chunks)
    held = _own(blocks)
    masks = _select_masks(listed, k_first, p0, p1, word, mask, sealed, held, b_first, cap)
    return _copy_marked(masks, p0, p1, held, b_first, cap, rows_of, positions), masks


def marked_copy(masks: NDArray[np.uint64], p0: int, p1: int, blocks: Handle,
                b_first: int, cap: int, rows_of: NDArray[np.int64]) -> NDArray[np.uint64]:
    """The values of block rows `rows_of` at the matches `chunk_select` found (its masks,
    for the same p0, p1 and cap), as a new (len(rows_of), matches) array.
    O(columns x matches + (p1 - p0) / 64)."""
    held = _own(blocks)
    return _copy_marked(masks, p0, p1, held, b_first, cap, rows_of, np.empty(0, np.int64))


def write_column(table: NDArray[np.uint64], cell_row: NDArray[np.int64], word: int,
                 mask: np.uint64, accepts: NDArray[np.bool_]) -> None:
    """table[cell_row[c], word] gets bit `mask` set where accepts[c] is False, cleared
    where it is True. O(cells)."""
    kept = table[cell_row, word] & ~mask
    table[cell_row, word] = np.where(accepts, kept, kept | mask)


_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xFF51AFD7ED558CCD,
        0xC4CEB9FE1A85EC53, 0xD6E8FEB86659FD93)


def fingerprint(values: NDArray[np.int64]) -> tuple[int, int]:
    """Two 64-bit lanes that tell int64 sequences apart (each value and its index mixed
    by two splitmix64 finalizers, summed and xored mod 2**64, the length folded in), as
    the compiled kernel computes them. O(n), uint64 arithmetic wrapping as in C."""
    flat = np.asarray(values).reshape(-1)
    n = flat.size
    golden, a1, a2, b1, b2, fold = (np.uint64(m) for m in _MIX)
    v = flat.astype(np.uint64) + np.arange(n, dtype=np.uint64) * golden
    a = (v ^ (v >> np.uint64(30))) * a1
    a = (a ^ (a >> np.uint64(27))) * a2
    b = (v ^ (v >> np.uint64(33))) * b1
    b = (b ^ (b >> np.uint64(33))) * b2
    s = int((a ^ (a >> np.uint64(31))).sum(dtype=np.uint64))
    x = int(np.bitwise_xor.reduce(b ^ (b >> np.uint64(33)), initial=np.uint64(0)))
    return (s + n * int(fold)) & _U64, x ^ n


def clear_bit(chunks: Handle, cap: int, word: int, mask: np.uint64) -> None:
    """Clear `mask` in word row `word` of every chunk that has that row (in a SLICED row,
    the slot's own cap / 64 words). O(chunks x cap)."""
    listed = _own(chunks)
    groups = cap // 64
    start = _trailing_zeros(mask) * groups
    for chunk in listed.arrays:
        if chunk is None or chunk.shape[0] <= word:
            continue
        row = chunk[word]
        if row[cap] == SLICED:
            row[start:start + groups] = 0
        else:
            row[:cap] &= ~mask


def set_bits(chunks: Handle, k_first: int, cap: int, word: int, mask: np.uint64,
             positions: NDArray[np.int64]) -> None:
    """Set `mask` in word row `word` at each of the sorted positions (row `word` of
    chunk p // cap, column p % cap; in a SLICED row the slot's own bits).
    O(len(positions))."""
    listed = _own(chunks)
    start = _trailing_zeros(mask) * (cap // 64)
    for c, a, b in _runs(positions, cap):
        row = _array_at(listed, c - k_first)[word]
        r = positions[a:b] - c * cap
        if row[cap] == SLICED:
            np.bitwise_or.at(row, start + (r >> 6),
                             np.left_shift(np.uint64(1), (r & 63).astype(np.uint64)))
        else:
            row[r] |= mask


def chunk_key_range(blocks: Handle, k_first: int, cap: int, row: int,
                    positions: NDArray[np.int64]) -> tuple[int, int]:
    """(min, max) of the int64 values of block row `row` at the sorted positions ((0, -1)
    for none). O(len(positions))."""
    if len(positions) == 0:
        return 0, -1
    values = np.empty((1, len(positions)), np.uint64)
    chunk_gather(blocks, k_first, cap, np.array([row], np.int64), positions, values)
    keys = values[0].view(np.int64)
    return int(keys.min()), int(keys.max())


def chunk_key_counts(blocks: Handle, k_first: int, cap: int, row: int,
                     positions: NDArray[np.int64], lo: int, counts: NDArray[np.int64]) -> int:
    """counts[v - lo] += 1 for the int64 value v of block row `row` at each sorted
    position within [lo, lo + len(counts)); returns how many lay outside.
    O(len(positions))."""
    values = np.empty((1, len(positions)), np.uint64)
    chunk_gather(blocks, k_first, cap, np.array([row], np.int64), positions, values)
    at = values[0].view(np.int64) - np.int64(lo)       # wraps as the compiled kernel's
    inside = at.view(np.uint64) < np.uint64(len(counts))
    counts += np.bincount(at[inside], minlength=len(counts)).astype(np.int64)
    return int(len(at) - np.count_nonzero(inside))


def chunk_scatter(blocks: Handle, k_first: int, cap: int, rows_of: NDArray[np.int64],
                  positions: NDArray[np.int64], key_row: int, keys: NDArray[np.int64],
                  lo: int, remap: NDArray[np.int64], cursors: NDArray[np.int64],
                  dst: NDArray[np.uint64]) -> None:
    """The tuple at sorted position positions[i] to column cursors[g] of `dst`,
    g = remap[key - lo], the key block row `key_row` there when key_row >= 0, else
    keys[i] (group 0 for all when `keys` is empty too), in position order within a
    group: dst[0] the position, dst[1 + r] block row rows_of[r]; cursors move on past
    their group's tuples. O((1 + len(rows_of)) x n log n)."""
    n = len(positions)
    values = np.empty((len(rows_of) + 1, n), np.uint64)
    chunk_gather(blocks, k_first, cap, np.array([*rows_of.tolist(), max(key_row, 0)], np.int64),
                 positions, values)
    if key_row >= 0:
        keys = values[-1].view(np.int64)
    values = values[:-1]
    codes = np.zeros(n, np.int64) if len(keys) == 0 else remap[keys - lo]
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=len(cursors)).astype(np.int64)
    firsts = np.cumsum(counts) - counts
    rank = np.arange(n) - np.repeat(firsts, counts)
    dest = np.empty(n, np.int64)
    dest[order] = cursors[codes[order]] + rank
    dst[0, dest] = positions.view(np.uint64)
    dst[1:, dest] = values
    cursors += counts


def float_prefix(values: NDArray[np.float64], s0: float, e0: float,
                 out: NDArray[np.float64]) -> None:
    """out[i] = the compensated prefix (s, e) after values[:i + 1] from (s0, e0): s the
    running float64 sum, e the running sum of each step's TwoSum rounding error. O(n)."""
    with np.errstate(over="ignore", invalid="ignore"):
        running = np.cumsum(np.concatenate(([s0], values)))
        before, after = running[:-1], running[1:]
        part = after - before
        errors = (before - (after - part)) + (values - part)
        errors[:1] += e0
        out[:, 0] = after
        np.cumsum(errors, out=out[:, 1])


def block_fold(blocks: Handle, k_first: int, cap: int, positions: NDArray[np.int64],
               key_row: int, lo: int, value_row: int, log_b: int, b_first: int,
               groups: int, counts: NDArray[np.int64], last: NDArray[np.int64],
               sums: NDArray[Any], mins: NDArray[Any], maxs: NDArray[Any]) -> int:
    """The tuples at sorted `positions` folded into cells [block, group]: block
    (p >> log_b) - b_first, group k - lo for the INT value k of block row `key_row`
    (0 without one); those whose group is not one of the first `groups` columns are
    left out, and their number returned. Skipping the cell arrays without rows:
    counts += the cell's rows, last raised to its latest position, sums += the sum of
    its values of block row `value_row` (read as sums' dtype; FLOAT a compensated pair
    summed from (0, 0) in position order, chunk by chunk, each chunk's then added to
    the cell's by one TwoSum step; INT the sums of the 32-bit halves), mins / maxs
    lowered / raised. O(n log n) and a loop over the chunks and the cells a FLOAT sum
    touches."""
    n = len(positions)
    if not n:
        return 0
    got = np.empty((2, n), np.uint64)
    chunk_gather(blocks, k_first, cap, np.array([max(key_row, 0), max(value_row, 0)], np.int64),
                 positions, got)
    outside = 0
    if key_row >= 0:
        at = got[0].view(np.int64) - np.int64(lo)        # wraps as the compiled kernel's
        inside = at.view(np.uint64) < np.uint64(groups)
        outside = int(n - np.count_nonzero(inside))
        positions, got = positions[inside], got[:, inside]
    if not len(positions):
        return outside
    starts = np.flatnonzero(np.r_[True, np.diff(positions // cap) != 0]).tolist()
    for a, b in zip(starts, [*starts[1:], len(positions)], strict=True):
        _fold_chunk(positions[a:b], got[:, a:b], key_row >= 0, lo, log_b, b_first,
                    groups, counts, last, sums, mins, maxs)
    return outside


def _fold_chunk(positions: NDArray[np.int64], got: NDArray[np.uint64], keyed: bool, lo: int,
                log_b: int, b_first: int, groups: int, counts: NDArray[np.int64],
                last: NDArray[np.int64], sums: NDArray[Any], mins: NDArray[Any],
                maxs: NDArray[Any]) -> None:
    """`block_fold` of one chunk's positions, their key and value words in `got`."""
    n = len(positions)
    g = got[0].view(np.int64) - np.int64(lo) if keyed else np.zeros(n, np.int64)
    cells = ((positions >> log_b) - b_first) * groups + g
    order = np.argsort(cells, kind="stable")
    found, starts, sizes = np.unique(cells[order], return_index=True, return_counts=True)
    b, g = np.divmod(found, groups)
    values = got[1].view(sums.dtype)[order]
    if counts.shape[0]:
        counts[b, g] += sizes
        last[b, g] = np.maximum(last[b, g], positions[order][starts + sizes - 1])
    if mins.shape[0]:
        mins[b, g] = np.minimum(mins[b, g], np.minimum.reduceat(values, starts))
    if maxs.shape[0]:
        maxs[b, g] = np.maximum(maxs[b, g], np.maximum.reduceat(values, starts))
    if not sums.shape[0]:
        return
    if sums.dtype.kind == "i":
        with np.errstate(over="ignore"):
            sums[b, g, 0] += np.add.reduceat(values >> 32, starts)
            sums[b, g, 1] += np.add.reduceat(values & 0xFFFFFFFF, starts)
        return
    for cb, cg, a, k in zip(b.tolist(), g.tolist(), starts.tolist(), sizes.tolist(),
                            strict=True):
        run = np.empty((k, 2))
        float_prefix(values[a:a + k], 0.0, 0.0, run)
        with np.errstate(over="ignore", invalid="ignore"):
            x, (v, e) = sums[cb, cg, 0], run[-1]
            total = x + v
            part = total - x
            sums[cb, cg, 1] += (x - (total - part)) + (v - part)
            sums[cb, cg, 1] += e
            sums[cb, cg, 0] = total


def block_prefix(sums: NDArray[np.float64], start: NDArray[np.float64],
                 out: NDArray[np.float64]) -> None:
    """out[b, g] = the compensated prefix of FLOAT block sums sums[:b + 1, g] from
    start[g]: the running float64 sum of the blocks' s, and the running sum of each
    step's TwoSum error then the block's e, in that order. O(blocks x groups)."""
    k = sums.shape[0]
    if not k:
        return
    with np.errstate(over="ignore", invalid="ignore"):
        running = np.cumsum(np.concatenate((start[None, :, 0], sums[:, :, 0])), axis=0)
        before, after = running[:-1], running[1:]
        part = after - before
        steps = np.empty((2 * k + 1, sums.shape[1]))
        steps[0] = start[:, 1]
        steps[1::2] = (before - (after - part)) + (sums[:, :, 0] - part)
        steps[2::2] = sums[:, :, 1]
        errors = np.cumsum(steps, axis=0)
    out[:, :, 0] = after
    out[:, :, 1] = errors[2::2]


def interval_fold(blocks: Handle, k_first: int, cap: int, p0: int, p1: int,
                  ints: NDArray[np.int64], floats: NDArray[np.float64], out: NDArray[np.int64],
                  key_row: int, lo: int, value_row: int, log_b: int, b_first: int,
                  groups: int, counts: NDArray[np.int64], last: NDArray[np.int64],
                  sums: NDArray[Any], mins: NDArray[Any], maxs: NDArray[Any]
                  ) -> tuple[int, int]:
    """`interval_scan` of [p0, p1) into `out`, then `block_fold` of the matches:
    (matches, those left out of the cells). O((p1 - p0) x intervals)."""
    k = interval_scan(blocks, k_first, cap, p0, p1, ints, floats, out)
    return k, block_fold(blocks, k_first, cap, out[:k], key_row, lo, value_row, log_b,
                         b_first, groups, counts, last, sums, mins, maxs)
