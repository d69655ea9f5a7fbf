"""Exactly-once ingest across server crashes: a server process killed with SIGKILL at
several points of an insert loop or of `psoup ingest`, and restarted on the same data
directory, ends up holding every row once: no batch lost, none applied twice (each
batch is keyed by producer and seq, psoup.producers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from psoup.client import Client
from tests.support import free_port, start_server, write

TOKEN = "exactly-once-token"
DDL = "CREATE STREAM R (i INT, v FLOAT)"
ROWS = 50
KILLS = 5


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, PSOUP_CONFIG_DIR=str(tmp_path / "config"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), env.get("PYTHONPATH")] if p)
    return env


def _batch(b: int) -> dict[str, Any]:
    i = np.arange(b * ROWS, (b + 1) * ROWS)
    return {"i": i, "v": i * 0.5}


def _stored(client: Client) -> tuple[list[int], list[int]]:
    """(tupleIDs, values of i) of everything in R, in tupleID order."""
    handle = client.register("SELECT i FROM R")
    answer = client.invoke(handle, now=1e12)
    client.unregister(handle)
    order = np.argsort(answer.tuple_ids)
    return answer.tuple_ids[order].tolist(), [answer.rows[k][0] for k in order]


def _kill_and_restart(proc: subprocess.Popen[bytes], client: Client, data_dir: Path, port: int,
                      env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Client]:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    client.close()
    return start_server(data_dir, port, TOKEN, env)


def _rows_in(client: Client) -> int:
    rows: int = client.stats()["streams"]["R"]["rows_total"]
    return rows


@pytest.mark.parametrize("batch_rows", [ROWS, ROWS // 5], ids=["one-batch", "pipelined"])
def test_client_insert_loop_survives_five_kills_exactly_once(tmp_path: Path, env: dict[str, str],
                                                             batch_rows: int) -> None:
    data_dir, port = tmp_path / "data", free_port()
    proc, client = start_server(data_dir, port, TOKEN, env)
    client.execute(DDL)
    batches = 150
    returned: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with Client(f"127.0.0.1:{port}", token=TOKEN, timeout=60, retry=60,
                        batch_rows=batch_rows) as producer:
                for b in range(batches):
                    returned[b] = producer.insert("R", _batch(b), ts=float(b)).tolist()
        except BaseException as exc:     # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=produce)
    thread.start()
    for k in range(1, KILLS + 1):
        while len(returned) < k * batches // (KILLS + 2) and thread.is_alive():
            time.sleep(0.002)
        proc, client = _kill_and_restart(proc, client, data_dir, port, env)
    thread.join(120)
    try:
        assert not errors, errors
        assert len(returned) == batches
        tids, values = _stored(client)
        assert values == list(range(batches * ROWS))           # each row once, in order
        assert tids == sorted(t for b in range(batches) for t in returned[b])
        assert len(set(tids)) == len(tids)
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def _ingest(path: Path, port: int, env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "psoup.cli.main", "--server",
                             f"127.0.0.1:{port}", "--token", TOKEN, "ingest", "R", str(path),
                             "--batch-rows", str(ROWS), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture
def readings(tmp_path: Path) -> tuple[int, Path]:
    n = 100 * ROWS
    return n, write(tmp_path / "r.csv", [{"i": k, "v": k * 0.5, "ts": float(k // ROWS)}
                                         for k in range(n)])


def test_psoup_ingest_rides_out_server_kills(tmp_path: Path, env: dict[str, str],
                                             readings: tuple[int, Path]) -> None:
    n, path = readings
    data_dir, port = tmp_path / "data", free_port()
    proc, client = start_server(data_dir, port, TOKEN, env)
    client.execute(DDL)
    ingest = _ingest(path, port, env)
    try:
        for k in range(1, KILLS + 1):
            while ingest.poll() is None and _rows_in(client) < k * n // (KILLS + 2):
                time.sleep(0.002)
            proc, client = _kill_and_restart(proc, client, data_dir, port, env)
        out, err = ingest.communicate(timeout=120)
        assert ingest.returncode == 0, err.decode()
        assert out.decode().startswith(f"{n:,} rows into R")
        tids, values = _stored(client)
        assert values == list(range(n)) and len(set(tids)) == n
    finally:
        ingest.kill()
        client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_ingest_resume_after_the_server_and_the_ingest_were_killed(
        tmp_path: Path, env: dict[str, str], readings: tuple[int, Path]) -> None:
    n, path = readings
    data_dir, port = tmp_path / "data", free_port()
    proc, client = start_server(data_dir, port, TOKEN, env)
    client.execute(DDL)
    try:
        for k in range(1, KILLS + 1):
            ingest = _ingest(path, port, env, *(["--resume"] if k > 1 else []))
            while ingest.poll() is None and _rows_in(client) < k * n // (KILLS + 2):
                time.sleep(0.002)
            ingest.kill()                 # the producer dies too: only --resume continues
            ingest.wait(10)
            proc, client = _kill_and_restart(proc, client, data_dir, port, env)
        done = _ingest(path, port, env, "--resume")
        out, err = done.communicate(timeout=120)
        assert done.returncode == 0, err.decode()
        assert "already stored" in out.decode()
        tids, values = _stored(client)
        assert values == list(range(n)) and len(set(tids)) == n
        assert list((tmp_path / "config" / "ingest").iterdir()) == []    # finished: no state
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_resume_without_an_unfinished_ingest_says_so(tmp_path: Path, env: dict[str, str],
                                                     readings: tuple[int, Path]) -> None:
    _, path = readings
    port = free_port()
    proc, client = start_server(tmp_path / "data", port, TOKEN, env)
    try:
        client.execute(DDL)
        out, err = _ingest(path, port, env, "--resume").communicate(timeout=60)
        assert "nothing to resume" in err.decode()
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
