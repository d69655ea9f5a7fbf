"""`since` cursors (psoup.results.cursors): a poll's Changes are the difference of the
two full answers, however many pollers hold however old cursors; cursors of range
windows are recomputed rather than stored, survive a restart of a durable engine, and a
garbled or forged cursor is a clear psoup error."""

from __future__ import annotations

import base64
import os
import pickle
import stat
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import psoup
import psoup.engine
from psoup.errors import CursorExpired, CursorInvalid
from psoup.results.cursors import SECRET_FILE, CursorStore
from psoup.results.result import Changes, Result

QUERIES = [
    "SELECT a FROM R WHERE b > 2 BEGIN NOW - 6 END NOW",
    "SELECT DISTINCT a FROM R WHERE b > 1 BEGIN NOW - 9 END NOW",
    "SELECT a, b FROM R [ROWS 5] WHERE a < 3",
    "SELECT b FROM R WHERE a >= 1",
    "SELECT a, COUNT(*) AS n FROM R BEGIN NOW - 8 END NOW GROUP BY a",
    "SELECT a, b FROM R [PARTITION BY a ROWS 2]",
]


def _engine(retain: int = 14, budget: int | None = None) -> psoup.Engine:
    """An engine over R; with `budget`, its cursor store keeps that many bytes of
    answers instead of the default."""
    with _cursor_budget(budget):
        eng = psoup.Engine(clock=lambda: 0.0, chunk_rows=4)
    eng.execute(f"CREATE STREAM R (a INT, b INT) RETAIN {retain} ROWS")
    return eng


@contextmanager
def _cursor_budget(budget: int | None) -> Iterator[None]:
    """Engines made meanwhile get a CursorStore of `budget` bytes (None: the default).
    The engine has no option for it: the budget is the store's constructor argument,
    so the test hands the engine a store class that has it bound."""
    if budget is None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(psoup.engine, "CursorStore", partial(CursorStore, budget=budget))
        yield


def _answerable(eng: psoup.Engine, handle: str, cursors: list[str], now: float) -> int:
    """How many of `cursors` (of an aggregate: answered from a stored copy only) a poll
    still accepts. A poll whose current answer was read last stores nothing new, so
    counting does not change what is kept."""
    count = 0
    for cursor in cursors:
        try:
            eng.invoke(handle, now=now, since=cursor)
        except CursorExpired:
            continue
        count += 1
    return count


def _identities(result: Result, sql: str) -> Counter[Any]:
    """A row's identity in the answer (what `since` compares): its tupleID, its values
    in a DISTINCT answer, its group and values in an aggregated one."""
    if "DISTINCT" in sql:
        return Counter(result.rows)
    if "COUNT" in sql:
        assert result.keys is not None      # an aggregated answer has its groups' keys
        return Counter(zip(result.keys, result.rows, strict=True))
    return Counter(zip(result.tuple_ids.tolist(), result.rows, strict=True))


def _assert_difference(changes: Changes, old: Result, new: Result, sql: str) -> None:
    before, after = _identities(old, sql), _identities(new, sql)
    assert _identities(changes.inserted, sql) == after - before
    assert _identities(changes.deleted, sql) == before - after


_step = st.one_of(
    st.tuples(st.just("insert"), st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5)),
                                          min_size=1, max_size=6)),
    st.tuples(st.just("invoke"), st.integers(0, len(QUERIES) - 1)),
    st.tuples(st.just("poll"), st.integers(0, len(QUERIES) - 1), st.integers(0, 10 ** 6)),
    st.tuples(st.just("wait"), st.integers(1, 4)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_step, max_size=40), st.sampled_from([0, 64 << 20]))
def test_changes_are_the_difference_of_independently_computed_answers(
        steps: list[tuple[Any, ...]], budget: int) -> None:
    """Random polls from any earlier cursor, between inserts, expiry (RETAIN 14 ROWS in
    chunks of 4) and invocations at increasing NOW. With the default budget no cursor
    expires; with none (only the newest answer kept) range windows are still recomputed,
    and a cursor that expires changes nothing."""
    eng = _engine(budget=budget)
    handles = [eng.register(sql) for sql in QUERIES]
    issued: list[list[tuple[str | None, Result]]] = [[] for _ in QUERIES]   # (cursor, answer)
    now = 10.0
    for step in steps:
        if step[0] == "insert":
            eng.insert("R", step[1], ts=now)
        elif step[0] == "wait":
            now += step[1]
        elif step[0] == "invoke":
            answer = eng.invoke(handles[step[1]], now=now)
            issued[step[1]].append((answer.cursor, answer))
        elif issued[step[1]]:
            q = step[1]
            cursor, old = issued[q][step[2] % len(issued[q])]
            new = eng.invoke(handles[q], now=now)                # the full answer, by itself
            try:
                changes = eng.invoke(handles[q], now=now, since=cursor)
            except CursorExpired as exc:
                assert budget == 0 and "invoke without since" in str(exc)
                continue
            assert isinstance(changes, Changes)     # a str cursor (Result.cursor is Optional)
            _assert_difference(changes, old, new, QUERIES[q])
            issued[q].append((changes.cursor, new))
        eng._check()


@pytest.mark.parametrize("budget, queries, retain", [
    (64 << 20, QUERIES, 14),     # the default budget: whatever the query
    (0, QUERIES[:3], 40),        # none: windows inside retention are recomputed
])
def test_a_hundred_pollers_never_see_an_expired_cursor(budget: int, queries: list[str],
                                                      retain: int) -> None:
    """100 pollers on few handles, each polling from its own last cursor in a random
    order while data arrives and expires: none gets cursor_expired, and the stored
    answers are per distinct answer, not per poller (none at all are needed for
    windows inside retention)."""
    rng = np.random.default_rng(7)
    eng = _engine(retain, budget)
    handles = [eng.register(sql) for sql in queries]
    now = 10.0
    pollers: list[list[Any]] = []
    issued: list[set[str]] = [set() for _ in handles]     # the cursors of each round
    for i in range(100):
        q = i % len(handles)
        answer = eng.invoke(handles[q], now=now)
        pollers.append([q, answer.cursor, answer])
        issued[q].add(str(answer.cursor))
    for _ in range(8):
        assert all(len(cursors) == 1 for cursors in issued), "one answer a round"
        issued = [set() for _ in handles]
        eng.insert("R", {"a": rng.integers(0, 5, 2), "b": rng.integers(0, 6, 2)}, ts=now)
        now += float(rng.integers(1, 3))
        for i in rng.permutation(len(pollers)):
            q, cursor, old = pollers[i]
            new = eng.invoke(handles[q], now=now)
            changes = eng.invoke(handles[q], now=now, since=cursor)
            assert isinstance(changes, Changes)
            _assert_difference(changes, old, new, queries[q])
            pollers[i][1:] = [changes.cursor, new]
            issued[q].add(changes.cursor)
        eng._check()       # with budget 0: only the newest answer stored
    # All the pollers of a handle got the same cursor each round, and the store keeps
    # one copy per distinct (handle, answer): at most one a handle per round, not one
    # a poller, whichever the budget.
    assert all(len(cursors) == 1 for cursors in issued)


def test_pollers_holding_one_answer_share_its_stored_copy() -> None:
    eng = _engine()
    h = eng.register(QUERIES[4])                 # an aggregate: answered from a copy
    eng.insert("R", [(1, 1), (2, 2)], ts=10.0)
    cursors = {eng.invoke(h, now=10.0).cursor for _ in range(50)}
    assert len(cursors) == 1
    eng.insert("R", [(1, 3)], ts=11.0)
    changes = eng.invoke(h, now=11.0, since=cursors.pop())
    assert isinstance(changes, Changes)
    assert changes.inserted.rows == [(1, 2)] and changes.deleted.rows == [(1, 1)]
    eng._check()


def test_stored_answers_stay_within_the_budget() -> None:
    """40 answers of an aggregate (answered from stored copies only), each read: the
    budget holds the newest few, so the oldest cursors expire and the newest do not."""
    eng = _engine(budget=8000)
    h = eng.register(QUERIES[4])
    cursors = []
    for t in range(40):
        eng.insert("R", [(t, 1)], ts=10.0 + t)
        cursors.append(str(eng.invoke(h, now=10.0 + t).cursor))  # reading it stores it
        eng._check()
    assert 1 < _answerable(eng, h, cursors, now=49.0) < 40
    assert _answerable(eng, h, cursors[-2:], now=49.0) == 2, "the newest are kept"
    with pytest.raises(CursorExpired, match="invoke without since"):
        eng.invoke(h, now=49.0, since=cursors[0])
    eng._check()


def test_a_cursor_stores_nothing_until_read_nor_for_a_gone_handle() -> None:
    """With room for one stored answer, another handle's stored answer stays answerable
    while an answer's cursor is unread, and when a cursor is read for a handle that is
    gone; reading one for a live handle takes its place."""
    eng = _engine(budget=0)
    h, kept = eng.register(QUERIES[4]), eng.register(QUERIES[4])
    eng.insert("R", [(1, 1), (2, 2)], ts=10.0)
    first = eng.invoke(kept, now=10.0).cursor
    assert first is not None
    late = eng.invoke(h, now=10.0)               # its cursor not read yet
    gone = eng.register(QUERIES[4])
    orphan = eng.invoke(gone, now=10.0)
    eng.unregister(gone)
    assert orphan.cursor
    assert _answerable(eng, kept, [first], now=10.0) == 1, "nothing else stored"
    assert late.cursor                           # stored now, in place of the other
    assert _answerable(eng, h, [str(late.cursor)], now=10.0) == 1
    with pytest.raises(CursorExpired):
        eng.invoke(kept, now=10.0, since=first)
    eng._check()


def test_a_cursor_survives_a_restart(tmp_path: Path) -> None:
    with psoup.Engine(path=str(tmp_path), chunk_rows=4) as eng:
        eng.execute("CREATE STREAM R (a INT, b INT) RETAIN 14 ROWS")
        h = eng.register(QUERIES[0])
        eng.insert("R", [(1, 3), (2, 4)], ts=10.0)
        first = eng.invoke(h, now=10.0)
    assert stat.S_IMODE(os.stat(tmp_path / SECRET_FILE).st_mode) == 0o600
    with psoup.Engine(path=str(tmp_path), chunk_rows=4) as eng:
        eng.insert("R", [(3, 5), (4, 0)], ts=14.0)
        changes = eng.invoke(h, now=17.0, since=first.cursor)
        assert isinstance(changes, Changes)
        assert changes.inserted.rows == [(3,)] and changes.deleted.rows == [(1,), (2,)]
        again = eng.invoke(h, now=17.0, since=changes.cursor)
        assert len(again) == 0


def test_a_stored_answer_does_not_survive_a_restart(tmp_path: Path) -> None:
    with psoup.Engine(path=str(tmp_path)) as eng:
        eng.execute("CREATE STREAM R (a INT, b INT)")
        h = eng.register(QUERIES[4])
        cursor = eng.invoke(h, now=10.0).cursor
    with psoup.Engine(path=str(tmp_path)) as eng:
        with pytest.raises(CursorExpired, match="invoke without since") as err:
            eng.invoke(h, now=10.0, since=cursor)
        assert not isinstance(err.value, CursorInvalid)


def _flip(cursor: str, at: int) -> str:
    raw = bytearray(base64.urlsafe_b64decode(cursor))
    raw[at % len(raw)] ^= 1
    return base64.urlsafe_b64encode(bytes(raw)).decode()


@settings(max_examples=50, deadline=None)
@given(st.one_of(
    st.text(max_size=80),
    st.binary(max_size=60).map(lambda b: base64.urlsafe_b64encode(b).decode()),
    st.integers(0, 10 ** 4).map(lambda at: ("flip", at)),
    st.just(("other", 0)),
))
def test_a_garbled_or_forged_cursor_is_refused_clearly(
        bad: str | tuple[str, int] | None) -> None:
    eng = _engine()
    h, other = eng.register(QUERIES[0]), eng.register(QUERIES[3])
    eng.insert("R", [(1, 3)], ts=10.0)
    good = eng.invoke(h, now=10.0).cursor
    assert good is not None
    if isinstance(bad, tuple):
        bad = _flip(good, bad[1]) if bad[0] == "flip" else eng.invoke(other, now=10.0).cursor
    with pytest.raises(CursorInvalid, match="not issued by this engine") as err:
        eng.invoke(h, now=10.0, since=bad)
    assert err.value.code == "cursor_expired"
    eng._check()


@pytest.mark.parametrize("bad", [17, None, b"bytes", ["list"]])
def test_a_cursor_that_is_no_string_is_refused_clearly(bad: Any) -> None:
    eng = _engine()
    h = eng.register(QUERIES[0])
    with pytest.raises(CursorInvalid):
        eng.invoke(h, since=bad) if bad is not None else eng.invoke(h, since="")


@pytest.mark.parametrize("budget", [0, 64 << 20])
def test_a_range_whose_tuples_left_memory_falls_back_to_the_stored_copy(budget: int) -> None:
    eng = _engine(budget=budget)
    h = eng.register(QUERIES[3])                # everything retained: 14 rows
    eng.insert("R", [(1, 0), (2, 1)], ts=10.0)
    first = eng.invoke(h, now=10.0)
    assert first.cursor                         # issued (and the answer stored) now
    _ = eng.invoke(eng.register(QUERIES[0]), now=10.0).cursor   # the newest stored answer
    eng.insert("R", [(3, v) for v in range(20)], ts=11.0)    # first's chunk is dropped
    if budget == 0:
        with pytest.raises(CursorExpired, match="left memory"):
            eng.invoke(h, now=11.0, since=first.cursor)
    else:
        changes = eng.invoke(h, now=11.0, since=first.cursor)
        assert isinstance(changes, Changes)
        _assert_difference(changes, first, eng.invoke(h, now=11.0), QUERIES[3])
        assert changes.deleted.rows == [(0,), (1,)]
    eng._check()


def test_a_cursor_is_issued_when_first_read_and_is_the_one_issued_at_once() -> None:
    eng = _engine()
    h = eng.register(QUERIES[4])                 # an aggregate: answered from a copy
    eng.insert("R", [(1, 1), (2, 2)], ts=10.0)
    late = eng.invoke(h, now=10.0)               # its cursor not read yet (see above)
    eng.insert("R", [(1, 3)], ts=11.0)
    now = eng.invoke(h, now=11.0)
    assert now.cursor
    gone = eng.register(QUERIES[0])
    orphan = eng.invoke(gone, now=11.0)
    eng.unregister(gone)
    assert orphan.cursor
    eng.close()
    cursor = late.cursor                         # after later inserts, and close
    assert cursor == late.cursor
    assert _answerable(eng, h, [str(cursor), str(now.cursor)], now=11.0) == 2, "both stored"
    changes = eng.invoke(h, now=11.0, since=cursor)
    assert isinstance(changes, Changes)
    assert changes.inserted.rows == [(1, 2)] and changes.deleted.rows == [(1, 1)]
    assert changes.cursor == now.cursor
    kept = pickle.loads(pickle.dumps(eng.invoke(h, now=11.0)))    # issued when pickled
    assert kept.cursor == now.cursor and kept.rows == now.rows
    eng._check()
