"""The WindowsTable: each query's BEGIN-END clause, resolved at invocation (Sect. 3.2, 3.3).

PSoup splits a query into its standing clause, joined with the data in the background,
and its window, kept here and applied only when the handle is invoked. Resolving a
window against NOW and a Data SteM yields a `Span` of positions.

Each kind of window (`model.Window.kind`) is one `WindowKind` in `KINDS`: how it
resolves in memory, and how far it reaches into a query's archive tier (history). A new
kind of window is a new entry here (and its syntax in psoup.query).
"""

from __future__ import annotations

import math

from psoup.query.model import Window
from psoup.stems.data_stem import DataSteM
from psoup.stems.span import Span


class WindowKind:
    """How one kind of window selects tuples."""

    def resolve(self, window: Window, stem: DataSteM, now: float) -> Span:
        """The retained positions of `stem` the window selects at `now`."""
        raise NotImplementedError

    def archive_reach(self, window: Window, now: float) -> tuple[float, float] | None:
        """The ts range [begin, end] the window selects among archived matches, or None
        when it counts tuples in memory only."""
        return None


class Unbounded(WindowKind):
    """Everything retained (no BEGIN/END, [RANGE UNBOUNDED]); the whole archive tier."""

    def resolve(self, window: Window, stem: DataSteM, now: float) -> Span:
        return Span.range(stem.horizon, stem.n)

    def archive_reach(self, window: Window, now: float) -> tuple[float, float] | None:
        return -math.inf, math.inf


class TimeRange(WindowKind):
    """BEGIN b END e and [RANGE ..], [NOW]: the tuples with b <= ts <= e at `now`."""

    def resolve(self, window: Window, stem: DataSteM, now: float) -> Span:
        begin, end = self._edges(window, now)
        if begin > end:
            return Span.range(stem.n, stem.n)
        return Span.range(*stem.time_range(begin, end))

    def archive_reach(self, window: Window, now: float) -> tuple[float, float] | None:
        return self._edges(window, now)

    @staticmethod
    def _edges(window: Window, now: float) -> tuple[float, float]:
        assert window.begin is not None and window.end is not None
        return window.begin.resolve(now), window.end.resolve(now)


class LastRows(WindowKind):
    """[ROWS n] and BEGIN (NOW - n ROWS) END NOW: the n most recent retained tuples."""

    def resolve(self, window: Window, stem: DataSteM, now: float) -> Span:
        assert window.rows is not None
        return Span.range(*stem.last_rows(window.rows))


class Partitioned(WindowKind):
    """[PARTITION BY cols ROWS n]: the n most recent retained tuples of each value."""

    def resolve(self, window: Window, stem: DataSteM, now: float) -> Span:
        assert window.rows is not None
        return Span.of(stem.partition_window(window.partition_by, window.rows))


#: Every kind of window, by `Window.kind`.
KINDS: dict[str, WindowKind] = {
    "all": Unbounded(), "range": TimeRange(), "rows": LastRows(), "partition": Partitioned(),
}


def resolve(window: Window, stem: DataSteM, now: float) -> Span:
    """The positions of `stem` that `window` selects at time `now`.

    Example:
        >>> from psoup.query.model import StreamSchema
        >>> stem = DataSteM(StreamSchema("R", (("a", "int"),)))
        >>> resolve(Window(), stem, 0.0)
        Span.range(0, 0)
    """
    return KINDS[window.kind].resolve(window, stem, now)


def archive_reach(window: Window, now: float) -> tuple[float, float] | None:
    """The ts range `window` selects among archived matches at `now`, or None."""
    return KINDS[window.kind].archive_reach(window, now)


class WindowsTable:
    """Query id -> the windows of its FROM items."""

    def __init__(self) -> None:
        self._windows: dict[int, tuple[Window, ...]] = {}

    def add(self, qid: int, windows: tuple[Window, ...]) -> None:
        self._windows[qid] = windows

    def remove(self, qid: int) -> None:
        del self._windows[qid]

    def spans(self, qid: int, stems: list[DataSteM], now: float) -> list[Span]:
        return [resolve(w, s, now) for w, s in zip(self._windows[qid], stems, strict=True)]

    def span(self, qid: int, stem: DataSteM, now: float) -> Span:
        """`spans` of a query with one FROM item (a selection query)."""
        window, = self._windows[qid]
        return resolve(window, stem, now)
