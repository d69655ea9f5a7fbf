"""History as a background job (issue 15): the state of one evaluation of standing queries
over the archive, run on its own thread while ingest, invocations and registrations go on.

`Engine.history` takes what the job needs under the engine's lock (the queries, the
archive's extent, the pending tiers of psoup.archive.tiers), starts a `HistoryJob` and
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

import contextlib
import logging
import math
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psoup.archive.policy import (
    DEFAULT_ROWS_PER_SECOND,
    WHOLE,
    ArchiveRead,
    Policy,
    Schedule,
    ask,
    capped,
)
from psoup.archive.rates import sample_rate
from psoup.archive.tiers import INCOMING, Segment
from psoup.errors import HistoryPending, PSoupError, QueryError
from psoup.locks import FairLock
from psoup.plans import JoinPlan, SelectionPlan

if TYPE_CHECKING:
    from psoup.core import Core
    from psoup.journal.journal import Journal
    from psoup.spark.history import Job

log = logging.getLogger("psoup.engine")

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


class HistoryJobs:
    """The engine's history jobs (docs/durability.md, "History"): the service behind
    `Engine.history` and its status, cancel and wait calls, and the re-evaluation of
    histories a restart could not bring back.

    It plans a job under the engine's lock (`plan_jobs`: one Spark job per stream, the
    archive policy's sample rates), runs the Spark pass on a thread of the job's own off
    the lock, and installs what it found under the lock, all or nothing. It remembers the
    8 latest jobs. Costs: `start` O(queries + archive part files' footers) under the
    lock; a job's install O(segments found); `check_pending` O(1).

    Args:
        lock: the engine's lock (held by `start`, taken by a job's thread to install).
        core: the engine's state (psoup.core.Core).
        journal: the engine's log and archive (None: an engine in memory, which has no
            archive and so no history).
        policy: how much of the archive a job reads (psoup.archive.policy).
        clock: the engine's clock.
        master, conf: the Spark master and settings of the passes.
        check_open: raises if the engine is closed or stopped.
        is_closed: whether the engine was closed (a job then installs nothing).
    """

    def __init__(self, lock: FairLock, core: Core, journal: Journal | None, policy: Policy,
                 clock: Callable[[], float], master: str | None, conf: Mapping[str, str],
                 check_open: Callable[[], None], is_closed: Callable[[], bool]):
        self._lock, self._core, self._journal = lock, core, journal
        self.policy, self._clock = policy, clock
        self.master, self.conf = master, dict(conf)
        self._check_open, self._is_closed = check_open, is_closed
        self.archive_rate = DEFAULT_ROWS_PER_SECOND    # measured by each history pass
        self._reductions: dict[str, Schedule] = {}     # of the latest job, by stream
        self._read_rows: dict[str, int] = {}           # the archived rows it covers
        self._jobs: dict[str, HistoryJob] = {}         # the latest jobs, by id
        self.due: set[str] = set()                     # logged as evaluated (recovery)
        self._pending: dict[str, str] = {}             # handle -> job evaluating it again

    # ------------------------------------------------------------------ the API's calls

    def start(self, handles: Sequence[str] | None,
              progress: Callable[[str], None] | None) -> str:
        """Under the engine's lock: plan and start a job; its id (Engine.history).

        The job runs one Spark pass per stream for all its queries, with psoup's Query
        SteM inside the executors (psoup.spark.history), on a thread of its own; ingest,
        invocations and registrations go on meanwhile. When the pass ends, each query
        gets its archive tier at once, holding its matches among every tuple that left
        memory, those that left while the job ran included; from then on the tier grows
        as tuples leave retention, so answers join archive and memory exactly. A query
        unregistered meanwhile gets nothing; a failed or cancelled job changes nothing.

        Raises:
            PSoupError: no archive, or a job runs.
            QueryError, UnknownHandle: a handle is a join, or not registered.
        """
        journal = self._journal
        if journal is None:
            raise PSoupError("history needs a durable engine: Engine(path=DIR) archives "
                             "what leaves memory under DIR/archive")
        running = [job for job in self._jobs.values() if job.state == "running"]
        if running:
            raise PSoupError(f"history job {running[0].id} is still running (one job at "
                             "a time per engine): wait for it or cancel it")
        journal.archive.flush()
        chosen, jobs = plan_jobs(self._core, handles, self._schedule)
        job = HistoryJob(secrets.token_hex(8), chosen, [j.schema.name for j in jobs],
                         progress)
        for j in jobs:
            j.archived_rows = self._read_rows.get(j.schema.name, 0)
        self._jobs = dict(list(self._jobs.items())[-7:]) | {job.id: job}
        if not jobs:
            job.end("done", self._archived(chosen))
            return job.id
        try:
            for j in jobs:
                self._core.tiers.begin(j.schema.name, [slot for slot, _ in j.queries])
            job.thread = threading.Thread(target=self._run, args=(job, jobs),
                                          name=f"psoup-history-{job.id}", daemon=True)
            job.thread.start()
        except BaseException:
            self._core.tiers.abort()
            del self._jobs[job.id]
            raise
        return job.id

    def job(self, job: str | None) -> HistoryJob:
        """A job by id (None: the latest).

        Raises:
            PSoupError: no such job (the 8 latest are remembered).
        """
        if job is None and self._jobs:
            return list(self._jobs.values())[-1]
        found = self._jobs.get(job) if job is not None else None
        if found is None:
            known = ", ".join(self._jobs) or "none yet"
            raise PSoupError(f"no history job {job!r} on this engine (its latest: {known})")
        return found

    def jobs(self) -> list[HistoryJob]:
        """The remembered jobs, oldest first."""
        return list(self._jobs.values())

    def forget(self, handle: str) -> None:
        """A query left: nothing is due or pending for it any more."""
        self.due.discard(handle)
        self._pending.pop(handle, None)

    def pending(self, handle: str) -> bool:
        """Whether `handle`'s history is being evaluated again after a restart."""
        return handle in self._pending

    def stats(self) -> dict[str, Any]:
        """The archive read rate and the latest reductions (stats()["archive_reads"])."""
        return {"policy": repr(self.policy), "rows_per_second": self.archive_rate,
                "reduction": {stream: [list(step) for step in steps]
                              for stream, steps in self._reductions.items()}}

    # ------------------------------------------------------------------ after a restart

    def reevaluate(self, start: Callable[[list[str]], str]) -> None:
        """After recovery: the queries whose history was evaluated before but whose
        tiers the log could not bring back (never saved, or a file unreadable) get it
        evaluated again by a job (`start`, Engine.history); until it is done, invoking
        one raises HistoryPending (`check_pending`) instead of answering short."""
        core = self._core
        due = [h for h in self.due if h in core.handles and core.handles[h].id not in core.tiers]
        self.due.clear()
        if not due:
            return
        try:
            job = start(due)
        except PSoupError as exc:
            job = f"not started: {exc}"
        self._pending = dict.fromkeys(due, job)
        log.info("evaluating the history of %d queries again after the restart (job %s)",
                 len(due), job)

    def check_pending(self, handle: str) -> None:
        """Refuse to answer a query whose history is being evaluated again.

        Raises:
            HistoryPending: it is (naming the job and its state).
        """
        job = self._pending.get(handle)
        if job is None:
            return
        found = self._jobs.get(job)
        if found is None:
            state = job
        else:
            status = found.status()
            state = f"job {job} {status['state']}"
            if status.get("error"):
                state += f": {status['error']}"
        raise HistoryPending(
            f"query {handle}: its history was evaluated before the engine restarted and is "
            f"being evaluated again ({state}); its answer would lack the archived part "
            "until then. Try again when the job is done (psoup history status), or "
            "evaluate it again (psoup history HANDLE)")

    # ------------------------------------------------------------------ a job's thread

    def _schedule(self, stream: str, below: int) -> Schedule:
        """Under the lock: the archive policy's sample rates for a job reading `stream`'s
        archive below tupleID `below`, from the part files' footers.

        Raises:
            PSoupError: the policy failed or gave a schedule that is not one.
        """
        assert self._journal is not None
        rows, size, first, last = self._journal.archive.extent(stream, below)
        read = ArchiveRead(stream, rows, size, first, last, self._clock(), self.archive_rate)
        self._read_rows[stream] = rows
        schedule = self._reductions[stream] = ask(self.policy, read)
        return schedule

    def _run(self, job: HistoryJob, jobs: list[Job]) -> None:
        """A job's thread: the Spark pass off the lock, then, under it, its matches
        installed in front of the pending tiers, or the pending tiers dropped (failed,
        cancelled, or the engine closed meanwhile)."""
        assert self._journal is not None, "history runs on durable engines only"
        incoming = self._journal.tiers_path / INCOMING / job.id
        found, error = self._pass(job, jobs, incoming)
        done: list[str] = []
        with self._lock:
            if found is not None and not job.cancelled() and not self._is_closed():
                error, done = self._install(job, found)
            if not done:
                self._core.tiers.abort()
        shutil.rmtree(incoming, ignore_errors=True)     # what no tier took
        with contextlib.suppress(OSError):
            incoming.parent.rmdir()                     # empty once no job uses it
        if done:
            self._save_tiers(job, done)     # before "done": a job done is a job saved
        with self._lock:
            if done:
                job.end("done", self._archived(job.handles))
            else:
                stopped = job.cancelled() or self._is_closed()
                job.end("cancelled" if stopped else "failed",
                        error=None if stopped else error)

    def _pass(self, job: HistoryJob, jobs: list[Job], incoming: Path
              ) -> tuple[dict[str, dict[int, list[Segment]]] | None, BaseException | None]:
        """The Spark pass, off the lock: what it found, or the error that stopped it;
        the archive read rate learnt from it (for Budget policies)."""
        from psoup.spark.history import evaluate_jobs
        assert self._journal is not None
        began = time.perf_counter()
        try:
            found = evaluate_jobs(self._journal.archive.root, jobs, self.master, job.note,
                                  job.id, job.cancelled, self.conf, into=incoming)
        except BaseException as exc:     # anything: the job must end, nothing applied
            return None, exc
        read = sum(j.rows_read for j in jobs)
        if read:
            rate = read / max(time.perf_counter() - began, 1e-3)
            with self._lock:
                self.archive_rate = 0.5 * self.archive_rate + 0.5 * rate
        return found, None

    def _install(self, job: HistoryJob, found: dict[str, dict[int, list[Segment]]]
                 ) -> tuple[Exception | None, list[str]]:
        """Under the lock: a job's segments moved into place in front of the pending
        tiers, which become visible, and the job's queries logged as evaluated; (the
        error, []) and nothing changed if the files could not be moved."""
        core, journal = self._core, self._journal
        assert journal is not None, "history runs on durable engines only"
        handle_of = {core.handles[h].id: h for h in job.handles if h in core.handles}
        try:
            core.tiers.finish(found, handle_of)
        except OSError as exc:          # all or nothing: the tiers made visible go too
            for slot in handle_of:
                core.tiers.forget(slot)
            return exc, []
        done = list(handle_of.values())
        for h in done:
            self._pending.pop(h, None)
        try:                            # so that a restart evaluates them again
            journal.history(done)
        except Exception as exc:        # the tiers stand; only the restart forgets
            log.warning("history job %s: could not log its queries (%s); after a "
                        "restart their history must be evaluated again by hand",
                        job.id, exc)
        return None, done

    def _save_tiers(self, job: HistoryJob, handles: list[str]) -> None:
        """After a job: its tiers written to tiers/ off the lock, then, under it, what
        they gained meanwhile and a log record naming their files, so a restart restores
        them there instead of evaluating them again. If that fails, the restart
        evaluates them again (the `history` record), and the next checkpoint saves them."""
        assert self._journal is not None
        core, journal = self._core, self._journal
        folder = journal.tiers_path
        try:
            with self._lock:
                handle_of = {core.handles[h].id: h for h in handles
                             if h in core.handles and core.handles[h].id in core.tiers}
                parts = core.tiers.unsaved(handle_of)
            core.tiers.sync(list(handle_of))    # the job's segments, moved into place
            written = core.tiers.write(folder, parts)
            with self._lock:
                self._check_open()
                # a checkpoint meanwhile removed the files no log named yet: those are
                # written again below, with what the tiers gained since
                core.tiers.mark_saved([w for w in written
                                       if (folder / w.segment.name).is_file()])
                handle_of = {slot: h for slot, h in handle_of.items()
                             if h in core.handles and core.handles[h].id == slot}
                journal.tiers(core.tiers.save(folder, handle_of))
        except Exception as exc:    # the tiers stand; a restart evaluates them again
            log.warning("history job %s: its tiers were not saved (%s); after a restart "
                        "its queries are evaluated again", job.id, exc)

    def _archived(self, handles: list[str]) -> dict[str, int]:
        """handle -> archived matches, for the handles still registered."""
        core = self._core
        return {h: core.tiers.count(core.handles[h].id) for h in handles if h in core.handles}


def plan_jobs(core: Core, handles: Sequence[str] | None,
              schedules: Callable[[str, int], Schedule]) -> tuple[list[str], list[Job]]:
    """The handles to evaluate over the archive (default: every selection query
    without a tier) and one Spark job per stream for those still without one.
    `schedules(stream, below)`: the overload policy's sample rates for reading the
    stream's archive below tupleID `below` (psoup.archive.policy), capped by each
    query's own TABLESAMPLE. O(queries).

    Raises:
        QueryError: a handle names a join query.
        UnknownHandle: a handle is not registered.
    """
    from psoup.spark.history import Job
    chosen = list(handles) if handles is not None else [
        h for h, p in core.handles.items()
        if isinstance(p, SelectionPlan) and p.slot not in core.tiers]
    by_stream: dict[str, list[SelectionPlan]] = {}
    for handle in chosen:
        plan = core.plan(handle)
        if isinstance(plan, JoinPlan):
            raise QueryError("history is evaluated for selection queries only; "
                             f"{handle} is a join")
        if plan.slot not in core.tiers:
            by_stream.setdefault(plan.query.sources[0].stream, []).append(plan)
    jobs = []
    for stream, plans in by_stream.items():
        stem = core.stems[stream]
        until = stem.ts_at(stem.oldest) if stem.oldest < stem.n else math.inf
        below = stem.oldest_tuple_id(core.next_tid)
        schedule = schedules(stream, below)
        samples = {p.slot: capped(schedule, None if s is None else
                                  sample_rate(s.method, s.fraction))
                   for p in plans for s in [p.query.sources[0].sample]}
        jobs.append(Job(core.ddl[stream], stem.schema,
                        [(p.slot, p.query.sql) for p in plans], below,
                        {slot: steps for slot, steps in samples.items() if steps != WHOLE},
                        until))
    return chosen, jobs
