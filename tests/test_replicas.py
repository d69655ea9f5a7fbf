"""Read replicas (`psoup serve --replicas N`, psoup.server.replica).

A replica holds a copy of the primary's state, fed every change the primary logs, and
answers the reads of the connections passed to it. What must hold:

* every answer a replica gives equals DuckDB over the same window, as the primary's do
  (hypothesis: random streams, queries, inserts, registrations and unregistrations, sent
  through connections on both sides);
* a read sees every write acknowledged before it began, whichever process the write went
  through (a client reads its own writes; a reader sees a producer's acknowledged batch),
  and never half a batch;
* writes sent to a replica are the primary's: idempotency keys, errors and refusals are
  the same bytes as from the primary;
* cursors hold across the two processes;
* a replica that dies, or falls too far behind, is started again from a snapshot with
  the whole state, and its clients' idempotent requests go on after a reconnect;
* a durable server's replicas start from its recovered state.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from psoup import Client, Engine
from psoup.errors import PSoupError
from psoup.results.result import Changes
from psoup.server import Server
from psoup.server import replica as replica_module
from psoup.server.replica import forwards
from tests.oracles import Oracle, assert_changes_compose
from tests.strategies import Scenario, scenarios
from tests.support import create

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"),
                                reason="read replicas need Linux (memfd_create)")

TOKEN = "replica-test-token"
#: How long a test waits for a replica to start or a reply to come: only a hang reaches it.
WAIT = 60.0


class _Served:
    """A server with one read replica, and a client connected to each process."""

    def __init__(self, engine: Engine, fronts: int = 0):
        self.engine = engine
        self.server = Server(engine, port=0, token=TOKEN, replicas=1, fronts=fronts)
        host, port = self.server.start_in_thread()
        self.address = f"{host}:{port}"
        self.wait_ready(1)
        self.primary, self.replica = self.pair()

    def replicas(self) -> Any:
        replicas = self.server._replicas
        assert replicas is not None
        return replicas

    def wait_ready(self, starts: int) -> None:
        """Until a replica that is the `starts`-th to start takes connections."""
        deadline = time.monotonic() + WAIT
        while True:
            replicas = self.server._replicas
            if (replicas is not None and replicas.starts >= starts
                    and any(link.ready for link in replicas._all)):
                return
            assert time.monotonic() < deadline, "the replica did not start"
            time.sleep(0.05)

    def on_replica(self, client: Client) -> bool:
        assert client.server["server_id"] == self.server.server_id  # one server to see
        return "replica" in client.server

    def pair(self) -> tuple[Client, Client]:
        """A client connected to the primary and one connected to the replica (the
        connections alternate between them)."""
        got: dict[bool, Client] = {}
        extra = []
        while len(got) < 2:
            client = Client(self.address, token=TOKEN, timeout=WAIT)
            side = self.on_replica(client)
            if side in got:
                extra.append(client)
            else:
                got[side] = client
        for client in extra:
            client.close()
        return got[False], got[True]

    def close(self) -> None:
        for client in (self.primary, self.replica):
            client.close()
        self.server.stop()
        self.engine.close()


@pytest.fixture(scope="module")
def served() -> Iterator[_Served]:
    served = _Served(Engine())
    yield served
    served.close()


# ---------------------------------------------------------------------- answers


@settings(max_examples=int(os.environ.get("PSOUP_REPLICA_EXAMPLES", "80")))
@given(scenarios(), st.randoms(use_true_random=False))
def test_replica_answers_agree_with_duckdb(served: _Served, scenario: Scenario,
                                           pick: Any) -> None:
    streams, ops = scenario
    clients = (served.primary, served.replica)
    create(cast(Engine, pick.choice(clients)), streams)
    oracle = Oracle(streams)
    last_ts = {name: 1000.0 for name in streams}
    now = 1000.0
    live: list[tuple[str, dict[str, Any], dict[int, tuple[str, list[Any]]]]] = []
    try:
        for op in ops:
            if op[0] == "insert":
                _, stream, rows, steps = op
                ts = [float(t) for t in last_ts[stream] + np.cumsum(steps)]
                last_ts[stream] = ts[-1]
                now = max(now, ts[-1])
                tids = pick.choice(clients).insert(stream, rows, ts=ts).tolist()
                oracle.insert(stream, rows, ts, tids)
            elif op[0] == "register":
                sql, spec = op[1]
                live.append((pick.choice(clients).register(sql), spec, {}))
            elif op[0] == "invoke" and live:
                _check(clients, oracle, live[op[1] % len(live)], now + op[2])
            elif op[0] == "unregister" and live:
                pick.choice(clients).unregister(live.pop(op[1] % len(live))[0])
            elif op[0] == "invoke_all":
                for entry in live:
                    _check(clients, oracle, entry, now + op[1])
    finally:
        for name in streams:
            served.primary.drop_stream(name, cascade=True)


def _check(clients: tuple[Client, Client], oracle: Oracle,
           entry: tuple[str, dict[str, Any], dict[int, tuple[str, list[Any]]]],
           now: float) -> None:
    handle, spec, polled = entry
    want = oracle.answer(spec, now)
    for side, client in enumerate(clients):
        if side in polled:      # a chain of since polls
            cursor, before = polled[side]
            changes = client.invoke(handle, now=now, since=cursor)
            assert isinstance(changes, Changes)
            assert_changes_compose(before, changes, want, (side, spec, now))
        got = client.invoke(handle, now=now)
        assert got.rows == want, (side, spec, now)
        # a cursor the other process can recompute (a selection over a position range)
        # starts the other side's next poll; one whose answer only this process keeps
        # a copy of, this side's (the other would say CursorExpired, as after an eviction)
        recomputed = not spec["distinct"] and spec["window"][0] != "partition"
        polled[1 - side if recomputed else side] = (cast(str, got.cursor), want)


def test_a_read_sees_every_write_acknowledged_before_it(served: _Served) -> None:
    """A producer inserts through the primary and publishes each acknowledged count;
    a reader on the replica must see at least the count published before its read
    began, a whole number of batches, never going back."""
    served.primary.execute("CREATE STREAM seen (a INT)")
    count = served.replica.register("SELECT COUNT(*) FROM seen")
    batch, batches = 100, 150
    acknowledged = [0]
    done = threading.Event()

    def produce() -> None:
        with Client(served.address, token=TOKEN, timeout=WAIT) as producer:
            for i in range(batches):
                producer.insert("seen", {"a": list(range(batch))}, ts=1000.0 + i)
                acknowledged[0] = (i + 1) * batch
        done.set()

    thread = threading.Thread(target=produce)
    thread.start()
    last = 0
    try:
        while not done.is_set():
            floor = acknowledged[0]
            (got,), = served.replica.invoke(count, now=2000.0).rows
            assert got >= floor, "a read missed a write acknowledged before it began"
            assert got % batch == 0, "a read saw part of a batch"
            assert got >= last, "a later read saw less"
            last = got
    finally:
        thread.join(WAIT)
        served.primary.drop_stream("seen", cascade=True)
    assert last <= batch * batches


def test_a_client_reads_its_own_writes_through_the_replica(served: _Served) -> None:
    client = served.replica
    client.execute("CREATE STREAM own (a INT, b FLOAT) RETAIN 50 ROWS")
    try:
        handle = client.register("SELECT a FROM own WHERE b > 0.5")
        for i in range(20):
            client.insert("own", [(i, 1.0), (i, 0.0)], ts=1000.0 + i)
            rows = client.invoke(handle, now=2000.0).rows
            assert rows == [(j,) for j in range(i + 1)]
        client.unregister(handle)
        with pytest.raises(PSoupError) as raised:
            client.invoke(handle)
        assert raised.value.code == "unknown_handle"
    finally:
        served.primary.drop_stream("own", cascade=True)


# ---------------------------------------------------------------------- writes


def test_writes_through_a_replica_are_the_primarys(served: _Served) -> None:
    served.primary.execute("CREATE STREAM keyed (a INT)")
    try:
        replica, primary = served.replica, served.primary
        # an idempotency key: the batch sent again gets its first tupleIDs back
        first = replica._request("insert", {"stream": "keyed", "rows": [[1], [2]],
                                            "producer": "p-replica", "seq": 0})
        again = primary._request("insert", {"stream": "keyed", "rows": [[1], [2]],
                                            "producer": "p-replica", "seq": 0})
        assert first == again
        assert replica.last_seq("p-replica") == 0
        # errors: the same code and message from either side, and nothing changed
        for sql in ("SELEC a FROM keyed", "SELECT nope FROM keyed", "CREATE STREAM keyed (a INT)"):
            errors = []
            for client in (replica, primary):
                with pytest.raises(PSoupError) as raised:
                    client.execute(sql)
                errors.append((raised.value.code, str(raised.value)))
            assert errors[0] == errors[1]
        with pytest.raises(PSoupError) as bad:
            replica.insert("keyed", [("text",)])
        assert bad.value.code == "schema"
        handle = replica.register("SELECT COUNT(*) FROM keyed")
        assert replica.invoke(handle).rows == [(2,)]
        # stats are the primary's (its ingest queue, its replicas)
        assert replica.stats()["replicas"]["ready"] == 1
        assert sorted(q for q, _ in replica.queries()) == sorted(q for q, _ in primary.queries())
    finally:
        served.primary.drop_stream("keyed", cascade=True)


def test_what_a_replica_sends_to_its_primary() -> None:
    replica = {"tiered"}        # the handles whose invocations the primary answers
    for op in ("insert", "register", "unregister", "execute", "create_stream", "history",
               "stats", "history_status", "history_cancel"):
        assert forwards(replica, op, {})
    assert forwards(replica, "invoke", {"handle": "tiered"})
    for op, args in (("invoke", {"handle": "other"}), ("queries", {}), ("ping", {}),
                     ("last_seq", {"producer": "p"}), ("nonsense", {}), ("invoke", [1])):
        assert not forwards(replica, op, args)


# ---------------------------------------------------------------------- failures


def test_a_replica_that_dies_is_started_again_with_the_whole_state() -> None:
    served = _Served(Engine())
    try:
        served.primary.execute("CREATE STREAM R (a INT)")
        handle = served.primary.register("SELECT a FROM R WHERE a >= 5")
        served.primary.insert("R", {"a": list(range(10))}, ts=1000.0)
        replica = served.replica
        assert replica.invoke(handle).rows == [(a,) for a in range(5, 10)]
        pid = served.replicas()._all[0].proc.pid
        os.kill(pid, signal.SIGKILL)
        # written while no replica runs: the new one's snapshot holds it
        served.primary.insert("R", {"a": [7]}, ts=1001.0)
        served.wait_ready(2)
        served.replicas()._check()
        # the client's connection died with the process; an invoke reconnects (to
        # either process) and is answered
        assert replica.invoke(handle).rows == [(a,) for a in (5, 6, 7, 8, 9, 7)]
        _, fresh = served.pair()
        try:
            assert fresh.invoke(handle).rows == [(a,) for a in (5, 6, 7, 8, 9, 7)]
        finally:
            fresh.close()
    finally:
        served.close()


def test_a_replica_too_far_behind_is_dropped_and_started_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    served = _Served(Engine())
    try:
        served.primary.execute("CREATE STREAM R (a INT)")
        handle = served.primary.register("SELECT COUNT(*) FROM R")
        monkeypatch.setattr(replica_module, "MAX_LAG_BYTES", 1_000)
        served.primary.insert("R", {"a": list(range(1_000))}, ts=1000.0)
        served.wait_ready(2)
        monkeypatch.undo()
        _, fresh = served.pair()
        try:
            assert fresh.invoke(handle).rows == [(1_000,)]
        finally:
            fresh.close()
    finally:
        served.close()


def test_a_durable_servers_replica_starts_from_its_recovered_state(tmp_path: Path) -> None:
    with Engine(path=tmp_path / "state") as engine:
        engine.execute("CREATE STREAM R (a INT, b FLOAT) RETAIN 100 ROWS")
        engine.insert("R", {"a": list(range(300)), "b": [0.5] * 300}, ts=1000.0)
        handle = engine.register("SELECT a, b FROM R WHERE b < 0.75")
        summed = engine.register("SELECT SUM(a) FROM R")
        engine.checkpoint()
        engine.insert("R", {"a": [1000, 1001], "b": [1.0, 2.0]}, ts=1001.0)
    served = _Served(Engine(path=tmp_path / "state"))
    try:
        for client in (served.primary, served.replica):
            assert client.invoke(handle).rows == served.engine.invoke(handle).rows
            assert client.invoke(summed).rows == served.engine.invoke(summed).rows
        assert len(served.replica.invoke(handle).rows) == 98
    finally:
        served.close()


def test_replicas_with_a_front() -> None:
    """With a front process as well, the connections go round the front (the primary's
    share) and the replica."""
    with_front = _Served(Engine(), fronts=1)
    try:
        with_front.primary.execute("CREATE STREAM R (a INT)")
        handle = with_front.replica.register("SELECT a FROM R")
        with_front.replica.insert("R", [(1,), (2,)], ts=1000.0)
        for client in (with_front.primary, with_front.replica):
            assert client.invoke(handle).rows == [(1,), (2,)]
    finally:
        with_front.close()


def test_invocations_of_tiered_handles_go_to_the_primary(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A handle whose history is due (or that has an archive tier) reads files only the
    primary has: a replica sends its invocations there, until it is unregistered."""
    served = _Served(Engine(path=tmp_path / "state"))
    try:
        served.primary.execute("CREATE STREAM R (a INT)")
        tiered = served.primary.register("SELECT a FROM R")
        plain_handle = served.primary.register("SELECT COUNT(*) FROM R")
        served.primary.insert("R", [(1,), (2,)], ts=1000.0)
        answered: list[str] = []
        invoke = served.engine.invoke

        def recorded(handle: str, *args: Any, **kwargs: Any) -> Any:
            answered.append(handle)
            return invoke(handle, *args, **kwargs)

        monkeypatch.setattr(served.engine, "invoke", recorded)
        assert served.replica.invoke(tiered).rows == [(1,), (2,)]
        assert answered == []                       # the replica answered it
        journal = served.engine._durability.journal
        assert journal is not None
        with served.engine.locked():                # as a history job logs it
            journal.history([tiered])
        served.primary.insert("R", [(3,)], ts=1001.0)   # a write after it: a read waits
        assert served.replica.invoke(tiered).rows == [(1,), (2,), (3,)]
        assert answered == [tiered]
        assert served.replica.invoke(plain_handle).rows == [(3,)]
        assert answered == [tiered]
        served.replica.unregister(tiered)
        assert tiered not in served.engine._core.handles
    finally:
        served.close()


def test_a_replica_engine_rebuilds_the_primary_from_its_snapshot_and_feed(
        tmp_path: Path) -> None:
    """In one process: a snapshot taken mid-stream, then the feed's records applied in
    order, give the primary's answers, tupleIDs and producers; a read waits for what
    the primary committed and the replica has not applied yet."""
    from psoup.server.replica_engine import ReplicaEngine

    primary = Engine(chunk_rows=16)
    primary.execute("CREATE STREAM R (a INT, b FLOAT) RETAIN 40 ROWS")
    early = primary.register("SELECT a FROM R WHERE b > 0.5")
    primary.insert("R", {"a": list(range(30)), "b": [0.1, 0.9] * 15}, ts=1000.0)
    fed: list[dict[str, Any]] = []
    counter = np.zeros(1, dtype=np.int64)

    def feed(record: dict[str, Any]) -> None:
        fed.append(record)
        counter[0] = len(fed)

    primary.set_feed(feed)
    manifest = primary.snapshot(tmp_path / "snap", lambda: None)
    replica = ReplicaEngine(counter, 0, manifest["primary"], primary.cursor_secret,
                            primary.replica_settings())
    replica.restore(manifest, tmp_path / "snap")
    late = primary.register("SELECT COUNT(*), SUM(a) FROM R")
    primary.insert("R", {"a": [100, 101], "b": [1.0, 0.0]}, ts=1001.0, producer="p", seq=0)
    primary.unregister(early)
    kept = primary.register("SELECT a FROM R WHERE a > 20")
    assert not replica.caught_up(False)             # 4 records fed, none applied
    for record in fed:
        replica.apply(record)
    assert replica.caught_up(False)
    for handle in (late, kept):
        got, want = replica.invoke(handle, now=2000.0), primary.invoke(handle, now=2000.0)
        assert got.rows == want.rows
        assert got.tuple_ids.tolist() == want.tuple_ids.tolist()
        # a cursor of one is taken by the other (the same secret, recomputable ranges)
    assert isinstance(replica.invoke(kept, now=2000.0,
                                     since=primary.invoke(kept, now=2000.0).cursor), Changes)
    with pytest.raises(PSoupError):
        replica.invoke(early)
    assert replica.last_seq("p") == primary.last_seq("p") == 0
    replica._check()
    with pytest.raises(PSoupError, match="read replica"):
        replica.insert("R", [(1, 1.0)])
    replica.close()
    primary.close()


def test_a_cursor_only_the_primary_kept_is_answered_through_a_replica(
        served: _Served) -> None:
    """An aggregate's answer cannot be recomputed from the tuples: its cursor names a
    copy kept by the process that gave it. Polled on the primary, then on a replica (a
    client that reconnected), the replica hands the poll to the primary. The other way
    round the primary has no copy: CursorExpired, as after an eviction (documented)."""
    primary, replica = served.primary, served.replica
    primary.execute("CREATE STREAM cur (g INT, v INT)")
    try:
        handle = primary.register("SELECT g, SUM(v) FROM cur GROUP BY g")
        primary.insert("cur", [(1, 10), (2, 20)], ts=1000.0)
        first = primary.invoke(handle, now=2000.0)
        primary.insert("cur", [(1, 5)], ts=1001.0)
        changes = replica.invoke(handle, now=2000.0, since=cast(str, first.cursor))
        assert isinstance(changes, Changes)
        assert changes.deleted.rows == [(1, 10)] and changes.inserted.rows == [(1, 15)]
        # (the primary gave that poll's answer, and keeps it: a new one, only here)
        primary.insert("cur", [(3, 7)], ts=1002.0)
        on_replica = replica.invoke(handle, now=2000.0)
        primary.insert("cur", [(2, 1)], ts=1003.0)      # the answer moves on from it
        with pytest.raises(PSoupError) as raised:
            primary.invoke(handle, now=2000.0, since=cast(str, on_replica.cursor))
        assert raised.value.code == "cursor_expired"
    finally:
        primary.drop_stream("cur", cascade=True)


def test_psoup_serve_with_a_replica_stops_whole_on_sigterm(tmp_path: Path) -> None:
    """`psoup serve --replicas 1` as users run it: both processes answer, SIGTERM stops
    the server and its replica, and the snapshots' folder is gone."""
    import subprocess
    import sys

    from tests.support import free_port, wait_listening

    port, data = free_port(), tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "psoup.cli.main", "--token", TOKEN,
                             "serve", "--data-dir", str(data), "--port", str(port),
                             "--replicas", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(proc, port)
        clients: dict[bool, Client] = {}
        deadline = time.monotonic() + WAIT
        while len(clients) < 2:         # until one connection reached the replica
            assert time.monotonic() < deadline, "no connection reached the replica"
            client = Client(f"127.0.0.1:{port}", token=TOKEN, timeout=WAIT)
            side = "replica" in client.server
            if side in clients:
                client.close()
                time.sleep(0.1)
            else:
                clients[side] = client
        clients[True].execute("CREATE STREAM R (a INT)")
        handle = clients[True].register("SELECT a FROM R WHERE a > 1")
        clients[False].insert("R", [(1,), (2,), (3,)], ts=1000.0)
        assert clients[True].invoke(handle).rows == [(2,), (3,)]
        assert clients[False].invoke(handle).rows == [(2,), (3,)]
        replica_pids = [int(p) for p in subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()]
        assert replica_pids and (data / "replicas").is_dir()
        for client in clients.values():
            client.close()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, err
        assert ", 1 read replica, " in out.splitlines()[0]      # the startup line
        for pid in replica_pids:
            assert not Path(f"/proc/{pid}").exists() or \
                Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        assert not (data / "replicas").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
