"""The catalog statements' answers: SHOW STREAMS, SHOW QUERIES and DESCRIBE (docs/
language.md, "The catalog"), as tables read from the engine's core."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from psoup.query.model import DESCRIBE, SHOW_QUERIES, SHOW_STREAMS, Catalog, StreamSchema
from psoup.results.result import Result

if TYPE_CHECKING:
    from psoup.core import Core

#: The columns of SHOW STREAMS and DESCRIBE (and the keys of Engine.describe).
CATALOG_COLUMNS = ["stream", "columns", "retain", "rows", "rows_total", "latest_ts",
                   "queries", "source", "source_state", "source_batches"]

#: A source's (state, micro-batches applied) by stream name (psoup.spark.live).
SourceStates = Callable[[str], tuple[str | None, int | None]]
#: A stream's (retained rows, rows ever, latest ts) when they are not in memory (a
#: stream probed in Spark's executors: its batch store's); None for the others.
Stored = Callable[[str], "tuple[int, int, float | None] | None"]


def _no_source(name: str) -> tuple[str | None, int | None]:
    return None, None

_RETAIN_UNITS = (("DAY", 86400.0), ("HOUR", 3600.0), ("MINUTE", 60.0), ("SECOND", 1.0))


def retention(schema: StreamSchema) -> str | None:
    """A stream's RETAIN clause as CREATE STREAM takes it, in its largest exact unit.

    Example:
        >>> retention(StreamSchema("R", (), retain_seconds=7200.0))
        '2 HOURS'
        >>> retention(StreamSchema("R", (), retain_rows=1)), retention(StreamSchema("R", ()))
        ('1 ROW', None)
    """
    amount: int | float
    if schema.retain_rows is not None:
        amount, unit = schema.retain_rows, "ROW"
    elif schema.retain_seconds is not None:
        seconds = schema.retain_seconds
        unit, size = next((u, s) for u, s in _RETAIN_UNITS if (seconds / s).is_integer()
                          or u == "SECOND")
        amount = int(seconds // size) if (seconds / size).is_integer() else seconds
    else:
        return None
    return f"{amount} {unit}" + ("" if amount == 1 else "S")


def table(columns: list[str], rows: list[tuple[Any, ...]]) -> Result:
    """A catalog answer: `rows` under `columns`, with no ts or tupleIDs of its own."""
    return Result(columns, rows, np.full(len(rows), np.nan), np.full(len(rows), -1, np.int64))


def describe_stream(core: Core, name: str, sources: SourceStates = _no_source,
                    stored: Stored | None = None) -> dict[str, Any]:
    """What DESCRIBE shows of existing stream `name`, by CATALOG_COLUMNS. O(queries)."""
    stem = core.stems[name]
    schema = stem.schema
    state, batches = sources(name)
    kept = None if stored is None else stored(name)
    retained, total, latest = kept if kept is not None else (
        stem.retained, stem.rows_total, stem.last_ts if stem.n else None)
    return dict(zip(CATALOG_COLUMNS, (
        name, ", ".join(f"{c} {t.upper()}" for c, t in schema.columns),
        retention(schema), retained, total, latest, len(core.users(name)),
        None if schema.source is None else schema.source.describe(), state, batches),
        strict=True))


def answer_catalog(core: Core, stmt: Catalog, sources: SourceStates = _no_source,
                   stored: Stored | None = None) -> Result:
    """The table a SHOW or DESCRIBE statement answers (not DROP STREAM, a change)."""
    if stmt.action == SHOW_STREAMS:
        return table(CATALOG_COLUMNS, [tuple(describe_stream(core, name, sources,
                                                             stored).values())
                                       for name in core.stems])
    if stmt.action == DESCRIBE:
        assert stmt.stream is not None, "DESCRIBE names a stream"
        return table(CATALOG_COLUMNS,
                     [tuple(describe_stream(core, stmt.stream, sources, stored).values())])
    assert stmt.action == SHOW_QUERIES, stmt.action
    return table(["handle", "sql"], [(h, plan.query.sql) for h, plan in core.handles.items()])
