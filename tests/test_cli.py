"""The `psoup` command line and the benchmark scripts, run as a user would."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

import psoup
from psoup.cli.demo import run_demo
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


def test_bad_option_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["demo", "--mode", "fast"])
    assert result.exit_code == 2
    assert "fast" in result.output


def test_bench_command_runs_every_suite_and_each_writes_its_reports() -> None:
    reports = {"ingest": ["ingest"], "register": ["register"],
               "invoke": ["invoke", "invoke_table2", "invoke_polls"],
               "joins": ["joins_fig8", "joins_fig11", "joins_sharing", "joins_routing"],
               "aggregates": ["aggregates"], "traffic": ["traffic_response", "traffic_arrival"],
               "manyq": ["manyq"], "server": ["server_poll", "server_ingest"],
               "soak": ["soak_history", "soak_clients"],
               "replay": ["replay"], "history": ["history"]}
    began = time.time()
    done = subprocess.run([sys.executable, "-m", "psoup.cli.main", "bench", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = done.stdout[done.stdout.rindex("suite"):]
    for suite, names in reports.items():
        assert re.search(rf"^{suite}\s+\d+\s+ok$", summary, re.M), summary
        for name in names:
            path = ROOT / "bench" / "results" / f"{name}_quick.json"
            assert path.stat().st_mtime >= began - 1, f"{name} was not rewritten"
            assert json.loads(path.read_text())["rows"]
            assert (ROOT / "bench" / "results" / f"{name}_quick.png").stat().st_size > 0


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
