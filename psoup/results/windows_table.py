"""The WindowsTable: each query's BEGIN-END clause, resolved at invocation (Sect. 3.2, 3.3).

PSoup splits a query into its standing clause, joined with the data in the background,
and its window, kept here and applied only when the handle is invoked (ARCHITECTURE.md,
invariant 3). Resolving a window against NOW and a Data SteM yields a span of positions.
"""

from __future__ import annotations


from psoup.query.model import Window
from psoup.results.base import Span
from psoup.stems.data_stem import DataSteM


def resolve(window: Window, stem: DataSteM, now: float) -> Span:
    """The positions of `stem` that `window` selects at time `now`.

    Example:
        >>> from psoup.query.model import StreamSchema
        >>> stem = DataSteM(StreamSchema("R", (("a", "int"),)))
        >>> resolve(Window(), stem, 0.0)
        (0, 0)
    """
    if window.kind == "all":
        return stem.horizon, stem.n
    if window.kind == "range":
        begin, end = window.begin.resolve(now), window.end.resolve(now)
        if begin > end:
            return stem.n, stem.n
        return stem.time_range(begin, end)
    if window.kind == "rows":
        return stem.last_rows(window.rows)
    if window.kind == "partition":
        return stem.partition_window(window.partition_by, window.rows)
    raise ValueError(f"unknown window kind {window.kind!r}")


class WindowsTable:
    """Query slot -> the windows of its FROM items."""

    def __init__(self):
        self._windows: dict[int, tuple[Window, ...]] = {}

    def add(self, slot: int, windows: tuple[Window, ...]) -> None:
        self._windows[slot] = windows

    def remove(self, slot: int) -> None:
        del self._windows[slot]

    def spans(self, slot: int, stems: list[DataSteM], now: float) -> list[Span]:
        return [resolve(w, s, now) for w, s in zip(self._windows[slot], stems)]
