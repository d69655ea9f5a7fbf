"""The shared predicate index of one (stream, attribute) (PSoup Sect. 4.2.2, Fig. 6).

PSoup indexes every query's single-attribute factors on an attribute in one tree keyed by
the factors' constants, so that a tuple finds all the queries its value satisfies without
testing them one by one. Here the tree is a `SortedDict` from constant to reference count,
and probing is done for a whole batch at once:

* the k distinct constants c_0 < ... < c_{k-1} cut the attribute's domain into 2k + 1
  *cells*: cell 2i+1 is {c_i}, cell 2i is the open gap (c_{i-1}, c_i);
* every normalized `AttrPredicate` (an interval with open or closed ends, minus a `!=`
  list, or an `=`/IN set) accepts exactly a union of cells, so a table with one row per
  cell and one bit per query slot says which queries a value *fails* (the Query SteM
  ORs these rows across attributes and keeps the interested queries that failed none:
  a query without a factor on this attribute has no bit here and is never affected);
* probing a batch is one `searchsorted` to find each value's cell and one row gather.

The probe's cost is O(n log k + n * slots / 64) for n tuples: it grows with the number of
queries only through the width of a bit row, 64 queries to a machine word. The table is
rebuilt lazily (O(cells * slots)) on the first probe after a registration or removal.
"""

from __future__ import annotations

import numpy as np
from sortedcontainers import SortedDict

from psoup.query.model import AttrPredicate
from psoup.stems.batch import DTYPES

#: Integer attributes whose values span fewer than this many values get a direct
#: value -> cell map instead of a binary search per value (lanes, stations, speeds).
DIRECT_MAP_LIMIT = 1 << 16


class AttributeIndex:
    """The queries' factors on one attribute of one stream, probed a batch at a time.

    Example:
        >>> idx = AttributeIndex("int")
        >>> idx.add(0, AttrPredicate("a", "int", lo=5))
        >>> idx.add(1, AttrPredicate("a", "int", eq=frozenset({3})))
        >>> idx.probe(np.array([3, 7]), 1)[:, 0].tolist()  # bit i set: query i fails
        [1, 2]
    """

    def __init__(self, ctype: str):
        self.dtype = DTYPES[ctype]
        self._constants: SortedDict = SortedDict()   # constant -> number of uses
        self._preds: dict[int, AttrPredicate] = {}
        self._keys: np.ndarray | None = None
        self._table: np.ndarray | None = None
        self._table_words = 0
        self._direct: tuple[int, np.ndarray] | None = None   # (first value, cell per value)

    def __len__(self) -> int:
        return len(self._preds)

    def add(self, slot: int, pred: AttrPredicate) -> None:
        """Index `pred` for query `slot`. O(log k); the table is rebuilt on next probe."""
        self._preds[slot] = pred
        for c in _constants(pred):
            self._constants[c] = self._constants.get(c, 0) + 1
        self._table = None

    def remove(self, slot: int) -> None:
        """Forget query `slot`'s factors. O(log k)."""
        pred = self._preds.pop(slot)
        for c in _constants(pred):
            left = self._constants[c] - 1
            if left:
                self._constants[c] = left
            else:
                del self._constants[c]
        self._table = None

    def probe(self, values: np.ndarray, words: int) -> np.ndarray:
        """Bit rows (len(values) x words, little-endian uint64) of the queries whose
        factors on this attribute reject each value. O(n log k + n * words).
        """
        return self.table(words)[self.cells(values)]

    def table(self, words: int) -> np.ndarray:
        """The (cells x words) reject table, rebuilt if the queries changed."""
        if self._table is None or self._table_words != words:
            self._build(words)
        return self._table

    def cells(self, values: np.ndarray) -> np.ndarray:
        """The cell of each value: O(n log k), or O(n) for integers in a small range."""
        keys = self._keys
        if values.dtype.kind in "iu" and len(values) >= 64:
            lo, hi = int(values.min()), int(values.max())
            direct = self._direct
            if direct is None or lo < direct[0] or hi >= direct[0] + len(direct[1]):
                if direct is not None:
                    lo = min(lo, direct[0])
                    hi = max(hi, direct[0] + len(direct[1]) - 1)
                if hi - lo >= DIRECT_MAP_LIMIT:
                    return self._search(keys, values)
                self._direct = direct = (lo, self._search(keys, np.arange(lo, hi + 1)))
            return direct[1][values - direct[0]]
        return self._search(keys, values)

    @staticmethod
    def _search(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        cell = np.searchsorted(keys, values, side="left")
        if len(keys):
            hit = keys[np.minimum(cell, len(keys) - 1)] == values
            cell = 2 * cell + hit
        return cell

    def _build(self, words: int) -> None:
        keys = np.array(list(self._constants.keys()), dtype=self.dtype)
        ncells = 2 * len(keys) + 1
        slots = np.array(sorted(self._preds), dtype=np.int64)
        # Difference array over cells per slot: +1 where an accepted run starts, -1 past it.
        delta = np.zeros((ncells + 1, words * 64), dtype=np.int8)
        points: list[tuple[int, int, int]] = []     # (cell, slot, +1 accept / -1 reject)
        for slot in slots.tolist():
            pred = self._preds[slot]
            if pred.empty:
                continue
            if pred.eq is not None:
                for c in pred.eq:
                    points.append((_cell_of(keys, c), slot, 1))
                continue
            first = 0 if pred.lo is None else _cell_of(keys, pred.lo) + int(pred.lo_open)
            last = ncells - 1 if pred.hi is None else _cell_of(keys, pred.hi) - int(pred.hi_open)
            if first > last:
                continue
            delta[first, slot] += 1
            delta[last + 1, slot] -= 1
            for c in pred.ne:
                points.append((_cell_of(keys, c), slot, -1))
        accept = np.cumsum(delta[:-1], axis=0, dtype=np.int8) > 0
        for cell, slot, sign in points:
            accept[cell, slot] = sign > 0
        reject = np.zeros_like(accept)
        reject[:, slots] = ~accept[:, slots]
        self._table = np.packbits(reject, axis=1, bitorder="little").view("<u8")
        self._keys = keys
        self._table_words = words
        self._direct = None

    def slots(self) -> list[int]:
        """The query slots with a factor on this attribute."""
        return list(self._preds)

    def _check(self) -> None:
        """Assert the structure's invariants (for tests): the constants are exactly
        those of the filed predicates, counted once per use, and a built table rejects
        exactly what each predicate rejects at every constant."""
        uses: dict = {}
        for pred in self._preds.values():
            for c in _constants(pred):
                uses[c] = uses.get(c, 0) + 1
        assert uses == dict(self._constants), "constants are reference-counted"
        if self._table is not None and len(self._keys):
            from psoup.bits import bit_of
            from psoup.stems.predicates import attr_mask
            rejects = self._table[self._search(self._keys, self._keys)]
            for slot, pred in self._preds.items():
                word, mask = bit_of(slot)
                got = (rejects[:, word] & mask) != 0
                assert (got == ~attr_mask(pred, self._keys)).all(), slot

    def nbytes(self) -> int:
        return 0 if self._table is None else self._table.nbytes + self._keys.nbytes


def _constants(pred: AttrPredicate) -> list:
    if pred.eq is not None:
        return list(pred.eq)
    return [c for c in (pred.lo, pred.hi) if c is not None] + list(pred.ne)


def _cell_of(keys: np.ndarray, constant) -> int:
    """The cell {constant}: constants of a registered predicate are always keys."""
    return 2 * int(np.searchsorted(keys, constant, side="left")) + 1
