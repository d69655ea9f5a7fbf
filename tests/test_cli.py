"""The `psoup` command line and the benchmark scripts, run as a user would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import psoup
from psoup.cli.demo import run_demo, write_samples
from psoup.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_demo_shows_every_window_kind() -> None:
    result = CliRunner().invoke(main, ["demo", "--rows", "2000"])
    assert result.exit_code == 0, result.output
    for kind in ("(sliding)", "(landmark)", "(snapshot)", "(CQL window)", "disconnects"):
        assert kind in result.output


def test_demo_answers_agree_across_modes() -> None:
    sizes = [run_demo(mode=m, rows=3000, echo=lambda _: None)
             for m in psoup.MODES]
    assert sizes[0] == sizes[1] == sizes[2]
    assert all(n > 0 for n in sizes[0].values())


def test_demo_writes_the_sample_files_up_to_now(tmp_path: Path) -> None:
    """readings.csv ends at the moment it is written, so the docs' NOW - 10 MINUTES
    windows have rows; old/ holds the two whole days before."""
    now = 1_795_314_932.5                     # 2026-11-22T02:35:32.500Z
    result = CliRunner().invoke(main, ["demo", "--write-samples", str(tmp_path)])
    assert result.exit_code == 0 and result.output.count("wrote ") == 3, result.output
    paths = write_samples(tmp_path, now=now)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == \
        ["readings.csv", "old/2026-11-20.csv", "old/2026-11-21.csv"]
    readings = paths[0].read_text().splitlines()
    assert readings[0] == "ts,lane,stationid,speed" and len(readings) == 12_001
    assert readings[1].startswith("2026-11-22T02:25:32.5")
    assert readings[-1].startswith("2026-11-22T02:35:32.4")
    old = paths[1].read_text().splitlines()
    assert old[1].startswith("2026-11-20T00:00:00.000Z,") and old[-1] < "2026-11-21"


def test_bad_option_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["demo", "--mode", "fast"])
    assert result.exit_code == 2
    assert "fast" in result.output


#: The reports (bench/results/<name>_smoke.json and .png) each suite that runs without
#: Spark writes; soak without Spark is its clients part (`--only clients`).
SMOKE_REPORTS = {"ingest": ["ingest"], "register": ["register"],
                 "invoke": ["invoke", "invoke_table2", "invoke_polls"],
                 "joins": ["joins_fig8", "joins_fig11", "joins_sharing", "joins_routing"],
                 "aggregates": ["aggregates"],
                 "traffic": ["traffic_response", "traffic_arrival"],
                 "manyq": ["manyq"], "server": ["server_poll", "server_ingest"],
                 "batch_reads": ["batch_reads"],
                 "scale": ["scale_register", "scale_stall", "scale_restart", "scale_cores",
                           "scale_cores_probe", "scale_cores_server"]}

#: Every script that picks its sizes through common.size_flag (the Spark suites included).
SIZED_SCRIPTS = ["ingest", "register", "invoke", "joins", "aggregates", "traffic", "manyq",
                 "server", "soak", "replay", "history", "oscar", "oscar_copies", "peers",
                 "scale_register", "scale_stall", "scale_restart", "scale_cores",
                 "spark_live", "batch_reads"]

#: A bound on a whole smoke run that only a hang reaches: the smoke sizes take seconds
#: per suite on a quiet 2-core machine, and a loaded one must not fail the test.
HANG_SECONDS = 1200


def _assert_smoke_reports(names: list[str], began: float) -> None:
    for name in names:
        path = ROOT / "bench" / "results" / f"{name}_smoke.json"
        assert path.stat().st_mtime >= began - 1, f"{name} was not rewritten"
        assert json.loads(path.read_text())["rows"], f"{name} has no rows"
        assert (ROOT / "bench" / "results" / f"{name}_smoke.png").stat().st_size > 0


def test_bench_command_runs_every_suite_without_spark_and_each_writes_its_reports() -> None:
    """`psoup bench --quick` with PSOUP_BENCH_SMOKE=1 runs the suites at smoke sizes: the
    wiring from the command to each script's reports, in seconds rather than minutes."""
    env = {**os.environ, "PSOUP_BENCH_SMOKE": "1"}
    began = time.time()
    done = subprocess.run([sys.executable, "-m", "psoup.cli.main", "bench", "--quick",
                           *SMOKE_REPORTS], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=HANG_SECONDS)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = done.stdout[done.stdout.rindex("suite"):]
    for suite, names in SMOKE_REPORTS.items():
        assert re.search(rf"^{suite}\s+\d+\s+ok$", summary, re.M), summary
        _assert_smoke_reports(names, began)
    clients = subprocess.run([sys.executable, "bench/soak.py", "--smoke", "--only", "clients"],
                             cwd=ROOT, capture_output=True, text=True, timeout=HANG_SECONDS)
    assert clients.returncode == 0, clients.stdout[-2000:] + clients.stderr[-2000:]
    _assert_smoke_reports(["soak_clients"], began)


def test_bench_command_runs_one_spark_suite_at_smoke_sizes() -> None:
    """replay, the lightest Spark suite (about 20 s, most of it Spark starting), stands
    for the wiring the Spark suites share; the others are checked without Spark below."""
    pytest.importorskip("pyspark")
    env = {**os.environ, "PSOUP_BENCH_SMOKE": "1"}
    began = time.time()
    done = subprocess.run([sys.executable, "-m", "psoup.cli.main", "bench", "--quick",
                           "replay"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=HANG_SECONDS)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"^replay\s+\d+\s+ok$", done.stdout, re.M), done.stdout[-2000:]
    _assert_smoke_reports(["replay"], began)


def test_every_bench_script_has_smoke_sizes_for_what_its_quick_run_sets() -> None:
    """The other Spark suites (history, soak's history part, oscar, peers) are not run
    here: each starts Spark. Their wiring is checked without it: the smoke level comes from
    --smoke or PSOUP_BENCH_SMOKE, names its reports *_smoke, and every script's smoke
    sizes set the same parameters as its quick ones, no larger."""
    code = f"""
import json, os, sys
sys.path.insert(0, "bench")
import importlib, common
levels = {{}}
for argv, smoke_env in ([], ""), (["--quick"], ""), (["--smoke"], ""), (["--quick"], "1"):
    sys.argv = ["x", *argv]
    os.environ[common.SMOKE_ENV] = smoke_env
    levels[" ".join(argv) + " " + smoke_env] = common.size_flag("doc")
sizes = {{}}
for name in {SIZED_SCRIPTS!r}:
    settings = importlib.import_module(name)._settings
    sizes[name] = [settings("quick"), settings("smoke")]
print(json.dumps({{"levels": levels, "sizes": sizes}}, default=str))
"""
    got = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout)
    assert got["levels"] == {" ": ["full", ""], "--quick ": ["quick", "_quick"],
                             "--smoke ": ["smoke", "_smoke"], "--quick 1": ["smoke", "_smoke"]}
    for name, (quick, smoke) in got["sizes"].items():
        assert smoke.keys() == quick.keys(), name
        for key, value in quick.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert smoke[key] <= value, (name, key)


def test_bench_command_rejects_an_unknown_suite_and_lists_the_known_ones() -> None:
    result = CliRunner().invoke(main, ["bench", "fig99"])
    assert result.exit_code == 2
    assert "unknown benchmark suite 'fig99'" in result.output and "table2" in result.output
    listed = CliRunner().invoke(main, ["bench", "--list"])
    assert listed.exit_code == 0
    assert re.search(r"^invoke\s+Fig. 7a/7b and Table 2.*table2", listed.output, re.M)


def test_the_command_line_loads_neither_engine_nor_spark_nor_arrow_to_start() -> None:
    """Every command starts by importing psoup.cli.main: the engine, the query compiler,
    pandas, pyarrow and Spark load only in the commands that use them (issue 16: every
    command used to take two seconds)."""
    code = ("import sys, psoup.cli.main; print(sorted(m for m in ('psoup.engine', "
            "'psoup.query', 'psoup.server.server', 'pandas', 'pyarrow', 'pyspark', 'numba') "
            "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"


def test_the_light_copies_of_engine_constants_agree_with_the_engine() -> None:
    from psoup.config import ENGINE_MODES, REPLAY_SLICE_ROWS
    from psoup.engine import MODES
    from psoup.spark.replay import SLICE_ROWS
    assert ENGINE_MODES == MODES and REPLAY_SLICE_ROWS == SLICE_ROWS
