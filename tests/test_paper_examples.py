"""The PSoup paper's walkthroughs (Sect. 3.2.1, Figs. 2 and 3) in every engine mode.

Fig. 2a's state: queries 20-23 in the Query SteM, tuples 48-52 of R(a, b) in the Data
SteM. Query 24 then arrives (Fig. 2, new query over old data) and must match tuples 48
and 50; a new tuple then arrives (Fig. 3, new data over old queries) and must be matched
against every standing query.
"""

from __future__ import annotations

import pytest

import psoup

FIG2_QUERIES = {
    20: "SELECT * FROM R WHERE 0 < a AND a <= 5",
    21: "SELECT * FROM R WHERE a > 4 AND b = 3",
    22: "SELECT * FROM R WHERE 0 > b AND b > 4",          # a contradiction: matches nothing
    23: "SELECT * FROM R WHERE a = 4 AND b = 3",
}
FIG2_TUPLES = {48: (4, 3), 49: (7, 1), 50: (3, 8), 51: (0, 0), 52: (8, 4)}
QUERY_24 = "SELECT * FROM R WHERE a <= 4 AND b >= 3"

# the engine, the handle of each paper query, and paper tupleID by engine tupleID
Fig2 = tuple[psoup.Engine, dict[int, str], dict[int, int]]


@pytest.fixture(params=psoup.MODES)
def fig2(request: pytest.FixtureRequest) -> Fig2:
    eng = psoup.Engine(mode=request.param, clock=lambda: 100.0)
    eng.execute("CREATE STREAM R (a INT, b INT)")
    handles = {qid: eng.register(sql) for qid, sql in FIG2_QUERIES.items()}
    ids = eng.insert("R", list(FIG2_TUPLES.values()), ts=[float(t) for t in FIG2_TUPLES])
    tuple_of = dict(zip(ids.tolist(), FIG2_TUPLES, strict=True))  # engine tupleID -> paper tupleID
    return eng, handles, tuple_of


def paper_ids(eng: psoup.Engine, handle: str, tuple_of: dict[int, int]) -> list[int]:
    return [tuple_of[t] for t in eng.invoke(handle).tuple_ids.tolist()]


def test_fig2_standing_queries_hold_their_matches(fig2: Fig2) -> None:
    eng, handles, tuple_of = fig2
    assert paper_ids(eng, handles[20], tuple_of) == [48, 50]
    assert paper_ids(eng, handles[21], tuple_of) == []        # 52 has b = 4, 49 has b = 1
    assert paper_ids(eng, handles[22], tuple_of) == []
    assert paper_ids(eng, handles[23], tuple_of) == [48]


def test_fig2_new_query_sees_old_data(fig2: Fig2) -> None:
    eng, _, tuple_of = fig2
    h24 = eng.register(QUERY_24)
    assert paper_ids(eng, h24, tuple_of) == [48, 50]
    assert eng.invoke(h24).rows == [(4, 3), (3, 8)]


def test_fig3_new_data_probes_every_standing_query(fig2: Fig2) -> None:
    eng, handles, tuple_of = fig2
    handles[24] = eng.register(QUERY_24)
    (new_id,) = eng.insert("R", [(5, 3)], ts=53.0).tolist()
    tuple_of[new_id] = 53
    matched = {qid for qid, h in handles.items() if 53 in paper_ids(eng, h, tuple_of)}
    assert matched == {20, 21}


def test_registration_order_does_not_change_results() -> None:
    """Duality: query-then-data and data-then-query give the same bits."""
    answers = []
    for query_first in (True, False):
        eng = psoup.Engine(clock=lambda: 100.0)
        eng.execute("CREATE STREAM R (a INT, b INT)")
        h = eng.register(QUERY_24) if query_first else None
        eng.insert("R", list(FIG2_TUPLES.values()), ts=[float(t) for t in FIG2_TUPLES])
        h = h or eng.register(QUERY_24)
        answers.append(eng.invoke(h).rows)
    assert answers[0] == answers[1] == [(4, 3), (3, 8)]
