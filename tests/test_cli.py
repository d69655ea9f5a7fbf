"""The `psoup` command line and the benchmark scripts, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import psoup
from psoup.cli.demo import run_demo
from psoup.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_demo_shows_every_window_kind():
    result = CliRunner().invoke(main, ["demo", "--rows", "2000"])
    assert result.exit_code == 0, result.output
    for kind in ("(sliding)", "(landmark)", "(snapshot)", "(CQL window)", "disconnects"):
        assert kind in result.output


def test_demo_answers_agree_across_modes():
    sizes = [run_demo(mode=m, rows=3000, echo=lambda _: None)
             for m in psoup.MODES]
    assert sizes[0] == sizes[1] == sizes[2]
    assert all(n > 0 for n in sizes[0].values())


def test_bad_option_is_a_usage_error():
    result = CliRunner().invoke(main, ["demo", "--mode", "fast"])
    assert result.exit_code == 2
    assert "fast" in result.output


def test_benchmarks_run_and_write_their_reports(tmp_path):
    reports = {"ingest.py": ["ingest"], "invoke.py": ["invoke"],
               "server.py": ["server_poll", "server_ingest"],
               "joins.py": ["joins_fig8", "joins_fig11", "joins_routing"]}
    for script, names in reports.items():
        done = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick"],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        for name in names:
            report = json.loads((ROOT / "bench" / "results" / f"{name}_quick.json").read_text())
            assert report["rows"]
            assert (ROOT / "bench" / "results" / f"{name}_quick.png").stat().st_size > 0
