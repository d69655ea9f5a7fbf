"""The packed environment of Spark executors (psoup.spark.packenv) in pieces that need
neither Spark nor a download: the pinned requirement list (closed under dependencies,
covering what the executor-side modules import), the archive's layout and its
all-or-nothing writing, pip's failures said in one line, and the Spark settings that
`--spark-env` adds. Building a real one and running a job through it is
tests/test_spark_cluster.py's (marker `cluster`)."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import psoup.server
from psoup.cli.main import main
from psoup.errors import PSoupError
from psoup.spark import packenv, session
from psoup.spark import reshape as reshaping

ROOT = Path(__file__).resolve().parent.parent

#: The modules whose code runs in Spark's executors (the functions the jobs hand to
#: mapInArrow and the helpers they call).
EXECUTOR_MODULES = ["psoup.spark.history", "psoup.spark.importer", "psoup.spark.replay",
                    "psoup.spark.reshape", "psoup.query", "psoup.stems.query_stem",
                    "psoup.results.aggregates", "psoup.archive.sampling"]


def _name(pin: str) -> str:
    return pin.partition("==")[0]


def test_the_requirements_pin_the_installed_versions_of_a_closed_set() -> None:
    pins = packenv.requirements()
    names = [_name(p) for p in pins]
    assert names == sorted(set(names))
    for pin in pins:
        name, _, version = pin.partition("==")
        assert metadata.version(name) == version
    assert set(packenv.EXECUTOR_DISTRIBUTIONS) <= set(names)
    assert "llvmlite" in names                  # numba's, found through its metadata
    assert not {"pytest", "hypothesis", "pyspark", "click", "psoup"} & set(names)
    for name in names:                          # every installed dependency is pinned too
        for requirement in metadata.distribution(name).requires or []:
            head, _, marker = requirement.partition(";")
            needed = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", head)
            assert needed is not None
            try:
                metadata.distribution(needed.group(1))
            except metadata.PackageNotFoundError:
                continue
            if "extra" not in marker:
                assert re.sub(r"[-_.]+", "-", needed.group(1)).lower() in names, requirement


def test_a_root_that_is_not_installed_is_refused() -> None:
    with pytest.raises(PSoupError, match="no-such-dist-xyz is not installed"):
        packenv.requirements(["no-such-dist-xyz"])


def test_the_executor_modules_import_only_pinned_distributions() -> None:
    """What the executor-side modules import, beyond the standard library, psoup and
    what a bare interpreter loads at start (site's .pth hooks), comes from pinned
    distributions: a new import elsewhere fails here before a cluster finds it."""
    script = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        f"for m in {EXECUTOR_MODULES!r}: __import__(m)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before})))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    imported = set(json.loads(done.stdout)) - set(sys.stdlib_module_names) - {"psoup"}
    owners = metadata.packages_distributions()
    pinned = {_name(p) for p in packenv.requirements()}
    # a module no distribution owns is made at run time (Cython's cython_runtime)
    foreign = {module: owners[module] for module in imported if module in owners
               and not any(re.sub(r"[-_.]+", "-", d).lower() in pinned
                           for d in owners[module])}
    assert not foreign
    assert {"numpy", "pyarrow", "numba", "sortedcontainers"} <= imported


def test_the_settings_name_the_archive_and_the_python_inside_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert packenv.settings("env.tar.gz") == {
        "spark.archives": f"{archive}#psoup_env",
        "spark.pyspark.python": "./psoup_env/bin/python"}
    with pytest.raises(PSoupError, match="no such file"):
        packenv.settings(tmp_path / "missing.tar.gz")
    (tmp_path / "env.txt").write_text("")
    with pytest.raises(PSoupError, match="not a packed environment"):
        packenv.settings(tmp_path / "env.txt")


def _fake_install(env_python: Path, pins: list[str], work: Path, pip_line: Any) -> None:
    """What pip would leave: a module in the environment's site-packages."""
    site = next((env_python.parent.parent / "lib").glob("python3*")) / "site-packages"
    (site / "fake_numpy.py").write_text("VERSION = 1\n")
    if pip_line is not None:
        pip_line(f"Successfully installed {' '.join(pins)}")


def test_the_archive_holds_the_environment_at_its_top(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packenv, "_install", _fake_install)
    said: list[str] = []
    lines: list[str] = []
    packed = packenv.build(tmp_path / "env.tar.gz", progress=said.append,
                           pip_line=lines.append)
    assert packed.path == tmp_path / "env.tar.gz" and packed.size == packed.path.stat().st_size
    assert packed.distributions == len(packenv.requirements())
    assert [m.split(" ")[0] for m in said] == ["making", "installing", "writing"]
    assert lines and lines[0].startswith("Successfully installed ")
    with tarfile.open(packed.path) as archive:
        members = {m.name: m for m in archive.getmembers()}
    assert {name.split("/")[0] for name in members} >= {"bin", "lib", "pyvenv.cfg"}
    assert members["bin/python"].issym()        # the interpreter it was made from
    assert any(name.endswith("/site-packages/fake_numpy.py") for name in members)
    assert [p.name for p in tmp_path.iterdir()] == ["env.tar.gz"]     # no temporary left
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(
        f"psoup-pack-env-*/{packenv.ENV_NAME}/fake_numpy.py"))


def test_a_failed_build_leaves_the_old_archive_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "env.tar.gz"
    out.write_bytes(b"the old archive")

    def broken(env_python: Path, pins: list[str], work: Path, pip_line: Any) -> None:
        _fake_install(env_python, pins, work, pip_line)
        monkeypatch.setattr(tarfile.TarFile, "add", _full_disk)
    monkeypatch.setattr(packenv, "_install", broken)
    with pytest.raises(OSError, match="No space left"):
        packenv.build(out)
    assert out.read_bytes() == b"the old archive"
    assert [p.name for p in tmp_path.iterdir()] == ["env.tar.gz"]
    with pytest.raises(PSoupError, match="is a .tar.gz"):
        packenv.build(tmp_path / "env.zip")


def _full_disk(*args: Any, **kwargs: Any) -> None:
    raise OSError(28, "No space left on device")


def test_a_python_of_another_version_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "python2"
    other.write_text("#!/bin/sh\necho 2 7\n")
    other.chmod(0o755)
    with pytest.raises(PSoupError, match=r"is Python 2\.7, and the driver's is 3\."):
        packenv.build(tmp_path / "env.tar.gz", python=str(other))
    with pytest.raises(PSoupError, match="no such Python"):
        packenv.build(tmp_path / "env.tar.gz", python=str(tmp_path / "nothing"))
    assert not list(tmp_path.glob("*.tar.gz"))


def test_pip_failures_are_one_line_that_says_whether_the_network_was_the_cause() -> None:
    offline = ["Collecting numpy==2.0", "WARNING: Retrying (Retry(total=4)) after "
               "connection broken by 'NewConnectionError(...: Failed to establish a new "
               "connection: [Errno -3] Temporary failure in name resolution')'",
               "ERROR: Could not find a version that satisfies the requirement numpy==2.0",
               "ERROR: No matching distribution found for numpy==2.0"]
    said = packenv.pip_failure(offline)
    assert said.startswith("pip could not download the packages (is the package index "
                           "reachable from here?")
    assert said.endswith("ERROR: No matching distribution found for numpy==2.0")
    assert packenv.pip_failure(["ERROR: No matching distribution found for numba==0.1"]) \
        == ("pip failed to install the executors' packages: ERROR: No matching "
            "distribution found for numba==0.1")
    assert packenv.pip_failure([]) == "pip failed to install the executors' packages: " \
        "no output"


def test_spark_env_adds_the_settings_to_a_jobs_and_to_a_servers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"")
    (tmp_path / "arc").mkdir()
    seen: dict[str, Any] = {}

    def reshape(root: Path, names: Any, master: Any, conf: dict[str, str],
                progress: Any) -> Any:
        seen["job"] = conf
        raise PSoupError("stop here")

    def run_server(**kwargs: Any) -> None:
        seen["server"] = kwargs["spark_conf"]
    monkeypatch.setattr(reshaping, "reshape", reshape)
    monkeypatch.setattr(psoup.server, "run_server", run_server)
    runner = CliRunner()
    done = runner.invoke(main, ["archive", "reshape", str(tmp_path / "arc"), "--conf",
                                "spark.cores.max=2", "--spark-env", str(archive)])
    assert done.exit_code == 1 and "stop here" in done.output
    want = {"spark.cores.max": "2", "spark.archives": f"{archive}#psoup_env",
            "spark.pyspark.python": "./psoup_env/bin/python"}
    assert seen["job"] == want
    done = runner.invoke(main, ["serve", "--spark-conf", "spark.cores.max=2",
                                "--spark-env", str(archive)])
    assert done.exit_code == 0, done.output
    assert seen["server"] == want
    done = runner.invoke(main, ["archive", "reshape", str(tmp_path / "arc"), "--conf",
                                "spark.archives=x.zip", "--spark-env", str(archive)])
    assert done.exit_code == 2
    assert "--spark-env sets spark.archives: leave it out of the Spark settings" \
        in done.output
    done = runner.invoke(main, ["serve", "--spark-env", str(tmp_path / "no.tar.gz")])
    assert done.exit_code == 2 and "no such file" in done.output


def test_spark_pyspark_python_names_a_clusters_executors_only_while_spark_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/workers/python")
    packed = {"spark.master": "spark://h:7077", "spark.pyspark.python": "./psoup_env/bin/python"}
    with session._executor_python(packed):
        assert os.environ["PYSPARK_PYTHON"] == "./psoup_env/bin/python"
    assert os.environ["PYSPARK_PYTHON"] == "/opt/workers/python"
    with session._executor_python({**packed, "spark.master": "local[2]"}):
        assert os.environ["PYSPARK_PYTHON"] == "/opt/workers/python"
    monkeypatch.delenv("PYSPARK_PYTHON")
    with session._executor_python(packed):
        assert os.environ["PYSPARK_PYTHON"] == "./psoup_env/bin/python"
    assert "PYSPARK_PYTHON" not in os.environ
    with session._executor_python({"spark.master": "local[2]"}):
        assert os.environ["PYSPARK_PYTHON"] == sys.executable
