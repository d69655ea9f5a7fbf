"""psoup's answers against DuckDB running the same SQL over the same window.

Hypothesis draws a schema, a retention, and an interleaving of inserts, registrations,
invocations at random NOW (earlier or later than the data), and unregistrations. Every
invocation is answered by all three engine modes and compared with DuckDB over a table
holding every tuple ever inserted, where the retention and the window are spelled out
in SQL. Registering before or after the data (PSoup's duality) happens in both orders by
construction. Each query is also polled with `since` cursors, each poll from the last
one's cursor, and the changes must compose: the previous answer minus `deleted` plus
`inserted` (as multisets) is the new answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import hypothesis.strategies as st
from hypothesis import given

import psoup
from psoup.options import ModeName
from psoup.results.result import Changes
from tests.oracles import Oracle, assert_changes_compose
from tests.strategies import Scenario, scenarios
from tests.support import Clock, always_reuse, create, insert_stepped

#: A registered query: (handle in each mode, oracle spec, {mode: (cursor, rows)} of
#: the last poll in each mode's chain of since polls).
Live: TypeAlias = tuple[dict[str, str], dict[str, Any],
                        dict[str, tuple[str | None, list[tuple[Any, ...]]]]]


@given(scenarios(), st.sampled_from([2, 3, 8, 8192]), st.sampled_from([0, 200, 64 << 20]))
def test_every_mode_agrees_with_duckdb(scenario: Scenario, chunk_rows: int,
                                       answer_cache_bytes: int) -> None:
    # answer_cache_bytes: every answer read whole (0), the last answers kept and reused
    # as windows move (64 MiB), or only the smallest kept, others dropped (200)
    streams, ops = scenario
    clock = Clock(1000.0)
    with always_reuse():
        engines = {m: psoup.Engine(mode=m, clock=clock, chunk_rows=chunk_rows,
                                   answer_cache_bytes=answer_cache_bytes)
                   for m in psoup.MODES}
    for eng in engines.values():
        create(eng, streams)
    oracle = Oracle(streams)
    last_ts = {name: 1000.0 for name in streams}
    live: list[Live] = []    # (handles, oracle spec, (cursor, rows))

    for op in ops:
        if op[0] == "insert":
            _, stream, rows, steps = op
            insert_stepped(engines, oracle, clock, last_ts, stream, rows, steps)
        elif op[0] == "register":
            sql, spec = op[1]
            live.append(({m: eng.register(sql) for m, eng in engines.items()}, spec, {}))
        elif op[0] == "invoke" and live:
            _check(engines, oracle, live[op[1] % len(live)], clock.now + op[2])
        elif op[0] == "unregister" and live:
            handles = live.pop(op[1] % len(live))[0]
            for mode, eng in engines.items():
                eng.unregister(handles[mode])
        elif op[0] == "invoke_all":
            for entry in live:
                _check(engines, oracle, entry, clock.now + op[1])
    for eng in engines.values():
        eng._check()


def _check(engines: Mapping[ModeName, psoup.Engine], oracle: Oracle, entry: Live,
           now: float) -> None:
    handles, spec, polled = entry
    want = oracle.answer(spec, now)
    for mode, eng in engines.items():
        if mode in polled:      # a chain of since polls, each from the last one's cursor
            cursor, before = polled[mode]
            changes = eng.invoke(handles[mode], now=now, since=cursor)
            assert isinstance(changes, Changes)     # cursor is a str: every answer has one
            assert_changes_compose(before, changes, want, (mode, spec, now))
            polled[mode] = changes.cursor, want
        got = eng.invoke(handles[mode], now=now)
        assert got.rows == want, (mode, spec, now)
        assert got.columns == spec["outputs"]
        polled.setdefault(mode, (got.cursor, want))
