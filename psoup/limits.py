"""The engine's limits: what one query, stream or registration may cost before it is
refused (docs/api.md, "Limits"). Each check runs before anything is applied or logged,
so a refused call changes nothing; recovery replays what was admitted, whatever the
limits are now.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from psoup.errors import LimitError, SchemaError

if TYPE_CHECKING:
    from psoup.core import Core
    from psoup.query.model import Query
    from psoup.stems.data_stem import DataSteM

#: The latest ts accepted by default: 10^11 seconds is the year 5138, and a clock in
#: milliseconds (1.8e12 in 2026) passes it by far. Engine(max_ts=None) lifts it.
MAX_TS = 1e11


def ts_unit_hint(value: float) -> str:
    """What a ts past MAX_TS probably is, as advice.

    Example:
        >>> ts_unit_hint(1795353067184.0)[:62]
        'it looks like milliseconds since the epoch (2026-11-22): psoup'
    """
    for unit, scale in (("milliseconds", 1e3), ("microseconds", 1e6), ("nanoseconds", 1e9)):
        seconds = value / scale
        if 0 <= seconds <= MAX_TS and seconds < 4102444800:        # before 2100
            day = time.strftime("%Y-%m-%d", time.gmtime(seconds))
            flag = {"milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns"}[unit]
            return (f"it looks like {unit} since the epoch ({day}): psoup takes seconds, "
                    f"so divide by {scale:,.0f} (psoup ingest --ts-unit {flag})")
    return "psoup takes seconds since the epoch (or any clock of seconds)"


def _positive(name: str, limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise ValueError(f"{name} must be a positive integer (or None: no limit), "
                         f"got {limit!r}")


class Limits:
    """The limits of one engine (`psoup.engine.Engine` documents each argument); None
    is no limit. Every check is O(1) but `admit`'s results bound, O(chunks).

    Raises:
        ValueError: a limit that is not a positive integer.
    """

    def __init__(self, max_factors: int | None = None, max_queries: int | None = None,
                 max_stream_bytes: int | None = None, max_results_bytes: int | None = None,
                 max_ts: float | None = MAX_TS):
        for name, limit in (("max_queries", max_queries), ("max_stream_bytes", max_stream_bytes),
                            ("max_results_bytes", max_results_bytes)):
            _positive(name, limit)
        self.max_factors = max_factors
        self.max_queries = max_queries
        self.max_stream_bytes = max_stream_bytes
        self.max_results_bytes = max_results_bytes
        self.max_ts = max_ts

    def admit(self, core: Core, query: Query) -> None:
        """Refuse a new standing query beyond max_queries or max_results_bytes.

        Raises:
            LimitError: naming the limit and what to do.
        """
        held = len(core.handles)
        if self.max_queries is not None and held >= self.max_queries:
            raise LimitError(f"the engine holds {held} standing queries, its limit "
                             f"(max_queries={self.max_queries}); unregister one first")
        if self.max_results_bytes is not None:
            used = core.kept.nbytes()
            grows = core.admission_bytes(query)
            if used + grows > self.max_results_bytes:
                raise LimitError(
                    f"registering this query could take the results memory from {used:,} "
                    f"to {used + grows:,} bytes, past its limit (max_results_bytes="
                    f"{self.max_results_bytes:,}); unregister queries, retain less data "
                    "(RETAIN), or raise the limit")

    def check_ts(self, stream: str, ts: NDArray[np.float64]) -> None:
        """Refuse a batch with a ts past max_ts (ts never decrease: the last is the
        largest).

        Raises:
            SchemaError: naming the row, its ts and what unit it looks like.
        """
        if self.max_ts is None or not ts[-1] > self.max_ts:
            return
        row = int(np.searchsorted(ts, self.max_ts, side="right"))
        raise SchemaError(f"stream '{stream}', row {row}: ts {float(ts[row])!r} is past "
                          f"max_ts ({self.max_ts:g} s): "
                          f"{ts_unit_hint(float(ts[row]))}; nothing was stored")

    def admit_batch(self, stem: DataSteM, ts: NDArray[np.float64]) -> None:
        """Refuse a batch that would take its stream past max_stream_bytes.

        Raises:
            LimitError: naming the stream, the rows and the limit.
        """
        if self.max_stream_bytes is None:
            return
        rows = stem.retained_after(ts)
        if rows * stem.row_bytes > self.max_stream_bytes:
            raise LimitError(
                f"stream '{stem.schema.name}': this batch of {len(ts):,} rows would retain "
                f"{rows:,} rows = {rows * stem.row_bytes:,} bytes ({stem.row_bytes} per row), "
                f"past its limit (max_stream_bytes={self.max_stream_bytes:,}); nothing was "
                "stored. Retain less (RETAIN n ROWS or a time), or raise the limit")

    def stats(self, core: Core) -> dict[str, Any]:
        """stats()["limits"]: each limit beside what it bounds now."""
        return {"queries": len(core.handles), "max_queries": self.max_queries,
                "max_factors": self.max_factors,
                "results_bytes": core.kept.nbytes(),
                "max_results_bytes": self.max_results_bytes,
                "stream_bytes": {name: stem.retained * stem.row_bytes
                                 for name, stem in core.stems.items()},
                "max_stream_bytes": self.max_stream_bytes}
