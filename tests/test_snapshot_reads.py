"""Invocations on reader threads beside the writer see a consistent snapshot.

A writer thread inserts batches into a stream that retention keeps short (so chunks
fill, seal, get sliced and expire under the readers), registers and unregisters other
queries (so slots are cleared and taken again), and now and then unregisters a polled
query and registers it again under a new handle; each change and the answers of every
polled handle right after it are one hold of the engine's lock, so the answers recorded
are those at each commit point. Reader threads invoke the polled handles all the while.
Every answer a reader gets must be the answer at some commit point, and a reader's
successive answers of one handle must never go back to an earlier commit. An
invocation of a handle unregistered meanwhile raises UnknownHandle, and only then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import psoup
from psoup import kernels
from psoup.errors import UnknownHandle
from psoup.options import ModeName
from psoup.results.answers import Answers
from psoup.results.partial import PartialResults

#: The polled queries: off the lock (selections; PARTITION BY off it but in PSoup-P),
#: and under it (an aggregate, with history none), over windows that move and expire.
POLLED = (
    "SELECT a, c FROM R [ROWS 150] WHERE a < 40",
    "SELECT a, b FROM R WHERE b > 0.5 BEGIN NOW - 3 END NOW",
    "SELECT DISTINCT a FROM R WHERE a IN (3, 10, 17, 24, 31)",
    "SELECT a FROM R [PARTITION BY a ROWS 2] WHERE a > 90",
    "SELECT a, tupleID FROM R WHERE a > 95",
    "SELECT COUNT(*), SUM(a) FROM R [ROWS 100] WHERE a > 50",
)
#: Queries the writer registers and unregisters (their slots are taken again).
CHURN = ("SELECT a FROM R WHERE a < {k}", "SELECT c FROM R WHERE a = {k}")

Key = tuple[tuple[Any, ...], ...]


def _answer_key(answer: psoup.Result) -> Key:
    """What two answers must agree on: their rows, with each row's tupleID."""
    return tuple(zip([tuple(row) for row in answer.rows], answer.tuple_ids.tolist(),
                     strict=True))


def _record(eng: psoup.Engine, handles: list[str], history: dict[str, list[Key]]) -> None:
    """Under the engine's lock: every polled handle's answer now, as the next commit."""
    for handle in handles:
        history.setdefault(handle, []).append(_answer_key(eng.invoke(handle)))


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    batches = draw(st.lists(st.integers(1, 300), min_size=8, max_size=20))
    return {"batches": batches, "seed": draw(st.integers(0, 2**32 - 1)),
            "retain": draw(st.sampled_from(["RETAIN 400 ROWS", "RETAIN 6 SECONDS"])),
            "chunk_rows": draw(st.sampled_from([64, 128, 100])),
            "cache": draw(st.sampled_from([0, 64 << 20]))}


@pytest.mark.parametrize("mode", ["partial", "complete", "nomat"])
@settings(max_examples=15, deadline=None)
@given(scenario=scenarios())
def test_every_answer_is_the_answer_at_a_commit(mode: ModeName,
                                                scenario: dict[str, Any]) -> None:
    rng = np.random.default_rng(scenario["seed"])
    now = [1000.0]
    eng = psoup.Engine(mode=mode, clock=lambda: now[0], chunk_rows=scenario["chunk_rows"],
                       answer_cache_bytes=scenario["cache"])
    if scenario["cache"]:       # reuse every last answer, small as the windows are
        eng._core.answers.recent.skip_rows_per_ns = 1e-9
    eng.execute(f"CREATE STREAM R (a INT, b FLOAT, c TEXT) {scenario['retain']}")
    polled = [eng.register(sql) for sql in POLLED]
    current = list(polled)                  # the handle of each polled query now
    ever = list(polled)                     # every polled handle (appended to only)
    history: dict[str, list[Key]] = {}
    gone: set[str] = set()
    churn: list[str] = []
    with eng.locked():
        _record(eng, current, history)
    done = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for i, n in enumerate(scenario["batches"]):
                a = rng.integers(0, 100, n)
                with eng.locked():
                    now[0] += 1.0
                    eng.insert("R", {"a": a, "b": rng.random(n),
                                     "c": np.array([f"c{v}" for v in a], dtype=object)},
                               ts=now[0])
                    _change(eng, i, churn, current, ever, gone, rng)
                    _record(eng, current, history)
        except BaseException as exc:   # reported by the test thread
            failures.append(exc)
        finally:
            done.set()

    got: list[list[tuple[str, Key | None]]] = [[], []]

    def read(out: list[tuple[str, Key | None]]) -> None:
        try:
            k = 0
            while not done.is_set() or k < 3 * len(current):
                handle = current[k % len(current)] if k % 5 else ever[k % len(ever)]
                k += 1
                try:
                    out.append((handle, _answer_key(eng.invoke(handle))))
                except UnknownHandle:
                    out.append((handle, None))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write)] + [
        threading.Thread(target=read, args=(out,)) for out in got]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    for out in got:
        _check_reads(out, history, gone)
    eng._check()


def _change(eng: psoup.Engine, i: int, churn: list[str], current: list[str],
            ever: list[str], gone: set[str], rng: np.random.Generator) -> None:
    """The writer's other changes after batch i: queries come and go."""
    if churn and i % 2:
        eng.unregister(churn.pop(0))
    if i % 3 == 0:
        k = int(rng.integers(0, 100))
        churn.append(eng.register(CHURN[i % 2].format(k=k)))
    if i % 4 == 1:                          # a polled query leaves and comes back
        j = int(rng.integers(0, len(current)))
        eng.unregister(current[j])
        gone.add(current[j])
        current[j] = eng.register(POLLED[j])
        ever.append(current[j])


def _check_reads(out: list[tuple[str, Key | None]], history: dict[str, list[Key]],
                 gone: set[str]) -> None:
    """Each answer is one at a commit point, and a thread's answers of a handle never
    go back to an earlier commit; UnknownHandle only for a handle gone."""
    earliest: dict[str, int] = {}
    for handle, key in out:
        if key is None:
            assert handle in gone, "UnknownHandle for a handle still registered"
            continue
        commits = history[handle]
        at = earliest.get(handle, 0)
        later = [i for i in range(at, len(commits)) if commits[i] == key]
        assert later, (f"an answer of {handle[:8]} at no commit point from "
                       f"{at} on: {key[:5]}...")
        earliest[handle] = later[0]


# ---------------------------------------------------------------------------- between
# the cut and the read: what a writer does there, done on the reader's own thread (off
# the lock, as a writer thread would), at once after the cut


def _meanwhile(monkeypatch: pytest.MonkeyPatch, act: Callable[[], None]) -> list[int]:
    """Have `act` run once between the next off-lock invocation's cut and its read;
    returns a list that counts the reads off the lock."""
    read_cut = Answers._read_cut
    reads: list[int] = []

    def patched(self: Answers, *args: Any) -> Any:
        reads.append(1)
        if len(reads) == 1:
            act()
        return read_cut(self, *args)
    monkeypatch.setattr(Answers, "_read_cut", patched)
    return reads


def _engine(mode: ModeName) -> psoup.Engine:
    eng = psoup.Engine(mode=mode, clock=lambda: 1000.0, chunk_rows=64)
    eng.execute("CREATE STREAM R (a INT, c TEXT) RETAIN 100 ROWS")
    return eng


def _rows(eng: psoup.Engine, n: int, value: int) -> None:
    eng.insert("R", {"a": np.full(n, value), "c": np.array([f"v{value}"] * n, object)},
               ts=1000.0)


@pytest.mark.parametrize("mode", ["partial", "complete", "nomat"])
def test_a_query_leaving_during_a_read_is_read_again(mode: ModeName,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    eng = _engine(mode)
    h = eng.register("SELECT a, c FROM R WHERE a = 1")
    eng.insert("R", {"a": np.arange(90) % 3, "c": np.array(["x"] * 90, object)})
    taken: list[str] = []

    def swap() -> None:         # the slot cleared and taken by a query matching others
        eng.unregister(h)
        taken.append(eng.register("SELECT a, c FROM R WHERE a = 2"))
    reads = _meanwhile(monkeypatch, swap)
    with pytest.raises(UnknownHandle):
        eng.invoke(h)
    assert len(reads) == 1, "read again, under the lock: the handle is gone"
    assert eng.invoke(taken[0]).to_numpy()["a"].tolist() == [2] * 30


@pytest.mark.parametrize("mode", ["partial", "complete", "nomat"])
@pytest.mark.parametrize("defer", [True, False])
def test_a_read_sees_its_cut_whatever_expires_or_widens_meanwhile(
        mode: ModeName, defer: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = _engine(mode)
    eng._core.answers.defer_identity = defer
    h = eng.register("SELECT a, c FROM R WHERE a < 5")
    for value in range(3):
        _rows(eng, 40, value)           # 120 rows: two chunks, the first half expired
    expected = eng.invoke(h)

    def churn() -> None:
        for value in range(5, 9):       # every chunk of the cut expires; spares reused
            _rows(eng, 70, value)
        for k in range(70):             # the bitmap widens: slots of a second word
            eng.register(f"SELECT a FROM R WHERE a = {k}")
        _rows(eng, 200, 1)
    _meanwhile(monkeypatch, churn)
    got = eng.invoke(h)
    assert got.rows == expected.rows and got.tuple_ids.tolist() == expected.tuple_ids.tolist()
    assert eng.invoke(h).to_numpy()["a"].tolist() == [1] * 100
    eng._check()


def test_a_row_sliced_while_a_read_holds_its_chunk_is_sliced_in_a_copy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    eng = psoup.Engine(clock=lambda: 1000.0, chunk_rows=64)
    eng.execute("CREATE STREAM R (a INT, c TEXT)")
    h1 = eng.register("SELECT a FROM R WHERE a = 1")
    h2 = eng.register("SELECT a FROM R WHERE a = 2")        # the same word row
    eng.insert("R", {"a": np.arange(100) % 3, "c": np.array(["x"] * 100, object)})
    expected = eng.invoke(h1).tuple_ids.tolist()
    bitmap = eng._core.kept.selections
    assert isinstance(bitmap, PartialResults)
    held = bitmap._bitmaps["R"][1]          # unsealed at the cut: read word-major

    def seal_and_slice() -> None:
        eng.insert("R", {"a": np.arange(40) % 3, "c": np.array(["y"] * 40, object)})
        assert len(eng.invoke(h2)) == 46     # its cut slices chunk 1's row
    _meanwhile(monkeypatch, seal_and_slice)
    assert eng.invoke(h1).tuple_ids.tolist() == expected
    now = bitmap._bitmaps["R"][1]
    assert now is not held, "the row was sliced in a copy of the chunk"
    forms = [chunk.base[0, 64] for chunk in (held, now) if chunk.base is not None]
    assert forms == [kernels.WORD_MAJOR, kernels.SLICED], "the read's chunk as it was"
    assert eng.invoke(h1).tuple_ids.tolist() == \
        [t for t in range(100) if t % 3 == 1] + [t for t in range(100, 140) if t % 3 == 2]
    eng._check()
