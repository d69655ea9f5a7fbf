"""`psoup demo`: the embedded engine on a synthetic traffic trace.

The trace is shaped like the CalTrans loop-detector data of the PSoup paper (Table 3):
readings of (lane 1-8, stationid 1-9, speed 0-100 mph) with most speeds near free flow and
slow or very fast readings rare. Time is simulated, one reading every 50 ms, so the demo
is the same on every run and takes a second or two. `write_samples` writes the same kind
of readings as CSV files, stamped up to the present, for the examples of the docs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from psoup.cli.output import iso_utc
from psoup.engine import Engine
from psoup.options import ModeName
from psoup.results.result import Changes, Result

START = 1_767_225_600.0      # 2026-01-01 00:00:00 UTC
STEP = 0.05                  # seconds between readings
DDL = "CREATE STREAM traffic (lane INT, stationid INT, speed FLOAT) RETAIN 1 HOUR"


def traffic(rng: np.random.Generator, n: int,
            t0: float) -> tuple[dict[str, NDArray[Any]], NDArray[np.float64]]:
    """n readings starting at t0: columns and timestamps."""
    speed = np.clip(rng.normal(62.0, 9.0, n), 0, 100)
    jam = rng.random(n) < 0.04                        # rare congestion readings
    speed[jam] = rng.uniform(3, 25, jam.sum())
    cols: dict[str, NDArray[Any]] = {"lane": rng.integers(1, 9, n),
                                     "stationid": rng.integers(1, 10, n),
                                     "speed": np.round(speed, 1)}
    ts = t0 + STEP * np.arange(n, dtype=np.float64)
    return cols, ts


def run_demo(mode: ModeName = "partial", rows: int = 20_000, seed: int = 7,
             echo: Callable[[str], None] = print,
             threads: int | None = None) -> dict[str, int]:
    """Run the demo and return each query's final answer size (for tests); `threads`
    is the engine's (None: the cores)."""
    rng = np.random.default_rng(seed)
    clock = {"now": START}
    eng = Engine(mode=mode, clock=lambda: clock["now"], threads=threads)
    eng.execute(DDL)
    echo(f"psoup demo  (mode: {mode}; one traffic reading every {STEP * 1000:.0f} ms, "
         "simulated time)\n")
    echo(DDL)

    snapshot_end = START + rows * STEP / 2
    specs = {
        "slow in lane 3, last 10 min (sliding)":
            "SELECT stationid, speed FROM traffic WHERE lane = 3 AND speed < 20 "
            "BEGIN NOW - 10 MINUTES END NOW",
        "stations with speeders since start (landmark)":
            f"SELECT DISTINCT stationid FROM traffic WHERE speed > 90 "
            f"BEGIN {START:.0f} END NOW",
        "station 4, lanes 1-2, first half (snapshot)":
            f"SELECT lane, speed FROM traffic WHERE stationid = 4 AND lane IN (1, 2) "
            f"AND speed BETWEEN 40 AND 50 BEGIN {START:.0f} END {snapshot_end:.0f}",
        "last 5 readings per lane below 30 mph (CQL window)":
            "SELECT lane, speed FROM traffic [PARTITION BY lane ROWS 5] WHERE speed < 30",
    }
    handles = {}
    echo("\nregistering standing queries:")
    for name, sql in specs.items():
        handles[name] = eng.register(sql)
        echo(f"  {handles[name][:10]}...  {sql}")

    def ingest(n: int) -> None:
        cols, ts = traffic(rng, n, clock["now"])
        began = time.perf_counter()
        for s in range(0, n, 5_000):
            eng.insert("traffic", {k: v[s:s + 5_000] for k, v in cols.items()}, ts=ts[s:s + 5_000])
        clock["now"] = float(ts[-1]) + STEP
        echo(f"  ingested {n:,} readings in {time.perf_counter() - began:.3f} s wall time; "
             f"simulated clock now {_hms(clock['now'])}")

    echo("\nphase 1: the client is connected")
    ingest(rows)
    cursors = show(eng, handles, echo, clock["now"])[1]
    echo("\nthe client disconnects; data keeps arriving ...")
    ingest(rows)
    echo("\nphase 2: the client comes back and invokes its handles")
    sizes = show(eng, handles, echo, clock["now"])[0]
    echo("\n  what changed while the client was away (invoke with since=cursor):")
    for name, handle in handles.items():
        changes = eng.invoke(handle, since=cursors[name])
        assert isinstance(changes, Changes), "invoke with since= answers with the Changes"
        echo(f"    {name}: +{len(changes.inserted)} rows entered, "
             f"-{len(changes.deleted)} rows left")
    stats = eng.stats()
    echo(f"\nstats: {stats['streams']['traffic']['rows']:,} readings retained, memory "
         f"{stats['memory']['total'] / 1e6:.1f} MB (data {stats['memory']['data'] / 1e6:.1f}, "
         f"results {stats['memory']['results'] / 1e6:.1f})")
    return sizes


def show(eng: Engine, handles: dict[str, str], echo: Callable[[str], None],
         now: float) -> tuple[dict[str, int], dict[str, str]]:
    """Invoke and print every handle; returns each answer's size and cursor."""
    sizes: dict[str, int] = {}
    cursors: dict[str, str] = {}
    for name, handle in handles.items():
        began = time.perf_counter()
        res = eng.invoke(handle)
        # without since=, invoke answers with the whole Result, which carries its cursor
        assert isinstance(res, Result) and res.cursor is not None
        ms = (time.perf_counter() - began) * 1000
        sizes[name], cursors[name] = len(res), res.cursor
        echo(f"\n  {name}: {len(res)} rows  (invoked at {_hms(now)} in {ms:.2f} ms)")
        header = ["ts"] + res.columns
        widths = [max(len(c), 9) for c in header]
        echo("    " + "  ".join(c.rjust(w) for c, w in zip(header, widths, strict=True)))
        for ts, row in list(zip(res.ts.tolist(), res.rows, strict=True))[-4:]:
            cells = [_hms(ts)] + [str(v) for v in row]
            echo("    " + "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
        if len(res) > 4:
            echo(f"    ... ({len(res) - 4} earlier rows)")
    return sizes, cursors


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


SAMPLE_ROWS = 12_000          # ten minutes of readings, one every STEP
OLD_DAYS = 2                  # days of old/*.csv, the archive import's input
OLD_ROWS = 1_000              # readings per old day


def write_samples(directory: Path, now: float | None = None, seed: int = 7) -> list[Path]:
    """The sample files the docs use: `readings.csv`, the ten minutes of readings that
    end at `now` (so `NOW - 10 MINUTES` windows have rows), and `old/DAY.csv`, a reading
    every minute and a half of each of the OLD_DAYS whole UTC days before now. Times are
    ISO 8601 UTC; returns the paths written."""
    now = time.time() if now is None else now
    rng = np.random.default_rng(seed)
    cols, ts = traffic(rng, SAMPLE_ROWS, now - SAMPLE_ROWS * STEP)
    written = [_write_csv(directory / "readings.csv", cols, ts)]
    today = now - now % 86_400
    for back in range(OLD_DAYS, 0, -1):
        day = today - back * 86_400
        cols, _ = traffic(rng, OLD_ROWS, day)
        stamps = day + (86_400 / OLD_ROWS) * np.arange(OLD_ROWS, dtype=np.float64)
        name = time.strftime("%Y-%m-%d", time.gmtime(day)) + ".csv"
        written.append(_write_csv(directory / "old" / name, cols, stamps))
    return written


def _write_csv(path: Path, cols: dict[str, NDArray[Any]],
               ts: NDArray[np.float64]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["ts,lane,stationid,speed"]
    lines += [f"{iso_utc(t)},{lane},{station},{speed}" for t, lane, station, speed in
              zip(ts.tolist(), cols["lane"].tolist(), cols["stationid"].tolist(),
                  cols["speed"].tolist(), strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path
