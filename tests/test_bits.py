"""Bit rows (psoup.bits): the one spelling of "which slots" every structure shares."""

from __future__ import annotations

import numpy as np
import pytest

from psoup.bits import bit_of, bit_row, regroup, set_bit, slot_rows, widened, words_for


def test_slot_s_is_bit_s_mod_64_of_word_s_div_64() -> None:
    row = bit_row([0, 63, 64, 130], 3)
    assert row.tolist() == [1 | (1 << 63), 1, 4]
    for slot in (0, 63, 64, 130):
        word, mask = bit_of(slot)
        assert row[word] & mask
    assert not row[bit_of(65)[0]] & bit_of(65)[1]


def test_set_bit_sets_and_clears_one_slot_in_every_row() -> None:
    rows = np.zeros((3, 2), dtype="<u8")
    set_bit(rows, 70)
    assert slot_rows(rows, 70).tolist() == [0, 1, 2]
    set_bit(rows, 70, False)
    assert not rows.any()


def test_slot_rows_beyond_the_width_is_empty() -> None:
    assert slot_rows(np.ones((2, 1), dtype="<u8"), 64).tolist() == []


def test_widened_pads_with_zero_words_and_keeps_wide_rows() -> None:
    rows = np.array([[5]], dtype="<u8")
    assert widened(rows, 3).tolist() == [[5, 0, 0]]
    assert widened(rows, 1) is rows
    assert words_for(129) == 3


@pytest.mark.parametrize("count", [8, 40])      # bit by bit, and by unpacking the rows
def test_regroup_moves_each_listed_slot_to_its_index(count: int) -> None:
    rng = np.random.default_rng(3)
    probe = rng.integers(0, 2**63, size=(9, 3), dtype=np.int64).astype("<u8")
    slots = [int(v) for v in rng.choice(192, size=count, replace=False)] + [500]
    got = regroup(probe, slots, 2)
    for g, slot in enumerate(slots):
        want = slot_rows(probe, slot).tolist()     # slot 500 is beyond: nowhere
        assert slot_rows(got, g).tolist() == want
