"""The `psoup` command: thin click commands that call the library.

PSoup's clients register a standing query, disconnect, and invoke its handle later
(Sect. 1); these commands are that client on a shell. `serve` runs the service;
`stream create|list|describe|drop`, `ingest`, `register`, `invoke`, `watch`,
`unregister`, `queries`, `show` and `stats` talk to it through `psoup.client.Client`;
`demo` runs the embedded engine; `shell` (`psoup.cli.shell`, imported only when it
runs) is an interactive session with either.
Names given to handles and each handle's last cursor live in the handle store
(`psoup.cli.handles`), so `psoup invoke slow-lane3 --changes` works from a new shell.

Exit codes: 0 success, 1 an error the server reported or a failed connection (one line
on stderr, no traceback), 2 a usage error (click's own), 130 an ingest interrupted by
Ctrl-C (one line saying what is stored).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial, wraps
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from psoup.cli.handles import HandleStore, HandleStoreError, name_taken
from psoup.cli.output import (
    DEFAULT_LIMIT,
    FORMATS,
    iso_times,
    one_line,
    render_changes,
    render_poll,
    render_record,
    render_records,
    render_result,
    render_stats,
    table,
    to_json,
)
from psoup.cli.polling import Interval, changes_since
from psoup.cli.progress import Progress, announce_large
from psoup.cli.typed import Typed
from psoup.client import TOKEN_ADVICE, Client, ConnectionFailed, OutcomeUnknown
from psoup.config import DEFAULT_HOST, DEFAULT_PORT, REPLAY_SLICE_ROWS, parse_address
from psoup.errors import PSoupError, QueryError, ReplayError, UnknownHandle
from psoup.formats import ALIASES, TS_UNITS, input_format
from psoup.formats import FORMATS as INPUT_FORMATS
from psoup.options import MODE_NAMES, SYNC_NAMES, ModeName, SyncName
from psoup.results.result import Changes, Result
from psoup.server.protocol import ErrorCode
from psoup.version import __version__

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*\Z")

if TYPE_CHECKING:   # the ingest module (pyarrow) is imported only by the commands using it
    from psoup.cli.ingest import IngestError, IngestInterrupted, IngestReport, Position, ResumeFile

if TYPE_CHECKING:   # generic from click 8.4 on; the package allows click 8.1
    _IntType = click.ParamType[int]
    _FloatType = click.ParamType[float]
else:
    _IntType = _FloatType = click.ParamType


class Failure(click.ClickException):
    """An expected error: printed as one line, "error: ...", on stderr; exit code 1.
    Timestamps in it ("ts 1767225600.0") are shown in UTC as the tables show them."""

    exit_code = 1

    def __init__(self, message: str):
        super().__init__(iso_times(" ".join(str(message).split())))

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


class ByteSize(_IntType):
    """A number of bytes: 1000000, 512M, 512MB, 2GiB (K, M, G, T are powers of 1,024).

    Example:
        >>> ByteSize().convert("2GiB", None, None), ByteSize().convert("1500", None, None)
        (2147483648, 1500)
        >>> ByteSize(zero=True).convert("0", None, None)
        0
    """

    name = "bytes"
    _FORM = re.compile(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*\Z", re.IGNORECASE)

    def __init__(self, zero: bool = False):
        self.zero = zero            # whether 0 is a size (an option that 0 turns off)

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        match = self._FORM.match(str(value))
        if not match or int(match[1]) < (0 if self.zero else 1):
            kind = "a" if self.zero else "a positive"
            self.fail(f"{value!r} is not {kind} size in bytes (e.g. 1000000, 512M, 2GiB)",
                      param, ctx)
        return int(match[1]) << (10 * " KMGT".index(match[2].upper() or " "))


@dataclass
class Settings:
    """The group's options: where the server is and how to authenticate."""

    server: str
    token: str | None


@dataclass
class Target:
    """What HANDLE|NAME on the command line refers to."""

    server: str
    handle: str
    name: str | None


class Instant(_FloatType):
    """A point in time: seconds since the epoch, or an ISO 8601 date-time (UTC unless it
    carries an offset)."""

    name = "time"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            return float(value)
        except ValueError:
            pass
        try:
            from psoup.query.timeparse import timestamp_seconds
            return timestamp_seconds(str(value))
        except ValueError:
            self.fail(f"{value!r} is neither seconds since the epoch nor an ISO 8601 "
                      "date-time", param, ctx)


class _Group(click.Group):
    """A group whose commands' expected errors (psoup's own, and the operating system's:
    a full disk, a missing permission) end as one line on stderr and exit code 1; a
    closed stdout (a pipe into `head`) ends a command quietly with exit code 0; with
    no command on a terminal, `psoup` is `psoup shell`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and sys.stdin.isatty() and sys.stdout.isatty():
            args = ["shell"]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # the reader went away (`psoup watch ... | head`): that ends the command, and
            # what is still buffered for stdout goes nowhere instead of into a traceback
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(0) from None
        except PSoupError as exc:
            raise Failure(str(exc)) from None
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise Failure(f"{exc.strerror or exc}{where}") from None


def _address(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        host, port = parse_address(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return f"{host}:{port}"


# ---------------------------------------------------------------------- the group

@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="psoup")
@click.option("--server", metavar="HOST:PORT", envvar="PSOUP_SERVER",
              default=f"{DEFAULT_HOST}:{DEFAULT_PORT}", show_default=True, callback=_address,
              help="The psoup server to talk to (or set PSOUP_SERVER).")
@click.option("--token", envvar="PSOUP_TOKEN", default=None,
              help="The server's access token (or set PSOUP_TOKEN); by default the token "
                   "file a server on this machine writes.")
@click.pass_context
def main(ctx: click.Context, server: str, token: str | None) -> None:
    """psoup: register standing queries over streams, disconnect, and invoke them later.

    \b
    psoup serve --data-dir state/
    psoup stream create traffic "lane INT, stationid INT, speed FLOAT" --retain "1 hour"
    psoup ingest traffic readings.csv
    psoup register "SELECT stationid, speed FROM traffic WHERE lane = 3 AND speed < 20
                    BEGIN NOW - 10 MINUTES END NOW" --name slow-lane3
    psoup invoke slow-lane3 --changes        # days later, from a new shell
    """
    ctx.obj = Settings(server, token)


#: `--threads` of the commands that run an engine (`Engine`'s threads).
_threads_option = click.option(
    "--threads", type=click.IntRange(1), default=None, metavar="N",
    help="Threads a large batch's probe is split over (default: the cores this process "
         "may run on; 1: one thread).")


#: --spark-env FILE of the commands that start Spark (`_spark_env`: its settings).
_spark_env_option = click.option(
    "--spark-env", "spark_env", default=None, metavar="FILE",
    callback=lambda ctx, param, value: _spark_env(param, value),
    help="A packed environment (`psoup spark pack-env`) whose Python a cluster's "
         "executors run, for workers without psoup's dependencies.")


@main.command()
@click.option("--mode", type=click.Choice(MODE_NAMES), default="partial",
              show_default=True, help="Engine mode: PSoup-P, PSoup-C or NoMat.")
@click.option("--rows", type=click.IntRange(100, 10_000_000), default=20_000, show_default=True,
              help="Traffic readings per phase of the demo.")
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the synthetic trace.")
@click.option("--write-samples", "samples", type=click.Path(file_okay=False, path_type=Path),
              default=None, metavar="DIR",
              help="Instead, write the docs' sample files into DIR: readings.csv (the last "
                   "10 minutes) and old/DAY.csv (the 2 days before today).")
@_threads_option
def demo(mode: ModeName, rows: int, seed: int, samples: Path | None,
         threads: int | None) -> None:
    """Run the embedded engine on a synthetic traffic trace; no server needed.

    Registers sliding, landmark and snapshot queries, ingests readings, "disconnects"
    while more data arrives, then invokes every handle and prints the answers.
    """
    if samples is not None:
        from psoup.cli.demo import write_samples
        for path in write_samples(samples, seed=seed):
            click.echo(f"wrote {path}")
        return
    from psoup.cli.demo import run_demo
    run_demo(mode=mode, rows=rows, seed=seed, echo=click.echo, threads=threads)


def _optional_address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else _address(ctx, param, value)


@main.command()
@click.option("--server", "server", metavar="HOST:PORT", default=None,
              callback=_optional_address,
              help="The psoup server to talk to, as `psoup --server` (or PSOUP_SERVER).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run an embedded engine on this state directory (one no server has "
                   "open) instead of talking to a server.")
@click.option("--in-memory", is_flag=True,
              help="Run an embedded engine in memory for the session, even when a server "
                   "answers at the default address.")
@click.option("--mode", type=click.Choice(MODE_NAMES), default="partial", show_default=True,
              help="The embedded engine's mode: PSoup-P, PSoup-C or NoMat.")
@click.option("-c", "--command", "commands", multiple=True, metavar="STATEMENT",
              help="Run this statement or meta-command, then leave (repeatable).")
@click.option("-f", "--file", "script", type=click.File("r"), default=None, metavar="FILE",
              help="Run the statements and meta-commands in FILE, then leave.")
@_threads_option
@click.pass_context
def shell(ctx: click.Context, server: str | None, data_dir: Path | None, in_memory: bool,
          mode: ModeName, commands: tuple[str, ...], script: IO[str] | None,
          threads: int | None) -> None:
    """An interactive session: statements end with ';' (a SELECT prints its handle),
    meta-commands such as \\invoke, \\watch and \\streams start with a backslash
    (\\help lists them). It talks to the server every other command would use
    (--server, PSOUP_SERVER, else the default address if a server answers there) and
    says which on start; with none, to an in-memory engine. Without a terminal, or with
    -c or -f, it runs those commands (or the script on stdin) and leaves."""
    from psoup.cli.shell import run_shell

    settings: Settings = ctx.obj
    server, where = _shell_backend(ctx, server, data_dir, in_memory)
    if server is not None:
        with _connected(server, settings.token) as client:
            code = run_shell(client, server, where, commands=commands, script=script)
    else:
        from psoup.engine import Engine

        with Engine(path=None if data_dir is None else str(data_dir), mode=mode,
                    threads=threads) as engine:
            code = run_shell(engine, None, where, commands=commands, script=script)
    ctx.exit(code)


def _shell_backend(ctx: click.Context, server: str | None, data_dir: Path | None,
                   in_memory: bool) -> tuple[str | None, str]:
    """The server the shell talks to (None: an embedded engine), and how its banner
    names it: the shell's --server, else psoup --server or PSOUP_SERVER, else the
    default address when a server answers there."""
    settings: Settings = ctx.obj
    if server is None and ctx.find_root().get_parameter_source("server") in (
            ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
        server = settings.server
    if (server is not None) + (data_dir is not None) + in_memory > 1:
        raise click.UsageError("pass one of --server (or PSOUP_SERVER), --data-dir and "
                               "--in-memory")
    if data_dir is not None:
        return None, str(data_dir)
    if in_memory:
        return None, "an in-memory engine"
    if server is not None:
        return server, f"the server at {server}"
    if _answers(settings.server, settings.token):
        return settings.server, f"the server at {settings.server}"
    return None, f"an in-memory engine (no server answers at {settings.server})"


def _answers(server: str, token: str | None) -> bool:
    """Whether a psoup server listens at `server`; one that refuses this client counts
    (connecting again then says why)."""
    try:
        Client(server, token=token, timeout=5.0).close()
    except ConnectionFailed:
        return False
    except PSoupError:
        pass            # it answered, and refused: connecting again says why
    return True


# ---------------------------------------------------------------------- the service

@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep durable state (write-ahead log, Parquet archive) here; without "
                   "it the server holds everything in memory only.")
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT,
              show_default=True, help="The port to listen on (0 picks a free one).")
@click.option("--mode", type=click.Choice(MODE_NAMES), default="partial", show_default=True,
              help="Engine mode: PSoup-P, PSoup-C or NoMat.")
@click.option("--sync", type=click.Choice(SYNC_NAMES), default="group", show_default=True,
              help="When the log reaches the disk: every write, once per group of "
                   "writes, or when the OS decides.")
@click.option("--max-queries", type=click.IntRange(1), default=None,
              help="Refuse registrations beyond this many standing queries (default: no "
                   "limit).")
@click.option("--max-stream-bytes", type=ByteSize(), default=None,
              help="Refuse batches that would make a stream retain more than this, e.g. "
                   "2GiB (default: no limit).")
@click.option("--max-results-bytes", type=ByteSize(), default=None,
              help="Refuse registrations that could take the results memory past this, "
                   "e.g. 4GiB (default: no limit).")
@click.option("--max-queued-bytes", type=ByteSize(), default=None,
              help="Inserts received and not yet applied that the server holds before it "
                   "answers busy (the client waits and sends again), e.g. 512MiB "
                   "(default: 256MiB).")
@click.option("--spark-master", default=None, metavar="URL",
              help="The Spark master of history jobs (default local[*]); clients cannot "
                   "choose it.")
@click.option("--spark-conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
              callback=lambda ctx, param, value: _spark_conf(param, value),
              help="A Spark setting of history jobs (repeatable), over spark-defaults.conf "
                   "and PSOUP_SPARK_CONF.")
@_spark_env_option
@click.option("--archive-budget", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS",
              help="How long a history job may read the archive: beyond it, the job reads "
                   "the largest uniform sample that fits, and answers state their sample "
                   "rate (default: read it all).")
@click.option("--answer-cache-bytes", type=ByteSize(zero=True), default="64MiB",
              show_default=True,
              help="Memory for each selection query's last answer (one that is a small "
                   "part of a large window), so that its next poll reads only the tuples "
                   "that arrived since (0 keeps none).")
@click.option("--token", "token_option", default=None,
              help="The access token clients must present (default: psoup --token, "
                   "PSOUP_TOKEN, the token saved in --data-dir, or a new one).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="warning", show_default=True,
              help="What the server logs on stderr: warning (refused connections, "
                   "timeouts), info (also every failed request and lost connection), "
                   "debug (also every request).")
@_threads_option
@click.option("--fronts", type=click.IntRange(0), default=None, metavar="N",
              help="Front processes that take the connections' socket work and relay "
                   "them to the server's process (default: 1 with more than one "
                   "thread and no --replicas, else 0; a front adds a few tens of "
                   "microseconds to a round trip).")
@click.option("--replicas", type=click.IntRange(0), default=0, show_default=True,
              metavar="N",
              help="Read replica processes, each holding a copy of the state and "
                   "answering the reads of its share of the connections (writes go to "
                   "the server's process). Each costs as much memory as the state and "
                   "applies every write again: for read-heavy loads.")
@click.pass_obj
def serve(settings: Settings, data_dir: Path | None, host: str, port: int, mode: ModeName,
          sync: SyncName, max_queries: int | None, max_stream_bytes: int | None,
          max_results_bytes: int | None, max_queued_bytes: int | None,
          spark_master: str | None, spark_conf: dict[str, str],
          spark_env: dict[str, str] | None, archive_budget: float | None,
          answer_cache_bytes: int, token_option: str | None, log_level: str,
          threads: int | None, fronts: int | None, replicas: int) -> None:
    """Run the psoup service until Ctrl-C or SIGTERM.

    Without --token (or PSOUP_TOKEN) the server generates an access token and leaves it,
    readable by you only, where `psoup` commands on this machine find it. A server that
    cannot start (the port is taken) leaves no new --data-dir behind.
    """
    import logging

    from psoup.server import Limits, run_server

    logger = logging.getLogger("psoup")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(log_level.upper())

    spark_conf = _with_env(spark_conf, spark_env)
    try:
        run_server(data_dir=data_dir, host=host, port=port,
                   token=token_option or settings.token, mode=mode,
                   sync=sync, limits=Limits(max_queries=max_queries,
                                            max_stream_bytes=max_stream_bytes,
                                            max_results_bytes=max_results_bytes,
                                            **({} if max_queued_bytes is None else
                                               {"max_queued_bytes": max_queued_bytes})),
                   spark_master=spark_master, spark_conf=spark_conf, echo=click.echo,
                   archive_budget=archive_budget, answer_cache_bytes=answer_cache_bytes,
                   threads=threads, fronts=fronts, replicas=replicas)
    except OSError as exc:
        raise Failure(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


@main.group()
def stream() -> None:
    """Declare, list, describe and drop the streams that producers ingest into."""


@stream.command("create")
@click.argument("name")
@click.argument("columns")
@click.option("--retain", metavar="SPAN", default=None,
              help='Keep only this much of the stream: "1 hour", "7 days", "100000 rows". '
                   "Without it everything is kept.")
@click.pass_obj
def stream_create(settings: Settings, name: str, columns: str, retain: str | None) -> None:
    """Create stream NAME with COLUMNS, e.g. "lane INT, stationid INT, speed FLOAT".

    Column types are INT, FLOAT, TEXT and BOOL; every tuple also gets a timestamp.
    """
    typed = Typed([(None, "CREATE STREAM "), ("NAME", name), (None, " ("), ("COLUMNS", columns),
                   (None, ")")] + ([(None, " RETAIN "), ("--retain", retain)] if retain else []))
    with _connected(settings.server, settings.token) as client:
        try:
            client.execute(typed.sql)
        except QueryError as exc:
            raise Failure(typed.explain(str(exc))) from None
    click.echo(f"created stream {name} ({columns})" + (f", retaining {retain}" if retain else ""))


@stream.command("list")
@click.option("-o", "--format", "fmt", type=click.Choice(FORMATS), default="table",
              show_default=True,
              help="table for people; csv and json for scripts.")
@click.pass_obj
def stream_list(settings: Settings, fmt: str) -> None:
    """List the streams: columns, retention, rows retained and ever inserted, latest ts,
    and how many standing queries read each (SHOW STREAMS)."""
    with _connected(settings.server, settings.token) as client:
        streams = client.execute("SHOW STREAMS")
    assert isinstance(streams, Result), "SHOW STREAMS answers with a table"
    columns, rows = _sourced(streams.columns, streams.rows)
    click.echo(render_records("streams", columns, rows, fmt))


#: SHOW STREAMS' columns about a stream's Spark source (NULL for other streams).
_SOURCE_COLUMNS = ("source", "source_state", "source_batches")


def _sourced(columns: list[str], rows: list[tuple[Any, ...]]
             ) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The catalog without its source columns when no stream has a source: streams fed
    by inserts list as they did before sources existed."""
    if any(row[columns.index("source")] is not None for row in rows):
        return columns, rows
    keep = [i for i, c in enumerate(columns) if c not in _SOURCE_COLUMNS]
    return [columns[i] for i in keep], [tuple(row[i] for i in keep) for row in rows]


@stream.command("describe")
@click.argument("name")
@click.option("-o", "--format", "fmt", type=click.Choice(FORMATS), default="table",
              show_default=True,
              help="table for people; csv and json for scripts.")
@click.pass_obj
def stream_describe(settings: Settings, name: str, fmt: str) -> None:
    """Show stream NAME: its columns, retention, rows, latest ts and queries (DESCRIBE)."""
    with _connected(settings.server, settings.token) as client:
        record = client.describe(name)
    if record.get("source") is None:
        record = {k: v for k, v in record.items() if k not in _SOURCE_COLUMNS}
    click.echo(render_record(record, fmt))


@stream.command("drop")
@click.argument("name")
@click.option("--cascade", is_flag=True,
              help="Unregister the standing queries that read the stream too; without it a "
                   "stream some query reads is refused, and the error names the queries.")
@click.pass_obj
def stream_drop(settings: Settings, name: str, cascade: bool) -> None:
    """Drop stream NAME: its tuples, in memory and archived, are gone; a stream created
    again under the name starts empty (DROP STREAM)."""
    store = HandleStore()
    with _connected(settings.server, settings.token) as client:
        before = {handle for handle, _ in client.queries()}
        try:
            client.drop_stream(name, cascade)
        except QueryError as exc:
            raise Failure(str(exc).replace(f"drop_stream({name!r}, cascade=True)",
                                           "--cascade")) from None
        gone = before - {handle for handle, _ in client.queries()}
    for handle in gone:
        store.forget_handle(settings.server, handle)
    took = f" and {len(gone)} standing quer{'y' if len(gone) == 1 else 'ies'}" if gone else ""
    click.echo(f"dropped stream {name}{took}")


@main.command(short_help="Append the rows of a file to a stream.")
@click.argument("stream_name", metavar="STREAM")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("-o", "--format", "fmt", type=click.Choice(INPUT_FORMATS + tuple(ALIASES)),
              default=None,
              help="The input format; by default guessed from FILE's extension (stdin: csv).")
@click.option("--batch-rows", type=click.IntRange(1, 1_000_000), default=50_000,
              show_default=True, help="Rows per insert; each batch is applied whole or not "
                                      "at all.")
@click.option("--ts-column", default="ts", show_default=True,
              help="The column holding each row's timestamp (seconds or ISO 8601); when "
                   "the file has none, the server's clock stamps each batch.")
@click.option("--ts-unit", type=click.Choice(TS_UNITS), default="s",
              show_default=True,
              help="The unit of numeric timestamps (psoup keeps seconds): a clock in "
                   "milliseconds needs ms.")
@click.option("--resume", is_flag=True,
              help="Continue an ingest of FILE that stopped (a crash, a lost server): "
                   "skip the batches the server already applied, send the rest.")
@click.pass_context
def ingest(ctx: click.Context, stream_name: str, file: str, fmt: str | None, batch_rows: int,
           ts_column: str, ts_unit: str, resume: bool) -> None:
    """Append the rows of FILE (CSV with a header, JSON lines, Parquet; - is stdin) to
    STREAM.

    Shows progress on a terminal and ends with one line: rows ingested and the rate. If
    the server rejects a batch, nothing of that batch is applied, the rows before it stay,
    and the error says how many went in and which rows the failed batch held. A batch
    whose reply is lost is sent again, and applied once; --resume continues a FILE whose
    ingest stopped, without duplicating a row. Ctrl-C waits for the reply to the batch in
    flight, says how many rows are stored and how --resume continues (exit code 130).
    """
    settings: Settings = ctx.obj
    try:
        fmt, codec = input_format(file, fmt)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="FILE") from None
    if resume and file == "-":
        raise click.BadParameter("--resume needs a named file, not stdin", param_hint="FILE")
    ts_required = ctx.get_parameter_source("ts_column") is not ParameterSource.DEFAULT
    from psoup.cli import ingest as ingesting
    try:
        with _ingest_input(file, fmt, codec) as (source, position):
            report = _ingest(settings, stream_name, file, source, fmt, batch_rows, ts_column,
                             ts_required, ts_unit, resume, position)
    except ingesting.IngestInterrupted as exc:
        state = None if file == "-" else ingesting.ResumeFile(stream_name, file, batch_rows)
        command = _resume_command(ctx) if state is not None and state.path.exists() else None
        click.echo(_interrupted(exc, file, command), err=True)
        raise click.exceptions.Exit(130) from None
    resumed = f"; {report.skipped:,} rows were already stored" if resume else ""
    click.echo(f"{report.rows:,} row{'' if report.rows == 1 else 's'} into {stream_name} "
               f"({report.rate:,.0f} rows/s){resumed}")


@contextmanager
def _ingest_input(file: str, fmt: str,
                  codec: str | None) -> Iterator[tuple[str | IO[bytes], Position]]:
    """FILE opened for `psoup ingest` (decompressed), and the `Position` that follows
    how far through it the ingest got: in bytes of the file as stored (the file's own
    position), for Parquet in rows; for stdin, of unknown size."""
    from psoup.cli import ingest as ingesting
    if file == "-":
        yield click.open_file("-", "rb"), ingesting.Position()
    elif fmt == "parquet":
        import pyarrow.parquet as pq
        yield file, ingesting.Position(pq.ParquetFile(file).metadata.num_rows)
    else:
        with open(file, "rb") as raw, ingesting.decompressed(raw, codec) as source:
            yield source, ingesting.Position(os.fstat(raw.fileno()).st_size, raw.tell)


def _ingest(settings: Settings, stream_name: str, file: str, source: str | IO[bytes],
            fmt: str, batch_rows: int, ts_column: str, ts_required: bool, ts_unit: str,
            resume: bool, position: Position) -> IngestReport:
    """`psoup ingest` once FILE is open: `position` follows how far through FILE the
    batches sent reach, for the progress line on a terminal.

    The resume state of FILE is removed when the ingest finishes or is refused (bad
    input, a rejected batch: --resume would meet the same refusal), and kept when
    --resume can continue: the server was away or busy, or Ctrl-C stopped the ingest
    once something was stored.
    """
    from psoup.cli import ingest as ingesting

    meter = ingesting.RateMeter(position.total) if _stderr_is_terminal() else None

    def progress(rows: int, seconds: float) -> None:
        assert meter is not None
        if rows == 0:                # a resumed ingest starts sending: rates from here
            meter.restart(position.done)
        else:
            click.echo(f"\r{meter.update(rows, position.done)}\x1b[K", nl=False, err=True)
    state = None if file == "-" else ingesting.ResumeFile(stream_name, file, batch_rows)
    saved = state.load() if state is not None and resume else None
    try:
        with _connected(settings.server, settings.token, batch_rows=batch_rows,
                        producer=saved["producer"] if saved else None) as client:
            skip = 0 if saved is None else ingesting.ResumeFile.resume_point(
                saved, client.last_seq())
            if state is not None and saved is None:
                state.start(client.producer)

            def applied(batches: int, rows: int) -> None:
                if state is not None:
                    state.save({"producer": client.producer, "batches": batches,
                                "next_seq": client.next_seq})

            declared = client.stats()["streams"].get(stream_name, {}).get("columns")
            report = ingesting.ingest(
                client, stream_name,
                ingesting.read_batches(source, fmt, batch_rows, declared,
                                       None if file == "-" else file, position),
                ts_column=ts_column, ts_required=ts_required,
                progress=progress if meter is not None else None, skip=skip,
                applied=applied, ts_unit=ts_unit,
                declared=None if declared is None else set(declared))
    except KeyboardInterrupt:        # before the first batch: connecting, asking the server
        raise _stopped(state, saved is None, ingesting.IngestInterrupted(
            0, exact=saved is None)) from None
    except ingesting.IngestError as exc:
        raise _stopped(state, saved is None, exc) from None
    finally:
        if meter is not None:
            click.echo("\r\033[K", nl=False, err=True)
    if state is not None:
        state.clear()
    return report


def _stopped(state: ResumeFile | None, fresh: bool, exc: IngestError) -> IngestError:
    """`exc`, which stopped an ingest, after removing the ingest's resume state
    unless --resume can continue from it: a refusal would come again, and an ingest of
    this run (`fresh`) interrupted before it stored a row leaves nothing to continue."""
    from psoup.cli import ingest as ingesting
    idle = (fresh and isinstance(exc, ingesting.IngestInterrupted)
            and exc.rows_done == 0 and exc.in_doubt is None)
    if state is not None and (not exc.resumable or idle):
        state.clear()
    return exc


def _resume_command(ctx: click.Context) -> str:
    """The command that continues the ingest `ctx` ran: the same STREAM, FILE and the
    options given that the ingest depends on, and --resume. A --token given is shown as
    TOKEN: the secret is not echoed."""
    words = ["psoup"]
    group = ctx.parent
    if group is not None:
        if group.get_parameter_source("server") is ParameterSource.COMMANDLINE:
            words += ["--server", str(group.params["server"])]
        if group.get_parameter_source("token") is ParameterSource.COMMANDLINE:
            words += ["--token", "TOKEN"]
    words += ["ingest", ctx.params["stream_name"], ctx.params["file"]]
    for name, option in (("fmt", "--format"), ("batch_rows", "--batch-rows"),
                         ("ts_column", "--ts-column"), ("ts_unit", "--ts-unit")):
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT:
            words += [option, str(ctx.params[name])]
    return shlex.join([*words, "--resume"])


def _interrupted(exc: IngestInterrupted, file: str, command: str | None) -> str:
    """What an ingest stopped by Ctrl-C says: the rows of FILE stored, and `command`,
    which continues it (None: nothing to resume)."""
    n = exc.rows_done
    stored = (f"{'' if exc.exact else 'at least '}{n:,} row{'' if n == 1 else 's'} "
              f"{'from stdin' if file == '-' else 'of ' + file} "
              f"{'is' if n == 1 else 'are'} stored")
    if exc.in_doubt:
        stored += f", and {exc.in_doubt} was in flight: it may or may not be"
    if command is None:
        return f"interrupted: {stored}"
    where = (f"from row {n + 1:,}" if exc.exact and not exc.in_doubt
             else "after the last batch the server applied, without duplicating")
    return f"interrupted: {stored}; `{command}` continues {where}"


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def _progress(rows: int, seconds: float, total: int | None = None,
              fraction: float | None = None) -> None:
    """A progress line on stderr, rewritten in place (`_rows_line`)."""
    click.echo(f"\r{_rows_line(rows, seconds, total, fraction)}\x1b[K", nl=False, err=True)


def _rows_line(rows: int, seconds: float, total: int | None = None,
               fraction: float | None = None) -> str:
    """Rows so far and the rate, and when the input's size is known (`total` rows, or
    the `fraction` of it read) the percentage and the time left at this pace."""
    rate = rows / max(seconds, 1e-9)
    of = "" if total is None else f" of {total:,}"
    if fraction is None and total:
        fraction = rows / total
    done = ""
    if fraction is not None:
        fraction = min(max(fraction, 0.0), 1.0)
        left = seconds * (1 - fraction) / fraction if fraction > 0 else None
        eta = "?" if left is None else time.strftime("%H:%M:%S", time.gmtime(left))
        done = f"  {fraction:.0%}  ETA {eta}"
    return f"{rows:,}{of} rows{done}  {rate:,.0f} rows/s"


# ---------------------------------------------------------------------- handles

@main.command()
@click.argument("sql")
@click.option("--name", default=None,
              help="Remember the handle under this name (in your config directory), so "
                   "later commands can use the name instead of the handle.")
@click.option("--replace", is_flag=True, help="Let --name take over a name already in use.")
@click.pass_obj
def register(settings: Settings, sql: str, name: str | None, replace: bool) -> None:
    """Register a standing query and print its handle.

    \b
    psoup register "SELECT stationid, speed FROM traffic WHERE lane = 3 AND speed < 20
                    BEGIN NOW - 10 MINUTES END NOW" --name slow-lane3
    """
    if name is not None and not _NAME.match(name):
        raise click.BadParameter(f"{name!r}: a name is letters, digits and _ . : - (starting "
                                 "with a letter or digit)", param_hint="--name")
    store = HandleStore()
    old = store.lookup(name) if name is not None else None
    if name is not None and old is not None and not replace:   # (old is None without name)
        raise name_taken(name, old)
    with _connected(settings.server, settings.token) as client:
        announce_large(client, sql)
        handle = client.register(sql)
        if name is not None:
            try:
                store.remember(name, settings.server, handle, sql, replace=replace)
            except HandleStoreError:
                client.unregister(handle)  # lost a race for the name: leave nothing behind
                raise
    if old is not None:
        click.echo(f"note: '{name}' now names the new handle; the old one ({old['handle']}) "
                   "is still registered", err=True)
    click.echo(handle)


_limit_option = click.option(
    "--limit", type=click.IntRange(0), default=None, metavar="N",
    help=f"Print at most N rows, then say how many there were (0: all). Default: "
         f"{DEFAULT_LIMIT} in a table on a terminal, else all.")


def _rows_shown(fmt: str, limit: int | None) -> int | None:
    """The most rows to print (None: all): --limit as given (0 is all); without it
    DEFAULT_LIMIT for a table on a terminal, all for csv, json and a pipe."""
    if limit is None:
        return DEFAULT_LIMIT if fmt == "table" and _stdout_is_terminal() else None
    return limit or None


def _stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


@main.command(short_help="Print a standing query's current answer.")
@click.argument("ref", metavar="HANDLE|NAME")
@click.option("-o", "--format", "fmt", type=click.Choice(FORMATS), default="table",
              show_default=True,
              help="table for people; csv and json (one document) for scripts.")
@click.option("--changes", is_flag=True,
              help="Print only the rows that entered (+) and left (-) the answer since "
                   "your last invocation of this handle.")
@click.option("--now", type=Instant(), default=None,
              help="Resolve the window at this time (seconds or ISO 8601) instead of the "
                   "server's clock.")
@_limit_option
@click.option("--no-pager", is_flag=True,
              help="Print a long table straight to the terminal instead of through a pager "
                   "($PAGER, else less).")
@click.pass_obj
def invoke(settings: Settings, ref: str, fmt: str, changes: bool, now: float | None,
           limit: int | None, no_pager: bool) -> None:
    """Print the current answer of a standing query, by handle or by name.

    With --changes, the first call for a handle prints the whole answer as inserted rows;
    every call remembers where it left off. A table shows each row's ts in UTC; on a
    terminal it shows the first 100 rows (--limit) and pages a long answer.
    """
    target = _resolve(settings, ref)
    store = HandleStore()
    answer: Result | Changes
    shown = _rows_shown(fmt, limit)
    with _connected(target.server, settings.token, target) as client:
        if changes:
            answer, reason = changes_since(client, target.handle,
                                            store.cursor(target.server, target.handle), now)
            text = render_changes(answer, fmt, reset=reason is not None, limit=shown)
        else:
            answer, reason = client.invoke(target.handle, now=now), None
            text = render_result(answer, fmt, limit=shown)
    store.set_cursor(target.server, target.handle, answer.cursor)
    if reason is not None and fmt == "table":
        click.echo(f"note: {reason}; showing the whole answer as inserted rows", err=True)
    total = len(answer)
    if fmt != "table" and shown is not None and total > shown:
        click.echo(f"note: {total:,} rows, first {shown:,} printed; --limit 0 for all",
                   err=True)
    if (fmt == "table" and not no_pager and _stdout_is_terminal() and
            text.count("\n") + 2 > shutil.get_terminal_size().lines):
        click.echo_via_pager(text + "\n")
    else:
        click.echo(text)


@main.command(short_help="Poll a standing query and print what changes.")
@click.argument("ref", metavar="HANDLE|NAME")
@click.option("--every", type=Interval(), required=True,
              help="Time between polls: 30s, 2m, 1h, 500ms, or a number of seconds.")
@click.option("--count", type=click.IntRange(1), default=None,
              help="Stop after this many polls (the first, whole answer included).")
@click.option("-o", "--format", "fmt", type=click.Choice(FORMATS), default="table",
              show_default=True,
              help="table; csv (columns polled and change first); json (one document per "
                   "line).")
@_limit_option
@click.pass_obj
def watch(settings: Settings, ref: str, every: float, count: int | None, fmt: str,
          limit: int | None) -> None:
    """Poll a standing query: print the whole answer, then at every interval what changed.

    Each poll is stamped with its time, and shows at most --limit rows; Ctrl-C stops.
    """
    target = _resolve(settings, ref)
    store = HandleStore()
    shown = _rows_shown(fmt, limit)
    polls = 0
    try:
        with _connected(target.server, settings.token, target) as client:
            answer: Result | Changes = client.invoke(target.handle)
            while True:
                store.set_cursor(target.server, target.handle, answer.cursor)
                click.echo(render_poll(answer, fmt, time.time(), first=polls == 0,
                                       limit=shown))
                polls += 1
                if count is not None and polls >= count:
                    return
                time.sleep(every)
                answer, reason = changes_since(client, target.handle, answer.cursor, None)
                if reason is not None and fmt == "table":
                    click.echo(f"note: {reason}; the next rows are the whole answer", err=True)
    except KeyboardInterrupt:
        return


@main.command()
@click.argument("ref", metavar="HANDLE|NAME")
@click.pass_obj
def unregister(settings: Settings, ref: str) -> None:
    """Drop a standing query; a name given to it is forgotten too."""
    target = _resolve(settings, ref)
    store = HandleStore()
    with _connected(target.server, settings.token, target) as client:
        try:
            client.unregister(target.handle)
        except UnknownHandle:
            if target.name is None:
                raise
            click.echo(f"note: the server no longer knew the handle of '{target.name}'",
                       err=True)
    store.forget_handle(target.server, target.handle)
    click.echo(f"unregistered {target.name or target.handle}")


@main.command(short_help="Evaluate standing queries over the server's archive.")
@click.argument("refs", nargs=-1, metavar="[HANDLE|NAME]...")
@click.pass_obj
def history(settings: Settings, refs: tuple[str, ...]) -> None:
    """Run the standing queries (all selection queries without history yet, or the ones
    named) over the archive of a durable server, in one Spark pass, so that their
    windows reach back past what memory holds (docs/semantics.md, "History").

    The job runs on the server (its Spark master: psoup serve --spark-master) while
    ingest and queries go on; this starts it, waits for it showing its progress on
    stderr, and prints each query's archived matches. Ctrl-C cancels it, and then
    nothing changes. The server needs psoup serve --data-dir; its first job starts Spark, which
    takes tens of seconds. See docs/cli.md, "psoup history"."""
    targets = [_resolve(settings, ref) for ref in refs]
    server = targets[0].server if targets else settings.server
    with _connected(server, settings.token) as client:
        job = client.history([t.handle for t in targets] or None)
        click.echo(f"history job {job}: evaluating over the archive (a Spark job on the "
                   "server); Ctrl-C cancels", err=True)
        shown = Progress(tasks=None)
        try:
            status = client.history_wait(job, on_status=partial(_job_progress, shown))
        except KeyboardInterrupt:
            client.history_cancel(job)
            raise Failure(f"history job {job} cancelled; nothing changed") from None
        except PSoupError as exc:
            raise Failure(str(exc)) from None
    names = _names_on(server)
    click.echo(table(["query", "archived matches"],
                     [[names.get(h, h), n] for h, n in status["result"].items()]))


def _job_progress(shown: Progress, status: dict[str, Any]) -> None:
    """A history job's progress on stderr (`shown`): rewritten in place on a terminal,
    else a line every few seconds."""
    if status["state"] != "running":
        shown.end()
        return
    progress = status["progress"]
    tasks = (f", {progress['tasks_done']}/{progress['tasks']} Spark tasks"
             if progress.get("tasks") else "")
    shown.update(f"{status['seconds']:.0f} s{tasks}: {progress['message'] or 'starting'}")


@main.command(short_help="List the standing queries.")
@click.option("-o", "--format", "fmt", type=click.Choice(FORMATS), default="table",
              show_default=True,
              help="table for people; csv and json for scripts.")
@click.pass_obj
def queries(settings: Settings, fmt: str) -> None:
    """List the server's standing queries: name (if you gave one), handle, SQL (on one
    line in a table, cut at 100 characters; whole in csv and json)."""
    names = _names_on(settings.server)
    with _connected(settings.server, settings.token) as client:
        rows = [(names.get(handle, ""), handle, sql) for handle, sql in client.queries()]
    if fmt == "json":
        click.echo(to_json({"queries": [dict(zip(("name", "handle", "sql"), r, strict=True))
                                        for r in rows]}))
    elif fmt == "csv":
        click.echo(render_records("queries", ["name", "handle", "sql"], rows, "csv"))
    else:
        click.echo(table(["name", "handle", "sql"], [(n, h, one_line(q)) for n, h, q in rows]) +
                   f"\n({len(rows)} standing quer{'y' if len(rows) == 1 else 'ies'})")


@main.command(short_help="Show a standing query: its SQL and statistics.")
@click.argument("ref", metavar="HANDLE|NAME")
@click.option("-o", "--format", "fmt", type=click.Choice(FORMATS), default="table",
              show_default=True,
              help="table for people; csv and json for scripts.")
@click.pass_obj
def show(settings: Settings, ref: str, fmt: str) -> None:
    """Show a standing query, by handle or by name: its SQL, how many retained tuples
    match it, and its history and join group (from the server's statistics)."""
    target = _resolve(settings, ref)
    with _connected(target.server, settings.token, target) as client:
        numbers = client.stats()["queries"].get(target.handle)
    if numbers is None:
        raise Failure(_unknown(target, UnknownHandle(f"unknown handle {target.handle!r}")))
    click.echo(render_record({"name": target.name, "handle": target.handle,
                              **_shown(numbers)}, fmt))


def _shown(numbers: dict[str, Any]) -> dict[str, Any]:
    """A query's statistics as `psoup show` prints them: its archive tier as a count of
    files, and nothing of a tier when it has none (no history)."""
    shown = {k: v for k, v in numbers.items() if k not in ("tier_files", "sampled_below")}
    if numbers.get("history"):
        shown["tier_files"] = len(numbers.get("tier_files", []))
        shown["sampled_below"] = numbers.get("sampled_below")
    return shown


@main.command(short_help="Show streams, queries and memory of the server.")
@click.option("-o", "--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="table for people; json: the server's raw statistics.")
@click.pass_obj
def stats(settings: Settings, fmt: str) -> None:
    """Show the server's streams (rows, size, rate), standing queries and memory."""
    with _connected(settings.server, settings.token) as client:
        numbers = client.stats()
    if fmt == "json":
        click.echo(to_json(numbers))
    else:
        click.echo(render_stats(numbers, _names_on(settings.server)))


# ---------------------------------------------------------------------- archive and replay

def _spark_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The --master, --conf and --spark-env options of the commands that run a Spark job
    here; the command gets the packed environment's settings within `spark_conf`."""
    @wraps(command)
    def merged(*args: Any, spark_conf: dict[str, str], spark_env: dict[str, str] | None,
               **kwargs: Any) -> Any:
        return command(*args, spark_conf=_with_env(spark_conf, spark_env), **kwargs)

    options = [
        _spark_env_option,
        click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
                     callback=lambda ctx, param, value: _spark_conf(param, value),
                     help="A Spark setting (repeatable), over spark-defaults.conf "
                          "and PSOUP_SPARK_CONF."),
        click.option("--master", default=None, metavar="URL",
                     help="The Spark master (default local[*])."),
    ]
    for option in options:
        merged = option(merged)
    return merged


@main.group()
def spark() -> None:
    """Prepare a Spark cluster for psoup's jobs."""


@spark.command("pack-env", short_help="Pack the executors' Python packages for a cluster.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("psoup-env.tar.gz"), show_default=True,
              help="The archive to write (.tar.gz); replaced whole when it exists.")
@click.option("--python", "python", default=None, metavar="EXE",
              help="The interpreter the environment is made from, at the path it has on "
                   "every worker (default: this one; its version must be this one's).")
def spark_pack_env(output: Path, python: str | None) -> None:
    """Build a packed virtual environment holding the packages psoup's code imports in
    Spark's executors (numpy, pyarrow, numba, pandas, msgpack, sortedcontainers and
    what they need), pinned to the versions installed here, for workers whose Python
    lacks them. Give it to a job with --spark-env FILE (psoup serve --spark-env FILE).

    pip installs them (downloading the wheels, or taking them from its cache) into a
    new environment, which is packed as a .tar.gz: minutes. The environment's Python is
    the interpreter it was made from: every worker needs that one at the same path.
    """
    from psoup.spark import packenv
    with Progress(tasks=None) as progress:
        packed = packenv.build(output, python, progress=progress, pip_line=progress.update)
    click.echo(f"{packed.path}: {packed.distributions} distributions, "
               f"{packed.size / 2**20:,.0f} MiB, built in {packed.seconds:.0f} s; "
               f"use it with --spark-env {packed.path}")


@main.group()
def archive() -> None:
    """Build archives (Parquet by stream and UTC day) for `psoup replay`."""


@archive.command("import", short_help="Write files of tuples as a stream of an archive.")
@click.argument("files", metavar="FILE...", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--stream", "stream_name", required=True, metavar="NAME",
              help="The stream the rows belong to.")
@click.option("--columns", required=True,
              help='The stream\'s columns, e.g. "lane INT, speed FLOAT, road TEXT".')
@click.option("--ts-column", default="ts", show_default=True,
              help="The column holding each row's timestamp: seconds since the epoch or "
                   "ISO 8601 (UTC unless it carries an offset).")
@click.option("-o", "--format", "fmt", type=click.Choice(INPUT_FORMATS + tuple(ALIASES)),
              default=None,
              help="The input format (jsonl, or json: one object per line); by default guessed "
                   "from each file's name.")
@click.option("--into", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The archive directory; created if missing.")
@_spark_options
def archive_import(files: tuple[Path, ...], stream_name: str, columns: str, ts_column: str,
                   fmt: str | None, into: Path, master: str | None,
                   spark_conf: dict[str, str]) -> None:
    """Sort the rows of FILE... by timestamp and write them into the archive as stream
    NAME, with tupleIDs after the ones the archive already holds (a Spark job).

    Every file is checked first: each declared column present and of a type that fits,
    no missing values, no NaN, a timestamp on every row. An error names the file and the
    column, and then nothing is written. The rows may be in any order, but may not begin
    before the archive's latest timestamp for NAME.
    """
    from psoup.spark import importer as importing
    try:
        declared = importing.parse_columns(stream_name, columns)
    except QueryError as exc:
        typed = Typed([(None, "CREATE STREAM "), ("--stream", stream_name), (None, " ("),
                       ("--columns", columns), (None, ")")])
        raise Failure(typed.explain(str(exc))) from None
    with Progress() as progress:
        report = importing.import_files(files, stream_name, declared, into,
                                        ts_column=ts_column, fmt=fmt, master=master,
                                        conf=spark_conf, progress=progress)
    ids = "" if not report.rows else f", tupleIDs {report.first_tid}..{report.last_tid}"
    click.echo(f"{report.rows:,} row{'' if report.rows == 1 else 's'} of {stream_name} "
               f"into {into} ({len(report.files)} file{'' if len(report.files) == 1 else 's'}"
               f"{ids}; {report.rate:,.0f} rows/s)")


@archive.command("reshape", short_help="Rewrite an archive in the sampled layout.")
@click.argument("root", metavar="ARCHIVE",
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--streams", default=None, metavar="NAME,...",
              help="Rewrite only these streams (default: every stream in the archive).")
@_spark_options
def archive_reshape(root: Path, streams: str | None, master: str | None,
                    spark_conf: dict[str, str]) -> None:
    """Rewrite the part files of ARCHIVE that are not in the sampled layout (a Spark job,
    a task per file), so that queries with TABLESAMPLE read only the fraction they
    sample. Archives psoup writes today are already in it; this is for older ones and
    files written by other tools. The rows do not change; each file is replaced whole,
    so an interrupted reshape leaves a valid archive, and running it again finishes.
    """
    from psoup.spark.reshape import reshape
    names = None if streams is None else [s.strip() for s in streams.split(",") if s.strip()]
    with Progress() as progress:
        report = reshape(root, names, master, spark_conf, progress=progress)
    click.echo(f"{len(report.rewritten):,} part file{'' if len(report.rewritten) == 1 else 's'} "
               f"rewritten ({report.rows:,} rows), {report.already:,} already in the sampled "
               f"layout; {report.seconds:.1f} s")


@main.command(short_help="Replay archived tuples into the streams, in timestamp order.")
@click.argument("archives", metavar="ARCHIVE...", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--from", "start", type=Instant(), default=None,
              help="Replay the rows with ts at or after this time (seconds or ISO 8601).")
@click.option("--to", "end", type=Instant(), default=None,
              help="Replay the rows with ts at or before this time.")
@click.option("--streams", default=None, metavar="NAME,...",
              help="Replay only these streams (default: every stream in the archives).")
@_spark_options
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Replay into an embedded engine on this state directory (one no server "
                   "has open) instead of a server.")
@click.option("--server", "server_option", metavar="HOST:PORT", default=None,
              callback=lambda ctx, param, value: value and _address(ctx, param, value),
              help="The server to replay into (default: psoup --server, PSOUP_SERVER, "
                   f"or {DEFAULT_HOST}:{DEFAULT_PORT}).")
@click.option("--token", "token_option", default=None,
              help="The server's access token (default: psoup --token, PSOUP_TOKEN, or "
                   "the token file a server on this machine writes).")
@click.option("--slice-rows", type=click.IntRange(1_000), default=REPLAY_SLICE_ROWS,
              show_default=True, help="About the most rows held in memory at once.")
@click.option("--resume", is_flag=True,
              help="Continue where the target stops: each stream from its latest ts on, "
                   "after the archived rows at that ts it already holds.")
@click.pass_obj
def replay(settings: Settings, archives: tuple[Path, ...], start: float | None,
           end: float | None, streams: str | None, master: str | None, data_dir: Path | None,
           server_option: str | None, token_option: str | None, slice_rows: int,
           resume: bool, spark_conf: dict[str, str]) -> None:
    """Replay the archived rows of ARCHIVE... into the streams of a server (or of the
    engine in --data-dir), in timestamp order, through every standing query as if they
    arrived live (a Spark job reads the archive).

    \b
    Replay only appends. A stream that holds data up to ts L takes rows with
    ts >= L (equal is allowed). If --from (or, without it, the archive's first
    row) lies before L, nothing is replayed and the error names L, how many
    archived rows have ts L (--from L replays them, --from the next ts skips
    them) and whether the archive ends before L. Older rows are for `psoup
    history`.

    \b
    --resume continues a replay that stopped part way (or was refused)
    exactly: each stream starts at its own L and skips as many of the
    archive's rows at ts L as it holds at L, so no row is doubled or lost
    (provided those rows came from this archive).

    The archive is checked before anything is delivered (schemas against the target's
    streams, readable files, no NULL or NaN, ts non-decreasing in tupleID order); an
    error names the file. Rows get fresh tupleIDs; a stream the target lacks is created
    with the archive's columns. Says what it is doing on stderr (a terminal or not).
    """
    if data_dir is not None and server_option is not None:
        raise click.UsageError("pass --data-dir or --server, not both")
    if start is not None and end is not None and start > end:
        raise click.BadParameter(f"--from {start!r} is after --to {end!r}",
                                 param_hint="--from")
    names = None if streams is None else [n.strip() for n in streams.split(",") if n.strip()]
    from psoup.spark import replay as replaying
    where = str(data_dir) if data_dir is not None else server_option or settings.server
    with Progress() as shown:
        def progress(done: int, total: int, seconds: float) -> None:
            shown.update(f"replayed {_rows_line(done, seconds, total)}")
        run = partial(replaying.replay, streams=names, start=start, end=end, master=master,
                      slice_rows=slice_rows, progress=progress, resume=resume,
                      conf=spark_conf, notes=shown)
        try:
            if data_dir is not None:
                from psoup.engine import Engine

                with Engine(path=str(data_dir)) as engine:
                    report = run(archives, engine)
            else:
                with _connected(where, token_option or settings.token) as client:
                    report = run(archives, client)
        except ReplayError as exc:
            raise Failure(replay_options(str(exc))) from None
    into = ", ".join(f"{name} {rows:,}" for name, rows in report.streams.items()) or "none"
    click.echo(f"{report.rows:,} row{'' if report.rows == 1 else 's'} replayed into {where}"
               + (f" ({into}; {report.rate:,.0f} rows/s)" if report.rows else "")
               + (f": {iso_times(report.note)}" if report.note else ""))


# ---------------------------------------------------------------------- helpers

def replay_options(message: str) -> str:
    """A replay refusal with replay()'s arguments named as this command's options.

    Example:
        >>> replay_options("resume=True skips them; start=5.0, the next ts, skips all")
        '--resume skips them; --from 5.0, the next ts, skips all'
    """
    return re.sub(r"\bstart=(?=[-\d])", "--from ",
                  message.replace("resume=True", "--resume"))


def _spark_conf(param: click.Parameter, pairs: tuple[str, ...]) -> dict[str, str]:
    """--conf KEY=VALUE options as Spark settings, checked before Spark starts."""
    from psoup.spark.session import parse_conf  # no pyspark import: only the parsing
    try:
        return parse_conf(pairs, param.opts[0])
    except PSoupError as exc:
        raise click.BadParameter(str(exc).partition(": ")[2], param=param) from None


def _spark_env(param: click.Parameter, value: str | None) -> dict[str, str] | None:
    """--spark-env FILE as the Spark settings that ship it, checked before Spark starts."""
    if value is None:
        return None
    from psoup.spark.packenv import settings  # no pyspark import: only the settings
    try:
        return settings(value)
    except PSoupError as exc:
        raise click.BadParameter(str(exc), param=param) from None


def _with_env(conf: dict[str, str], env: dict[str, str] | None) -> dict[str, str]:
    """`conf` with a packed environment's settings, which it may not set itself.

    Example:
        >>> _with_env({"spark.cores.max": "8"}, {"spark.archives": "/e.tar.gz#psoup_env"})
        {'spark.cores.max': '8', 'spark.archives': '/e.tar.gz#psoup_env'}
    """
    if env is None:
        return conf
    both = sorted(set(conf) & set(env))
    if both:
        raise click.UsageError(f"--spark-env sets {', '.join(both)}: leave "
                               f"{'it' if len(both) == 1 else 'them'} out of the Spark "
                               "settings")
    return {**conf, **env}


@contextmanager
def _connected(server: str, token: str | None, target: Target | None = None,
               **options: Any) -> Iterator[Client]:
    """A client of `server`, with the failures of connecting explained; `target` names
    what an UnknownHandle inside refers to."""
    try:
        client = Client(server, token=token, **options)
    except ConnectionFailed as exc:
        cause = exc.__cause__
        why = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(exc)
        raise Failure(f"cannot reach psoup server at {server}: {why} (is `psoup serve` "
                      "running?)") from None
    except PSoupError as exc:
        if exc.code != ErrorCode.AUTH:
            raise
        raise Failure(f"the server at {server} refused the connection: "
                      + str(exc).replace(TOKEN_ADVICE, "with --token or PSOUP_TOKEN")) from None
    try:
        with client:
            yield client
    except UnknownHandle as exc:
        raise Failure(_unknown(target, exc)) from None
    except ConnectionFailed as exc:
        if isinstance(exc, OutcomeUnknown):
            raise
        raise Failure(f"lost the connection to {server}: {exc}") from None


def _unknown(target: Target | None, exc: UnknownHandle) -> str:
    if target is None:
        return str(exc)
    if target.name is not None:
        return (f"the name '{target.name}' refers to handle {target.handle}, which "
                f"the server at {target.server} no longer knows (`psoup unregister "
                f"{target.name}` forgets the name)")
    return (f"'{target.handle}' is neither a name in {HandleStore().path} nor a handle the "
            f"server at {target.server} knows")


def _resolve(settings: Settings, ref: str) -> Target:
    """A name from the handle store (with the server it was registered on), else a handle
    on the --server."""
    entry = HandleStore().lookup(ref)
    if entry is not None:
        return Target(entry["server"], entry["handle"], ref)
    return Target(settings.server, ref, None)


def _names_on(server: str) -> dict[str, str]:
    """handle -> name for the handles named on `server`."""
    return {e["handle"]: name for name, e in HandleStore().names().items()
            if e["server"] == server}


@main.command(short_help="Run the benchmark suite (or some of its suites).")
@click.argument("suites", nargs=-1, metavar="[SUITE]...")
@click.option("--quick", is_flag=True, help="Tiny runs, to check that every suite works.")
@click.option("--list", "list_", is_flag=True, help="List the suites and exit.")
def bench(suites: tuple[str, ...], quick: bool, list_: bool) -> None:
    """Run the benchmarks: all of them, or the SUITEs named (ingest, register, invoke, joins,
    aggregates, traffic, manyq, peers, server, replay, history, spark_live; the paper's
    fig7, table2, fig8, fig9, fig11, sect5.5 name the suite that reproduces them). Each
    prints its tables and writes bench/results/NAME.json and NAME.png."""
    from psoup.cli import bench as benching
    if list_:
        aliases: dict[str, list[str]] = {}
        for alias, suite in benching.ALIASES.items():
            aliases.setdefault(suite, []).append(alias)
        click.echo(table(["suite", "measures", "aliases"],
                         [[name, what, ", ".join(aliases.get(name, []))]
                          for name, (_, what) in benching.SUITES.items()]))
        return
    try:
        chosen = benching.resolve(suites)
        done = benching.run(chosen, quick, click.echo)
    except benching.BenchError as exc:
        raise click.UsageError(str(exc)) from None
    total = sum(d["seconds"] for d in done)
    click.echo(table(["suite", "seconds", "result"],
                     [[d["suite"], f"{d['seconds']:.0f}",
                       {True: "ok", False: "FAILED", None: "skipped"}[d["ok"]]] for d in done]))
    click.echo(f"total {total / 60:.1f} min")
    if any(d["ok"] is False for d in done):
        sys.exit(1)


if __name__ == "__main__":
    main()
