"""Join queries: the PSoup walkthroughs (Sect. 3.2.2, Figs. 4 and 5), duality, self-joins,
N-way joins, join factors, windows over joins, `since` cursors, and a differential test
of every engine mode and routing policy against DuckDB.

Join answer semantics (docs/language.md, docs/semantics.md): the rows are every combination
of tuples, one per FROM item, that satisfies the WHERE clause, with every component
inside its item's window at invocation time and still retained; ordered by the earliest
component ts, then by the component tupleIDs in FROM order. `Result.ts` is that earliest
ts and `Result.tuple_ids` an (n, k) int64 array, one tupleID per FROM item.

Expected answers in the unit tests are literals worked out by hand from the data (the
comments show the reasoning), never copied from psoup's output.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import event, given, settings

import psoup
from psoup.options import ROUTING_NAMES, ModeName, RoutingName
from psoup.results.result import Changes, Result
from tests.oracles import JoinOracle, as_triples, expected_changes
from tests.strategies import Scenario, join_scenarios
from tests.support import Clock, create, insert_stepped

ROUTINGS: tuple[RoutingName, ...] = ROUTING_NAMES
ENGINE_KINDS = [(m, r) for m in psoup.MODES for r in ROUTINGS]

#: The `make_engine` fixture: make(clock=None, chunk_rows=2) -> an engine of one kind.
MakeEngine: TypeAlias = Callable[..., psoup.Engine]
#: The `fig4` fixture: the engine, the handles of FIG4_QUERIES, tupleID -> paper ID.
Fig4: TypeAlias = tuple[psoup.Engine, dict[int, str], dict[int, int]]
#: The `rs` fixture: the engine, tupleID -> the test's name of the tuple.
RS: TypeAlias = tuple[psoup.Engine, dict[int, str]]


@pytest.fixture(params=ENGINE_KINDS, ids=[f"{m}-{r}" for m, r in ENGINE_KINDS])
def make_engine(request: pytest.FixtureRequest) -> MakeEngine:
    """A factory of engines of one (mode, routing); chunk_rows=2 so that joins read
    across several storage chunks."""
    mode, routing = request.param

    def make(clock: Clock | None = None, chunk_rows: int = 2) -> psoup.Engine:
        return psoup.Engine(mode=mode, routing=routing, clock=clock or Clock(100.0),
                            chunk_rows=chunk_rows)
    return make


def pairs(result: Result, paper_id: Mapping[int, Any]) -> list[tuple[Any, ...]]:
    """The answer's tupleID combinations, translated to the test's own tuple names."""
    assert result.tuple_ids.dtype == np.int64
    assert result.tuple_ids.ndim == 2 and result.tuple_ids.shape[0] == len(result.rows)
    return [tuple(paper_id[t] for t in row) for row in result.tuple_ids.tolist()]


def insert(eng: psoup.Engine, stream: str, named_rows: Mapping[Any, tuple[Any, ...]],
           ts: float | list[float], names: dict[int, Any]) -> list[int]:
    """Insert rows and remember engine tupleID -> the test's name for each row."""
    ids: list[int] = eng.insert(stream, list(named_rows.values()), ts=ts).tolist()
    names.update(zip(ids, named_rows, strict=True))
    return ids


# ----------------------------------------------------------------------------------
# PSoup Figs. 4 and 5: query 23 = R.a < 5 AND R.a > S.b AND S.b > 1
#
# The SteMs hold R and S tuples with tupleIDs up to 54 and queries up to 22. Tuple
# names below are the paper-style IDs; each tuple's ts equals its ID.

FIG4_R = {48: (4,), 49: (5,), 50: (3,), 51: (2,)}          # R(a)
FIG4_S = {52: (2,), 53: (1,), 54: (3,)}                    # S(b)
FIG4_QUERIES = {
    20: "SELECT * FROM R, S WHERE R.a = S.b",
    21: "SELECT * FROM R, S WHERE R.a > S.b + 1",
    22: "SELECT * FROM R WHERE R.a < 5",                  # a selection query, same SteMs
}
QUERY_23 = "SELECT * FROM R, S WHERE R.a < 5 AND R.a > S.b AND S.b > 1"


@pytest.fixture
def fig4(make_engine: MakeEngine) -> Fig4:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (b INT)")
    handles = {qid: eng.register(sql) for qid, sql in FIG4_QUERIES.items()}
    names: dict[int, int] = {}
    insert(eng, "R", FIG4_R, [float(t) for t in FIG4_R], names)
    insert(eng, "S", FIG4_S, [float(t) for t in FIG4_S], names)
    return eng, handles, names


def test_fig4_standing_join_queries_hold_their_pairs(fig4: Fig4) -> None:
    eng, handles, names = fig4
    # 20, R.a = S.b: 50 (a=3) with 54 (b=3); 51 (a=2) with 52 (b=2). Earliest ts 50, 51.
    assert pairs(eng.invoke(handles[20]), names) == [(50, 54), (51, 52)]
    # 21, R.a > S.b + 1: 48 (4 > 3, 4 > 2, not 4 > 4) -> 52, 53; 49 (5 > 3, 2, 4) -> all;
    # 50 (3 > 3 no, 3 > 2 yes, 3 > 4 no) -> 53; 51 (2 > 3, 2 > 2, 2 > 4) -> none.
    assert pairs(eng.invoke(handles[21]), names) == [
        (48, 52), (48, 53), (49, 52), (49, 53), (49, 54), (50, 53)]
    assert [names[t] for t in eng.invoke(handles[22]).tuple_ids.tolist()] == [48, 50, 51]


def test_fig4_new_join_query_over_stored_data(fig4: Fig4) -> None:
    eng, _, names = fig4
    h23 = eng.register(QUERY_23)
    got = eng.invoke(h23)
    # R.a < 5 keeps 48 (4), 50 (3), 51 (2) (not 49: a=5); S.b > 1 keeps 52 (2), 54 (3)
    # (not 53: b=1). R.a > S.b: 48 -> 52 (4>2), 54 (4>3); 50 -> 52 (3>2), not 54 (3>3);
    # 51 -> neither (2>2, 2>3 fail).
    assert pairs(got, names) == [(48, 52), (48, 54), (50, 52)]
    assert got.columns == ["R.a", "S.b"]
    assert got.rows == [(4, 2), (4, 3), (3, 2)]
    assert got.ts.tolist() == [48.0, 48.0, 50.0]          # the earliest component ts


def test_fig5_new_r_tuple_joins_stored_s_tuples(fig4: Fig4) -> None:
    eng, _, names = fig4
    h23 = eng.register(QUERY_23)
    insert(eng, "R", {55: (4,)}, 55.0, names)
    got = eng.invoke(h23)
    # 55 (a=4 < 5) joins the S tuples with 1 < b < 4: 52 (b=2), 54 (b=3). Their earliest
    # ts is the S tuple's (52, 54), so they come after the old pairs (earliest 48, 50).
    assert pairs(got, names) == [(48, 52), (48, 54), (50, 52), (55, 52), (55, 54)]
    assert got.ts.tolist() == [48.0, 48.0, 50.0, 52.0, 54.0]
    assert got.rows[-2:] == [(4, 2), (4, 3)]


def test_fig5_new_r_tuple_failing_its_local_factor_adds_nothing(fig4: Fig4) -> None:
    eng, _, names = fig4
    h23 = eng.register(QUERY_23)
    insert(eng, "R", {55: (5,)}, 55.0, names)     # R.a < 5 fails: no hybrid struct
    assert pairs(eng.invoke(h23), names) == [(48, 52), (48, 54), (50, 52)]


def test_fig5_new_s_tuple_joins_stored_r_tuples(fig4: Fig4) -> None:
    eng, _, names = fig4
    h23 = eng.register(QUERY_23)
    insert(eng, "S", {55: (2,)}, 55.0, names)
    # 55 (b=2 > 1) joins the R tuples with 2 < a < 5: 48 (a=4), 50 (a=3). Earliest ts is
    # the R tuple's, so (48, 55) sorts after (48, 54) by S tupleID and before 50's pairs.
    got = eng.invoke(h23)
    assert pairs(got, names) == [(48, 52), (48, 54), (48, 55), (50, 52), (50, 55)]
    assert got.ts.tolist() == [48.0, 48.0, 48.0, 50.0, 50.0]


def test_fig5_new_tuple_updates_every_standing_join_query(fig4: Fig4) -> None:
    eng, handles, names = fig4
    handles[23] = eng.register(QUERY_23)
    insert(eng, "R", {55: (4,)}, 55.0, names)
    # 20 (R.a = S.b): no S tuple has b=4 -> unchanged.
    assert pairs(eng.invoke(handles[20]), names) == [(50, 54), (51, 52)]
    # 21 (R.a > S.b + 1): 4 > 3 (52), 4 > 2 (53), not 4 > 4 (54).
    assert pairs(eng.invoke(handles[21]), names) == [
        (48, 52), (48, 53), (49, 52), (49, 53), (49, 54), (50, 53), (55, 52), (55, 53)]
    # 22 (selection R.a < 5) gets the tuple itself.
    assert [names[t] for t in eng.invoke(handles[22]).tuple_ids.tolist()] == [48, 50, 51, 55]
    assert pairs(eng.invoke(handles[23]), names)[-2:] == [(55, 52), (55, 54)]


# ----------------------------------------------------------------------------------
# Duality (docs/design.md, "Invariants", 2) for joins

DUALITY_QUERIES = [
    "SELECT * FROM R, S WHERE R.a = S.b AND R.c > 0",
    "SELECT * FROM R, S WHERE R.a < S.b - 1 AND S.d != 2",
    "SELECT r1.a, r2.c FROM R r1, R r2 WHERE r1.a = r2.c",
    "SELECT * FROM R, S, T WHERE R.a = S.b AND S.d <= T.e + 1 AND T.e > 0",
    "SELECT DISTINCT R.a FROM R, S WHERE R.c >= S.d",
    "SELECT * FROM R, S WHERE R.ts <= S.ts + 1 AND R.a = S.b",
    "SELECT * FROM R [ROWS 4], S [RANGE 3 SECONDS] WHERE R.a = S.b",
    "SELECT * FROM R, S WHERE R.a = S.b BEGIN NOW - 4 END NOW",
]


def duality_batches(seed: int) -> list[tuple[str, list[tuple[int, int]], list[float]]]:
    """Twelve batches of 1-4 rows, to R, S, T in turn, timestamps rising 0-0.5 s a row."""
    rng = random.Random(seed)
    out: list[tuple[str, list[tuple[int, int]], list[float]]] = []
    ts = 10.0
    for i in range(12):
        stream = "RST"[i % 3]
        rows = [(rng.randint(0, 3), rng.randint(0, 3)) for _ in range(rng.randint(1, 4))]
        stamps: list[float] = []
        for _ in rows:
            ts += rng.choice([0.0, 0.5])
            stamps.append(ts)
        out.append((stream, rows, stamps))
    return out


@pytest.mark.parametrize("sql", DUALITY_QUERIES)
@pytest.mark.parametrize("seed", [1, 3])
def test_join_query_before_or_after_the_data_gives_the_same_answer(make_engine: MakeEngine,
                                                                   sql: str, seed: int) -> None:
    batches = duality_batches(seed)
    answers = []
    for register_at in (0, len(batches) // 2, len(batches)):   # first, midway, last
        eng = make_engine(clock=Clock(20.0))
        eng.execute("CREATE STREAM R (a INT, c INT)")
        eng.execute("CREATE STREAM S (b INT, d INT)")
        eng.execute("CREATE STREAM T (e INT, g INT)")
        handle = None
        for i, (stream, rows, stamps) in enumerate(batches):
            if i == register_at:
                handle = eng.register(sql)
            eng.insert(stream, rows, ts=stamps)
        handle = handle or eng.register(sql)
        got = eng.invoke(handle, now=max(t for *_, stamps in batches for t in stamps))
        answers.append((got.rows, got.ts.tolist(), got.tuple_ids.tolist()))
    assert answers[0] == answers[1] == answers[2]
    assert answers[0][0], "the data should give this query some rows"


# ----------------------------------------------------------------------------------
# Self-joins

SELF_JOIN = "SELECT r1.tupleID, r2.tupleID FROM R r1, R r2 WHERE r1.a = r2.b"
#     name: (a, b)
SELF_ROWS = {"t0": (1, 1), "t1": (2, 1), "t2": (1, 2)}
# r1.a = r2.b: t0 (a=1) -> r2 with b=1: t0 itself and t1; t1 (a=2) -> t2 (b=2);
# t2 (a=1) -> t0, t1.
SELF_PAIRS = {("t0", "t0"), ("t0", "t1"), ("t1", "t2"), ("t2", "t0"), ("t2", "t1")}


@pytest.mark.parametrize("query_first", [True, False])
def test_self_join_within_one_batch_includes_a_tuple_with_itself(make_engine: MakeEngine,
                                                                 query_first: bool) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT, b INT)")
    h = eng.register(SELF_JOIN) if query_first else None
    names: dict[int, str] = {}
    insert(eng, "R", SELF_ROWS, 5.0, names)              # one batch, one ts
    h = h or eng.register(SELF_JOIN)
    got = eng.invoke(h)
    # Equal ts everywhere: the order is by r1's tupleID, then r2's.
    assert pairs(got, names) == [("t0", "t0"), ("t0", "t1"), ("t1", "t2"), ("t2", "t0"),
                                 ("t2", "t1")]
    assert set(pairs(got, names)) == SELF_PAIRS
    assert got.columns == ["r1.tupleID", "r2.tupleID"]
    assert got.rows == [tuple(r) for r in got.tuple_ids.tolist()]


@pytest.mark.parametrize("register_at", [0, 1, 2])
def test_self_join_across_batches_finds_every_pair_once(make_engine: MakeEngine,
                                                        register_at: int) -> None:
    """t0 arrives first (ts 1), then t1 and t2 together (ts 2); the query is registered
    before, between or after the batches. A pair of a new and an old tuple must appear
    once whichever of r1/r2 the new tuple plays, and new-new pairs once too."""
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT, b INT)")
    names: dict[int, str] = {}
    h = eng.register(SELF_JOIN) if register_at == 0 else None
    insert(eng, "R", {"t0": SELF_ROWS["t0"]}, 1.0, names)
    h = h or (eng.register(SELF_JOIN) if register_at == 1 else None)
    insert(eng, "R", {"t1": SELF_ROWS["t1"], "t2": SELF_ROWS["t2"]}, 2.0, names)
    h = h or eng.register(SELF_JOIN)
    got = eng.invoke(h)
    # earliest ts 1: every pair with t0: (t0,t0), (t0,t1), (t2,t0), by r1 then r2 tupleID;
    # earliest ts 2: (t1,t2), (t2,t1).
    assert pairs(got, names) == [("t0", "t0"), ("t0", "t1"), ("t2", "t0"), ("t1", "t2"),
                                 ("t2", "t1")]
    assert got.ts.tolist() == [1.0, 1.0, 1.0, 2.0, 2.0]


def test_self_join_strict_inequality_excludes_the_tuple_with_itself(
        make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    strict = eng.register("SELECT * FROM R r1, R r2 WHERE r1.a < r2.a")
    loose = eng.register("SELECT * FROM R r1, R r2 WHERE r1.a <= r2.a")
    names: dict[int, str] = {}
    insert(eng, "R", {"x": (1,)}, 1.0, names)
    assert pairs(eng.invoke(strict), names) == []           # 1 < 1 is false
    assert pairs(eng.invoke(loose), names) == [("x", "x")]  # 1 <= 1
    insert(eng, "R", {"y": (2,)}, 2.0, names)
    # strict: only (x, y) (1 < 2). loose: (x,x), (x,y) at earliest 1; (y,y) at 2.
    assert pairs(eng.invoke(strict), names) == [("x", "y")]
    assert pairs(eng.invoke(loose), names) == [("x", "x"), ("x", "y"), ("y", "y")]


def test_self_join_items_have_their_own_local_factors(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT, kind TEXT)")
    h = eng.register("SELECT r1.a, r2.a FROM R r1, R r2 "
                     "WHERE r1.kind = 'buy' AND r2.kind = 'sell' AND r1.a = r2.a")
    names: dict[int, str] = {}
    insert(eng, "R", {"b1": (1, "buy"), "s1": (1, "sell"), "b2": (2, "buy")}, 1.0, names)
    insert(eng, "R", {"s2": (2, "sell"), "s1b": (1, "sell")}, 2.0, names)
    got = eng.invoke(h)
    # buys b1 (1), b2 (2); sells s1 (1), s2 (2), s1b (1). Equal a: (b1,s1) ts 1,
    # (b1,s1b) earliest 1, (b2,s2) earliest 1 (b2's ts).
    assert pairs(got, names) == [("b1", "s1"), ("b1", "s1b"), ("b2", "s2")]
    assert got.columns == ["r1.a", "r2.a"]
    assert got.rows == [(1, 1), (1, 1), (2, 2)]


def test_self_join_with_one_unaliased_item(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT, b INT)")
    h = eng.register("SELECT * FROM R, R r2 WHERE R.a = r2.b")
    names: dict[int, str] = {}
    insert(eng, "R", SELF_ROWS, 5.0, names)
    got = eng.invoke(h)
    assert got.columns == ["R.a", "R.b", "r2.a", "r2.b"]
    assert set(pairs(got, names)) == SELF_PAIRS


# ----------------------------------------------------------------------------------
# N-way joins

@pytest.fixture
def rst(make_engine: MakeEngine) -> psoup.Engine:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (b INT)")
    eng.execute("CREATE STREAM T (c INT)")
    return eng


def test_three_way_chain_join(rst: psoup.Engine) -> None:
    eng = rst
    h = eng.register("SELECT * FROM R, S, T WHERE R.a = S.b AND S.b < T.c")
    names: dict[int, str] = {}
    insert(eng, "R", {"r0": (1,), "r1": (2,)}, 1.0, names)
    insert(eng, "S", {"s0": (1,), "s1": (2,), "s2": (3,)}, 2.0, names)
    insert(eng, "T", {"t0": (2,), "t1": (3,)}, 3.0, names)
    got = eng.invoke(h)
    # R.a = S.b: (r0,s0), (r1,s1); S.b < T.c: s0 (1) -> t0, t1; s1 (2) -> t1.
    assert pairs(got, names) == [("r0", "s0", "t0"), ("r0", "s0", "t1"), ("r1", "s1", "t1")]
    assert got.columns == ["R.a", "S.b", "T.c"]
    assert got.rows == [(1, 1, 2), (1, 1, 3), (2, 2, 3)]
    assert got.tuple_ids.shape == (3, 3)


def test_three_way_join_new_tuple_in_the_middle_item(rst: psoup.Engine) -> None:
    eng = rst
    h = eng.register("SELECT * FROM R, S, T WHERE R.a = S.b AND S.b < T.c")
    names: dict[int, str] = {}
    insert(eng, "R", {"r0": (1,), "r1": (2,)}, 1.0, names)
    insert(eng, "T", {"t0": (2,), "t1": (3,)}, 1.0, names)
    assert pairs(eng.invoke(h), names) == []
    insert(eng, "S", {"s1": (2,)}, 2.0, names)
    # s1 (b=2) joins r1 (a=2) and t1 (3 > 2); not t0 (2 < 2 fails).
    assert pairs(eng.invoke(h), names) == [("r1", "s1", "t1")]
    insert(eng, "S", {"s0": (1,)}, 3.0, names)
    # s0 (b=1) joins r0 and both t0, t1; r0's ts 1 ties with r1's, then r tupleID.
    assert pairs(eng.invoke(h), names) == [("r0", "s0", "t0"), ("r0", "s0", "t1"),
                                           ("r1", "s1", "t1")]


def test_three_way_self_join(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    h = eng.register("SELECT x.a, y.a, z.a FROM R x, R y, R z WHERE x.a < y.a AND y.a < z.a")
    names: dict[int, str] = {}
    insert(eng, "R", {"p": (1,), "q": (2,)}, 1.0, names)
    insert(eng, "R", {"u": (3,), "v": (2,)}, 2.0, names)
    got = eng.invoke(h)
    # increasing triples of a: 1 < 2 < 3 with the 2 being q or v: (p, q, u), (p, v, u).
    assert pairs(got, names) == [("p", "q", "u"), ("p", "v", "u")]
    assert got.columns == ["x.a", "y.a", "z.a"]


def test_four_way_join(make_engine: MakeEngine) -> None:
    eng = make_engine()
    for s in "RSTU":
        eng.execute(f"CREATE STREAM {s} (k INT)")
    h = eng.register("SELECT * FROM R, S, T, U WHERE R.k = S.k AND S.k = T.k AND T.k != U.k")
    names: dict[int, str] = {}
    insert(eng, "R", {"r1": (1,), "r2": (2,)}, 1.0, names)
    insert(eng, "S", {"s1": (1,), "s2": (2,)}, 1.0, names)
    insert(eng, "T", {"t2": (2,)}, 1.0, names)
    insert(eng, "U", {"u1": (1,), "u2": (2,)}, 1.0, names)
    # R=S=T only on k=2 (T has only 2); T.k != U.k keeps u1.
    assert pairs(eng.invoke(h), names) == [("r2", "s2", "t2", "u1")]


# ----------------------------------------------------------------------------------
# Join factors: offsets, inequalities, !=, TEXT, ts, cross products

@pytest.fixture
def rs(make_engine: MakeEngine) -> RS:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT, f FLOAT, t TEXT)")
    eng.execute("CREATE STREAM S (b INT, g FLOAT, t TEXT)")
    names: dict[int, str] = {}
    insert(eng, "R", {"r1": (1, 0.5, "x"), "r2": (3, 2.0, "é"), "r3": (4, 1.5, "y")},
           [1.0, 2.0, 3.0], names)
    insert(eng, "S", {"s1": (2, 1.0, "x"), "s2": (1, 2.5, "X"), "s3": (4, 0.0, "é")},
           [1.0, 2.0, 3.0], names)
    return eng, names


def by_earliest(combos: list[tuple[str, str]],
                ts: Mapping[str, float]) -> list[tuple[str, str]]:
    """Reference order: earliest component ts, then tupleIDs in FROM order (the names
    r1 < r2 < r3 and s1 < s2 < s3 follow insertion order, so tupleID order)."""
    return sorted(combos, key=lambda c: (min(ts[n] for n in c), c))


RS_TS = {"r1": 1.0, "r2": 2.0, "r3": 3.0, "s1": 1.0, "s2": 2.0, "s3": 3.0}
RS_A = {"r1": 1, "r2": 3, "r3": 4}
RS_B = {"s1": 2, "s2": 1, "s3": 4}


@pytest.mark.parametrize(
    "where, expected",
    [
        # R.a = S.b + 1: a in {1,3,4}, b+1 in {3,2,5}: r2 (3) = s1 (2)+1.
        ("R.a = S.b + 1", [("r2", "s1")]),
        # R.a <= S.b - 2: b-2 in {0,-1,2}: only s3 (2) with r1 (1).
        ("R.a <= S.b - 2", [("r1", "s3")]),
        # the same factor written from S's side: S.b >= R.a + 2.
        ("S.b >= R.a + 2", [("r1", "s3")]),
        # R.a > S.b: r1 (1) > none; r2 (3) > s1 (2), s2 (1); r3 (4) > s1, s2.
        ("R.a > S.b", [("r2", "s1"), ("r2", "s2"), ("r3", "s1"), ("r3", "s2")]),
        # R.a >= S.b: adds the equal pairs r1 (1) >= s2 (1) and r3 (4) >= s3 (4).
        ("R.a >= S.b", [("r1", "s2"), ("r2", "s1"), ("r2", "s2"), ("r3", "s1"),
                        ("r3", "s2"), ("r3", "s3")]),
        # R.a < S.b: r1 (1) < s1 (2), s3 (4); r2 (3) < s3.
        ("R.a < S.b", [("r1", "s1"), ("r1", "s3"), ("r2", "s3")]),
        # R.a != S.b: all but (r1,s2) (1=1) and (r3,s3) (4=4).
        ("R.a != S.b", [(r, s) for r in ("r1", "r2", "r3") for s in ("s1", "s2", "s3")
                        if RS_A[r] != RS_B[s]]),
        ("R.a <> S.b", [(r, s) for r in ("r1", "r2", "r3") for s in ("s1", "s2", "s3")
                        if RS_A[r] != RS_B[s]]),
        # float offset: R.f < S.g + 0.5; g+0.5 in {1.5, 3.0, 0.5}; f in {0.5, 2.0, 1.5}:
        # r1 (0.5) < 1.5, 3.0; r2 (2.0) < 3.0; r3 (1.5) < 3.0 (not < 1.5).
        ("R.f < S.g + 0.5", [("r1", "s1"), ("r1", "s2"), ("r2", "s2"), ("r3", "s2")]),
        # INT = FLOAT - 0.5: g-0.5 in {0.5, 2.0, -0.5}; a is an integer: none equal ...
        ("R.a = S.g - 0.5", []),
        # ... while FLOAT = FLOAT - 0.5: f in {0.5, 2.0, 1.5}: r1 = s1 (0.5), r2 = s2 (2.0).
        ("R.f = S.g - 0.5", [("r1", "s1"), ("r2", "s2")]),
        # INT vs FLOAT with a float offset: a <= g + 1.5 (g+1.5 in {2.5, 4.0, 1.5}):
        # r1 (1) <= all; r2 (3) <= s2 (4.0); r3 (4) <= s2 (4.0).
        ("R.a <= S.g + 1.5", [("r1", "s1"), ("r1", "s2"), ("r1", "s3"), ("r2", "s2"),
                              ("r3", "s2")]),
        # TEXT equality is exact and by code point: 'x' = 'x', 'é' = 'é', not 'X'.
        ("R.t = S.t", [("r1", "s1"), ("r2", "s3")]),
        # TEXT order by code point: 'X' (88) < 'x' (120) < 'y' (121) < 'é' (233).
        ("R.t < S.t", [("r1", "s3"), ("r3", "s3")]),
        # two join factors on one pair: b - 2 < a < b + 2 -> |a - b| <= 1 (ints):
        # r1 (1) with s1 (2), s2 (1); r2 (3) with s1 (2), s3 (4); r3 (4) with s3 (4).
        ("R.a > S.b - 2 AND R.a < S.b + 2",
         [("r1", "s1"), ("r1", "s2"), ("r2", "s1"), ("r2", "s3"), ("r3", "s3")]),
        # join and local factors together: a > 1 and a = b: r3 (4) = s3 (4).
        ("R.a > 1 AND R.a = S.b AND S.g < 1", [("r3", "s3")]),
    ],
)  # fmt: skip
def test_join_factor(rs: RS, where: str, expected: list[tuple[str, str]]) -> None:
    eng, names = rs
    got = eng.invoke(eng.register(f"SELECT * FROM R, S WHERE {where}"))
    assert pairs(got, names) == by_earliest(expected, RS_TS)
    assert got.ts.tolist() == [min(RS_TS[n] for n in c) for c in by_earliest(expected, RS_TS)]


def test_cross_product_without_join_factor(rs: RS) -> None:
    eng, names = rs
    got = eng.invoke(eng.register("SELECT R.a, S.b FROM R, S"))
    # 3 x 3 combinations. Earliest ts: 1 for every pair with r1 or s1 (5 pairs), ordered
    # by R tupleID then S tupleID; then 2 for (r2,s2), (r2,s3), (r3,s2); then 3 (r3,s3).
    assert pairs(got, names) == [
        ("r1", "s1"), ("r1", "s2"), ("r1", "s3"), ("r2", "s1"), ("r3", "s1"),
        ("r2", "s2"), ("r2", "s3"), ("r3", "s2"), ("r3", "s3")]
    assert got.ts.tolist() == [1.0] * 5 + [2.0] * 3 + [3.0]
    assert got.columns == ["a", "b"]
    assert got.rows[:3] == [(1, 2), (1, 1), (1, 4)]


def test_cross_product_with_local_factors_only(rs: RS) -> None:
    eng, names = rs
    got = eng.invoke(eng.register("SELECT * FROM R, S WHERE R.a >= 3 AND S.g > 0.5"))
    # R: r2 (3), r3 (4); S: s1 (1.0), s2 (2.5). Earliest: (r2,s1) 1, (r3,s1) 1, (r2,s2) 2,
    # (r3,s2) 2.
    assert pairs(got, names) == [("r2", "s1"), ("r3", "s1"), ("r2", "s2"), ("r3", "s2")]


def test_ts_in_a_join_factor(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (b INT)")
    h = eng.register("SELECT r.tupleID, s.tupleID FROM R r, S s WHERE r.ts <= s.ts + 2")
    names: dict[int, str] = {}
    insert(eng, "S", {"s9": (0,), "s11": (0,), "s12": (0,)}, [9.0, 11.0, 12.0], names)
    insert(eng, "R", {"r10": (0,), "r13": (0,)}, [10.0, 13.0], names)
    got = eng.invoke(h)
    # r10: 10 <= 11, 13, 14 -> all S; r13: 13 <= 11 no, 13 <= 13, 13 <= 14 -> s11, s12.
    # earliest ts: (r10,s9) 9, (r10,s11) 10, (r10,s12) 10, (r13,s11) 11, (r13,s12) 12.
    assert pairs(got, names) == [("r10", "s9"), ("r10", "s11"), ("r10", "s12"),
                                 ("r13", "s11"), ("r13", "s12")]
    assert got.ts.tolist() == [9.0, 10.0, 10.0, 11.0, 12.0]


def test_tuple_id_in_a_join_factor(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    h = eng.register("SELECT * FROM R r1, R r2 WHERE r1.tupleID < r2.tupleID AND r1.a = r2.a")
    names: dict[int, str] = {}
    insert(eng, "R", {"p": (1,), "q": (1,), "u": (2,), "v": (1,)}, 1.0, names)
    # ordered pairs of distinct tuples with equal a, first one older: (p,q), (p,v), (q,v).
    assert pairs(eng.invoke(h), names) == [("p", "q"), ("p", "v"), ("q", "v")]


def test_bool_join_factor(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (x BOOL)")
    eng.execute("CREATE STREAM S (y BOOL)")
    eq = eng.register("SELECT * FROM R, S WHERE R.x = S.y")
    lt = eng.register("SELECT * FROM R, S WHERE R.x < S.y")
    names: dict[int, str] = {}
    insert(eng, "R", {"rt": (True,), "rf": (False,)}, 1.0, names)
    insert(eng, "S", {"sf": (False,), "st": (True,)}, 1.0, names)
    assert pairs(eng.invoke(eq), names) == [("rt", "st"), ("rf", "sf")]
    assert pairs(eng.invoke(lt), names) == [("rf", "st")]              # FALSE < TRUE


INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)


@pytest.mark.parametrize(
    "where, expected",
    [
        # a = b + 1 holds for no pair of {MIN, MAX} (MAX + 1 = 2**63 is no INT64 value;
        # int64 wrap-around would make it MIN and match (rmin, smax)) ...
        ("R.a = S.b + 1", []),
        # ... a < b + 1 means a <= b: (rmin, smax), (rmin, smin), (rmax, smax); with
        # wrap-around, MAX + 1 = MIN would drop (rmin, smax) and (rmax, smax).
        ("R.a < S.b + 1", [("rmin", "smax"), ("rmin", "smin"), ("rmax", "smax")]),
        # a > b - 1 means a >= b: (rmin, smin), (rmax, smax), (rmax, smin).
        ("R.a > S.b - 1", [("rmin", "smin"), ("rmax", "smax"), ("rmax", "smin")]),
        ("R.a = S.b - 1", []),
    ],
)  # fmt: skip
def test_join_factor_offset_does_not_wrap_around_int64(make_engine: MakeEngine, where: str,
                                                       expected: list[tuple[str, str]]) -> None:
    """`R.a op S.b + c` compares numbers (docs/language.md), so S.b + c must not overflow:
    psoup adds the offset to the int64 column in numpy (psoup/eddy/hybrid.py, `target =
    target + shift` and `x + shift`), which wraps INT64_MAX + 1 to INT64_MIN."""
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (b INT)")
    h = eng.register(f"SELECT * FROM R, S WHERE {where}")
    names: dict[int, str] = {}
    insert(eng, "R", {"rmin": (INT64_MIN,), "rmax": (INT64_MAX,)}, 1.0, names)
    insert(eng, "S", {"smax": (INT64_MAX,), "smin": (INT64_MIN,)}, 1.0, names)
    assert pairs(eng.invoke(h), names) == expected


# ----------------------------------------------------------------------------------
# Projection, DISTINCT and windows over joins

def test_distinct_keeps_the_first_combination(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (b INT)")
    h = eng.register("SELECT DISTINCT R.a FROM R, S WHERE R.a <= S.b")
    names: dict[int, str] = {}
    insert(eng, "S", {"s1": (5,)}, 1.0, names)
    insert(eng, "R", {"r1": (2,), "r2": (2,), "r3": (7,)}, [2.0, 3.0, 4.0], names)
    insert(eng, "S", {"s2": (9,)}, 5.0, names)
    got = eng.invoke(h)
    # combos: (r1,s1) ts 1, (r2,s1) 1, (r1,s2) 2, (r2,s2) 3, (r3,s2) 4. The rows a=2 first
    # appear as (r1,s1) (ts 1), a=7 as (r3,s2) (ts 4).
    assert got.rows == [(2,), (7,)]
    assert got.ts.tolist() == [1.0, 4.0]
    assert pairs(got, names) == [("r1", "s1"), ("r3", "s2")]


def test_sliding_window_requires_every_component_inside(make_engine: MakeEngine) -> None:
    eng = make_engine(clock=Clock(10.0))
    eng.execute("CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (b INT)")
    h = eng.register("SELECT * FROM R, S WHERE R.a = S.b BEGIN NOW - 3 END NOW")
    names: dict[int, str] = {}
    insert(eng, "R", {"r1": (1,), "r5": (1,)}, [1.0, 5.0], names)
    insert(eng, "S", {"s2": (1,), "s6": (1,)}, [2.0, 6.0], names)
    # window [b, e] at now: every component's ts must be in it.
    assert pairs(eng.invoke(h, now=6.0), names) == [("r5", "s6")]               # [3, 6]
    assert pairs(eng.invoke(h, now=5.0), names) == [("r5", "s2")]               # [2, 5]
    assert pairs(eng.invoke(h, now=4.0), names) == [("r1", "s2")]               # [1, 4]
    assert pairs(eng.invoke(h, now=100.0), names) == []
    assert pairs(eng.invoke(h, now=8.0), names) == [("r5", "s6")]               # [5, 8]
    # [1, 6] holds all four; earliest ts 1, 1, 2, 5.
    wide = eng.register("SELECT * FROM R, S WHERE R.a = S.b BEGIN NOW - 5 END NOW")
    assert pairs(eng.invoke(wide, now=6.0), names) == [
        ("r1", "s2"), ("r1", "s6"), ("r5", "s2"), ("r5", "s6")]


def test_snapshot_window_over_a_join(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (b INT)")
    h = eng.register("SELECT * FROM R, S WHERE R.a = S.b BEGIN 2 END 5")
    names: dict[int, str] = {}
    insert(eng, "R", {"r1": (1,), "r3": (1,), "r6": (1,)}, [1.0, 3.0, 6.0], names)
    insert(eng, "S", {"s2": (1,), "s5": (1,)}, [2.0, 5.0], names)
    # in [2, 5]: r3, s2, s5.
    assert pairs(eng.invoke(h, now=50.0), names) == [("r3", "s2"), ("r3", "s5")]


def test_rows_window_applies_to_each_stream(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (b INT)")
    both = eng.register("SELECT * FROM R, S BEGIN (NOW - 1 ROWS) END NOW")
    selfj = eng.register("SELECT * FROM R r1, R r2 BEGIN (NOW - 1 ROWS) END NOW")
    names: dict[int, str] = {}
    insert(eng, "R", {"r1": (1,), "r2": (2,)}, [1.0, 2.0], names)
    insert(eng, "S", {"s1": (1,), "s2": (2,)}, [1.0, 2.0], names)
    # the last tuple of each stream: r2 and s2; the self-join pairs r2 with itself.
    assert pairs(eng.invoke(both), names) == [("r2", "s2")]
    assert pairs(eng.invoke(selfj), names) == [("r2", "r2")]


def test_per_item_windows(make_engine: MakeEngine) -> None:
    eng = make_engine(clock=Clock(10.0))
    eng.execute("CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (b INT)")
    names: dict[int, str] = {}
    insert(eng, "R", {"r1": (1,), "r2": (1,), "r3": (2,)}, [1.0, 2.0, 3.0], names)
    insert(eng, "S", {"s1": (1,), "s4": (1,), "s8": (2,)}, [1.0, 4.0, 8.0], names)
    rows1 = eng.register("SELECT * FROM R [ROWS 2], S WHERE R.a = S.b")
    # R's last 2: r2 (1), r3 (2); S everything: r2 -> s1, s4; r3 -> s8.
    # earliest: (r2,s1) 1, (r2,s4) 2, (r3,s8) 3.
    assert pairs(eng.invoke(rows1, now=10.0), names) == [("r2", "s1"), ("r2", "s4"),
                                                         ("r3", "s8")]
    ranged = eng.register("SELECT * FROM R, S [RANGE 6 SECONDS] WHERE R.a = S.b")
    # S in [now-6, now] = [4, 10]: s4, s8; R everything: (r1,s4), (r2,s4), (r3,s8).
    assert pairs(eng.invoke(ranged, now=10.0), names) == [("r1", "s4"), ("r2", "s4"),
                                                          ("r3", "s8")]
    part = eng.register("SELECT * FROM R [PARTITION BY a ROWS 1], S [NOW] WHERE R.a = S.b")
    # R's newest per a: r2 (a=1), r3 (a=2); S with ts = now = 8: s8 (b=2) -> (r3, s8).
    assert pairs(eng.invoke(part, now=8.0), names) == [("r3", "s8")]
    # at now = 4, S [NOW] holds s4 (b=1), which joins r2 (the newest a=1; r1 is not in
    # R's window).
    assert pairs(eng.invoke(part, now=4.0), names) == [("r2", "s4")]


def test_retention_drops_combinations_with_an_expired_component(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT) RETAIN 2 ROWS")
    eng.execute("CREATE STREAM S (b INT)")
    h = eng.register("SELECT * FROM R, S WHERE R.a = S.b")
    names: dict[int, str] = {}
    insert(eng, "S", {"s1": (1,)}, 1.0, names)
    insert(eng, "R", {"r1": (1,), "r2": (1,)}, 2.0, names)
    assert pairs(eng.invoke(h), names) == [("r1", "s1"), ("r2", "s1")]
    insert(eng, "R", {"r3": (1,)}, 3.0, names)         # r1 leaves retention (last 2 rows)
    assert pairs(eng.invoke(h), names) == [("r2", "s1"), ("r3", "s1")]
    insert(eng, "R", {"r4": (5,), "r5": (6,)}, 4.0, names)   # r2, r3 leave
    assert pairs(eng.invoke(h), names) == []
    late = eng.register("SELECT * FROM R, S WHERE R.a = S.b")
    assert pairs(eng.invoke(late), names) == []


@pytest.mark.parametrize("retain", ["RETAIN 1 ROWS", "RETAIN 3 SECONDS"])
def test_batch_that_expires_its_own_first_tuples_joins_only_the_retained_ones(
        make_engine: MakeEngine, retain: str) -> None:
    """A batch longer than S's retention pushes its own first tuples below the horizon
    (and, with chunk_rows=2, drops their chunks) before the join query sees it. The join
    must use the retained ones only; found by the differential test below, where the
    insert raised IndexError in psoup.stems.data_stem.DataSteM.gather_columns, called
    from Eddy._join_new_data -> stamped() with the batch's expired positions."""
    eng = make_engine()
    eng.execute("CREATE STREAM R (k INT)")
    eng.execute(f"CREATE STREAM S (k INT) {retain}")
    names: dict[int, str] = {}
    insert(eng, "R", {"r": (0,)}, 1.0, names)
    h = eng.register("SELECT * FROM R, S")
    # RETAIN 1 ROWS keeps s5 only; RETAIN 3 SECONDS keeps ts >= 9 - 3 = 6: s5 only.
    insert(eng, "S", {f"s{i}": (0,) for i in range(1, 6)}, [2.0, 2.0, 2.0, 2.0, 9.0], names)
    assert pairs(eng.invoke(h), names) == [("r", "s5")]


def test_unregistered_join_handle_stops_working_and_slots_are_reused(
        make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (b INT)")
    old = eng.register("SELECT * FROM R, S WHERE R.a = S.b AND R.a > 0 AND S.b > 0")
    names: dict[int, str] = {}
    insert(eng, "R", {"r0": (0,), "r1": (1,)}, 1.0, names)
    insert(eng, "S", {"s0": (0,), "s1": (1,)}, 1.0, names)
    eng.unregister(old)
    with pytest.raises(psoup.UnknownHandle):
        eng.invoke(old)
    # the new queries take the freed slots: nothing of the old query's bits may leak.
    new = eng.register("SELECT * FROM R, S WHERE R.a = S.b AND R.a < 1")
    sel = eng.register("SELECT * FROM S WHERE b < 1")
    insert(eng, "R", {"r2": (0,)}, 2.0, names)
    assert pairs(eng.invoke(new), names) == [("r0", "s0"), ("r2", "s0")]
    assert [names[t] for t in eng.invoke(sel).tuple_ids.tolist()] == ["s0"]


def test_contradictory_join_queries_match_nothing(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT)")
    eng.execute("CREATE STREAM S (b INT)")
    local = eng.register("SELECT * FROM R, S WHERE R.a > 5 AND R.a < 3 AND R.a = S.b")
    joins = eng.register("SELECT * FROM R, S WHERE R.a < S.b AND R.a > S.b")
    fine = eng.register("SELECT * FROM R, S WHERE R.a <= S.b AND R.a >= S.b")   # R.a = S.b
    names: dict[int, str] = {}
    insert(eng, "R", {"r4": (4,), "r6": (6,)}, 1.0, names)
    insert(eng, "S", {"s4": (4,), "s6": (6,)}, 1.0, names)
    assert pairs(eng.invoke(local), names) == []
    assert pairs(eng.invoke(joins), names) == []
    assert pairs(eng.invoke(fine), names) == [("r4", "s4"), ("r6", "s6")]
    assert eng.invoke(local).tuple_ids.shape == (0, 2)


# ----------------------------------------------------------------------------------
# invoke(since=cursor) on a join query

def keyed(result: Result, distinct: bool) -> list[tuple[Any, ...]]:
    keys = result.rows if distinct else [tuple(r) for r in result.tuple_ids.tolist()]
    return list(zip(keys, result.rows, result.ts.tolist(),
                    [tuple(r) for r in result.tuple_ids.tolist()], strict=True))


@pytest.mark.parametrize("distinct", [False, True])
def test_since_cursor_changes_compose_to_the_answers(make_engine: MakeEngine,
                                                     distinct: bool) -> None:
    clock = Clock(10.0)
    eng = make_engine(clock=clock)
    eng.execute("CREATE STREAM R (a INT) RETAIN 4 ROWS")
    eng.execute("CREATE STREAM S (b INT)")
    sql = (f"SELECT {'DISTINCT ' if distinct else ''}R.a, S.b FROM R, S "
           "WHERE R.a <= S.b BEGIN NOW - 5 END NOW")
    h = eng.register(sql)
    first = eng.invoke(h, now=10.0)
    assert first.rows == [] and first.cursor
    cursor, previous = first.cursor, first
    script = [
        ("R", [(1,), (2,)], 10.0, 10.0),
        ("S", [(2,), (1,)], 11.0, 11.0),     # 4 pairs enter
        (None, None, None, 12.0),             # nothing changes
        ("R", [(3,), (1,)], 13.0, 13.0),
        ("S", [(3,)], 14.0, 15.5),            # the ts-10 tuples slide out at NOW = 15.5
        ("R", [(0,), (0,), (0,)], 16.0, 16.0),  # retention drops R tuples
        (None, None, None, 40.0),             # everything slides out
    ]
    polls = 0
    for stream, rows, ts, now in script:
        if stream:
            eng.insert(stream, rows, ts=ts)
        clock.now = now
        changes = eng.invoke(h, now=now, since=cursor)
        full = eng.invoke(h, now=now)
        old, new = keyed(previous, distinct), keyed(full, distinct)
        old_keys, new_keys = {k for k, *_ in old}, {k for k, *_ in new}
        # what entered, in answer order; what left, in the old answer's order
        assert keyed(changes.inserted, distinct) == [e for e in new if e[0] not in old_keys]
        assert keyed(changes.deleted, distinct) == [e for e in old if e[0] not in new_keys]
        # composing: old - deleted + inserted is the new answer (as a set of keys)
        composed = (old_keys - {k for k, *_ in keyed(changes.deleted, distinct)}) | \
            {k for k, *_ in keyed(changes.inserted, distinct)}
        assert composed == new_keys
        assert changes.columns == full.columns == ["a", "b"]
        polls += len(changes)
        cursor, previous = changes.cursor, full
    assert polls > 0
    assert previous.rows == []


def test_since_cursor_on_a_self_join_counts_each_pair(make_engine: MakeEngine) -> None:
    eng = make_engine()
    eng.execute("CREATE STREAM R (a INT, b INT)")
    h = eng.register(SELF_JOIN)
    names: dict[int, str] = {}
    cursor = eng.invoke(h).cursor
    insert(eng, "R", {"t0": SELF_ROWS["t0"]}, 1.0, names)
    ch = eng.invoke(h, since=cursor)
    assert isinstance(ch, Changes)          # a str cursor (Result.cursor is Optional)
    assert pairs(ch.inserted, names) == [("t0", "t0")] and len(ch.deleted) == 0
    insert(eng, "R", {"t1": SELF_ROWS["t1"], "t2": SELF_ROWS["t2"]}, 2.0, names)
    ch2 = eng.invoke(h, since=ch.cursor)
    assert pairs(ch2.inserted, names) == [("t0", "t1"), ("t2", "t0"), ("t1", "t2"),
                                          ("t2", "t1")]
    assert len(ch2.deleted) == 0


# ----------------------------------------------------------------------------------
# Groups: join queries sharing streams and join factors share one structure (Sect. 5.4)

def _group_engine(mode: ModeName, shared: bool = True) -> psoup.Engine:
    eng = psoup.Engine(mode=mode, clock=Clock(100.0), chunk_rows=4, shared_joins=shared)
    eng.execute("CREATE STREAM R (a INT, x INT)")
    eng.execute("CREATE STREAM S (b INT, y INT)")
    return eng


def _brute(r_rows: list[tuple[int, int]], s_rows: list[tuple[int, int]], rx: int,
           sy: int) -> list[tuple[int, int]]:
    """Every (R index, S index) with R.a = S.b AND R.x > rx AND S.y < sy."""
    return [(i, j) for i, (a, x) in enumerate(r_rows) for j, (b, y) in enumerate(s_rows)
            if a == b and x > rx and y < sy]


@pytest.mark.parametrize("mode", ["partial", "complete"])
def test_siblings_share_one_group_and_each_gets_its_own_answer(mode: ModeName) -> None:
    eng = _group_engine(mode)
    r_rows = [(1, 5), (2, 9), (1, 1), (3, 7)]
    s_rows = [(1, 0), (1, 8), (2, 3), (3, 9)]
    rid = eng.insert("R", r_rows[:2], ts=1.0).tolist()
    sid = eng.insert("S", s_rows[:2], ts=1.0).tolist()
    sql = "SELECT R.a, S.y FROM R, S WHERE R.a = S.b AND R.x > {} AND S.y < {}"
    bounds = [(0, 10), (4, 5), (6, 10)]
    h0 = eng.register(sql.format(*bounds[0]))          # before the rest of the data
    rid += eng.insert("R", r_rows[2:], ts=2.0).tolist()
    h1 = eng.register(sql.format(*bounds[1]))          # in between: old and new data
    h2 = eng.register("SELECT R.a, S.y FROM R, S WHERE S.y < 10 AND R.x > 6 AND "
                      "S.b = R.a")                      # the factors in another order
    sid += eng.insert("S", s_rows[2:], ts=3.0).tolist()
    groups = eng.stats()["join_groups"]
    assert len(groups) == 1                              # one structure for all three
    for h, (rx, sy) in zip((h0, h1, h2), bounds, strict=True):
        want = _brute(r_rows, s_rows, rx, sy)
        got = eng.invoke(h, now=10.0).tuple_ids.tolist()
        assert sorted(map(tuple, got)) == sorted((rid[i], sid[j]) for i, j in want)
    # every combination is stored once: (R0, S0) serves h0 and h1 (found for h0 by a
    # batch and for h1 over old data), and the count is the union of the answers
    union: set[tuple[int, int]] = set()
    for rx, sy in bounds:
        union |= set(_brute(r_rows, s_rows, rx, sy))
    (group,) = groups.values()
    assert group["members"] == 3 and group["entries"] == len(union)
    eng._check()


@pytest.mark.parametrize("mode", ["partial", "complete"])
def test_a_member_leaving_clears_its_bits_and_its_index_is_reused_clean(mode: ModeName) -> None:
    eng = _group_engine(mode)
    sql = "SELECT R.a FROM R, S WHERE R.a = S.b AND R.x > {} AND S.y < 100"
    wide = eng.register(sql.format(0))
    narrow = eng.register(sql.format(50))
    eng.insert("R", [(1, 60), (1, 10)], ts=1.0)
    eng.insert("S", [(1, 0)], ts=1.0)
    assert len(eng.invoke(narrow, now=5.0)) == 1 and len(eng.invoke(wide, now=5.0)) == 2
    eng.unregister(narrow)
    assert eng.stats()["queries"][wide]["member"] == 0
    # the newcomer takes index 1; it must not inherit the old member's combination
    none = eng.register(sql.format(1000))
    assert eng.stats()["queries"][none]["member"] == 1
    eng._check()
    assert len(eng.invoke(none, now=5.0)) == 0
    assert len(eng.invoke(wide, now=5.0)) == 2
    eng.insert("R", [(1, 2000)], ts=2.0)
    assert len(eng.invoke(none, now=5.0)) == 1 and len(eng.invoke(wide, now=5.0)) == 3
    eng.unregister(wide)
    eng.unregister(none)
    stats = eng.stats()
    assert stats["join_groups"] == {} and stats["memory"]["results"] == 0
    eng._check()


@pytest.mark.parametrize("shared", [True, False])
def test_groups_of_more_than_64_members_match_each_query_alone(shared: bool) -> None:
    """Member bits span several words, and a batch regroups them from many slots."""
    rnd = random.Random(7)
    eng = _group_engine("partial", shared)
    eng.execute("CREATE STREAM T (c INT)")        # a selection query's slot in between
    sel = eng.register("SELECT c FROM T WHERE c > 1")
    bounds = [(rnd.randrange(10), rnd.randrange(10)) for _ in range(70)]
    sql = "SELECT R.a FROM R, S WHERE R.a = S.b AND R.x > {} AND S.y < {}"
    handles = [eng.register(sql.format(*b)) for b in bounds[:35]]
    r_rows = [(rnd.randrange(3), rnd.randrange(10)) for _ in range(12)]
    s_rows = [(rnd.randrange(3), rnd.randrange(10)) for _ in range(12)]
    rid = eng.insert("R", r_rows[:6], ts=1.0).tolist()
    sid = eng.insert("S", s_rows[:6], ts=1.0).tolist()
    handles += [eng.register(sql.format(*b)) for b in bounds[35:]]
    rid += eng.insert("R", r_rows[6:], ts=2.0).tolist()
    sid += eng.insert("S", s_rows[6:], ts=2.0).tolist()
    eng.insert("T", [(5,), (0,)], ts=2.0)
    assert len(eng.stats()["join_groups"]) == (1 if shared else 70)
    eng._check()
    for h, (rx, sy) in zip(handles, bounds, strict=True):
        want = sorted((rid[i], sid[j]) for i, j in _brute(r_rows, s_rows, rx, sy))
        assert sorted(map(tuple, eng.invoke(h, now=5.0).tuple_ids.tolist())) == want
    assert eng.invoke(sel, now=5.0).rows == [(5,)]


# ----------------------------------------------------------------------------------
# Differential: every mode and routing policy against DuckDB

#: A join scenario runs six engines (3 modes x 2 routings) and checks since-cursors too;
#: a third of the profile's examples (PSOUP_EXAMPLES scales both this test and
#: test_differential.py) keeps it to about 25 s in the ci profile.
JOIN_EXAMPLES = max(10, settings().max_examples // 3)


@settings(max_examples=JOIN_EXAMPLES)
@given(join_scenarios(), st.sampled_from([2, 3, 8, 8192]))
def test_joins_agree_with_duckdb_in_every_mode_and_routing(scenario: Scenario,
                                                           chunk_rows: int) -> None:
    streams, ops = scenario
    clock = Clock(1000.0)
    # the fixed-routing engines also join each query on its own (no groups)
    engines = {(m, r): psoup.Engine(mode=m, routing=r, clock=clock, chunk_rows=chunk_rows,
                                    shared_joins=r == "adaptive")
               for m, r in ENGINE_KINDS}
    for eng in engines.values():
        create(eng, streams)
    oracle = JoinOracle(streams)
    last_ts = {name: 1000.0 for name in streams}
    # live entries: [kind, handles per engine, spec, sql, cursors per engine, last answer]
    live: list[list[Any]] = []

    for op in ops:
        if op[0] == "insert":
            _, stream, rows, steps, synced = op
            insert_stepped(engines, oracle, clock, last_ts, stream, rows, steps, synced)
        elif op[0] in ("register", "select"):
            sql, spec = op[1]
            handles = {key: eng.register(sql) for key, eng in engines.items()}
            live.append([op[0], handles, spec, sql, {}, None])
        elif op[0] == "invoke" and live:
            _check_join(engines, oracle, live[op[1] % len(live)], clock.now + op[2], op[3])
        elif op[0] == "unregister" and live:
            entry = live.pop(op[1] % len(live))
            for key, eng in engines.items():
                eng.unregister(entry[1][key])
        elif op[0] == "invoke_all":
            for entry in live:
                _check_join(engines, oracle, entry, clock.now + op[1], True)


def _check_join(engines: Mapping[tuple[ModeName, RoutingName], psoup.Engine], oracle: JoinOracle,
                entry: list[Any], now: float, use_since: bool) -> None:
    kind, handles, spec, sql = entry[:4]
    if kind == "select":
        _check_selection(engines, oracle, handles, spec, sql, now)
        return
    want = oracle.join_answer(spec, now)
    k = len(spec["items"])
    event(f"{k}-way{' self-join' if len(set(spec['items'])) < k else ''}: "
          f"{'no rows' if not want[0] else '1-9 rows' if len(want[0]) < 10 else '10+ rows'}")
    for key, eng in engines.items():
        if use_since and key in entry[4]:
            changes = eng.invoke(handles[key], now=now, since=entry[4][key])
            assert isinstance(changes, Changes)     # a str cursor (Result.cursor is Optional)
            ins, dels = expected_changes(entry[5], want, spec["distinct"])
            assert as_triples(changes.inserted) == ins, ("inserted", key, sql, now)
            assert as_triples(changes.deleted) == dels, ("deleted", key, sql, now)
        got = eng.invoke(handles[key], now=now)
        assert got.columns == spec["names"], (key, sql)
        assert got.rows == want[0], (key, sql, now)
        assert got.ts.tolist() == want[1], (key, sql, now)
        assert got.tuple_ids.dtype == np.int64, (key, sql)
        assert got.tuple_ids.shape == (len(want[2]), k), (key, sql, now)
        assert [tuple(r) for r in got.tuple_ids.tolist()] == want[2], (key, sql, now)
        entry[4][key] = got.cursor
    entry[5] = want


def _check_selection(engines: Mapping[tuple[ModeName, RoutingName], psoup.Engine],
                     oracle: JoinOracle,
                     handles: dict[tuple[str, str], str], spec: dict[str, Any], sql: str,
                     now: float) -> None:
    want = oracle.answer(spec, now)
    for key, eng in engines.items():
        assert eng.invoke(handles[key], now=now).rows == want, (key, sql, now)
