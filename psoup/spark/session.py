"""The one SparkSession of a psoup process, started on first use.

Starting Spark takes tens of seconds on a small machine (a JVM loading Spark's jars: 28-35
s for `local[1]` on a loaded 2-core machine, docs/durability.md), so psoup starts it
lazily (only `psoup replay`, `psoup archive import` and `Engine.evaluate_history` need
it) and once: every later call gets the same session. Never on the per-tuple or
per-invocation path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

from psoup.errors import PSoupError

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
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), SPARK_NICENESS)
        except (OSError, AttributeError, ValueError):
            pass


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


def spark_session(master: str | None = None) -> Any:
    """The process's SparkSession (default master local[*]; UI off, Arrow on, UTC).

    Raises:
        PSoupError: pyspark is not installed, or Spark cannot start (no Java).
    """
    global _session
    with _lock:
        if _session is not None:
            return _session
        try:
            from pyspark import SparkConf, SparkContext
            from pyspark.java_gateway import launch_gateway
            from pyspark.sql import SparkSession
        except ImportError as exc:
            raise PSoupError("Spark is needed here: pip install 'psoup[spark]' "
                             "(pyspark, with Java 17 or newer)") from exc
        # the executors' Python must be this one (psoup and its dependencies); on a
        # cluster, PYSPARK_PYTHON names the workers' interpreter
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        try:
            conf = (SparkConf().setMaster(master or "local[*]").setAppName("psoup")
                    .set("spark.ui.enabled", "false")
                    .set("spark.ui.showConsoleProgress", "false")
                    .set("spark.sql.execution.arrow.pyspark.enabled", "true")
                    .set("spark.sql.session.timeZone", "UTC")
                    .set("spark.driver.extraJavaOptions",
                         f"-Dlog4j2.configurationFile={_log_config()}"))
            if SparkContext._active_spark_context is None:
                # the driver JVM's stderr through a filter (the gateway is what
                # SparkContext would launch, with stderr piped)
                gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
                _lower_priority(gateway.proc.pid)
                threading.Thread(target=_forward, args=(gateway.proc.stderr,),
                                 name="psoup-spark-stderr", daemon=True).start()
                SparkContext(conf=conf, gateway=gateway)
            _session = SparkSession.builder.config(conf=conf).getOrCreate()
        except Exception as exc:     # Java missing, bad master URL, ...
            raise PSoupError(f"Spark did not start ({master or 'local[*]'}): {exc}") from exc
        _session.sparkContext.setLogLevel("ERROR")
        return _session


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
    session = _session
    if session is None:
        return None
    try:
        tracker = session.sparkContext.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done, total
    except Exception:               # the session stopping meanwhile: no progress to say
        return None


def spark_error(exc: BaseException) -> str:
    """The gist of a Spark failure in one line: py4j's "An error occurred while calling
    o37.json" wrapper and the Java exception class dropped.

    Example:
        >>> spark_error(RuntimeError("An error occurred while calling o37.json.\\n"
        ...     ": org.apache.spark.SparkException: [MALFORMED] Malformed records\\n\\tat x"))
        '[MALFORMED] Malformed records'
    """
    for line in str(exc).splitlines():
        line = line.strip().lstrip(":").strip()
        if not line or line.startswith("An error occurred while calling"):
            continue
        head, sep, rest = line.partition(": ")
        if sep and " " not in head and "." in head:      # a Java class name
            return rest
        return line
    return type(exc).__name__
