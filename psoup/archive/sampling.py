"""The archive's sampled layout: any fraction of a part file read as a uniform sample.

"Remembrance of Streams Past" (Sect. 4.1.3, *RandomizeThenSort*) stores a stream in
runs of blocks, each arriving tuple put in a block of its run drawn at random, each
block kept in time order, so that reading k of a run's R blocks reads a uniform sample
of rate k/R for k/R of the I/O, and the original order comes back by merging the
blocks. psoup maps that onto Parquet:

- every archived row carries a uniform random *draw* in [0, SAMPLE_SPACE), the column
  SAMPLE_COLUMN (int16);
- a part file is a sequence of *runs* (each flush of rows, at most `run_rows`), each
  cut into SAMPLE_GROUPS row groups by draw (group g holds the draws in
  [g, g + 1) x SAMPLE_SPACE / SAMPLE_GROUPS; a run under SAMPLE_GROUPS x
  MIN_GROUP_ROWS rows into fewer, each of a wider draw range), each row group in
  tupleID order;
- the sample of rate p is the rows whose draw is below `threshold(p)` (p rounded to a
  multiple of 1 / SAMPLE_SPACE): each row is in it with probability p, independently
  of the others (a Bernoulli sample), and a reader finds it in the row groups whose
  draw statistics start below the threshold, i.e. ceil(p x SAMPLE_GROUPS) of every
  run's SAMPLE_GROUPS, without reading the others (Spark and pyarrow both skip row
  groups by the statistics of a filter's column). SQL's SYSTEM sampling reads whole
  row groups: its rate is rounded up to a multiple of 1 / SAMPLE_GROUPS (`system_rate`).

Rows of one file are then not in tupleID order across row groups: `in_order` puts them
back (a stable sort of SAMPLE_GROUPS sorted runs per run). A part file without the
draw column (written before this layout, or by another tool) is read whole; `psoup
archive reshape` rewrites it in this layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from psoup.archive.layout import SAMPLE_COLUMN, TUPLE_ID_COLUMN
from psoup.archive.rates import MIN_GROUP_ROWS, SAMPLE_GROUPS, SAMPLE_SPACE


def draws(n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` uniform draws in [0, SAMPLE_SPACE), int16. O(n)."""
    return rng.integers(0, SAMPLE_SPACE, size=n, dtype=np.int16)


def sampled_schema(schema: pa.Schema) -> pa.Schema:
    """A part file's schema with the draw column last (the metadata kept)."""
    if SAMPLE_COLUMN in schema.names:
        return schema
    return schema.append(pa.field(SAMPLE_COLUMN, pa.int16()))


def write_runs(table: pa.Table, rng: np.random.Generator, sink: str | IO[bytes],
               run_rows: int = 1 << 17) -> None:
    """Write `table` (a part file's rows in tupleID order, without draws) to `sink` in
    the sampled layout: runs of at most `run_rows` rows, each cut into up to
    SAMPLE_GROUPS row groups by a fresh uniform draw per row (empty groups left out).
    O(rows log SAMPLE_GROUPS).

    Example:
        >>> import io, pyarrow.parquet as pq
        >>> sink = io.BytesIO()
        >>> t = pa.table({"ts": [0.0, 1.0, 2.0], "tuple_id": [5, 6, 7]})
        >>> write_runs(t, np.random.default_rng(1), sink)
        >>> back = pq.read_table(sink)
        >>> in_order(back).column("tuple_id").to_pylist(), SAMPLE_COLUMN in back.schema.names
        ([5, 6, 7], True)
    """
    import pyarrow.parquet as pq

    with pq.ParquetWriter(sink, sampled_schema(table.schema)) as writer:
        for a in range(0, table.num_rows, run_rows):
            write_run(writer, table.slice(a, run_rows), rng)


def write_run(writer: Any, table: pa.Table, rng: np.random.Generator) -> None:
    """Write `table` (rows in tupleID order) as one run of the sampled layout through
    an open `pq.ParquetWriter` of `sampled_schema`: its rows ordered by row group and
    then tupleID, one row group per `write_table` call. Rows keep the draws they carry
    in SAMPLE_COLUMN (a tier's matches keep the archive's, so that samples nest);
    without that column each gets a fresh one from `rng`. A run of fewer than
    SAMPLE_GROUPS x MIN_GROUP_ROWS rows is cut into fewer row groups (a power of two,
    each still one draw range; a run under 2 x MIN_GROUP_ROWS is one row group): a
    row group costs about 0.1 ms to write, which 16 of a few rows each (a tier's
    segment of a query matching little) would spend for nothing, since a sampled read
    of a file that small reads it all anyway. O(rows)."""
    if not table.num_rows:
        return
    if SAMPLE_COLUMN in table.schema.names:
        drawn = table.column(SAMPLE_COLUMN).to_numpy()
        table = table.drop_columns([SAMPLE_COLUMN])
    else:
        drawn = draws(table.num_rows, rng)
    groups = SAMPLE_GROUPS
    while groups > 1 and table.num_rows < groups * MIN_GROUP_ROWS:
        groups //= 2
    table = table.append_column(SAMPLE_COLUMN, pa.array(drawn)).cast(writer.schema)
    if groups == 1:
        writer.write_table(table, row_group_size=table.num_rows)
        return
    group = drawn // (SAMPLE_SPACE // groups)
    order = np.argsort(group, kind="stable")         # stable: tupleID order in a group
    bounds = np.searchsorted(group[order], np.arange(groups + 1)).tolist()
    ordered = table.take(pa.array(order))
    for a, b in zip(bounds, bounds[1:], strict=False):
        if b > a:
            writer.write_table(ordered.slice(a, b - a), row_group_size=b - a)


def is_sampled(schema: pa.Schema) -> bool:
    """True when a part file has the draw column (the sampled layout)."""
    return SAMPLE_COLUMN in schema.names


def in_order(table: pa.Table, key: str = TUPLE_ID_COLUMN) -> pa.Table:
    """A part file's rows (or several files' rows, concatenated) back in tupleID order
    (column `key`), without the draw column. O(n log runs): the sort is a merge of
    sorted runs.

    Example:
        >>> t = pa.table({"tuple_id": [3, 9, 1, 4], SAMPLE_COLUMN: pa.array([5, 9, 700, 900],
        ...                                                                 pa.int16())})
        >>> in_order(t).to_pydict()
        {'tuple_id': [1, 3, 4, 9]}
    """
    if SAMPLE_COLUMN not in table.schema.names:
        return table
    return _by_key(table.drop_columns([SAMPLE_COLUMN]), key)


def _by_key(table: pa.Table, key: str) -> pa.Table:
    """`table` in `key` order: a stable sort, which merges the sorted row groups of a
    run (O(n log runs)); the table itself when already in order (O(n))."""
    ids = table.column(key).to_numpy()
    if len(ids) > 1 and (np.diff(ids) < 0).any():
        table = table.take(pa.array(np.argsort(ids, kind="stable")))
    return table


def draws_of(raw: pa.Array | pa.ChunkedArray | None, tuple_ids: np.ndarray) -> np.ndarray:
    """Each row's draw in [0, SAMPLE_SPACE): its SAMPLE_COLUMN value, or for a row of a
    file written before the sampled layout (null, or no such column) a hash of its
    tupleID (splitmix64), uniform too but found only by reading every row.

    Example:
        >>> draws_of(pa.array([5, None], pa.int16()), np.array([0, 1])).tolist()[0]
        5
    """
    ids = tuple_ids.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = ids + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    hashed: NDArray[np.int64] = (z % np.uint64(SAMPLE_SPACE)).astype(np.int64)
    if raw is None:
        return hashed
    have: NDArray[np.int64] = raw.fill_null(-1).to_numpy().astype(np.int64)  # pyarrow: Any
    return np.where(have >= 0, have, hashed)


def read_below(path: Any, columns: Sequence[str] | None = None, limit: int = SAMPLE_SPACE,
               key: str = TUPLE_ID_COLUMN, keep_draws: bool = False) -> pa.Table:
    """The rows of Parquet file `path` whose draw is below `limit` (all for
    SAMPLE_SPACE; `threshold(rate)` for the sample of a rate), `columns` of them (None:
    all but the draws), in `key` order: only the row groups that can hold them are
    read. A file without draws is read whole, its draws hashed from `key` (`draws_of`).
    `keep_draws`: the draws are kept, as SAMPLE_COLUMN. O(rows read).

    Example:
        >>> import io
        >>> sink = io.BytesIO()
        >>> write_runs(pa.table({"ts": [0.0, 1.0], "tuple_id": [5, 6]}),
        ...            np.random.default_rng(1), sink)
        >>> read_below(sink).column("tuple_id").to_pylist()
        [5, 6]
    """
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    sampled = is_sampled(pf.schema_arrow)
    if columns is None:
        columns = [name for name in pf.schema_arrow.names if name != SAMPLE_COLUMN]
    wanted = list(dict.fromkeys([*columns, key] + ([SAMPLE_COLUMN] if sampled else [])))
    if sampled and limit < SAMPLE_SPACE:
        groups = [g for g in range(pf.metadata.num_row_groups) if _lowest(pf, g) < limit]
        table = pf.read_row_groups(groups, columns=wanted)
    else:
        table = pf.read(columns=wanted)
    if limit < SAMPLE_SPACE or keep_draws:
        drawn = draws_of(table.column(SAMPLE_COLUMN) if sampled else None,
                         table.column(key).to_numpy())
        if keep_draws:
            table = table.drop_columns([SAMPLE_COLUMN] if sampled else []).append_column(
                SAMPLE_COLUMN, pa.array(drawn.astype(np.int16)))
        if limit < SAMPLE_SPACE:
            table = table.filter(pa.array(drawn < limit))
    return _by_key(table, key).select([*columns] + ([SAMPLE_COLUMN] if keep_draws else []))


def _lowest(pf: Any, group: int) -> int:
    """The smallest draw in row group `group` of `pf` (0 without statistics)."""
    meta = pf.metadata.row_group(group)
    index = pf.schema_arrow.get_field_index(SAMPLE_COLUMN)
    stats = meta.column(index).statistics
    if stats is None or not stats.has_min_max:
        return 0
    return int(stats.min)
