"""What both kernel backends share, and import without numba: the backend PSOUP_KERNELS
picks (`BACKEND`), the forms of a PSoup-P chunk's word rows (`WORD_MAJOR`, `SLICED`),
the probe's tile size, and `AddressTable`, the list of chunks a kernel walks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NewType

import numpy as np
from numpy.typing import NDArray

#: The environment variable that picks the backend, and its values (the first the default).
BACKEND_VARIABLE = "PSOUP_KERNELS"
BACKENDS = ("numba", "numpy")


def _backend() -> str:
    """The backend PSOUP_KERNELS names ("numba" when it is unset or empty)."""
    chosen = os.environ.get(BACKEND_VARIABLE, "").strip() or BACKENDS[0]
    if chosen not in BACKENDS:
        raise ValueError(f"{BACKEND_VARIABLE}={chosen!r}: the kernel backend must be one of "
                         f"{', '.join(repr(b) for b in BACKENDS)}")
    return chosen


#: The backend in use, read once at import: "numba" or "numpy".
BACKEND = _backend()

#: Words of result rows computed row-major before they are written out word-major: a
#: tile (8 KiB) that leaves most of the L1 cache to the reject rows it ORs. A tile holds
#: a multiple of 8 tuples, at least 8, so each 8 x 8 block store writes whole cache lines.
#: (Measured, probe of 8,000 tuples: 2,048 words and at least 64 tuples, a 32 KiB tile at
#: 4,096 queries, took 397 us there; 1,024 words, 354 us; 512 or 256 words, no better.)
TILE_WORDS = 1024

#: The compiled probe by blocks of words (`probe_into`, four tables): from
#: BLOCK_FROM_WORDS words of results per tuple (16,384 queries) and BLOCK_FROM_CELLS words
#: in all, it runs over BLOCK_WORDS words of every tuple at a time. With more words the
#: four tables' rows (257 cells each in the Fig. 9 workload) outgrow L2, and each tuple
#: read its rows from L3 again. Measured on the 2-core AMD EPYC (Zen 5, 1 MB L2), one
#: thread, whole against blocked: 16,384 tuples at 157 words 1.38 / 1.31 ms, 313 words
#: 2.87 / 2.58 (at 4,096 tuples 0.67 / 0.61, at 1,024 0.14 / 0.16), 469 words 4.7 /
#: 3.9, 782 words 8.0 / 6.4, 1,563 words (10^5 queries) 18.5 / 13.3 ms (at 256 tuples
#: 236 / 225 us, at 64 tuples 65 / 76 us); blocks of 32, 128 or 256 words were slower
#: than 64 at each size.
BLOCK_FROM_WORDS = 256
BLOCK_FROM_CELLS = 1 << 19
BLOCK_WORDS = 64

#: The form of a word row of a PSoup-P chunk, kept in its first padding word
#: (row[cap]): WORD_MAJOR, one word per tuple (bit b of row[i]: slot 64 w + b, tuple
#: i), as the probe writes it; or SLICED, each slot's bits contiguous (bit t of
#: row[b * cap / 64 + g]: slot 64 w + b, tuple 64 g + t), as a find reads it best.
WORD_MAJOR = 0
SLICED = 1


#: What the kernels that walk chunks take for a chunk list: `AddressTable.handle`, the
#: int64 table under numba, the AddressTable itself under numpy (a type of its own, so
#: that passing the AddressTable or its table directly is a type error).
Handle = NewType("Handle", object)


class AddressTable:
    """A list of C-contiguous 2-d uint64 arrays (None for a gap: no rows) that the
    kernels walking a chunked store take in one argument, holding the arrays so that
    they live as long as it does.

    `table` is what a compiled kernel reads: row i is (address, rows, columns) of
    arrays[i] (zeros for a gap), one int64 array, because a numba typed list of the
    arrays costs ~0.75 us to hand to a compiled call and an invocation's find takes two.
    `arrays` is what the numpy twins read. `handle` is what a call site passes to the
    kernels of the backend in use: `table` under numba, the AddressTable itself under
    numpy; one attribute read is all it adds to a call. All are fixed when it is made:
    a caller that changes the list makes a new table. Making one is O(k).
    """

    __slots__ = ("arrays", "handle", "table")

    def __init__(self, arrays: Sequence[NDArray[np.uint64] | None]) -> None:
        self.arrays: tuple[NDArray[np.uint64] | None, ...] = tuple(arrays)
        table = np.zeros((len(self.arrays), 3), np.int64)
        for i, array in enumerate(self.arrays):
            if array is not None:
                assert array.dtype == np.uint64 and array.ndim == 2 and \
                    array.flags.c_contiguous
                table[i] = (array.ctypes.data, array.shape[0], array.shape[1])
        self.table: NDArray[np.int64] = table
        self.handle = Handle(table if BACKEND == "numba" else self)

    def __len__(self) -> int:
        return len(self.arrays)


def address_table(arrays: Sequence[NDArray[np.uint64] | None]) -> AddressTable:
    """The `AddressTable` of `arrays` (the name kept from when it returned the bare int64
    table). O(len(arrays))."""
    return AddressTable(arrays)
