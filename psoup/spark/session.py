"""The one SparkSession of a psoup process, started on first use.

Starting Spark takes tens of seconds on a small machine (a JVM loading Spark's jars: 28-35
s for `local[1]` on a loaded 2-core machine, docs/durability.md), so psoup starts it
lazily (only `psoup replay`, `psoup archive import` and `Engine.evaluate_history` need
it) and once: every later call gets the same session. Never on the per-tuple or
per-invocation path.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from psoup.errors import PSoupError
from psoup.spark.packenv import EXECUTOR_DISTRIBUTIONS

_lock = threading.Lock()
_session: Any = None

# The driver JVM logs errors only: a command's stderr is for psoup's own messages.
# Naming PythonGatewayServer's logger also keeps Spark from announcing its shell log
# level ("Setting default log level to WARN"), as it does for pyspark by default. A
# failed task is not logged at all (with local masters the executors run in the driver):
# the job's error reaches psoup, which reports it in one line naming the file.
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = off
"""

#: Lines the JVM writes to stderr that say nothing to a psoup user: Spark 4 runs with the
#: vector API incubator module, and the JVM announces it at start.
_JVM_NOISE = (b"WARNING: Using incubator modules: jdk.incubator.vector",)


#: The CPU niceness of the driver JVM (and so of local executors and their Python
#: workers): Spark's work is batch work beside a server's requests, which come first.
SPARK_NICENESS = 10


def _lower_priority(pid: int) -> None:
    """Give every thread of the JVM `pid` niceness SPARK_NICENESS. Linux keeps a nice
    value per thread and a new thread takes its creator's, so the threads Spark starts
    later (executor tasks, Python workers) run at it too. Best effort: nothing where
    /proc or the call is missing."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        threads = [str(pid)]
    for tid in threads:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            os.setpriority(os.PRIO_PROCESS, int(tid), SPARK_NICENESS)


def _forward(stream: IO[bytes]) -> None:
    """Copy the driver JVM's stderr to ours, without its known noise (a thread for the
    JVM's life: its stderr is a pipe that must be drained)."""
    out = getattr(sys.stderr, "buffer", None)
    for line in iter(stream.readline, b""):
        if line.rstrip().startswith(_JVM_NOISE):
            continue
        try:
            if out is not None:
                out.write(line)
                out.flush()
            else:
                sys.stderr.write(line.decode(errors="replace"))
        except (OSError, ValueError):    # our stderr closed: keep draining the pipe
            pass


#: The line of a Python traceback naming what was raised ("ValueError: ...").
_PYTHON_RAISED = re.compile(r"(?m)^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|"
                            r"Interrupt)(?:: [^\n]*)?$")
_NO_PSOUP = re.compile(r"ModuleNotFoundError: No module named '("
                       + "|".join(("psoup", *EXECUTOR_DISTRIBUTIONS, "llvmlite")) + r")[.']")

#: psoup's own settings; spark-defaults.conf, PSOUP_SPARK_CONF and `conf` override them.
_DEFAULTS = {
    "spark.master": "local[*]",
    "spark.app.name": "psoup",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    # the driver JVM's heap (Spark's default 1g). With a local master the executors
    # run in it, and a history job's shuffle and sort of every match with them: at one
    # match per tuple it grew 752 -> 1,198 MB from 1M to 4M archived tuples with 1g,
    # 707 -> 855 MB with 512m (the sort spills past it; that job 5.0 -> 6.1 s)
    "spark.driver.memory": "512m",
}
#: The environment variable of Spark settings: `key=value` pairs separated by spaces,
#: quoted as in a shell where a value holds spaces.
CONF_VARIABLE = "PSOUP_SPARK_CONF"


def parse_conf(pairs: Iterable[str], where: str) -> dict[str, str]:
    """`key=value` strings as a dict of Spark settings; `where` names their source in
    errors.

    Raises:
        PSoupError: a pair without '=' or a key that is not a Spark setting (spark.*).

    Example:
        >>> parse_conf(["spark.executor.memory=2g"], "--conf")
        {'spark.executor.memory': '2g'}
    """
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key.startswith("spark.") or not value:
            raise PSoupError(f"{where}: {pair!r} is not a Spark setting: write "
                             "spark.key=value, e.g. spark.executor.memory=2g")
        out[key] = value.strip()
    return out


def _checked(conf: Mapping[str, str] | None) -> dict[str, str]:
    """`conf` (a caller's settings) checked as `parse_conf` checks strings."""
    return parse_conf([f"{k}={v}" for k, v in (conf or {}).items()], "conf")


def spark_defaults() -> dict[str, str]:
    """The settings of spark-defaults.conf in $SPARK_CONF_DIR, or else in
    $SPARK_HOME/conf ({} when there is none): lines of a key and a value separated by
    whitespace (or '='), '#' comments, as spark-submit reads them."""
    folder = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME")
        else None)
    if folder is None:
        return {}
    try:
        text = Path(folder, "spark-defaults.conf").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = re.split(r"\s*=\s*|\s+", line, maxsplit=1)
        if len(parts) == 2 and parts[0].startswith("spark."):
            out[parts[0]] = parts[1].strip()
    return out


def spark_settings(master: str | None = None,
                   conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings the process's session starts with: psoup's defaults, then
    spark-defaults.conf, then $PSOUP_SPARK_CONF, then `conf`, then `master` (if given),
    each overriding the one before. psoup's log configuration is added to the driver's
    Java options whatever they are.

    Raises:
        PSoupError: PSOUP_SPARK_CONF or `conf` holds something that is not a setting.
    """
    settings = dict(_DEFAULTS)
    settings.update(spark_defaults())
    settings.update(parse_conf(shlex.split(os.environ.get(CONF_VARIABLE, "")),
                               CONF_VARIABLE))
    settings.update(_checked(conf))
    if master:
        settings["spark.master"] = master
    java = settings.get("spark.driver.extraJavaOptions", "")
    settings["spark.driver.extraJavaOptions"] = \
        f"{java} -Dlog4j2.configurationFile={_log_config()}".strip()
    return settings


def spark_session(master: str | None = None, conf: Mapping[str, str] | None = None,
                  progress: Callable[[str], None] | None = None) -> Any:
    """The process's SparkSession, started on first use with `spark_settings(master,
    conf)` (default master local[*]; UI off, Arrow on, UTC). When this call starts it,
    `progress` hears "starting Spark (MASTER)…" before and "Spark started in N s" after
    (the start takes tens of seconds).

    A process has one session. Once it runs, a `master` or a `conf` value other than
    the one it started with is refused, never silently ignored.

    Raises:
        PSoupError: pyspark is not installed, Spark cannot start (no Java, a bad master
            URL), a setting is malformed, or the session runs with other settings.
    """
    global _session
    with _lock:
        if _session is not None:
            _check_running(_session, master, conf)
            return _session
        try:
            from pyspark import SparkConf, SparkContext
            from pyspark.java_gateway import launch_gateway
            from pyspark.sql import SparkSession
        except ImportError as exc:
            raise PSoupError("Spark is needed here: pip install 'psoup[spark]' "
                             "(pyspark, with Java 17 or newer)") from exc
        settings = spark_settings(master, conf)
        began = time.perf_counter()
        if progress is not None:
            progress(f"starting Spark ({settings['spark.master']})…")
        try:
            spark_conf = SparkConf().setAll(list(settings.items()))
            with _executor_python(settings):
                if SparkContext._active_spark_context is None:
                    # the driver JVM's stderr through a filter (the gateway is what
                    # SparkContext would launch, with stderr piped)
                    gateway = launch_gateway(spark_conf,  # type: ignore[no-untyped-call]  # pyspark leaves it untyped
                                             popen_kwargs={"stderr": subprocess.PIPE})
                    _lower_priority(gateway.proc.pid)
                    threading.Thread(target=_forward, args=(gateway.proc.stderr,),
                                     name="psoup-spark-stderr", daemon=True).start()
                    SparkContext(conf=spark_conf, gateway=gateway)
            _session = SparkSession.builder.config(conf=spark_conf).getOrCreate()
        except Exception as exc:     # Java missing, bad master URL, ...
            raise PSoupError(f"Spark did not start ({settings['spark.master']}): "
                             f"{spark_error(exc)}") from exc
        _session.sparkContext.setLogLevel("ERROR")
        if not settings["spark.master"].startswith("local"):
            try:
                _ship_psoup(_session.sparkContext)
            except PSoupError:
                _session.stop()             # no session without psoup on its executors
                _session = None
                raise
        if progress is not None:
            progress(f"Spark started in {time.perf_counter() - began:.0f} s")
        return _session


@contextlib.contextmanager
def _executor_python(settings: Mapping[str, str]) -> Iterator[None]:
    """Within the block, PYSPARK_PYTHON (which pyspark reads once, when the context
    starts) names the executors' Python: spark.pyspark.python on a cluster (Spark's own
    precedence; a packed environment sets it, psoup.spark.packenv), restored after;
    else PYSPARK_PYTHON as set, else this interpreter (it has psoup and its
    dependencies), kept. Local executors are this process's Python workers, started in
    the driver's working directory where a packed environment's relative path names
    nothing: spark.pyspark.python is for clusters only."""
    executors = settings.get("spark.pyspark.python")
    if not executors or settings["spark.master"].startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        yield
        return
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = executors
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = before


def package_zip(folder: str | Path | None = None) -> Path:
    """psoup's own modules (its .py files, as installed) zipped, for executors whose
    Python lacks psoup: `SparkContext.addPyFile` puts the zip on their sys.path. The
    zip is rebuilt when the package changed (its name holds a digest of the sources).
    O(size of the package).
    """
    import hashlib
    import zipfile

    root = Path(__file__).resolve().parent.parent      # the psoup package
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.blake2b(digest_size=8)
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    out = Path(folder or tempfile.gettempdir()) / f"psoup-{os.getuid()}-{digest.hexdigest()}.zip"
    if not out.is_file():
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in files:
                archive.write(path, (Path("psoup") / path.relative_to(root)).as_posix())
        os.replace(tmp, out)
    return out


def _ship_psoup(context: Any) -> None:
    """Give a cluster's executors psoup's modules (`package_zip`). Its compiled
    dependencies (numpy, pyarrow, numba, ...) must be in their Python already, or in
    the packed environment they run (psoup.spark.packenv; docs/durability.md, "Spark on
    a cluster")."""
    try:
        context.addPyFile(str(package_zip()))
    except Exception as exc:          # the driver's temp directory unwritable, ...
        raise PSoupError(f"cannot ship psoup to Spark's executors: {spark_error(exc)}") \
            from exc


def _check_running(session: Any, master: str | None,
                   conf: Mapping[str, str] | None) -> None:
    """Refuse a master or settings the running session did not start with."""
    context = session.sparkContext
    if master and master != context.master:
        raise PSoupError(f"Spark already runs in this process with master {context.master}"
                         f"; master {master} would take effect only in a new process")
    running = context.getConf()
    for key, value in _checked(conf).items():
        if running.get(key) != value:
            raise PSoupError(f"Spark already runs in this process with {key}="
                             f"{running.get(key)}; {key}={value} would take effect only "
                             "in a new process")


def _log_config() -> Path:
    """The log4j2 configuration above, as a file the driver JVM can read (one per user,
    rewritten atomically when it differs)."""
    path = Path(tempfile.gettempdir()) / f"psoup-log4j2-{os.getuid()}.properties"
    if not path.is_file() or path.read_text() != _LOG4J2:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(_LOG4J2)
        os.replace(tmp, path)
    return path


def stop_session() -> None:
    """Stop the process's SparkSession, if one runs; the next `spark_session` starts a
    new one. For tests and for programs that are done with Spark."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None


def cancel_group(group: str) -> None:
    """Cancel the Spark jobs of `group` (running ones are interrupted); nothing when no
    session runs (Spark is never started to cancel). Does not wait for a session
    being started (the module lock): its jobs have not been submitted yet."""
    session = _session
    if session is not None:
        session.sparkContext.cancelJobGroup(group)


def group_progress(group: str) -> tuple[int, int] | None:
    """(tasks done, tasks) of the Spark jobs of `group` so far, from Spark's status
    tracker; None when no session runs (or one is starting) or Spark cannot say."""
    def stages(tracker: Any) -> Iterator[int]:
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            yield from (job.stageIds if job is not None else ())
    return _tasks(stages)


def running_tasks() -> tuple[int, int] | None:
    """(tasks done, tasks) of the Spark stages running now, from Spark's status tracker;
    None when no session runs (or one is starting) or Spark cannot say."""
    return _tasks(lambda tracker: tracker.getActiveStageIds())


def _tasks(stages: Callable[[Any], Iterable[int]]) -> tuple[int, int] | None:
    """(tasks done, tasks) of the stages `stages(tracker)` names; None when no session
    runs or it stops meanwhile."""
    session = _session
    if session is None:
        return None
    try:
        tracker = session.sparkContext.statusTracker()
        done = total = 0
        for stage_id in stages(tracker):
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                done += stage.numCompletedTasks
                total += stage.numTasks
        return done, total
    except Exception:               # the session stopping meanwhile: no progress to say
        return None


def spark_error(exc: BaseException) -> str:
    """The gist of a Spark failure in one line: py4j's "An error occurred while calling
    o37.json" wrapper and the Java exception class dropped. When Python code failed in
    an executor, its own exception (the line of the last Python traceback Spark
    forwards that names what was raised) is the gist, not the stage failure around it;
    an executor without psoup says so, with what to do.

    Example:
        >>> spark_error(RuntimeError("An error occurred while calling o37.json.\\n"
        ...     ": org.apache.spark.SparkException: [MALFORMED] Malformed records\\n\\tat x"))
        '[MALFORMED] Malformed records'
    """
    text = str(exc)
    if "Traceback (most recent call last)" in text:
        tail = text.rsplit("Traceback (most recent call last)", 1)[1]
        raised = [m.group(0).strip() for m in _PYTHON_RAISED.finditer(tail)]
        if raised:
            gist = f"in a Spark executor: {raised[0]}"
            if _NO_PSOUP.search(raised[0]):
                gist += (" (the executors' Python lacks psoup or one of its dependencies: "
                         "install them there, or ship a packed environment: psoup "
                         "spark pack-env, then --spark-env; see docs/durability.md, "
                         "Spark on a cluster)")
            return gist
    for line in text.splitlines():
        line = line.strip().lstrip(":").strip()
        if not line or line.startswith("An error occurred while calling"):
            continue
        head, sep, rest = line.partition(": ")
        if sep and " " not in head and "." in head:      # a Java class name
            return rest
        return line
    return type(exc).__name__
