"""The Data SteM alone (PSoup Sect. 4.2.1): chunked columnar storage, retention by rows
and by seconds, the time index, reads by position in any order, probes over ranges and
position arrays, lookups by tupleID and PARTITION BY windows, with `_check` after every
append. The oracle is a plain list of every tuple appended, filtered in Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import hypothesis.strategies as st
import numpy as np
from hypothesis import given

from psoup.query import compile_statement
from psoup.query.model import Query, StreamSchema
from psoup.stems.batch import make_batch
from psoup.stems.data_stem import DataSteM
from psoup.stems.predicates import source_mask
from psoup.stems.span import Span

#: A stream's RETAIN clause, its batches as (rows of (a, t), ts steps), and chunk rows.
History: TypeAlias = tuple[str, list[tuple[list[tuple[int, str]], list[float]]], int]


def _stem(retain: str, chunk_rows: int) -> DataSteM:
    schema = compile_statement(f"CREATE STREAM R (a INT, t TEXT){retain}", {})
    assert isinstance(schema, StreamSchema)
    return DataSteM(schema, chunk_rows)


@st.composite
def histories(draw: st.DrawFn) -> History:
    retain = draw(st.sampled_from(["", " RETAIN 5 ROWS", " RETAIN 13 ROWS",
                                   " RETAIN 3 SECONDS", " RETAIN 10 SECONDS"]))
    batches: list[tuple[list[tuple[int, str]], list[float]]] = []
    for _ in range(draw(st.integers(1, 8))):
        n = draw(st.integers(1, 12))
        rows = [(draw(st.integers(0, 5)), draw(st.sampled_from(["x", "y", "é"])))
                for _ in range(n)]
        steps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 4.0]), min_size=n,
                              max_size=n))
        batches.append((rows, steps))
    return retain, batches, draw(st.sampled_from([1, 2, 3, 8]))


def _retained(all_rows: list[tuple[Any, ...]], retain: str) -> list[tuple[Any, ...]]:
    """The oracle's retained rows: (position, ts, tid, a, t)."""
    if retain.endswith("ROWS"):
        return all_rows[-int(retain.split()[1]):]
    if retain.endswith("SECONDS"):
        latest = all_rows[-1][1]
        return [r for r in all_rows if r[1] >= latest - float(retain.split()[1])]
    return all_rows


@given(histories(), st.booleans())
def test_reads_probes_and_windows_match_the_retained_tuples(history: History,
                                                            deferred: bool) -> None:
    # deferred: the batch's values copied by the callable `append` leaves (as the Eddy
    # runs it beside a split probe), when none of its positions leaves retention at once
    retain, batches, chunk_rows = history
    stem = _stem(retain, chunk_rows)
    all_rows: list[tuple[Any, ...]] = []
    ts = 1000.0
    for rows, steps in batches:
        stamps: list[float] = []
        for step in steps:
            ts += step
            stamps.append(ts)
        batch = make_batch(stem.schema, rows, stamps, 0.0, stem.last_ts)
        first = len(all_rows)
        later: list[Callable[[], None]] | None = [] if deferred else None
        p0 = stem.append(batch, np.arange(first, first + len(rows)) * 3, later)  # ids grow
        assert p0 == first
        for task in later or ():
            task()
        all_rows += [(first + i, stamps[i], (first + i) * 3, *rows[i]) for i in range(len(rows))]
        stem._check()
        kept = _retained(all_rows, retain)
        assert (stem.horizon, stem.n) == (kept[0][0], len(all_rows))
        positions = np.array([r[0] for r in kept])
        # reads in order and in any order, repeats allowed
        got = stem.take(["a", "t", "ts", "tupleID"], positions)
        assert got["a"].tolist() == [r[3] for r in kept]
        assert got["t"].tolist() == [r[4] for r in kept]
        shuffled = np.concatenate([positions[::-1], positions[:2]])
        by_pos = {r[0]: r for r in kept}
        assert stem.column("tupleID", shuffled, any_order=True).tolist() == \
            [by_pos[p][2] for p in shuffled.tolist()]
        # the time index
        lo, hi = kept[0][1] + 0.5, all_rows[-1][1]
        p, q = stem.time_range(lo, hi)
        assert list(range(p, q)) == [r[0] for r in kept if lo <= r[1] <= hi]
        # lookups by tupleID
        assert stem.lookup(kept[0][2]) == kept[0][0]
        assert stem.lookup(kept[0][2] + 1) is None
        # a probe over a range and over an array of positions
        query = compile_statement("SELECT a FROM R WHERE a >= 2 AND t != 'y'",
                                  {"R": stem.schema})
        assert isinstance(query, Query)
        source = query.sources[0]
        want = [r[0] for r in kept if r[3] >= 2 and r[4] != "y"]
        assert stem.probe(source).tolist() == want
        assert stem.probe(source, Span.range(0, stem.n)).tolist() == want
        every_other = positions[::2]
        assert stem.probe(source, Span.of(every_other)).tolist() == \
            [p for p in want if p in set(every_other.tolist())]
        # PARTITION BY a ROWS 1: the newest retained tuple of each value of a
        newest: dict[int, int] = {}
        for r in kept:
            newest[r[3]] = r[0]
        assert stem.partition_window(["a"], 1).tolist() == sorted(newest.values())


def test_probe_with_a_value_index_agrees_with_a_scan() -> None:
    """Sealed chunks sort each column on first use; a selective predicate reads the index
    instead of scanning (INDEX_SELECTIVITY)."""
    stem = _stem("", 64)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 1000, 640)
    cols = {"a": a, "t": np.array(["x"] * 640, dtype=object)}
    stem.append(make_batch(stem.schema, cols, np.arange(640.0), 0.0, stem.last_ts),
                np.arange(640))
    query = compile_statement("SELECT a FROM R WHERE a BETWEEN 10 AND 20", {"R": stem.schema})
    assert isinstance(query, Query)
    got = stem.probe(query.sources[0])
    assert got.tolist() == np.flatnonzero(source_mask(query.sources[0], cols, 640)).tolist()
    stem._check()                                  # the built indices sort their chunks


def test_oldest_tuple_id_is_the_first_held_in_memory() -> None:
    stem = _stem(" RETAIN 3 ROWS", 2)
    assert stem.oldest_tuple_id(default=42) == 42
    rows = [(i, "x") for i in range(7)]
    stem.append(make_batch(stem.schema, rows, 1.0, 0.0, stem.last_ts), np.arange(10, 17))
    # retention keeps positions 4..6; chunks of 2 hold 4..6 from position 4
    assert (stem.horizon, stem.oldest, stem.oldest_tuple_id(0)) == (4, 4, 14)


def test_dropped_chunks_are_reused_unless_their_memory_is_held_elsewhere() -> None:
    stem = _stem(" RETAIN 4 ROWS", 4)

    def put(start: int) -> None:
        stem.append(make_batch(stem.schema, [(start + i, "x") for i in range(4)],
                               float(start), 0.0, stem.last_ts), np.arange(start, start + 4))
        stem._check()

    put(0)
    first = stem._chunks[0]
    put(4)                                  # chunk 0 falls below the horizon: a spare
    put(8)
    assert stem._chunks[-1] is first, "the dropped chunk holds the new rows"
    held = stem._chunks[-1].cols["a"][:4]   # a view of a chunk's memory, kept outside
    put(12)
    put(16)                                 # the held chunk is dropped, not reused
    assert held.tolist() == [8, 9, 10, 11]
    assert all(c.cols["a"].base is not held.base for c in stem._chunks + stem._spare)
    assert stem.rows(stem.horizon, stem.n)["a"].tolist() == [16, 17, 18, 19]


_FACTORS = st.sampled_from([
    "a >= {i}", "a < {i}", "a BETWEEN {i} AND {j}", "a != {i}", "a IN ({i}, {j})",
    "x > {f}", "x <= {f}", "x >= {f} AND x < {g}", "x != {f}", "b > {i} AND b <= {j}",
    "a < b", "t = 'y'", "ok = TRUE",
])


@given(st.data(), st.sampled_from([3, 64, 100, 256]), st.integers(1, 300))
def test_a_probe_over_a_range_agrees_with_the_factors_evaluated_one_by_one(
        data: st.DataObject, cap: int, n: int) -> None:
    """The compiled interval scan of a range (INT and FLOAT columns, open and closed
    bounds, infinities, 64-row groups cut by chunk ends and by the range) with what it leaves to
    the checks after it (sets, `!=` lists, TEXT and BOOL columns, multi-column factors),
    against every factor tested in Python."""
    schema = compile_statement(
        "CREATE STREAM R (a INT, b INT, x FLOAT, t TEXT, ok BOOL) RETAIN 250 ROWS", {})
    assert isinstance(schema, StreamSchema)
    stem = DataSteM(schema, cap)
    small = st.integers(-3, 3)
    floats = st.sampled_from([-1.5, -0.0, 0.0, 0.5, 1.0, 2.0, float("inf"), -float("inf")])
    cols = {"a": np.array(data.draw(st.lists(small, min_size=n, max_size=n)), np.int64),
            "b": np.array(data.draw(st.lists(small, min_size=n, max_size=n)), np.int64),
            "x": np.array(data.draw(st.lists(floats, min_size=n, max_size=n)), np.float64),
            "t": np.array(data.draw(st.lists(st.sampled_from("xy"), min_size=n,
                                             max_size=n)), dtype=object),
            "ok": np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))}
    stem.append(make_batch(schema, cols, np.arange(float(n)), 0.0, stem.last_ts),
                np.arange(n))
    chosen = data.draw(st.lists(_FACTORS, min_size=1, max_size=4))
    where = " AND ".join(f.format(i=data.draw(small), j=data.draw(small),
                                  f=data.draw(st.sampled_from([-1.5, 0, 0.5, 1, 2])),
                                  g=data.draw(st.sampled_from([0, 1, 2.5])))
                         for f in chosen)
    query = compile_statement(f"SELECT a FROM R WHERE {where}", {"R": schema})
    assert isinstance(query, Query)
    source = query.sources[0]
    p0 = data.draw(st.integers(0, n))
    p1 = data.draw(st.integers(p0, n))
    span = Span.range(p0, p1)
    lo = max(p0, stem.horizon)
    mask = source_mask(source, {c: v[lo:p1] for c, v in cols.items()}, max(p1 - lo, 0))
    want = (np.flatnonzero(mask) + lo).tolist() if p1 > lo else []
    assert stem.probe(source, span).tolist() == want, where
