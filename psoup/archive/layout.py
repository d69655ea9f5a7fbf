"""The archive's layout: everything psoup knows about a part file, in one place.

An archive is a Hive-partitioned Parquet tree, the contract between the engine that
writes it (psoup.archive.parquet), the Spark jobs that import, replay and evaluate it
(psoup.spark), and any other Parquet reader::

    root/stream=NAME/date=YYYY-MM-DD/part-{first tupleID:020d}-{last tupleID:020d}.parquet

Each file holds ``ts`` (float64), ``tuple_id`` (int64), the stream's columns in schema
order and, last, ``psoup_sample`` (int16: the sampled layout of psoup.archive.sampling,
whose row groups are each in tupleID order; a file without it has all its rows in
tupleID order); the psoup schema rides along in the key-value metadata
(``psoup.stream``, ``psoup.columns``). In memory psoup names the implicit columns `ts`
and `tupleID` (the language's names); on disk they are ``ts`` and ``tuple_id``
(`DISK_NAMES`), as Parquet readers expect snake_case.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from psoup.errors import ArchiveError, SchemaError
from psoup.query.model import TS, TUPLE_ID, ColumnType
from psoup.query.tokens import is_identifier

_INT, _FLOAT, _TEXT, _BOOL = ColumnType.INT, ColumnType.FLOAT, ColumnType.TEXT, ColumnType.BOOL

#: Arrow type of each psoup column type.
ARROW_TYPES: dict[ColumnType, pa.DataType] = {
    _INT: pa.int64(), _FLOAT: pa.float64(), _TEXT: pa.string(), _BOOL: pa.bool_()}

#: Spark SQL type of each psoup column type.
SPARK_TYPES = {_INT: "BIGINT", _FLOAT: "DOUBLE", _TEXT: "STRING", _BOOL: "BOOLEAN"}

#: The archive's names for the implicit columns.
TS_COLUMN, TUPLE_ID_COLUMN = "ts", "tuple_id"

#: The sampled layout's column (psoup.archive.sampling): each row's uniform random draw,
#: int16; a part file may have it, last, or not (written before that layout).
SAMPLE_COLUMN = "psoup_sample"

#: In-memory name -> on-disk name of the implicit columns.
DISK_NAMES = {TS: TS_COLUMN, TUPLE_ID: TUPLE_ID_COLUMN}

#: A part file's name: the first and the last tupleID it holds.
PART_NAME = re.compile(r"part-(\d{20})-(\d{20})\.parquet\Z")
#: A date partition holds one UTC day of a stream.
SECONDS_PER_DAY = 86400.0


def part_path(root: str | Path, stream: str, ts: float, first: int, last: int) -> Path:
    """Where the part file of `stream` holding tupleIDs `first`..`last`, the first of them
    stamped `ts`, lives under `root` (the module docstring's layout). O(1).

    Example:
        >>> part_path("arc", "R", 86400.5, 3, 9).as_posix()
        'arc/stream=R/date=1970-01-02/part-00000000000000000003-00000000000000000009.parquet'
    """
    day = np.datetime64(int(np.floor_divide(ts, SECONDS_PER_DAY)), "D")
    name = f"part-{first:020d}-{last:020d}.parquet"
    return Path(root) / f"stream={stream}" / f"date={day}" / name


def stream_columns(schema: pa.Schema) -> list[tuple[str, ColumnType]] | None:
    """The psoup schema a part file carries in its metadata, None if it has none.

    Raises:
        ValueError: a type that is not a psoup type (a file psoup did not write).

    Example:
        >>> [(c, t.value) for c, t in stream_columns(arrow_schema("R", [("a", "int")]))]
        [('a', 'int')]
    """
    raw = (schema.metadata or {}).get(b"psoup.columns")
    if raw is None:
        return None
    return [(str(name), ColumnType(ctype)) for name, ctype in json.loads(raw)]


def arrow_schema(stream: str, columns: Sequence[tuple[str, str]]) -> pa.Schema:
    """The Arrow schema of a stream's part files, with the psoup schema as metadata
    (each type by its name). `columns` pairs a name with a `ColumnType` or a type's name
    ("int"): any string, checked here.

    Raises:
        SchemaError: a bad stream name, an unknown type, or a column named ts or tuple_id.
    """
    if not is_identifier(stream):
        raise SchemaError(f"{stream!r} is not a valid stream name (letters, digits, _)")
    fields = [pa.field(TS_COLUMN, pa.float64()), pa.field(TUPLE_ID_COLUMN, pa.int64())]
    for name, ctype in columns:
        if ctype not in ARROW_TYPES:
            raise SchemaError(f"stream '{stream}', column '{name}': unknown type {ctype!r} "
                              f"(expected one of {', '.join(ARROW_TYPES)})")
        if name in (TS_COLUMN, TUPLE_ID_COLUMN, SAMPLE_COLUMN):
            raise SchemaError(f"stream '{stream}': column '{name}' collides with the "
                              f"archive's own '{name}' column")
        fields.append(pa.field(name, ARROW_TYPES[ColumnType(ctype)]))
    metadata = {b"psoup.stream": stream.encode(),
                b"psoup.columns": json.dumps([[n, str(t)] for n, t in columns]).encode()}
    return pa.schema(fields, metadata=metadata)


def part_columns(columns: Sequence[tuple[str, ColumnType]]) -> list[tuple[str, ColumnType]]:
    """(on-disk name, psoup type) of every column of a stream's part files, in order.

    Example:
        >>> [(c, str(t)) for c, t in part_columns([("a", ColumnType.INT)])]
        [('ts', 'float'), ('tuple_id', 'int'), ('a', 'int')]
    """
    return [(TS_COLUMN, _FLOAT), (TUPLE_ID_COLUMN, _INT), *columns]


def check_part(schema: pa.Schema, path: Path, stream: str,
               columns: Sequence[tuple[str, ColumnType]]) -> None:
    """A part file's Arrow schema against the stream's: exactly its columns (ts, tuple_id
    and the declared ones), each of its Arrow type, and maybe the sampled layout's draws
    (SAMPLE_COLUMN, int16). O(columns).

    Raises:
        ArchiveError: naming the file and the first column at fault.
    """
    have = {f.name: f.type for f in schema}
    declared = ", ".join(f"{c} {t.upper()}" for c, t in columns)
    for column, ctype in part_columns(columns):
        want, got = ARROW_TYPES[ctype], have.get(column)
        if got is None:
            raise ArchiveError(f"{path}: no column '{column}' (stream '{stream}' has "
                               f"{declared})")
        if got != want and not (want == pa.string() and got == pa.large_string()):
            raise ArchiveError(f"{path}: column '{column}' holds {got}, but stream "
                               f"'{stream}' declares it {ctype.upper()} ({want})")
    if SAMPLE_COLUMN in have and have[SAMPLE_COLUMN] != pa.int16():
        raise ArchiveError(f"{path}: column '{SAMPLE_COLUMN}' holds {have[SAMPLE_COLUMN]}, "
                           "not the sampled layout's int16 draws")
    extra = [c for c in have if c not in dict(part_columns(columns)) and c != SAMPLE_COLUMN]
    if extra:
        raise ArchiveError(f"{path}: column '{extra[0]}' is not a column of stream "
                           f"'{stream}' ({declared})")


def to_numpy(column: pa.Array | pa.ChunkedArray, ctype: ColumnType) -> NDArray[Any]:
    """An Arrow column as the numpy array psoup keeps for its type (TEXT: Python str
    objects, so that comparisons are by code point).

    Example:
        >>> to_numpy(pa.array(["x"]), ColumnType.TEXT).dtype, to_numpy(pa.array([1]), _INT)
        (dtype('O'), array([1]))
    """
    if ctype == _TEXT:
        return np.array(column.to_pylist(), dtype=object)
    from psoup.stems.batch import DTYPES
    values: NDArray[Any] = column.to_numpy(zero_copy_only=False)  # pyarrow: untyped
    return values.astype(DTYPES[ctype], copy=False)
