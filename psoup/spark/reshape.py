"""`psoup archive reshape`: rewrite an archive's part files in the sampled layout.

Archives written before the sampled layout (psoup.archive.sampling), or by other tools,
hold their rows in tupleID order without draws: a TABLESAMPLE over them must read every
row. This Spark job rewrites each such part file in place, one task per file, in the
executors (nothing passes through the driver but a row count per file): the file is
read, checked (rows in tupleID order, the stream's schema), written beside itself as
``.tmp`` in runs cut into row groups by fresh draws, fsynced and renamed over the
original. The rows never change, only their order in the file and the draw column, so
the archive stays valid at every moment: a reshape cut short leaves each file in one
layout or the other, and running it again finishes the job (files already in the
sampled layout are skipped, on their footers).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from psoup.archive.layout import PART_NAME, check_part, stream_columns
from psoup.errors import ArchiveError
from psoup.spark.session import spark_error


@dataclass
class ReshapeReport:
    """What a reshape did: the files it rewrote and their rows, the part files already
    in the sampled layout, and the seconds it took."""

    rewritten: list[Path]
    rows: int
    already: int
    seconds: float


def reshape(root: str | Path, streams: Sequence[str] | None = None,
            master: str | None = None, conf: Mapping[str, str] | None = None,
            progress: Callable[[str], None] | None = None) -> ReshapeReport:
    """Rewrite every part file under the archive `root` (of `streams`, default all) that
    is not in the sampled layout. O(rows of those files), in the executors.

    Raises:
        ArchiveError: `root` holds no archive, a part file is damaged, out of tupleID
            order or without psoup's schema (naming it; the files rewritten before it
            stay rewritten, with the same rows).
    """
    import pyarrow.parquet as pq

    from psoup.archive.sampling import is_sampled

    began = time.perf_counter()
    root = Path(root).resolve()          # executors resolve paths from their own cwd
    if not root.is_dir():
        raise ArchiveError(f"{root} is not a directory")
    paths = sorted(p for p in root.glob("stream=*/date=*/part-*.parquet")
                   if PART_NAME.match(p.name)
                   and (streams is None or p.parent.parent.name[len("stream="):] in streams))
    if streams is not None:
        known = {p.parent.parent.name[len("stream="):] for p in paths}
        missing = [s for s in streams if s not in known]
        if missing:
            raise ArchiveError(f"{root} holds no part file of stream(s) {', '.join(missing)}")
    todo = []
    for path in paths:
        try:
            schema = pq.read_schema(path)
        except Exception as exc:
            raise ArchiveError(f"{path}: not a readable Parquet file ({exc})") from None
        if not is_sampled(schema):
            todo.append(path)
    if progress is not None:
        progress(f"{len(todo)} of {len(paths)} part files to rewrite in the sampled layout")
    rows = 0
    if todo:
        from psoup.spark.session import spark_session
        spark = spark_session(master, conf, progress)
        try:
            counts = (spark.sparkContext.parallelize([str(p) for p in todo], len(todo))
                      .map(rewrite_part).collect())
        except Exception as exc:        # Spark's errors: py4j / PySpark classes of many kinds
            raise ArchiveError(f"reshaping the archive under {root} failed: "
                               f"{spark_error(exc)}") from None
        rows = sum(counts)
    # the aggregate copies of part files that have none (an archive written without
    # them); a reshape keeps each file's rows, so the copies there stay right
    from psoup.archive.rollups import Rollups, folder_for
    for stream in sorted({p.parent.parent.name[len("stream="):] for p in paths}):
        Rollups(root, folder_for(root)).build(stream)
    return ReshapeReport(todo, rows, len(paths) - len(todo), time.perf_counter() - began)


def rewrite_part(path: str) -> int:
    """What each Spark task runs: part file `path` rewritten in the sampled layout (a
    ``.tmp`` beside it, fsynced, renamed over it); its number of rows. A file already
    in that layout is left alone.

    Raises:
        ValueError: the file lacks psoup's schema, or its rows are not in tupleID order.
    """
    from functools import partial

    import numpy as np
    import pyarrow.parquet as pq

    from psoup.archive.layout import TUPLE_ID_COLUMN
    from psoup.archive.sampling import is_sampled, write_runs
    from psoup.fsync import fsync_dir, write_whole

    target = Path(path)
    table = pq.read_table(target)
    if is_sampled(table.schema):
        return int(table.num_rows)
    columns = stream_columns(table.schema)
    if columns is None:
        raise ValueError(f"{target}: no psoup schema in its metadata (psoup.columns)")
    stream = target.parent.parent.name[len("stream="):]
    try:
        check_part(table.schema, target, stream, columns)
    except ArchiveError as exc:
        raise ValueError(str(exc)) from None
    ids = table.column(TUPLE_ID_COLUMN).to_numpy()
    if len(ids) > 1 and (np.diff(ids) <= 0).any():
        raise ValueError(f"{target}: its tuple_ids are not increasing")
    private = (target.stat().st_mode & 0o077) == 0
    write_whole(target, partial(write_runs, table, np.random.default_rng()), private)
    fsync_dir(target.parent)
    return int(table.num_rows)
