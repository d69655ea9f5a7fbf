"""`psoup shell`: an interactive session with an engine, like sqlite3 or psql.

PSoup's client registers standing queries and invokes their handles later (Sect. 1);
the shell is that client at a prompt. Statements of the query language (docs/language.md)
end with `;` and may span lines: a SELECT registers a standing query and prints its
handle, SHOW and DESCRIBE print their table, CREATE and DROP say what they did.
Meta-commands start with a backslash and take one line: `\\invoke`, `\\changes` and
`\\watch` read answers, `\\streams`, `\\queries` and `\\describe` the catalog, `\\timing`
and `\\format` change the output (`\\help` lists them all).

The session talks to an embedded `psoup.Engine` (in memory, or on a data directory) or
to a server through `psoup.client.Client`; both answer the same calls. On a terminal,
GNU readline (the standard library's) edits lines, completes keywords and names, and
keeps a history across sessions; without one, the shell reads a script from stdin.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

import click

from psoup.cli.handles import HandleStore
from psoup.cli.output import (
    DEFAULT_LIMIT,
    FORMATS,
    one_line,
    render_changes,
    render_poll,
    render_record,
    render_records,
    render_result,
    table,
)
from psoup.cli.progress import announce_large
from psoup.config import config_dir
from psoup.errors import PSoupError
from psoup.results.result import Changes, Result

#: Words the completer offers in statements (docs/language.md).
KEYWORDS = (
    "SELECT", "DISTINCT", "FROM", "WHERE", "AND", "BETWEEN", "IN", "AS", "GROUP", "BY",
    "BEGIN", "END", "NOW", "TRUE", "FALSE", "RANGE", "ROWS", "PARTITION", "UNBOUNDED",
    "SECONDS", "MINUTES", "HOURS", "DAYS", "COUNT", "SUM", "AVG", "MIN", "MAX",
    "CREATE", "STREAM", "RETAIN", "INT", "FLOAT", "TEXT", "BOOL",
    "SHOW", "STREAMS", "QUERIES", "DESCRIBE", "DROP", "CASCADE",
)

HELP = """\
Statements end with ";" and may span lines (docs/language.md):
  CREATE STREAM s (a INT, b TEXT) [RETAIN 1 HOUR];   SELECT ... ;   (prints the handle)
  SHOW STREAMS;  SHOW QUERIES;  DESCRIBE s;  DROP STREAM s [CASCADE];
Meta-commands (one line each; HANDLE may be a name from the handle store on a server,
or left out for the query registered last):
  \\streams                 the streams (SHOW STREAMS)
  \\queries                 the standing queries
  \\describe STREAM         one stream (DESCRIBE)
  \\ingest STREAM FILE      append the rows of a CSV, JSON lines or Parquet file
                           (--ts-column COL: the column of timestamps, if not ts)
  \\invoke [HANDLE]         the query's current answer; on a terminal a table shows
                           the first 100 rows (--limit N: N, 0: all), paged if long
  \\changes [HANDLE]        what entered (+) and left (-) the answer since the last look
                           (--limit N as for \\invoke)
  \\watch [HANDLE] [2s]     the answer, then its changes at every interval; Ctrl-C stops
  \\unregister [HANDLE]     drop a standing query
  \\format table|csv|json   how answers are printed (now: {fmt})
  \\timing                  print each command's time (now: {timing})
  \\x                       show each row of a table as a record (now: {expanded})
  \\o [FILE]                send answers and tables to FILE (emptied first); \\o: here
  \\i FILE                  run the statements and meta-commands in FILE
  \\help                    this text (or help)
  \\quit                    leave (or quit, exit, Ctrl-D)"""

_META = ("\\streams", "\\queries", "\\describe", "\\ingest", "\\invoke", "\\changes",
         "\\watch", "\\unregister", "\\format", "\\timing", "\\x", "\\o", "\\i", "\\help",
         "\\quit", "\\q")
#: Words that, alone on a line outside a statement, are meta-commands (as in psql).
_BARE = {"help": "\\help", "quit": "\\quit", "exit": "\\quit"}
_TAKES_STREAM = ("\\describe", "\\ingest")
#: The meta-commands that take a file name, and how many words come before it.
_FILE_AFTER = {"\\ingest": 2, "\\i": 1, "\\o": 1}
#: How deep \\i may nest: a file that includes itself stops there.
_MAX_DEPTH = 16
#: The keywords that start a part of a statement, for completion to know where it is.
_CLAUSES = ("SELECT", "FROM", "WHERE", "GROUP", "BEGIN", "END", "TABLESAMPLE")
_TAKES_HANDLE = ("\\invoke", "\\changes", "\\watch", "\\unregister")


class ShellError(Exception):
    """A mistake in a meta-command; printed as one `error:` line like the engine's."""


@dataclass
class Session:
    """One shell: the engine or server it talks to and the user's settings.

    Args:
        backend: a `psoup.Engine` or a connected `psoup.client.Client`.
        server: "host:port" of the server, None for an embedded engine; names from the
            handle store resolve only on the server they were registered on.
        echo: prints a line of output; `warn` one of errors. Answers, tables and what
            a statement did go to `out` instead when it is set (`\\o FILE`).
        terminal: whether a person reads the output on a terminal: then, as with
            `psoup invoke`, a table shows at most DEFAULT_LIMIT rows unless `--limit`
            says otherwise, and one taller than the terminal goes through a pager.
    """

    backend: Any
    server: str | None
    echo: Callable[[str], None]
    warn: Callable[[str], None]
    fmt: str = "table"
    timing: bool = False
    terminal: bool = False
    expanded: bool = False
    out: IO[str] | None = None
    last_handle: str | None = None
    failures: int = 0
    _cursors: dict[str, str | None] = field(default_factory=dict)
    _catalog: dict[str, list[str]] | None = None
    _depth: int = 0
    _opened: contextlib.ExitStack[Any] = field(default_factory=contextlib.ExitStack)

    # ------------------------------------------------------------------ input

    def run(self, lines: Iterator[str]) -> bool:
        """Run the statements and meta-commands in `lines` until they end (True) or
        `\\quit` (False)."""
        return all(self.run_one(command) for command in statements(lines))

    def close(self) -> None:
        """Close the file `\\o` sends output to, if any."""
        self._opened.close()
        self.out = None

    def _say(self, text: str) -> None:
        """Print a command's output: an answer, a table, what a statement did."""
        if self.out is None:
            self.echo(text)
        else:
            self.out.write(text + "\n")
            self.out.flush()

    def run_one(self, command: str) -> bool:
        """Run one statement or meta-command; False when it asks to leave."""
        began = time.perf_counter()
        try:
            if command.startswith("\\"):
                if not self._meta(command):
                    return False
            else:
                self._statement(command)
        except (PSoupError, ShellError, click.ClickException, OSError) as exc:
            self.failures += 1
            message = exc.message if isinstance(exc, click.ClickException) else \
                (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
            self.warn(f"error: {' '.join(message.split())}")
            if not command.startswith("\\"):
                for line in caret(command, message):
                    self.warn(line)
        except KeyboardInterrupt:
            self.warn("interrupted")
        if self.timing:
            self.echo(f"time: {(time.perf_counter() - began) * 1000:.1f} ms")
        return True

    # ------------------------------------------------------------------ statements

    def _statement(self, sql: str) -> None:
        self._catalog = None
        words = re.findall(r"\w+", sql.upper())
        gone_before = self._handles() if words[:2] == ["DROP", "STREAM"] else set()
        if words[:1] == ["SELECT"]:
            announce_large(self.backend, sql)
        with self._whole():
            answer = self.backend.execute(sql)
        if isinstance(answer, str):
            self.last_handle = answer
            self._say(answer)
        elif isinstance(answer, Result):
            if words[:1] == ["DESCRIBE"] and len(answer.rows) == 1:
                first = dict(zip(answer.columns, answer.rows[0], strict=True))
                self._say(render_record(first, self.fmt))
            elif words[:2] == ["SHOW", "QUERIES"]:
                self._queries()
            else:
                key = "streams" if words[:2] == ["SHOW", "STREAMS"] else "rows"
                self._say(self._records(answer.columns, answer.rows, render_records(
                    key, answer.columns, answer.rows, self.fmt)))
        else:
            if gone_before:
                for handle in gone_before - self._handles():
                    self._forget(handle)
            self._say(" ".join(words[:2]))

    # ------------------------------------------------------------------ meta-commands

    def _meta(self, command: str) -> bool:
        name, *args = command.split()
        if name in ("\\quit", "\\q"):
            return False
        if name in _TAKES_HANDLE:
            self._on_handle(name, args)
        elif name in ("\\help", "\\format", "\\timing", "\\x", "\\o"):
            self._setting(name, args)
        elif name == "\\i":
            return self._include(_one(name, args, "FILE"))
        elif name == "\\streams":
            self._statement("SHOW STREAMS")
        elif name == "\\queries":
            self._queries()
        elif name == "\\describe":
            self._statement(f"DESCRIBE {_one(name, args, 'STREAM')}")
        elif name == "\\ingest":
            self._ingest(args)
        else:
            raise ShellError(f"unknown command {name} (\\help lists the commands)")
        return True

    def _on_handle(self, name: str, args: list[str]) -> None:
        """The meta-commands of one standing query (_TAKES_HANDLE)."""
        if name == "\\watch":
            self._watch(args)
            return
        shown = self._limit(args) if name != "\\unregister" else None
        handle = self._handle(args)
        if name == "\\invoke":
            answer = self.backend.invoke(handle)
            self._cursors[handle] = answer.cursor
            self._remember_cursor(handle, answer.cursor)
            if self.fmt != "table" and shown is not None and len(answer) > shown:
                self.warn(f"note: {len(answer):,} rows, first {shown:,} printed; "
                          "--limit 0 for all")
            rows = [(t, *r) for t, r in zip(answer.ts[:shown].tolist(), answer.rows[:shown],
                                            strict=True)]
            self._page(self._records(["ts", *answer.columns], rows,
                                     render_result(answer, self.fmt, limit=shown)))
        elif name == "\\changes":
            self._changes(handle, shown)
        else:
            with self._whole():
                self.backend.unregister(handle)
            self._forget(handle)
            self._say(f"unregistered {handle}")

    @contextlib.contextmanager
    def _whole(self) -> Iterator[None]:
        """Hold Ctrl-C back until the block ends: a statement or an unregistration cut
        short would leave the catalog changed with nothing said (a query registered,
        its handle never printed), and an engine or a connection in an unknown state."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        pressed: list[int] = []

        def hold(signum: int, frame: object) -> None:
            if not pressed:
                self.warn("note: finishing this command; it cannot stop half way")
            pressed.append(signum)

        before = signal.signal(signal.SIGINT, hold)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, before)

    def _records(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                 text: str) -> str:
        """`text`, a table of `rows` with its footer, or with `\\x` on the same rows as
        records: a `-[ RECORD n ]-` line, then one `column  value` line per column."""
        if not self.expanded or self.fmt != "table":
            return text
        blocks = [f"-[ RECORD {n} ]-" + "\n" + render_record(
            dict(zip(columns, row, strict=True)), "table") for n, row in enumerate(rows, 1)]
        return "\n".join([*blocks, text.rsplit("\n", 1)[-1]])

    def _limit(self, args: list[str]) -> int | None:
        """The most rows to print (None: all), as `psoup invoke` decides it; takes a
        `--limit N` out of `args`."""

        if "--limit" not in args:
            return DEFAULT_LIMIT if self.fmt == "table" and self.terminal else None
        at = args.index("--limit")
        if at + 1 == len(args) or not args[at + 1].isdigit():
            raise ShellError("--limit takes a number of rows (0: all)")
        limit = int(args[at + 1])
        del args[at:at + 2]
        return limit or None

    def _page(self, text: str) -> None:
        """Print `text`, through a pager when it is a table taller than the terminal."""
        if (self.fmt == "table" and self.terminal and self.out is None and
                text.count("\n") + 2 > shutil.get_terminal_size().lines):
            click.echo_via_pager(text + "\n")
        else:
            self._say(text)

    def _setting(self, name: str, args: list[str]) -> None:
        """\\help, and the session's settings: \\format and \\timing."""
        if name == "\\help":
            self.echo(HELP.format(fmt=self.fmt, timing="on" if self.timing else "off",
                                  expanded="on" if self.expanded else "off"))
        elif name == "\\format":
            fmt = _one(name, args, "|".join(FORMATS))
            if fmt not in FORMATS:
                raise ShellError(f"unknown format {fmt!r} (formats: {', '.join(FORMATS)})")
            self.fmt = fmt
            self.echo(f"format {fmt}")
        elif name == "\\o":
            self._output(args)
        elif name == "\\x":
            self.expanded = not self.expanded
            self.echo(f"expanded display {'on' if self.expanded else 'off'}")
        else:
            self.timing = not self.timing
            self.echo(f"timing {'on' if self.timing else 'off'}")

    def _output(self, args: list[str]) -> None:
        """\\o FILE: answers and tables go to FILE (emptied first); \\o: back here."""
        if len(args) > 1:
            raise ShellError("usage: \\o [FILE]")
        opened = contextlib.ExitStack()
        out = _opened_for_writing(args[0], opened) if args else None
        self.close()
        self.out, self._opened = out, opened
        self.echo(f"output to {args[0]}" if args else "output here")

    def _include(self, path: str) -> bool:
        """\\i FILE: run the commands in FILE; False when one of them is `\\quit`."""
        if self._depth >= _MAX_DEPTH:
            raise ShellError(f"\\i nested {_MAX_DEPTH} deep: does a file include itself?")
        with open(os.path.expanduser(path)) as script:
            self._depth += 1
            try:
                return self.run(iter(script))
            finally:
                self._depth -= 1

    def _queries(self) -> None:
        names = self._names()
        by_handle = {e["handle"]: n for n, e in names.items()}
        rows = [(by_handle.get(h, ""), h, sql) for h, sql in self.backend.queries()]
        if self.fmt == "table":
            shown = [(n, h, one_line(sql)) for n, h, sql in rows]
            self._say(self._records(["name", "handle", "sql"], rows, table(
                ["name", "handle", "sql"], shown) + f"\n({len(rows)} standing "
                f"quer{'y' if len(rows) == 1 else 'ies'})"))
        else:
            self._say(render_records("queries", ["name", "handle", "sql"], rows, self.fmt))

    def _changes(self, handle: str, shown: int | None) -> None:
        from psoup.cli.polling import changes_since

        changes, reason = changes_since(self.backend, handle, self._cursor(handle), None)
        self._cursors[handle] = changes.cursor
        self._remember_cursor(handle, changes.cursor)
        if reason is not None and self.fmt == "table":
            self.warn(f"note: {reason}; showing the whole answer as inserted rows")
        rows = [(mark, t, *r) for mark, part in (("+", changes.inserted), ("-", changes.deleted))
                for t, r in zip(part.ts.tolist(), part.rows, strict=True)][:shown]
        self._page(self._records(["change", "ts", *changes.columns], rows, render_changes(
            changes, self.fmt, reset=reason is not None, limit=shown)))

    def _watch(self, args: list[str]) -> None:
        from psoup.cli.polling import Interval, changes_since

        every = 2.0
        if args and re.fullmatch(r"[\d.]+(ms|s|m|h|d)?", args[-1]):
            every = Interval().convert(args.pop(), None, None)
        handle = self._handle(args)
        answer: Result | Changes = self.backend.invoke(handle)
        first = True
        try:
            while True:
                self._cursors[handle] = answer.cursor
                self._say(render_poll(answer, self.fmt, time.time(), first=first))
                first = False
                time.sleep(every)
                answer, reason = changes_since(self.backend, handle, answer.cursor, None)
                if reason is not None and self.fmt == "table":
                    self.warn(f"note: {reason}; the next rows are the whole answer")
        except KeyboardInterrupt:
            self.echo("")
        finally:
            self._remember_cursor(handle, answer.cursor)

    def _ingest(self, args: list[str]) -> None:
        """\\ingest STREAM FILE [--ts-column COL], as `psoup ingest`: the file's columns
        are checked against the stream's before any row is sent."""
        from psoup.cli import ingest as ingesting
        from psoup.formats import guess_format

        ts_column = "ts"
        if args[2:3] == ["--ts-column"] and len(args) == 4:
            ts_column = args.pop()
            args.pop()
        if len(args) != 2:
            raise ShellError("usage: \\ingest STREAM FILE [--ts-column COL]")
        stream, path = args
        try:
            fmt = guess_format(path)
        except ValueError as exc:
            raise ShellError(str(exc)) from None
        self._catalog = None
        declared = self.backend.stats()["streams"].get(stream, {}).get("columns")
        report = ingesting.ingest(self.backend, stream,
                                  ingesting.read_batches(path, fmt, 50_000, declared),
                                  ts_column=ts_column, ts_required=ts_column != "ts",
                                  declared=None if declared is None else set(declared))
        self._say(f"{report.rows:,} row{'' if report.rows == 1 else 's'} into {stream} "
                  f"({report.rate:,.0f} rows/s)")

    # ------------------------------------------------------------------ handles

    def _handle(self, args: list[str]) -> str:
        """The handle `args` name: a handle, a name of the handle store on this server,
        or, without arguments, the query registered last in this session."""
        if len(args) > 1:
            raise ShellError(f"too many arguments: {' '.join(args)}")
        if not args:
            if self.last_handle is None:
                raise ShellError("no query registered in this session yet: name a handle")
            return self.last_handle
        entry = self._names().get(args[0])
        if entry is not None:
            return str(entry["handle"])
        elsewhere = HandleStore().lookup(args[0])
        if elsewhere is not None and elsewhere["server"] != self.server:
            here = f"the server at {self.server}" if self.server else "an embedded engine"
            raise ShellError(f"'{args[0]}' names a handle on the server at "
                             f"{elsewhere['server']}, and this shell talks to {here} "
                             f"(psoup shell --server {elsewhere['server']})")
        return args[0]

    def _handles(self) -> set[str]:
        return {handle for handle, _ in self.backend.queries()}

    def _names(self) -> dict[str, dict[str, Any]]:
        if self.server is None:
            return {}
        return {n: e for n, e in HandleStore().names().items() if e["server"] == self.server}

    def _cursor(self, handle: str) -> str | None:
        if self.server is None:
            return self._cursors.get(handle)
        return HandleStore().cursor(self.server, handle)

    def _remember_cursor(self, handle: str, cursor: str | None) -> None:
        if self.server is not None:
            HandleStore().set_cursor(self.server, handle, cursor)

    def _forget(self, handle: str) -> None:
        self._cursors.pop(handle, None)
        if self.last_handle == handle:
            self.last_handle = None
        if self.server is not None:
            HandleStore().forget_handle(self.server, handle)

    # ------------------------------------------------------------------ completion

    def candidates(self, line: str, word: str) -> list[str]:
        """What TAB offers for `word`, the last word of `line`: meta-commands; stream
        names where a stream goes (after FROM, DESCRIBE, DROP STREAM, \\describe,
        \\ingest); file names after `\\ingest STREAM`, `\\i` and `\\o`; column names
        (of the streams the statement names, if any) and keywords (in the case the word
        is typed in) elsewhere in a statement; handles and names after the meta-commands
        that take one.

        Example:
            >>> from psoup import Engine
            >>> s = Session(Engine(), None, print, print)
            >>> s.run_one("CREATE STREAM traffic (lane INT, speed FLOAT, trend TEXT);")
            CREATE STREAM
            True
            >>> s.candidates("SELECT sp", "sp"), s.candidates("select * fr", "fr")
            (['speed'], ['from'])
            >>> s.candidates("SELECT speed FROM tr", "tr"), s.candidates("\\\\describe t", "t")
            (['traffic'], ['traffic'])
            >>> s.candidates("SELECT * FROM traffic WHERE tr", "tr")
            ['trend', 'true']
        """
        head = line.split()[0] if line.split() else ""
        if line.startswith("\\") and (line == word or " " not in line):
            names: list[str] = list(_META)
        elif len(line.split()) - (line[-1:] != " ") >= _FILE_AFTER.get(head, 99):
            return _paths(word)
        elif head in _TAKES_STREAM:
            names = list(self._streams())
        elif head in _TAKES_HANDLE:
            names = sorted(self._names()) + sorted(self._handles())
        elif line.startswith("\\"):
            names = list(FORMATS) if head == "\\format" else []
        else:
            names = self._in_statement(line[:len(line) - len(word)], word)
        return sorted({n for n in names if n.startswith(word)} or
                      {n for n in names if n.lower().startswith(word.lower())})

    def _in_statement(self, before: str, word: str) -> list[str]:
        """The names that may come next in a statement after the text `before`."""
        words = re.findall(r"\w+|,", before)
        upper = [w.upper() for w in words]
        streams = self._streams()
        clauses = [w for w in upper if w in _CLAUSES]
        in_from = clauses[-1:] == ["FROM"] and upper[-1:] in (["FROM"], [","])
        if in_from or upper[-1:] == ["DESCRIBE"] or upper[-2:] == ["DROP", "STREAM"]:
            return list(streams)
        if upper[-2:] == ["CREATE", "STREAM"]:
            return []
        named = [streams[w] for w in words if w in streams] or list(streams.values())
        columns = sorted({c for cols in named for c in cols} | {"ts", "tupleID"})
        keywords = [k if word[:1].isupper() or not word else k.lower() for k in KEYWORDS]
        return columns + keywords

    def _streams(self) -> dict[str, list[str]]:
        """stream -> column names, from SHOW STREAMS, cached until the next statement."""
        if self._catalog is None:
            shown = self.backend.execute("SHOW STREAMS")
            self._catalog = {row[0]: [c.split()[0] for c in row[1].split(",") if c.strip()]
                             for row in shown.rows}
        return self._catalog


def statements(lines: Iterator[str]) -> Iterator[str]:
    """Group input lines into commands: a meta-command is one line starting with `\\`
    (or `help`, `quit` or `exit` alone), a statement runs to the `;` that ends a line
    (its lines joined by newlines).

    Example:
        >>> list(statements(iter(["SHOW", "STREAMS;", "\\\\timing", "", "DESCRIBE R;"])))
        ['SHOW\\nSTREAMS;', '\\\\timing', 'DESCRIBE R;']
        >>> list(statements(iter(["help", "exit;"])))
        ['\\\\help', '\\\\quit']
    """
    pending: list[str] = []
    for line in lines:
        text = line.strip()
        if not pending and (not text or text.startswith("--")):
            continue
        if not pending and (bare := bare_command(text)) is not None:
            yield bare
            continue
        if not pending and text.startswith("\\"):
            yield text
            continue
        pending.append(line.rstrip())
        if text.endswith(";"):
            yield "\n".join(pending).strip()
            pending = []
    if pending and "".join(pending).strip():
        yield "\n".join(pending).strip()


def caret(statement: str, message: str) -> list[str]:
    """The line of `statement` an error `message` ("line L, column C: ...") points at,
    and a caret under that column; nothing when the message names no position.

    Example:
        >>> print("\\n".join(caret("SELECT a\\n FROM nowhere;", "line 2, column 7: unknown")))
         FROM nowhere;
              ^
    """
    found = re.match(r"line (\d+), column (\d+): ", message)
    lines = statement.split("\n")
    if found is None or not 0 < int(found[1]) <= len(lines):
        return []
    text = lines[int(found[1]) - 1]
    before = text[:int(found[2]) - 1]
    return [text, "".join(c if c == "\t" else " " for c in before) + "^"]


def bare_command(text: str) -> str | None:
    """The meta-command a line of `help`, `quit` or `exit` (any case, `;` or not) means.

    Example:
        >>> bare_command("Quit;"), bare_command("quit now")
        ('\\\\quit', None)
    """
    return _BARE.get(text.strip().rstrip(";").strip().lower())


def history_path() -> Path:
    """The shell's history file, in the user's psoup config directory."""
    return config_dir() / "shell_history"


def interactive(session: Session, prompt: str = "psoup> ",
                more: str = "   ...> ") -> None:
    """Read commands with GNU readline at `prompt` (`more` inside a statement), with
    completion and a history kept across sessions, until `\\quit` or Ctrl-D."""
    import readline

    path = history_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(1000)
    readline.set_completer_delims(" \t\n,()=<>;")
    readline.set_completer(_completer(session, readline))
    bind = "bind ^I rl_complete" if "libedit" in (readline.__doc__ or "") else "tab: complete"
    readline.parse_and_bind(bind)
    try:
        session.run(_prompted(readline, prompt, more))
    finally:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
        os.chmod(path, 0o600)
        readline.write_history_file(path)


def _prompted(readline: Any, prompt: str, more: str) -> Iterator[str]:
    """Lines typed at the prompt; a statement of several lines goes into the history as
    one entry, and Ctrl-C drops the statement being typed."""
    started = readline.get_current_history_length()
    pending: list[str] = []
    while True:
        try:
            typed = input(more if pending else prompt)
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print("^C")
            pending = []
            started = readline.get_current_history_length()
            continue
        for line in typed.split("\n"):         # a bracketed paste arrives as one "line"
            text = line.strip()
            if not pending and (text.startswith("\\") or not text or bare_command(text)):
                yield line
                started = readline.get_current_history_length()
                continue
            pending.append(line)
            if text.endswith(";"):
                now = readline.get_current_history_length()
                if now - started > 1:
                    for _ in range(now - started):
                        readline.remove_history_item(started)
                    readline.add_history(" ".join(p.strip() for p in pending))
                started = readline.get_current_history_length()
                yield from pending
                pending = []


def _completer(session: Session, readline: Any) -> Callable[[str, int], str | None]:
    found: list[str] = []

    def complete(word: str, state: int) -> str | None:
        if state == 0:
            line = readline.get_line_buffer()[:readline.get_endidx()]
            try:
                found[:] = session.candidates(line, word)
            except Exception:       # a completion must never end the shell
                found[:] = []
            if len(found) == 1 and not found[0].endswith("/"):
                found[0] += " "         # a directory's name goes on with a file's
        return found[state] if state < len(found) else None

    return complete


def _opened_for_writing(path: str, stack: contextlib.ExitStack[Any]) -> IO[str]:
    """`path` (`~` expanded) emptied and open for writing until `stack` closes."""
    return stack.enter_context(open(os.path.expanduser(path), "w"))


def _paths(word: str) -> list[str]:
    """The files and directories (these ending in `/`) whose names start with `word`."""
    found = []
    for path in glob.glob(glob.escape(os.path.expanduser(word)) + "*"):
        shown = word + path[len(os.path.expanduser(word)):]
        found.append(shown + "/" if os.path.isdir(path) else shown)
    return sorted(found)


def _one(name: str, args: list[str], what: str) -> str:
    return _exactly(name, args, what)[0]


def _exactly(name: str, args: list[str], what: str) -> list[str]:
    if len(args) != len(what.split()):
        raise ShellError(f"usage: {name} {what}")
    return args


def run_shell(backend: Any, server: str | None, where: str, stdin: TextIO | None = None,
              commands: tuple[str, ...] = (), script: IO[str] | None = None) -> int:
    """Run a shell on `backend`: the `commands` (each one statement or meta-command),
    then the `script`, when there are any; else interactive on a terminal, else a script
    from `stdin` (default: the process's). `where` names the backend in the banner.

    Returns:
        The exit code: 0, or 1 when a command of a script failed.
    """
    stdin = stdin or sys.stdin
    with contextlib.closing(Session(backend, server, click.echo, _warn)) as session:
        return _run_session(session, stdin, where, commands, script)


def _run_session(session: Session, stdin: TextIO, where: str, commands: tuple[str, ...],
                 script: IO[str] | None) -> int:
    if commands or script is not None:
        for command in commands:
            session.run(iter(command.splitlines()))
        if script is not None:
            session.run(iter(script))
        return 1 if session.failures else 0
    if stdin.isatty() and sys.stdout.isatty():
        session.terminal = True
        click.echo(f"psoup shell on {where}; statements end with ';', \\help for help, "
                   "Ctrl-D leaves")
        interactive(session)
        return 0
    session.run(iter(stdin))
    return 1 if session.failures else 0


def _warn(line: str) -> None:
    click.echo(line, err=True)
