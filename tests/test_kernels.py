"""The compiled kernels (psoup.kernels) against the numpy expressions they replace."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from psoup.kernels import gather_rows, or_at, probe_into, word_positions, write_column

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
@given(st.data(), st.integers(1, 5), st.integers(1, 200))
def test_gather_rows_takes_the_selected_block_rows_at_the_positions(data, rows, cap):
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    block = gen.integers(0, 2**63, (rows, cap), dtype=np.uint64)
    rows_of = np.array(data.draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=4)),
                       dtype=np.int64)
    base = 5 * cap
    positions = np.sort(gen.choice(cap, data.draw(st.integers(0, cap)), replace=False)) + base
    at = data.draw(st.integers(0, 3))
    out = np.zeros((len(rows_of), at + len(positions)), np.uint64)
    gather_rows(block, rows_of, positions.astype(np.int64), base, out, at)
    assert (out[:, at:] == block[rows_of][:, positions - base]).all()
    assert not out[:, :at].any()


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(1, 7), st.integers(1, 5), st.integers(0, 40))
def test_probe_into_is_the_inverted_or_of_the_cells_rows_under_interest(data, tables, words,
                                                                     n):
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    cells = 9
    reject = tuple(gen.integers(0, 2**63, (cells, words), dtype=np.uint64)
                   for _ in range(tables))
    rows = tuple(gen.integers(0, cells, n, dtype=np.int64) for _ in range(tables))
    interest = gen.integers(0, 2**63, words, dtype=np.uint64)
    out = np.empty((words, n + 8), np.uint64)[:, :n]       # rows apart, as in a chunk
    probe_into(reject, rows, interest, out)
    expected = np.zeros((n, words), np.uint64)
    for table, r in zip(reject, rows):
        expected |= table[r]
    assert (out.T == (~expected & interest)).all()


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


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(1, 100))
def test_or_at_sets_one_bit_at_the_positions_and_nothing_else(data, n):
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    row = gen.integers(0, 2**63, n, dtype=np.uint64)
    positions = np.sort(gen.choice(n, data.draw(st.integers(0, n)), replace=False)) + 1000
    mask = np.uint64(1) << np.uint64(data.draw(st.integers(0, 63)))
    expected = row.copy()
    expected[positions - 1000] |= mask
    or_at(row, positions.astype(np.int64), 1000, mask)
    assert (row == expected).all()
