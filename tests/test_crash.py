"""A server killed with SIGKILL in the middle of an ingest loses nothing it acknowledged
(docs/design.md, "Invariants", 4): after a restart on the same data directory, every
acknowledged batch and every handle is back, the batch in flight is wholly there or
wholly absent, and every answer equals that of an engine that never crashed."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

import psoup
from psoup.client import Client
from tests.support import free_port, start_server

TOKEN = "crash-test-token"
DDL = "CREATE STREAM R (a INT, b FLOAT, tag TEXT) RETAIN 3000 ROWS"
QUERIES = [
    "SELECT * FROM R",
    "SELECT a, tag FROM R WHERE a < 30 AND b > 0.5 BEGIN NOW - 50 END NOW",
    "SELECT DISTINCT tag FROM R WHERE a >= 90",
]
ROWS = 150


def _batch(i: int) -> tuple[dict[str, Any], NDArray[np.float64]]:
    gen = np.random.default_rng(i)
    cols = {"a": gen.integers(0, 100, ROWS), "b": gen.random(ROWS),
            "tag": [f"t{v}" for v in gen.integers(0, 7, ROWS)]}
    return cols, i + np.arange(ROWS) / ROWS


def _answers(target: Client | psoup.Engine, handles: list[str],
             now: float) -> list[tuple[list[int], list[tuple[Any, ...]]]]:
    results = [target.invoke(h, now=now) for h in handles]
    return [(r.tuple_ids.tolist(), r.rows) for r in results]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, PSOUP_CONFIG_DIR=str(tmp_path / "config"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), env.get("PYTHONPATH")] if p)
    return env


def test_sigkill_mid_ingest_loses_nothing_acknowledged(tmp_path: Path,
                                                       env: dict[str, str]) -> None:
    data_dir, port = tmp_path / "data", free_port()
    proc, client = start_server(data_dir, port, TOKEN, env)
    client.execute(DDL)
    handles = [client.register(q) for q in QUERIES]

    acked: list[int] = []

    def produce() -> None:
        producer = Client(f"127.0.0.1:{port}", token=TOKEN, timeout=60, retry=0)
        for i in range(10_000):
            cols, ts = _batch(i)
            try:
                producer.insert("R", cols, ts=ts)
            except (psoup.PSoupError, OSError):
                return
            acked.append(i)

    thread = threading.Thread(target=produce)
    thread.start()
    while len(acked) < 40 and thread.is_alive():     # a producer that gave up: no hang
        time.sleep(0.005)
    assert len(acked) >= 40, "the producer stopped before the crash"
    os.kill(proc.pid, signal.SIGKILL)
    thread.join(30)
    proc.wait(10)
    client.close()

    proc, client = start_server(data_dir, port, TOKEN, env)
    try:
        assert [h for h, _ in client.queries()] == handles
        # The tupleID counter says how many tuples the log holds: every acknowledged
        # batch, plus the one in flight if its record was complete.
        marker = ({"a": [1], "b": [0.9], "tag": ["m"]}, [float(len(acked) + 5)])
        logged = int(client.insert("R", *marker)[0])
        assert logged in (len(acked) * ROWS, (len(acked) + 1) * ROWS), "half a batch survived"
        batches = list(range(logged // ROWS))
        assert batches[:len(acked)] == acked

        twin = psoup.Engine()
        twin.execute(DDL)
        twin_handles = [twin.register(q) for q in QUERIES]
        for i in batches:
            twin.insert("R", *_batch(i))
        twin.insert("R", *marker)
        for now in (float(len(batches)), len(acked) + 5.0, 1e9):
            assert _answers(client, handles, now) == _answers(twin, twin_handles, now)
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
