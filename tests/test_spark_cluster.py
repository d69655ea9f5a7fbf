"""psoup's Spark jobs on a real Spark standalone cluster on 127.0.0.1: a master and two
workers started from the installed pyspark's `spark-class`, whose executors run a Python
that has psoup's dependencies but not psoup (psoup ships itself: psoup.spark.session).
Import, replay and history run against it in driver processes of their own (a process
has one Spark session, and the test run's is local[2]); one worker is killed while the
import runs, and the answers must still equal DuckDB's over the same rows. An import
also runs with executors whose Python has none of psoup's dependencies either, through
the packed environment `psoup spark pack-env` builds (once per test session). Streams
FROM FILES run their Structured Streaming queries on it from a durable engine in a
psoup process of its own, probed in the executors (WITH (probe = 'executors'), on
workers without psoup's dependencies through the packed environment; and once probed
in the psoup process): answers equal DuckDB's over the landed files, with an executor
killed mid-batch, with the psoup process SIGKILLed mid-batch and started again, and
with queries registered during the ingest (covered by the history pass). Every process started is
stopped by its process group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
import pytest

from tests.support import bare_python, land, python_without_psoup, trace

pytestmark = pytest.mark.cluster

T0 = 1_767_225_600.0
COLUMNS = "lane INT, speed FLOAT, road TEXT"
QUERIES = ["SELECT lane, speed, road FROM traffic WHERE speed < 30.0",
           "SELECT road, speed FROM traffic WHERE lane = 3 AND speed >= 50.0"]

#: The cluster's URL, the environment for drivers, the log files, and each worker's
#: process and work directory.
Cluster = tuple[str, dict[str, str], list[Path], list[tuple[subprocess.Popen[bytes], Path]]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait(predicate: Callable[[], bool], seconds: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"{what} did not happen in {seconds:.0f} s\n{tails}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """spark://127.0.0.1:PORT with two workers of one core each; yields (url, env for
    drivers, log files, the workers' processes and work directories)."""
    root = tmp_path_factory.mktemp("cluster")
    home = Path(pyspark.__file__).parent
    python = python_without_psoup(root / "worker-env")
    port = _free_port()
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(root / "logs"), SPARK_WORKER_DIR=str(root / "work"),
               PYSPARK_PYTHON=str(python))
    env.pop("PSOUP_SPARK_CONF", None)
    # the drivers import the psoup under test (PYTHONPATH, when the run names one); the
    # master and workers, and so the executors, do not see it
    cluster_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    logs = [root / "master.log", root / "worker-1.log", root / "worker-2.log"]
    spark_class = str(home / "bin" / "spark-class")
    started = []
    try:
        with open(logs[0], "wb") as log:
            started.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(_free_port())],
                env=cluster_env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
                start_new_session=True))
        url = f"spark://127.0.0.1:{port}"
        _wait(lambda: b"I have been elected leader" in logs[0].read_bytes(), 120,
              "the Spark master's start", logs)
        workers = []
        for i in (1, 2):
            with open(logs[i], "wb") as log:
                started.append(subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", "--host",
                     "127.0.0.1", "--cores", "1", "--memory", "1g", "--work-dir",
                     str(root / f"work-{i}"), "--webui-port", str(_free_port()), url],
                    env=cluster_env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
                    start_new_session=True))
            workers.append((started[-1], root / f"work-{i}"))
        for i in (1, 2):
            def registered(log: Path = logs[i]) -> bool:
                return b"Successfully registered with master" in log.read_bytes()
            _wait(registered, 120, f"worker {i}'s registration", logs)
        yield url, env, logs, workers
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _readings(n: int) -> list[dict[str, Any]]:
    return [{"ts": T0 + i // 3, "lane": i % 5, "speed": round(5 + (i * 7.3) % 90, 1),
             "road": f"r{i % 7}"} for i in range(n)]


def _duckdb(rows: list[dict[str, Any]], sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    table = pa.Table.from_pylist(rows).cast(pa.schema([("ts", pa.float64()),
                                                       ("lane", pa.int32()),
                                                       ("speed", pa.float64()),
                                                       ("road", pa.string())]))
    con.register("traffic", table)
    return sorted(con.execute(sql).fetchall())


def _running_task(work: Path) -> bool:
    """An executor under the worker directory `work` has started a task."""
    return any(b"Running task" in p.read_bytes() for p in work.glob("app-*/*/stderr"))


@pytest.fixture(scope="session")
def packed_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The executors' packed environment, built once by `psoup spark pack-env` (pip
    takes the wheels from its cache when it holds them); the build's time and size are
    printed (pytest -s shows them)."""
    out = tmp_path_factory.mktemp("packed") / "psoup-env.tar.gz"
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "psoup.cli.main", "spark", "pack-env",
                           "--output", str(out)], capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, (done.stdout, done.stderr)
    print(f"\npacked environment: {out.stat().st_size / 2**20:.0f} MiB built in "
          f"{time.monotonic() - began:.0f} s; {done.stdout.strip()}")
    return out


def test_import_on_workers_without_psoups_dependencies_through_a_packed_env(
        cluster: Cluster, packed_env: Path, tmp_path: Path) -> None:
    url, env, logs, _ = cluster
    bare = bare_python(tmp_path / "bare")
    n = 20_000
    rows = _readings(n)
    (tmp_path / "readings.csv").write_text("ts,lane,speed,road\n" + "".join(
        f"{r['ts']},{r['lane']},{r['speed']},{r['road']}\n" for r in reversed(rows)))
    done = subprocess.run(
        [sys.executable, "-m", "psoup.cli.main", "archive", "import", "readings.csv",
         "--stream", "traffic", "--columns", COLUMNS, "--into", "arc", "--master", url,
         "--spark-env", str(packed_env)],
        env=dict(env, PYSPARK_PYTHON=str(bare)), cwd=tmp_path, capture_output=True,
        text=True, timeout=900)
    assert done.returncode == 0, (done.stdout, done.stderr,
                                  [p.read_text()[-2000:] for p in logs if p.exists()])
    assert done.stdout.startswith(f"{n:,} rows of traffic into arc")
    archived = pq.ParquetDataset(str(tmp_path / "arc" / "stream=traffic")).read()
    assert archived.num_rows == n and not list(tmp_path.rglob("*.tmp"))
    assert sorted(zip(archived.column("ts").to_pylist(), archived.column("lane").to_pylist(),
                      archived.column("speed").to_pylist(), strict=True)) == \
        sorted((r["ts"], r["lane"], r["speed"]) for r in rows)
    # the executors unpacked the environment and ran their Python workers from it
    unpacked = [p for p in (tmp_path.parent).glob("cluster*/work-*/app-*/*/psoup_env")]
    assert unpacked and all((p / "bin" / "python").exists() for p in unpacked)


# ---------------------------------------------------------------------- live sources

#: Standing queries over a stream FROM FILES, and each as DuckDB answers it over the
#: landed files (the view f); the selection's rows have ts first.
LIVE_QUERIES = ["SELECT lane, speed FROM traffic WHERE speed > 50.0",
                "SELECT lane, COUNT(*), MAX(speed) FROM traffic WHERE speed < 80.0 "
                "GROUP BY lane"]
LIVE_ORACLE = ["SELECT ts, lane, speed FROM f WHERE speed > 50.0 ORDER BY ts",
               "SELECT lane, COUNT(*), MAX(speed) FROM f WHERE speed < 80.0 "
               "GROUP BY lane ORDER BY lane"]

#: A psoup process whose durable engine (on the cluster's master) has a stream FROM
#: FILES (taking `per_batch` files a micro-batch, probed where `probe` says: in
#: Spark's executors by default) with LIVE_QUERIES registered, and the Spark settings
#: `conf`; it prints "ready", then "applied N" after each micro-batch N is applied (or
#: committed). On stdin, "rows N" waits for N rows in the stream (for a stream probed
#: in the executors: committed) and prints a JSON line of the answers (once the
#: history pass of the queries has covered every batch) and the source's counters;
#: "go" lets a held batch run;
#: "register" registers LIVE_QUERIES again (the answers are theirs from then on) and
#: prints a JSON line of the rows the stream had at that moment. With
#: "hold:N" it waits for "go" before collecting batch N (its tasks run after that);
#: with "kill" it SIGKILLs itself once batch 1 is in its log, before Spark commits it.
LIVE_CHILD = """
import json, os, signal, sys, threading, time
import psoup
from psoup.spark.live import LiveSources

data, inbox, url, fmt, how, queries, per_batch, conf, probe = sys.argv[1:]
go = threading.Event()
applied = LiveSources.apply

def apply(self, run, frame, batch_id):
    if how == "hold:%d" % batch_id:
        print("holding", batch_id, flush=True)
        if not go.wait(120):
            os._exit(3)
    applied(self, run, frame, batch_id)
    print("applied", batch_id, flush=True)
    if how == "kill" and batch_id == 1:
        os.kill(os.getpid(), signal.SIGKILL)

LiveSources.apply = apply
eng = psoup.Engine(path=data, spark_master=url, spark_conf=json.loads(conf))
if "traffic" not in eng.streams():
    eng.execute("CREATE STREAM traffic (lane INT, speed FLOAT) FROM FILES '%s' FORMAT %s "
                "WITH (maxFilesPerTrigger = %s, trigger = '500 milliseconds', probe = '%s')"
                % (inbox, fmt, per_batch, probe))
handles = [eng.register(q) for q in json.loads(queries)]

def rows():
    if probe == "executors":        # none in memory: the batches committed
        return eng.stats()["sources"]["traffic"].get("retained_rows", 0)
    return eng.describe("traffic")["rows_total"]

def invoke(handle):
    deadline = time.monotonic() + 120
    while True:
        try:
            return eng.invoke(handle)
        except psoup.HistoryPending:    # the history pass of a registration runs
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

print("ready", flush=True)
for line in sys.stdin:
    word, _, arg = line.strip().partition(" ")
    if word == "go":
        go.set()
        continue
    if word == "register":          # the answers are the new registrations' from now
        handles = [eng.register(q) for q in json.loads(queries)]
        print(json.dumps({"registered_at": rows()}), flush=True)
        continue
    deadline = time.monotonic() + 120
    while rows() < int(arg):
        if time.monotonic() > deadline:
            print(json.dumps({"timeout": eng.stats()["sources"]}), flush=True)
            os._exit(4)
        time.sleep(0.2)
    time.sleep(1.0)                 # a batch applied twice would show now
    selection, aggregate = (invoke(h) for h in handles)
    out = [[[t, *r] for t, r in zip(selection.ts.tolist(), selection.rows)],
           sorted(list(r) for r in aggregate.rows)]
    source = eng.stats()["sources"]["traffic"]
    print(json.dumps({"answers": out, "rows": rows(),
                      "source": {k: source[k] for k in ("batches", "replayed_batches",
                                                        "restarts", "last_error")}}),
          flush=True)
eng.close()
"""


class Live:
    """A LIVE_CHILD process: its lines read one at a time, its answers asked for."""

    def __init__(self, cluster: Cluster, tmp_path: Path, fmt: str, how: str = "",
                 per_batch: int = 1, conf: dict[str, str] | None = None,
                 executors_python: Path | None = None, probe: str = "executors") -> None:
        url, env, self.logs, _ = cluster
        if executors_python is not None:
            env = dict(env, PYSPARK_PYTHON=str(executors_python))
        self.stderr = tmp_path / f"psoup-{how or 'plain'}.log"
        with open(self.stderr, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", LIVE_CHILD, str(tmp_path / "data"),
                 str(tmp_path / "in"), url, fmt, how, json.dumps(LIVE_QUERIES),
                 str(per_batch), json.dumps(conf or {}), probe],
                env=env, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, text=True)
        self.expect("ready")

    def expect(self, prefix: str) -> str:
        """The next line starting with `prefix` (others, "applied N", are skipped)."""
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            assert line, f"the psoup process ended: {self.stderr.read_text()[-3000:]}"
            if line.startswith(prefix):
                return line.strip()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answers(self, rows: int) -> dict[str, Any]:
        self.send(f"rows {rows}")
        said: dict[str, Any] = json.loads(self.expect("{"))
        assert "timeout" not in said, said
        return said

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _live_oracle(inbox: Path, fmt: str) -> list[list[list[Any]]]:
    db = duckdb.connect()
    if fmt == "csv":
        db.execute(f"CREATE VIEW f AS SELECT lane::BIGINT AS lane, speed::DOUBLE AS speed, "
                   f"ts::DOUBLE AS ts FROM read_csv('{inbox}/*.csv', header = true)")
    else:
        db.execute(f"CREATE VIEW f AS SELECT * FROM read_parquet('{inbox}/*.parquet')")
    return [[list(r) for r in db.execute(sql).fetchall()] for sql in LIVE_ORACLE]


def _apps_with_tasks(cluster: Cluster) -> set[str]:
    """The applications whose executors ran a task on the cluster's workers."""
    return {p.parent.parent.name for _, work in cluster[3]
            for p in work.glob("app-*/*/stderr") if b"Running task" in p.read_bytes()}


def _executors(work: Path) -> list[int]:
    """The process ids of the executor JVMs a worker runs (their working directories
    are under its work directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes()
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if b"CoarseGrainedExecutorBackend" in command and cwd.startswith(str(work)):
            found.append(int(proc.name))
    return found


@pytest.mark.parametrize("probe", ["engine", "executors"])
def test_live_files_on_the_cluster_give_duckdbs_answers(cluster: Cluster, packed_env: Path,
                                                        tmp_path: Path, probe: str) -> None:
    """CSV files landing in a folder, several micro-batches, on the cluster's executors,
    whose Python has neither psoup nor its dependencies: the standing queries answer as
    DuckDB does over the same files. Probed in the psoup process, reading the files runs
    no Python there; probed in the executors, their Python comes from the packed
    environment, and the tasks probe and write each batch there."""
    from psoup.spark.packenv import settings
    inbox = tmp_path / "in"
    inbox.mkdir()
    before = _apps_with_tasks(cluster)
    live = Live(cluster, tmp_path, "csv", executors_python=bare_python(tmp_path / "bare"),
                probe=probe, conf=settings(packed_env) if probe == "executors" else None)
    try:
        land(inbox, "a.csv", trace(40, 0, 81))
        assert live.answers(40)["rows"] == 40
        land(inbox, "b.csv", trace(30, 40, 82))
        land(inbox, "c.csv", trace(25, 70, 83))
        got = live.answers(95)
        assert got["rows"] == 95
        assert got["answers"] == _live_oracle(inbox, "csv")
        assert got["source"]["batches"] == 3 and got["source"]["last_error"] is None
    finally:
        live.close()
    assert live.proc.returncode == 0, live.stderr.read_text()[-3000:]
    assert _apps_with_tasks(cluster) - before, "no task ran on the cluster's executors"
    if probe == "executors":            # the batches' files, written by the executors
        parts = list((tmp_path / "data" / "sources").glob("traffic.*/batches/*/part-*"))
        assert len(parts) >= 3


def _tasks_run(work: Path) -> list[str]:
    """The "Running task" lines of the executors under a worker's work directory."""
    return [line for p in work.glob("app-*/*/stderr")
            for line in p.read_text(errors="replace").splitlines() if "Running task" in line]


def test_live_source_keeps_every_row_once_when_an_executor_dies_mid_batch(
        cluster: Cluster, tmp_path: Path) -> None:
    """Parquet files; micro-batch 1 (two files, so two tasks, one on each worker's
    executor) starts with one executor frozen (SIGSTOP), so a task sent there hangs,
    and that executor is then SIGKILLed: Spark runs the task again (its second attempt,
    on the other executor or on the one the master starts on the worker in its place;
    or the scheduler had given the other one both), and the answers are every row
    once."""
    url, _, logs, workers = cluster
    alive = [work for proc, work in workers if proc.poll() is None]
    assert len(alive) == 2, "this test needs both workers (a test before it killed one)"
    victim_work, survivor_work = alive
    inbox = tmp_path / "in"
    inbox.mkdir()
    # each file its own partition (so its own task), however small
    live = Live(cluster, tmp_path, "parquet", "hold:1", per_batch=2,
                conf={"spark.sql.files.openCostInBytes": str(128 * 2**20)})
    try:
        land(inbox, "a.parquet", trace(30, 0, 91), "parquet")
        assert live.answers(30)["rows"] == 30
        def registered(work: Path) -> bool:
            return any(b"Successfully registered with driver" in p.read_bytes()
                       for p in work.glob("app-*/*/stderr"))
        _wait(lambda: registered(victim_work) and registered(survivor_work), 120,
              "an executor on each worker", logs)
        land(inbox, "b.parquet", trace(40, 30, 92), "parquet")
        land(inbox, "c.parquet", trace(35, 70, 93), "parquet")
        live.expect("holding 1")
        victims = _executors(victim_work)
        assert victims
        for pid in victims:
            os.kill(pid, signal.SIGSTOP)
        ran = len(_tasks_run(survivor_work))
        live.send("go")
        _wait(lambda: len(_tasks_run(survivor_work)) > ran, 60, "batch 1's task", logs)
        time.sleep(1.0)                 # the other task was sent to the frozen executor
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        assert live.answers(105)["rows"] == 105
        after = _tasks_run(survivor_work)[ran:]
        # the task the scheduler sent the frozen executor ran again (its second
        # attempt), here or on the executor the master started in the dead one's place;
        # or the scheduler had given both of batch 1's tasks to this executor
        retried = [t for t in after + _tasks_run(victim_work) if ".1 in stage" in t]
        assert retried or len(after) >= 2, "a task of batch 1 was lost with its executor"
        land(inbox, "d.parquet", trace(20, 105, 94), "parquet")
        got = live.answers(125)
        assert got["rows"] == 125
        assert got["answers"] == _live_oracle(inbox, "parquet")
        assert got["source"]["batches"] == 3 and got["source"]["replayed_batches"] == 0
        # the master started another executor on the worker
        _wait(lambda: bool(set(_executors(victim_work)) - set(victims)), 60,
              "a new executor on the worker", logs)
    finally:
        live.close()
    assert live.proc.returncode == 0, live.stderr.read_text()[-3000:]


def test_live_source_on_the_cluster_applies_a_batch_once_across_a_psoup_kill(
        cluster: Cluster, tmp_path: Path) -> None:
    """The psoup process is SIGKILLed after it logged micro-batch 1 and before Spark
    committed it; a new one on the same data directory gets batch 1 from Spark again,
    answers it as a duplicate, and goes on: no row lost or counted twice."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    first = Live(cluster, tmp_path, "csv", "kill")
    try:
        land(inbox, "a.csv", trace(12, 0, 101))
        first.expect("applied 0")
        land(inbox, "b.csv", trace(17, 12, 102))
        first.expect("applied 1")
        assert first.proc.wait(60) == -signal.SIGKILL
    finally:
        first.close()
    back = Live(cluster, tmp_path, "csv")
    try:
        back.expect("applied 1")        # Spark's batch 1 again, a duplicate to psoup
        land(inbox, "c.csv", trace(8, 29, 103))
        got = back.answers(37)
        assert got["rows"] == 37
        assert got["answers"] == _live_oracle(inbox, "csv")
        assert (got["source"]["batches"], got["source"]["replayed_batches"]) == (1, 1)
    finally:
        back.close()
    assert back.proc.returncode == 0, back.stderr.read_text()[-3000:]


def test_live_source_on_the_cluster_registration_during_ingest(cluster: Cluster,
                                                               tmp_path: Path) -> None:
    """Queries registered while micro-batches arrive (one file each) answer over every
    row, those before the registration and those after, each once."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    live = Live(cluster, tmp_path, "csv")
    try:
        for i in range(6):
            land(inbox, f"{i}.csv", trace(10, 10 * i, 111 + i))
        live.expect("applied 0")
        live.send("register")
        at = json.loads(live.expect("{"))["registered_at"]
        got = live.answers(60)
        assert 0 < at < 60, "registered before or after the ingest, not during it"
        assert got["rows"] == 60 and got["source"]["batches"] == 6
        assert got["answers"] == _live_oracle(inbox, "csv")
    finally:
        live.close()
    assert live.proc.returncode == 0, live.stderr.read_text()[-3000:]


def test_import_replay_and_history_on_a_cluster_whose_workers_lack_psoup(
        cluster: Cluster, tmp_path: Path) -> None:
    url, env, logs, workers = cluster
    n = 200_000
    rows = _readings(n)
    data = tmp_path / "readings.csv"
    data.write_text("ts,lane,speed,road\n" + "".join(
        f"{r['ts']},{r['lane']},{r['speed']},{r['road']}\n" for r in reversed(rows)))

    # import, with a relative --into (the executors write under the driver's directory);
    # a worker is killed as soon as one of its tasks runs: Spark retries on the other
    importing = subprocess.Popen(
        [sys.executable, "-m", "psoup.cli.main", "archive", "import", "readings.csv",
         "--stream", "traffic", "--columns", COLUMNS, "--into", "arc", "--master", url],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim, work = workers[0]
    _wait(lambda: _running_task(work) or importing.poll() is not None, 300,
          "a task on worker 1", logs)
    assert importing.poll() is None, "the import ended before a worker could be killed"
    os.killpg(victim.pid, signal.SIGKILL)
    out, err = importing.communicate(timeout=600)
    assert importing.returncode == 0, (out, err)
    assert out.startswith(f"{n:,} rows of traffic into arc")
    archived = pq.ParquetDataset(str(tmp_path / "arc" / "stream=traffic")).read()
    assert archived.num_rows == n and not list(tmp_path.rglob("*.tmp"))
    assert sorted(zip(archived.column("ts").to_pylist(), archived.column("lane").to_pylist(),
                      archived.column("speed").to_pylist(), strict=True)) == \
        sorted((r["ts"], r["lane"], r["speed"]) for r in rows)

    # replay into an engine and evaluate history over its archive, in one driver
    script = textwrap.dedent(f"""
        import json, sys
        import psoup
        from psoup.spark.replay import replay
        url, queries = sys.argv[1], json.loads(sys.argv[2])
        out = {{}}
        with psoup.Engine(path="state", spark_master=url) as eng:
            eng.execute("CREATE STREAM traffic ({COLUMNS}) RETAIN 500 ROWS")
            handles = [eng.register(q) for q in queries]
            report = replay(["arc"], eng, master=url)
            out["replayed"] = report.rows
            eng.checkpoint()            # what left retention goes to the archive
            out["history"] = eng.history_wait(eng.history())
            out["answers"] = [sorted(eng.invoke(h, now={T0 + 5000}).rows) for h in handles]
        print(json.dumps(out))
    """)
    said = _psoup_script(script, [url, json.dumps(QUERIES)], env, tmp_path, logs)
    got = json.loads(said.strip().splitlines()[-1])
    assert got["replayed"] == n
    assert got["history"]["state"] == "done", got["history"].get("error")
    for sql, answer in zip(QUERIES, got["answers"], strict=True):
        want = _duckdb(rows, sql)
        assert len(want) > 100
        assert [tuple(r) for r in answer] == want


def _psoup_script(script: str, args: list[str], env: dict[str, str], cwd: Path,
                  logs: list[Path]) -> str:
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout, done.stderr,
                                  [p.read_text()[-2000:] for p in logs if p.exists()])
    return done.stdout

