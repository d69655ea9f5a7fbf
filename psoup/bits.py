"""Bit rows: sets of query slots as little-endian uint64 words (PSoup Sect. 4.3).

Every structure that keeps "which queries" per tuple does it the same way: bit `s` of a
row stands for slot (or group member) `s`, 64 of them to a machine word, word `s // 64`,
bit `s % 64` within it. A probe of n tuples is an (n, words) array of such rows. This
module is the one place that spells that arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: Bits per word of a bit row.
WORD = 64

#: The dtype of a bit row's words.
DTYPE = np.dtype("<u8")


def words_for(slots: int) -> int:
    """Words needed for `slots` bits (at least one).

    Example:
        >>> words_for(0), words_for(64), words_for(65)
        (1, 1, 2)
    """
    return max(1, -(-slots // WORD))


def bit_of(slot: int) -> tuple[int, np.uint64]:
    """(word, mask) of `slot`: row[word] & mask is nonzero when slot is in the row.

    Example:
        >>> bit_of(65)
        (1, np.uint64(2))
    """
    word, bit = divmod(slot, WORD)
    return word, _MASKS[bit]


#: The mask of each bit of a word (made once: a numpy scalar costs a microsecond).
_MASKS = [np.uint64(1) << np.uint64(bit) for bit in range(WORD)]

#: Bytes in a cache line.
LINE = 64


def aligned_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A zero array of words of `shape` whose first word starts a cache line, so that
    rows of a multiple of 8 words each start one too: the probe then reads a row as
    whole lines (numpy only aligns to 16 bytes, and a 128-byte row at 16 bytes past a
    line spans 3 lines, not 2: the probe at 4,096 queries took 7% longer). O(size), 64
    bytes more than np.zeros; the array is a view of the one allocated.

    Example:
        >>> aligned_zeros((3, 8)).ctypes.data % LINE
        0
    """
    size = int(np.prod(shape))
    whole = np.zeros(size + LINE // DTYPE.itemsize, DTYPE)
    skip = (-whole.ctypes.data % LINE) // DTYPE.itemsize
    return whole[skip:skip + size].reshape(shape)


def slot_rows(bits: np.ndarray, slot: int) -> np.ndarray:
    """The rows of a bitmap (n, words) whose bit `slot` is set. O(n).

    Example:
        >>> slot_rows(np.array([[1], [2], [3]], dtype="<u8"), 1).tolist()
        [1, 2]
    """
    word, mask = bit_of(slot)
    if word >= bits.shape[1]:
        return np.empty(0, np.int64)
    return np.flatnonzero(bits[:, word] & mask)


def bit_row(slots: Iterable[int], words: int) -> np.ndarray:
    """One bit row of `words` words with `slots` set.

    Example:
        >>> bit_row([0, 65], 2).tolist()
        [1, 2]
    """
    flags = np.zeros(words * WORD, dtype=bool)
    flags[list(slots)] = True
    return np.packbits(flags, bitorder="little").view(DTYPE)


def set_bit(rows: np.ndarray, slot: int, on: bool = True) -> None:
    """Set (or clear) bit `slot` in every row of `rows` (a row or an (n, words) array);
    the rows must be wide enough.

    Example:
        >>> rows = np.zeros((2, 1), dtype="<u8"); set_bit(rows, 3); rows[:, 0].tolist()
        [8, 8]
    """
    word, mask = bit_of(slot)
    if rows.ndim == 1:          # one word, not a view and a ufunc call (~3 us)
        rows[word] = rows[word] | mask if on else rows[word] & ~mask
    elif on:
        rows[..., word] |= mask
    else:
        rows[..., word] &= ~mask


def widened(rows: np.ndarray, words: int) -> np.ndarray:
    """`rows` (a row or an (n, w) array) with zero words appended up to `words`; the same
    array when it is wide enough.

    Example:
        >>> widened(np.array([[1]], dtype="<u8"), 2).tolist()
        [[1, 0]]
    """
    have = rows.shape[-1]
    if have >= words:
        return rows
    pad = [(0, 0)] * (rows.ndim - 1) + [(0, words - have)]
    return np.pad(rows, pad)


def regroup(bits: np.ndarray, slots: list[int], words: int) -> np.ndarray:
    """Regroup bitmap rows (n, W) by a list of slots: bit g of row i of the result is
    bit `slots[g]` of row i of `bits` (0 where that slot is beyond W words). A few slots
    are moved bit by bit; many at once by unpacking the rows: O(n * W * 64 / 8).

    Example:
        >>> regroup(np.array([[0b100], [0b010]], dtype="<u8"), [2, 1], 1)[:, 0].tolist()
        [1, 2]
    """
    n = bits.shape[0]
    if len(slots) <= 16:
        out = np.zeros((n, words), dtype=DTYPE)
        for g, slot in enumerate(slots):
            word, mask = bit_of(slot)
            if word < bits.shape[1]:
                column = (bits[:, word] & mask) != 0
                set_to = column.astype(DTYPE) << np.uint64(g % WORD)
                out[:, g // WORD] |= set_to
        return out
    flags = np.unpackbits(np.ascontiguousarray(bits).view(np.uint8), axis=1,
                          bitorder="little")
    index = np.asarray(slots)
    flags = flags[:, np.minimum(index, flags.shape[1] - 1)]
    flags[:, index >= bits.shape[1] * WORD] = 0
    packed = np.packbits(flags, axis=1, bitorder="little")
    out = np.zeros((n, words * 8), dtype=np.uint8)
    out[:, :packed.shape[1]] = packed
    return out.view(DTYPE)
