"""PSoup-P's sealed chunk rows, turned bit-sliced by the first find that reads them
(psoup.kernels.slice_row): answers stay those of the data through registrations on
sliced rows, unregistrations (slots reused), retention, drops and windows of every kind.
NoMat, which keeps no bitmap, answers the same queries as the reference."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
from hypothesis import given, settings

import psoup
from tests.support import sliced_rows

CHUNK = 64          # the smallest chunk whose rows can be sliced


def _engines(retain: str) -> tuple[psoup.Engine, psoup.Engine]:
    eng = psoup.Engine(mode="partial", chunk_rows=CHUNK, answer_cache_bytes=0)
    ref = psoup.Engine(mode="nomat", chunk_rows=CHUNK)
    for e in (eng, ref):
        e.execute("CREATE STREAM R (a INT, b INT)" + retain)
    return eng, ref


def test_a_find_slices_only_sealed_rows_and_answers_alike_before_and_after() -> None:
    eng, ref = _engines("")
    gen = np.random.default_rng(5)
    sql = [f"SELECT a, b FROM R WHERE a BETWEEN {lo} AND {lo + 20}" for lo in range(0, 90, 3)]
    mine = [eng.register(q) for q in sql]
    theirs = [ref.register(q) for q in sql]
    columns = {"a": gen.integers(0, 100, 202), "b": np.arange(202)}
    for e in (eng, ref):        # the same tuples: 3 whole chunks, then 10 rows of a 4th
        e.insert("R", columns, ts=np.arange(202.0))
    assert sliced_rows(eng) == 0, "nothing is sliced before a find reads it"
    first = [eng.invoke(h, now=300.0).rows for h in mine]
    assert sliced_rows(eng) == 3, "the one word row of each sealed chunk, not the open one"
    assert first == [eng.invoke(h, now=300.0).rows for h in mine]       # read sliced
    assert first == [ref.invoke(h, now=300.0).rows for h in theirs]
    # a query registered now sets its bits in the sliced rows; one unregistered clears
    # its own; the slot it frees is taken again
    eng.unregister(mine[4])
    ref.unregister(theirs[4])
    late = "SELECT a, b FROM R WHERE b >= 60 AND a < 50"
    mine[4], theirs[4] = eng.register(late), ref.register(late)
    assert [eng.invoke(h, now=300.0).rows for h in mine] == \
        [ref.invoke(h, now=300.0).rows for h in theirs]
    eng._check()
    # a stream made again starts at position 0: its chunks are open again until filled
    for e in (eng, ref):
        e.execute("DROP STREAM R CASCADE")
        e.execute("CREATE STREAM R (a INT, b INT)")
    handle, ref_handle = eng.register(sql[0]), ref.register(sql[0])
    for n, t0 in ((100, 0.0), (60, 100.0)):     # a find between the two batches
        columns = {"a": gen.integers(0, 30, n), "b": np.arange(n)}
        for e in (eng, ref):
            e.insert("R", columns, ts=t0 + np.arange(float(n)))
        assert eng.invoke(handle, now=200.0).rows == ref.invoke(ref_handle, now=200.0).rows
    eng._check()


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_sliced_rows_answer_as_the_data_does(data: st.DataObject) -> None:
    """Random inserts (whole chunks and pieces), registrations (one or a whole word of
    slots at a time), unregistrations and invocations over ROWS, time and whole-stream
    windows, with and without retention: PSoup-P answers as NoMat does."""
    retain = data.draw(st.sampled_from(["", " RETAIN 150 ROWS", " RETAIN 400 ROWS",
                                        " RETAIN 300 SECONDS"]))
    eng, ref = _engines(retain)
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    live: list[tuple[str, str]] = []
    ts = 0.0
    windows = ["", " BEGIN (NOW - 100 ROWS) END NOW", " BEGIN (NOW - 150 SECONDS) END NOW"]

    def query() -> str:
        lo = int(gen.integers(0, 100))
        return (f"SELECT a, b FROM R WHERE a BETWEEN {lo} AND {lo + int(gen.integers(0, 40))}"
                + windows[int(gen.integers(len(windows)))])

    for _ in range(data.draw(st.integers(4, 30))):
        op = data.draw(st.sampled_from(["insert", "insert", "register", "register_many",
                                        "unregister", "invoke"]))
        if op == "insert":
            n = data.draw(st.integers(1, 150))
            columns = {"a": gen.integers(0, 100, n), "b": gen.integers(0, 1000, n)}
            stamps = ts + np.arange(n, dtype=np.float64)
            ts += n
            for e in (eng, ref):
                e.insert("R", columns, ts=stamps)
        elif op in ("register", "register_many"):
            for _ in range(1 if op == "register" else data.draw(st.integers(2, 70))):
                sql = query()
                live.append((eng.register(sql), ref.register(sql)))
        elif op == "unregister" and live:
            mine, theirs = live.pop(data.draw(st.integers(0, len(live) - 1)))
            eng.unregister(mine)
            ref.unregister(theirs)
        elif op == "invoke" and live:
            for mine, theirs in live[::max(1, len(live) // 8)]:
                got, want = eng.invoke(mine, now=ts), ref.invoke(theirs, now=ts)
                assert got.rows == want.rows
                assert np.array_equal(got.tuple_ids, want.tuple_ids)
    for mine, theirs in live:
        assert eng.invoke(mine, now=ts).rows == ref.invoke(theirs, now=ts).rows
    eng._check()
