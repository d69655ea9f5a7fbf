"""One core against every core (issue 37, "every core"): the same code pinned to one
core with one thread, against all the cores this process may use, in the same run.

- ingest: tuples/s through `Engine.insert` (PSoup-P, in memory) with 1,024 / 10^4 /
  10^5 standing queries of the Fig. 9 workload (1-4 inequality factors over R's four
  INT columns), batches of 32,768 tuples (16,384 at 10^5 queries, whose results are
  12.5 KB per tuple), RETAIN two batches. One child process per query count registers
  the queries once, then is timed in turns: pinned to one core
  (`os.sched_setaffinity`) with the engine's probe on one thread (threads=1, today's
  engine), and unpinned with a thread per core (the engine's default), in turns,
  the best of each kept. Also the cores each used (process CPU time / wall time), and
  the rate of the fastest batch of each (on a machine other processes share, the
  batches that met a free core: the ratios of the verdicts are the throughputs').
  Targets: >= 1.8x at 10^5 queries, >= 1.4x at 10^4.
- probe: the probe alone (`QuerySteM.probe_into` into PSoup-P's chunks) of n tuples at
  1,024 and 10^4 queries, on one thread and split over every core, single calls in
  alternation, the fastest of each kept (a core busy with another process now and then
  does not hide what the split does when it is free). Where the split starts to pay
  is the engine's threshold, `psoup.stems.query_stem.PROBE_SPLIT` (work per thread,
  tuples x words of results).
- server: 100 polling connections invoking random handles of 200 traffic queries
  (bench/server.py's workload) over a 100K-tuple stream, and one producer inserting
  1,000-row batches at a fixed pace (20 a second: 20,000 rows/s, which both servers
  take, so "rows/s not lower" is checked on the rate achieved), against the server's
  process pinned to one core with --threads 1 (no front process), unpinned with the
  default (the engine process passes the connections to one front process that relays
  their bytes over a Unix socket and encodes the numeric answers it gets raw, so that
  the sockets' system calls and transports and that encoding run beside the engine's
  Python), and unpinned with --fronts 0 (every connection in the engine's process).
  Unpinned, reads that find the engine lock taken wait for it on the
  event loop for up to 2 ms rather than moving to a read thread, which between two
  cores cost more than it saved. The load is cheap so that it does not measure itself: the
  pollers are connections on one asyncio loop in a process of their own, each with one
  invoke in flight, the request frames encoded once per handle, the replies not
  decoded (the length read, the body skipped, the ok flag checked in place); the
  producer is `psoup.Client` in another process. Only the server is pinned; on a
  2-core machine the generator (about 0.15 of a core) and the producer share the cores
  with the unpinned server. Reported: invokes/s, p50/p99, error replies, the
  producer's rows/s and insert latency, and the cores the server's engine process, its
  front processes and the generator used. Target: >= 1.5x invokes/s, rows/s not lower.
  Then with one read replica (--replicas 1: a second process holding a copy of the
  state, fed every change, answering the reads of every other connection; no front by
  default), and with a front as well. The last row is not a psoup mode: two unpinned
  one-thread servers, each holding every query and every batch (a producer per server
  sends each batch to it), the pollers split between them: what read replicas could
  reach at most here.
  `--server-only` runs just this part; SCALE_ONLY="label;label" runs only the
  unpinned server rows named beside the pinned one.

The machine's other load shows in these ratios (a busy second core gives the split
nothing): run it on a quiet machine.

Usage: python bench/scale_cores.py [--quick | --smoke] [--server-only]
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)

import psoup  # noqa: E402
import psoup.stems.query_stem as query_stem  # noqa: E402
from psoup.client import Client  # noqa: E402
from psoup.query import compile_statement  # noqa: E402
from psoup.query.model import Query, StreamSchema  # noqa: E402
from psoup.results.partial import PartialResults  # noqa: E402
from psoup.server.protocol import HEADER, PROTOCOL, pack_frame, unpack_payload  # noqa: E402
from psoup.workers import Workers, default_threads  # noqa: E402

#: The issue's targets: (query count, all cores / one core) for ingest, and the server's.
INGEST_TARGETS = {100_000: 1.8, 10_000: 1.4}
SERVER_TARGET = 1.5


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"counts": [64, 256], "batch": 1_024, "large_batch": 512, "min_time": 0.0,
                "cap": 0.05, "turns": 1, "probe_counts": [64], "probe_sizes": [256, 1_024],
                "probe_rounds": 3, "queries": 5, "prefill": 1_000, "clients": 2,
                "seconds": 0.5, "rate": 5, "lead": 1.0}
    if level == "quick":
        return {"counts": [1_024, 10_000, 100_000], "batch": 32_768, "large_batch": 16_384,
                "min_time": 0.5, "cap": 1.0, "turns": 2, "probe_counts": [1_024, 10_000],
                "probe_sizes": [2_048, 8_192, 32_768], "probe_rounds": 40,
                "queries": 200, "prefill": 100_000, "clients": 100, "seconds": 5.0,
                "rate": 20, "lead": 4.0}
    return {"counts": [1_024, 10_000, 100_000], "batch": 32_768, "large_batch": 16_384,
            "min_time": 2.0, "cap": 4.0, "turns": 3, "probe_counts": [1_024, 10_000],
            "probe_sizes": [1_024, 2_048, 4_096, 8_192, 16_384, 32_768, 65_536],
            "probe_rounds": 200, "queries": 200, "prefill": 100_000, "clients": 100,
            "seconds": 10.0, "rate": 20, "lead": 4.0}


def _one_core() -> set[int]:
    return {min(os.sched_getaffinity(0))}


# ---------------------------------------------------------------- ingest


def ingest_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a child process: register `count` queries, then time ingest pinned to one
    core with one thread and unpinned with a thread per core, in turns."""
    every = os.sched_getaffinity(0)
    count, batch = spec["count"], spec["batch"]
    eng = psoup.Engine(threads=1)
    eng.execute(f"{common.CREATE_R} RETAIN {2 * batch} ROWS")
    t0 = time.perf_counter()
    for sql in common.selection_queries(common.rng(72), count, "inequality"):
        eng.register(sql)
    register_s = time.perf_counter() - t0
    gen = common.rng(71)
    pool = [common.data_columns(gen, batch) for _ in range(4)]
    sent = [0]

    def feed() -> None:
        cols = pool[(sent[0] // batch) % len(pool)]
        eng.insert("R", cols, ts=np.arange(sent[0], sent[0] + batch, dtype=float))
        sent[0] += batch
    # the engine's own Workers, swapped between turns: one thread (what Engine(threads=1)
    # holds) and one per core (Engine's default); the queries are registered once
    stem = eng._core.query_stem
    workers = {"one": Workers(1), "all": Workers(len(every))}
    best: dict[str, dict[str, float]] = {}
    for _ in range(spec["turns"]):
        for label in ("one", "all"):
            os.sched_setaffinity(0, _one_core() if label == "one" else every)
            stem.workers = workers[label]
            for _ in range(3):                # fill the retention; warm the pool
                feed()
            with common.settled():
                cpu0, wall0 = time.process_time(), time.perf_counter()
                t = common.timed(feed, repeat=3, min_time=spec["min_time"],
                                 max_time=spec["cap"])
                cores = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
            rate = t.calls * batch / t.total
            fastest = batch / min(t.times)
            got = best.setdefault(label, {"rate": 0.0, "cores": 0.0, "fastest": 0.0})
            if rate > got["rate"]:
                got.update(rate=rate, cores=cores)
            got["fastest"] = max(got["fastest"], fastest)
    os.sched_setaffinity(0, every)
    workers["all"].close()
    eng.close()
    return {"register_s": register_s, "threads": len(every), **{
        f"{label} {key}": value for label, got in best.items() for key, value in got.items()}}


def bench_ingest(s: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for count in s["counts"]:
        batch = s["large_batch"] if count >= 100_000 else s["batch"]
        spec = {"count": count, "batch": batch, "turns": s["turns"],
                "min_time": s["min_time"], "cap": s["cap"]}
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import scale_cores; "
                "print(json.dumps(scale_cores.ingest_child(json.loads(sys.argv[2]))))")
        done = subprocess.run([sys.executable, "-c", code, str(common.BENCH_DIR),
                               json.dumps(spec)], check=True, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=str(common.ROOT)))
        got = json.loads(done.stdout.strip().splitlines()[-1])
        row = {"queries": count, "batch": batch, **got,
               "ratio": got["all rate"] / got["one rate"],
               "fastest ratio": got["all fastest"] / got["one fastest"]}
        rows.append(row)
        print(f"  {count:,} queries: one core {got['one rate']:,.0f} tuples/s, all "
              f"{got['all rate']:,.0f} ({row['ratio']:.2f}x)", flush=True)
    return rows


# ---------------------------------------------------------------- the probe alone


def bench_probe(s: dict[str, Any]) -> list[dict[str, Any]]:
    """The probe alone, one thread against split over every core at each size (the
    split forced, whatever PROBE_SPLIT says)."""
    threads = default_threads()
    schema = compile_statement(common.CREATE_R, {})
    assert isinstance(schema, StreamSchema)
    schemas = {"R": schema}
    rows = []
    split = query_stem.PROBE_SPLIT
    one, every = Workers(1), Workers(threads)
    try:
        for count in s["probe_counts"]:
            stem = query_stem.QuerySteM()
            for sql in common.selection_queries(common.rng(72), count, "inequality"):
                query = compile_statement(sql, schemas)
                assert isinstance(query, Query)
                stem.insert(query)
            for n in s["probe_sizes"]:
                rows.append(_probe_row(stem, count, n, one, every, s["probe_rounds"]))
    finally:
        query_stem.PROBE_SPLIT = split
        every.close()
    return rows


def _probe_row(stem: query_stem.QuerySteM, count: int, n: int, one: Workers,
               every: Workers, rounds: int) -> dict[str, Any]:
    cols = common.data_columns(common.rng(1), n)
    pieces = PartialResults(8192).destination("R", 0, n, stem.words)
    best = {"one": float("inf"), "all": float("inf")}
    clock = time.perf_counter
    for _ in range(rounds):
        for label, workers, threshold in (("one", one, 1 << 62), ("all", every, 1)):
            stem.workers = workers
            query_stem.PROBE_SPLIT = threshold
            t0 = clock()
            stem.probe_into("R", cols, pieces)
            best[label] = min(best[label], clock() - t0)
    return {"queries": count, "tuples": n, "work": n * stem.words,
            "per thread": n * stem.words // every.threads,
            "one us": best["one"] * 1e6, "all us": best["all"] * 1e6,
            "ratio": best["one"] / best["all"]}


# ---------------------------------------------------------------- the server


#: The server row that is not a psoup mode: two unpinned one-thread servers, each
#: holding every query and every batch (the producer sends each batch to both), the
#: pollers split between them: what a design of read replicas (engine processes
#: that each hold the state and answer reads) could reach at most on this machine.
REPLICAS = "2 one-thread servers, each batch to both (replica bound)"


def _serve_one_thread() -> str:
    """`run_server` in a child process with one thread and no front, unpinned."""
    return ("import sys; from psoup.server.server import run_server; "
            "run_server(None, port=int(sys.argv[2]), token=sys.argv[3], "
            "echo=lambda s: None, threads=1, fronts=0)")


def _serve(pinned: bool, fronts: int | None = None, replicas: int = 0) -> str:
    """`run_server` in a child process, pinned to one core with one thread, or not
    (with `fronts` front processes, None: the default, one with more than one thread;
    and `replicas` read replicas)."""
    pin = f"os.sched_setaffinity(0, {_one_core()!r}); " if pinned else ""
    threads = "1" if pinned else os.environ.get("SCALE_THREADS", "None")
    return ("import os, sys; " + pin + "from psoup.server.server import run_server; "
            "run_server(None, port=int(sys.argv[2]), token=sys.argv[3], "
            f"echo=lambda s: None, threads={threads}, fronts={fronts!r}, "
            f"replicas={replicas})")


#: The start of a successful reply to a pre-encoded request of id 1: a map of three
#: ("id", "ok", "result", in the order `ok_reply` builds it) with ok = true. An error
#: reply has "ok": false there, so comparing these bytes checks each reply without
#: decoding it.
_OK_PREFIX = b"\x83\xa2id\x01\xa2ok\xc3"


class _Poller(asyncio.Protocol):
    """One polling connection: says hello, then invokes random handles closed-loop (one
    request in flight), its request frames encoded once, its replies only measured
    (length read, body skipped, the ok flag checked in place)."""

    def __init__(self, frames: list[bytes], hello: bytes, seed: int,
                 ready: asyncio.Future[None]):
        self.frames, self.hello, self.ready = frames, hello, ready
        self.pick = random.Random(seed)
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.sent = 0.0
        self.latencies: list[float] = []     # seconds per call, with its end time
        self.ends: list[float] = []
        self.errors = 0
        self.stop_at = float("inf")
        self.warming = 2

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.hello)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 4:
            size = HEADER.unpack_from(self.buf)[0]
            if len(self.buf) < 4 + size:
                return
            ok = self.buf[4:4 + len(_OK_PREFIX)] == _OK_PREFIX
            if not ok and self.errors == 0:
                print(f"error reply: {unpack_payload(bytes(self.buf[4:4 + size]))!r}",
                      file=sys.stderr, flush=True)
            del self.buf[:4 + size]
            self._replied(ok)

    def connection_lost(self, exc: Exception | None) -> None:
        # the server closing a connection before the end counts as an error reply
        if not self.ready.done():
            self.ready.set_exception(RuntimeError(f"connection lost during hello: {exc}"))
        elif time.perf_counter() < self.stop_at:
            self.errors += 1
            print(f"a polling connection was lost: {exc}", file=sys.stderr, flush=True)

    def _replied(self, ok: bool) -> None:
        now = time.perf_counter()
        if self.warming:                # the hello's reply, then one untimed invoke's
            self.warming -= 1
            if not ok:
                self.ready.set_exception(RuntimeError("hello or first invoke refused"))
            elif self.warming:
                self.invoke()
            else:
                self.ready.set_result(None)
            return
        self.errors += not ok
        self.latencies.append(now - self.sent)
        self.ends.append(now)
        if now < self.stop_at:
            self.invoke()

    def invoke(self) -> None:
        assert self.transport is not None
        self.sent = time.perf_counter()
        self.transport.write(self.frames[self.pick.randrange(len(self.frames))])


def _same(poller: _Poller) -> Callable[[], _Poller]:
    return lambda: poller


async def _poll_all(spec: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    host, port = spec["address"].rsplit(":", 1)
    hello = pack_frame({"id": 1, "op": "hello", "args": {"token": spec["token"],
                                                          "protocol": PROTOCOL}})
    frames = [pack_frame({"id": 1, "op": "invoke", "args": {"handle": h}})
              for h in spec["handles"]]
    pollers = []
    for k in range(spec["clients"]):
        ready: asyncio.Future[None] = loop.create_future()
        poller = _Poller(frames, hello, k, ready)
        transport, _ = await loop.create_connection(_same(poller), host, int(port))
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP,
                                                      socket.TCP_NODELAY, 1)
        await ready
        pollers.append(poller)
    await asyncio.sleep(max(0.0, spec["start_at"] - time.time()))
    late = time.time() - spec["start_at"]
    cpu0, t0 = time.process_time(), time.perf_counter()
    t1 = t0 + spec["seconds"]
    for poller in pollers:
        poller.stop_at = t1
        poller.invoke()
    await asyncio.sleep(spec["seconds"])
    cpu = time.process_time() - cpu0
    await asyncio.sleep(0.2)                      # the calls in flight at the end
    for poller in pollers:
        assert poller.transport is not None
        poller.transport.close()
    lat = np.array([x for p in pollers for x, end in zip(p.latencies, p.ends, strict=True)
                    if end <= t1])
    p50, p99 = np.percentile(lat, [50, 99]) if len(lat) else (np.nan, np.nan)
    return {"calls": len(lat), "invokes_per_s": len(lat) / spec["seconds"],
            "p50_ms": p50 * 1e3, "p99_ms": p99 * 1e3,
            "errors": sum(p.errors for p in pollers), "clients": spec["clients"],
            "generator_cores": cpu / spec["seconds"], "poll_late_s": late}


def poll_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a child process: `clients` polling connections on one asyncio loop from
    `start_at` (wall clock) for `seconds`; the cores it used meanwhile too."""
    return asyncio.run(_poll_all(spec))


def produce_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a child process: 1,000-row batches through `psoup.Client` at `rate` batches a
    second (a fixed schedule; a late batch is sent at once, not skipped), from
    `start_at` for `seconds`."""
    import server as served
    feed = np.random.default_rng(99)
    batches = [served.readings(feed, spec["batch"]) for _ in range(16)]
    inserts: list[float] = []
    with Client(spec["address"], token=spec["token"], timeout=60) as client:
        time.sleep(max(0.0, spec["start_at"] - time.time()))
        t0 = time.perf_counter()
        period = 1.0 / spec["rate"]
        sent = 0
        while True:
            due = t0 + sent * period
            now = time.perf_counter()
            if due >= t0 + spec["seconds"]:
                break
            if due > now:
                time.sleep(due - now)
            began = time.perf_counter()
            client.insert("traffic", batches[sent % len(batches)])
            inserts.append(time.perf_counter() - began)
            sent += 1
        elapsed = max(time.perf_counter() - t0, spec["seconds"])
    p50, p99 = np.percentile(inserts, [50, 99]) if inserts else (np.nan, np.nan)
    return {"ingest_rows_per_s": sent * spec["batch"] / elapsed,
            # every batch due in the run is sent, late or not: a late one stretches it
            "offered_rows_per_s": sent * spec["batch"] / spec["seconds"],
            "insert_p50_ms": p50 * 1e3, "insert_p99_ms": p99 * 1e3}


def _child(function: str, spec: dict[str, Any]) -> subprocess.Popen[str]:
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import scale_cores; "
            f"print(json.dumps(scale_cores.{function}(json.loads(sys.argv[2]))))")
    return subprocess.Popen([sys.executable, "-c", code, str(common.BENCH_DIR),
                             json.dumps(spec)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(common.ROOT)))


def _result(child: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = child.communicate(timeout=600)
    if child.returncode != 0:
        raise RuntimeError(f"a load child failed (exit {child.returncode})")
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return got


def _measure(processes: Sequence[Any], handles: Sequence[list[str]],
             s: dict[str, Any]) -> dict[str, Any]:
    """The pollers (split evenly between `processes`) and a paced producer per process
    (each batch sent to every one), each in its own process, for s["seconds"], and the
    servers' CPU over that time (from /proc), summed."""
    import server as served
    start_at = time.time() + s["lead"]
    kids = []
    for process, its in zip(processes, handles, strict=True):
        spec = {"address": process.address, "token": served.TOKEN, "start_at": start_at,
                "seconds": s["seconds"]}
        kids.append((_child("poll_child", {**spec, "handles": its,
                                           "clients": s["clients"] // len(processes)}),
                     _child("produce_child", {**spec, "rate": s["rate"], "batch": 1_000})))
    time.sleep(max(0.0, start_at - time.time()))
    before = [_cpu_seconds(process.proc.pid) for process in processes]
    time.sleep(s["seconds"])
    after = [_cpu_seconds(process.proc.pid) for process in processes]
    polls = [_result(poller) for poller, _ in kids]
    produced = [_result(producer) for _, producer in kids]
    row = {**polls[0], **produced[0], "server_cores": None, "front_cores": None}
    if len(processes) > 1:
        # (the p50 and p99 the worst of the pollers' own, not those of all the calls)
        row.update(calls=sum(p["calls"] for p in polls),
                   invokes_per_s=sum(p["invokes_per_s"] for p in polls),
                   clients=sum(p["clients"] for p in polls),
                   errors=sum(p["errors"] for p in polls),
                   generator_cores=sum(p["generator_cores"] for p in polls),
                   p50_ms=max(p["p50_ms"] for p in polls),
                   p99_ms=max(p["p99_ms"] for p in polls),
                   ingest_rows_per_s=min(p["ingest_rows_per_s"] for p in produced),
                   insert_p99_ms=max(p["insert_p99_ms"] for p in produced))
    held = [_rss_mb(process.proc.pid) for process in processes]
    row["server_rss_mb"] = sum(own for own, _ in held)
    row["children_rss_mb"] = sum(kids for _, kids in held)
    spent = [(a, b) for a, b in zip(before, after, strict=True)
             if a is not None and b is not None]
    if len(spent) == len(processes):
        row["server_cores"] = sum(b[0] - a[0] for a, b in spent) / s["seconds"]
        row["front_cores"] = sum(b[1] - a[1] for a, b in spent) / s["seconds"]
    return row


def _rss_mb(pid: int) -> tuple[float, float]:
    """The resident memory (MB, VmRSS) of the server's process and, summed, of its
    child processes (fronts, read replicas), from /proc (Linux; 0 where unreadable)."""
    def rss(p: int) -> float:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0
    return rss(pid), sum(rss(child) for child in _children(pid))


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task")
        return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]
    except OSError:
        return []


def _cpu_seconds(pid: int) -> tuple[float, float] | None:
    """CPU seconds so far of the server's process and of its front processes (its
    children), from /proc (Linux); None where there is no /proc."""
    import server as served
    own = served._proc_counters(pid)
    if own is None:
        return None
    fronts = 0.0
    for child in _children(pid):
        counted = served._proc_counters(child)
        fronts += counted[0] if counted is not None else 0.0
    return own[0], fronts


def bench_server(s: dict[str, Any]) -> list[dict[str, Any]]:
    import server as served  # bench/server.py: its server process, data and queries
    gen = common.rng(1)
    sql = served.traffic_queries(gen, s["queries"])
    prefill = served.readings(gen, s["prefill"])
    now = time.time()
    ts = np.linspace(now - 60.0, now, s["prefill"])
    rows = []
    for label, pinned, fronts, replicas, copies in (
            ("one core, --threads 1", True, None, 0, 1),
            ("all cores", False, None, 0, 1),
            ("all cores, --fronts 0", False, 0, 0, 1),
            ("all cores, --replicas 1", False, None, 1, 1),
            ("all cores, --replicas 1 --fronts 1", False, 1, 1, 1),
            (REPLICAS, False, 0, 0, 2)):
        if s.get("only") and label not in s["only"] and not pinned:
            continue
        serve = _serve(pinned, fronts, replicas) if copies == 1 else _serve_one_thread()
        processes = [served._ServerProcess(serve=serve) for _ in range(copies)]
        try:
            handles = []
            for process in processes:
                with process.client() as setup:
                    handles.append(served._setup(setup, sql, prefill, ts))
            row = _measure(processes, handles, s)
        finally:
            for process in processes:
                process.stop()
        row.update(server=label, queries=s["queries"], bound=copies > 1)
        rows.append(row)
        print(f"  {label}: {row['invokes_per_s']:,.0f} invokes/s (p50 {row['p50_ms']:.2f} "
              f"ms, p99 {row['p99_ms']:.1f} ms), {row['ingest_rows_per_s']:,.0f} rows/s, "
              f"server {row['server_cores'] or 0:.2f} cores, fronts "
              f"{row['front_cores'] or 0:.2f}, generator {row['generator_cores']:.2f}",
              flush=True)
    return rows


# ---------------------------------------------------------------- report


def _plot_ingest(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    counts = [r["queries"] for r in rows]
    ax.plot(counts, [r["one rate"] for r in rows], marker="o", label="one core, 1 thread")
    ax.plot(counts, [r["all rate"] for r in rows], marker="s", label="every core")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("standing queries")
    ax.set_ylabel("tuples / s ingested")
    ax.set_title("Ingest on one core and on every core")
    ax.legend()


def _plot_probe(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    for count in sorted({r["queries"] for r in rows}):
        mine = [r for r in rows if r["queries"] == count]
        ax.plot([r["per thread"] for r in mine], [r["ratio"] for r in mine], marker="o",
                label=f"{count:,} queries")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.axvline(query_stem.PROBE_SPLIT, color="red", linestyle="--",
               label="PROBE_SPLIT (the engine splits from here)")
    ax.set_xscale("log")
    ax.set_xlabel("words of results per thread (tuples x words / threads)")
    ax.set_ylabel("one thread's time / split time")
    ax.set_title("The probe split over every core")
    ax.legend()


def _plot_server(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    ax.bar([r["server"] for r in rows], [r["invokes_per_s"] for r in rows])
    ax.set_ylabel("invokes / s")
    ax.set_title("100 polling clients and a producer")


INGEST_COLUMNS = [
    ("queries", "queries", ",d"), ("batch", "batch", ",d"),
    ("one rate", "one core tuples/s", ",.0f"), ("one cores", "cores used", ".2f"),
    ("all rate", "every core tuples/s", ",.0f"), ("all cores", "cores used", ".2f"),
    ("ratio", "every/one", ".2f"), ("one fastest", "one core, fastest batch tuples/s", ",.0f"),
    ("all fastest", "every core, fastest batch tuples/s", ",.0f"),
    ("fastest ratio", "every/one, fastest batch", ".2f"), ("register_s", "register s", ".1f")]
PROBE_COLUMNS = [
    ("queries", "queries", ",d"), ("tuples", "tuples", ",d"),
    ("per thread", "words per thread", ",d"), ("one us", "one thread us", ",.0f"),
    ("all us", "split us", ",.0f"), ("ratio", "one/split", ".2f")]
SERVER_COLUMNS = [
    ("server", "server", "s"), ("clients", "clients", "d"),
    ("invokes_per_s", "invokes/s", ",.0f"), ("p50_ms", "p50 ms", ".2f"),
    ("p99_ms", "p99 ms", ".1f"), ("errors", "error replies", "d"),
    ("ingest_rows_per_s", "producer rows/s", ",.0f"),
    ("offered_rows_per_s", "paced at rows/s", ",.0f"),
    ("insert_p50_ms", "insert p50 ms", ".2f"), ("insert_p99_ms", "insert p99 ms", ".1f"),
    ("server_cores", "server cores used", ".2f"),
    ("front_cores", "front processes' cores", ".2f"),
    ("server_rss_mb", "server RSS MB", ",.0f"),
    ("children_rss_mb", "children's RSS MB", ",.0f"),
    ("generator_cores", "generator cores used", ".2f")]
_SERVER_NOTES = [
    "server: the pollers are connections on one asyncio loop in a process of their own, "
    "each with one invoke in flight, its request frames encoded once and its replies "
    "not decoded (the ok flag checked in place); the producer, in another process, "
    "inserts 1,000-row batches at a fixed pace through psoup.Client. Only the server is "
    "pinned; the generator and the producer share the machine's cores with it in both "
    "runs (on 2 cores, the generator's CPU is taken from what the unpinned server could "
    "use)",
    "server cores used: the engine process's CPU time (from /proc) / wall time over the "
    "run; front processes' cores: the same for its child processes, the fronts that relay "
    "its connections (psoup serve --fronts N starts N; by default one with more than one "
    "thread and no replica) and the read replicas that answer theirs (--replicas N)"]


def _verdicts(rows: Sequence[dict[str, Any]], server: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for row in rows:
        target = INGEST_TARGETS.get(row["queries"])
        if target is not None:
            out.append(f"target: ingest every core >= {target}x one core at "
                       f"{row['queries']:,} queries: {row['ratio']:.2f}x -> "
                       f"{'PASS' if row['ratio'] >= target else 'MISS'}")
    if server:
        one, *others = server
        for every in others:
            if every.get("bound"):
                out.append(f"not a target: {every['server']}: "
                           f"{every['invokes_per_s'] / one['invokes_per_s']:.2f}x one core")
                continue
            ratio = every["invokes_per_s"] / one["invokes_per_s"]
            rows_ok = every["ingest_rows_per_s"] >= one["ingest_rows_per_s"]
            out.append(f"target: server every core >= {SERVER_TARGET}x invokes/s of one "
                       f"core, producer rows/s not lower ({every['server']}): {ratio:.2f}x, "
                       f"rows/s {every['ingest_rows_per_s']:,.0f} vs "
                       f"{one['ingest_rows_per_s']:,.0f} -> "
                       f"{'PASS' if ratio >= SERVER_TARGET and rows_ok else 'MISS'}")
    return out


def main() -> None:
    only_server = "--server-only" in sys.argv      # common.size_flag knows no such flag
    if only_server:
        sys.argv.remove("--server-only")
    level, suffix = common.size_flag(__doc__ or "")
    s = _settings(level)
    if os.environ.get("SCALE_ONLY"):    # server rows to run beside the pinned one
        s["only"] = os.environ["SCALE_ONLY"].split(";")
    print("server", flush=True)
    server = bench_server(s)
    server_notes = _verdicts([], server) + _SERVER_NOTES
    common.report(f"scale_cores_server{suffix}", server, SERVER_COLUMNS, _plot_server,
                  notes=server_notes, params=s)
    if only_server:
        return
    print(f"probe alone, one thread vs {default_threads()}", flush=True)
    probe = bench_probe(s)
    print("ingest", flush=True)
    ingest = bench_ingest(s)
    notes = _verdicts(ingest, server) + [
        f"cores: {default_threads()} ({common.machine_info()['cpu']}); the machine's other "
        "load lowers every ratio",
        f"PROBE_SPLIT = {query_stem.PROBE_SPLIT:,} words per thread: the engine splits a "
        "probe whose share per thread reaches it"] + _SERVER_NOTES
    common.report(f"scale_cores_probe{suffix}", probe, PROBE_COLUMNS, _plot_probe,
                  params=s)
    common.report(f"scale_cores{suffix}", ingest, INGEST_COLUMNS, _plot_ingest, notes=notes,
                  params=s)


if __name__ == "__main__":
    main()
