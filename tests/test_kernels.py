"""The kernels (psoup.kernels, the backend PSOUP_KERNELS picks) against the numpy
expressions they replace; each compiled kernel against its numpy twin
(psoup.kernels.compiled against psoup.kernels.reference, on the same inputs: outputs,
dtypes and writes into output arguments alike); and the engine on the numpy backend,
in a process of its own, never importing numba and answering as the default backend."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

import psoup.kernels.layout as kernel_layout
from psoup.kernels import (
    SLICED,
    WORD_MAJOR,
    address_table,
    chunk_gather,
    chunk_positions,
    chunk_select,
    clear_bit,
    compiled,
    marked_copy,
    probe_into,
    reference,
    set_bits,
    slice_row,
    ts_fault,
    word_positions,
    write_column,
)
from psoup.kernels.layout import BLOCK_WORDS, AddressTable, Handle


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(0, 300), st.integers(0, 63), st.floats(0, 1))
def test_word_positions_lists_the_rows_with_the_bit_set(data: st.DataObject, n: int, bit: int,
                                                        density: float) -> None:
    """Sparse, dense and mixed runs of 64 rows, and a ragged tail, all agree with numpy."""
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    mask = np.uint64(1) << np.uint64(bit)
    words = gen.integers(0, 2**63, n, dtype=np.uint64) & ~mask
    words[gen.random(n) < density] |= mask
    r0 = data.draw(st.integers(0, n))
    r1 = data.draw(st.integers(r0, n))
    out = np.full(n + 1, -1, np.int64)
    found = word_positions(words, mask, r0, r1, 1000, out)
    expected = np.flatnonzero(words[r0:r1] & mask) + r0 + 1000
    assert out[:found].tolist() == expected.tolist()


@settings(max_examples=100, deadline=None)
@given(st.data(), st.integers(1, 5), st.integers(1, 50), st.integers(1, 4))
def test_chunk_gather_takes_the_selected_rows_at_positions_across_chunks(
        data: st.DataObject, rows: int, cap: int, chunks: int) -> None:
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    blocks = [gen.integers(0, 2**63, (rows, cap), dtype=np.uint64) for _ in range(chunks)]
    listed = address_table(blocks).handle
    first = data.draw(st.integers(0, 3))                 # chunk number of blocks[0]
    rows_of = np.array(data.draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=4)),
                       dtype=np.int64)
    positions = np.sort(gen.choice(chunks * cap, data.draw(st.integers(0, chunks * cap)),
                                   replace=False)).astype(np.int64) + first * cap
    out = np.zeros((len(rows_of), len(positions)), np.uint64)
    chunk_gather(listed, first, cap, rows_of, positions, out)
    whole = np.concatenate(blocks, axis=1)
    assert (out == whole[rows_of][:, positions - first * cap]).all()


def _bitmap(data: st.DataObject, gen: np.random.Generator, chunks: int, cap: int, word: int,
            mask: np.uint64, pad: int, fill: Callable[[NDArray[np.uint64]], NDArray[np.uint64]]
            ) -> tuple[list[NDArray[np.uint64]], int, NDArray[np.bool_]]:
    """A list of `chunks` word-major bitmap chunks of `cap` rows (0 to
    word + 2 word rows each, `pad` never-read words past each row's end, values
    `fill(random words)`), the chunk number of the first, and the bit `mask` of word
    row `word` at every position (a chunk before the first, or past the list, none)."""
    listed = []
    expected_bits = []
    for _ in range(chunks):
        height = data.draw(st.sampled_from([0, word, word + 1, word + 2]))
        padded = np.zeros((height, cap + pad), np.uint64)   # rows longer than cap
        chunk = padded[:, :cap]
        chunk[:] = fill(gen.integers(0, 2**63, (height, cap), dtype=np.uint64))
        padded[:, cap + 1:] = ~np.uint64(0)                 # never read
        padded[:, cap] = WORD_MAJOR                         # each row's form
        listed.append(padded)
        expected_bits.append(chunk[word] & mask != 0 if height > word
                             else np.zeros(cap, bool))
    first = data.draw(st.integers(0, 2))
    bits = np.concatenate([np.zeros(first * cap, bool), *expected_bits,
                           np.zeros(cap, bool)])
    return listed, first, bits


#: Chunk sizes: any, and multiples of 64 (whose sealed rows a find turns SLICED).
CAPS = st.one_of(st.integers(1, 130), st.sampled_from([64, 128, 192]))


def _sealed_rows_sliced(listed: Sequence[NDArray[np.uint64]], first: int, cap: int, word: int,
                        sealed: int, p0: int, p1: int) -> bool:
    """Whether every row `word` of a chunk the find read, sealed below `sealed`, is now
    SLICED when cap allows it, and every other row still WORD_MAJOR."""
    for i, chunk in enumerate(listed):
        c = first + i
        if chunk.shape[0] > word:
            read = p0 < p1 and p0 // cap <= c <= (p1 - 1) // cap
            want = read and cap % 64 == 0 and (c + 1) * cap <= sealed
            if chunk[word, cap] != (SLICED if want else WORD_MAJOR):
                return False
    return True


@settings(max_examples=150, deadline=None)
@given(st.data(), CAPS, st.integers(1, 4), st.integers(0, 2))
def test_chunk_positions_lists_the_window_matches_across_chunks_and_gaps(
        data: st.DataObject, cap: int, chunks: int, word: int) -> None:
    """Chunks missing from the list, gaps (no rows) and chunks too narrow for the word
    have no matches; the rest agree with numpy, the first time (sealed rows made SLICED
    as they are read) and again (read SLICED)."""
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    mask = np.uint64(1) << np.uint64(data.draw(st.integers(0, 63)))
    listed, first, bits = _bitmap(data, gen, chunks, cap, word, mask, 3, lambda rows: rows)
    p0 = data.draw(st.integers(0, len(bits)))
    p1 = data.draw(st.integers(p0, len(bits)))
    sealed = data.draw(st.integers(0, len(bits)))
    expected = (np.flatnonzero(bits[p0:p1]) + p0).tolist()
    for _ in range(2):
        out = np.full(p1 - p0 + 1, -1, np.int64)   # the last word must stay unwritten
        found = chunk_positions(address_table(listed).handle, first, cap, p0, p1, word, mask,
                                sealed, out)
        assert out[:found].tolist() == expected and out[-1] == -1
    assert _sealed_rows_sliced(listed, first, cap, word, sealed, p0, p1)


def test_chunk_positions_writes_no_further_than_the_window_in_a_sliced_row() -> None:
    """Every row of a window matching, its tail less than 64 rows: the positions fill
    the output exactly, the word after them untouched (a dense run written 64 at a
    time would write past the window's end)."""
    cap, word, mask = 128, 0, np.uint64(1) << np.uint64(9)
    padded = np.zeros((1, cap + 2), np.uint64)
    padded[0, :cap] = mask
    listed = address_table([padded]).handle
    for p0, p1 in ((5, 100), (0, 128), (64, 70)):
        out = np.full(p1 - p0 + 1, -1, np.int64)
        found = chunk_positions(listed, 0, cap, p0, p1, word, mask, cap, out)
        assert padded[0, cap] == SLICED
        assert out[:found].tolist() == list(range(p0, p1)) and out[-1] == -1


@settings(max_examples=150, deadline=None)
@given(st.data(), st.one_of(st.integers(1, 200), st.sampled_from([64, 128, 192])),
       st.integers(1, 4), st.integers(0, 2), st.sampled_from([0.0, 0.05, 0.3, 0.9, 1.0]))
def test_chunk_select_takes_the_columns_of_the_window_matches(data: st.DataObject, cap: int,
                                                               chunks: int, word: int,
                                                               density: float) -> None:
    """`chunk_positions` then `chunk_gather`, for every density (sparse rows one by one,
    dense ones eight values at a time) and chunk size (64-row runs cut by the chunk's end);
    bitmap gaps, chunks too narrow for the word, and chunks with no data block have no
    matches. `marked_copy` takes other columns through the same matches. Sealed rows
    are made SLICED as they are read, and read so the second time alike."""
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    mask = np.uint64(1) << np.uint64(data.draw(st.integers(0, 63)))

    def dense(chunk_rows: NDArray[np.uint64]) -> NDArray[np.uint64]:  # `word`'s bit at density
        chunk_rows &= ~mask
        if len(chunk_rows) > word:
            chunk_rows[word] |= np.where(gen.random(cap) < density, mask, np.uint64(0))
        return chunk_rows
    listed, first, bits = _bitmap(data, gen, chunks, cap, word, mask, 8, dense)
    rows = data.draw(st.integers(1, 5))
    b_first = data.draw(st.integers(0, first + 1))        # chunks before it have no data
    n_blocks = data.draw(st.integers(0, first + chunks + 1 - b_first))
    block_list = [gen.integers(0, 2**63, (rows, cap), dtype=np.uint64)
                  for _ in range(n_blocks)]
    blocks = address_table(block_list).handle
    held = np.zeros(len(bits), bool)
    held[b_first * cap:(b_first + n_blocks) * cap] = True
    rows_of = np.array(data.draw(st.lists(st.integers(0, rows - 1), max_size=4)), np.int64)
    p0 = data.draw(st.integers(0, len(bits)))
    p1 = data.draw(st.integers(p0, len(bits)))
    with_positions = data.draw(st.booleans())
    sealed = data.draw(st.integers(0, len(bits)))
    expected = np.flatnonzero(bits[p0:p1] & held[p0:p1]) + p0
    for _ in range(2):
        positions = np.full(p1 - p0 if with_positions else 0, -1, np.int64)
        out, masks = chunk_select(address_table(listed).handle, first, p0, p1, word, mask, sealed,
                                  blocks, b_first, cap, rows_of, positions)
        assert out.shape == (len(rows_of), len(expected))
        if with_positions:
            assert positions[:len(expected)].tolist() == expected.tolist()
    later_rows = rows_of[::-1].copy()           # other columns later, through the masks
    later = marked_copy(masks, p0, p1, blocks, b_first, cap, later_rows)
    assert later.shape == (len(later_rows), len(expected))
    if n_blocks and len(rows_of):
        whole = np.concatenate(block_list, axis=1)
        assert (out == whole[rows_of][:, expected - b_first * cap]).all()
        assert (later == whole[later_rows][:, expected - b_first * cap]).all()


def _probe_keys(data: st.DataObject, gen: np.random.Generator, cells: int,
                rows: list[NDArray[np.int64]]
                ) -> tuple[list[NDArray[np.int64]], list[int], list[NDArray[np.int64]]]:
    """Each table's keys for the cells `rows`: its rows through an identity map, or values
    through a direct map (value - first -> row) over a range wider than the values; as a
    batch's columns are, some read-only (Arrow), some strided."""
    keys: list[NDArray[np.int64]] = []
    firsts: list[int] = []
    maps: list[NDArray[np.int64]] = []
    for r in rows:
        if data.draw(st.booleans()):
            keys.append(r)
            firsts.append(0)
            maps.append(np.arange(cells, dtype=np.int64))
        else:
            first, span = int(gen.integers(-50, 50)), cells + int(gen.integers(0, 5))
            value_row = gen.integers(0, cells, span, dtype=np.int64)
            value_row[gen.permutation(span)[:cells]] = np.arange(cells)   # every row reached
            slot_of = {row: np.flatnonzero(value_row == row) for row in range(cells)}
            picks = np.array([gen.choice(slot_of[int(row)]) for row in r], np.int64)
            keys.append(picks + first)
            firsts.append(first)
            maps.append(value_row)
    for k, key in enumerate(keys):
        if data.draw(st.booleans()):
            key = key.copy()
            key.flags.writeable = False
        if data.draw(st.booleans()):
            spread = np.zeros(2 * len(key), np.int64)
            spread[::2] = key
            key = spread[::2]
        keys[k] = key
    return keys, firsts, maps


@settings(max_examples=80, deadline=None)
@given(st.data(), st.integers(1, 7), st.integers(1, 20), st.integers(0, 300),
       st.sampled_from(["chunk", "gapped", "transposed"]))
def test_probe_into_is_the_inverted_or_of_the_cells_rows_under_interest(
        data: st.DataObject, tables: int, words: int, n: int, layout: str) -> None:
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    cells = 9
    reject = tuple(gen.integers(0, 2**63, (cells, words), dtype=np.uint64)
                   for _ in range(tables))
    rows = [gen.integers(0, cells, n, dtype=np.int64) for _ in range(tables)]
    keys, firsts, maps = _probe_keys(data, gen, cells, rows)
    interest = gen.integers(0, 2**63, words, dtype=np.uint64)
    if layout == "chunk":       # rows whole cache lines apart (8x8 blocks), any start
        start = data.draw(st.integers(0, 7))
        padded = np.full((words, start + n + 16 - (start + n) % 8), 7, np.uint64)
        out = padded[:, start:start + n]
    elif layout == "gapped":    # rows apart by n + 8 words, as the first test had them
        padded = np.full((words, n + 8), 7, np.uint64)
        out = padded[:, :n]
    else:                       # tuple-major memory seen word-major (the Eddy's scratch)
        padded = np.full((n, words), 7, np.uint64)
        out = padded.T
    before = padded.copy()
    assert probe_into(reject, tuple(keys), tuple(firsts), tuple(maps), interest, out) == -1
    expected = np.zeros((n, words), np.uint64)
    for table, r in zip(reject, rows, strict=True):
        expected |= table[r]
    assert ((~expected & interest) == out.T).all()
    out_mask = np.zeros(padded.shape, bool)
    if layout == "transposed":
        out_mask[:] = True
    else:
        out_mask[:, out.ctypes.data // 8 - padded.ctypes.data // 8:][:, :n] = True
    assert (padded[~out_mask] == before[~out_mask]).all(), "nothing outside out is written"
    if n:               # a key outside its map: the first such table, and nothing written
        bad = data.draw(st.integers(0, tables - 1))
        keys[bad] = keys[bad].copy()
        keys[bad][data.draw(st.integers(0, n - 1))] = firsts[bad] + data.draw(
            st.sampled_from([-1, len(maps[bad]), 10**6]))
        padded[:] = 7
        assert probe_into(reject, tuple(keys), tuple(firsts), tuple(maps), interest,
                          out) == bad
        assert (padded == 7).all(), "a probe with a key outside its map writes nothing"


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(1, 40), st.integers(1, 3))
def test_write_column_sets_the_rejected_cells_bit_and_clears_the_others(
        data: st.DataObject, cells: int, words: int) -> None:
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    table = gen.integers(0, 2**63, (cells + 5, words), dtype=np.uint64)
    cell_row = gen.permutation(cells + 5)[:cells].astype(np.int64)
    accepts = gen.random(cells) < 0.5
    word, bit = data.draw(st.integers(0, words - 1)), data.draw(st.integers(0, 63))
    mask = np.uint64(1) << np.uint64(bit)
    expected = table.copy()
    expected[cell_row, word] &= ~mask
    expected[cell_row[~accepts], word] |= mask
    write_column(table, cell_row, word, mask, accepts)
    assert (table == expected).all()


def _logical(row: NDArray[np.uint64], cap: int) -> NDArray[np.bool_]:
    """A chunk row's bits as a (tuple, slot bit) bool matrix, whatever its form."""
    words = row[:cap]
    if row[cap] == SLICED:                  # slot b's bits in words b * cap/64 ...
        per_slot = np.unpackbits(words.reshape(64, cap // 64).view(np.uint8),
                                 bitorder="little").reshape(64, cap)
        per_bit: NDArray[np.bool_] = per_slot.T.astype(bool)
        return per_bit
    per_tuple: NDArray[np.bool_] = np.unpackbits(words.view(np.uint8), bitorder="little") \
        .reshape(cap, 64).astype(bool)
    return per_tuple


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from([64, 128, 192]))
def test_slice_row_keeps_every_bit_of_the_row(data: st.DataObject, cap: int) -> None:
    """A row made SLICED holds the same bits: slot b's bit of tuple t, read WORD_MAJOR
    before and SLICED after; the words past its form word are untouched."""
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    row = gen.integers(0, 2**64, cap + 3, dtype=np.uint64)
    row[cap] = WORD_MAJOR
    before, tail = _logical(row, cap), row[cap + 1:].copy()
    slice_row(row, cap)
    assert row[cap] == SLICED and (row[cap + 1:] == tail).all()
    assert (_logical(row, cap) == before).all()


@settings(max_examples=80, deadline=None)
@given(st.data(), st.integers(1, 6), CAPS, st.integers(0, 3))
def test_clear_and_set_bits_make_one_bit_exactly_the_positions_in_every_chunk(
        data: st.DataObject, n_chunks: int, cap: int, word: int) -> None:
    """Chunks of a chunked bitmap, some too narrow for the word, some gaps (no rows),
    rows of either form: `clear_bit` then `set_bits` leave the bit set exactly at the
    positions, `set_bits` alone at the positions and wherever it was set, every other bit
    unchanged, each row in its form."""
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    k_first = data.draw(st.integers(0, 5))
    rows = [data.draw(st.sampled_from([0, word, word + 1, word + 3])) for _ in range(n_chunks)]
    pad = data.draw(st.integers(1, 3))          # the form word, then words never touched
    chunks = [gen.integers(0, 2**64, (r, cap + pad), dtype=np.uint64) for r in rows]
    for chunk in chunks:
        chunk[:, cap] = WORD_MAJOR
        for w in range(len(chunk)):
            if cap % 64 == 0 and data.draw(st.booleans()):
                slice_row(chunk[w], cap)
    before = [c.copy() for c in chunks]
    wide = [k for k, r in enumerate(rows) if r > word]
    cells = [(k, i) for k in wide for i in range(cap)]
    chosen = sorted(data.draw(st.sets(st.sampled_from(cells), max_size=len(cells)))
                    if cells else [])
    positions = np.array([(k_first + k) * cap + i for k, i in chosen], np.int64)
    bit = data.draw(st.integers(0, 63))
    mask = np.uint64(1) << np.uint64(bit)
    clear = data.draw(st.booleans())
    table = address_table(chunks).handle
    if clear:
        clear_bit(table, cap, word, mask)
    set_bits(table, k_first, cap, word, mask, positions)
    for k, (chunk, old) in enumerate(zip(chunks, before, strict=True)):
        assert (chunk[:, cap:] == old[:, cap:]).all(), ("forms and padding kept", k)
        for w in range(len(chunk)):
            expected = _logical(old[w], cap)
            if w == word:
                if clear:
                    expected[:, bit] = False
                expected[[i for kk, i in chosen if kk == k], bit] = True
            assert (_logical(chunk[w], cap) == expected).all(), (k, w)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=60), st.data())
def test_fingerprint_is_equal_for_equal_sequences_and_tells_changed_ones_apart(
        values: list[int], data: st.DataObject) -> None:
    """The digest of `since` cursors: equal for the same sequence (any layout), and
    different after a change, an insertion, a removal or a swap."""
    from psoup.kernels import fingerprint
    a = np.array(values, np.int64)
    assert fingerprint(a) == fingerprint(a.copy()) == fingerprint(a.reshape(1, -1))
    changed = [a.tolist() + [7]]
    if len(a):
        i = data.draw(st.integers(0, len(a) - 1))
        changed.append(np.delete(a, i).tolist())
        bumped = a.copy()
        bumped[i] ^= 1                         # flip the low bit: always a change
        changed.append(bumped.tolist())
        j = data.draw(st.integers(0, len(a) - 1))
        if a[i] != a[j]:
            swapped = a.copy()
            swapped[[i, j]] = swapped[[j, i]]
            changed.append(swapped.tolist())
    for other in changed:
        assert fingerprint(np.array(other, np.int64)) != fingerprint(a)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0, 3.0, float("inf"), float("-inf"),
                                 float("nan")]), max_size=40),
       st.sampled_from([float("-inf"), 0.0, 1.0]), st.booleans())
def test_ts_fault_finds_the_first_row_not_finite_or_going_back(stamps: list[float],
                                                               last: float,
                                                               sort: bool) -> None:
    if sort:            # mostly in order, so that the fault is often late or absent
        stamps = sorted(stamps, key=lambda t: (t != t, t))
    want, before = -1, last
    for i, t in enumerate(stamps):
        if not np.isfinite(t) or t < before:
            want = i
            break
        before = t
    assert ts_fault(np.array(stamps, dtype=np.float64), last) == want


# ------------------------------------------------------- each compiled kernel and its twin
# The same inputs, copied, to psoup.kernels.compiled and psoup.kernels.reference: equal
# results (values, dtypes, shapes) and equal arrays after (the writes into outputs, and
# rows made SLICED). A chunk list goes to each as its own handle: the int64 table to the
# compiled kernel, the AddressTable to its twin.

SEEDS = st.integers(0, 2**32 - 1)
#: Chunk sizes: 1 row, a few, non-multiples of 64, and multiples (rows that turn SLICED).
TWIN_CAPS = st.one_of(st.sampled_from([64, 128, 192]), st.integers(1, 3), st.integers(1, 150))


def _twin_tables(arrays: Sequence[NDArray[np.uint64] | None]
                 ) -> tuple[list[NDArray[np.uint64] | None], Handle,
                            list[NDArray[np.uint64] | None], Handle, list[AddressTable]]:
    """Two copies of `arrays` (gaps kept) with each one's handle: (copies for the
    compiled kernel, its handle, copies for the twin, its handle, the tables, which keep
    the copies alive)."""
    mine = [None if a is None else a.copy() for a in arrays]
    twin = [None if a is None else a.copy() for a in arrays]
    tables = [AddressTable(mine), AddressTable(twin)]
    return mine, Handle(tables[0].table), twin, Handle(tables[1]), tables


def _same_arrays(a: Sequence[NDArray[np.uint64] | None],
                 b: Sequence[NDArray[np.uint64] | None]) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None) or
        (x is not None and y is not None and np.array_equal(x, y))
        for x, y in zip(a, b, strict=True))


def _chunk_list(data: st.DataObject, gen: np.random.Generator, chunks: int, cap: int,
                word: int, density: float) -> list[NDArray[np.uint64] | None]:
    """A chunked bitmap as PSoup-P keeps it: padded C-contiguous arrays of 0 to word + 2
    word rows (cap words, the form word, padding), some gaps (None), row `word`'s lowest
    bits set at `density`, rows of cap a multiple of 64 made SLICED at random."""
    out: list[NDArray[np.uint64] | None] = []
    for _ in range(chunks):
        if data.draw(st.integers(0, 5)) == 0:
            out.append(None)
            continue
        height = data.draw(st.sampled_from([0, word, word + 1, word + 2]))
        padded = gen.integers(0, 2**64, (height, cap + 1 + data.draw(st.integers(0, 8))),
                              dtype=np.uint64)
        dense = gen.random((height, cap)) < density
        padded[:, :cap] = np.where(dense, padded[:, :cap] | np.uint64(0xFF),
                                   padded[:, :cap] & ~np.uint64(0xFF))
        padded[:, cap] = WORD_MAJOR
        for w in range(height):
            if cap % 64 == 0 and data.draw(st.booleans()):
                reference.slice_row(padded[w], cap)
        out.append(padded)
    return out


def _window(data: st.DataObject, first: int, chunks: int, cap: int) -> tuple[int, int]:
    """A window p0 <= p < p1 over the chunks' positions and one chunk either side (p1 - p0
    sometimes 0 or 1)."""
    end = (first + chunks + 1) * cap
    p0 = data.draw(st.integers(0, end))
    p1 = data.draw(st.one_of(st.just(p0), st.just(min(p0 + 1, end)), st.integers(p0, end)))
    return p0, p1


def _sealed(data: st.DataObject, first: int, chunks: int, cap: int) -> int:
    """The end of the positions the probe has written: often past every chunk (each
    sealed, its rows read turned SLICED), else anywhere."""
    end = (first + chunks + 1) * cap
    return data.draw(st.one_of(st.just(end), st.integers(0, end)))


MASKS = st.integers(0, 63).map(lambda bit: np.uint64(1) << np.uint64(bit))
LOW_MASKS = st.integers(0, 7).map(lambda bit: np.uint64(1) << np.uint64(bit))


@settings(max_examples=120, deadline=None)
@given(st.data(), SEEDS, st.integers(1, 6), st.integers(1, 20), st.integers(0, 300),
       st.booleans())
def test_probe_into_compiled_and_twin_write_the_same_rows_or_refuse_the_same_table(
        data: st.DataObject, seed: int, tables: int, words: int, n: int,
        outside: bool) -> None:
    """Any number of tables (padded to four in the compiled one), n of 0, 1 or not a
    multiple of 8, rows wider than `words`, out rows apart or transposed; a key outside
    its map makes both return the same table and write nothing."""
    gen = np.random.default_rng(seed)
    cells = 7
    reject = tuple(gen.integers(0, 2**64, (cells, words + data.draw(st.integers(0, 2))),
                                dtype=np.uint64) for _ in range(tables))
    rows = [gen.integers(0, cells, n, dtype=np.int64) for _ in range(tables)]
    keys, firsts, maps = _probe_keys(data, gen, cells, rows)
    if outside and n:
        bad = data.draw(st.integers(0, tables - 1))
        keys[bad] = keys[bad].copy()
        keys[bad][data.draw(st.integers(0, n - 1))] = firsts[bad] + len(maps[bad])
    interest = gen.integers(0, 2**64, words + 1, dtype=np.uint64)
    transposed = data.draw(st.booleans())
    results = []
    for kernels in (compiled, reference):
        padded = np.full((n, words) if transposed else (words, n + 5), 3, np.uint64)
        out = padded.T if transposed else padded[:, 1:n + 1]
        got = kernels.probe_into(reject, tuple(keys), tuple(firsts), tuple(maps), interest,
                                 out)
        results.append((got, padded))
    assert results[0][0] == results[1][0]
    assert np.array_equal(results[0][1], results[1][1])


@pytest.mark.parametrize("seed", range(6))
def test_probe_into_by_blocks_of_words_writes_what_the_twin_writes(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The word-blocked probe (many queries, large batches: here every call), over one
    to four tables, blocks of whole and ragged words, out rows apart, cache-aligned or
    transposed; a key outside its map returns its table and writes nothing."""
    monkeypatch.setattr(kernel_layout, "BLOCK_FROM_WORDS", 1)
    monkeypatch.setattr(kernel_layout, "BLOCK_FROM_CELLS", 0)
    gen = np.random.default_rng(seed)
    cells, tables = 11, 1 + seed % 4
    words = int(gen.integers(1, 3 * BLOCK_WORDS))
    n = int(gen.integers(0, 200))
    reject = tuple(gen.integers(0, 2**64, (cells, words + seed % 3), dtype=np.uint64)
                   for _ in range(tables))
    keys = [gen.integers(0, cells, n, dtype=np.int64) for _ in range(tables)]
    maps = tuple(gen.permutation(cells).astype(np.int64) for _ in range(tables))
    interest = gen.integers(0, 2**64, words, dtype=np.uint64)
    if n and seed % 2:
        keys[seed % tables][n // 2] = cells
    results = []
    for kernels in (compiled, reference):
        if seed % 3 == 2:
            padded = np.full((n, words), 3, np.uint64)
            out = padded.T
        else:
            padded = np.full((words, n + 16), 3, np.uint64)
            start = (-padded.ctypes.data % 64) // 8 if seed % 3 else 1
            out = padded[:, start:start + n]
        got = kernels.probe_into(reject, tuple(keys), (0,) * tables, maps, interest, out)
        outside = np.ones(padded.shape, bool)
        if seed % 3 != 2:
            outside[:, start:start + n] = False
            assert (padded[outside] == 3).all(), "nothing outside out is written"
        results.append((got, out.copy()))
    assert results[0][0] == results[1][0] == (seed % tables if n and seed % 2 else -1)
    assert np.array_equal(results[0][1], results[1][1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0, 1e300, float("inf"), float("-inf"),
                                 float("nan")]), max_size=70),
       st.sampled_from([float("-inf"), 0.0, 1.0, float("nan")]), st.booleans())
def test_ts_fault_compiled_and_twin_find_the_same_first_fault(stamps: list[float], last: float,
                                                             sort: bool) -> None:
    if sort:
        stamps = sorted(stamps, key=lambda t: (t != t, t))
    array = np.array(stamps, dtype=np.float64)
    got, want = compiled.ts_fault(array, last), reference.ts_fault(array, last)
    assert got == want and type(got) is type(want) is int


@settings(max_examples=150, deadline=None)
@given(st.data(), SEEDS, st.integers(0, 400), MASKS, st.floats(0, 1))
def test_word_positions_compiled_and_twin_list_the_same_rows(
        data: st.DataObject, seed: int, n: int, mask: np.uint64, density: float) -> None:
    gen = np.random.default_rng(seed)
    words = gen.integers(0, 2**64, n, dtype=np.uint64) & ~mask
    words[gen.random(n) < density] |= mask
    r0 = data.draw(st.integers(0, n))
    r1 = data.draw(st.integers(r0, n))
    base = data.draw(st.integers(0, 10**6))
    outs = [np.full(n + 1, -1, np.int64) for _ in range(2)]
    got = compiled.word_positions(words, mask, r0, r1, base, outs[0])
    want = reference.word_positions(words, mask, r0, r1, base, outs[1])
    assert got == want and type(got) is type(want) is int
    assert np.array_equal(outs[0][:got], outs[1][:want])


@settings(max_examples=60, deadline=None)
@given(SEEDS, st.sampled_from([64, 128, 192, 8192]), st.integers(0, 3))
def test_slice_row_compiled_and_twin_transpose_alike(seed: int, cap: int, tail: int) -> None:
    gen = np.random.default_rng(seed)
    row = gen.integers(0, 2**64, cap + 1 + tail, dtype=np.uint64)
    row[cap] = WORD_MAJOR
    rows = [row.copy(), row.copy()]
    compiled.slice_row(rows[0], cap)
    reference.slice_row(rows[1], cap)
    assert np.array_equal(rows[0], rows[1]) and rows[1][cap] == SLICED


@settings(max_examples=150, deadline=None)
@given(st.data(), SEEDS, TWIN_CAPS, st.integers(0, 5), st.integers(0, 2), LOW_MASKS,
       st.sampled_from([0.0, 0.1, 0.5, 1.0]))
def test_chunk_positions_compiled_and_twin_find_and_slice_alike(
        data: st.DataObject, seed: int, cap: int, chunks: int, word: int, mask: np.uint64,
        density: float) -> None:
    """Chunks missing, gaps, chunks too narrow for the word, rows of either form; sealed
    rows read made SLICED by both; twice (the second time reading SLICED rows)."""
    gen = np.random.default_rng(seed)
    arrays = _chunk_list(data, gen, chunks, cap, word, density)
    first = data.draw(st.integers(0, 2))
    p0, p1 = _window(data, first, chunks, cap)
    sealed = _sealed(data, first, chunks, cap)
    mine, mine_h, twin, twin_h, _tables = _twin_tables(arrays)
    for _ in range(2):
        outs = [np.full(p1 - p0 + 1, -1, np.int64) for _ in range(2)]
        got = compiled.chunk_positions(mine_h, first, cap, p0, p1, word, mask, sealed, outs[0])
        want = reference.chunk_positions(twin_h, first, cap, p0, p1, word, mask, sealed,
                                         outs[1])
        assert got == want and type(got) is type(want) is int
        assert np.array_equal(outs[0][:got], outs[1][:want])
        assert _same_arrays(mine, twin)


def _blocks(gen: np.random.Generator, rows: int, cap: int, n: int) -> list[NDArray[np.uint64]]:
    """n data blocks of a chunked store: rows 8-byte columns of cap values, some of them
    int64 or float64 values seen as words (NaN and infinities among the floats)."""
    out = []
    for _ in range(n):
        block = gen.integers(-50, 50, (rows, cap)).astype(np.int64).view(np.uint64).copy()
        floats = gen.choice([-1.5, 0.0, 2.25, np.nan, np.inf, -np.inf, 7.0], (rows, cap))
        use_float = gen.random(rows) < 0.5
        block[use_float] = floats[use_float].view(np.uint64)
        out.append(block)
    return out


@settings(max_examples=100, deadline=None)
@given(st.data(), SEEDS, st.integers(0, 5), TWIN_CAPS, st.integers(1, 4))
def test_chunk_gather_compiled_and_twin_take_the_same_values(
        data: st.DataObject, seed: int, rows_of_n: int, cap: int, chunks: int) -> None:
    gen = np.random.default_rng(seed)
    rows = 3
    blocks = _blocks(gen, rows, cap, chunks)
    first = data.draw(st.integers(0, 3))
    rows_of = gen.integers(0, rows, rows_of_n).astype(np.int64)
    count = data.draw(st.integers(0, chunks * cap))
    positions = np.sort(gen.choice(chunks * cap, count, replace=False)).astype(np.int64) \
        + first * cap
    _mine, mine_h, _twin, twin_h, _tables = _twin_tables(blocks)
    outs = [np.zeros((rows_of_n, count), np.uint64) for _ in range(2)]
    compiled.chunk_gather(mine_h, first, cap, rows_of, positions, outs[0])
    reference.chunk_gather(twin_h, first, cap, rows_of, positions, outs[1])
    assert np.array_equal(outs[0], outs[1])


@settings(max_examples=150, deadline=None)
@given(st.data(), SEEDS, TWIN_CAPS, st.integers(1, 4), st.integers(1, 4))
def test_interval_scan_compiled_and_twin_find_the_same_positions(
        data: st.DataObject, seed: int, cap: int, chunks: int, intervals: int) -> None:
    """Int64 and float64 closed intervals (NaN in none, infinite bounds), one to four
    of them, over windows cut anywhere in the chunks; `interval_gather` finds the same
    positions and takes the rows' values at them."""
    gen = np.random.default_rng(seed)
    rows = 3
    blocks = _blocks(gen, rows, cap, chunks)
    first = data.draw(st.integers(0, 2))
    p0 = data.draw(st.integers(first * cap, (first + chunks) * cap))
    p1 = data.draw(st.integers(p0, (first + chunks) * cap))
    ints = np.zeros((4, intervals), np.int64)
    floats = np.zeros((2, intervals), np.float64)
    for j in range(intervals):
        ints[0, j] = data.draw(st.integers(0, rows - 1))
        ints[1, j] = data.draw(st.integers(0, 1))
        lo, hi = sorted(data.draw(st.lists(st.integers(-60, 60), min_size=2, max_size=2)))
        ints[2, j], ints[3, j] = lo, hi
        bounds = [-np.inf, -1.5, 0.0, 2.25, 7.0, np.inf]
        f_lo, f_hi = sorted(data.draw(st.lists(st.sampled_from(bounds), min_size=2,
                                               max_size=2)))
        floats[0, j], floats[1, j] = f_lo, f_hi
    _mine, mine_h, _twin, twin_h, _tables = _twin_tables(blocks)
    outs = [np.full(p1 - p0 + 1, -1, np.int64) for _ in range(2)]
    got = compiled.interval_scan(mine_h, first, cap, p0, p1, ints, floats, outs[0])
    want = reference.interval_scan(twin_h, first, cap, p0, p1, ints, floats, outs[1])
    assert got == want and type(got) is type(want) is int
    assert np.array_equal(outs[0][:got], outs[1][:want])
    rows_of = gen.integers(0, rows, data.draw(st.integers(0, 3))).astype(np.int64)
    gathered = [np.zeros((1 + len(rows_of), p1 - p0 + 1), np.uint64) for _ in range(2)]
    got = compiled.interval_gather(mine_h, first, cap, p0, p1, ints, floats, rows_of,
                                   gathered[0])
    want = reference.interval_gather(twin_h, first, cap, p0, p1, ints, floats, rows_of,
                                     gathered[1])
    assert got == want == len(outs[1][:want])
    assert np.array_equal(gathered[0][:, :got], gathered[1][:, :want])
    assert np.array_equal(gathered[0][0, :got].view(np.int64), outs[1][:want])
    # interval_fold: the same positions, and the cells block_fold makes of them
    log_b = data.draw(st.sampled_from([0, 1, 3, 62]))
    key_row = data.draw(st.sampled_from([-1, 2]))
    lo = data.draw(st.integers(-4, 4))
    groups = data.draw(st.integers(1, 3))
    b_first = p0 >> log_b
    blocks_n = max(((max(p1, 1) - 1) >> log_b) - b_first + 1, 1)

    def cells() -> list[NDArray[Any]]:
        return [np.zeros((blocks_n, groups), np.int64), np.full((blocks_n, groups), -1),
                np.zeros((blocks_n, groups, 2), np.int64),
                np.full((blocks_n, groups), 2**63 - 1), np.full((blocks_n, groups), -2**63)]
    folded = [cells() for _ in range(3)]
    found = [np.full(p1 - p0 + 1, -1, np.int64) for _ in range(2)]
    got_k = compiled.interval_fold(mine_h, first, cap, p0, p1, ints, floats, found[0],
                                   key_row, lo, 1, log_b, b_first, groups, *folded[0])
    want_k = reference.interval_fold(twin_h, first, cap, p0, p1, ints, floats, found[1],
                                     key_row, lo, 1, log_b, b_first, groups, *folded[1])
    left = compiled.block_fold(mine_h, first, cap, outs[1][:want], key_row, lo, 1, log_b,
                               b_first, groups, *folded[2])
    assert got_k == want_k == (want, left)
    assert np.array_equal(found[0][:want], outs[1][:want])
    assert np.array_equal(found[1][:want], outs[1][:want])
    for a, b, c in zip(*folded, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)


def _select_case(data: st.DataObject, gen: np.random.Generator, cap: int, chunks: int,
                 word: int, density: float
                 ) -> tuple[list[NDArray[np.uint64] | None], int, list[NDArray[np.uint64]],
                            int, int, int, int]:
    """chunk_select's inputs: (bitmap chunks, their first chunk number, data blocks,
    theirs, p0, p1, sealed)."""
    arrays = _chunk_list(data, gen, chunks, cap, word, density)
    first = data.draw(st.integers(0, 2))
    b_first = data.draw(st.integers(0, first + 1))
    blocks = _blocks(gen, 3, cap, data.draw(st.integers(0, first + chunks + 1 - b_first)))
    p0, p1 = _window(data, first, chunks, cap)
    return arrays, first, blocks, b_first, p0, p1, _sealed(data, first, chunks, cap)


@settings(max_examples=150, deadline=None)
@given(st.data(), SEEDS, TWIN_CAPS, st.integers(1, 4), st.integers(0, 2), LOW_MASKS,
       st.sampled_from([0.0, 0.05, 0.3, 0.9, 1.0]), st.integers(0, 4), st.booleans())
def test_chunk_select_compiled_and_twin_take_the_same_matches(
        data: st.DataObject, seed: int, cap: int, chunks: int, word: int, mask: np.uint64,
        density: float, columns: int, with_positions: bool) -> None:
    """Every density (sparse 64-row runs one by one, dense ones eight values at a time in
    the compiled kernel), chunks without a bitmap row or a data block: the same values,
    masks and positions, and the same rows made SLICED."""
    gen = np.random.default_rng(seed)
    arrays, first, blocks, b_first, p0, p1, sealed = _select_case(data, gen, cap, chunks,
                                                                  word, density)
    rows_of = gen.integers(0, 3, columns).astype(np.int64)
    mine, mine_h, twin, twin_h, _tables = _twin_tables(arrays)
    _bm, mine_b, _bt, twin_b, _block_tables = _twin_tables(blocks)
    positions = [np.full(p1 - p0 if with_positions else 0, -1, np.int64) for _ in range(2)]
    got, got_masks = compiled.chunk_select(mine_h, first, p0, p1, word, mask, sealed, mine_b,
                                           b_first, cap, rows_of, positions[0])
    want, want_masks = reference.chunk_select(twin_h, first, p0, p1, word, mask, sealed,
                                              twin_b, b_first, cap, rows_of, positions[1])
    assert got.dtype == want.dtype == np.uint64 and np.array_equal(got, want)
    assert got_masks.dtype == want_masks.dtype and np.array_equal(got_masks, want_masks)
    matches = got.shape[1]
    assert np.array_equal(positions[0][:matches], positions[1][:matches])
    assert _same_arrays(mine, twin)


@settings(max_examples=100, deadline=None)
@given(st.data(), SEEDS, TWIN_CAPS, st.integers(1, 4), st.integers(0, 2), LOW_MASKS,
       st.sampled_from([0.0, 0.3, 1.0]), st.integers(0, 4))
def test_marked_copy_compiled_and_twin_copy_the_same_columns_through_the_masks(
        data: st.DataObject, seed: int, cap: int, chunks: int, word: int, mask: np.uint64,
        density: float, columns: int) -> None:
    gen = np.random.default_rng(seed)
    arrays, first, blocks, b_first, p0, p1, sealed = _select_case(data, gen, cap, chunks,
                                                                  word, density)
    _mine, mine_h, _twin, _twin_h, _tables = _twin_tables(arrays)
    _bm, mine_b, _bt, twin_b, _block_tables = _twin_tables(blocks)
    _, masks = compiled.chunk_select(mine_h, first, p0, p1, word, mask, sealed, mine_b,
                                     b_first, cap, np.empty(0, np.int64),
                                     np.empty(0, np.int64))
    rows_of = gen.integers(0, 3, columns).astype(np.int64)
    got = compiled.marked_copy(masks, p0, p1, mine_b, b_first, cap, rows_of)
    want = reference.marked_copy(masks, p0, p1, twin_b, b_first, cap, rows_of)
    assert got.dtype == want.dtype == np.uint64 and np.array_equal(got, want)


@settings(max_examples=80, deadline=None)
@given(SEEDS, st.integers(0, 40), st.integers(1, 3), st.integers(0, 63), st.booleans())
def test_write_column_compiled_and_twin_set_the_same_column(seed: int, cells: int, words: int,
                                                            bit: int, repeats: bool) -> None:
    """Cells in any order, some rows named twice (the last one wins in both)."""
    gen = np.random.default_rng(seed)
    table = gen.integers(0, 2**64, (cells + 5, words), dtype=np.uint64)
    cell_row = (gen.integers(0, cells + 5, cells) if repeats
                else gen.permutation(cells + 5)[:cells]).astype(np.int64)
    accepts = gen.random(cells) < 0.5
    word = int(gen.integers(0, words))
    mask = np.uint64(1) << np.uint64(bit)
    tables = [table.copy(), table.copy()]
    compiled.write_column(tables[0], cell_row, word, mask, accepts)
    reference.write_column(tables[1], cell_row, word, mask, accepts)
    assert np.array_equal(tables[0], tables[1])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=300), st.booleans())
def test_fingerprint_compiled_and_twin_give_the_same_lanes(values: list[int],
                                                           as_row: bool) -> None:
    array = np.array(values, np.int64)
    if as_row:
        array = array.reshape(1, -1)
    got, want = compiled.fingerprint(array), reference.fingerprint(array)
    assert got == want
    assert [type(x) for x in got] == [type(x) for x in want] == [int, int]


@settings(max_examples=100, deadline=None)
@given(st.data(), SEEDS, st.integers(0, 5), TWIN_CAPS, st.integers(0, 3), MASKS)
def test_clear_bit_compiled_and_twin_clear_the_same_bits(
        data: st.DataObject, seed: int, chunks: int, cap: int, word: int,
        mask: np.uint64) -> None:
    gen = np.random.default_rng(seed)
    arrays = _chunk_list(data, gen, chunks, cap, word, 0.5)
    mine, mine_h, twin, twin_h, _tables = _twin_tables(arrays)
    compiled.clear_bit(mine_h, cap, word, mask)
    reference.clear_bit(twin_h, cap, word, mask)
    assert _same_arrays(mine, twin)


@settings(max_examples=100, deadline=None)
@given(st.data(), SEEDS, st.integers(1, 5), TWIN_CAPS, st.integers(0, 3), MASKS)
def test_set_bits_compiled_and_twin_set_the_same_bits(
        data: st.DataObject, seed: int, chunks: int, cap: int, word: int,
        mask: np.uint64) -> None:
    """Positions in chunks wide enough for the word (the caller's promise), sorted, any
    number, rows of either form."""
    gen = np.random.default_rng(seed)
    arrays = _chunk_list(data, gen, chunks, cap, word, 0.2)
    k_first = data.draw(st.integers(0, 3))
    wide = [k for k, a in enumerate(arrays) if a is not None and a.shape[0] > word]
    cells = np.array([(k_first + k) * cap + i for k in wide for i in range(cap)], np.int64)
    count = data.draw(st.integers(0, len(cells)))
    positions = np.sort(gen.choice(cells, count, replace=False)) if count else \
        np.empty(0, np.int64)
    mine, mine_h, twin, twin_h, _tables = _twin_tables(arrays)
    compiled.set_bits(mine_h, k_first, cap, word, mask, positions)
    reference.set_bits(twin_h, k_first, cap, word, mask, positions)
    assert _same_arrays(mine, twin)


def _int_blocks(gen: np.random.Generator, cap: int, n: int, lo: int,
                span: int) -> list[NDArray[np.uint64]]:
    """`_blocks` whose row 2 holds int64 keys in [lo, lo + span)."""
    blocks = _blocks(gen, 3, cap, n)
    for block in blocks:
        block[2] = gen.integers(lo, lo + max(span, 1), cap).astype(np.int64).view(np.uint64)
    return blocks


@settings(max_examples=100, deadline=None)
@given(st.data(), SEEDS, st.integers(0, 4), TWIN_CAPS, st.integers(1, 4), st.integers(0, 6),
       st.sampled_from(["none", "row", "keys"]))
def test_chunk_scatter_compiled_and_twin_group_the_same_columns(
        data: st.DataObject, seed: int, rows_of_n: int, cap: int, chunks: int,
        span: int, keyed: str) -> None:
    """Sorted positions across chunks, grouped by keys of a small range through a remap
    (read from a chunk row, or given per tuple), or all in one group, into room that
    starts at each group's cursor."""
    gen = np.random.default_rng(seed)
    lo = int(gen.integers(-5, 5))
    blocks = _int_blocks(gen, cap, chunks, lo, span)
    first = data.draw(st.integers(0, 3))
    rows_of = gen.integers(0, 3, rows_of_n).astype(np.int64)
    count = data.draw(st.integers(0, chunks * cap))
    positions = np.sort(gen.choice(chunks * cap, count, replace=False)).astype(np.int64) \
        + first * cap
    span = max(span, 1)
    remap = gen.permutation(span).astype(np.int64)
    key_row, keys = -1, np.empty(0, np.int64)
    if keyed == "none":
        codes, groups = np.zeros(count, np.int64), 1
    else:
        values = np.empty((1, count), np.uint64)
        reference.chunk_gather(Handle(AddressTable(blocks)), first, cap,
                               np.array([2], np.int64), positions, values)
        codes, groups = remap[values[0].view(np.int64) - lo], span
        if keyed == "row":
            key_row = 2
        else:
            keys = values[0].view(np.int64).copy()
    sizes = np.bincount(codes, minlength=groups)
    room = sizes + gen.integers(0, 3, groups)
    cursors = np.cumsum(room) - room
    _mine, mine_h, _twin, twin_h, _tables = _twin_tables(blocks)
    dsts = [np.zeros((1 + rows_of_n, int(room.sum())), np.uint64) for _ in range(2)]
    moved = [cursors.astype(np.int64), cursors.astype(np.int64)]
    compiled.chunk_scatter(mine_h, first, cap, rows_of, positions, key_row, keys, lo, remap,
                           moved[0], dsts[0])
    reference.chunk_scatter(twin_h, first, cap, rows_of, positions, key_row, keys, lo, remap,
                            moved[1], dsts[1])
    assert np.array_equal(dsts[0], dsts[1])
    assert np.array_equal(moved[0], moved[1]) and np.array_equal(moved[0], cursors + sizes)


@settings(max_examples=100, deadline=None)
@given(st.data(), SEEDS, TWIN_CAPS, st.integers(1, 4), st.integers(0, 40))
def test_chunk_key_range_and_counts_compiled_and_twin_agree(
        data: st.DataObject, seed: int, cap: int, chunks: int, span: int) -> None:
    gen = np.random.default_rng(seed)
    lo = int(gen.integers(-20, 20))
    blocks = _int_blocks(gen, cap, chunks, lo, span)
    first = data.draw(st.integers(0, 3))
    count = data.draw(st.integers(0, chunks * cap))
    positions = np.sort(gen.choice(chunks * cap, count, replace=False)).astype(np.int64) \
        + first * cap
    _mine, mine_h, _twin, twin_h, _tables = _twin_tables(blocks)
    found = compiled.chunk_key_range(mine_h, first, cap, 2, positions)
    assert found == reference.chunk_key_range(twin_h, first, cap, 2, positions)
    low, high = found
    assert count or (low, high) == (0, -1)
    counts = [np.zeros(high - low + 1, np.int64) for _ in range(2)]
    assert compiled.chunk_key_counts(mine_h, first, cap, 2, positions, low, counts[0]) == 0
    assert reference.chunk_key_counts(twin_h, first, cap, 2, positions, low, counts[1]) == 0
    assert np.array_equal(counts[0], counts[1]) and counts[0].sum() == count
    # a table that misses keys at both ends counts the others and says how many it missed
    shift = data.draw(st.integers(0, max(high - low, 0)))
    part = [np.zeros(max(high - low - 1, 0), np.int64) for _ in range(2)]
    missed = [kernel.chunk_key_counts(h, first, cap, 2, positions, low + shift, c)
              for kernel, h, c in ((compiled, mine_h, part[0]), (reference, twin_h, part[1]))]
    assert missed[0] == missed[1] == count - part[0].sum()
    assert np.array_equal(part[0], part[1])
    within = counts[0][shift:shift + len(part[0])]
    assert np.array_equal(part[0][:len(within)], within) and not part[0][len(within):].any()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                          st.sampled_from([1e17, -1e17, 0.1, 1.0, -0.0])), max_size=100),
       st.floats(-1e6, 1e6), st.floats(-1e-6, 1e-6))
def test_float_prefix_compiled_and_twin_sum_to_the_same_bits(values: list[float], s0: float,
                                                             e0: float) -> None:
    """Bit for bit: the same operations in the same order (NaN where either has NaN)."""
    array = np.array(values, np.float64)
    outs = [np.zeros((len(array), 2)) for _ in range(2)]
    compiled.float_prefix(array, s0, e0, outs[0])
    reference.float_prefix(array, s0, e0, outs[1])
    assert np.array_equal(outs[0], outs[1], equal_nan=True)



def _fold_cells(gen: np.random.Generator, kind: str, blocks_n: int, groups: int,
                what: str) -> list[NDArray[Any]]:
    """Cell arrays for `block_fold` (counts, last, sums, mins, maxs), some already
    holding values; those `what` leaves out have no rows."""
    dt = np.dtype(np.float64 if kind == "float" else np.int64)
    counts = gen.integers(0, 3, (blocks_n, groups)).astype(np.int64)
    last = gen.integers(-1, 5, (blocks_n, groups)).astype(np.int64)
    sums = (gen.normal(0, 1e3, (blocks_n, groups, 2)) if kind == "float"
            else gen.integers(-2**40, 2**40, (blocks_n, groups, 2))).astype(dt)
    mins = np.full((blocks_n, groups), np.inf if kind == "float" else 2**63 - 1, dt)
    maxs = np.full((blocks_n, groups), -np.inf if kind == "float" else -2**63, dt)
    cells = [counts, last, sums, mins, maxs]
    keep = {"count": (0, 1), "sum": (2,), "extremes": (3, 4), "all": (0, 1, 2, 3, 4)}[what]
    return [a if i in keep else np.empty((0,) * a.ndim, dt if i >= 2 else np.int64)
            for i, a in enumerate(cells)]


@settings(max_examples=150, deadline=None)
@given(st.data(), SEEDS, st.sampled_from(["float", "int"]),
       st.one_of(st.integers(0, 6), st.just(62)), st.integers(1, 4), st.integers(0, 5),
       st.booleans(),
       st.sampled_from(["count", "sum", "extremes", "all"]))
def test_block_fold_compiled_and_twin_fill_the_same_cells(
        data: st.DataObject, seed: int, kind: str, log_b: int, chunks: int, span: int,
        keyed: bool, what: str) -> None:
    """Bit for bit, cells that held values before included; and the counts, sums and
    extremes are those of the rows (the sums exact for INT, to rounding for FLOAT).
    log_b 62: one block across every chunk, as an invocation's edge folds."""
    gen = np.random.default_rng(seed)
    cap = 64
    lo = int(gen.integers(-20, 20))
    blocks = _int_blocks(gen, cap, chunks, lo, span)
    for block in blocks:        # row 1: the values, FLOAT or INT (wide, to test halves)
        block[1] = (gen.normal(0, 1e6, cap) if kind == "float"
                    else gen.integers(-2**62, 2**62, cap)).view(np.uint64)
    first = data.draw(st.integers(0, 3))
    count = data.draw(st.integers(0, chunks * cap))
    positions = np.sort(gen.choice(chunks * cap, count, replace=False)).astype(np.int64) \
        + first * cap
    b_first = (first * cap) >> log_b
    blocks_n = ((first + chunks) * cap >> log_b) - b_first
    # fewer groups than keys: a guess of the keys' range that missed some
    groups = data.draw(st.integers(1, max(span, 1))) if keyed else 1
    cells = _fold_cells(gen, kind, blocks_n, groups, what)
    before = [a.copy() for a in cells]
    twin_cells = [a.copy() for a in cells]
    _mine, mine_h, _twin, twin_h, _tables = _twin_tables(blocks)
    key_row = 2 if keyed else -1
    left = compiled.block_fold(mine_h, first, cap, positions, key_row, lo, 1, log_b, b_first,
                               groups, *cells)
    assert left == reference.block_fold(twin_h, first, cap, positions, key_row, lo, 1, log_b,
                                        b_first, groups, *twin_cells)
    for a, b in zip(cells, twin_cells, strict=True):
        assert np.array_equal(a, b)
    # against the rows themselves
    values = np.empty((2, count), np.uint64)
    reference.chunk_gather(twin_h, first, cap, np.array([2, 1], np.int64), positions, values)
    g = values[0].view(np.int64) - lo if keyed else np.zeros(count, np.int64)
    assert left == np.count_nonzero(g >= groups)
    b = (positions >> log_b) - b_first
    v = values[1].view(np.float64 if kind == "float" else np.int64)
    counts, last, sums, mins, maxs = cells
    for cb, cg in {(int(x), int(y)) for x, y in zip(b, g, strict=True) if y < groups}:
        here = (b == cb) & (g == cg)
        if counts.shape[0]:
            assert counts[cb, cg] - before[0][cb, cg] == here.sum()
            assert last[cb, cg] == max(positions[here].max(), before[1][cb, cg])
        if sums.shape[0] and kind == "int":
            hi, lo_ = (sums[cb, cg] - before[2][cb, cg]).tolist()
            assert ((hi << 32) + lo_ - sum(v[here].tolist())) % 2**64 == 0
        if sums.shape[0] and kind == "float":
            got = sums[cb, cg, 0] + sums[cb, cg, 1]
            want = math.fsum([*before[2][cb, cg].tolist(), *v[here].tolist()])
            assert abs(got - want) <= 1e-12 * (abs(want) + np.abs(v[here]).sum() + 1e3)
        if mins.shape[0]:
            assert mins[cb, cg] == min(v[here].min(), before[3][cb, cg])
            assert maxs[cb, cg] == max(v[here].max(), before[4][cb, cg])


@settings(max_examples=100, deadline=None)
@given(SEEDS, st.integers(0, 20), st.integers(1, 4))
def test_block_prefix_compiled_and_twin_sum_to_the_same_bits(seed: int, k: int,
                                                              groups: int) -> None:
    gen = np.random.default_rng(seed)
    sums = gen.normal(0, 1, (k, groups, 2)) * 10.0 ** gen.integers(-3, 17, (k, groups, 2))
    start = gen.normal(0, 1e3, (groups, 2))
    outs = [np.zeros((k, groups, 2)) for _ in range(2)]
    compiled.block_prefix(sums, start, outs[0])
    reference.block_prefix(sums, start, outs[1])
    assert np.array_equal(outs[0], outs[1])
    for g in range(groups):     # each prefix is the blocks' compensated total
        for b in range(k):
            want = math.fsum([*start[g].tolist(), *sums[:b + 1, g].ravel().tolist()])
            got = outs[0][b, g, 0] + outs[0][b, g, 1]
            assert abs(got - want) <= 1e-12 * (abs(want) + np.abs(sums[:b + 1, g]).sum())

# ---------------------------------------------------------------- the engine on numpy

_WORKLOAD = r"""
import json, sys
import psoup
from tests.support import Clock

answers = {}
for mode in psoup.MODES:
    eng = psoup.Engine(mode=mode, clock=Clock(1000.0), chunk_rows=64)
    eng.execute("CREATE STREAM R (a INT, b FLOAT, name TEXT)")
    early = eng.register("SELECT a, b FROM R WHERE a > 3 AND b < 80.0 BEGIN NOW - 400 END NOW")
    gone = eng.register("SELECT name FROM R WHERE a < 50 BEGIN NOW - 400 END NOW")
    for start in (0, 150):
        eng.insert("R", [(i, i / 2, f"n{i % 3}") for i in range(start, start + 150)],
                   ts=[1000.0 + i for i in range(start, start + 150)])
    late = eng.register("SELECT a FROM R WHERE a >= 20 AND a <= 260 AND b > 30.0 "
                        "BEGIN NOW - 400 END NOW")
    eng.unregister(gone)
    eng.insert("R", [(i, i / 2, "x") for i in range(300, 364)],
               ts=[1000.0 + i for i in range(300, 364)])
    answers[mode] = [eng.invoke(h, now=1363.0).rows for h in (early, late)]
print(json.dumps({"answers": answers, "numba": "numba" in sys.modules,
                  "llvmlite": "llvmlite" in sys.modules}))
"""


def _run_workload(backend: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "PSOUP_KERNELS"}
    if backend is not None:
        env["PSOUP_KERNELS"] = backend
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _WORKLOAD], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_engine_on_the_numpy_backend_never_imports_numba_and_answers_alike() -> None:
    """Register, insert in several chunks (of 64 rows: sealed rows turn SLICED), register
    over retained tuples, unregister, insert, invoke: in every mode the numpy backend's
    answers are the default backend's, and numba and llvmlite are never imported."""
    on_numpy = _run_workload("numpy")
    default = _run_workload(None)
    assert on_numpy["numba"] is False and on_numpy["llvmlite"] is False
    assert default["numba"] is True
    assert on_numpy["answers"] == default["answers"]
    answers = on_numpy["answers"]
    assert isinstance(answers, dict) and all(rows for per_mode in answers.values()
                                             for rows in per_mode)


def test_an_unknown_backend_is_refused_naming_the_variable_and_the_choices() -> None:
    env = dict(os.environ, PSOUP_KERNELS="cuda")
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = str(root)
    done = subprocess.run([sys.executable, "-c", "import psoup.kernels"], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "ValueError: PSOUP_KERNELS='cuda'" in done.stderr
    assert "'numba', 'numpy'" in done.stderr


#: In a process of its own, compiled for the target its environment names (numba's
#: NUMBA_CPU_NAME / NUMBA_CPU_FEATURES) with a fresh cache (numba inspects no cached
#: code): the kernels whose code hangs on the target (the answer copy's compress, the
#: transposition, the finds' ragged tails, the probe's rows ORed as vectors) against
#: their twins at every density, the aggregate index's kernels too, then
#: every compiled kernel's assembly searched for the forms some common x86-64 CPUs run
#: slowly: a compress-store to memory (microcoded on Zen 4), gathers and scatters (slow
#: on Intel's since the Downfall fix; scatters on AMD's).
_TARGET_CHECK = r"""
import json, re
import numpy as np
import pytest
from numba.core.registry import CPUDispatcher
from psoup.kernels import compiled, layout, reference
from psoup.kernels.layout import SLICED, WORD_MAJOR, AddressTable, Handle

gen = np.random.default_rng(11)
wrong = []
cap, chunks = 256, 3
for density in (0.0, 0.05, 0.3, 0.6, 0.9, 1.0):
    for sealed in (0, chunks * cap):
        bits = [gen.integers(0, 2**63, (2, cap + 8), dtype=np.uint64) for _ in range(chunks)]
        for a in bits:
            a[1, :cap] = (gen.random(cap) < density).astype(np.uint64)
            a[:, cap] = WORD_MAJOR
        blocks = [gen.integers(0, 2**63, (3, cap), dtype=np.uint64) for _ in range(chunks)]
        p0 = int(gen.integers(0, cap))
        p1 = int(gen.integers(p0, chunks * cap + 1))
        rows_of = np.array([2, 0, 1, 2], np.int64)
        mine, twin = [a.copy() for a in bits], [a.copy() for a in bits]
        tables = [AddressTable(mine), AddressTable(twin), AddressTable(blocks)]
        args = (p0, p1, 1, np.uint64(1), sealed)
        got, got_masks = compiled.chunk_select(Handle(tables[0].table), 0, *args,
                                               Handle(tables[2].table), 0, cap, rows_of,
                                               np.empty(0, np.int64))
        want, want_masks = reference.chunk_select(Handle(tables[1]), 0, *args,
                                                  Handle(tables[2]), 0, cap, rows_of,
                                                  np.empty(0, np.int64))
        later = rows_of[::-1].copy()
        same = (np.array_equal(got, want) and np.array_equal(got_masks, want_masks)
                and all(np.array_equal(x, y) for x, y in zip(mine, twin))
                and np.array_equal(
                    compiled.marked_copy(got_masks, p0, p1, Handle(tables[2].table), 0, cap,
                                         later),
                    reference.marked_copy(want_masks, p0, p1, Handle(tables[2]), 0, cap,
                                          later)))
        if not same:
            wrong.append(f"chunk_select at {density} (sealed {sealed})")
        r0 = int(gen.integers(0, 70))
        r1 = int(gen.integers(r0, cap + 1))
        word_row = bits[0][1, :cap].copy()
        outs = [np.full(cap + 1, -1, np.int64) for _ in range(2)]
        found = [kernels.word_positions(word_row, np.uint64(1), r0, r1, 5, out)
                 for kernels, out in ((compiled, outs[0]), (reference, outs[1]))]
        if found[0] != found[1] or not np.array_equal(outs[0][:found[0]], outs[1][:found[1]]):
            wrong.append(f"word_positions at {density}")
        ints = np.array([[0, 2], [0, 0], [2**60, 0], [2**62, 2**62]], np.int64)
        floats = np.zeros((2, 2))
        found = [kernels.interval_scan(handle, 0, cap, p0, p1, ints, floats, out)
                 for kernels, handle, out in ((compiled, Handle(tables[2].table), outs[0]),
                                              (reference, Handle(tables[2]), outs[1]))]
        if found[0] != found[1] or not np.array_equal(outs[0][:found[0]], outs[1][:found[1]]):
            wrong.append(f"interval_scan at {density}")
for words, attributes in ((3, 4), (16, 5), (21, 8)):
    tables = tuple(gen.integers(0, 2**64, (9, words + 1), dtype=np.uint64)
                   for _ in range(attributes))
    keys = tuple(gen.integers(0, 9, 70) for _ in range(attributes))
    maps = tuple(np.arange(9, dtype=np.int64) for _ in range(attributes))
    interest = gen.integers(0, 2**64, words, dtype=np.uint64)
    outs = [np.zeros((words, 70), np.uint64) for _ in range(2)]
    for kernels, out in ((compiled, outs[0]), (reference, outs[1])):
        kernels.probe_into(tables, keys, (0,) * attributes, maps, interest, out)
    if not np.array_equal(outs[0], outs[1]):
        wrong.append(f"probe_into of {words} words")
# the word-blocked probe (every call blocked here), of a ragged last block too
layout.BLOCK_FROM_WORDS, layout.BLOCK_FROM_CELLS = 1, 0
words = layout.BLOCK_WORDS + 13
tables = tuple(gen.integers(0, 2**64, (9, words), dtype=np.uint64) for _ in range(4))
keys = tuple(gen.integers(0, 9, 70) for _ in range(4))
maps = tuple(np.arange(9, dtype=np.int64) for _ in range(4))
interest = gen.integers(0, 2**64, words, dtype=np.uint64)
outs = [np.zeros((words, 72), np.uint64)[:, 1:71] for _ in range(2)]
for kernels, out in ((compiled, outs[0]), (reference, outs[1])):
    kernels.probe_into(tables, keys, (0,) * 4, maps, interest, out)
if not np.array_equal(outs[0], outs[1]):
    wrong.append("probe_into by blocks of words")
row = gen.integers(0, 2**64, cap + 1, dtype=np.uint64)
row[cap] = WORD_MAJOR
rows = [row.copy(), row.copy()]
compiled.slice_row(rows[0], cap)
reference.slice_row(rows[1], cap)
if not np.array_equal(rows[0], rows[1]) or rows[0][cap] != SLICED:
    wrong.append("slice_row")
# the aggregate kernels, keyed and not, FLOAT and INT, at matches sparse and dense
keyed_blocks = [gen.integers(0, 2**63, (3, cap), dtype=np.uint64) for _ in range(chunks)]
for block in keyed_blocks:
    block[0] = gen.integers(0, 4, cap).astype(np.int64).view(np.uint64)
    block[2] = gen.normal(0, 1, cap).view(np.uint64)
keyed_tables = [AddressTable(keyed_blocks), AddressTable(keyed_blocks)]
for density in (0.05, 1.0):
    where = np.flatnonzero(gen.random(chunks * cap) < density).astype(np.int64)
    ints = np.array([[2], [1], [0], [0]], np.int64)
    floats = np.array([[-0.5], [0.5]])
    for dtype, value_row in ((np.float64, 2), (np.int64, 1)):
        for key_row, groups in ((0, 4), (-1, 1)):
            got = []
            for kernels, handle in ((compiled, Handle(keyed_tables[0].table)),
                                    (reference, Handle(keyed_tables[1]))):
                cells = [np.zeros((chunks * cap // 64, groups), np.int64),
                         np.full((chunks * cap // 64, groups), -1, np.int64),
                         np.zeros((chunks * cap // 64, groups, 2), dtype),
                         np.zeros((chunks * cap // 64, groups), dtype),
                         np.zeros((chunks * cap // 64, groups), dtype)]
                kernels.block_fold(handle, 0, cap, where, key_row, 0, value_row, 6, 0, groups,
                                   *cells)
                out = np.empty(chunks * cap, np.int64)
                k, _ = kernels.interval_fold(handle, 0, cap, 0, chunks * cap, ints, floats,
                                             out, key_row, 0, value_row, 6, 0, groups, *cells)
                prefix = np.empty((chunks * cap // 64, groups, 2))
                kernels.block_prefix(cells[2].astype(np.float64), np.zeros((groups, 2)), prefix)
                got.append([*cells, out[:k], prefix,
                            np.array(kernels.chunk_key_range(handle, 0, cap, 0, where))])
            if not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(*got)):
                wrong.append(f"aggregate kernels {dtype.__name__} key {key_row} at {density}")
slow_form = re.compile(r"\bv\w*(gather|scatter)\w*|\bv\w*compress\w*\s+%\w+,\s*[^%\s]")
slow = {}
for name in dir(compiled):
    kernel = getattr(compiled, name)
    if isinstance(kernel, CPUDispatcher):
        for asm in kernel.inspect_asm().values():
            slow.setdefault(name, []).extend(
                line.strip() for line in asm.splitlines() if slow_form.search(line))
print(json.dumps({"wrong": wrong, "slow": {k: v for k, v in slow.items() if v}}))
"""


def _x86_features() -> set[str]:
    """The host CPU's features as LLVM names them, enabled ones only ("avx2", ...); none
    off x86-64."""
    import llvmlite.binding as llvm
    if llvm.get_process_triple().split("-")[0] not in ("x86_64", "amd64"):
        return set()
    return {f[1:] for f in llvm.get_host_cpu_features().flatten().split(",")
            if f.startswith("+")}


#: Targets other than this CPU's: (LLVM's CPU name, the features given with it, the
#: feature this CPU needs to run the code).
_TARGETS = {"haswell": ("+avx2", "avx2"),
            "skylake-avx512": ("+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512cd", "avx512f")}


@pytest.mark.parametrize("target", ["host", "haswell", "skylake-avx512"])
def test_the_kernels_compiled_for_this_cpu_or_another_use_no_slow_form(
        target: str, tmp_path: Path) -> None:
    """On this CPU's target, on haswell's (AVX2, no AVX-512: the copy stores value by
    value, branch-free) and on an Intel AVX-512 one (LLVM's cost model tuned for Intel:
    the copy compresses in registers), the kernels agree with their twins and no
    compiled kernel holds a compress-store to memory, a gather or a scatter."""
    if target in _TARGETS and _TARGETS[target][1] not in _x86_features():
        pytest.skip(f"code compiled for {target} needs an x86-64 CPU with "
                    f"{_TARGETS[target][1]} to run")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PSOUP_KERNELS", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    if target in _TARGETS:
        env.update(NUMBA_CPU_NAME=target, NUMBA_CPU_FEATURES=_TARGETS[target][0])
    env["NUMBA_CACHE_DIR"] = str(tmp_path)
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _TARGET_CHECK], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"wrong": [], "slow": {}}
