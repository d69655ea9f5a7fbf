"""Turning what a producer hands `Engine.insert` into one checked column batch.

This is the edge where Python objects per tuple are allowed: rows as tuples,
rows as dicts, or columns as sequences or numpy arrays (the fast path) become one numpy
array per column, and every rule of docs/language.md "Streams" is checked before anything is
stored, so a rejected batch changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from psoup.errors import SchemaError
from psoup.query.model import INT64_MAX, INT64_MIN, ColumnType, StreamSchema

_INT, _FLOAT, _TEXT, _BOOL = ColumnType.INT, ColumnType.FLOAT, ColumnType.TEXT, ColumnType.BOOL

#: numpy storage dtype per column type; TEXT keeps Python str objects, so comparisons are
#: by code point exactly as docs/language.md requires.
DTYPES: dict[ColumnType, np.dtype[Any]] = {
    _INT: np.dtype(np.int64), _FLOAT: np.dtype(np.float64),
    _TEXT: np.dtype(object), _BOOL: np.dtype(bool),
}

_PY_TYPES: dict[ColumnType, tuple[type, ...]] = {
    _INT: (int, np.integer),
    _FLOAT: (int, float, np.integer, np.floating),
    _TEXT: (str, np.str_),
    _BOOL: (bool, np.bool_),
}
_ARRAY_KINDS = {_INT: "iu", _FLOAT: "iuf", _TEXT: "OUS", _BOOL: "b"}


@dataclass
class Batch:
    """A checked batch: `columns[name]` and `ts` are numpy arrays of length `n`."""

    columns: dict[str, np.ndarray]
    ts: np.ndarray
    n: int


def make_batch(schema: StreamSchema, rows: Any, ts: Any, clock_now: float,
               last_ts: float) -> Batch:
    """Check `rows` and `ts` against `schema` and return them as one column batch.

    Args:
        schema: the stream's schema.
        rows: a list of tuples in schema order, a list of dicts, or a dict of column ->
            sequence or numpy array.
        ts: None (use `clock_now`), one number for all rows, or one number per row.
        clock_now: the engine clock's reading, used when `ts` is None.
        last_ts: the stream's latest timestamp (-inf when empty); ts may not go below it.

    Returns:
        The batch; raises SchemaError naming the stream, the row and the column otherwise.

    Example:
        >>> s = StreamSchema("R", (("a", "int"),))
        >>> make_batch(s, [(1,), (2,)], 5.0, 0.0, float("-inf")).columns["a"].tolist()
        [1, 2]
    """
    raw = _columns_of(schema, rows)
    n = len(next(iter(raw.values()))) if raw else 0
    columns = {}
    for name, ctype in schema.columns:
        columns[name] = _check_column(schema.name, name, ctype, raw[name], n)
    stamps = _check_ts(schema.name, ts, n, clock_now, last_ts)
    return Batch(columns, stamps, n)


def _columns_of(schema: StreamSchema, rows: Any) -> dict[str, Any]:
    names = schema.names
    if type(rows) is dict or isinstance(rows, Mapping):
        if rows.keys() != schema.name_set:
            _check_names(schema, rows.keys(), "the dict of columns")
        columns = {name: rows[name] for name in names}
        lengths = [len(values) for values in columns.values()]
        if lengths and lengths.count(lengths[0]) != len(lengths):
            detail = ", ".join(f"{k}={v}" for k, v in zip(columns, lengths, strict=True))
            raise SchemaError(f"stream '{schema.name}': columns have different lengths ({detail})")
        return columns
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise SchemaError(
            f"stream '{schema.name}': rows must be a list of tuples, a list of dicts, or a "
            f"dict of columns, not {type(rows).__name__}")
    if not rows:
        return {name: [] for name in names}
    if all(isinstance(r, Mapping) for r in rows):
        for i, r in enumerate(rows):
            _check_names(schema, r.keys(), f"row {i}")
        return {name: [r[name] for r in rows] for name in names}
    for i, r in enumerate(rows):
        if isinstance(r, (Mapping, str, bytes)) or not isinstance(r, Sequence):
            raise SchemaError(f"stream '{schema.name}', row {i}: expected a tuple of "
                              f"{len(names)} values ({', '.join(names)}), got {r!r}")
        if len(r) != len(names):
            raise SchemaError(f"stream '{schema.name}', row {i}: expected {len(names)} values "
                              f"({', '.join(names)}), got {len(r)}")
    return dict(zip(names, (list(c) for c in zip(*rows, strict=True)), strict=True))


def _check_names(schema: StreamSchema, keys: Any, where: str) -> None:
    names = schema.names
    missing = [n for n in names if n not in keys]
    if missing:
        raise SchemaError(f"stream '{schema.name}': {where} has no column '{missing[0]}' "
                          f"(the stream's columns: {', '.join(names)})")
    extra = [k for k in keys if k not in names]
    if extra:
        raise SchemaError(f"stream '{schema.name}': {where} has column '{extra[0]}', which "
                          f"the stream lacks (its columns: {', '.join(names)})")


def _check_column(stream: str, name: str, ctype: ColumnType, values: Any, n: int) -> np.ndarray:
    dtype = DTYPES[ctype]
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise SchemaError(f"stream '{stream}', column '{name}': expected a 1-d array, "
                              f"got shape {values.shape}")
        if values.dtype.kind not in _ARRAY_KINDS[ctype]:
            raise SchemaError(f"stream '{stream}', column '{name}': expected {ctype.upper()} "
                              f"values, got an array of {values.dtype}")
        if values.dtype.kind == "O":
            _check_objects(stream, name, ctype, values)
        if ctype == _INT and values.dtype.kind == "u" and len(values) and \
                values.max() > INT64_MAX:
            raise SchemaError(f"stream '{stream}', column '{name}': value exceeds 64-bit INT")
        out = np.ascontiguousarray(values, dtype=dtype)  # no copy: nothing keeps it
    else:
        values = list(values)
        _check_objects(stream, name, ctype, values)
        try:
            out = np.array(values, dtype=dtype) if values else np.empty(0, dtype=dtype)
        except OverflowError:
            big = next(i for i, v in enumerate(values) if not INT64_MIN <= v <= INT64_MAX)
            raise SchemaError(f"stream '{stream}', row {big}, column '{name}': "
                              f"{values[big]} does not fit a 64-bit INT") from None
    if ctype == _FLOAT and len(out):
        bad = np.flatnonzero(np.isnan(out))
        if len(bad):
            raise SchemaError(f"stream '{stream}', row {bad[0]}, column '{name}': NaN is not "
                              "a value (psoup has no NULLs)")
    return out


def _check_objects(stream: str, name: str, ctype: ColumnType, values: Collection[Any]) -> None:
    allowed = _PY_TYPES[ctype]
    types = set(map(type, values))
    # bool is an int subclass: refuse it for INT and FLOAT unless the column is BOOL.
    if all(issubclass(t, allowed) for t in types) and (
            ctype == _BOOL or not any(issubclass(t, (bool, np.bool_)) for t in types)):
        return
    for i, v in enumerate(values):
        if not isinstance(v, allowed) or (ctype != _BOOL and isinstance(v, (bool, np.bool_))):
            raise SchemaError(f"stream '{stream}', row {i}, column '{name}': expected "
                              f"{ctype.upper()}, got {type(v).__name__} {v!r}")


def _check_ts(stream: str, ts: Any, n: int, clock_now: float, last_ts: float) -> np.ndarray:
    if ts is None:
        ts = clock_now
    if isinstance(ts, (int, float, np.integer, np.floating)) and \
            not isinstance(ts, (bool, np.bool_)):
        stamps = np.full(n, float(ts))
    else:
        try:
            stamps = np.asarray(ts, dtype=np.float64)
        except (TypeError, ValueError):
            raise SchemaError(f"stream '{stream}': ts must be None, a number, or one number "
                              f"per row, got {type(ts).__name__}") from None
        if stamps.ndim != 1 or len(stamps) != n:
            raise SchemaError(f"stream '{stream}': got {stamps.size} timestamps for {n} rows")
    if n == 0:
        return stamps
    # both rules in one compiled pass (no temporary arrays: ~4 us for 10,000 rows, where
    # numpy's whole-array tests took ~19 us in an insert); the row is found only on a fault
    bad = _ts_fault()(stamps if stamps.flags.c_contiguous else np.ascontiguousarray(stamps),
                      last_ts)
    if bad < 0:
        return stamps
    if not math.isfinite(stamps[bad]):
        raise SchemaError(f"stream '{stream}', row {bad}: ts {float(stamps[bad])} is not a "
                          "finite number of seconds")
    if bad == 0:
        raise SchemaError(f"stream '{stream}', row 0: ts {float(stamps[0])!r} is older than the "
                          f"stream's latest ts {last_ts!r}; timestamps may not decrease")
    raise SchemaError(f"stream '{stream}', row {bad}: ts {float(stamps[bad])!r} is older than "
                      f"row {bad - 1}'s ts {float(stamps[bad - 1])!r}; timestamps may not "
                      "decrease")


def _ts_fault() -> Any:
    """kernels.ts_fault, imported on first use: this module is also loaded without an
    engine (a client reading an archive), where importing numba would cost half a
    second for nothing."""
    global _TS_FAULT
    if _TS_FAULT is None:
        from psoup.kernels import ts_fault
        _TS_FAULT = ts_fault
    return _TS_FAULT


_TS_FAULT: Any = None
