"""The one SparkSession of a psoup process, started on first use.

Spark starts in seconds, so psoup starts it lazily (only `psoup replay`, `psoup archive
import` and `Engine.evaluate_history` need it) and once: every later call gets the same
session. Never on the per-tuple or per-invocation path.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from psoup.errors import PSoupError

_lock = threading.Lock()
_session: Any = None


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
            from pyspark.sql import SparkSession
        except ImportError as exc:
            raise PSoupError("Spark is needed here: pip install 'psoup[spark]' "
                             "(pyspark, with Java 17 or newer)") from exc
        # the executors' Python must be this one (psoup and its dependencies); on a
        # cluster, PYSPARK_PYTHON names the workers' interpreter
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        try:
            _session = (SparkSession.builder.master(master or "local[*]").appName("psoup")
                        .config("spark.ui.enabled", "false")
                        .config("spark.ui.showConsoleProgress", "false")
                        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                        .config("spark.sql.session.timeZone", "UTC")
                        .getOrCreate())
        except Exception as exc:     # Java missing, bad master URL, ...
            raise PSoupError(f"Spark did not start ({master or 'local[*]'}): {exc}") from exc
        _session.sparkContext.setLogLevel("ERROR")
        return _session
