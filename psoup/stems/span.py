"""Spans: what a resolved window selects in one stream, as positions (PSoup Sect. 3.3).

Positions are arrival ranks in a stream and follow its timestamps, so almost every
window is a *range* of positions [lo, hi): a time window is two binary searches over the
ts column, a ROWS window the last n positions, an unbounded one the retained positions.
A PARTITION BY window is not contiguous: it is a sorted *array* of positions. `Span`
holds either, and the readers of the Results Structure ask it, not its form, what they
need.
"""

from __future__ import annotations

import numpy as np


class Span:
    """A position range [lo, hi) or a sorted array of positions.

    Example:
        >>> Span.range(3, 7).pick(np.array([1, 3, 6, 9])).tolist()
        [3, 6]
        >>> Span.of(np.array([2, 5])).pick(np.array([1, 2, 3, 5])).tolist()
        [2, 5]
        >>> len(Span.range(5, 2)), Span.of(np.array([4, 8])).bounds()
        (0, (4, 9))
    """

    __slots__ = ("lo", "hi", "positions")

    def __init__(self, lo: int, hi: int, positions: np.ndarray | None = None):
        self.lo = lo
        self.hi = max(lo, hi)
        self.positions = positions

    @classmethod
    def range(cls, lo: int, hi: int) -> Span:
        """The positions lo, lo + 1, ..., hi - 1 (empty when hi <= lo)."""
        return cls(int(lo), int(hi))

    @classmethod
    def of(cls, positions: np.ndarray) -> Span:
        """An explicit sorted array of positions."""
        positions = np.asarray(positions, dtype=np.int64)
        lo, hi = (int(positions[0]), int(positions[-1]) + 1) if len(positions) else (0, 0)
        return cls(lo, hi, positions)

    @property
    def is_range(self) -> bool:
        """True for a contiguous range (structures that answer ranges can use it)."""
        return self.positions is None

    def __len__(self) -> int:
        return self.hi - self.lo if self.positions is None else len(self.positions)

    def bounds(self) -> tuple[int, int]:
        """The smallest range [lo, hi) covering the span."""
        return self.lo, self.hi

    def first(self) -> int | None:
        """The first position, or None when the span is empty."""
        return self.lo if len(self) else None

    def array(self) -> np.ndarray:
        """The positions as a sorted int64 array. O(len)."""
        if self.positions is None:
            return np.arange(self.lo, self.hi, dtype=np.int64)
        return self.positions

    def contains(self, values: np.ndarray) -> np.ndarray:
        """Which of `values` (positions in any order) lie in the span. O(n), or O(n log m)
        for an array of m positions."""
        if self.positions is None:
            return (values >= self.lo) & (values < self.hi)
        return np.isin(values, self.positions)

    def pick(self, sorted_positions: np.ndarray) -> np.ndarray:
        """The sorted positions that lie in the span: two binary searches for a range."""
        if self.positions is None:
            a, b = np.searchsorted(sorted_positions, (self.lo, self.hi))
            return sorted_positions[a:b]
        return sorted_positions[np.isin(sorted_positions, self.positions, assume_unique=True)]

    def __repr__(self) -> str:
        if self.positions is None:
            return f"Span.range({self.lo}, {self.hi})"
        return f"Span.of({len(self.positions)} positions in [{self.lo}, {self.hi}))"
