"""What a long command says on stderr while it works (psoup.cli.progress): phases as
whole lines, counts and a heartbeat at most every few seconds, one line rewritten in
place on a terminal. A fake clock stands in for time."""

from __future__ import annotations

import pytest

from psoup.cli.progress import EVERY, Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


def test_phases_are_whole_lines_and_counts_come_at_most_every_few_seconds(
        capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    shown = Progress(terminal=False, clock=clock, tasks=None)
    assert shown.every == EVERY
    shown("starting Spark (local[2])…")
    clock.now += 31
    shown("Spark started in 31 s")
    for rows in range(0, 4_000, 100):       # a count every 0.25 s for 10 s: one line
        shown.update(f"{rows:,} rows")
        clock.now += 0.25
    assert lines(capsys) == ["starting Spark (local[2])…", "Spark started in 31 s",
                             "2,000 rows"]


def test_the_heartbeat_names_the_running_phase_its_time_and_spark_tasks(
        capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    tasks = [(3, 8)]
    shown = Progress(terminal=False, clock=clock, tasks=lambda: tasks[0])
    shown.tick()                             # no phase yet: nothing to say
    shown("reading and checking every row (a Spark job)…")
    clock.now += EVERY - 1
    shown.tick()                             # too soon after the phase's line
    clock.now += 1
    shown.tick()
    clock.now += 2 * EVERY
    tasks[0] = (8, 8)
    shown.tick()
    shown("2,000 rows read and checked")     # not a phase ("…"): the heartbeat stops
    clock.now += 3 * EVERY
    shown.tick()
    assert lines(capsys) == ["reading and checking every row (a Spark job)…",
                             "reading and checking every row (a Spark job): 5 s, "
                             "3/8 Spark tasks done",
                             "reading and checking every row (a Spark job): 15 s, "
                             "8/8 Spark tasks done",
                             "2,000 rows read and checked"]


def test_on_a_terminal_counts_rewrite_one_line_and_end_clears_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    shown = Progress(terminal=True, clock=clock, tasks=None)
    shown.update("10 rows")
    clock.now += shown.every
    shown.update("20 rows")
    shown("Spark started in 3 s")            # a phase ends the rewritten line
    shown.update("30 rows")                  # too soon: nothing
    clock.now += shown.every
    shown.update("40 rows")
    shown.end()
    shown.end()                              # nothing left to clear
    assert capsys.readouterr().err == ("\r10 rows\x1b[K\r20 rows\x1b[K"
                                       "\rSpark started in 3 s\x1b[K\n"
                                       "\r40 rows\x1b[K\r\x1b[K")


def test_as_a_context_it_beats_in_a_thread_and_stops_with_the_block(
        capsys: pytest.CaptureFixture[str]) -> None:
    with Progress(terminal=False, tasks=None) as shown:
        shown("waiting…")
    assert lines(capsys) == ["waiting…"]
