"""The process's Spark session: where its settings come from, a running session that
refuses other settings instead of ignoring them, and Spark's failures said in one line
(the executor's own Python exception when that is what failed)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from psoup.cli.main import main
from psoup.errors import PSoupError
from psoup.spark import session
from psoup.spark.session import package_zip, parse_conf, spark_error, spark_session, spark_settings
from tests.support import python_without_psoup

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_settings_come_from_defaults_then_files_then_environment_then_arguments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "spark-defaults.conf").write_text(
        "# a comment\n"
        "spark.executor.memory   4g\n"
        "spark.sql.session.timeZone=Europe/Paris\n"
        "spark.driver.extraJavaOptions -Dfrom.file=1\n"
        "not.spark 1\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.setenv("PSOUP_SPARK_CONF", "spark.executor.memory=6g "
                                           "'spark.executor.extraJavaOptions=-Da=1 -Db=2'")
    got = spark_settings(None, {"spark.executor.cores": "3"})
    assert got["spark.master"] == "local[*]" and got["spark.ui.enabled"] == "false"
    assert got["spark.sql.session.timeZone"] == "Europe/Paris"     # the file over psoup's
    assert got["spark.executor.memory"] == "6g"                      # the environment over it
    assert got["spark.executor.extraJavaOptions"] == "-Da=1 -Db=2"
    assert got["spark.executor.cores"] == "3"
    assert "not.spark" not in got
    java = got["spark.driver.extraJavaOptions"]
    assert java.startswith("-Dfrom.file=1 -Dlog4j2.configurationFile=")   # both kept
    assert spark_settings("spark://h:7077", {"spark.master": "local[1]"})["spark.master"] \
        == "spark://h:7077"
    assert spark_settings(None, {"spark.master": "local[1]"})["spark.master"] == "local[1]"


@pytest.mark.parametrize("pair", ["executor.memory=2g", "spark.executor.memory", "=2g",
                                  "spark.executor.memory="])
def test_a_malformed_setting_is_refused_by_name(pair: str) -> None:
    with pytest.raises(PSoupError, match=f"--conf: {pair!r} is not a Spark setting"):
        parse_conf([pair], "--conf")


def test_a_malformed_environment_setting_names_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSOUP_SPARK_CONF", "spark.ok=1 oops")
    with pytest.raises(PSoupError, match="PSOUP_SPARK_CONF: 'oops' is not a Spark setting"):
        spark_settings()


def test_a_running_session_refuses_another_master_or_setting(spark: SparkSession) -> None:
    assert spark_session() is spark and spark_session("local[2]") is spark
    assert spark_session(conf={"spark.sql.session.timeZone": "UTC"}) is spark
    with pytest.raises(PSoupError, match=r"already runs in this process with master "
                                         r"local\[2\]; master local\[1\] would take effect "
                                         "only in a new process"):
        spark_session("local[1]")
    with pytest.raises(PSoupError, match="with spark.executor.memory=None; "
                                         "spark.executor.memory=3g would take effect"):
        spark_session(conf={"spark.executor.memory": "3g"})


_EXECUTOR_FAILURE = """An error occurred while calling o91.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 \
failed 4 times, most recent failure: Lost task 0.3 in stage 3.0 (TID 9) (10.0.0.2 executor \
1): org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/opt/spark/python/lib/pyspark.zip/pyspark/worker.py", line 1900, in main
    func, profiler, deserializer, serializer = read_udfs(pickleSer, infile, eval_type)
  File "/opt/spark/python/lib/pyspark.zip/pyspark/serializers.py", line 471, in loads
    return cloudpickle.loads(obj, encoding=encoding)
{raised}

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(\
PythonRunner.scala:603)
Caused by: org.apache.spark.SparkException: more Java
"""


def test_an_executors_python_exception_is_the_gist_of_the_error() -> None:
    missing = RuntimeError(_EXECUTOR_FAILURE.format(
        raised="ModuleNotFoundError: No module named 'psoup'"))
    said = spark_error(missing)
    assert said.startswith("in a Spark executor: ModuleNotFoundError: No module named "
                           "'psoup' (the executors' Python lacks psoup")
    assert "psoup spark pack-env, then --spark-env" in said
    other = RuntimeError(_EXECUTOR_FAILURE.format(raised="ValueError: bad value 3"))
    assert spark_error(other) == "in a Spark executor: ValueError: bad value 3"


@pytest.mark.parametrize("args", [
    ["archive", "import", "x.csv", "--stream", "R", "--columns", "a INT", "--into", "arc",
     "--conf", "memory=2g"],
    ["replay", ".", "--conf", "memory=2g"],
    ["serve", "--spark-conf", "memory=2g"],
])
def test_the_cli_refuses_a_malformed_setting_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.csv").write_text("ts,a\n1,2\n")
    monkeypatch.setattr(session, "spark_session", lambda *a, **k: pytest.fail("started"))
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 2
    assert "'memory=2g' is not a Spark setting: write spark.key=value" in done.stderr


def test_the_shipped_zip_runs_psoup_in_a_python_without_it(tmp_path: Path) -> None:
    python = python_without_psoup(tmp_path / "env")
    zipped = package_zip(tmp_path)
    assert package_zip(tmp_path) == zipped                   # the same sources: reused
    run = subprocess.run([str(python), "-c", f"""
import sys; sys.path.insert(0, {str(zipped)!r})
import psoup
assert psoup.__file__.startswith({str(zipped)!r}), psoup.__file__
eng = psoup.Engine()
eng.execute("CREATE STREAM R (a INT, x FLOAT)")
h = eng.register("SELECT a FROM R WHERE x < 2.0")
eng.insert("R", [(1, 1.5), (2, 2.5), (3, 0.5)], ts=[1.0, 2.0, 3.0])
print(eng.invoke(h).rows)
"""], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[(1,), (3,)]"
