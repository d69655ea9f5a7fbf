"""A probe split over threads gives exactly the bits of the probe on one thread.

`PROBE_SPLIT` is lowered to one word here, so that batches of a few tuples are split
too (at the engine's threshold only batches of tens of thousands of tuples are): the
bits of every query's every tuple, and so every answer, must not change. The split
cuts a batch's pieces at cache lines of their rows, which lie wherever the chunk and
the batch put them, so small chunks (many pieces per batch) and more threads than the
machine's cores are used as well.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from numpy.typing import NDArray

import psoup
import psoup.stems.query_stem as query_stem
from psoup.cli.main import main
from psoup.kernels.layout import BLOCK_FROM_WORDS
from psoup.options import ModeName
from psoup.results.partial import PartialResults
from psoup.stems.query_stem import QuerySteM
from psoup.workers import Workers, check_threads, default_threads
from tests.strategies import Scenario, StemScenario, scenarios, stem_scenarios
from tests.support import Clock, Streams, compiled_query, compiled_schema, create, probe_columns


@pytest.fixture(autouse=True)
def split_everything(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every probe of more than one tuple split (the engine's threshold is ~2^18 words),
    into shrinking shares."""
    monkeypatch.setattr(query_stem, "PROBE_SPLIT", 1)
    monkeypatch.setattr(query_stem, "SHRUNK_WORDS", 1)
    yield


# ---------------------------------------------------------------- the Query SteM alone


def _probed(stem: QuerySteM, cols: dict[str, NDArray[Any]], n: int,
            chunk_rows: int, first: int) -> NDArray[np.uint64]:
    """The probe of n tuples written as PSoup-P writes it: into chunks of `chunk_rows`
    from position `first`, read back as (words, n)."""
    results = PartialResults(chunk_rows)
    pieces = results.destination("R", first, n, stem.words)
    stem.probe_into("R", cols, pieces)
    return np.concatenate([out.copy() for _, _, out in pieces], axis=1)


@given(stem_scenarios(), st.sampled_from([1, 8, 9, 64, 8192]), st.integers(0, 70),
       st.integers(2, 5))
def test_split_probe_writes_the_bits_of_one_thread(scenario: StemScenario, chunk_rows: int,
                                                   first: int, threads: int) -> None:
    columns, steps = scenario
    ddl = "CREATE STREAM R (" + ", ".join(f"{c} {t.upper()}" for c, t in columns) + ")"
    schema = compiled_schema(ddl)
    one, many = QuerySteM(), QuerySteM(workers=Workers(threads))
    tid = 0
    for kind, arg in steps:
        if kind == "register":
            sql = "SELECT * FROM R" + (f" WHERE {arg}" if arg else "")
            query = compiled_query(sql, schema)
            assert one.insert(query) == many.insert(query)
        elif kind == "remove" and one.queries:
            slot = sorted(one.queries)[arg % len(one.queries)]
            one.remove(slot)
            many.remove(slot)
        elif kind == "probe":
            cols = probe_columns(schema, arg, tid)
            tid += len(arg)
            want = _probed(one, cols, len(arg), chunk_rows, first)
            got = _probed(many, cols, len(arg), chunk_rows, first)
            assert np.array_equal(want, got)
            assert np.array_equal(one.probe("R", cols, len(arg)),
                                  many.probe("R", cols, len(arg)))
    many._check()
    many.workers.close()


def test_values_outside_the_direct_map_are_looked_up_on_the_calling_thread() -> None:
    # the second batch's values fall outside the direct maps the first built: every
    # share misses, the keys are looked up again once, and the shares probed again
    schema = compiled_schema("CREATE STREAM R (a INT, b INT)")
    gen = np.random.default_rng(3)
    one, many = QuerySteM(), QuerySteM(workers=Workers(3))
    for i in range(200):
        query = compiled_query(f"SELECT * FROM R WHERE a > {int(gen.integers(0, 100))}"
                               + (f" AND b <= {int(gen.integers(0, 100))}" if i % 2 else ""),
                               schema)
        one.insert(query)
        many.insert(query)
    for lo, hi in ((0, 100), (-10**6, 10**6), (10**9, 10**12)):
        n = 1000
        cols = {"a": gen.integers(lo, hi, n), "b": gen.integers(lo, hi, n)}
        assert np.array_equal(_probed(one, cols, n, 256, 5), _probed(many, cols, n, 256, 5))
    many.workers.close()


def test_shares_are_whole_lines_and_cover_the_batch_once() -> None:
    stem = QuerySteM(workers=Workers(3))
    results = PartialResults(8192)
    pieces = results.destination("R", 8000, 1000, 4)      # two pieces, 192 + 808 tuples
    shares = stem._shares(pieces, 4)
    sizes = [sum(b - a for a, b, _ in share) for share in shares]
    least = -(-1000 // (3 * query_stem.SHARES_PER_THREAD))
    assert len(shares) > 3 and sizes == sorted(sizes, reverse=True), \
        "shares shrink, the largest taken first"
    assert sizes[0] <= 1000 // 12 + 8 and sizes[-1] >= least // 2 - 8
    covered = sorted((a, b) for share in shares for a, b, _ in share)
    assert covered[0][0] == 0 and covered[-1][1] == 1000
    assert all(b == c for (_, b), (c, _) in zip(covered[:-1], covered[1:], strict=True))
    starts = {a for a, _, _ in pieces}
    for share in shares:
        for a, _, out in share:
            assert a in starts or out.ctypes.data % 64 == 0, \
                "a cut inside a piece falls on a cache line of its rows"


def test_below_the_threshold_nothing_is_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(query_stem, "PROBE_SPLIT", 1 << 18)
    monkeypatch.setattr(query_stem, "SHRUNK_WORDS", 3 << 18)
    stem = QuerySteM(workers=Workers(2))
    pieces = PartialResults(8192).destination("R", 0, 8192, 16)
    assert len(stem._shares(pieces, 16)) == 1                   # 2^17 words: one share
    assert len(stem._shares(PartialResults(8192).destination("R", 0, 32768, 16), 16)) == 2
    shares = stem._shares(PartialResults(8192).destination("R", 0, 65536, 157), 157)
    sizes = [sum(b - a for a, b, _ in share) for share in shares]   # 2^23 words
    assert sizes[0] == 65536 // 8 and min(sizes) * 157 >= 1 << 18 and len(sizes) > 8
    shares = stem._shares(PartialResults(8192).destination("R", 0, 32768, 157), 157)
    sizes = [sum(b - a for a, b, _ in share) for share in shares]
    # 2^22 words: equal shares (shares of 2^19.3 would be), each cut moved up onto a
    # cache line of its rows (at most 7 rows, wherever the allocator put them), so a
    # share is 4,096 rows less what its start moved plus what its end did
    assert len(sizes) == 8 and sum(sizes) == 32768 and all(abs(k - 4096) < 64 for k in sizes)


@pytest.mark.parametrize("threads", [2, 3])
def test_a_probe_by_blocks_of_words_has_one_share_per_thread(threads: int) -> None:
    """From BLOCK_FROM_WORDS words a tuple, each share reads every block of the tables'
    rows once: one share per thread, equal but for the cuts moved onto cache lines."""
    stem = QuerySteM(workers=Workers(threads))
    words = BLOCK_FROM_WORDS + 40
    shares = stem._shares(PartialResults(8192).destination("R", 100, 16384, words), words)
    sizes = [sum(b - a for a, b, _ in share) for share in shares]
    assert len(sizes) == threads and sum(sizes) == 16384
    assert max(sizes) - min(sizes) <= 16
    below = stem._shares(PartialResults(8192).destination("R", 0, 16384, 200), 200)
    assert len(below) > 8, "below it, the shares shrink as before"


# ---------------------------------------------------------------- whole engines


def _replay(eng: psoup.Engine, streams: Any, ops: Sequence[tuple[Any, ...]],
            clock: Clock) -> list[Any]:
    """Run a scenario's operations; every invocation's rows, in order."""
    create(eng, streams)
    seen: list[Any] = []
    handles: list[str] = []
    last = dict.fromkeys(streams, 1000.0)
    for op in ops:
        if op[0] == "insert":
            _, stream, rows, steps = op if len(op) == 4 else ("insert", "R", *op[1:])
            ts = list(last[stream] + np.cumsum(steps))
            last[stream] = ts[-1]
            clock.now = max(clock.now, ts[-1])
            eng.insert(stream, rows, ts=ts)
        elif op[0] == "register":
            handles.append(eng.register(op[1][0]))
        elif op[0] == "invoke" and handles:
            seen.append(eng.invoke(handles[op[1] % len(handles)], now=clock.now + op[2]).rows)
        elif op[0] == "unregister" and handles:
            eng.unregister(handles.pop(op[1] % len(handles)))
        elif op[0] == "invoke_all":
            seen.extend(eng.invoke(h, now=clock.now + op[1]).rows for h in handles)
    eng._check()
    return seen


def _same_with_threads(scenario: Scenario, mode: ModeName, chunk_rows: int) -> None:
    streams, ops = scenario
    answers = []
    for threads in (1, 3):
        clock = Clock(1000.0)
        with psoup.Engine(mode=mode, clock=clock, chunk_rows=chunk_rows,
                          threads=threads) as eng:
            answers.append(_replay(eng, streams, ops, clock))
    assert answers[0] == answers[1]


@given(scenarios(), st.sampled_from(psoup.MODES), st.sampled_from([3, 8, 8192]))
def test_selections_answer_alike_on_one_thread_and_three(scenario: Scenario, mode: ModeName,
                                                         chunk_rows: int) -> None:
    _same_with_threads(scenario, mode, chunk_rows)


def _workload_ops(gen: np.random.Generator, joins: bool) -> list[tuple[Any, ...]]:
    """Registrations (selections, GROUP BY aggregates, and with `joins` joins of R and
    S), then batches of 1 to 300 tuples into both streams, each followed by an
    invocation of every query."""
    ops: list[tuple[Any, ...]] = []
    for i in range(150):
        a, b = int(gen.integers(-5, 60)), float(gen.integers(0, 50))
        sql = [f"SELECT * FROM R WHERE a > {a} AND b <= {b}",
               f"SELECT a, c FROM R WHERE c <> 'x' AND a < b + {a % 7}",
               f"SELECT c, COUNT(*), SUM(a), MAX(b) FROM R WHERE a >= {a} GROUP BY c",
               f"SELECT AVG(b) FROM R [ROWS 40] WHERE b > {b}"][i % 4]
        if joins and i % 10 == 9:
            sql = f"SELECT R.a, S.a FROM R, S WHERE R.a = S.a AND S.b < {b}"
        ops.append(("register", (sql, None)))
    texts = np.array(["x", "y", "zz", "é", ""])
    for step in range(12):
        for stream in ("R", "S") if joins else ("R",):
            n = int(gen.integers(1, 300))
            spread = 10 ** int(gen.integers(2, 7))      # later batches leave the direct map
            rows = list(zip(gen.integers(-spread, spread, n).tolist(),
                            gen.integers(0, 60, n).astype(float).tolist(),
                            texts[gen.integers(0, len(texts), n)].tolist(), strict=True))
            ops.append(("insert", stream, rows, [0.5] * n))
        ops.append(("invoke_all", step % 3 - 1))
    return ops


@pytest.mark.parametrize("mode", psoup.MODES)
@pytest.mark.parametrize("joins", [False, True])
def test_aggregates_and_joins_answer_alike_on_one_thread_and_three(mode: ModeName,
                                                                   joins: bool) -> None:
    columns = [("a", "int"), ("b", "float"), ("c", "text")]
    streams: Streams = {"R": (columns, ("rows", 500)), "S": (columns, None)}
    ops = _workload_ops(np.random.default_rng(11 + joins), joins)
    _same_with_threads((streams, ops), mode, 64)


# ---------------------------------------------------------------- the option


def test_threads_default_to_the_cores_and_one_is_todays_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_threads() >= 1
    with psoup.Engine() as eng:
        assert eng._core.query_stem.workers.threads == default_threads()
    with psoup.Engine(threads=1) as eng:
        stem = eng._core.query_stem
        assert stem.workers.threads == 1

        def no_shares(*args: Any) -> Any:
            raise AssertionError("one thread asks for no shares")
        monkeypatch.setattr(stem, "_shares", no_shares)
        eng.execute("CREATE STREAM R (a INT)")
        h = eng.register("SELECT a FROM R WHERE a > 5")
        eng.insert("R", {"a": np.arange(10_000)}, ts=1.0)
        assert len(eng.invoke(h, now=1.0).rows) == 10_000 - 6


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_bad_thread_counts_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="threads must be a whole number >= 1"):
        check_threads(bad)
    if bad is not None:             # (None is Engine's default: the cores)
        with pytest.raises(ValueError, match="threads must be a whole number >= 1"):
            psoup.Engine(threads=bad)


def test_the_calling_thread_does_every_share_a_held_back_thread_does_not_take() -> None:
    # the pool's thread is held until the caller has taken every task: the caller runs
    # them all and does not wait for the thread, which then finds nothing left
    workers = Workers(2)
    gate = threading.Event()
    workers.run([lambda: 0, lambda: 0])         # the pool's thread exists and is idle
    assert workers._pool is not None
    workers._pool.submit(gate.wait)             # ... and is now busy
    ran: list[str] = []

    def task(i: int) -> int:
        ran.append(threading.current_thread().name)
        return i
    got = workers.run([partial(task, i) for i in range(6)])
    assert got == list(range(6))
    assert ran == [threading.current_thread().name] * 6
    gate.set()
    workers.close()


def test_a_failing_share_raises_once_every_share_has_ended() -> None:
    workers = Workers(3)
    ended: list[int] = []

    def fail() -> int:
        raise RuntimeError("boom")

    def slow(i: int) -> int:
        ended.append(i)
        return i
    with pytest.raises(RuntimeError, match="boom"):
        workers.run([fail, lambda: slow(1), lambda: slow(2)])
    assert sorted(ended) == [1, 2]
    assert workers.run([lambda: 7, lambda: 8, lambda: 9]) == [7, 8, 9]
    workers.close()


# ---------------------------------------------------------------- the command line


def _seen_threads(monkeypatch: pytest.MonkeyPatch, target: Any, name: str) -> list[Any]:
    """Replace target.name by a recorder of the `threads` it is called with."""
    seen: list[Any] = []

    def record(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("threads"))
        return {}
    monkeypatch.setattr(target, name, record)
    return seen


@pytest.mark.parametrize("given_", [[], ["--threads", "1"], ["--threads", "4"]])
def test_serve_and_demo_pass_threads_on(monkeypatch: pytest.MonkeyPatch,
                                        given_: list[str]) -> None:
    import psoup.cli.demo
    import psoup.server
    served = _seen_threads(monkeypatch, psoup.server, "run_server")
    demoed = _seen_threads(monkeypatch, psoup.cli.demo, "run_demo")
    runner = CliRunner()
    assert runner.invoke(main, ["serve", "--port", "0", *given_]).exit_code == 0
    assert runner.invoke(main, ["demo", *given_]).exit_code == 0
    want = int(given_[1]) if given_ else None        # None: the engine takes the cores
    assert served == [want] and demoed == [want]


def test_the_shell_runs_its_engine_on_the_threads_given(monkeypatch: pytest.MonkeyPatch) -> None:
    import psoup.engine
    made: list[int] = []

    class Recorded(psoup.engine.Engine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self._core.query_stem.workers.threads)
    monkeypatch.setattr(psoup.engine, "Engine", Recorded)
    result = CliRunner().invoke(main, ["shell", "--in-memory", "--threads", "3", "-c",
                                       "CREATE STREAM R (a INT);"])
    assert result.exit_code == 0, result.output
    assert made == [3]


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["demo"],
                                     ["shell", "--in-memory", "-c", "SHOW STREAMS;"]])
@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_bad_thread_counts_are_usage_errors(command: list[str], bad: str) -> None:
    result = CliRunner().invoke(main, [*command, "--threads", bad])
    assert result.exit_code == 2
    assert "--threads" in result.output
