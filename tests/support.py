"""Small helpers shared by test modules: a settable clock, SQL literals, creating the
scenario's streams in an engine, inserting one batch everywhere, writing input files,
reading a reply frame off a raw socket, running a real server process to kill, a
Python that has psoup's dependencies but not psoup and one that has neither (for Spark
executors), engines that
always reuse their last answers, the count of an engine's bit-sliced rows, the
wait for an engine's automatic checkpoint, streams FROM a source that Spark does
not feed, files landing in a source's folder (`land`, with rows from `trace`), and
the queries over them with DuckDB's answers (`answers`, `oracle`, `wait_for`).
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pytest
from numpy.typing import NDArray

from psoup.archive.rollups import Rollups, Substitute, folder_for
from psoup.errors import PSoupError
from psoup.kernels import SLICED
from psoup.plans import Plan
from psoup.query import compile_statement
from psoup.query.model import Query, StreamSchema
from psoup.results import recent
from psoup.results.answers import Answers
from psoup.results.partial import PartialResults
from psoup.server.protocol import HEADER, unpack_payload
from psoup.stems.batch import make_batch

if TYPE_CHECKING:
    from psoup.client import Client
    from psoup.engine import Engine
    from tests.oracles import Oracle

#: A stream's declared columns as (name, type) pairs ("int", "float", "text", "bool").
Columns: TypeAlias = list[tuple[str, str]]
#: A stream's RETAIN rule: ("rows", n) or ("secs", seconds), or None for none.
Retain: TypeAlias = tuple[str, float] | None
#: The streams of a scenario: name -> (columns, retention).
Streams: TypeAlias = dict[str, tuple[Columns, Retain]]


class Clock:
    """A settable clock for engines under test: fixed at `now`, or advancing `tick`
    seconds per reading."""

    def __init__(self, now: float = 1000.0, tick: float = 0.0):
        self.now = now
        self.tick = tick

    def __call__(self) -> float:
        value = self.now
        self.now += self.tick
        return value


def sql_literal(value: object) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def insert_everywhere(engines: Mapping[Any, Engine], oracle: Oracle, stream: str,
                      rows: list[tuple[Any, ...]], ts: list[float]) -> None:
    """Insert one batch into every engine, which must hand out the same tupleIDs, and
    into the oracle."""
    tids: list[int] | None = None
    for eng in engines.values():
        got: list[int] = eng.insert(stream, rows, ts=ts).tolist()
        assert tids is None or got == tids
        tids = got
    assert tids is not None
    oracle.insert(stream, rows, ts, tids)


def insert_stepped(engines: Mapping[Any, Engine], oracle: Oracle, clock: Clock,
                   last_ts: dict[str, float], stream: str, rows: list[tuple[Any, ...]],
                   steps: Sequence[float], synced: bool = False) -> None:
    """Insert one batch everywhere, its ts advancing by `steps` from the stream's last ts
    (from the clock's NOW too, when `synced`); moves `last_ts` and the clock along."""
    ts: list[float] = []
    t = max(last_ts[stream], clock.now) if synced else last_ts[stream]
    for step in steps:
        t += step
        ts.append(t)
    last_ts[stream] = t
    clock.now = max(clock.now, t)
    insert_everywhere(engines, oracle, stream, rows, ts)


def create(engine: Engine, streams: Streams) -> None:
    for name, (columns, retain) in streams.items():
        cols = ", ".join(f"{c} {t.upper()}" for c, t in columns)
        clause = ""
        if retain:
            clause = f" RETAIN {retain[1]} ROWS" if retain[0] == "rows" else \
                f" RETAIN {retain[1]} SECONDS"
        engine.execute(f"CREATE STREAM {name} ({cols}){clause}")


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    """rows as a file whose format the extension names (.csv, .jsonl, else Parquet)."""
    if path.suffix == ".csv":
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def read_reply(sock: socket.socket) -> Any:
    """The next frame's message off a raw socket, or None when the server closed the
    connection first (before or in the middle of the frame)."""
    head = _read_exactly(sock, HEADER.size)
    if head is None:
        return None
    body = _read_exactly(sock, HEADER.unpack(head)[0])
    return None if body is None else unpack_payload(body)


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


SERVE = ("import sys; from psoup.server.server import run_server; "
         "run_server(sys.argv[1], port=int(sys.argv[2]), token=sys.argv[3], sync='group')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_listening(proc: subprocess.Popen[Any], port: int, seconds: float = 60.0) -> None:
    """Return once 127.0.0.1:port accepts connections; fail if `proc` exits first or
    `seconds` pass."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the server did not start listening"
            time.sleep(0.05)


def start_server(data_dir: Path, port: int, token: str,
                 env: Mapping[str, str] | None) -> tuple[subprocess.Popen[bytes], Client]:
    """A server process on 127.0.0.1:port over data_dir (sync="group"), and a Client of
    it once it answers."""
    from psoup.client import Client

    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(data_dir), str(port), token],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:
        try:
            return proc, Client(f"127.0.0.1:{port}", token=token, timeout=60)
        except PSoupError as err:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                assert proc.stderr is not None
                raise AssertionError(
                    f"server did not start: {proc.stderr.read().decode()}") from err
            time.sleep(0.1)


def python_without_psoup(folder: Path) -> Path:
    """A virtual environment in `folder` that sees this one's packages but not psoup,
    checked both ways; returns its python. A .pth line adds this environment's
    site-packages directory, and the .pth files there (psoup's editable finder) are not
    run for a directory added so."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    check = "import numpy, pyarrow, numba, msgpack, sortedcontainers, click"
    subprocess.run([str(python), "-c", check], check=True, cwd=folder)
    # the interpreter itself, whatever PYTHONPATH a test run was given
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    lacks = subprocess.run([str(python), "-c", "import psoup"], cwd=folder,
                           capture_output=True, text=True, env=bare)
    assert "No module named 'psoup'" in lacks.stderr, "this Python must lack psoup"
    return python


def bare_python(folder: Path) -> Path:
    """A virtual environment in `folder` with neither psoup nor any of its dependencies
    (nor pip), checked; returns its python: a Spark worker's Python before anything was
    installed for psoup."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    for module in ("psoup", "numpy", "pyarrow", "numba", "pandas", "msgpack",
                   "sortedcontainers"):
        lacks = subprocess.run([str(python), "-c", f"import {module}"], cwd=folder,
                               capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        assert f"No module named '{module}'" in lacks.stderr, f"this Python has {module}"
    return python


@contextmanager
def always_reuse() -> Iterator[None]:
    """Engines made in this block keep every selection answer they may and make the
    next one from it whenever the window moved forward (psoup.results.recent), however
    small the window: by default only large windows are worth it, which small test
    streams never reach. An engine's answers take their cost model from the module's
    constants when it is made, so engines made outside the block keep the real one."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(recent, "SKIP_ROWS_PER_NS", 1e-9)
        patch.setattr(recent, "FIXED_NS", 0)
        yield


@contextmanager
def quiet_sources() -> Iterator[None]:
    """Streams created FROM a Spark source in this block (of engines in this process)
    start no Spark query: the stream is one fed by a source, as its answers say
    (`Result.fresh_to`), but its tuples come from the test's inserts, which such a
    stream takes as any other. Spark need not start; pyspark must be installed, since
    CREATE STREAM ... FROM checks for it."""
    pytest.importorskip("pyspark")
    from psoup.spark.live import LiveSources

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LiveSources, "_start", lambda self, schema, folder: None)
        yield


def sliced_rows(engine: Engine) -> int:
    """How many word rows of a PSoup-P engine's bitmap chunks are bit-sliced
    (psoup.kernels.slice_row). The one look inside an engine the tests take: slicing
    changes the layout only, never an answer or a size any interface shows, so this
    count is how tests/test_sliced_rows.py knows its answers came from sliced rows."""
    selections = engine._core.kept.selections
    assert isinstance(selections, PartialResults)
    sliced = 0
    for chunks in selections._bitmaps.values():
        for chunk in chunks.values():
            padded = chunk.base         # the chunk's rows with the form word after them
            assert padded is not None
            sliced += int((padded[:, selections.chunk_rows] == SLICED).sum())
    return sliced


def compiled_schema(ddl: str) -> StreamSchema:
    """The stream schema a CREATE STREAM statement declares."""
    schema = compile_statement(ddl, {})
    assert isinstance(schema, StreamSchema)
    return schema


def compiled_query(sql: str, schema: StreamSchema) -> Query:
    """The checked query of a SELECT over stream R of `schema`."""
    query = compile_statement(sql, {"R": schema})
    assert isinstance(query, Query)
    return query


def checkpointed(engine: Engine) -> None:
    """Wait until the automatic checkpoint `engine` is writing in the background (if
    any) has ended, so that its outcome shows in stats()["durability"]. Tests only: the
    API's checkpoint() is synchronous, and nothing a user does waits for an automatic
    one."""
    engine._durability.wait_checkpoint()


def substitutes(monkeypatch: pytest.MonkeyPatch) -> list[Substitute | None]:
    """What the copies answered (`Answers.substitute`) at each call from now on."""
    got: list[Substitute | None] = []
    real = Answers.substitute

    def spy(answers: Answers, plan: Plan, now: float) -> Substitute | None:
        got.append(real(answers, plan, now))
        return got[-1]
    monkeypatch.setattr(Answers, "substitute", spy)
    return got


def check_copies(state: Path) -> None:
    """The invariants of the copies an engine left on `state` (psoup.archive.rollups),
    indexed afresh from its files."""
    Rollups(state / "archive", folder_for(state / "archive"))._check()


def probe_columns(schema: StreamSchema, rows: Sequence[tuple[Any, ...]],
                  first_tid: int) -> dict[str, NDArray[Any]]:
    """A batch of `rows` as the Query SteM probes it: its columns, ts and tupleIDs
    from `first_tid`."""
    batch = make_batch(schema, rows, [1000.0 + i for i in range(len(rows))], 0.0,
                       float("-inf"))
    columns = dict(batch.columns)
    columns["ts"] = batch.ts
    columns["tupleID"] = np.arange(first_tid, first_tid + batch.n)
    return columns


#: Landed files' modification times: one second apart, in landing order (Spark's file
#: source takes new files oldest first, and files landed in one second would tie).
MTIMES = itertools.count(int(time.time()) - 100_000)


def land(folder: Path, name: str, rows: list[tuple[int, float, float]],
         fmt: str = "csv") -> None:
    """Write rows (lane, speed, ts) as a producer lands a file: elsewhere (in the
    folder's parent), then renamed in. JSON files give ts as ISO-8601."""
    tmp = folder.parent / f".{name}"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"lane": [a for a, _, _ in rows],
                                 "speed": [b for _, b, _ in rows],
                                 "ts": [c for _, _, c in rows]}), tmp)
    elif fmt == "csv":
        tmp.write_text("lane,speed,ts\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows))
    else:
        tmp.write_text("".join(json.dumps({"lane": a, "speed": b, "ts": _iso(c)}) + "\n"
                               for a, b, c in rows))
    at = next(MTIMES)
    os.utime(tmp, (at, at))
    tmp.rename(folder / name)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def trace(n: int, start: int, seed: int, t0: float = 1_767_225_600.0
          ) -> list[tuple[int, float, float]]:
    """n rows (lane, speed, ts) with distinct increasing ts, 0.5 s apart from t0 +
    start / 2 (rows from `start` on of one long trace)."""
    import random
    gen = random.Random(seed)
    return [(gen.randrange(1, 5), round(gen.uniform(20, 120), 2), t0 + (start + i) * 0.5)
            for i in range(n)]


# ---------------------------------------------------------------------- live sources

#: Standing queries over a `traffic` stream fed by files of `trace` rows.
QUERIES = [
    "SELECT lane, speed FROM traffic WHERE speed > 50.0",
    "SELECT * FROM traffic WHERE lane = 2",
    "SELECT lane, COUNT(*) FROM traffic WHERE speed < 80.0 GROUP BY lane",
]
#: Each query of QUERIES as DuckDB answers it over the files (rows in ts order).
ORACLE = [
    "SELECT lane, speed FROM f WHERE speed > 50.0 ORDER BY ts",
    "SELECT ts, lane, speed FROM f WHERE lane = 2 ORDER BY ts",
    "SELECT lane, COUNT(*) FROM f WHERE speed < 80.0 GROUP BY lane ORDER BY lane",
]


def wait_for(check: Callable[[], bool], seconds: float = 240.0) -> None:
    """Poll `check` until it holds (Spark's micro-batches take seconds here)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the source")
        time.sleep(0.3)


def oracle(folder: Path, fmt: str = "csv") -> list[list[tuple[Any, ...]]]:
    """DuckDB's answer to each of QUERIES over the files in `folder`."""
    import duckdb
    db = duckdb.connect()
    if fmt == "csv":
        db.execute(f"CREATE VIEW f AS SELECT lane::BIGINT AS lane, speed::DOUBLE AS speed, "
                   f"ts::DOUBLE AS ts FROM read_csv('{folder}/*.csv', header = true)")
    elif fmt == "parquet":
        db.execute(f"CREATE VIEW f AS SELECT * FROM read_parquet('{folder}/*.parquet')")
    else:
        db.execute(f"CREATE VIEW f AS SELECT lane::BIGINT AS lane, speed::DOUBLE AS speed, "
                   f"epoch(ts::TIMESTAMPTZ) AS ts FROM read_json('{folder}/*.json', "
                   f"columns = {{lane: 'BIGINT', speed: 'DOUBLE', ts: 'VARCHAR'}})")
    return [[tuple(r) for r in db.execute(sql).fetchall()] for sql in ORACLE]


def answers(eng: Engine | Client, handles: list[str]) -> list[list[tuple[Any, ...]]]:
    """The answers of `handles` (QUERIES' in order), shaped as `oracle`'s."""
    out = []
    for h, sql in zip(handles, QUERIES, strict=True):
        result = eng.invoke(h)
        rows = result.rows
        if "WHERE lane = 2" in sql:      # SELECT *: ts first, as DuckDB's view has it
            rows = [(t, *r) for t, r in zip(result.ts.tolist(), rows, strict=True)]
        out.append(sorted(rows) if "GROUP BY" in sql else rows)
    return out


#: A psoup process with a FILES source probed where argv says (the default, 'engine',
#: not written in its statement), and QUERIES[0]
#: registered: it prints "applied N" after each micro-batch N is applied (or committed),
#: and SIGKILLs itself once batch 1 is, before Spark commits it.
KILLED_CHILD = """
import os, signal, sys, time
import psoup
from psoup.spark.live import LiveSources

data, inbox, probe, query = sys.argv[1:]
applied = LiveSources.apply

def apply(self, run, frame, batch_id):
    applied(self, run, frame, batch_id)
    print("applied", batch_id, flush=True)
    if batch_id == 1:
        os.kill(os.getpid(), signal.SIGKILL)

LiveSources.apply = apply
eng = psoup.Engine(path=data)
eng.execute("CREATE STREAM traffic (lane INT, speed FLOAT) FROM FILES '%s' FORMAT CSV%s"
            % (inbox, "" if probe == "engine" else " WITH (probe = '%s')" % probe))
eng.register(query)
print("ready", flush=True)
time.sleep(600)
"""


def killed_after_batch_1(inbox: Path, data: Path, probe: str) -> None:
    """Run KILLED_CHILD on `data` with a stream FROM FILES `inbox` (made here) probed
    where `probe` says; land two files of 12 and 17 rows (one micro-batch each) and
    return once it has SIGKILLed itself after batch 1 and its Spark has gone."""
    inbox.mkdir()
    root = str(Path(__file__).resolve().parent.parent)        # this psoup, in the child
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in [root, os.environ.get("PYTHONPATH")] if p))
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(data), str(inbox),
                              probe, QUERIES[0]],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=env)
    assert child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "ready"
        land(inbox, "a.csv", trace(12, 0, 21))
        assert child.stdout.readline().strip() == "applied 0"
        land(inbox, "b.csv", trace(17, 12, 22))
        assert child.stdout.readline().strip() == "applied 1"
        assert child.wait(120) == -9
    finally:
        child.kill()
        child.wait()
    time.sleep(3)                       # its Spark exits when its stdin closes
