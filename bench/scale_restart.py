"""Restart at disk speed: SIGKILL to the first answered request, against reading the
checkpoint's files (issue 37, part 3).

A child process builds a durable engine (PSoup-P, the paper's stream R of four INT
columns, N retained tuples, Q standing queries: Q - 2 selections of 1-4 interval factors,
a COUNT/AVG GROUP BY and an unwindowed COUNT), checkpoints it, inserts a few batches
more (the short log after the checkpoint) and is killed with SIGKILL. Then, each from
a cold page cache when this runs as root (`echo 3 > /proc/sys/vm/drop_caches`, after
which a throwaway process loads Python, numpy, numba and psoup again, so that only the
engine's own files are cold; without root the cache is warm, and the report says so):

* restart: a new process from its start to the first answered invoke (Python and
  psoup imported, Engine(path) reading the checkpoint back and replaying the log after
  it, then the invoke), with the checkpoint's part of it: its files mapped (their pages
  read when first touched, a thread having the kernel read them ahead), its queries
  registered, the aggregates rebuilt; and when the read-ahead of every file had ended
  (files cached: from then on no page of the state waits for the disk);
* read files: reading every file the checkpoint's manifest names, sequentially, into
  memory (the floor a restart is compared with: target <= 2x);
* log only: the same engine restarted from its log alone, as before checkpoints held
  the state in files (a copy of the data directory taken before the checkpoint).

The answers after the restart are checked against those before the kill.

Usage: python bench/scale_restart.py [--quick | --smoke]
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)

TARGET = 2.0            # restart <= 2x reading the files, at 5M x 10k


def _settings(level: common.Level) -> dict[str, Any]:
    if level == "smoke":        # warm: a smoke run leaves the machine's page cache alone
        return {"rows": 20_000, "queries": 50, "batch": 4096, "after": 2, "log_only": 1,
                "cold": False}
    if level == "quick":
        return {"rows": 500_000, "queries": 1_000, "batch": 65_536, "after": 4, "log_only": 1,
                "cold": True}
    return {"rows": 5_000_000, "queries": 10_000, "batch": 65_536, "after": 8, "log_only": 1,
            "cold": True}


#: The child that builds the engine: it says "logged" once everything is inserted (the
#: parent copies the directory), checkpoints when told, inserts `after` batches more,
#: prints the answers and "ready", and waits to be killed.
BUILD = """
import json, sys, time
sys.path.insert(0, "bench")
import common, psoup
path, rows, queries, batch, after = sys.argv[1], *map(int, sys.argv[2:6])
eng = psoup.Engine(path=path, sync="off", checkpoint_bytes=1 << 62, checkpoint_seconds=None)
eng.execute(common.CREATE_R)
gen = common.rng(37)
sqls = common.selection_queries(gen, queries - 2, "interval")
sqls += ["SELECT a, COUNT(*), AVG(b) FROM R GROUP BY a", "SELECT COUNT(*) FROM R"]
handles = [eng.register(sql) for sql in sqls]
done = 0
while done < rows:
    n = min(batch, rows - done)
    eng.insert("R", common.data_columns(gen, n), ts=float(done))
    done += n
print("logged", flush=True)
sys.stdin.readline()
began = time.perf_counter()
eng.checkpoint()
took = time.perf_counter() - began
for i in range(after):
    eng.insert("R", common.data_columns(gen, 1000), ts=float(rows + i))
picked = [handles[0], handles[len(handles) // 2], handles[-2], handles[-1]]
answers = [len(eng.invoke(h, now=1e12)) for h in picked]
print(json.dumps({"checkpoint_s": took, "handles": picked, "answers": answers,
                  "rss_mb": int(open("/proc/self/statm").read().split()[1]) * 4096 / 1e6}),
      flush=True)
print("ready", flush=True)
time.sleep(3600)
"""

#: The restarted process: reports when it began, when the engine was open and when the
#: first invoke was answered, with the answers to compare.
RESTART = """
import json, sys, time
began = time.time()
sys.path.insert(0, "bench")
from psoup.engine import Engine
path, handles = sys.argv[1], json.loads(sys.argv[2])
opened0 = time.time()
eng = Engine(path=path, sync="off", checkpoint_bytes=1 << 62, checkpoint_seconds=None)
opened = time.time()
first = len(eng.invoke(handles[0], now=1e12))
answered = time.time()
answers = [first] + [len(eng.invoke(h, now=1e12)) for h in handles[1:]]
r = eng._durability.restored
if r is not None and r.readahead is not None:
    r.readahead.join()
cached = time.time()
print(json.dumps({"began": began, "imported": opened0, "opened": opened, "answered": answered,
                  "answers": answers, "cached": cached,
                  "restore": None if r is None else {"read": r.read, "queries": r.queries,
                                                     "rebuilt": r.rebuilt, "bytes": r.bytes,
                                                     "total": r.total}}))
eng.close()
"""

WARM = "import sys; sys.path.insert(0, 'bench'); import psoup, psoup.kernels, numpy, numba"


def _cold(env: dict[str, str], wanted: bool) -> bool:
    """Drop the page cache (when `wanted`, as root), then load the code again; whether
    it dropped."""
    dropped = False
    if wanted:
        try:
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            dropped = True
        except OSError:
            pass
    if dropped:
        subprocess.run([sys.executable, "-c", WARM], cwd=common.ROOT, env=env, check=True)
    return dropped


def _restart(path: Path, handles: list[str], env: dict[str, str]) -> dict[str, Any]:
    began = time.time()
    done = subprocess.run([sys.executable, "-c", RESTART, str(path), json.dumps(handles)],
                          cwd=common.ROOT, env=env, check=True, capture_output=True, text=True)
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    got["spawned"] = began
    return got


def _read_files(path: Path) -> tuple[float, int]:
    """Seconds to read every file the newest manifest names (and it), and their bytes."""
    from psoup.journal import checkpoint
    folder = path / "checkpoint"
    manifest = checkpoint.newest(folder)
    assert manifest is not None, "the child wrote a checkpoint"
    names = [*checkpoint.files_of(manifest), f"manifest-{manifest['number']:08d}.mp"]
    buffer = bytearray(64 << 20)
    view, total = memoryview(buffer), 0
    began = time.perf_counter()
    for name in names:
        with open(folder / name, "rb", buffering=0) as f:
            while got := f.readinto(view):
                total += got
    for wal in (path / "wal").iterdir():
        total += len(wal.read_bytes())
    return time.perf_counter() - began, total


def bench(s: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    env = dict(os.environ, PYTHONPATH=str(common.ROOT))
    work = Path(tempfile.mkdtemp(prefix="psoup-restart-"))
    try:
        data, old = work / "data", work / "log-only"
        child = subprocess.Popen(
            [sys.executable, "-c", BUILD, str(data), str(s["rows"]), str(s["queries"]),
             str(s["batch"]), str(s["after"])], cwd=common.ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdin is not None and child.stdout is not None
        built = time.perf_counter()
        assert child.stdout.readline().strip() == "logged"
        built = time.perf_counter() - built
        if s["log_only"]:
            shutil.copytree(data, old, ignore=shutil.ignore_patterns("lock"))
        child.stdin.write("go\n")
        child.stdin.flush()
        before = json.loads(child.stdout.readline())
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        cold = _cold(env, s["cold"])
        restarted = _restart(data, before["handles"], env)
        assert restarted["answers"] == before["answers"], (restarted, before)
        _cold(env, s["cold"])
        read_s, read_bytes = _read_files(data)
        rows = [_row("checkpoint", s, restarted, read_s, read_bytes, before)]
        if s["log_only"]:
            _cold(env, s["cold"])
            logged = _restart(old, before["handles"], env)
            rows.append(_row("log only", s, logged, None, None, before))
        warm = "warm (not root)" if s["cold"] else "warm (smoke)"
        notes = [f"page cache {'dropped (root)' if cold else warm} before "
                 "each restart and before reading the files",
                 f"built in {built:.1f} s; checkpoint written in {before['checkpoint_s']:.2f} s "
                 f"(the writer went on meanwhile); the engine held {before['rss_mb']:,.0f} MB",
                 "answers after the restart equal those before the SIGKILL"]
        ratio = rows[0]["restart/read"]
        full = s["rows"] == 5_000_000 and s["queries"] == 10_000
        verdict = ("not measured at this size" if not full
                   else "met" if ratio <= TARGET else "NOT met")
        notes.append(f"restart / reading the files = {ratio:.2f}x (target <= {TARGET:.0f}x at "
                     f"5M x 10k: {verdict})")
        return rows, notes
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _row(kind: str, s: dict[str, Any], got: dict[str, Any], read_s: float | None,
         read_bytes: int | None, before: dict[str, Any]) -> dict[str, Any]:
    restart = got["answered"] - got["spawned"]
    r = got["restore"] or {}
    return {"from": kind, "rows": s["rows"], "queries": s["queries"],
            "restart s": restart, "import s": got["imported"] - got["spawned"],
            "open s": got["opened"] - got["imported"],
            "first invoke s": got["answered"] - got["opened"],
            "cached s": got["cached"] - got["spawned"] if got["restore"] else None,
            "restore s": r.get("total"), "files read s": r.get("read"),
            "queries s": r.get("queries"),
            "rebuilt s": r.get("rebuilt"),
            "MB": None if read_bytes is None else read_bytes / 1e6,
            "read files s": read_s,
            "restart/read": None if read_s is None else restart / read_s}


def _plot(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    parts = ["import s", "open s", "first invoke s"]
    bottom = [0.0] * len(rows)
    for part in parts:
        values = [row[part] for row in rows]
        ax.bar([row["from"] for row in rows], values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    read = rows[0]["read files s"]
    if read:
        ax.axhline(read, color="k", linestyle="--", label="reading the files")
        ax.axhline(TARGET * read, color="r", linestyle=":", label=f"{TARGET:.0f}x reading")
    ax.set_ylabel("seconds from process start to first answer")
    ax.set_title(f"restart after SIGKILL: {rows[0]['rows']:,} tuples x "
                 f"{rows[0]['queries']:,} queries")
    ax.legend()


def main() -> None:
    level, suffix = common.size_flag(__doc__)
    s = _settings(level)
    rows, notes = bench(s)
    common.report(f"scale_restart{suffix}", rows, [
        ("from", "restart from", "s"), ("rows", "tuples", ",d"), ("queries", "queries", ",d"),
        ("restart s", "SIGKILL->answer s", ".2f"), ("import s", "import s", ".2f"),
        ("open s", "Engine() s", ".2f"), ("first invoke s", "1st invoke s", ".3f"),
        ("cached s", "files cached s", ".2f"),
        ("restore s", "checkpoint s", ".2f"), ("files read s", "its files", ".2f"),
        ("queries s", "its queries", ".2f"),
        ("rebuilt s", "rebuilt", ".2f"), ("MB", "files MB", ",.0f"),
        ("read files s", "reading files s", ".2f"), ("restart/read", "restart/read", ".2f"),
    ], _plot, notes=notes, params=s)


if __name__ == "__main__":
    main()
