"""The compiled kernels (psoup.kernels) against the numpy expressions they replace."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from psoup.kernels import (SLICED, WORD_MAJOR, address_table, chunk_gather, chunk_positions,
                           chunk_select, marked_copy, probe_into, slice_row, ts_fault,
                           word_positions, clear_bit, set_bits, write_column)

WORDS = st.integers(0, 2**64 - 1).map(np.uint64)


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(0, 300), st.integers(0, 63), st.floats(0, 1))
def test_word_positions_lists_the_rows_with_the_bit_set(data, n, bit, density):
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
def test_chunk_gather_takes_the_selected_rows_at_positions_across_chunks(data, rows, cap,
                                                                          chunks):
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    blocks = [gen.integers(0, 2**63, (rows, cap), dtype=np.uint64) for _ in range(chunks)]
    listed = address_table(blocks)
    first = data.draw(st.integers(0, 3))                 # chunk number of blocks[0]
    rows_of = np.array(data.draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=4)),
                       dtype=np.int64)
    positions = np.sort(gen.choice(chunks * cap, data.draw(st.integers(0, chunks * cap)),
                                   replace=False)).astype(np.int64) + first * cap
    out = np.zeros((len(rows_of), len(positions)), np.uint64)
    chunk_gather(listed, first, cap, rows_of, positions, out)
    whole = np.concatenate(blocks, axis=1)
    assert (out == whole[rows_of][:, positions - first * cap]).all()


def _bitmap(data, gen, chunks, cap, word, mask, pad, fill):
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


def _sealed_rows_sliced(listed, first, cap, word, sealed, p0, p1):
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
def test_chunk_positions_lists_the_window_matches_across_chunks_and_gaps(data, cap, chunks,
                                                                        word):
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
        found = chunk_positions(address_table(listed), first, cap, p0, p1, word, mask,
                                sealed, out)
        assert out[:found].tolist() == expected and out[-1] == -1
    assert _sealed_rows_sliced(listed, first, cap, word, sealed, p0, p1)


def test_chunk_positions_writes_no_further_than_the_window_in_a_sliced_row():
    """Every row of a window matching, its tail less than 64 rows: the positions fill
    the output exactly, the word after them untouched (a dense run written 64 at a
    time would write past the window's end)."""
    cap, word, mask = 128, 0, np.uint64(1) << np.uint64(9)
    padded = np.zeros((1, cap + 2), np.uint64)
    padded[0, :cap] = mask
    listed = address_table([padded])
    for p0, p1 in ((5, 100), (0, 128), (64, 70)):
        out = np.full(p1 - p0 + 1, -1, np.int64)
        found = chunk_positions(listed, 0, cap, p0, p1, word, mask, cap, out)
        assert padded[0, cap] == SLICED
        assert out[:found].tolist() == list(range(p0, p1)) and out[-1] == -1


@settings(max_examples=150, deadline=None)
@given(st.data(), st.one_of(st.integers(1, 200), st.sampled_from([64, 128, 192])),
       st.integers(1, 4), st.integers(0, 2), st.sampled_from([0.0, 0.05, 0.3, 0.9, 1.0]))
def test_chunk_select_takes_the_columns_of_the_window_matches(data, cap, chunks, word,
                                                               density):
    """`chunk_positions` then `chunk_gather`, for every density (sparse rows one by one,
    dense ones by compress-stores) and chunk size (64-row runs cut by the chunk's end);
    bitmap gaps, chunks too narrow for the word, and chunks with no data block have no
    matches. `marked_copy` takes other columns through the same matches. Sealed rows
    are made SLICED as they are read, and read so the second time alike."""
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    mask = np.uint64(1) << np.uint64(data.draw(st.integers(0, 63)))

    def dense(chunk_rows):                  # row `word`'s bit set at `density`
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
    blocks = address_table(block_list)
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
        out, masks = chunk_select(address_table(listed), first, p0, p1, word, mask, sealed,
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


@settings(max_examples=80, deadline=None)
@given(st.data(), st.integers(1, 7), st.integers(1, 20), st.integers(0, 300),
       st.sampled_from(["chunk", "gapped", "transposed"]))
def test_probe_into_is_the_inverted_or_of_the_cells_rows_under_interest(data, tables, words,
                                                                     n, layout):
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    cells = 9
    reject = tuple(gen.integers(0, 2**63, (cells, words), dtype=np.uint64)
                   for _ in range(tables))
    rows = [gen.integers(0, cells, n, dtype=np.int64) for _ in range(tables)]
    # each table's keys: its rows through an identity map, or values through a direct
    # map (value - first -> row) over a range wider than the values
    keys, firsts, maps = [], [], []
    for r in rows:
        if data.draw(st.booleans()):
            keys.append(r), firsts.append(0), maps.append(np.arange(cells, dtype=np.int64))
        else:
            first, span = int(gen.integers(-50, 50)), cells + int(gen.integers(0, 5))
            value_row = gen.integers(0, cells, span, dtype=np.int64)
            value_row[gen.permutation(span)[:cells]] = np.arange(cells)   # every row reached
            slot_of = {row: np.flatnonzero(value_row == row) for row in range(cells)}
            picks = np.array([gen.choice(slot_of[int(row)]) for row in r], np.int64)
            keys.append(picks + first), firsts.append(first), maps.append(value_row)
    for k, key in enumerate(keys):     # a batch's columns: read-only (Arrow), strided
        if data.draw(st.booleans()):
            key = key.copy()
            key.flags.writeable = False
        if data.draw(st.booleans()):
            spread = np.zeros(2 * n, np.int64)
            spread[::2] = key
            key = spread[::2]
        keys[k] = key
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
    for table, r in zip(reject, rows):
        expected |= table[r]
    assert (out.T == (~expected & interest)).all()
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
def test_write_column_sets_the_rejected_cells_bit_and_clears_the_others(data, cells, words):
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


def _logical(row, cap):
    """A chunk row's bits as a (tuple, slot bit) bool matrix, whatever its form."""
    words = row[:cap]
    if row[cap] == SLICED:                  # slot b's bits in words b * cap/64 ...
        per_slot = np.unpackbits(words.reshape(64, cap // 64).view(np.uint8),
                                 bitorder="little").reshape(64, cap)
        return per_slot.T.astype(bool)
    return np.unpackbits(words.view(np.uint8), bitorder="little").reshape(cap, 64) \
        .astype(bool)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from([64, 128, 192]))
def test_slice_row_keeps_every_bit_of_the_row(data, cap):
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
def test_clear_and_set_bits_make_one_bit_exactly_the_positions_in_every_chunk(data, n_chunks,
                                                                               cap, word):
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
    table = address_table(chunks)
    if clear:
        clear_bit(table, cap, word, mask)
    set_bits(table, k_first, cap, word, mask, positions)
    for k, (chunk, old) in enumerate(zip(chunks, before)):
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
def test_fingerprint_is_equal_for_equal_sequences_and_tells_changed_ones_apart(values, data):
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
def test_ts_fault_finds_the_first_row_not_finite_or_going_back(stamps, last, sort):
    if sort:            # mostly in order, so that the fault is often late or absent
        stamps = sorted(stamps, key=lambda t: (t != t, t))
    want, before = -1, last
    for i, t in enumerate(stamps):
        if not np.isfinite(t) or t < before:
            want = i
            break
        before = t
    assert ts_fault(np.array(stamps, dtype=np.float64), last) == want
