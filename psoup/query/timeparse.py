"""Time units and timestamps of window edges and retention (docs/language.md, "Windows").

A window edge is NOW plus or minus a duration, epoch seconds, or a quoted ISO-8601
timestamp; PSoup Sect. 3.2 keeps them as written and resolves NOW at invocation, so this
module only turns units into seconds and timestamps into epoch seconds.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from psoup.strenum import StrEnum


class TimeUnit(StrEnum):
    """A unit of a duration or a count, by its canonical (singular, upper-case) name."""

    SECOND = "SECOND"
    MINUTE = "MINUTE"
    HOUR = "HOUR"
    DAY = "DAY"
    ROW = "ROW"


#: Seconds per time unit.
UNIT_SECONDS = {TimeUnit.SECOND: 1, TimeUnit.MINUTE: 60, TimeUnit.HOUR: 3600,
                TimeUnit.DAY: 86400}

#: The count unit of logical windows and row retention.
ROW = TimeUnit.ROW

_UNITS = {unit.value: unit for unit in TimeUnit}

_TIMESTAMP = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})"
    r"(?:[Tt ](?P<time>\d{2}:\d{2}(?::\d{2})?)(?:\.(?P<fraction>\d+))?"
    r"(?P<zone>[Zz]|[+-]\d{2}:?\d{2})?)?"
)


def unit_name(word: str) -> TimeUnit | None:
    """The unit a unit word names (SECOND(S), MINUTE(S), HOUR(S), DAY(S), ROW(S)).

    Args:
        word: the word as written, in any case.

    Returns:
        The unit; None when `word` is not a unit.

    Example:
        >>> unit_name("minutes"), unit_name("ROW"), unit_name("weeks")
        (<TimeUnit.MINUTE: 'MINUTE'>, <TimeUnit.ROW: 'ROW'>, None)
    """
    return _UNITS.get(word.upper().removesuffix("S"))


def timestamp_seconds(text: str) -> float:
    """Epoch seconds of an ISO-8601 timestamp; UTC unless it carries an offset.

    Accepts `YYYY-MM-DD`, then optionally `T` or a space, `HH:MM[:SS]`, a fraction of a
    second (digits past microseconds are dropped) and `Z` or `+HH:MM` / `-HHMM`. The same
    forms are accepted on every supported Python version.

    Args:
        text: the timestamp, without quotes.

    Returns:
        Seconds since the Unix epoch.

    Raises:
        ValueError: `text` is not such a timestamp, or names an impossible date or time.

    Example:
        >>> timestamp_seconds("1970-01-02 00:00:01.5"), timestamp_seconds("1970-01-01T01:00+01:00")
        (86401.5, 0.0)
    """
    m = _TIMESTAMP.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not an ISO-8601 timestamp: {text!r}")
    iso = m["date"]
    if m["time"]:
        iso += "T" + m["time"]
        if m["fraction"]:
            iso += "." + m["fraction"][:6].ljust(6, "0")
        zone = (m["zone"] or "").upper()
        if zone == "Z":
            iso += "+00:00"
        elif zone:
            iso += zone[:3] + ":" + zone[-2:]
    moment = datetime.fromisoformat(iso)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()
