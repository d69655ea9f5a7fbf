"""Polling a handle from the command line (`psoup watch`, the shell's `\\watch` and
`\\changes`): the interval option's type, and the changes since a cursor with a fallback
to the whole answer."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from psoup.client import Client
from psoup.errors import CursorExpired
from psoup.results.result import Changes, Result

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


if TYPE_CHECKING:   # generic from click 8.4 on; the package allows click 8.1
    _FloatType = click.ParamType[float]
else:
    _FloatType = click.ParamType


class Interval(_FloatType):
    """A duration: "500ms", "30s", "2m", "1h", "1d", or a bare number of seconds."""

    name = "interval"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*", str(value))
            if match is None:
                self.fail(f"{value!r} is not a duration such as 30s, 2m, 1h or 500ms",
                          param, ctx)
            seconds = float(match[1]) * _UNITS[match[2] or "s"]
        if seconds <= 0:
            self.fail(f"{value!r} must be longer than zero", param, ctx)
        return seconds


def changes_since(client: Client, handle: str, cursor: str | None,
                   now: float | None) -> tuple[Changes, str | None]:
    """The changes since `cursor`; without a usable cursor, the whole answer as inserted
    rows and the reason why (for a note to the user)."""
    if cursor is None:
        reason = "no earlier invocation of this handle is remembered here"
    else:
        try:
            return client.invoke(handle, now=now, since=cursor), None
        except CursorExpired:
            reason = "the server no longer knows where the last invocation left off"
    whole = client.invoke(handle, now=now)
    empty = Result(whole.columns, [], np.empty(0), np.empty(0, np.int64))
    assert whole.cursor is not None, "an invocation's answer carries its cursor"
    return Changes(whole.columns, whole, empty, whole.cursor, whole.fresh_to), reason
