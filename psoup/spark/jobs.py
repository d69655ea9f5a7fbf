"""History as a background job (issue 15): the state of one evaluation of standing queries
over the archive, run on its own thread while ingest, invocations and registrations go on.

`Engine.history` takes what the job needs under the engine's lock (the queries, the
archive's extent, the pending tiers of psoup.results.tiers), starts a `HistoryJob` and
returns its id at once; the job's thread runs the Spark pass (psoup.spark.history) off
the lock and installs the result under it. This module holds the job's state only: its
lifecycle (running -> done | failed | cancelled), progress, result, error and the
cancellation, each read and changed under the job's own lock, never the engine's.

`status` never calls into Spark: it is a read a server answers on its event loop under
the engine's lock, and a call to Spark's status tracker is a round trip per job and
stage to a JVM busy with the job (and at lower priority, psoup.spark.session), tens of
milliseconds that every request would wait behind. Spark's task counts come from a
thread of the job's own instead, which asks Spark every PROGRESS_EVERY seconds while the
job runs, once someone has asked for its status.

Nothing here imports Spark: progress and cancellation reach it through
psoup.spark.session, and only once a session runs.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

#: A job's states; every one but "running" is final.
STATES = ("running", "done", "failed", "cancelled")
#: Seconds between two reads of a running job's Spark task counts.
PROGRESS_EVERY = 0.5


class HistoryJob:
    """One history job: `id`, the `handles` it evaluates, the `streams` it reads.

    Example:
        >>> job = HistoryJob("j1", ["h"], ["R"])
        >>> job.note("evaluating 1 queries over the archive of R")
        >>> job.end("done", {"h": 3})
        >>> s = job.status()
        >>> s["state"], s["result"], s["progress"]["message"]
        ('done', {'h': 3}, 'evaluating 1 queries over the archive of R')
    """

    def __init__(self, job_id: str, handles: list[str], streams: list[str],
                 progress: Callable[[str], None] | None = None):
        self.id = job_id
        self.handles = handles
        self.streams = streams
        self.state = "running"
        self.result: dict[str, int] | None = None
        self.error: BaseException | None = None
        self._progress = progress
        self._message = ""
        self._started = time.time()
        self._ended: float | None = None
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._tasks: tuple[int, int] | None = None     # Spark tasks (done, all), if known
        self._watcher: threading.Thread | None = None
        self.thread: threading.Thread | None = None

    def note(self, message: str) -> None:
        """A progress message from the Spark pass (also passed on to the job's
        `progress` callback)."""
        with self._lock:
            self._message = message
        if self._progress is not None:
            self._progress(message)

    def cancelled(self) -> bool:
        """Whether cancellation was asked for."""
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Ask the job to stop: its Spark jobs are cancelled (job group = the job's id)
        and whatever it found is discarded. Nothing for a job that has ended."""
        with self._lock:
            if self.state != "running":
                return
            self._cancel.set()
        from psoup.spark.session import cancel_group
        cancel_group(self.id)

    def end(self, state: str, result: dict[str, int] | None = None,
            error: BaseException | None = None) -> None:
        """Record the job's final state (called once, by its thread or at once when it
        has nothing to evaluate)."""
        assert state in STATES and state != "running", state
        with self._lock:
            self.state, self.result, self.error = state, result, error
            self._ended = time.time()
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job has ended (True) or `timeout` seconds passed (False)."""
        return self._done.wait(timeout)

    def status(self) -> dict[str, Any]:
        """The job as plain values: id, state, handles and streams (counts), progress
        (the last message; Spark tasks done and in all while it runs, when known: as
        of at most PROGRESS_EVERY seconds ago), seconds, error (one line) and result
        (handle -> archived matches, when done). O(1): the first call while the job
        runs starts the thread that reads the task counts from Spark."""
        with self._lock:
            state, message, ended = self.state, self._message, self._ended
            result, error, tasks = self.result, self.error, self._tasks
            if state == "running" and self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, daemon=True,
                                                 name=f"psoup-history-progress-{self.id}")
                self._watcher.start()
        progress: dict[str, Any] = {"message": message}
        if state == "running" and tasks is not None:
            progress["tasks_done"], progress["tasks"] = tasks
        return {"id": self.id, "state": state, "handles": len(self.handles),
                "streams": len(self.streams), "progress": progress,
                "seconds": (ended or time.time()) - self._started,
                "error": None if error is None else str(error) or type(error).__name__,
                "result": result}

    def _watch(self) -> None:
        """The watcher thread: Spark's task counts for the job, every PROGRESS_EVERY
        seconds until it ends."""
        from psoup.spark.session import group_progress
        while True:
            tasks = group_progress(self.id)
            with self._lock:
                if tasks is not None:
                    self._tasks = tasks
            if self._done.wait(PROGRESS_EVERY):
                return
