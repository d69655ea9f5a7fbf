"""The stall run of the scale suite (issue 37, "no client stalls another"): a polling
client's and a producer's latency, quiet and while other clients do the long things.

A durable server (its own process, a data directory in a temporary folder, sync="group",
what `psoup serve --data-dir` runs) holds the traffic stream of bench/server.py with
`retained` rows (full: 4 million) and a query whose answer is half of them (full: 2M
rows). Two paced clients are measured throughout:

- the poller invokes a small window (the last 1,000 readings of one lane) every 50 ms;
- the producer inserts a batch of 1,000 readings every 20 ms.

First a quiet window with only those two; then a contended window of the same clients
while, at once:

- a registrar registers queries over the retained rows (a selection and a GROUP BY
  aggregate in turn), unregistering each after it;
- a reader invokes the large query again and again (a 2M-row answer, full size);
- a checkpoint runs (Engine.checkpoint, in the server process, started by SIGUSR1 a third
  into the window; the server's automatic checkpoints run as they fall due, in both
  windows, and so do the archive's flushes of rows that left retention: the plot and
  the notes mark both, timed in the server).

Reported: p50, p99 and max of each measured client in each window, and the contended
p99 against the issue's target, max(5 x quiet p99, 100 ms) (ratio <= 1: met); the plot
shows every call's latency over time with the contended window, the checkpoints and the
archive flushes marked. The measured clients are threads of this process, the
contending ones threads of another (a 2M-row answer's decoding would otherwise hold the
measured clients' GIL); all share the machine's cores with the server.

With --replicas N the server runs N read replicas (`psoup serve --replicas N`: the
measured and the contending clients' connections go round its processes); its reports
are then named scale_stall_replicas*.

Usage: python bench/scale_stall.py [--quick | --smoke] [--replicas N]
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)
from server import TOKEN, _ServerProcess, readings  # noqa: E402

import psoup  # noqa: E402
from psoup.client import Client  # noqa: E402

BATCH, PRODUCE_EVERY, POLL_EVERY = 1_000, 0.02, 0.05
#: The issue's target: contended p99 <= max(TARGET_FACTOR x quiet p99, TARGET_FLOOR s).
TARGET_FACTOR, TARGET_FLOOR = 5.0, 0.1
SMALL = "SELECT stationid, speed FROM traffic WHERE lane = 3 BEGIN (NOW - 1000 ROWS) END NOW"
LARGE = "SELECT lane, stationid, speed FROM traffic WHERE lane <= 4"    # half the rows
REGISTERED = ("SELECT lane, COUNT(*), AVG(speed) FROM traffic GROUP BY lane",
              "SELECT stationid, speed FROM traffic WHERE lane = 5 AND speed > 70")
#: The environment variable naming the file where the server writes its events.
EVENTS_ENV = "PSOUP_BENCH_EVENTS"
#: The environment variable giving the server's read replicas (--replicas).
REPLICAS_ENV = "PSOUP_BENCH_REPLICAS"
#: `psoup serve --data-dir D --sync group`, plus: SIGUSR1 runs Engine.checkpoint() on a
#: thread of its own; every checkpoint (that one, "requested", and the automatic ones,
#: "checkpoint") and every archive flush of rows that left retention ("archive flush")
#: appends "kind start-epoch-seconds duration" to $EVENTS_ENV. The hooks wrap internal
#: methods (what the engine does is timed, not changed); one renamed since is not marked.
SERVE = f"""
import importlib, os, signal, sys, threading, time
import psoup.server.server as s
def _timed(kind, fn):
    def timed(*args, **kwargs):
        began, t0 = time.time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            with open(os.environ[{EVENTS_ENV!r}], "a") as f:
                f.write(f"{{kind.replace(' ', '_')}} {{began}} {{time.perf_counter() - t0}}\\n")
    return timed
for module, owner, name, kind in (("psoup.journal.durable", "Durability", "checkpoint",
                                   "checkpoint"),
                                  ("psoup.archive.parquet", "Archive", "_flush_stream",
                                   "archive flush")):
    try:
        cls = getattr(importlib.import_module(module), owner)
        setattr(cls, name, _timed(kind, getattr(cls, name)))
    except (ImportError, AttributeError):
        pass
engines = []
class _Recorded(s.Engine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        engines.append(self)
s.Engine = _Recorded
signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(
    target=_timed("requested", lambda: engines[0].checkpoint())).start())
s.run_server(sys.argv[1] or None, port=int(sys.argv[2]), token=sys.argv[3], sync="group",
             echo=lambda line: None,
             replicas=int(os.environ.get({REPLICAS_ENV!r}, "0")))
"""
#: How the plot marks the server's events, and what it calls them.
EVENT_COLORS = {"requested": "tab:purple", "checkpoint": "tab:red",
                "archive_flush": "tab:green"}
EVENT_NAMES = {"requested": "requested checkpoint",
               "checkpoint": "checkpoints (automatic and requested)",
               "archive_flush": "archive flushes"}


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":
        return {"retained": 20_000, "quiet": 1.5, "contended": 2.0, "warmup": 0.5}
    if level == "quick":
        return {"retained": 400_000, "quiet": 12.0, "contended": 20.0, "warmup": 2.0}
    return {"retained": 4_000_000, "quiet": 60.0, "contended": 90.0, "warmup": 5.0}


class _Timeline:
    """Calls timed on a common clock: (start since t0, seconds) per role."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.epoch = time.time()
        self.calls: dict[str, list[tuple[float, float]]] = {}
        self.errors: dict[str, int] = {}

    def timed(self, role: str, call: Callable[[], Any]) -> Any:
        began = time.perf_counter()
        try:
            value = call()
        except psoup.PSoupError:
            self.errors[role] = self.errors.get(role, 0) + 1
            return None
        self.calls.setdefault(role, []).append((began - self.t0,
                                                time.perf_counter() - began))
        return value

    def now(self) -> float:
        return time.perf_counter() - self.t0


def _looped(stop: threading.Event, step: Callable[[], object]) -> None:
    while not stop.is_set():
        step()


def _load(address: str, large: str, t0: float, go: Any, stop: Any, out: Any) -> None:
    """The contending clients, in a process of their own (so that decoding a 2M-row
    answer does not hold the measured clients' GIL): once `go` is set and until `stop`
    is, a reader invokes `large` again and again and a registrar registers and
    unregisters REGISTERED in turn. Puts ({role: [(start - t0, seconds)]}, {role:
    errors}) on `out`."""
    timeline = _Timeline()
    timeline.t0 = t0                # perf_counter is the machine's monotonic clock

    def read_large() -> None:
        with Client(address, token=TOKEN, timeout=600) as client:
            _looped(stop, lambda: timeline.timed("large reader", lambda: client.invoke(large)))

    def register() -> None:
        k = [0]

        def one(client: Client) -> None:
            handle = timeline.timed("registrar", lambda: client.register(
                REGISTERED[k[0] % len(REGISTERED)]))
            k[0] += 1
            if handle is not None:
                client.unregister(handle)
        with Client(address, token=TOKEN, timeout=600) as client:
            _looped(stop, lambda: one(client))

    threads = [threading.Thread(target=read_large), threading.Thread(target=register)]
    go.wait()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put((timeline.calls, timeline.errors))


def _run(server: _ServerProcess, s: dict[str, Any], small: str, large: str,
         timeline: _Timeline) -> tuple[float, float, float]:
    """The measured clients through warm-up, the quiet window and the contended one;
    returns (quiet start, contended start, contended end) on the timeline."""
    stop = threading.Event()
    feed = np.random.default_rng(7)

    def produce() -> None:
        with server.client() as client:
            common.paced(stop, PRODUCE_EVERY, lambda: timeline.timed(
                "producer", lambda: client.insert("traffic", readings(feed, BATCH))))

    def poll() -> None:
        with server.client() as client:
            common.paced(stop, POLL_EVERY, lambda: timeline.timed(
                "poller", lambda: client.invoke(small)))

    spawn = multiprocessing.get_context("spawn")
    go, stop_load, out = spawn.Event(), spawn.Event(), spawn.Queue()
    load = spawn.Process(target=_load, args=(server.address, large, timeline.t0, go,
                                             stop_load, out))
    load.start()                    # its imports before the windows, its work on `go`
    measured = [threading.Thread(target=produce), threading.Thread(target=poll)]
    for thread in measured:
        thread.start()
    time.sleep(s["warmup"])
    quiet = timeline.now()
    time.sleep(s["quiet"])
    contended = timeline.now()
    go.set()
    time.sleep(s["contended"] / 3)
    server.proc.send_signal(signal.SIGUSR1)         # a checkpoint, beside the rest
    time.sleep(s["contended"] * 2 / 3)
    end = timeline.now()
    stop.set()
    stop_load.set()
    calls, errors = out.get()
    load.join()
    for thread in measured:
        thread.join()
    timeline.calls.update(calls)
    timeline.errors.update(errors)
    return quiet, contended, end


def _window(calls: Sequence[tuple[float, float]], a: float, b: float) -> np.ndarray:
    return np.asarray([dt for t, dt in calls if a <= t < b], dtype=np.float64)


def _rows(timeline: _Timeline, quiet: float, contended: float,
          end: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for role in ("poller", "producer"):
        calls = timeline.calls.get(role, [])
        before = _window(calls, quiet, contended)
        during = _window(calls, contended, end)
        quiet_p99 = float(np.percentile(before, 99)) if len(before) else float("nan")
        target = max(TARGET_FACTOR * quiet_p99, TARGET_FLOOR)
        for phase, lat in (("quiet", before), ("contended", during)):
            row: dict[str, Any] = {"client": role, "window": phase, "calls": len(lat),
                                   "p50_ms": None, "p99_ms": None, "max_ms": None,
                                   "target_ms": None, "ratio": None, "verdict": None}
            if len(lat):
                row.update(p50_ms=1e3 * float(np.percentile(lat, 50)),
                           p99_ms=1e3 * float(np.percentile(lat, 99)),
                           max_ms=1e3 * float(lat.max()))
            if phase == "contended" and len(lat):
                row.update(target_ms=1e3 * target, ratio=row["p99_ms"] / (1e3 * target))
                row["verdict"] = "met" if row["ratio"] <= 1.0 else "NOT met"
            rows.append(row)
    return rows


def _events(path: Path, timeline: _Timeline) -> dict[str, list[tuple[float, float]]]:
    """The server's events (EVENTS_ENV): kind -> [(start on the timeline, seconds)]."""
    out: dict[str, list[tuple[float, float]]] = {}
    if path.is_file():
        for line in path.read_text().split("\n"):
            if line.strip():
                kind, began, seconds = line.split()
                out.setdefault(kind, []).append((float(began) - timeline.epoch,
                                                 float(seconds)))
    return out


def _plot(timeline: _Timeline, quiet: float, contended: float, end: float,
          events: dict[str, list[tuple[float, float]]],
          targets: dict[str, float]) -> Callable[[Any, Sequence[dict[str, Any]]], None]:
    def plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
        colors = {"poller": "tab:blue", "producer": "tab:orange"}
        paces = {"poller": "every 50 ms", "producer": "1,000 rows / 20 ms"}
        for role, color in colors.items():
            calls = [(t, dt) for t, dt in timeline.calls.get(role, []) if quiet <= t < end]
            if calls:
                t, dt = zip(*calls, strict=True)
                ax.plot(np.asarray(t) - quiet, 1e3 * np.asarray(dt), ".", ms=2, color=color,
                        label=f"{role} ({paces[role]})")
            if role in targets:
                ax.axhline(1e3 * targets[role], color=color, ls="--", lw=0.8,
                           label=f"{role} target {1e3 * targets[role]:.0f} ms")
        ax.axvspan(contended - quiet, end - quiet, color="tab:gray", alpha=0.08,
                   label="contended: registrations, large reads")
        for kind, color in EVENT_COLORS.items():
            for k, (began, seconds) in enumerate(events.get(kind, [])):
                if quiet <= began < end:
                    ax.axvspan(began - quiet, began - quiet + max(seconds, 0.02), color=color,
                               alpha=0.3, label=EVENT_NAMES[kind] if k == 0 else None)
        ax.set_yscale("log")
        ax.set_xlabel("seconds")
        ax.set_ylabel("latency per call, ms")
        ax.set_title("poller and producer latency, quiet then contended")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)
    return plot


def _event_notes(events: dict[str, list[tuple[float, float]]], quiet: float,
                 contended: float, end: float) -> list[str]:
    """One line per kind of server event: how many in each window, and how long."""
    notes = []
    for kind in ("checkpoint", "archive_flush"):
        spans = events.get(kind, [])
        counts = [sum(a <= t < b for t, _ in spans) for a, b in ((quiet, contended),
                                                                   (contended, end))]
        if sum(counts):
            took = np.asarray([dt for t, dt in spans if quiet <= t < end])
            notes.append(f"server {EVENT_NAMES[kind]}: {counts[0]} quiet, {counts[1]} "
                         f"contended; {1e3 * np.median(took):,.0f} ms median, "
                         f"{1e3 * took.max():,.0f} ms max")
    return notes


def main() -> None:
    replicas = 0
    if "--replicas" in sys.argv:             # common.size_flag knows no such flag
        at = sys.argv.index("--replicas")
        replicas = int(sys.argv[at + 1])
        del sys.argv[at:at + 2]
    os.environ[REPLICAS_ENV] = str(replicas)
    level, suffix = common.size_flag(__doc__)
    if replicas:
        suffix = "_replicas" + suffix
    s = {**_settings(level), "replicas": replicas}
    tmp = tempfile.mkdtemp(prefix="psoup-stall-")
    events_file = Path(tmp) / "events"
    os.environ[EVENTS_ENV] = str(events_file)
    retained = s["retained"]
    server = _ServerProcess(os.path.join(tmp, "state"), serve=SERVE)
    try:
        with server.client() as setup:
            setup.execute("CREATE STREAM traffic (lane INT, stationid INT, speed FLOAT) "
                          f"RETAIN {retained} ROWS")
            gen = common.rng(37)
            began = time.perf_counter()
            for first in range(0, retained, 100_000):
                setup.insert("traffic", readings(gen, min(100_000, retained - first)))
            prefill_s = time.perf_counter() - began
            small = setup.register(SMALL)
            large = setup.register(LARGE)
            large_rows = len(setup.invoke(large))
            setup.invoke(small)
        timeline = _Timeline()
        quiet, contended, end = _run(server, s, small, large, timeline)
    finally:
        server.stop()
    events = _events(events_file, timeline)
    rows = _rows(timeline, quiet, contended, end)
    targets = {r["client"]: r["target_ms"] / 1e3 for r in rows if r["target_ms"]}
    notes = [f"{retained:,} rows retained (prefilled in {prefill_s:.1f} s), the large answer "
             f"{large_rows:,} rows; windows: quiet {contended - quiet:.0f} s, contended "
             f"{end - contended:.0f} s; machine load (1 min) {os.getloadavg()[0]:.1f} at the end"]
    for role in ("large reader", "registrar"):
        lat = np.asarray([dt for _, dt in timeline.calls.get(role, [])])
        if len(lat):
            notes.append(f"{role}: {len(lat)} calls, p50 {1e3 * np.percentile(lat, 50):,.0f} ms, "
                         f"max {1e3 * lat.max():,.0f} ms")
    notes += [f"requested checkpoint (SIGUSR1): {seconds:.2f} s, at {began - contended:.1f} s "
              "into the contended window" for began, seconds in events.get("requested", [])]
    notes += _event_notes(events, quiet, contended, end)
    if timeline.errors:
        notes.append(f"errors: {timeline.errors}")
    notes.append(f"target: contended p99 <= max({TARGET_FACTOR:g} x quiet p99, "
                 f"{TARGET_FLOOR * 1e3:.0f} ms); ratio = contended p99 / target")
    common.report(f"scale_stall{suffix}", rows, [
        ("client", "client", "s"), ("window", "window", "s"), ("calls", "calls", ",d"),
        ("p50_ms", "p50 ms", ".1f"), ("p99_ms", "p99 ms", ".1f"), ("max_ms", "max ms", ".0f"),
        ("target_ms", "target ms", ".0f"), ("ratio", "p99/target", ".2f"),
        ("verdict", "target", "s"),
    ], _plot(timeline, quiet, contended, end, events, targets), notes=notes,
        params={**s, "large_rows": large_rows})


if __name__ == "__main__":
    main()
