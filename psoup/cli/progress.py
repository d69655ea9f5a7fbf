"""What a long command is doing, on stderr: the phases of its work as they begin and end
("starting Spark (local[2])…", "Spark started in 31 s"), counts so far, and while a phase
runs a line every few seconds saying for how long (and Spark's tasks done, when a Spark
job runs). Starting Spark alone takes tens of seconds, and an import or a replay minutes:
a command whose output goes to a file must not look hung meanwhile.

On a terminal the counts and the heartbeat rewrite one line; elsewhere (a file, a pipe,
a test) they are plain lines, at most one each `every` seconds. Phase messages are always
whole lines. Nothing here runs per tuple: a counter is shown only when its time comes.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

import click

from psoup.errors import PSoupError

#: Seconds between two throttled lines (counts, heartbeat) off a terminal.
EVERY = 5.0
#: Seconds between two rewrites of the line on a terminal.
EVERY_ON_TERMINAL = 0.2


def spark_tasks() -> tuple[int, int] | None:
    """(tasks done, tasks) of the Spark stages running now; None without a session.
    Never starts Spark."""
    from psoup.spark.session import running_tasks
    return running_tasks()


class Progress:
    """Phase messages and throttled progress lines of one command on stderr.

    Args:
        terminal: rewrite one line in place (None: whether stderr is a terminal).
        every: the least seconds between two throttled lines (None: EVERY, or
            EVERY_ON_TERMINAL on a terminal).
        clock: seconds, monotonic (tests pass a fake one).
        tasks: (done, all) of the Spark tasks running now, for the heartbeat, or None.

    Used as a context manager it runs the heartbeat in a thread and clears the line it
    left on a terminal at the end.
    """

    def __init__(self, terminal: bool | None = None, every: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 tasks: Callable[[], tuple[int, int] | None] | None = spark_tasks) -> None:
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self.every = (EVERY_ON_TERMINAL if self.terminal else EVERY) if every is None \
            else every
        self._clock = clock
        self._tasks = tasks
        self._lock = threading.Lock()
        self._shown = -float("inf")      # when the last throttled line was shown
        self._phase: str | None = None   # the phase running ("…" ended), and its start
        self._began = 0.0
        self._open = False               # a line rewritten in place is on the terminal
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, message: str) -> None:
        """A phase begins (a message ending in "…": the heartbeat names it until the next
        message) or a step is done: always shown, as a whole line."""
        with self._lock:
            self._phase = message.rstrip("…") if message.endswith("…") else None
            self._began = self._shown = self._clock()
            self._write(message, keep=True)

    def update(self, message: str) -> None:
        """A count so far: shown only when `every` seconds passed since the last line."""
        with self._lock:
            now = self._clock()
            if now - self._shown >= self.every:
                self._shown = now
                self._write(message, keep=False)

    def tick(self) -> None:
        """The heartbeat: while a phase runs, a line saying for how long (and the Spark
        tasks done) once `every` seconds passed without a line."""
        with self._lock:
            now = self._clock()
            if self._phase is None or now - self._shown < max(self.every, EVERY):
                return
            counts = self._tasks() if self._tasks is not None else None
            tasks = f", {counts[0]}/{counts[1]} Spark tasks done" if counts and counts[1] \
                else ""
            self._shown = now
            self._write(f"{self._phase}: {now - self._began:.0f} s{tasks}", keep=False)

    def end(self) -> None:
        """Clear the line left on a terminal (before the command's last output)."""
        with self._lock:
            if self._open:
                click.echo("\r\x1b[K", nl=False, err=True, color=True)
                self._open = False

    def _write(self, text: str, keep: bool) -> None:
        if not self.terminal:
            click.echo(text, err=True)
            return
        # color: click strips escapes from a stream that is no terminal (a stand-in for one)
        click.echo(f"\r{text}\x1b[K", nl=keep, err=True, color=True)
        self._open = not keep

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()

    def __enter__(self) -> Progress:
        self._thread = threading.Thread(target=self._beat, name="psoup-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.end()


#: Retained tuples from which `psoup register` and the shell say that a new query is
#: applied to them (the engine joins a new query with all the retained data before it
#: answers).
LARGE_STORE = 1_000_000


class _Describes(Protocol):
    """An engine or a client: what `announce_large` asks of it."""

    def describe(self, name: str) -> dict[str, Any]: ...


def announce_large(api: _Describes, sql: str) -> None:
    """Say on stderr that registering `sql` applies it to many retained tuples (at least
    LARGE_STORE), which takes a while: the count is the retained rows of the streams it
    reads (DESCRIBE of each), asked before registering. Nothing when the SQL is no
    SELECT, does not parse or names an unknown stream: registering reports that."""
    from psoup.query.parser import parse
    from psoup.query.syntax import Select
    try:
        statement = parse(sql)
        if not isinstance(statement, Select):
            return
        rows = sum(int(api.describe(name)["rows"])
                   for name in {item.stream for item in statement.sources})
    except PSoupError:
        return
    if rows >= LARGE_STORE:
        click.echo(f"applying the query to {rows:,} retained tuples…", err=True)
