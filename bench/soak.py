"""The service over time (issue 15): live traffic beside a history job, and a soak of
100 clients, each against its own control in the same run.

Workload: the traffic stream and queries of bench/server.py (Sect. 5.5's trace,
`lane = c1 AND stationid = c2 AND speed > c3` over the last minute), on a durable server
(its own process, a data directory in a temporary folder, sync="group").

- history: the data directory is first filled through an embedded engine with an
  archive of N readings (full: 2 million; RETAIN 100,000 ROWS, so all but the last
  100,000 left memory for the Parquet archive), then served. One producer inserts
  batches of 1,000 readings every 50 ms and pollers invoke random handles every 100 ms
  (paced, not closed loops: the latency is what interference adds, not queueing behind
  other clients), for a window without a history job, then for a window of the same
  length that starts as the `history` op returns (every standing query over the
  archive: one Spark pass in the server process, local[*]). Spark is started before
  either window by a job over a small stream of its own (a server's first job starts
  it, then it stays up; its start alone took most of a minute on the loaded 2-core
  machine, so the measured job is the pass, not the JVM's start). A monitor polls
  `history_status` to tell how much of the window the job covered. Reported: insert
  and invoke p50/p99 in both windows and the p99 ratios (target <= 2x). A full run then
  waits for the job to end (cancelling it after 5 minutes); a quick run cancels it
  after the window, and reports how long the cancel took to stop it. A full run does
  all this twice, on a fresh server each time: with the server's default Spark master,
  local[*], and with local[1] (`psoup serve --spark-master local[1]`: Spark on one core,
  leaving the other to the server).
- clients: 100 clients for 3 minutes (quick: a few seconds): 1 producer inserting with
  idempotency keys (its own producer id, consecutive seqs), pollers invoking with
  `since` cursors, and churners registering a query, polling it and unregistering it.
  Pollers sometimes poll a churner's current handle, so some polls race its
  unregistration. Every error is counted by wire code. Documented, expected codes:
  `unknown_handle` on a churned handle (docs/protocol.md: "a handle ... unregistered"),
  and `cursor_expired` (a cursor whose answer the server can no longer rebuild, after
  which the client invokes without `since`); targets: no other error, cursor_expired
  < 1% of polls, and the producer's last seq on the server equal to its last batch.

Server and clients share the machine's cores (the clients are threads of this process).

Usage: python bench/soak.py [--quick | --smoke]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)
from server import TOKEN, _ServerProcess, readings, traffic_queries  # noqa: E402

import psoup  # noqa: E402
from psoup.client import Client  # noqa: E402
from psoup.results.result import Changes  # noqa: E402

DDL = "CREATE STREAM traffic (lane INT, stationid INT, speed FLOAT) RETAIN 100000 ROWS"
P99_TARGET = 2.0             # p99 beside a history job <= 2x the p99 without one
EXPIRED_TARGET = 0.01        # cursor_expired < 1% of polls
#: Codes the protocol documents for this workload, and why each is expected.
EXPECTED = {
    "unknown_handle": "a poller raced a churner's unregister of that handle",
    "cursor_expired": "the answer behind a cursor could no longer be rebuilt; the poller "
                      "invokes without `since` next time",
}
BATCH, PRODUCE_EVERY = 1_000, 0.05
WARMUP_DDL = "CREATE STREAM warmup (lane INT, stationid INT, speed FLOAT) RETAIN 10 ROWS"
_T = TypeVar("_T")


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"archive_rows": 20_000, "queries": 5, "pollers": 2, "window": 1.0,
                "job_limit": 0.0, "masters": ["local[*]"],
                "soak_pollers": 2, "churners": 1, "soak_seconds": 2.0,
                "poll_every": 0.1, "soak_poll_every": 0.2}
    if level == "quick":
        return {"archive_rows": 200_000, "queries": 20, "pollers": 4, "window": 2.0,
                "job_limit": 0.0, "masters": ["local[*]"],
                "soak_pollers": 6, "churners": 3, "soak_seconds": 3.0,
                "poll_every": 0.1, "soak_poll_every": 0.2}
    return {"archive_rows": 2_000_000, "queries": 200, "pollers": 16, "window": 15.0,
            "job_limit": 300.0, "masters": ["local[*]", "local[1]"],
            "soak_pollers": 79, "churners": 20, "soak_seconds": 180.0,
            "poll_every": 0.1, "soak_poll_every": 0.5}


def _code(exc: Exception) -> str:
    """The wire code of a psoup error (client-side errors have theirs), else the type."""
    return getattr(exc, "code", None) or type(exc).__name__


# ------------------------------------------------------------------ history beside traffic

def _fill_archive(state: str, n: int) -> float:
    """n readings through an embedded engine on `state`, stamped over the hour before
    now; all but the retained 100,000 leave memory for the archive. Also a stream
    `warmup` of 100 rows (still in memory, its archive empty): a job over it costs
    little more than Spark's start. Returns seconds."""
    began = time.perf_counter()
    gen = common.rng(151)
    end = time.time() - 60.0
    ts = np.linspace(end - 3600.0, end, n)
    engine = psoup.Engine(path=state, sync="off")
    engine.execute(DDL)
    engine.execute(WARMUP_DDL)
    engine.insert("warmup", readings(gen, 100), ts=ts[:100])
    step = 100_000
    for first in range(0, n, step):
        engine.insert("traffic", readings(gen, min(step, n - first)),
                      ts=ts[first:first + step])
    engine.close()
    return time.perf_counter() - began


def _window(server: _ServerProcess, handles: list[str], pollers: int, seconds: float,
            every: float, job: str | None = None) -> dict[str, Any]:
    """One producer and `pollers` pollers, paced, for `seconds`; with `job`, a monitor
    polls its status and the window's share covered by the running job is returned."""
    stop = threading.Event()
    inserts: list[float] = []
    invokes: list[list[float]] = [[] for _ in range(pollers)]
    errors: Counter[str] = Counter()
    ended: list[float] = []

    def timed_call(out: list[float], call: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        try:
            call()
        except psoup.PSoupError as exc:
            errors[_code(exc)] += 1
            return
        out.append(time.perf_counter() - t0)

    def produce() -> None:
        feed = np.random.default_rng(7)
        with server.client() as client:
            common.paced(stop, PRODUCE_EVERY,
                   lambda: timed_call(inserts, lambda: client.insert(
                       "traffic", readings(feed, BATCH))))

    def poll(k: int) -> None:
        pick = np.random.default_rng(k)
        with server.client() as client:
            common.paced(stop, every, lambda: timed_call(invokes[k], lambda: client.invoke(
                handles[int(pick.integers(len(handles)))])))

    def monitor() -> None:
        assert job is not None
        with server.client() as client:
            while not stop.wait(0.2):
                if client.history_status(job)["state"] != "running":
                    ended.append(time.perf_counter())
                    return

    threads = [threading.Thread(target=produce)]
    threads += [threading.Thread(target=poll, args=(k,)) for k in range(pollers)]
    if job is not None:
        threads.append(threading.Thread(target=monitor))
    t0 = time.perf_counter()
    elapsed = common.run_for(threads, stop, seconds)
    ins, inv = np.asarray(inserts), np.concatenate([np.asarray(x) for x in invokes])
    covered = None if job is None else (min(ended[0], t0 + elapsed) - t0 if ended
                                        else elapsed) / elapsed
    return {"seconds": elapsed, "inserts": len(ins), "invokes": len(inv),
            "insert_p50_ms": np.percentile(ins, 50) * 1e3,
            "insert_p99_ms": np.percentile(ins, 99) * 1e3,
            "invoke_p50_ms": np.percentile(inv, 50) * 1e3,
            "invoke_p99_ms": np.percentile(inv, 99) * 1e3,
            "errors": sum(errors.values()), "covered": covered,
            "load": os.getloadavg()[0]}


def bench_history(s: dict[str, Any], master: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The windows without and beside a history job on a server whose Spark master is
    `master`; rows (quiet, busy, ratio) and the job's figures."""
    tmp = tempfile.mkdtemp(prefix="psoup-soak-")
    try:
        state = os.path.join(tmp, "state")
        fill_s = _fill_archive(state, s["archive_rows"])
        server = _ServerProcess(state, master)
        try:
            with server.client() as client:
                began = time.perf_counter()
                client.history([client.register("SELECT * FROM warmup WHERE lane = 1")],
                               wait=True)
                spark_s = time.perf_counter() - began
                handles = [client.register(q)
                           for q in traffic_queries(common.rng(152), s["queries"])]
                _window(server, handles, s["pollers"], 1.0, s["poll_every"])
                quiet = _window(server, handles, s["pollers"], s["window"], s["poll_every"])
                began = time.perf_counter()
                job = client.history()
                busy = _window(server, handles, s["pollers"], s["window"], s["poll_every"],
                               job)
                cancelled = None
                while (status := client.history_status(job))["state"] == "running":
                    if cancelled is None and time.perf_counter() - began > s["job_limit"]:
                        cancelled = time.perf_counter()
                        client.history_cancel(job)
                    time.sleep(0.2)
                job_s = time.perf_counter() - began
                cancel_s = None if cancelled is None else time.perf_counter() - cancelled
        finally:
            server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    quiet["scenario"], busy["scenario"] = "no history job", "history job running"
    ratio: dict[str, Any] = {"scenario": "ratio (with job / without)",
                             **{k: busy[k] / quiet[k] for k in (
                                 "insert_p50_ms", "insert_p99_ms", "invoke_p50_ms",
                                 "invoke_p99_ms")}}
    job_info = {"fill_s": fill_s, "spark_s": spark_s, "job_s": job_s, "cancel_s": cancel_s,
                "job_state": status["state"],
                "matches": sum((status["result"] or {}).values())}
    rows = [quiet, busy, ratio]
    for row in rows:
        row["master"] = master
    return rows, job_info


def _plot_history(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    keys = ["insert_p50_ms", "insert_p99_ms", "invoke_p50_ms", "invoke_p99_ms"]
    x = np.arange(len(keys))
    shown = [row for row in rows if not row["scenario"].startswith("ratio")]
    width = 0.8 / len(shown)
    for i, row in enumerate(shown):
        ax.bar(x + (i - (len(shown) - 1) / 2) * width, [row[k] for k in keys], width,
               label=f"{row['scenario']}, Spark {row['master']}")
    ax.set_xticks(x, ["insert p50", "insert p99", "invoke p50", "invoke p99"])
    ax.set_yscale("log")
    ax.set_ylabel("milliseconds")
    ax.legend(fontsize=8)
    ax.set_title("live traffic latency, without and beside a Spark history job")


# ------------------------------------------------------------------ soak

class _Tally:
    """Calls, latencies and errors by code of one client role, shared by its threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()

    def call(self, fn: Callable[[], _T], expected: tuple[str, ...] = ()) -> _T | Exception:
        """fn(); its latency if it succeeds, its error counted by code if not (as
        "code" when in `expected`, "code (unexpected)" otherwise)."""
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as exc:   # every error counts; the soak goes on
            code = _code(exc)
            with self.lock:
                self.errors[code if code in expected else f"{code} (unexpected)"] += 1
            return exc
        with self.lock:
            self.latencies.append(time.perf_counter() - t0)
        return out


def _churn(k: int, server: _ServerProcess, stop: threading.Event, tally: _Tally,
           board: list[str | None]) -> None:
    """Churner `k` until `stop`: registers a query, posts its handle on `board` for the
    pollers, invokes it three times with its cursor, unregisters it."""
    pick = np.random.default_rng(2000 + k)
    client = tally.call(server.client)
    if isinstance(client, Exception):
        return
    with client:
        while not stop.is_set():
            sql = traffic_queries(pick, 1)[0]

            def register(sql: str = sql) -> str:
                return client.register(sql)
            handle = tally.call(register)
            if isinstance(handle, Exception):
                stop.wait(1.0)
                continue
            board[k] = handle
            cursor = None
            for _ in range(3):
                if stop.wait(0.3 + 0.4 * pick.random()):
                    break

                def invoke(handle: str = handle,
                           cursor: str | None = cursor) -> psoup.Result | Changes:
                    return client.invoke(handle, since=cursor)
                out = tally.call(invoke, expected=("cursor_expired",))
                cursor = None if isinstance(out, Exception) else out.cursor
            board[k] = None

            def unregister(handle: str = handle) -> None:
                client.unregister(handle)
            tally.call(unregister)


def bench_soak(s: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    tmp = tempfile.mkdtemp(prefix="psoup-soak-")
    producer_id = "soak-producer"
    tallies = {role: _Tally() for role in ("producer", "poller", "churner")}
    polls: Counter[str] = Counter()
    board: list[str | None] = [None] * s["churners"]
    polls_of = [0] * s["soak_pollers"]
    stop = threading.Event()
    try:
        server = _ServerProcess(os.path.join(tmp, "state"))
        try:
            with server.client() as setup:
                setup.execute(DDL)
                stable = [setup.register(q) for q in traffic_queries(common.rng(153), 50)]
                setup.insert("traffic", readings(common.rng(154), 100_000))

            def produce() -> None:
                feed, tally = np.random.default_rng(155), tallies["producer"]
                with Client(server.address, token=TOKEN, timeout=60,
                            producer=producer_id) as client:
                    common.paced(stop, PRODUCE_EVERY, lambda: tally.call(
                        lambda: client.insert("traffic", readings(feed, BATCH))))

            def poll(k: int) -> None:
                pick, tally = np.random.default_rng(1000 + k), tallies["poller"]
                own = [stable[k % len(stable)], stable[(7 * k + 3) % len(stable)]]
                cursors: dict[str, str | None] = {}
                client = tally.call(server.client)      # a refused connect counts too
                if isinstance(client, Exception):
                    return

                def step() -> None:
                    posted = board[k % len(board)] if pick.random() < 0.1 else None
                    churned = posted is not None
                    handle = posted or own[polls_of[k] % len(own)]
                    polls_of[k] += 1
                    since = cursors.pop(handle, None)
                    out = tally.call(lambda: client.invoke(handle, since=since),
                                     expected=("unknown_handle", "cursor_expired")
                                     if churned else ("cursor_expired",))
                    with tally.lock:
                        polls["since" if since else "whole"] += 1
                    if not isinstance(out, Exception):
                        cursors[handle] = out.cursor

                with client:
                    common.paced(stop, s["soak_poll_every"] * (0.5 + pick.random()), step)

            threads = [threading.Thread(target=produce)]
            threads += [threading.Thread(target=poll, args=(k,))
                        for k in range(s["soak_pollers"])]
            threads += [threading.Thread(target=_churn,
                                         args=(k, server, stop, tallies["churner"], board))
                        for k in range(s["churners"])]
            elapsed = common.run_for(threads, stop, s["soak_seconds"])
            with server.client() as check:
                last_seq = check.last_seq(producer_id)
        finally:
            server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    counts = {"producer": 1, "poller": s["soak_pollers"], "churner": s["churners"]}
    rows: list[dict[str, Any]] = []
    for role, tally in tallies.items():
        lat = np.asarray(tally.latencies)
        rows.append({"role": role, "clients": counts[role], "calls": len(lat),
                     "calls_per_s": len(lat) / elapsed,
                     "p50_ms": np.percentile(lat, 50) * 1e3 if len(lat) else None,
                     "p99_ms": np.percentile(lat, 99) * 1e3 if len(lat) else None,
                     "errors": dict(tally.errors)})
    batches = len(tallies["producer"].latencies)
    return rows, {"seconds": elapsed, "polls": dict(polls), "last_seq": last_seq,
                  "batches": batches, "load": os.getloadavg()[0]}


def _plot_soak(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["p50_ms"] or 0 for r in rows], 0.4, label="p50")
    ax.bar(x + 0.2, [r["p99_ms"] or 0 for r in rows], 0.4, label="p99")
    ax.set_xticks(x, [f"{r['role']} x{r['clients']}" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("milliseconds per call")
    ax.legend()
    ax.set_title(f"soak: {sum(r['clients'] for r in rows)} clients on one durable server")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> None:
    only = None
    if "--only" in sys.argv:        # --only history|clients: one of the two scenarios
        at = sys.argv.index("--only")
        only = sys.argv[at + 1] if at + 1 < len(sys.argv) else ""
        if only not in ("history", "clients"):
            raise SystemExit("--only takes history or clients")
        del sys.argv[at:at + 2]
    level, suffix = common.size_flag(__doc__)
    s = _settings(level)
    cores = f"{os.cpu_count()} cores shared by the server, Spark and the client threads"

    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for master in (s["masters"] if only != "clients" else ()):
        found, job = bench_history(s, master)
        rows += found
        busy, ratio = found[1], found[2]
        busy.update(job)
        notes += [
            f"Spark {master}: archive of {s['archive_rows']:,} readings "
            f"({job['fill_s']:.1f} s to write through an embedded engine); "
            f"{s['queries']} standing queries; the job: {job['job_s']:.1f} s from the "
            f"`history` op to its end ({job['job_state']}, {job['matches']:,} archived "
            "matches"
            + (f"; cancelled once the window was over and {s['job_limit']:.0f} s had "
               f"passed, stopped {job['cancel_s']:.1f} s later"
               if job["cancel_s"] is not None else "")
            + f"); Spark started before both windows, by a job over a small stream "
            f"({job['spark_s']:.1f} s); the job covered {busy['covered']:.0%} of the "
            f"{s['window']:.0f} s window (history_status polled every 0.2 s)"]
        for key, what in (("insert_p99_ms", "insert"), ("invoke_p99_ms", "invoke")):
            notes.append(f"target: {what} p99 with the job <= {P99_TARGET:.0f}x without "
                         f"(Spark {master}): {ratio[key]:.2f}x -> "
                         f"{_verdict(ratio[key] <= P99_TARGET)}")
    notes.append(f"live traffic: 1 producer, {BATCH:,} rows every "
                 f"{PRODUCE_EVERY * 1e3:.0f} ms; {s['pollers']} pollers, one invoke each "
                 f"every {s['poll_every'] * 1e3:.0f} ms; {cores}")
    if only == "clients":
        pass
    else:
        _report_history(suffix, rows, notes, s)
    if only == "history":
        return
    _soak_clients(s, suffix)


def _report_history(suffix: str, rows: list[dict[str, Any]], notes: list[str],
                    s: dict[str, Any]) -> None:
    common.report(f"soak_history{suffix}", rows, [
        ("master", "Spark", "s"), ("scenario", "scenario", "s"),
        ("inserts", "inserts", ",d"),
        ("insert_p50_ms", "insert p50 ms", ".2f"), ("insert_p99_ms", "insert p99 ms", ".2f"),
        ("invokes", "invokes", ",d"), ("invoke_p50_ms", "invoke p50 ms", ".2f"),
        ("invoke_p99_ms", "invoke p99 ms", ".2f"), ("errors", "errors", ",d"),
        ("covered", "job covered", ".0%"), ("load", "load avg (1 min)", ".1f"),
    ], _plot_history, notes=notes, params=s)


def _soak_clients(s: dict[str, Any], suffix: str) -> None:
    rows, run = bench_soak(s)
    errors: Counter[str] = Counter()
    for row in rows:
        errors.update(row["errors"])
        row["error_text"] = ", ".join(f"{c}: {n}" for c, n in sorted(row["errors"].items())) \
            or "none"
    polls = sum(run["polls"].values())
    unexpected = sum(n for code, n in errors.items() if code.endswith("(unexpected)"))
    expired = errors.get("cursor_expired", 0)
    share = expired / polls if polls else 0.0
    clients = sum(r["clients"] for r in rows)
    notes = [
        f"{clients} clients for {run['seconds']:.0f} s against one durable server; "
        f"{os.cpu_count()} cores shared by the server and the client threads (the "
        f"{clients} clients are threads of one process); load average "
        f"(1 min) at the end: {run['load']:.1f}",
        f"polls: {polls:,} ({run['polls'].get('since', 0):,} with a `since` cursor); each "
        "poller alternates between two of 50 standing queries, and about 10% of its polls "
        "go to a churner's current handle instead",
        "documented, expected codes: " + "; ".join(f"{c}: {why}" for c, why in
                                                   EXPECTED.items()),
        f"errors by code: {dict(errors) or 'none'}",
        f"target: 0 errors other than the documented ones: {unexpected} -> "
        f"{_verdict(unexpected == 0)}",
        f"target: cursor_expired < {EXPIRED_TARGET:.0%} of polls: {expired:,} "
        f"({share:.3%}) -> {_verdict(share < EXPIRED_TARGET)}",
        f"idempotent producer: {run['batches']:,} batches acknowledged, the server's "
        f"last_seq {run['last_seq']:,} -> "
        f"{_verdict(run['last_seq'] == run['batches'] - 1)}",
    ]
    common.report(f"soak_clients{suffix}", rows, [
        ("role", "role", "s"), ("clients", "clients", "d"), ("calls", "calls", ",d"),
        ("calls_per_s", "calls/s", ",.1f"), ("p50_ms", "p50 ms", ".2f"),
        ("p99_ms", "p99 ms", ".2f"), ("error_text", "errors by code", "s"),
    ], _plot_soak, notes=notes, params={**s, **run})


if __name__ == "__main__":
    main()
