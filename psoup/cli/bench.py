"""`psoup bench [SUITE...]`: run the benchmark scripts of the repository's bench/ folder.

Each suite is one script (bench/README.md describes them); the paper's figure and table
names are aliases of the script that reproduces them. Scripts run one after another in
their own Python process (so one suite's memory and threads do not disturb the next),
with the repository root as the working directory; each prints its tables and writes
bench/results/<name>.json and .png. A full (not --quick) run ends with bench/summary.py,
which writes the latest tables and plots into bench/README.md.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: suite -> (script, what it measures), in the order `all` runs them.
SUITES = {
    "ingest": ("ingest.py", "Fig. 9: arrival rate vs queries, P/C shared and unshared"),
    "register": ("register.py", "the query stream: registrations interleaved with data"),
    "invoke": ("invoke.py", "Fig. 7a/7b and Table 2: response time vs window, vs factors; polls"),
    "joins": ("joins.py", "Fig. 8, Fig. 11, join groups, adaptive routing"),
    "aggregates": ("aggregates.py", "Sect. 6: COUNT/SUM/MAX vs window, 2^10 .. 2^20"),
    "traffic": ("traffic.py", "Sect. 5.5: the traffic trace, Figs. 12 and 13"),
    "manyq": ("manyq.py", "10^4 and 10^5 standing queries vs per-query numpy"),
    "peers": ("peers.py", "Fig. 9's queries: psoup vs Spark Structured Streaming, Pathway"),
    "server": ("server.py", "the service: polling clients and ingest through the wire"),
    "soak": ("soak.py", "the service over time: beside a history job; 100 clients soaking"),
    "replay": ("replay.py", "Spark replay rate vs Spark's own read rate"),
    "history": ("history.py", "1,024 queries over 10^7 archived tuples: one pass vs per query"),
    "spark_live": ("spark_live.py", "streams fed by a Spark source: files landing in a "
                                    "folder, local[1] vs local[2], vs Spark's own filters"),
    "batch_reads": ("batch_reads.py", "invocations over a stream probed in Spark's "
                                      "executors: its batch store vs the in-memory engine"),
    "oscar": ("oscar.py", "reduced archive reads: COUNT(*) at 0-75% reduction vs the "
                          "strawman and DuckDB, interval coverage; hourly averages "
                          "from the aggregate copies vs tuples"),
    "scale": ("scale.py", "one machine at a user's sizes: registration at 1M-16M rows vs "
                          "DuckDB, stalls, restart, one core vs all cores"),
}

#: The paper's names for the experiments, and other aliases.
ALIASES = {"fig7": "invoke", "fig7a": "invoke", "fig7b": "invoke", "table2": "invoke",
           "fig8": "joins", "fig9": "ingest", "fig11": "joins", "fig12": "traffic",
           "fig13": "traffic", "sect5.5": "traffic", "sect6": "aggregates"}


class BenchError(Exception):
    """A suite that cannot run (unknown name, scripts not found)."""


def bench_dir() -> Path:
    """The repository's bench/ folder (present in a checkout, not in a wheel)."""
    here = Path(__file__).resolve().parents[2] / "bench"     # psoup/cli/bench.py
    if not (here / "common.py").is_file():
        raise BenchError(f"the benchmark scripts are not at {here}: they live in the "
                         "repository's bench/ folder; run `psoup bench` from a checkout "
                         "installed with `pip install -e .` (or `make bench`)")
    return here


def resolve(names: Sequence[str]) -> list[str]:
    """Suite names (aliases resolved, duplicates dropped, `all` expanded) in run order."""
    wanted = []
    for name in names or ["all"]:
        key = name.lower()
        if key == "all":
            wanted += list(SUITES)
            continue
        key = ALIASES.get(key, key)
        if key not in SUITES:
            known = ", ".join(["all", *SUITES, *ALIASES])
            raise BenchError(f"unknown benchmark suite {name!r} (choose from {known})")
        wanted.append(key)
    return [s for s in SUITES if s in wanted]


def run(suites: Sequence[str], quick: bool,
        echo: Callable[[str], None]) -> list[dict[str, Any]]:
    """Run each suite's script; returns one {suite, seconds, ok} per suite."""
    folder = bench_dir()
    done: list[dict[str, Any]] = []
    for suite in suites:
        script, what = SUITES[suite]
        path = folder / script
        if not path.is_file():
            echo(f"== {suite}: skipped ({script} is not in {folder})")
            done.append({"suite": suite, "seconds": 0.0, "ok": None})
            continue
        echo(f"== {suite}: {what}")
        began = time.perf_counter()
        code = subprocess.call([sys.executable, str(path)] + (["--quick"] if quick else []),
                               cwd=folder.parent)
        done.append({"suite": suite, "seconds": time.perf_counter() - began, "ok": code == 0})
    if not quick and (folder / "summary.py").is_file():      # the README's latest results
        subprocess.call([sys.executable, str(folder / "summary.py")], cwd=folder.parent)
    return done
