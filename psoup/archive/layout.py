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

import numpy as np
import pyarrow as pa

from psoup.errors import ArchiveError, SchemaError
from psoup.query.model import TS, TUPLE_ID
from psoup.query.tokens import is_identifier

#: Arrow type of each psoup column type.
ARROW_TYPES = {"int": pa.int64(), "float": pa.float64(), "text": pa.string(),
               "bool": pa.bool_()}

#: Spark SQL type of each psoup column type.
SPARK_TYPES = {"int": "BIGINT", "float": "DOUBLE", "text": "STRING", "bool": "BOOLEAN"}

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


def stream_columns(schema: pa.Schema) -> list[tuple[str, str]] | None:
    """The psoup schema a part file carries in its metadata, None if it has none.

    Example:
        >>> stream_columns(arrow_schema("R", [("a", "int"), ("s", "text")]))
        [('a', 'int'), ('s', 'text')]
    """
    raw = (schema.metadata or {}).get(b"psoup.columns")
    if raw is None:
        return None
    return [(str(name), str(ctype)) for name, ctype in json.loads(raw)]


def arrow_schema(stream: str, columns: Sequence[tuple[str, str]]) -> pa.Schema:
    """The Arrow schema of a stream's part files, with the psoup schema as metadata.

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
        fields.append(pa.field(name, ARROW_TYPES[ctype]))
    metadata = {b"psoup.stream": stream.encode(),
                b"psoup.columns": json.dumps([[n, t] for n, t in columns]).encode()}
    return pa.schema(fields, metadata=metadata)


def part_columns(columns: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """(on-disk name, psoup type) of every column of a stream's part files, in order.

    Example:
        >>> part_columns([("a", "int")])
        [('ts', 'float'), ('tuple_id', 'int'), ('a', 'int')]
    """
    return [(TS_COLUMN, "float"), (TUPLE_ID_COLUMN, "int"), *columns]


def check_part(schema: pa.Schema, path: Path, stream: str,
               columns: Sequence[tuple[str, str]]) -> None:
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


def to_numpy(column: pa.Array | pa.ChunkedArray, ctype: str) -> np.ndarray:
    """An Arrow column as the numpy array psoup keeps for its type (TEXT: Python str
    objects, so that comparisons are by code point).

    Example:
        >>> to_numpy(pa.array(["x", "y"]), "text").dtype, to_numpy(pa.array([1]), "int")
        (dtype('O'), array([1]))
    """
    if ctype == "text":
        return np.array(column.to_pylist(), dtype=object)
    from psoup.stems.batch import DTYPES
    return column.to_numpy(zero_copy_only=False).astype(DTYPES[ctype], copy=False)
