"""How the `psoup` command prints answers: an aligned table for people, CSV and JSON for
scripts.

Tables are for reading: each row's timestamp is a first column `ts` in ISO 8601 UTC
(`iso_utc`, which `--now` and `--from` accept back), SQL is one line, and a `limit`
cuts long answers with a footer saying how much was left out. CSV and JSON are for
scripts: timestamps stay seconds since the epoch and SQL stays whole.

An answer is a `Result` (the whole answer of an invocation) or a `Changes` (what entered
and left the answer since a cursor, the STREAM paper's Istream and Dstream). An answer
over a stream fed by a Spark source also says up to which ts it is complete (its
`fresh_to`: a table's footer, a JSON document's "fresh_to"). Values are
the Python scalars the engine returns; text is printed verbatim, floats compactly in a
table and exactly in CSV and JSON. JSON output is one document per answer with a fixed
set of keys, so scripts can rely on it (docs/cli.md).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from psoup.results.result import Changes, Result

#: The output formats of `psoup invoke`, `watch` and `queries`.
FORMATS = ("table", "csv", "json")

#: Rows of an answer a table on a terminal shows unless --limit says otherwise.
DEFAULT_LIMIT = 100


def render_result(result: Result, fmt: str, limit: int | None = None) -> str:
    """The whole answer of one invocation in `fmt` ("table", "csv" or "json").

    A table starts with each row's ts (`iso_utc`), CSV with it in seconds. JSON is
    ``{"columns": [...], "rows": [[...], ...], "ts": [...], "cursor": "..."}``, ts in
    seconds. `limit` (None: all) keeps the first rows; the table's footer says how many
    there were (`cut_note`), CSV and JSON just end early. An answer over a stream fed by
    a source says up to which ts it is complete: in the table's footer (`fresh_note`),
    as "fresh_to" (seconds; null while the source has sent nothing) in JSON; CSV holds
    rows only.

    Example:
        >>> import numpy as np
        >>> r = Result(["a", "name"], [(1, "x"), (2, "y")], np.array([5.0, 6.5]),
        ...            np.array([1, 2]), "c1")
        >>> print(render_result(r, "table"))
        ts                        a  name
        --                        -  ----
        1970-01-01T00:00:05.000Z  1  x
        1970-01-01T00:00:06.500Z  2  y
        (2 rows)
        >>> print(render_result(r, "table", limit=1))
        ts                        a  name
        --                        -  ----
        1970-01-01T00:00:05.000Z  1  x
        (2 rows, first 1 shown; --limit 0 for all)
        >>> render_result(r, "json", limit=1)
        '{"columns": ["a", "name"], "rows": [[1, "x"]], "ts": [5.0], "cursor": "c1"}'
        >>> print(render_result(r, "csv"))
        ts,a,name
        5.0,1,x
        6.5,2,y
    """
    if fmt == "json":
        return to_json(_result_doc(result, limit))
    if fmt == "csv":
        return _csv(["ts"] + list(result.columns), _stamped(result, limit, iso=False))
    n = len(result.rows)
    return (table(["ts"] + list(result.columns), _stamped(result, limit)) +
            f"\n({n:,} row{'' if n == 1 else 's'}{cut_note(n, limit)}"
            f"{fresh_note(result.fresh_to)})")


def render_changes(changes: Changes, fmt: str, reset: bool = False,
                   limit: int | None = None) -> str:
    """What changed since a cursor: inserted rows marked "+", deleted rows "-".

    Args:
        changes: the invocation's changes.
        fmt: "table" (a first column of + and -, then ts), "csv" (a first column
            "change", then ts in seconds) or "json" (``{"columns", "inserted",
            "deleted", "cursor", "reset"}``).
        reset: True when `changes.inserted` is the whole answer (there was no usable
            cursor), so a script must replace what it holds instead of applying a delta.
        limit: show at most this many changed rows (None: all), inserted ones first.

    Example:
        >>> import numpy as np
        >>> one = Result(["a"], [(7,)], np.array([5.0]), np.array([1]))
        >>> none = Result(["a"], [], np.empty(0), np.empty(0, np.int64))
        >>> print(render_changes(Changes(["a"], one, none, "c2"), "table"))
           ts                        a
           --                        -
        +  1970-01-01T00:00:05.000Z  7
        (1 inserted, 0 deleted)
    """
    if fmt == "json":
        return to_json(_changes_doc(changes, reset, limit))
    if fmt == "csv":
        return _csv(["change", "ts"] + list(changes.columns),
                    _marked(changes, stamped=True, iso=False)[:limit])
    n = len(changes.inserted) + len(changes.deleted)
    return (table(["", "ts"] + list(changes.columns), _marked(changes, stamped=True)[:limit]) +
            f"\n({len(changes.inserted):,} inserted, {len(changes.deleted):,} deleted"
            f"{cut_note(n, limit)}{fresh_note(changes.fresh_to)})")


def render_poll(answer: Result | Changes, fmt: str, polled: float, first: bool,
                limit: int | None = None) -> str:
    """One poll of `psoup watch`: the whole answer (the first poll) or what changed.

    Table: a line ``[local time] N rows`` or ``[local time] +I -D`` and the rows (each
    with its ts), marked + and - for changes; at most `limit` rows per poll, and the
    line says when some were left out. CSV: one document across polls, columns "polled"
    (epoch seconds), "change" and "ts" (seconds), then the query's; the first answer's rows count as
    inserted, and the header comes with the first poll only. JSON: one document per line,
    the document of `render_result` or `render_changes` plus "polled".

    Example:
        >>> import numpy as np
        >>> r = Result(["a"], [(1,)], np.array([5.0]), np.array([1]), "c1")
        >>> render_poll(r, "csv", 100.0, first=True)
        'polled,change,ts,a\\n100.0,+,5.0,1'
    """
    if isinstance(answer, Result):
        empty = Result(answer.columns, [], np.empty(0), np.empty(0, np.int64))
        assert answer.cursor is not None, "a polled answer comes from an invocation"
        changes = Changes(answer.columns, answer, empty, answer.cursor)
    else:
        changes = answer
    if fmt == "json":
        doc = (_result_doc(answer, limit) if isinstance(answer, Result)
               else _changes_doc(answer, False, limit))
        return to_json({"polled": polled, **doc})
    if fmt == "csv":
        text = _csv(["polled", "change", "ts"] + list(changes.columns),
                    [(polled,) + row
                     for row in _marked(changes, stamped=True, iso=False)[:limit]])
        return text if first else text.partition("\n")[2]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(polled))
    fresh = fresh_note(answer.fresh_to)
    if isinstance(answer, Result):
        n = len(answer)
        return (f"[{stamp}] {n:,} row{'' if n == 1 else 's'}{cut_note(n, limit)}{fresh}\n" +
                table(["ts"] + list(answer.columns), _stamped(answer, limit)))
    if not len(changes):
        return f"[{stamp}] no changes{fresh}"
    n = len(changes.inserted) + len(changes.deleted)
    return (f"[{stamp}] +{len(changes.inserted):,} -{len(changes.deleted):,}"
            f"{cut_note(n, limit)}{fresh}\n" +
            table(["", "ts"] + list(changes.columns), _marked(changes, stamped=True)[:limit]))


def cut_note(total: int, limit: int | None) -> str:
    """The end of a table's footer when `limit` left rows out ("" when it did not).

    Example:
        >>> cut_note(61577, 100), cut_note(5, 100)
        (', first 100 shown; --limit 0 for all', '')
    """
    if limit is None or total <= limit:
        return ""
    return f", first {limit:,} shown; --limit 0 for all"


def fresh_note(fresh_to: float | None) -> str:
    """The end of a footer saying up to which ts an answer over a stream fed by a
    source is complete ("" for an answer over none: `Result.fresh_to` None).

    Example:
        >>> fresh_note(1795795201.0), fresh_note(None)
        ('; complete to 2026-11-27T16:00:01.000Z', '')
        >>> fresh_note(-math.inf)
        '; complete to no ts yet (its source has sent nothing)'
    """
    if fresh_to is None:
        return ""
    if not math.isfinite(fresh_to):
        return "; complete to no ts yet (its source has sent nothing)"
    return f"; complete to {iso_utc(fresh_to)}"


def render_records(key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                   fmt: str) -> str:
    """Catalog rows (streams, say) in `fmt`: a table with a count, CSV, or JSON as
    ``{key: [{column: value, ...}, ...]}``. In a table, NULL is "-", timestamps (columns
    named ts or ending in _ts) are `iso_utc` and SQL is one line (`one_line`).

    Example:
        >>> print(render_records("streams", ["stream", "retain"], [("R", None)], "table"))
        stream  retain
        ------  ------
        R       -
        (1 stream)
        >>> render_records("streams", ["stream", "retain"], [("R", None)], "json")
        '{"streams": [{"stream": "R", "retain": null}]}'
    """
    if fmt == "json":
        return to_json({key: [dict(zip(columns, row, strict=True)) for row in rows]})
    if fmt == "csv":
        return _csv(columns, rows)
    n = len(rows)
    shown = [[_shown(c, v) for c, v in zip(columns, row, strict=True)] for row in rows]
    return table(columns, shown) + f"\n({n} {key if n != 1 else key[:-1]})"


def render_record(record: dict[str, Any], fmt: str) -> str:
    """One catalog record (a stream, a query): `field  value` lines (shown as in
    `render_records`), CSV of one row, or a JSON object.

    Example:
        >>> print(render_record({"stream": "R", "rows": 3, "latest_ts": 0.0}, "table"))
        stream     R
        rows       3
        latest_ts  1970-01-01T00:00:00.000Z
    """
    if fmt == "json":
        return to_json(record)
    if fmt == "csv":
        return _csv(list(record), [list(record.values())])
    width = max(map(len, record), default=0)
    return "\n".join(f"{k.ljust(width)}  {_flat(_shown(k, v))}" for k, v in record.items())


def render_stats(stats: dict[str, Any], names: dict[str, str]) -> str:
    """`psoup stats` for people: the engine mode and memory, a table of streams and one of
    standing queries (with the names the user gave them, the tuples each matches now and
    its SQL on one line); other sections as key: value.

    Args:
        stats: the server's stats() dict.
        names: handle -> name, from the handle store.
    """
    lines = {key: _flat(value) for key, value in stats.items()
             if key not in ("streams", "queries", "memory", "sources")}
    memory = stats.get("memory")
    if memory:
        parts = ", ".join(f"{k} {human_bytes(v)}" for k, v in memory.items() if k != "total")
        lines["memory"] = f"{human_bytes(memory.get('total', 0))} ({parts})"
    width = max(map(len, lines), default=0)
    out = [f"{key:<{width}}  {text}" for key, text in lines.items()]
    streams = stats.get("streams", {})
    if streams:
        rows = [(name, s.get("rows", 0), s.get("rows_total", 0), human_bytes(s.get("bytes", 0)),
                 round(s.get("rows_per_s", 0.0), 1), iso_utc(s.get("latest_ts")))
                for name, s in streams.items()]
        out += ["", table(["stream", "rows", "rows total", "size", "rows/s", "latest ts"], rows)]
    sources = stats.get("sources", {})
    if sources:
        out += ["", _sources_table(sources)]
    queries = stats.get("queries", {})
    out += ["", f"{len(queries)} standing quer{'y' if len(queries) == 1 else 'ies'}"]
    if queries:
        # "results" counts the retained tuples (or join combinations) that match the
        # query now, not the rows of its answer (a DISTINCT or an aggregate has fewer)
        query_rows = [(names.get(h, ""), h[:12] + "...", q.get("results", ""),
                       one_line(q.get("sql", ""))) for h, q in queries.items()]
        out.append(table(["name", "handle", "matches", "sql"], query_rows))
    return "\n".join(out)


def _sources_table(sources: dict[str, dict[str, Any]]) -> str:
    """The streams fed by a Spark source: state, micro-batches, rates, lag, last error."""
    def rate(value: float | None) -> Any:
        return "" if value is None else round(value, 1)
    rows = [(name, s.get("state", ""), s.get("batches", 0), s.get("rows", 0),
             rate(s.get("input_rows_per_s")), rate(s.get("processed_rows_per_s")),
             rate(s.get("lag_seconds")), one_line(s.get("last_error") or ""))
            for name, s in sources.items()]
    return table(["source of", "state", "batches", "rows", "in rows/s", "done rows/s",
                  "lag s", "last error"], rows)


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned text table: a header, a rule of dashes under named columns, one line
    per row. Numbers are right-aligned, everything else left-aligned; no trailing blanks.

    Example:
        >>> print(table(["lane", "speed"], [(3, 12.5), (10, 7.25)]))
        lane  speed
        ----  -----
           3   12.5
          10   7.25
    """
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [bool(rows) and all(_is_number(r[i]) for r in rows) for i in range(len(columns))]

    def line(values: Sequence[str], right: Sequence[bool]) -> str:
        return "  ".join(v.rjust(w) if r else v.ljust(w)
                         for v, w, r in zip(values, widths, right, strict=True)).rstrip()

    out = [line(columns, numeric)]
    if any(columns):
        out.append(line(["-" * len(c) for c in columns], numeric))
    out.extend(line(r, numeric) for r in cells)
    return "\n".join(out)


def cell(value: Any) -> str:
    """One value as table text: floats in at most 12 significant digits (and always with
    a point or an exponent, so they read as floats), the rest as str.

    Example:
        >>> cell(62.0), cell(0.1 + 0.2), cell(1767225600.05), cell(1e20), cell("a b")
        ('62.0', '0.3', '1767225600.05', '1e+20', 'a b')
    """
    if isinstance(value, float):
        text = format(value, ".12g")
        return text + ".0" if text.lstrip("-").isdigit() else text
    return str(value)


def human_bytes(n: float) -> str:
    """A byte count for people.

    Example:
        >>> human_bytes(512), human_bytes(3_400_000)
        ('512 B', '3.4 MB')
    """
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def iso_utc(ts: float | None) -> str:
    """A timestamp (seconds since the epoch) as ISO 8601 UTC to the millisecond, the form
    of every ts the CLI shows to people ("-" for none); `--now` and `--from` take it back.

    Example:
        >>> iso_utc(1767225600.25), iso_utc(None)
        ('2026-01-01T00:00:00.250Z', '-')
    """
    if ts is None or not math.isfinite(ts):
        return "-"
    ms = round(ts * 1000)
    if not -62_135_596_800_000 <= ms < 253_402_300_800_000:     # years 1-9999
        return cell(float(ts))
    seconds, millis = divmod(ms, 1000)
    when = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=seconds)
    return f"{when:%Y-%m-%dT%H:%M:%S}.{millis:03d}Z"


def iso_times(message: str) -> str:
    """A message with every "ts SECONDS" and "--from SECONDS" in it shown as `iso_utc`,
    the seconds kept after it (the exact value, which --from also takes back), so that
    one message shows its times in one form.

    Example:
        >>> iso_times("stream 'R' holds data up to ts 1767225600.25; ts 1e+20 is past")
        "stream 'R' holds data up to ts 2026-01-01T00:00:00.250Z (1767225600.25); ts 1e+20 is past"
        >>> iso_times("it ends at ts 1767225600.0.")
        'it ends at ts 2026-01-01T00:00:00.000Z (1767225600.0).'
        >>> iso_times("--from 1767225601.5 skips it")
        '--from 2026-01-01T00:00:01.500Z (1767225601.5) skips it'
    """
    def shown(match: re.Match[str]) -> str:
        text = iso_utc(float(match[2]))
        return match[0] if not text.endswith("Z") else f"{match[1]} {text} ({match[2]})"
    return _TS_IN_TEXT.sub(shown, message)


# a number that ends a sentence ("ts 5.0.") is a time too; "ts 5.0.1" is not
_TS_IN_TEXT = re.compile(r"(\bts|--from) (-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)(?!\w|\.\w)")


def one_line(sql: str, width: int = 100) -> str:
    """SQL for a table cell: whitespace and newlines collapsed to single blanks, and text
    past `width` characters cut to an ellipsis (JSON and CSV keep the SQL whole).

    Example:
        >>> one_line("SELECT a\\n  FROM R\\n WHERE a > 1")
        'SELECT a FROM R WHERE a > 1'
        >>> one_line("SELECT a, b, c FROM R", width=12)
        'SELECT a,...'
    """
    flat = " ".join(str(sql).split())
    return flat if len(flat) <= width else flat[:width - 3].rstrip() + "..."


def _shown(column: str, value: Any) -> Any:
    if value is None:
        return "-"
    if column == "sql":
        return one_line(value)
    if (column == "ts" or column.endswith("_ts")) and _is_number(value):
        return iso_utc(value)
    return value


def _stamped(result: Result, limit: int | None, iso: bool = True) -> list[tuple[Any, ...]]:
    """The rows with each one's ts in front: `iso_utc` for people, seconds for scripts."""
    return [(iso_utc(t) if iso else t,) + tuple(r)
            for t, r in zip(result.ts[:limit].tolist(), result.rows[:limit], strict=True)]


def _result_doc(result: Result, limit: int | None = None) -> dict[str, Any]:
    doc = {"columns": list(result.columns), "rows": [list(r) for r in result.rows[:limit]],
           "ts": result.ts[:limit].tolist(), "cursor": result.cursor}
    return _with_fresh(doc, result.fresh_to)


def _changes_doc(changes: Changes, reset: bool, limit: int | None = None) -> dict[str, Any]:
    inserted = changes.inserted.rows[:limit]
    rest = None if limit is None else max(limit - len(inserted), 0)
    return {"columns": list(changes.columns), "inserted": [list(r) for r in inserted],
            "deleted": [list(r) for r in changes.deleted.rows[:rest]],
            "cursor": changes.cursor, "reset": reset} | _with_fresh({}, changes.fresh_to)


def _with_fresh(doc: dict[str, Any], fresh_to: float | None) -> dict[str, Any]:
    """`doc` with "fresh_to" for an answer over a stream fed by a source (null while
    it has sent nothing: JSON has no -inf); as it was for any other answer."""
    if fresh_to is not None:
        doc["fresh_to"] = fresh_to
    return doc


def _marked(changes: Changes, stamped: bool = False, iso: bool = True) -> list[tuple[Any, ...]]:
    """The changed rows, inserted ones (+) first; `stamped` puts each row's ts after
    the mark (`iso_utc`, or seconds when not `iso`)."""
    return [(mark,) + ((iso_utc(t) if iso else t,) if stamped else ()) + tuple(r)
            for mark, part in (("+", changes.inserted), ("-", changes.deleted))
            for t, r in zip(part.ts.tolist(), part.rows, strict=True)]


def _flat(value: Any, nested: bool = False) -> str:
    """A value on one line for people: a dict as "key value, ..." (a dict inside one in
    parentheses, an empty one as "none"), None as "-", as tables show NULL.

    Example:
        >>> _flat({"policy": "Exact()", "reduction": {}, "max": None, "by": {"R": 320}})
        'policy Exact(), reduction none, max -, by (R 320)'
    """
    if isinstance(value, dict):
        if not value:
            return "none"
        text = ", ".join(f"{k} {_flat(v, nested=True)}" for k, v in value.items())
        return f"({text})" if nested else text
    return "-" if value is None else cell(value)


def to_json(document: Any) -> str:
    """`document` as one line of JSON with NaN-free values (non-finite floats become null).

    Example:
        >>> to_json({"x": [1.5, float("inf")]})
        '{"x": [1.5, null]}'
    """
    return json.dumps(_finite(document), allow_nan=False, default=_jsonable)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _jsonable(value: Any) -> Any:
    # numpy scalars and bytes from a server reply; anything else is a bug worth a TypeError.
    if hasattr(value, "item"):
        return _finite(value.item())
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buf.getvalue().rstrip("\n")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
