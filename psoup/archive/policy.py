"""Overload policies: how much of the archive a history job reads ("Remembrance of
Streams Past", Sect. 3: the reduction UDF).

A hybrid query must read the archive before it can answer for the past; when the archive
is large, reading all of it takes longer than a user can wait or than the live stream
can spare. The archive's sampled layout (psoup.archive.sampling) lets a read take a
uniform sample of any rate for that fraction of the I/O; a *policy* chooses the rate of
each read, from what the read would cover (`ArchiveRead`: rows, bytes and ts range of
the archived part, from the part files' footers) and when it runs. Its choice is a
*schedule*: (from ts, rate) steps in ts order, the first from -inf, so the rate may
depend on the age of the data. The schedule travels with the query's archive tier
(psoup.archive.tiers.Sampled) and every answer states it (`Result.fidelity`).

Policies: `Exact` (the default: read everything), `ConstantRate`, `ByAge` (recent data
whole, older data thinner), `Budget` (the smallest reduction whose estimated read time
fits a number of seconds: `Engine(archive_budget=...)`). Any object with a
`schedule(read)` method is a policy (`Policy`). A query's own TABLESAMPLE rate caps the
policy's (`capped`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np

from psoup.archive.rates import SAMPLE_GROUPS
from psoup.errors import PSoupError

#: (from ts, rate) steps in ts order, the first from -inf: a read's sample rates.
Schedule = tuple[tuple[float, float], ...]

#: Read everything.
WHOLE: Schedule = ((-math.inf, 1.0),)

#: What psoup assumes a history pass reads per second before it has measured one
#: (bench/history.py: 10 million archived tuples against 1,024 queries in 16.7 s, about
#: 0.6 million a second on 2 cores; fewer queries read faster).
DEFAULT_ROWS_PER_SECOND = 1_000_000.0
#: What psoup assumes an invocation reads of a query's archive tier files per second
#: before it has measured one (pyarrow reading Parquet on one core).
DEFAULT_TIER_ROWS_PER_SECOND = 5_000_000.0


class ArchiveRead(NamedTuple):
    """A read of one stream's archive a history job is about to do: the archived rows
    and bytes it covers, their ts range, the time now, and the rows a second psoup's
    last history pass read (DEFAULT_ROWS_PER_SECOND before any)."""

    stream: str
    rows: int
    bytes: int
    first_ts: float
    last_ts: float
    now: float
    rows_per_second: float = DEFAULT_ROWS_PER_SECOND


class Policy(Protocol):
    """Chooses the sample rates of a read of the archive."""

    def schedule(self, read: ArchiveRead) -> Schedule:
        """The (from ts, rate) steps to read `read` at."""
        ...


class Exact:
    """Read the whole archive (no reduction): the default."""

    def schedule(self, read: ArchiveRead) -> Schedule:
        return WHOLE

    def __repr__(self) -> str:
        return "Exact()"


class ConstantRate:
    """Read a uniform sample of `rate` (0 < rate <= 1) of the archive, whatever its size.

    Example:
        >>> ConstantRate(0.25).schedule(ArchiveRead("R", 10, 80, 0.0, 9.0, 10.0))
        ((-inf, 0.25),)
    """

    def __init__(self, rate: float):
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"a sample rate is in (0, 1], not {rate!r}")
        self.rate = float(rate)

    def schedule(self, read: ArchiveRead) -> Schedule:
        return ((-math.inf, self.rate),)

    def __repr__(self) -> str:
        return f"ConstantRate({self.rate})"


class ByAge:
    """Recent data at a higher rate than old data: `tiers` are (age in seconds, rate)
    pairs, by increasing age: data younger than the first age is read at its rate, ...,
    and data older than the last age at `older`.

    Example:
        >>> ByAge([(3600, 1.0), (86400, 0.25)], older=0.05).schedule(
        ...     ArchiveRead("R", 10, 80, 0.0, 9.0, 100000.0))
        ((-inf, 0.05), (13600.0, 0.25), (96400.0, 1.0))
    """

    def __init__(self, tiers: Sequence[tuple[float, float]], older: float):
        ages = [float(age) for age, _ in tiers]
        if not ages or ages != sorted(ages) or ages[0] <= 0:
            raise ValueError("ByAge needs (age seconds, rate) pairs by increasing positive age")
        for rate in [r for _, r in tiers] + [older]:
            if not 0.0 < rate <= 1.0:
                raise ValueError(f"a sample rate is in (0, 1], not {rate!r}")
        self.tiers = [(float(a), float(r)) for a, r in tiers]
        self.older = float(older)

    def schedule(self, read: ArchiveRead) -> Schedule:
        steps = [(-math.inf, self.older)]
        for age, rate in reversed(self.tiers):
            steps.append((read.now - age, rate))
        return tuple(steps)

    def __repr__(self) -> str:
        return f"ByAge({self.tiers}, older={self.older})"


class Budget:
    """The smallest reduction whose read fits `seconds`: the largest rate, in whole row
    groups of the sampled layout (k / SAMPLE_GROUPS, at least one group), with
    read.rows x rate / read.rows_per_second <= seconds; the whole archive when it fits.

    Example:
        >>> b = Budget(2.0)
        >>> b.schedule(ArchiveRead("R", 1_000_000, 0, 0.0, 9.0, 10.0))
        ((-inf, 1.0),)
        >>> b.schedule(ArchiveRead("R", 10_000_000, 0, 0.0, 9.0, 10.0))
        ((-inf, 0.1875),)
    """

    def __init__(self, seconds: float):
        if not seconds > 0:
            raise ValueError(f"an archive budget is a positive number of seconds, not "
                             f"{seconds!r}")
        self.seconds = float(seconds)

    def schedule(self, read: ArchiveRead) -> Schedule:
        need = read.rows / max(read.rows_per_second, 1e-9)
        if need <= self.seconds:
            return WHOLE
        groups = max(1, math.floor(SAMPLE_GROUPS * self.seconds / need))
        return ((-math.inf, groups / SAMPLE_GROUPS),)

    def __repr__(self) -> str:
        return f"Budget({self.seconds} s)"


def step_ranges(schedule: Schedule) -> list[tuple[float, float, float]]:
    """`schedule`'s steps as (from ts, to ts, rate): each to the next step's start, the
    last to inf.

    Example:
        >>> step_ranges(((-math.inf, 0.05), (10.0, 1.0)))
        [(-inf, 10.0, 0.05), (10.0, inf, 1.0)]
    """
    ends = [start for start, _ in schedule[1:]] + [math.inf]
    return [(start, end, rate) for (start, rate), end in zip(schedule, ends, strict=True)]


def step_at(steps: Sequence[tuple[float, float]], ts: np.ndarray) -> np.ndarray:
    """The value of the step holding each of `ts`, for steps (from ts, value) in ts
    order, the first from -inf (a schedule's rates, or a sample's draw thresholds).
    O(n log steps).

    Example:
        >>> step_at(((-math.inf, 0.25), (10.0, 1.0)), np.array([3.0, 10.0])).tolist()
        [0.25, 1.0]
    """
    starts = np.array([start for start, _ in steps])
    values = np.array([value for _, value in steps])
    return values[np.searchsorted(starts, ts, side="right") - 1]


def capped(schedule: Schedule, rate: float | None) -> Schedule:
    """`schedule` with no rate above `rate` (a query's own TABLESAMPLE; None: no cap),
    its steps of equal rates merged.

    Example:
        >>> capped(((-math.inf, 0.05), (10.0, 1.0)), 0.25)
        ((-inf, 0.05), (10.0, 0.25))
        >>> capped(WHOLE, None) == WHOLE
        True
    """
    steps = [(start, min(r, rate) if rate is not None else r) for start, r in schedule]
    out = [steps[0]]
    for start, r in steps[1:]:
        if r != out[-1][1]:
            out.append((start, r))
    return tuple(out)


def check_schedule(schedule: Schedule) -> Schedule:
    """A policy's schedule, checked: steps in increasing ts order, the first from -inf,
    rates in (0, 1] (ValueError naming the fault otherwise)."""
    steps = tuple((float(a), float(r)) for a, r in schedule)
    if not steps or steps[0][0] != -math.inf:
        raise ValueError(f"a schedule starts at -inf: {schedule!r}")
    if any(b[0] <= a[0] for a, b in zip(steps, steps[1:], strict=False)):
        raise ValueError(f"a schedule's steps go by increasing ts: {schedule!r}")
    if any(not 0.0 < r <= 1.0 for _, r in steps):
        raise ValueError(f"a schedule's rates are in (0, 1]: {schedule!r}")
    return steps


def ask(policy: Policy, read: ArchiveRead) -> Schedule:
    """`policy`'s schedule for `read`, checked (`check_schedule`).

    Raises:
        PSoupError: the policy raised, or gave a schedule that is not one (naming it
            and the read).
    """
    try:
        return check_schedule(policy.schedule(read))
    except Exception as exc:
        raise PSoupError(f"the archive policy {policy!r} failed on {read}: {exc}") from None
