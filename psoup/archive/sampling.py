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
  [g, g + 1) x SAMPLE_SPACE / SAMPLE_GROUPS), each row group in tupleID order;
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

import math
from typing import IO, Sequence

import numpy as np
import pyarrow as pa

from psoup.archive.layout import SAMPLE_COLUMN, TUPLE_ID_COLUMN

#: Draws are uniform in [0, SAMPLE_SPACE): sample rates are multiples of its inverse.
SAMPLE_SPACE = 1 << 10
#: Row groups per run of a part file: a read of rate p reads ceil(p x this) of them.
SAMPLE_GROUPS = 16
#: Draw values per row group.
GROUP_WIDTH = SAMPLE_SPACE // SAMPLE_GROUPS


def threshold(rate: float) -> int:
    """The draws below this are in the sample of `rate` (0 < rate <= 1): rate x
    SAMPLE_SPACE rounded to the nearest, at least 1. O(1).

    Example:
        >>> threshold(0.25), threshold(1.0), threshold(1e-9)
        (256, 1024, 1)
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"a sample rate is in (0, 1], not {rate}")
    return max(1, min(SAMPLE_SPACE, round(rate * SAMPLE_SPACE)))


def bernoulli_rate(rate: float) -> float:
    """The rate a BERNOULLI sample of `rate` really has (a multiple of 1/SAMPLE_SPACE).

    Example:
        >>> bernoulli_rate(0.1)
        0.099609375
    """
    return threshold(rate) / SAMPLE_SPACE


def system_rate(rate: float) -> float:
    """The rate a SYSTEM sample of `rate` has: whole row groups, so `rate` rounded up to
    a multiple of 1/SAMPLE_GROUPS.

    Example:
        >>> system_rate(0.1), system_rate(0.25)
        (0.125, 0.25)
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"a sample rate is in (0, 1], not {rate}")
    return min(SAMPLE_GROUPS, math.ceil(rate * SAMPLE_GROUPS - 1e-9)) / SAMPLE_GROUPS


def sample_rate(method: str, fraction: float) -> float:
    """The rate a TABLESAMPLE `method` (BERNOULLI or SYSTEM) of `fraction` reads at.

    Example:
        >>> sample_rate("SYSTEM", 0.3), sample_rate("BERNOULLI", 0.25)
        (0.3125, 0.25)
    """
    return system_rate(fraction) if method == "SYSTEM" else bernoulli_rate(fraction)


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


def write_run(writer, table: pa.Table, rng: np.random.Generator) -> None:
    """Write `table` (rows in tupleID order, without draws) as one run of the sampled
    layout through an open `pq.ParquetWriter` of `sampled_schema`: its rows ordered
    by row group and then tupleID, one row group per `write_table` call. O(rows)."""
    if not table.num_rows:
        return
    drawn = draws(table.num_rows, rng)
    group = drawn // GROUP_WIDTH
    order = np.argsort(group, kind="stable")         # stable: tupleID order in a group
    bounds = np.searchsorted(group[order], np.arange(SAMPLE_GROUPS + 1)).tolist()
    ordered = (table.append_column(SAMPLE_COLUMN, pa.array(drawn)).take(pa.array(order))
               .cast(writer.schema))
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            writer.write_table(ordered.slice(a, b - a), row_group_size=b - a)


def is_sampled(schema: pa.Schema) -> bool:
    """True when a part file has the draw column (the sampled layout)."""
    return SAMPLE_COLUMN in schema.names


def in_order(table: pa.Table) -> pa.Table:
    """A part file's rows (or several files' rows, concatenated) back in tupleID order,
    without the draw column. O(n log runs): the sort is a merge of sorted runs.

    Example:
        >>> t = pa.table({"tuple_id": [3, 9, 1, 4], SAMPLE_COLUMN: pa.array([5, 9, 700, 900],
        ...                                                                 pa.int16())})
        >>> in_order(t).to_pydict()
        {'tuple_id': [1, 3, 4, 9]}
    """
    if SAMPLE_COLUMN not in table.schema.names:
        return table
    table = table.drop_columns([SAMPLE_COLUMN])
    ids = table.column(TUPLE_ID_COLUMN).to_numpy()
    if len(ids) > 1 and (np.diff(ids) < 0).any():
        table = table.take(pa.array(np.argsort(ids, kind="stable")))
    return table


def read_sample(path, columns: Sequence[str] | None = None, rate: float = 1.0) -> pa.Table:
    """The rows of part file `path` in the sample of `rate`, in tupleID order, without
    the draw column: only the row groups that can hold them are read (a file without
    draws is read whole and, below rate 1, raises ValueError). O(rows read).
    """
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    sampled = is_sampled(pf.schema_arrow)
    wanted = None if columns is None else list(dict.fromkeys(
        [*columns, TUPLE_ID_COLUMN] + ([SAMPLE_COLUMN] if sampled else [])))
    if rate >= 1.0:
        table = pf.read(columns=wanted)
    elif not sampled:
        raise ValueError(f"{path} is not in the sampled layout (psoup archive reshape)")
    else:
        limit = threshold(rate)
        groups = [g for g in range(pf.metadata.num_row_groups) if _lowest(pf, g) < limit]
        table = pf.read_row_groups(groups, columns=wanted)
        keep = np.asarray(table.column(SAMPLE_COLUMN).to_numpy() < limit)
        table = table.filter(pa.array(keep))
    table = in_order(table)
    if columns is not None:
        table = table.select(list(columns))
    return table


def _lowest(pf, group: int) -> int:
    """The smallest draw in row group `group` of `pf` (0 without statistics)."""
    meta = pf.metadata.row_group(group)
    index = pf.schema_arrow.get_field_index(SAMPLE_COLUMN)
    stats = meta.column(index).statistics
    if stats is None or not stats.has_min_max:
        return 0
    return int(stats.min)
