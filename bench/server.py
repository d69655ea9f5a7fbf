"""The service under load: polling clients against a live ingest, and ingest through the
protocol, each against the embedded engine in the same run (the issue's targets:
report the protocol overhead; server ingest >= 50% of embedded ingest).

Workload: the traffic stream of the paper's Sect. 5.5 (Table 3: lane 1-8, stationid
1-9, speed 0-100 with extremes rare) and standing queries of the shape
`lane = c1 AND stationid = c2 AND speed > c3` over the last minute.

- poll: the server (its own process, in memory) holds the queries over a prefilled
  stream; `clients` threads each invoke random handles in a loop while one producer
  thread inserts batches of 1,000 readings as fast as the server takes them. Reported:
  invocations per second, p50/p99 latency, and the ratio of p50 latency to the embedded
  engine's invoke cost on the same data and queries (protocol overhead).
- large answers: one client invokes 64 handles in turn, each answer thousands to tens of
  thousands of rows, on a server whose C allocator keeps the memory it frees (what
  `psoup serve` does) and on one left to glibc's default (freed memory handed back to
  the kernel, then faulted in again): invokes/s, server CPU and page faults per call.
- ingest: batches of 10,000 readings as numpy columns through `Client.insert`, with the
  same queries registered, against `Engine.insert` of the same batches: one request at
  a time, and pipelined (one insert call that the client sends as a pipeline of
  10,000-row batches); the server in memory and with a data
  directory (sync="group": fsynced before each reply).

Usage: python bench/server.py [--quick | --smoke]
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)

import psoup  # noqa: E402
from psoup.client import Client  # noqa: E402

DDL = "CREATE STREAM traffic (lane INT, stationid INT, speed FLOAT) RETAIN 200000 ROWS"
TOKEN = "bench-token"
INGEST_TARGET = 0.5      # server ingest >= 50% of embedded ingest
#: Poll invokes/s of the full run before reads ran on the event loop (commit 06abc73), the
#: service issue's baseline: 100 polling clients should get 3x. Measured again on
#: 2026-11-25 on the 2-core machine of bench/results, alternating with this code: the
#: means of 2 and 3 runs (706, 738, 737; the 2026-11-23 figures, 832 and 552, were
#: slower, and flattered the ratio by a third). Other machines print no ratio.
BEFORE = {"machine_cpus": 2, "1 client, no ingest": 1304.0, "100 clients + producer": 727.0}
POLL_TARGET = 3.0
#: `run_server` with the C allocator left to hand freed memory back to the kernel.
SERVE_HANDING_BACK = ("import sys; import psoup.server.server as s; "
                      "s.keep_freed_memory = lambda: False; "
                      "s.run_server(sys.argv[1] or None, port=int(sys.argv[2]), "
                      "token=sys.argv[3], echo=lambda x: None, answer_cache_bytes=0)")
SERVE = ("import sys; from psoup.server.server import run_server; "
         "d = sys.argv[1] or None; "
         "run_server(d, port=int(sys.argv[2]), token=sys.argv[3], sync='group', "
         "spark_master=sys.argv[4] or None, echo=lambda s: None)")
#: `run_server` reading every answer whole: the large-answers scenario invokes its
#: handles again and again over an unchanged window, which a server keeping the queries'
#: last answers (the default) would answer from them, building nothing.
SERVE_WHOLE = SERVE.replace("echo=lambda s: None)", "echo=lambda s: None, "
                                                     "answer_cache_bytes=0)")


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"queries": 5, "prefill": 1_000, "clients": 2, "seconds": 1.0,
                "ingest_batches": 2, "ingest_batch": 500, "large_tuples": 1_024,
                "large_window": 512, "large_seconds": 0.2}
    if level == "quick":
        return {"queries": 20, "prefill": 5_000, "clients": 8, "seconds": 1.0,
                "ingest_batches": 5, "ingest_batch": 2_000, "large_tuples": 4_096,
                "large_window": 2_048, "large_seconds": 0.5}
    return {"queries": 200, "prefill": 100_000, "clients": 100, "seconds": 10.0,
            "ingest_batches": 40, "ingest_batch": 10_000, "large_tuples": 73_728,
            "large_window": 32_768, "large_seconds": 5.0}


def readings(gen: np.random.Generator, n: int) -> dict[str, NDArray[Any]]:
    """n traffic readings: lanes and stations uniform, speed normal around 60, clipped."""
    return {"lane": gen.integers(1, 9, n), "stationid": gen.integers(1, 10, n),
            "speed": np.clip(gen.normal(60.0, 15.0, n), 0.0, 100.0).round(1)}


def traffic_queries(gen: np.random.Generator, n: int) -> list[str]:
    return [f"SELECT stationid, speed FROM traffic WHERE lane = {gen.integers(1, 9)} AND "
            f"stationid = {gen.integers(1, 10)} AND speed > {gen.integers(40, 90)} "
            "BEGIN NOW - 60 END NOW" for _ in range(n)]


class _ServerProcess:
    """`run_server` in a child process (its own interpreter, so its own GIL); history
    jobs on `spark_master` (default: local[*])."""

    def __init__(self, data_dir: str = "", spark_master: str = "", serve: str = SERVE):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=str(common.ROOT),
                   PSOUP_CONFIG_DIR=tempfile.mkdtemp(prefix="psoup-bench-config-"))
        self.proc = subprocess.Popen([sys.executable, "-c", serve, data_dir, str(self.port),
                                      TOKEN, spark_master], env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                Client(self.address, token=TOKEN, timeout=5).close()
                return
            except psoup.PSoupError as err:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the benchmark server did not start") from err
                time.sleep(0.1)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> Client:
        return Client(self.address, token=TOKEN, timeout=60)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def _setup(target: psoup.Engine | Client, sql: list[str], prefill: dict[str, NDArray[Any]],
           ts: NDArray[np.float64]) -> list[str]:
    target.execute(DDL)
    handles = [target.register(q) for q in sql]
    target.insert("traffic", prefill, ts=ts)
    return handles


def bench_poll(s: dict[str, Any]) -> list[dict[str, Any]]:
    gen = common.rng(1)
    sql = traffic_queries(gen, s["queries"])
    prefill = readings(gen, s["prefill"])
    now = time.time()
    ts = np.linspace(now - 60.0, now, s["prefill"])

    embedded = psoup.Engine(answer_cache_bytes=0)   # each answer read whole, as before
    handles = _setup(embedded, sql, prefill, ts)
    per_call = common.timed(lambda: [embedded.invoke(h) for h in handles], repeat=5,
                            min_time=1.0).median / len(handles)
    rows: list[dict[str, Any]] = []
    for scenario, clients, producing in (("1 client, no ingest", 1, False),
                                         (f"{s['clients']} clients + producer",
                                          s["clients"], True)):
        server = _ServerProcess()
        try:
            with server.client() as setup:
                remote = _setup(setup, sql, prefill, ts)
            row = _poll(server, remote, clients, producing, s["seconds"])
        finally:
            server.stop()
        row.update(scenario=scenario, queries=s["queries"], embedded_ms=per_call * 1e3,
                   overhead=row["p50_ms"] / (per_call * 1e3),
                   capacity=row["invokes_per_s"] * per_call)
        rows.append(row)
    return rows


def _poll(server: _ServerProcess, handles: list[str], clients: int, producing: bool,
          seconds: float) -> dict[str, Any]:
    """Closed-loop pollers (each invokes random handles back to back) for `seconds`,
    with or without a producer inserting batches of 1,000 readings meanwhile."""
    stop = threading.Event()
    latencies: list[list[float]] = [[] for _ in range(clients)]
    ingested = [0]
    inserts: list[float] = []           # the producer's round trip per batch

    def poll(k: int) -> None:
        pick = np.random.default_rng(k)
        with server.client() as client:
            clock, out = time.perf_counter, latencies[k]
            while not stop.is_set():
                h = handles[int(pick.integers(len(handles)))]
                t0 = clock()
                client.invoke(h)
                out.append(clock() - t0)

    def produce() -> None:
        feed = np.random.default_rng(99)
        with server.client() as client:
            while not stop.is_set():
                batch = readings(feed, 1_000)
                t0 = time.perf_counter()
                client.insert("traffic", batch)
                inserts.append(time.perf_counter() - t0)
                ingested[0] += 1_000

    threads = [threading.Thread(target=poll, args=(k,)) for k in range(clients)]
    if producing:
        threads.append(threading.Thread(target=produce))
    elapsed = common.run_for(threads, stop, seconds)
    lat = np.concatenate([np.asarray(x) for x in latencies])
    p50, p99 = np.percentile(lat, [50, 99])
    row: dict[str, Any] = {
        "clients": clients, "invokes_per_s": len(lat) / elapsed, "p50_ms": p50 * 1e3,
        "p99_ms": p99 * 1e3, "ingest_rows_per_s": ingested[0] / elapsed,
        "insert_p50_ms": None, "insert_p99_ms": None}
    if inserts:
        row["insert_p50_ms"], row["insert_p99_ms"] = 1e3 * np.percentile(inserts, [50, 99])
    return row


def _proc_counters(pid: int) -> tuple[float, int] | None:
    """(CPU seconds, minor page faults) of a process so far, from /proc (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, int(fields[7])


def bench_large_answers(s: dict[str, Any]) -> list[dict[str, Any]]:
    """Answers of thousands to tens of thousands of rows, 64 handles invoked in turn by
    one client, the server keeping the memory its allocator frees (`psoup serve`) and
    handing it back to the kernel (glibc's default): invokes/s, and the server's CPU and
    page faults per invocation."""
    gen = common.rng(7)
    n, window = s["large_tuples"], s["large_window"]
    columns = common.data_columns(common.rng(3), n)
    wheres = [common._factor(gen, "interval", str(gen.choice(common.STREAM_COLUMNS)))
              for _ in range(64)]
    rows: list[dict[str, Any]] = []
    for label, serve in (("kept (psoup serve)", SERVE_WHOLE),
                         ("handed back (glibc default)", SERVE_HANDING_BACK)):
        server = _ServerProcess(serve=serve)
        try:
            with server.client() as client:
                client.execute(common.CREATE_R)
                handles = [client.register(f"SELECT * FROM R WHERE {w} BEGIN (NOW - "
                                           f"{window} ROWS) END NOW") for w in wheres]
                for a in range(0, n, 8192):
                    client.insert("R", {c: v[a:a + 8192] for c, v in columns.items()},
                                  ts=np.arange(a, min(a + 8192, n), dtype=np.float64))
                sizes = [len(client.invoke(h, now=float(n))) for h in handles]
                before = _proc_counters(server.proc.pid)
                calls, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < s["large_seconds"]:
                    for h in handles:
                        client.invoke(h, now=float(n))
                    calls += len(handles)
                elapsed = time.perf_counter() - t0
                after = _proc_counters(server.proc.pid)
        finally:
            server.stop()
        row: dict[str, Any] = {"server": label, "mean_rows": float(np.mean(sizes)),
               "invokes_per_s": calls / elapsed, "cpu_us": None, "faults": None}
        if before is not None and after is not None:
            row["cpu_us"] = 1e6 * (after[0] - before[0]) / calls
            row["faults"] = (after[1] - before[1]) / calls
        rows.append(row)
    return rows


def bench_ingest(s: dict[str, Any]) -> list[dict[str, Any]]:
    gen = common.rng(2)
    sql = traffic_queries(gen, s["queries"])
    n: int = s["ingest_batch"]
    k: int = s["ingest_batches"]
    data = readings(gen, n * k)
    stamps = 1e9 + np.arange(n * k) / n
    batches = [({c: v[i * n:(i + 1) * n] for c, v in data.items()}, stamps[i * n:(i + 1) * n])
               for i in range(k)]

    def run(target: psoup.Engine | Client, pipelined: bool = False) -> float:
        target.execute(DDL)
        for q in sql:
            target.register(q)
        t0 = time.perf_counter()
        if pipelined:            # one insert call; the client pipelines its batches
            assert isinstance(target, Client)       # nanoseconds beside the inserts timed
            target.batch_rows = n
            target.insert("traffic", data, ts=stamps)
        else:
            for cols, ts in batches:
                target.insert("traffic", cols, ts=ts)
        return n * k / (time.perf_counter() - t0)

    run(psoup.Engine())     # untimed: compiled kernels loaded (or compiled) first
    rows: list[dict[str, Any]] = [{"engine": "embedded", "rows_per_s": run(psoup.Engine())}]
    with tempfile.TemporaryDirectory(prefix="psoup-bench-") as tmp:
        rows.append({"engine": "embedded, durable (sync=always)",
                     "rows_per_s": run(psoup.Engine(path=os.path.join(tmp, "e")))})
        for label, data_dir, pipelined in (
                ("server, one request at a time", "", False),
                ("server, pipelined", "", True),
                ("server, pipelined, durable (group fsync)", os.path.join(tmp, "s"), True)):
            server = _ServerProcess(data_dir)
            try:
                with server.client() as client:
                    rows.append({"engine": label, "rows_per_s": run(client, pipelined)})
            finally:
                server.stop()
    base = rows[0]["rows_per_s"]
    for row in rows:
        row["vs_embedded"] = row["rows_per_s"] / base
    return rows


def _plot_poll(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    labels = ["embedded invoke"]
    values = [rows[0]["embedded_ms"]]
    for row in rows:
        labels += [f"{row['scenario']}\np50", "p99"]
        values += [row["p50_ms"], row["p99_ms"]]
    ax.bar(range(len(values)), values, color=["tab:gray"] + ["tab:blue", "tab:orange"] * len(rows))
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("milliseconds per invocation")
    ax.set_title(f"invoke latency through the server, {rows[0]['queries']} standing queries")


def _plot_large(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    ax.bar([r["server"] for r in rows], [r["cpu_us"] or 0 for r in rows], color="tab:blue")
    ax.set_ylabel("server CPU us per invocation")
    ax.set_title(f"large answers ({rows[0]['mean_rows']:,.0f} rows on average), "
                 "64 handles in turn")


def _plot_ingest(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    ax.barh([r["engine"] for r in rows], [r["rows_per_s"] for r in rows], color="tab:blue")
    ax.set_xlabel("tuples per second")
    ax.set_title("ingest: embedded engine vs through the server")


def main() -> None:
    level, suffix = common.size_flag(__doc__)
    quick = level != "full"
    s = _settings(level)

    poll = bench_poll(s)
    notes = [
        "p50/embedded: server round trip / the embedded engine's invoke cost on the same "
        "data and queries, each answer read whole (answer_cache_bytes=0; protocol "
        "overhead; with one client it is the whole story)",
        "the server keeps each query's last answer (its default), so a poll reads only "
        "the tuples that arrived since that handle's last poll (with no ingest, none: "
        "the last answer's columns are sent again)",
        "capacity: invokes/s x embedded cost = the share of one core's worth of embedded "
        "invocations the server delivered; closed-loop clients queue behind each other, "
        "so their latency is clients / throughput (Little's law), not protocol cost",
        "insert p50/p99: the producer's round trip per 1,000-row batch while the pollers "
        "run (the engine's fair lock lets it in between polls, not after all of them)"]
    comparable = not quick and os.cpu_count() == BEFORE["machine_cpus"]
    for row in poll:
        row["vs_before"] = (row["invokes_per_s"] / BEFORE[row["scenario"]]
                            if comparable and row["scenario"] in BEFORE else None)
    if comparable:
        ratio = poll[-1]["vs_before"]
        notes.append(f"vs before: invokes/s / the same run before reads ran on the event "
                     f"loop (commit 06abc73, same machine); {poll[-1]['scenario']}: "
                     f"{ratio:.2f}x (target >= {POLL_TARGET}x: "
                     f"{'met' if ratio >= POLL_TARGET else 'NOT met'}); the producer's "
                     "rows/s vary with it (it inserts as fast as the server takes them), "
                     "and load from other processes on the machine moves both runs' "
                     "invokes/s by up to a third")
    common.report(f"server_poll{suffix}", poll, [
        ("scenario", "scenario", "s"), ("invokes_per_s", "invokes/s", ",.0f"),
        ("p50_ms", "p50 ms", ".3f"), ("p99_ms", "p99 ms", ".3f"),
        ("embedded_ms", "embedded ms", ".3f"), ("overhead", "p50/embedded", ".2f"),
        ("capacity", "capacity", ".2f"), ("ingest_rows_per_s", "producer rows/s", ",.0f"),
        ("insert_p50_ms", "insert p50 ms", ".2f"), ("insert_p99_ms", "insert p99 ms", ".2f"),
        ("vs_before", "vs before", ".2f"),
    ], _plot_poll, notes=notes, params=s)

    large = bench_large_answers(s)
    kept, handed = large
    notes = ["one client invokes 64 handles in turn, each answer a few thousand to tens of "
             "thousands of rows (PSoup-P, W = "
             f"{s['large_window']:,}); server CPU and page faults per invocation from /proc; "
             "both servers read every answer whole (answer_cache_bytes=0: the handles are "
             "invoked again over an unchanged window)"]
    if kept["cpu_us"] and handed["cpu_us"]:
        notes.append(f"server CPU per invocation, handed back / kept: "
                     f"{handed['cpu_us'] / kept['cpu_us']:.2f}x; page faults "
                     f"{handed['faults']:.0f} / {kept['faults']:.0f}")
    common.report(f"server_large{suffix}", large, [
        ("server", "server's allocator", "s"), ("mean_rows", "rows per answer", ",.0f"),
        ("invokes_per_s", "invokes/s", ",.0f"), ("cpu_us", "server CPU us", ",.0f"),
        ("faults", "page faults", ",.0f"),
    ], _plot_large, notes=notes, params=s)

    ingest = bench_ingest(s)
    server_ratio = next(r["vs_embedded"] for r in ingest if r["engine"] == "server, pipelined")
    verdict = "met" if server_ratio >= INGEST_TARGET else "NOT met"
    common.report(f"server_ingest{suffix}", ingest, [
        ("engine", "engine", "s"), ("rows_per_s", "rows/s", ",.0f"),
        ("vs_embedded", "vs embedded", ".2f"),
    ], _plot_ingest, notes=[
        f"server ingest / embedded ingest = {server_ratio:.2f} "
        f"(target >= {INGEST_TARGET}: {verdict})"], params=s)


if __name__ == "__main__":
    main()
