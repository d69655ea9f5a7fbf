"""The archive's sampled layout and TABLESAMPLE (issue 18): uniform samples read for a
fraction of the I/O, scaled estimates whose intervals cover the truth, answers that
state their fidelity, and exact answers at 100%.

The oracle of the end-to-end tests is DuckDB over every tuple inserted, with each
archived tuple's draw read back from the part files: a tuple is in a query's sample
when it was archived before the history job (tupleID below the first one held in
memory then) and its draw is below the rate's threshold, or when it was not archived.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
import pytest

import psoup
from psoup.archive import rates, sampling
from psoup.archive.layout import SAMPLE_COLUMN, arrow_schema, part_path
from psoup.archive.parquet import Archive
from psoup.archive.policy import ArchiveRead, Schedule
from psoup.archive.sampling import draws_of
from psoup.errors import QueryError
from psoup.query import compile_statement
from psoup.query.model import SampleMethod
from psoup.results.aggregates import Aggregator
from psoup.results.result import Result
from psoup.server.protocol import decode_answer, encode_answer, pack_frame, unpack_payload
from tests.oracles import binomial_p_value
from tests.support import Clock, compiled_query, compiled_schema

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _table(n: int, first: int = 0) -> pa.Table:
    ids = np.arange(first, first + n)
    return pa.table({"ts": ids / 10.0, "tuple_id": ids, "a": ids % 13},
                    schema=arrow_schema("R", [("a", "int")]))


# ---------------------------------------------------------------------- the layout

def test_each_row_group_holds_one_draw_range_in_tuple_id_order() -> None:
    """Runs of 16,384 rows get 16 row groups of 64 draw values each; the last, shorter
    run fewer (7,232 rows: 4 groups of 256 values); every group in tupleID order."""
    sink = io.BytesIO()
    n, run = 40_000, 16 * rates.MIN_GROUP_ROWS
    sampling.write_runs(_table(n), np.random.default_rng(1), sink, run_rows=run)
    pf = pq.ParquetFile(sink)
    assert pf.metadata.num_row_groups == 16 + 16 + 4
    for g in range(pf.metadata.num_row_groups):
        part = pf.read_row_group(g)
        draws = part.column(SAMPLE_COLUMN).to_numpy()
        ids = part.column("tuple_id").to_numpy()
        width = rates.GROUP_WIDTH if g < 32 else rates.SAMPLE_SPACE // 4
        assert len(set((draws // width).tolist())) == 1, "a row group: one draw range"
        assert (np.diff(ids) > 0).all(), "a row group is in tupleID order"
    back = sampling.in_order(pq.read_table(sink))
    assert back.equals(_table(n))               # every row, back in order, draws dropped
    small = io.BytesIO()                        # a run of a few rows: one row group
    sampling.write_runs(_table(100), np.random.default_rng(1), small)
    assert pq.ParquetFile(small).metadata.num_row_groups == 1
    assert sampling.read_below(small, None, 256).num_rows < 100


@pytest.mark.parametrize("rate", [1 / 16, 0.25, 0.3, 0.75])
def test_a_sample_reads_only_the_row_groups_below_its_threshold(
        rate: float, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = io.BytesIO()
    sampling.write_runs(_table(4 * 16 * rates.MIN_GROUP_ROWS), np.random.default_rng(2), sink,
                        run_rows=16 * rates.MIN_GROUP_ROWS)
    whole = pq.read_table(sink)
    read_groups: list[int] = []
    real = pq.ParquetFile.read_row_groups

    def spy(self: pq.ParquetFile, groups: list[int], *args: Any, **kwargs: Any) -> pa.Table:
        read_groups.extend(groups)
        return real(self, groups, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    got = sampling.read_below(sink, None, rates.threshold(rate))
    limit = rates.threshold(rate)
    want = sampling.in_order(whole.filter(pc_less(whole.column(SAMPLE_COLUMN), limit)))
    assert got.equals(want)
    runs = 4
    assert len(read_groups) <= runs * math.ceil(limit / rates.GROUP_WIDTH)
    assert len(read_groups) < pq.ParquetFile(sink).metadata.num_row_groups or rate == 1


def pc_less(column: pa.ChunkedArray, limit: int) -> pa.Array:
    return pa.array(column.to_numpy() < limit)


def test_a_sample_is_uniform_per_stratum_by_a_binomial_test(tmp_path: Path) -> None:
    arc = Archive(tmp_path, seed=7)
    n = 200_000
    ids = np.arange(n)
    arc.add("R", [("a", "int")], {"ts": ids / 100.0, "tupleID": ids, "a": ids % 10})
    arc.flush()
    rate = 0.25
    got = pa.concat_tables([sampling.read_below(p, None, rates.threshold(rate))
                            for p in sorted(tmp_path.rglob("*.parquet"))])
    sampled = np.zeros(n, bool)
    sampled[got.column("tuple_id").to_numpy()] = True
    real = rates.bernoulli_rate(rate)
    strata = {f"a={v}": ids % 10 == v for v in range(10)}
    strata |= {f"decile {d}": ids * 10 // n == d for d in range(10)}
    p_values = {name: binomial_p_value(int(sampled[mask].sum()), int(mask.sum()), real)
                for name, mask in strata.items()}
    # 20 strata, each at the 0.1% level: a fair sample fails one with probability < 2%
    assert min(p_values.values()) > 0.001, p_values
    # and a skewed one is caught: half the rate in one decile
    skewed = sampled.copy()
    skewed[: n // 10] &= np.arange(n // 10) % 2 == 0
    assert binomial_p_value(int(skewed[: n // 10].sum()), n // 10, real) < 0.001


def test_scaled_count_and_sum_intervals_cover_the_truth_in_93_percent_of_runs(
        tmp_path: Path) -> None:
    """Archives of the same rows, each with its own seed: the 95% intervals of the COUNT
    and SUM estimates from a 10% sample plus exact live rows cover the truth in at least
    93% of 400 runs. (The first 100 seeds gave 94 and 92 of 100: a calibrated 95%
    interval passes "93 of 100" only about 80% of the time, so this asks 93% of 400,
    which it passes about 95% of the time, and which an interval of 90% coverage
    fails about 99% of the time.)"""
    schema = compiled_schema("CREATE STREAM R (a INT, g INT)")
    query = compiled_query("SELECT COUNT(*), SUM(a) FROM R WHERE g < 3", schema)
    aggregator = Aggregator(query)
    gen = np.random.default_rng(11)
    n, live = 20_000, 500
    a, g = gen.integers(0, 100, n + live), gen.integers(0, 10, n + live)
    keep = g < 3
    truth = (int(keep.sum()), int(a[keep].sum()))
    covered = {"count(*)": 0, "sum(a)": 0}
    for seed in range(400):
        folder = tmp_path / str(seed)
        arc = Archive(folder, seed=seed)
        ids = np.arange(n)
        arc.add("R", [("a", "int"), ("g", "int")],
                {"ts": ids / 10.0, "tupleID": ids, "a": a[:n], "g": g[:n]})
        arc.flush()
        rows = pa.concat_tables([sampling.read_below(p, None, rates.threshold(0.1))
                                 for p in sorted(folder.rglob("*.parquet"))])
        tid = np.concatenate([rows.column("tuple_id").to_numpy(), np.arange(n, n + live)])
        mask = keep[tid]
        weights = np.where(tid < n, 1 / rates.bernoulli_rate(0.1), 1.0)[mask]
        got = aggregator.compute({(0, "a"): a[tid][mask]}, tid[mask] / 10.0, weights)
        (count, total), = got.rows
        covered["count(*)"] += abs(count - truth[0]) <= got.error["count(*)"][0]
        covered["sum(a)"] += abs(total - truth[1]) <= got.error["sum(a)"][0]
    assert min(covered.values()) >= 372, covered


def test_a_part_file_without_draws_is_read_whole_and_hashed_for_samples() -> None:
    ids = np.arange(100_000, dtype=np.int64)
    drawn = draws_of(None, ids)
    assert drawn.min() >= 0 and drawn.max() < rates.SAMPLE_SPACE
    assert abs((drawn < 256).mean() - 0.25) < 0.01
    raw = pa.array([3, None, 900], pa.int16())
    assert draws_of(raw, np.array([0, 1, 2])).tolist() == [3, draws_of(None, ids[1:2])[0], 900]


# ---------------------------------------------------------------------- the language

@pytest.mark.parametrize("sql, error", [
    ("SELECT * FROM R TABLESAMPLE BERNOULLI (0)", "percentage is in (0, 100]"),
    ("SELECT * FROM R TABLESAMPLE BERNOULLI (101)", "percentage is in (0, 100]"),
    ("SELECT * FROM R TABLESAMPLE HALF (5)", "BERNOULLI or SYSTEM"),
    ("SELECT * FROM R TABLESAMPLE BERNOULLI 5", "'(' and a percentage"),
    ("SELECT * FROM R TABLESAMPLE BERNOULLI (5) [RANGE 5]", "window goes before TABLESAMPLE"),
    ("SELECT * FROM R TABLESAMPLE BERNOULLI (5) REPEATABLE (1)", "REPEATABLE"),
    ("SELECT * FROM R r, R s TABLESAMPLE SYSTEM (5) WHERE r.a = s.a", "one stream"),
])
def test_bad_tablesample_clauses_are_named(sql: str, error: str) -> None:
    schema = compiled_schema("CREATE STREAM R (a INT)")
    with pytest.raises(QueryError, match=error.replace("(", r"\(").replace("[", r"\[")
                       .replace(")", r"\)").replace("]", r"\]")):
        compile_statement(sql, {"R": schema})


def test_tablesample_rates_bernoulli_rows_system_whole_row_groups() -> None:
    schema = compiled_schema("CREATE STREAM R (a INT)")
    q = compiled_query("SELECT * FROM R r [RANGE 1 HOUR] TABLESAMPLE SYSTEM (10)", schema)
    sample = q.sources[0].sample
    assert sample is not None
    assert (sample.method, sample.fraction) == ("SYSTEM", 0.1)
    assert rates.sample_rate(sample.method, sample.fraction) == 2 / 16
    assert rates.sample_rate(SampleMethod.BERNOULLI, 0.1) == 102 / 1024
    full = compiled_query("SELECT * FROM R TABLESAMPLE BERNOULLI (100)", schema)
    assert full.sources[0].sample is None


def test_fidelity_and_error_cross_the_wire() -> None:
    r = psoup.Result(["count(*)"], [(40.0,)], np.array([5.0]), np.array([-1]), cursor="c",
                     fidelity=[(-math.inf, 10.0, 0.25), (10.0, math.inf, 1.0)],
                     error={"count(*)": np.array([3.5])})
    back = decode_answer(unpack_payload(pack_frame(encode_answer(r))[4:]))
    assert isinstance(back, Result)
    assert back.fidelity == r.fidelity and not back.exact
    assert back.error["count(*)"].tolist() == [3.5]
    exact = decode_answer(unpack_payload(pack_frame(encode_answer(
        psoup.Result(["a"], [(1,)], np.array([5.0]), np.array([3]))))[4:]))
    assert isinstance(exact, Result)
    assert exact.exact and exact.error == {}


# ---------------------------------------------------------------------- end to end

def _engine(state: Path, seed: int
            ) -> tuple[psoup.Engine, np.random.Generator, dict[str, list[Any]]]:
    """A durable engine at `state` holding 3,000 tuples of R, 64 retained: (it, the rows
    inserted as columns)."""
    gen = np.random.default_rng(seed)
    eng = psoup.Engine(path=str(state), clock=Clock(0.0), chunk_rows=16)
    eng.execute("CREATE STREAM R (a INT, b FLOAT) RETAIN 64 ROWS")
    rows: dict[str, list[Any]] = {}
    return eng, gen, rows


def _fill(eng: psoup.Engine, gen: np.random.Generator, rows: dict[str, list[Any]],
          start: float, n: int) -> None:
    ts = start + np.arange(n, dtype=float)
    batch = {"a": gen.integers(0, 10, n), "b": np.round(gen.random(n), 3)}
    tids = eng.insert("R", batch, ts=ts)
    for name, values in (("ts", ts), ("tid", tids), *batch.items()):
        rows.setdefault(name, []).extend(values.tolist())


def _oracle(rows: dict[str, list[Any]], archive: Path) -> duckdb.DuckDBPyConnection:
    """DuckDB: `src` every tuple inserted, with its draw (NULL if not archived)."""
    con = duckdb.connect()
    con.register("inserted", pa.table(rows))
    files = sorted(archive.rglob("part-*.parquet"))
    draws = pa.concat_tables([pq.read_table(p, columns=["tuple_id", SAMPLE_COLUMN])
                              for p in files])
    con.register("draws", draws)
    con.execute("CREATE VIEW src AS SELECT i.*, d.psoup_sample AS draw FROM inserted i "
                "LEFT JOIN draws d ON d.tuple_id = i.tid")
    return con


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[Any, ...]:
    """The one row `sql` gives."""
    row = con.execute(sql).fetchone()
    assert row is not None
    return row


def _sampled_below(eng: psoup.Engine, handle: str) -> int:
    """The first tupleID the query's sampled tier did not read from the archive."""
    below = eng.stats()["queries"][handle]["sampled_below"]
    assert isinstance(below, int)
    return below


def _horizon(eng: psoup.Engine, stream: str) -> int:
    """The first tupleID `stream` holds in memory: the least one a query without
    history (and so memory only) answers with."""
    handle = eng.register(f"SELECT ts FROM {stream}")
    first = int(eng.invoke(handle).tuple_ids.min())
    eng.unregister(handle)
    return first


def test_tablesample_answers_equal_duckdb_over_the_sample_plus_memory(tmp_path: Path) -> None:
    eng, gen, rows = _engine(tmp_path / "s", 3)
    h = {"count": eng.register("SELECT COUNT(*), SUM(a), AVG(b) FROM R TABLESAMPLE "
                               "BERNOULLI (30) WHERE a > 2"),
         "rows": eng.register("SELECT a, b FROM R TABLESAMPLE SYSTEM (25) WHERE a >= 7 "
                              "BEGIN 100 END NOW"),
         "exact": eng.register("SELECT COUNT(*), SUM(a) FROM R TABLESAMPLE BERNOULLI (100) "
                               "WHERE a > 2")}
    _fill(eng, gen, rows, 0, 3000)
    eng.evaluate_history()
    _fill(eng, gen, rows, 3000, 200)         # the tiers follow the horizon, exactly
    below = min(_sampled_below(eng, h["count"]), _sampled_below(eng, h["rows"]))
    con = _oracle(rows, tmp_path / "s" / "archive")
    now = 3200.0
    weight = f"CASE WHEN tid < {below} THEN 1024.0 / {rates.threshold(0.3)} ELSE 1 END"
    inside = f"(tid >= {below} OR draw < {rates.threshold(0.3)})"
    count, total, var_c, var_s, avg = _one(
        con,
        f"SELECT SUM({weight}), SUM({weight} * a), SUM({weight} * {weight} - {weight}), "
        f"SUM(({weight} * {weight} - {weight}) * a * a), SUM({weight} * b) / SUM({weight}) "
        f"FROM src WHERE a > 2 AND {inside}")
    got = eng.invoke(h["count"], now=now)
    assert got.rows[0][:2] == pytest.approx((count, total))
    assert got.rows[0][2] == pytest.approx(avg)
    assert got.error["count(*)"][0] == pytest.approx(1.96 * math.sqrt(var_c))
    assert got.error["sum(a)"][0] == pytest.approx(1.96 * math.sqrt(var_s))
    (first_mem,) = _one(con, f"SELECT ts FROM src WHERE tid = {below}")
    assert got.fidelity == ((-math.inf, first_mem, rates.bernoulli_rate(0.3)),
                            (first_mem, math.inf, 1.0))

    want_rows = con.execute(
        f"SELECT a, b FROM src WHERE a >= 7 AND ts BETWEEN 100 AND {now} AND "
        f"(tid >= {below} OR draw < {rates.threshold(4 / 16)}) ORDER BY ts, tid").fetchall()
    got_rows = eng.invoke(h["rows"], now=now)
    assert got_rows.rows == [tuple(r) for r in want_rows]
    assert got_rows.fidelity[0][:1] == (100.0,) and got_rows.fidelity[0][2] == 0.25

    # 100 percent is the exact answer, over archive and memory
    exact = eng.invoke(h["exact"], now=now)
    assert exact.exact and exact.error == {}
    assert exact.rows == [tuple(_one(con, "SELECT COUNT(*), SUM(a) FROM src WHERE a > 2"))]

    # a restart keeps how the tiers were sampled
    eng.close()
    again = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(now))
    back = again.invoke(h["count"], now=now)
    assert back.rows == got.rows and back.fidelity == got.fidelity
    again._check()
    again.close()


def test_a_query_that_finds_nothing_in_its_sample_keeps_its_rate_across_a_restart(
        tmp_path: Path) -> None:
    eng, gen, rows = _engine(tmp_path / "s", 4)
    h = eng.register("SELECT COUNT(*) FROM R TABLESAMPLE BERNOULLI (5) WHERE a > 100")
    _fill(eng, gen, rows, 0, 1000)
    assert eng.evaluate_history() == {h: 0}
    first = eng.invoke(h, now=1000.0)
    assert first.rows == [(0.0,)] and not first.exact
    eng.close()
    again = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(1000.0))
    assert again.invoke(h, now=1000.0).fidelity == first.fidelity
    again.close()


def test_reshape_rewrites_an_old_archive_and_samples_then_read_its_draws(
        tmp_path: Path) -> None:
    from psoup.spark.reshape import reshape

    root = tmp_path / "arc"
    schema = arrow_schema("R", [("a", "int")])
    rows = 16 * rates.MIN_GROUP_ROWS                # a run of 16 row groups a file
    for k in range(3):                          # written by another tool: no draws
        table = _table(rows, first=rows * k).cast(schema)
        path = part_path(root, "R", 0.0, rows * k, rows * k + rows - 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
    before = Archive(root).read("R")
    report = reshape(root)
    assert (len(report.rewritten), report.rows, report.already) == (3, 3 * rows, 0)
    for path in root.rglob("part-*.parquet"):
        assert sampling.is_sampled(pq.read_schema(path))
        assert pq.ParquetFile(path).metadata.num_row_groups == rates.SAMPLE_GROUPS
    assert Archive(root).read("R").equals(before)           # the same rows, in order
    assert reshape(root).already == 3                        # again: nothing to do
    assert not list(root.rglob("*.tmp"))


# ---------------------------------------------------------------------- overload policy

def test_a_budget_picks_the_largest_whole_row_group_rate_that_fits() -> None:
    from psoup.archive.policy import Budget

    def rate(rows: int, seconds: float, rps: float = 1e6) -> float:
        (step,) = Budget(seconds).schedule(ArchiveRead("R", rows, 0, 0.0, 1.0, 2.0, rps))
        return step[1]

    assert rate(10**6, 1.0) == 1.0                     # fits: read everything
    assert rate(4 * 10**6, 1.0) == 0.25                # 4 s of reading in 1 s
    assert rate(4 * 10**6 + 1, 1.0) == 3 / 16          # just over: one group fewer
    assert rate(10**9, 1.0) == 1 / 16                  # never below one group
    assert rate(4 * 10**6, 1.0, rps=2e6) == 0.5        # a faster pass reads more


def test_by_age_and_caps_and_bad_schedules() -> None:
    from psoup.archive.policy import WHOLE, ByAge, capped, check_schedule

    read = ArchiveRead("R", 10, 80, 0.0, 9.0, 1000.0)
    schedule = ByAge([(100, 1.0), (500, 0.5)], older=0.1).schedule(read)
    assert schedule == ((-math.inf, 0.1), (500.0, 0.5), (900.0, 1.0))
    assert capped(schedule, 0.3) == ((-math.inf, 0.1), (500.0, 0.3))
    assert capped(WHOLE, 0.25) == ((-math.inf, 0.25),)
    for bad in [(), ((0.0, 1.0),), ((-math.inf, 0.0),), ((-math.inf, 1.0), (5.0, 2.0)),
                ((-math.inf, 1.0), (5.0, 0.5), (5.0, 0.4))]:
        with pytest.raises(ValueError):
            check_schedule(bad)
    with pytest.raises(ValueError, match="positive"):
        ByAge([(0, 1.0)], older=0.5)


def test_engine_refuses_two_policies_or_one_without_a_schedule(tmp_path: Path) -> None:
    from psoup.archive.policy import ConstantRate

    with pytest.raises(ValueError, match="not both"):
        psoup.Engine(archive_budget=1.0, archive_policy=ConstantRate(0.5))
    no_policy: Any = object()              # no schedule method: refused at run time
    with pytest.raises(ValueError, match="schedule"):
        psoup.Engine(archive_policy=no_policy)
    with pytest.raises(ValueError, match="positive"):
        psoup.Engine(archive_budget=0)


class _Broken:
    def schedule(self, read: ArchiveRead) -> Schedule:
        return ((0.0, 0.5),)                     # does not start at -inf


def test_a_policy_that_fails_starts_no_job_and_changes_nothing(tmp_path: Path) -> None:
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(0.0), chunk_rows=16,
                       archive_policy=_Broken())
    eng.execute("CREATE STREAM R (a INT) RETAIN 16 ROWS")
    h = eng.register("SELECT * FROM R")
    eng.insert("R", {"a": np.arange(200)}, ts=np.arange(200.0))
    with pytest.raises(psoup.PSoupError, match="archive policy"):
        eng.history()
    assert eng.invoke(h, now=200.0).tuple_ids.min() > 100      # memory only, as before
    with pytest.raises(psoup.PSoupError):
        eng.history_status()                     # no job was started
    eng._check()
    eng.close()


def test_an_age_policy_reads_old_data_thinner_and_answers_say_so(tmp_path: Path) -> None:
    from psoup.archive.policy import ByAge

    now = 3000.0
    policy = ByAge([(1000, 1.0)], older=0.25)            # ts >= 2000 whole, older 25%
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(now), chunk_rows=16,
                       archive_policy=policy)
    eng.execute("CREATE STREAM R (a INT, b FLOAT) RETAIN 64 ROWS")
    gen = np.random.default_rng(8)
    rows: dict[str, list[Any]] = {}
    count = eng.register("SELECT COUNT(*), SUM(a) FROM R WHERE a > 2")
    listed = eng.register("SELECT a FROM R TABLESAMPLE BERNOULLI (10) WHERE a < 5 "
                          "BEGIN 500 END NOW")
    _fill(eng, gen, rows, 0, 3000)
    eng.evaluate_history()
    assert eng.stats()["archive_reads"]["reduction"] == {"R": [[-math.inf, 0.25],
                                                               [2000.0, 1.0]]}
    below = _sampled_below(eng, count)
    eng.close()
    # the policy applies to invocations' reads of the tiers too: read them whole here
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(now))
    con = _oracle(rows, tmp_path / "s" / "archive")
    weight = f"CASE WHEN tid >= {below} OR ts >= 2000 THEN 1 ELSE 4 END"
    inside = f"(tid >= {below} OR ts >= 2000 OR draw < 256)"
    want = _one(con, f"SELECT SUM({weight}), SUM({weight} * a) FROM src WHERE a > 2 "
                     f"AND {inside}")
    got = eng.invoke(count, now=now)
    assert got.rows[0] == pytest.approx(want)
    assert got.fidelity == ((-math.inf, 2000.0, 0.25), (2000.0, math.inf, 1.0))
    # the query's own 10% caps the policy: ts >= 2000 at 10% too (below the horizon)
    thr = rates.threshold(0.1)
    want_rows = con.execute(
        f"SELECT a FROM src WHERE a < 5 AND ts BETWEEN 500 AND {now} AND "
        f"(tid >= {below} OR draw < {thr}) ORDER BY ts, tid").fetchall()
    assert eng.invoke(listed, now=now).rows == [tuple(r) for r in want_rows]
    eng.close()


def test_an_invocation_reads_a_sample_of_the_tier_when_the_policy_says_so(
        tmp_path: Path) -> None:
    """ConstantRate(0.25): the history job reads a quarter of the archive, and every
    invocation a quarter of the tier's files: the same archived tuples (a match keeps
    its tuple's draw, so the samples nest), a quarter of the matches found in memory
    (their draws are drawn when the tier is saved); the tuples in memory whole."""
    from psoup.archive.policy import ConstantRate

    now = 3000.0
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(now), chunk_rows=16,
                       archive_policy=ConstantRate(0.25))
    eng.execute("CREATE STREAM R (a INT, b FLOAT) RETAIN 64 ROWS")
    gen = np.random.default_rng(9)
    rows: dict[str, list[Any]] = {}
    h = eng.register("SELECT COUNT(*), SUM(a) FROM R WHERE a > 2")
    _fill(eng, gen, rows, 0, 3000)
    eng.evaluate_history()
    _fill(eng, gen, rows, 3000, 300)          # the tier gains matches from memory
    eng.commit()
    eng.close()                               # saved: every match of the tier on disk
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(now + 300),
                       archive_policy=ConstantRate(0.25))
    below = _sampled_below(eng, h)
    horizon = _horizon(eng, "R")
    con = _oracle(rows, tmp_path / "s" / "archive")
    files = [tmp_path / "s" / "tiers" / name
             for name in eng.stats()["queries"][h]["tier_files"]]
    files = [path for path in files if pq.read_metadata(path).num_rows]
    tier = pa.concat_tables([pq.read_table(p, columns=["tupleID", SAMPLE_COLUMN])
                             for p in files])
    saved = int(pa.compute.max(tier.column("tupleID")).as_py())
    con.register("tier", tier)
    # memory: whole; the tier's saved files: their draws below 256, a quarter; its
    # matches not saved yet (in memory, found again when the log was replayed): whole
    weight = f"CASE WHEN tid >= {horizon} OR tid > {saved} THEN 1.0 ELSE 4.0 END"
    want = _one(
        con,
        f"SELECT SUM({weight}), SUM({weight} * a) FROM src LEFT JOIN tier t "
        f"ON t.tupleID = src.tid WHERE a > 2 AND (tid >= {horizon} OR tid > {saved} OR "
        f"t.psoup_sample < 256)")
    assert below <= saved < horizon
    got = eng.invoke(h, now=now + 300)
    assert got.rows[0] == pytest.approx(want)
    assert not got.exact and got.fidelity[0][2] == 0.25
    assert eng.stats()["archive_reads"]["tier_reads"] == {h: 0.25}
    assert eng.invoke(h, now=now + 300).rows == got.rows     # from the cache, the same
    eng._check()
    eng.close()


def test_a_segment_across_an_age_boundary_reads_its_recent_matches_whole(
        tmp_path: Path) -> None:
    """ByAge at invocation: the history pass writes one segment holding matches on both
    sides of the boundary (ts 100 at NOW 400); an invocation reads it in parts, each at
    its own rate, so every match younger than 300 s is in the answer, and only the
    older ones are a quarter of them."""
    from psoup.archive.policy import ByAge

    now = 400.0
    eng = psoup.Engine(path=str(tmp_path / "s"), clock=Clock(now), chunk_rows=64,
                       archive_policy=ByAge([(300, 1.0)], older=0.25))
    eng.execute("CREATE STREAM R (a INT, b FLOAT) RETAIN 500 ROWS")
    gen = np.random.default_rng(10)
    rows: dict[str, list[Any]] = {}
    listed = eng.register("SELECT a FROM R WHERE a < 5 BEGIN 50 END NOW")
    count = eng.register("SELECT COUNT(*) FROM R WHERE a < 5 BEGIN 50 END NOW")
    ts = np.arange(4000) / 10.0
    batch = {"a": gen.integers(0, 10, 4000), "b": np.round(gen.random(4000), 3)}
    tids = eng.insert("R", batch, ts=ts)
    for name, values in (("ts", ts), ("tid", tids), *batch.items()):
        rows.setdefault(name, []).extend(values.tolist())
    eng.evaluate_history()
    first, last = eng.stats()["queries"][listed]["tier_files"][0][-47:-8].split("-")
    assert int(first) < 1000 < int(last)            # one file across ts 100 (tupleID 1000)
    con = _oracle(rows, tmp_path / "s" / "archive")
    young = {int(t) for (t,) in con.execute(
        f"SELECT tid FROM src WHERE a < 5 AND ts >= 100 AND ts <= {now}").fetchall()}
    old = {int(t) for (t,) in con.execute(
        "SELECT tid FROM src WHERE a < 5 AND ts >= 50 AND ts < 100").fetchall()}
    got = eng.invoke(listed, now=now)
    ids = set(got.tuple_ids.tolist())
    assert young <= ids, f"{len(young - ids)} of {len(young)} recent matches missing"
    assert ids - young <= old and 0 < len(ids - young) < len(old)
    assert got.fidelity == ((50.0, 100.0, 0.25), (100.0, now, 1.0))
    estimate = eng.invoke(count, now=now)
    assert estimate.fidelity == got.fidelity
    assert estimate.rows[0][0] == pytest.approx(len(young) + 4 * len(ids - young))
    again = eng.invoke(listed, now=now)                     # the file's read, cached
    assert again.tuple_ids.tolist() == got.tuple_ids.tolist()
    assert eng.stats()["archive_reads"]["tier_reads"][listed] == 0.25
    eng._check()
    eng.close()
