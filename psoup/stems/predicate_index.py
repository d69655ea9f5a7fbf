"""The shared predicate index of one (stream, attribute) (PSoup Sect. 4.2.2, Fig. 6).

PSoup indexes every query's single-attribute factors on an attribute in one tree keyed by
the factors' constants, so that a tuple finds all the queries its value satisfies without
testing them one by one. Here the tree is the sorted array of the distinct constants,
searched by bisection (a new constant is inserted by one copy of it, O(k)), with a
reference count per constant in a dict; probing is done for a whole batch at once:

* the k distinct constants c_0 < ... < c_{k-1} cut the attribute's domain into 2k + 1
  *cells*: cell 2i+1 is {c_i}, cell 2i is the open gap (c_{i-1}, c_i);
* every normalized `AttrPredicate` (an interval with open or closed ends, minus a `!=`
  list, or an `=`/IN set) accepts exactly a union of cells, so a table with one row per
  cell and one bit per query slot says which queries a value *fails* (the Query SteM
  ORs these rows across attributes and keeps the interested queries that failed none:
  a query without a factor on this attribute has no bit here and is never affected);
* probing a batch finds each value's cell (one `searchsorted`, or a direct value -> row
  map for integers in a small range) and gathers its row.

The index changes as queries come and go, never rebuilt (the query stream is a stream):

* rows of the table have stable ids; `cell -> row` is an indirection (O(k) to edit, one
  int per cell), so a new constant splits its gap by *copying* the gap's row twice (the
  existing queries treat the constant and both sides of it alike) and a constant nobody
  uses any more merges its three cells back into one, freeing two rows;
* a query's own bits are one column of the table: registering writes it, unregistering
  clears it, O(cells) strided word writes;
* the direct map is patched over the values from the changed constant to the next key.

Costs: add/remove O(k + cells + Q/64) words (plus O(range) for the direct map, bounded
by DIRECT_MAP_LIMIT); probe O(n log k + n * words) for n tuples. Memory: (2k + 1 rows)
x words x 8 bytes, rows over-allocated at most twofold; words a power of two up to 8
cache lines, past them at most 1/16 more than the slots need plus two lines (`row_words`:
rows an odd number of lines wide): a probe at 10^4 queries reads 157 words of rows 168
wide, where twofold widening had left rows of 280 and the probe 8% slower. The table
starts on a cache line (`psoup.bits.aligned_zeros`), so the probe reads its rows as whole
lines.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from psoup import kernels
from psoup.bits import WORD, aligned_zeros, bit_of
from psoup.query.model import AttrPredicate, ColumnType
from psoup.stems.batch import DTYPES

#: Integer attributes whose values span fewer than this many values get a direct
#: value -> row map instead of a binary search per value (lanes, stations, speeds).
DIRECT_MAP_LIMIT = 1 << 16


_IDENTITY = np.arange(1024, dtype=np.int64)


def _identity(n: int) -> np.ndarray:
    """The map 0..n-1 -> itself (keys that are table rows already), n int64s."""
    global _IDENTITY
    if len(_IDENTITY) < n:
        _IDENTITY = np.arange(max(n, 2 * len(_IDENTITY)), dtype=np.int64)
    return _IDENTITY[:n]


_ALL = np.ones(1024, dtype=bool)


def _accept_all(cells: int) -> np.ndarray:
    """`cells` Trues: every cell accepted (a column cleared by `write_column`)."""
    global _ALL
    if len(_ALL) < cells:
        _ALL = np.ones(2 * cells, dtype=bool)
    return _ALL[:cells]


def row_words(words: int) -> int:
    """The width of a reject table holding `words` words of query bits: a power of two
    up to 8 cache lines (4,096 queries), beyond it an odd number of whole lines. A row
    stride of a power of two lines puts the rows a probe reads (every other one: a
    constant's cell, not the gaps around it) on a fraction of the cache's sets; up to 8
    lines the four tables' rows fit the L2 cache even so, beyond they do not: at 10^4
    queries (157 words, rows of 256 words) the probe ran at 0.64x the rate of rows 168
    words wide.

    Example:
        >>> [row_words(w) for w in (1, 3, 9, 64, 65, 157, 256)]
        [1, 4, 16, 64, 72, 168, 264]
    """
    if words <= 64:
        return 1 << (words - 1).bit_length()
    return (-(-words // 8) | 1) * 8


class AttributeIndex:
    """The queries' factors on one attribute of one stream, probed a batch at a time.

    Example:
        >>> idx = AttributeIndex("int")
        >>> idx.add(0, AttrPredicate("a", "int", lo=5))
        >>> idx.add(1, AttrPredicate("a", "int", eq=frozenset({3})))
        >>> idx.probe(np.array([3, 7]), 1)[:, 0].tolist()  # bit i set: query i fails
        [1, 2]
    """

    def __init__(self, ctype: ColumnType):
        self.dtype = DTYPES[ctype]
        self._uses: dict[Any, int] = {}                  # constant -> number of uses
        self._preds: dict[int, AttrPredicate] = {}
        self._keys = np.empty(0, self.dtype)              # the constants, sorted
        self._cell_row = np.zeros(1, np.int64)            # cell -> row of the table
        self._table = aligned_zeros((4, 1))               # row -> reject bits by slot
        self._free_rows = deque(range(3, 0, -1))          # row 0 is the one cell's
        self._direct: tuple[int, np.ndarray] | None = None   # (first value, row per value)

    def __len__(self) -> int:
        return len(self._preds)

    # ------------------------------------------------------------------ changes

    def add(self, slot: int, pred: AttrPredicate) -> None:
        """Index `pred` for query `slot`: split cells for its new constants, then write
        its column. O(k + cells + Q/64)."""
        assert slot not in self._preds, f"slot {slot} is filed already"
        for c in _constants(pred):
            uses = self._uses.get(c, 0)
            self._uses[c] = uses + 1
            if not uses:
                self._split(c)
        self._preds[slot] = pred
        self._write(slot, pred)

    def remove(self, slot: int) -> None:
        """Forget query `slot`'s factors: clear its column, then merge the cells of the
        constants nobody uses any more. O(k + cells)."""
        pred = self._preds.pop(slot)
        word, mask = bit_of(slot)
        if word < self._table.shape[1]:                 # free rows are never read
            cells = len(self._cell_row)
            kernels.write_column(self._table, self._cell_row, word, mask, _accept_all(cells))
        for c in _constants(pred):
            left = self._uses[c] - 1
            if left:
                self._uses[c] = left
            else:
                del self._uses[c]
                self._merge(c)

    def _split(self, c: Any) -> None:
        """Make c a key: its gap's row is copied to {c} and to the gap above c."""
        keys = self._keys
        i = int(keys.searchsorted(c))
        gap = int(self._cell_row[2 * i])
        at, above = self._new_row(gap), self._new_row(gap, gap=True)
        # (np.insert and np.delete cost ~10 us each in argument handling; a concatenate ~1)
        self._keys = np.concatenate((keys[:i], np.array([c], keys.dtype), keys[i:]))
        cells = self._cell_row
        self._cell_row = np.concatenate((cells[:2 * i + 1], np.array([at, above]),
                                         cells[2 * i + 1:]))
        if self._direct is not None:    # the gap's values from c on now map to at, above
            self._remap(int(c), at, above, keys[i] if i < len(keys) else None)

    def _merge(self, c: Any) -> None:
        """Drop key c: {c} and the gap above it fold into the gap below (every query
        left treats them alike, none having c as a constant)."""
        keys = self._keys
        i = int(keys.searchsorted(c))
        cells = self._cell_row
        self._free_rows.extend(int(r) for r in cells[2 * i + 1:2 * i + 3])
        self._keys = np.concatenate((keys[:i], keys[i + 1:]))
        self._cell_row = np.concatenate((cells[:2 * i + 1], cells[2 * i + 3:]))
        if self._direct is not None:    # c and the values above it up to the next key
            gap = int(cells[2 * i])
            self._remap(int(c), gap, gap, keys[i + 1] if i + 1 < len(keys) else None)

    def _new_row(self, copy_of: int, gap: bool = False) -> int:
        """A free row, a copy of row `copy_of`: a constant's cell takes the lowest free
        row, a gap's cell the highest (after a doubling). An integer attribute's values
        reach every constant's cell but no gap between consecutive constants, so the
        rows its probe reads stay together rather than every other row: measured, at
        10^4 queries, 9% off the probe (the rows and the cache lines a prefetch brings
        with them fit the L2 cache). O(words), O(rows x words) when the table doubles."""
        if not self._free_rows:
            rows, words = self._table.shape
            table = aligned_zeros((2 * rows, words))
            table[:rows] = self._table
            self._table = table
            self._free_rows = deque(range(2 * rows - 1, rows - 1, -1))
        row = self._free_rows.popleft() if gap else self._free_rows.pop()
        self._table[row] = self._table[copy_of]
        return row

    def _write(self, slot: int, pred: AttrPredicate) -> None:
        """Set `slot`'s reject bit in every cell `pred` rejects, clear it elsewhere."""
        word, mask = bit_of(slot)
        if word >= self._table.shape[1]:      # widened 1/16 ahead, columns kept
            self.table(word + 1 + max(1, (word + 1) // 16))
        kernels.write_column(self._table, self._cell_row, word, mask, self._accepts(pred))

    def _accepts(self, pred: AttrPredicate) -> np.ndarray:
        """Which cells `pred` accepts (a bool per cell). O(cells)."""
        keys = self._keys
        accept = np.zeros(2 * len(keys) + 1, dtype=bool)
        if pred.empty:
            return accept
        if pred.eq is not None:
            accept[[_cell_of(keys, c) for c in pred.eq]] = True
            return accept
        first = 0 if pred.lo is None else _cell_of(keys, pred.lo) + int(pred.lo_open)
        last = len(accept) - 1 if pred.hi is None else \
            _cell_of(keys, pred.hi) - int(pred.hi_open)
        accept[first:last + 1] = True
        if pred.ne:
            accept[[_cell_of(keys, c) for c in pred.ne]] = False
        return accept

    # ------------------------------------------------------------------ probing

    def probe(self, values: np.ndarray, words: int) -> np.ndarray:
        """Bit rows (len(values) x words, little-endian uint64) of the queries whose
        factors on this attribute reject each value. O(n log k + n * words).
        """
        return self.table(words)[self.rows(values), :words]

    def table(self, words: int) -> np.ndarray:
        """The C-contiguous reject table, at least `words` words wide (rows by `rows()`;
        words past the queries' slots are zero)."""
        if self._table.shape[1] < words:
            rows, have = self._table.shape
            table = aligned_zeros((rows, row_words(words)))
            table[:, :have] = self._table
            self._table = table
        return self._table

    def keys(self, values: np.ndarray,
             direct_map: bool = True) -> tuple[np.ndarray, int, np.ndarray]:
        """The probe's keys for `values` (`kernels.probe_into`): for integers, once the
        index keeps a direct map, the values themselves, the map's first value and the
        map, O(1); otherwise (or with direct_map=False: the kernel found a value outside
        the map) their table rows and an identity map, as `rows`, which widens the map
        to them."""
        direct = self._direct
        if direct_map and direct is not None and values.dtype == np.int64:
            return values, direct[0], direct[1]
        return self.rows(values), 0, _identity(self._table.shape[0])

    def rows(self, values: np.ndarray) -> np.ndarray:
        """The table row of each value: O(n log k), or O(n) for integers in a small
        range (a direct value -> row map, built over the values seen and widened to
        new ones)."""
        if values.dtype.kind in "iu" and len(values) >= 64:
            direct = self._direct
            lo, hi = int(values.min()), int(values.max())
            if direct is None or lo < direct[0] or hi >= direct[0] + len(direct[1]):
                if direct is not None:
                    lo = min(lo, direct[0])
                    hi = max(hi, direct[0] + len(direct[1]) - 1)
                if hi - lo >= DIRECT_MAP_LIMIT:
                    return self._search(values)
                self._direct = direct = (lo, self._search(np.arange(lo, hi + 1)))
            rows: np.ndarray = direct[1][values - direct[0]]
            return rows
        return self._search(values)

    def _search(self, values: np.ndarray) -> np.ndarray:
        keys = self._keys
        cell = np.searchsorted(keys, values, side="left")
        if len(keys):
            hit = keys[np.minimum(cell, len(keys) - 1)] == values
            cell = 2 * cell + hit
        return self._cell_row[cell]

    def _remap(self, c: int, at: int, above: int, next_key: Any) -> None:
        """Point the direct map's value c at row `at` and its values from c + 1 up to
        `next_key` (exclusive; None: the end of the domain) at row `above`: the only
        values whose cell changed when key c came or went. O(values changed)."""
        assert self._direct is not None
        first, rows = self._direct
        end = first + len(rows)
        if first <= c < end:
            rows[c - first] = at
        start = max(c + 1, first)
        stop = end if next_key is None else min(end, int(next_key))
        if stop > start:        # (a stop below the map's first value would index from
            rows[start - first:stop - first] = above       # its end, as a negative one)

    # ------------------------------------------------------------------ introspection

    def slots(self) -> list[int]:
        """The query slots with a factor on this attribute."""
        return list(self._preds)

    def nbytes(self) -> int:
        direct = 0 if self._direct is None else self._direct[1].nbytes
        return self._table.nbytes + self._keys.nbytes + self._cell_row.nbytes + direct

    def _check(self) -> None:
        """Assert the structure's invariants (for tests): the keys are exactly the filed
        predicates' constants, sorted and counted once per use; every cell has its own
        live row; each slot's column rejects exactly what its predicate rejects at every
        key and between keys; unfiled slots have no bits; the direct map agrees."""
        uses: dict[Any, int] = {}
        for pred in self._preds.values():
            for c in _constants(pred):
                uses[c] = uses.get(c, 0) + 1
        assert uses == dict(self._uses), "constants are reference-counted"
        keys = self._keys
        assert keys.tolist() == sorted(self._uses), "keys are the sorted constants"
        cells = self._cell_row
        assert len(cells) == 2 * len(keys) + 1
        assert len(set(cells.tolist())) == len(cells), "each cell has its own row"
        assert not set(cells.tolist()) & set(self._free_rows), "a free row is no cell's"
        assert row_words(self._table.shape[1]) == self._table.shape[1], \
            "rows are a power of two words up to 8 lines, an odd number of lines beyond"
        probes = _cell_samples(keys)
        bits = self._table[self._search(probes)]
        from psoup.stems.predicates import attr_mask
        filed = set(self._preds)
        for slot in range(self._table.shape[1] * WORD):
            word, mask = bit_of(slot)
            got = (bits[:, word] & mask) != 0
            if slot in filed:
                want = ~attr_mask(self._preds[slot], probes)
                assert (got == want).all(), ("column", slot)
            else:
                assert not (self._table[cells, word] & mask).any(), ("stray bits", slot)
        if self._direct is not None:
            first, rows = self._direct
            values = np.arange(first, first + len(rows))
            assert (rows == self._search(values)).all(), "the direct map is current"


def _constants(pred: AttrPredicate) -> list[Any]:
    if pred.eq is not None:
        return list(pred.eq)
    return [c for c in (pred.lo, pred.hi) if c is not None] + list(pred.ne)


def _cell_of(keys: np.ndarray, constant: Any) -> int:
    """The cell {constant}: constants of a registered predicate are always keys."""
    return 2 * int(keys.searchsorted(constant)) + 1


def _cell_samples(keys: np.ndarray) -> np.ndarray:
    """A value in every cell that has one: the keys, and a value inside each gap
    (numbers only; for other types the keys alone)."""
    if keys.dtype.kind not in "iuf" or not len(keys):
        return keys
    k = keys.astype(np.float64) if keys.dtype.kind == "f" else keys.astype(object)
    inner = [(a + b) / 2 if keys.dtype.kind == "f" else a + 1
             for a, b in zip(k[:-1], k[1:], strict=True) if (b - a > 1 or keys.dtype.kind == "f")]
    ends = [k[0] - 1, k[-1] + 1]
    values = sorted(set(list(k) + inner + ends))
    try:
        return np.array(values, dtype=keys.dtype)
    except OverflowError:
        return keys
