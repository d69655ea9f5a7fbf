"""A blocking client of the psoup service: the Engine API, over the network.

`Client` mirrors `psoup.Engine` (execute, create_stream, insert, register, invoke,
unregister, queries, stats) and returns the same types, so code written against an
embedded engine runs against a server by changing one line. The protocol is in
docs/protocol.md.

Disconnection is normal for PSoup clients, so a broken connection is repaired on the next
call: the client reconnects (and says hello again) and retries once when that cannot
apply a change twice, i.e. for reads, or when the request cannot have reached the server.
Inserts carry an idempotency key (the client's producer id and a batch number,
psoup.producers), so an insert whose reply was lost is sent again, reconnecting for up to
`retry` seconds (a server restarting), and applied once. Other writes raise
`OutcomeUnknown` rather than guess. An insert the server refuses as busy (its ingest
queue is full: nothing applied) is sent again after the pause the server asks for, for
up to `busy_timeout` seconds, then raises `Busy`.
"""

from __future__ import annotations

import os
import random
import secrets
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast, overload

import numpy as np
from numpy.typing import NDArray

from psoup.codec import encode_array
from psoup.config import parse_address, token_path
from psoup.errors import Busy, DiskFull, PSoupError, QueryError, SchemaError, SequenceError
from psoup.options import ColumnTypeName
from psoup.results.result import Changes, Result
from psoup.server.ops import OPS, OpName
from psoup.server.protocol import (
    HEADER,
    PROTOCOL,
    ErrorCode,
    ProtocolError,
    decode_answer,
    error_of,
    join_answers,
    pack_frame,
    unpack_payload,
)

#: Batches of one insert that may be in flight at once (sent, reply not yet read).
PIPELINE = 4


class ConnectionFailed(PSoupError, ConnectionError):
    """The server could not be reached, or the connection broke before the request could
    have been received: nothing was applied."""

    code = "connection"


class OutcomeUnknown(ConnectionFailed):
    """The connection broke after a change was sent and before its reply arrived: the
    change may or may not have been applied. Check (queries(), an invocation) before
    sending it again."""

    code = "outcome_unknown"


class _Broken(Exception):
    """The connection ended (EOF or a socket error) while a reply was awaited."""


@dataclass
class _Run:
    """One pipelined run of insert batches (`Client._pipeline`): the batches sent and
    not yet answered (request id, start, stop, seq), the first refusal (error, start,
    stop, seq), the batches answered after it (not applied), and whether the
    connection broke."""

    in_flight: deque[tuple[int, int, int, int]] = field(default_factory=deque)
    failure: tuple[PSoupError, int, int, int] | None = None
    skipped: list[tuple[int, int]] = field(default_factory=list)
    broken: bool = False


class Client:
    """A connection to a psoup server, with the Engine's methods.

    Args:
        address: "host:port", "host" or ":port" (defaults 127.0.0.1 and 7070).
        token: the access token; else the PSOUP_TOKEN environment variable; else the
            token file a server on this machine wrote (psoup.config.token_path).
        timeout: seconds to wait for a connection or a reply.
        batch_rows: inserts larger than this (or than the server's max_batch_rows) are
            sent as several batches; each batch is atomic, the insert as a whole is not.
        producer: the producer id of this client's inserts (default: a random one). A
            given id continues after that producer's last batch on the server
            (`last_seq`), so a process resuming a producer's work applies nothing twice.
        retry: seconds an insert whose reply was lost keeps reconnecting and resending
            the same batch (same key: applied once) before it raises OutcomeUnknown.
        busy_timeout: seconds an insert the server refuses as busy (its ingest queue
            full, nothing applied) keeps waiting the pause the server asks for and
            sending it again before it raises Busy.

    Raises:
        ConnectionFailed: no server answers at `address`.
        PSoupError: code "auth" when the server refuses the token.

    Example:
        >>> from psoup import Engine
        >>> from psoup.server import Server
        >>> server = Server(Engine(), port=0, token="t")
        >>> host, port = server.start_in_thread()
        >>> with Client(f"{host}:{port}", token="t") as client:
        ...     client.execute("CREATE STREAM R (a INT)")
        ...     h = client.register("SELECT a FROM R WHERE a > 1")
        ...     client.insert("R", [(1,), (2,)], ts=10.0).tolist()
        ...     client.invoke(h, now=11.0).rows
        [0, 1]
        [(2,)]
        >>> server.stop()
    """

    def __init__(self, address: str = "127.0.0.1:7070", token: str | None = None,
                 timeout: float = 30.0, batch_rows: int = 100_000,
                 producer: str | None = None, retry: float = 60.0,
                 busy_timeout: float = 60.0):
        if batch_rows < 1:
            raise ValueError("batch_rows must be positive")
        if producer is not None and not producer:
            raise ValueError("producer must be a non-empty string")
        self.producer = producer if producer is not None else secrets.token_hex(16)
        self.retry = retry
        self.busy_timeout = busy_timeout
        # The next batch's seq; None: ask the server (a given producer id, or after an
        # outcome that stayed unknown).
        self._seq: int | None = 0 if producer is None else None
        self.host, self.port = parse_address(address)
        self.timeout = timeout
        self.batch_rows = batch_rows
        self.server: dict[str, Any] = {}
        # where the token came from, for the message when the server refuses it
        self._token, self._token_from = ((token, "given") if token is not None
                                         else _find_token(self.host, self.port))
        self._sock: socket.socket | None = None
        self._next_id = 0
        self._lock = threading.RLock()
        self._closed = False
        with self._lock:
            self._connect()

    # ------------------------------------------------------------------ the Engine API

    def execute(self, sql: str) -> str | Result | None:
        """Run one statement: CREATE STREAM and DROP STREAM return None, SELECT its
        handle, SHOW and DESCRIBE a Result."""
        value = self._request(OpName.EXECUTE, {"sql": sql})
        if not isinstance(value, Mapping):
            return cast("str | None", value)        # a handle, or None
        table = decode_answer(value)
        assert isinstance(table, Result), "a statement's table is an answer, not changes"
        return table

    def streams(self) -> list[str]:
        """The streams' names, in creation order (SHOW STREAMS)."""
        return [row[0] for row in self._table("SHOW STREAMS").rows]

    def describe(self, name: str) -> dict[str, Any]:
        """What DESCRIBE shows of stream `name`, as a dict (Engine.describe)."""
        return self._table(f"DESCRIBE {_name(name)}").to_dicts()[0]

    def drop_stream(self, name: str, cascade: bool = False) -> None:
        """Drop stream `name` (DROP STREAM; Engine.drop_stream)."""
        sql = f"DROP STREAM {_name(name)}"
        try:
            self._request(OpName.EXECUTE, {"sql": sql + (" CASCADE" if cascade else "")})
        except QueryError as exc:
            # the server suggests the statement; this call's caller passes an argument
            raise QueryError(str(exc).replace(
                f"{sql} CASCADE", f"drop_stream({name!r}, cascade=True)")) from None

    def _table(self, sql: str) -> Result:
        table = self.execute(sql)
        assert isinstance(table, Result), "SHOW and DESCRIBE answer with a table"
        return table

    def create_stream(self, name: str, columns: Mapping[str, ColumnTypeName]
                      | Sequence[tuple[str, ColumnTypeName]],
                      retain: str | None = None) -> None:
        """Declare a stream: column name -> type, in order; the same as CREATE STREAM."""
        wire = dict(columns) if isinstance(columns, Mapping) else [list(c) for c in columns]
        self._request(OpName.CREATE_STREAM, {"name": name, "columns": wire, "retain": retain})

    def register(self, sql: str) -> str:
        """Register a standing query; returns its handle."""
        handle: str = self._request(OpName.REGISTER, {"sql": sql})
        return handle

    def insert(self, stream: str, rows: Any, ts: Any = None) -> NDArray[np.int64]:
        """Insert rows into `stream`; returns their tupleIDs (numpy int64).

        Args:
            rows: a list of tuples in schema order, a list of dicts, or a dict of column
                -> sequence or numpy array (sent as raw column bytes: the fast path).
            ts: None (the server's clock), one number for all rows, or one per row.

        Each batch of at most `batch_rows` rows is atomic. A larger insert is sent as a
        pipeline of batches (the next one travels while the server applies the one
        before); when a batch is rejected, the batches after it are not applied, and the
        error says which rows were stored.

        Each batch carries the key (producer, seq): when the connection breaks before a
        reply, the client reconnects and sends the same batches again for up to `retry`
        seconds, and the server applies each once, so the insert happens exactly once.
        Only if the server stays unreachable does it raise OutcomeUnknown (`last_seq`
        then tells whether the batch was applied).
        """
        if isinstance(rows, Mapping):
            lengths = {len(values) for values in rows.values()}
            n = lengths.pop() if len(lengths) == 1 else None
        elif isinstance(rows, Sequence) and not isinstance(rows, (str, bytes)):
            n = len(rows)
        else:
            raise SchemaError(f"stream '{stream}': rows must be a list of tuples, a list of "
                              f"dicts, or a dict of columns, not {type(rows).__name__}")
        per_row = ts is not None and not isinstance(ts, (int, float, np.number))
        if n is None or (per_row and len(ts) != n):
            return self._insert_rows(stream, rows, ts, 0, None, n)  # malformed: one request
        size = min(self.batch_rows, self.server["limits"]["max_batch_rows"])
        if n <= size:
            return self._insert_rows(stream, rows, ts, 0, n, n)
        return self._insert_pipelined(stream, rows, ts, n, size)

    @property
    def next_seq(self) -> int | None:
        """The seq this client's next insert batch takes (None: it will ask the server,
        for a given producer id or after an outcome that stayed unknown)."""
        return self._seq

    def last_seq(self, producer: str | None = None) -> int:
        """The seq of the last batch the server applied for `producer` (default: this
        client's); -1 if none."""
        seq: int = self._request(OpName.LAST_SEQ, {"producer": producer or self.producer})
        return seq

    @overload
    def invoke(self, handle: str, now: float | None = None, since: None = None) -> Result: ...

    @overload
    def invoke(self, handle: str, now: float | None = None, *, since: str) -> Changes: ...

    @overload
    def invoke(self, handle: str, now: float | None = None,
               since: str | None = None) -> Result | Changes: ...

    def invoke(self, handle: str, now: float | None = None,
               since: str | None = None) -> Result | Changes:
        """The query's answer at `now` (default: the server's clock); with `since=cursor`
        (a previous answer's `.cursor`), only the Changes since that answer. Either
        carries `fresh_to` as the engine's does (docs/language.md, "Freshness")."""
        args: dict[str, Any] = {"handle": handle}
        if now is not None:
            args["now"] = now
        if since is not None:
            args["since"] = since
        return decode_answer(self._request(OpName.INVOKE, args))

    def unregister(self, handle: str) -> None:
        """Remove a standing query; its handle stops working."""
        self._request(OpName.UNREGISTER, {"handle": handle})

    def history(self, handles: Sequence[str] | None = None, wait: bool = False,
                poll: float = 0.5) -> str:
        """Start a history job on the server (Engine.history) and return its id at once,
        or with `wait=True` once it has ended (as `history_wait`, raising if it failed or
        was cancelled). The Spark master is the server's (psoup serve --spark-master).

        Raises:
            PSoupError: the server keeps no archive, a job runs already, or (waiting)
                the job failed or was cancelled.
        """
        args = {} if handles is None else {"handles": list(handles)}
        job: str = self._request(OpName.HISTORY, args)["job"]
        if wait:
            self.history_wait(job, poll=poll)
        return job

    def history_status(self, job: str | None = None) -> dict[str, Any]:
        """A history job's status (Engine.history_status): state, progress, error,
        result; default: the server's latest job."""
        status: dict[str, Any] = self._request(OpName.HISTORY_STATUS,
                                               {} if job is None else {"job": job})
        return status

    def history_cancel(self, job: str) -> dict[str, Any]:
        """Cancel a running history job (Engine.history_cancel); returns its status."""
        status: dict[str, Any] = self._request(OpName.HISTORY_CANCEL, {"job": job})
        return status

    def history_wait(self, job: str, timeout: float | None = None, poll: float = 0.5,
                     on_status: Callable[[dict[str, Any]], None] | None = None
                     ) -> dict[str, Any]:
        """Poll a history job every `poll` seconds until it ends (or `timeout` passes:
        TimeoutError) and return its final status; `on_status` sees each status.

        Raises:
            PSoupError: the job failed (its error) or was cancelled.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.history_status(job)
            if on_status is not None:
                on_status(status)
            if status["state"] == "done":
                return status
            if status["state"] in ("failed", "cancelled"):
                raise PSoupError(f"history job {job} {status['state']}"
                                 + (f": {status['error']}" if status["error"] else
                                    "; nothing changed"))
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"history job {job} still running after {timeout} s")
            time.sleep(poll)

    def evaluate_history(self, handles: Sequence[str] | None = None) -> dict[str, int]:
        """Engine.evaluate_history on the server: start a job, wait for it and return
        handle -> archived matches."""
        matches: dict[str, int] = self.history_wait(self.history(handles))["result"]
        return matches

    def queries(self) -> list[tuple[str, str]]:
        """[(handle, sql), ...] in registration order."""
        return [tuple(pair) for pair in self._request(OpName.QUERIES, {})]

    def stats(self) -> dict[str, Any]:
        """The server engine's statistics (Engine.stats)."""
        stats: dict[str, Any] = self._request(OpName.STATS, {})
        return stats

    def ping(self) -> str:
        """'pong', from a live, authenticated connection."""
        pong: str = self._request(OpName.PING, {})
        return pong

    def close(self) -> None:
        """Close the connection; the client cannot be used afterwards. Idempotent."""
        with self._lock:
            self._closed = True
            self._drop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Client({self.host}:{self.port}, {state})"

    # ------------------------------------------------------------------ inserts

    def _insert_rows(self, stream: str, rows: Any, ts: Any, start: int, stop: int | None,
                     total: int | None, seq: int | None = None) -> NDArray[np.int64]:
        """Send rows[start:stop] (all of them when stop is None) as one batch, halving it
        while its frame is larger than the server accepts. The batch takes the next seq,
        or `seq` when it resends a batch sent before."""
        with self._lock:
            own = seq is None
            key = self._next_seq() if seq is None else seq
            part = dict(_slice_rows(rows, ts, start, stop), stream=stream,
                        producer=self.producer, seq=key)
            try:
                reply = self._resend(OpName.INSERT, part)
            except ProtocolError as exc:
                if exc.code == ErrorCode.FRAME_TOO_LARGE and own and stop is not None \
                        and stop - start > 1:
                    mid = (start + stop) // 2
                    return np.concatenate([
                        self._insert_rows(stream, rows, ts, start, mid, total),
                        self._insert_rows(stream, rows, ts, mid, stop, total)])
                raise _in_batch(exc, start, stop, total) from None
            except SequenceError as exc:
                self._seq = None           # out of step with the server: ask it again
                if own and key > 0 and self._next_seq() == 0:
                    # The server forgot this idle producer (psoup.producers); the batch
                    # was refused, so it is in no doubt: send it as the producer's seq 0.
                    return self._insert_rows(stream, rows, ts, start, stop, total)
                raise _in_batch(exc, start, stop, total) from None
            except PSoupError as exc:
                raise _in_batch(exc, start, stop, total) from None
            if own:
                self._seq = key + 1
        if reply["first"] is None:
            return np.empty(0, np.int64)
        return np.arange(reply["first"], reply["first"] + reply["n"], dtype=np.int64)

    def _next_seq(self) -> int:
        if self._seq is None:
            self._seq = self.last_seq() + 1
        return self._seq

    def _resend(self, op: str, args: dict[str, Any]) -> Any:
        """A keyed request, sent again (reconnecting, with back-off) while its outcome is
        unknown, for up to `retry` seconds: the key makes every resend safe."""
        deadline = time.monotonic() + self.retry
        pause = 0.05
        while True:
            try:
                return self._request(op, args, idempotent=True)
            except ConnectionFailed as exc:
                if self._closed or time.monotonic() + pause > deadline:
                    self._seq = None
                    raise OutcomeUnknown(
                        f"{exc}; {op} of producer {self.producer!r} seq {args['seq']} was "
                        f"retried for {self.retry:g}s and may or may not have been applied "
                        "(last_seq() tells; sending it again with the same key is safe)") \
                        from None
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _insert_pipelined(self, stream: str, rows: Any, ts: Any, n: int,
                          size: int) -> NDArray[np.int64]:
        """rows[0:n] as batches of `size`, up to PIPELINE of them in flight. Every batch
        after the first is sent with "chain", so the server skips it if an earlier one
        was rejected: the stored rows are always a prefix of the insert. A batch refused
        as busy (and the chained ones after it, skipped) is sent again after the pause
        the server asks for, the first of them unchained. When the connection breaks,
        the batches in doubt are sent again one by one with their keys (the server
        remembers more than PIPELINE batches per producer), then the rest."""
        with self._lock:
            ids: list[NDArray[np.int64]] = []
            spans = [(a, min(a + size, n)) for a in range(0, n, size)][::-1]
            deadline = None
            while True:
                busy, rest = self._pipeline(stream, rows, ts, n, spans, ids)
                if busy is None:
                    return np.concatenate(ids)
                deadline = deadline or time.monotonic() + self.busy_timeout
                try:
                    self._pause(busy, deadline)
                except Busy as exc:
                    raise _in_batch(exc, rest[-1][0], rest[-1][1], n) from None
                spans = rest

    def _pipeline(self, stream: str, rows: Any, ts: Any, n: int,
                  spans: list[tuple[int, int]], ids: list[NDArray[np.int64]]
                  ) -> tuple[Busy | None, list[tuple[int, int]]]:
        """Send `spans` (last first) as one pipelined run, the first unchained,
        appending the tupleIDs of each applied batch to `ids`. Returns (None, []), or
        the busy refusal of a batch and the spans left to send from it on (last first);
        raises any other refusal."""
        sock = self._live_socket()
        limit = self.server["limits"]["max_frame_bytes"]
        run = _Run()
        in_flight = run.in_flight
        chain = False
        while spans and run.failure is None and not run.broken:
            start, stop = spans.pop()
            key = self._next_seq()
            args = dict(_slice_rows(rows, ts, start, stop), stream=stream,
                        chain=chain, producer=self.producer, seq=key)
            self._next_id += 1
            frame = pack_frame({"id": self._next_id, "op": OpName.INSERT, "args": args})
            if len(frame) - HEADER.size > limit:
                if stop - start == 1:
                    run.failure = (ProtocolError(ErrorCode.FRAME_TOO_LARGE,
                                                 f"row {start} alone exceeds the server's "
                                                 f"frame limit of {limit} bytes"),
                                   start, stop, key)
                    break
                mid = (start + stop) // 2
                spans += [(mid, stop), (start, mid)]
                continue
            in_flight.append((self._next_id, start, stop, key))
            self._seq = key + 1
            chain = True
            try:
                sock.sendall(frame)
            except OSError:
                self._drop()
                run.broken = True
                break
            if len(in_flight) >= PIPELINE:
                self._collect(sock, run, ids)
        while in_flight and not run.broken:
            self._collect(sock, run, ids)
        return self._settle(run, stream, rows, ts, n, spans, ids)

    def _collect(self, sock: socket.socket, run: _Run, ids: list[NDArray[np.int64]]) -> None:
        """Read the reply to the oldest batch in flight: its tupleIDs go to `ids`, a
        refusal to `run`; a connection that broke marks `run` broken."""
        request_id, start, stop, key = run.in_flight[0]
        try:
            reply = self._result(self._receive(sock), request_id)
        except PSoupError as exc:
            run.in_flight.popleft()
            if run.failure is None:
                run.failure = (exc, start, stop, key)
            else:
                run.skipped.append((start, stop))
            return
        except (TimeoutError, _Broken):
            self._drop()
            run.broken = True
            return
        run.in_flight.popleft()
        ids.append(np.arange(reply["first"], reply["first"] + reply["n"], dtype=np.int64))

    def _settle(self, run: _Run, stream: str, rows: Any, ts: Any, n: int,
                spans: list[tuple[int, int]], ids: list[NDArray[np.int64]]
                ) -> tuple[Busy | None, list[tuple[int, int]]]:
        """The end of a pipelined run (`_pipeline` says what it returns): a refusal
        raised, or returned with the spans to send again when it was busy; after a
        broken connection, the batches in doubt sent again one by one with their keys,
        then the rest."""
        if run.failure is not None:
            error, start, stop, key = run.failure
            self._seq = key     # it and the chained batches after it were not applied
            if isinstance(error, Busy) and not run.broken:
                return error, spans + run.skipped[::-1] + [(start, stop)]
            if isinstance(error, SequenceError):
                self._seq = None
            raise _in_batch(error, start, stop, n) from None
        if run.broken:
            for _, start, stop, key in run.in_flight:
                ids.append(self._insert_rows(stream, rows, ts, start, stop, n, seq=key))
            for start, stop in reversed(spans):
                ids.append(self._insert_rows(stream, rows, ts, start, stop, n))
        return None, []

    # ------------------------------------------------------------------ the connection

    def _request(self, op: str, args: dict[str, Any], wait: float | None = None,
                 idempotent: bool | None = None) -> Any:
        """Send one request and return its result; a broken connection is repaired and
        the request sent again when that cannot apply it twice (psoup.server.ops says
        which operations are idempotent; `idempotent` overrides it, for a keyed insert).
        A busy refusal (nothing applied) is sent again after the pause it asks for."""
        deadline = None
        while True:
            try:
                return self._request_once(op, args, wait, idempotent)
            except Busy as exc:
                deadline = deadline or time.monotonic() + self.busy_timeout
                self._pause(exc, deadline)

    def _pause(self, busy: Busy, deadline: float) -> None:
        """Sleep the pause a busy reply asks for (up to half again, so that producers
        refused together do not come back together); raise it past `deadline`."""
        pause = busy.retry_after * random.uniform(1.0, 1.5)
        if self._closed or time.monotonic() + pause > deadline:
            raise Busy(f"{busy} (refused for {self.busy_timeout:g}s, the client's "
                       "busy_timeout)", busy.retry_after) from None
        time.sleep(pause)

    def _request_once(self, op: str, args: dict[str, Any], wait: float | None,
                      idempotent: bool | None) -> Any:
        if idempotent is None:
            idempotent = OPS[op].idempotent
        with self._lock:
            if self._closed:
                raise PSoupError("this client is closed; open a new Client")
            self._next_id += 1
            request_id = self._next_id
            frame = _request_frame(request_id, op, args)
            for attempt in (1, 2):
                sock = self._live_socket()
                limit = self.server["limits"]["max_frame_bytes"]
                if len(frame) - HEADER.size > limit:
                    raise ProtocolError(ErrorCode.FRAME_TOO_LARGE,
                                        f"a {op} request of {len(frame) - HEADER.size} bytes "
                                        f"exceeds the server's limit of {limit} bytes")
                try:
                    sock.sendall(frame)
                except OSError as exc:
                    # sendall failed, so the server never got the whole frame, and it
                    # applies only whole frames: safe to resend any request once.
                    self._drop()
                    if attempt == 1:
                        continue
                    raise ConnectionFailed(f"{op}: cannot send to {self._where}: {exc}") from exc
                try:
                    return self._reply(sock, request_id, wait)
                except TimeoutError:
                    self._drop()
                    raise self._no_reply(op, idempotent) from None
                except _Broken as exc:
                    self._drop()
                    if idempotent and attempt == 1:
                        continue
                    if idempotent:
                        raise ConnectionFailed(f"{op}: {exc}") from None
                    raise OutcomeUnknown(f"{op}: {exc} after the request was sent; the change "
                                         "may or may not have been applied") from None
            raise AssertionError("unreachable")

    def _reply(self, sock: socket.socket, request_id: int, wait: float | None) -> Any:
        """The result of request `request_id`, waiting `wait` seconds for it (default:
        the client's timeout)."""
        if wait is not None:             # a long request: wait longer
            sock.settimeout(wait)
        try:
            reply = self._receive(sock)
            if isinstance(reply, Mapping) and reply.get("more") is True:
                return self._pieces(sock, reply, request_id)
            return self._result(reply, request_id)
        finally:
            if wait is not None and self._sock is sock:
                sock.settimeout(self.timeout)

    def _pieces(self, sock: socket.socket, reply: Mapping[str, Any], request_id: int) -> Any:
        """The result of a reply sent in pieces (docs/protocol.md, "Large answers"),
        `reply` its first frame: the frames up to the one without `more`, joined. An
        error frame ends the reply: its error is raised, the pieces dropped."""
        pieces = [self._result(reply, request_id)]
        while reply.get("more") is True:
            reply = self._receive(sock)
            pieces.append(self._result(reply, request_id))  # raises unless a Mapping
        try:
            return join_answers(pieces)
        except ProtocolError:
            self._drop()
            raise

    def _no_reply(self, op: str, idempotent: bool) -> ConnectionFailed:
        """The error of a request whose reply did not come within the timeout."""
        if idempotent:
            return ConnectionFailed(f"{op}: no reply from {self._where} within "
                                    f"{self.timeout:g}s")
        return OutcomeUnknown(f"{op}: no reply from {self._where} within "
                              f"{self.timeout:g}s; the change may or may not have "
                              "been applied")

    @property
    def _where(self) -> str:
        return f"the psoup server at {self.host}:{self.port}"

    def _live_socket(self) -> socket.socket:
        """The connection, reconnected if the server has closed it since the last call."""
        if self._sock is not None and _closed_by_peer(self._sock):
            self._drop()
        if self._sock is None:
            self._connect()
        assert self._sock is not None
        return self._sock

    def _connect(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise ConnectionFailed(f"cannot reach {self._where}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._next_id += 1
        try:
            sock.sendall(pack_frame({"id": self._next_id, "op": OpName.HELLO,
                                     "args": {"token": self._token, "protocol": PROTOCOL,
                                              "pieces": True}}))
            self.server = self._result(self._receive(sock), self._next_id)
            spoken = self.server.get("protocol", 1) if isinstance(self.server, Mapping) else 1
            if spoken != PROTOCOL:
                raise PSoupError(f"{self._where} speaks protocol {spoken}, this client "
                                 f"{PROTOCOL}: install the same psoup version on both sides")
        except (OSError, _Broken) as exc:
            sock.close()
            raise ConnectionFailed(f"{self._where} closed the connection during hello: "
                                   f"{exc}") from None
        except PSoupError as exc:
            sock.close()
            if exc.code == ErrorCode.AUTH:
                raise ProtocolError(ErrorCode.AUTH, f"{exc}: {self._token_hint()}") from None
            raise
        self._sock = sock

    def _token_hint(self) -> str:
        """Where the refused token came from and where the right one is."""
        path = token_path(self.host, self.port)
        sent = {"given": "the token given", "PSOUP_TOKEN": "the token in PSOUP_TOKEN",
                "": f"no token (there is no {path})"}.get(self._token_from,
                                                           f"the token in {path} (stale?)")
        return (f"this client sent {sent}; a server on this machine started without "
                f"--token leaves its token in {path}, else pass the server's token "
                f"{TOKEN_ADVICE}")

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _receive(self, sock: socket.socket) -> Any:
        (size,) = HEADER.unpack(_read_exactly(sock, HEADER.size))
        return unpack_payload(_read_exactly(sock, size))

    def _result(self, reply: Any, request_id: int) -> Any:
        if not isinstance(reply, Mapping) or reply.get("id") not in (request_id, None):
            self._drop()
            raise ConnectionFailed(f"{self._where} sent a reply out of step with the "
                                   f"requests: {str(reply)[:80]}")
        if reply.get("ok"):
            return reply.get("result")
        if reply.get("id") is None:
            self._drop()  # a frame-level error: the server closes the connection
        raise error_of(reply.get("error"))


#: How a Python caller passes the token; the CLI puts its options in place of it.
TOKEN_ADVICE = "as Client(..., token=...) or in the PSOUP_TOKEN environment variable"


def _find_token(host: str, port: int) -> tuple[str | None, str]:
    """The token to send and where it came from ("PSOUP_TOKEN", the token file's path,
    or "" when there is none)."""
    env = os.environ.get("PSOUP_TOKEN")
    if env:
        return env, "PSOUP_TOKEN"
    path = token_path(host, port)
    if path.is_file():
        return path.read_text().strip(), str(path)
    return None, ""


def _closed_by_peer(sock: socket.socket) -> bool:
    # The server never speaks unasked, so a readable idle socket means EOF, a reset, or
    # the one error frame it sends before closing.
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _request_frame(request_id: int, op: str, args: dict[str, Any]) -> bytes:
    """The frame of one request.

    Raises:
        ProtocolError: "bad_args" when msgpack cannot encode the arguments.
    """
    try:
        return pack_frame({"id": request_id, "op": op, "args": args})
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(ErrorCode.BAD_ARGS, f"{op}: cannot encode the arguments: "
                                                f"{exc}") from None


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        try:
            k = sock.recv_into(view[got:])
        except TimeoutError:
            raise
        except OSError as exc:
            raise _Broken(f"the connection broke ({exc})") from None
        if k == 0:
            raise _Broken("the server closed the connection")
        got += k
    return bytes(buf)


def _slice_rows(rows: Any, ts: Any, start: int, stop: int | None) -> dict[str, Any]:
    """The insert arguments for rows[start:stop]: raw columns for a dict, rows otherwise."""
    cut = slice(start, stop)
    if isinstance(rows, Mapping):
        part: dict[str, Any] = {"columns": {name: _column(values[cut])
                                            for name, values in rows.items()}}
    else:
        part = {"rows": list(rows[cut])}
    if ts is None or isinstance(ts, (int, float, np.number)):
        part["ts"] = ts
    else:
        part["ts"] = encode_array(np.asarray(ts[cut])) if isinstance(ts, np.ndarray) \
            else list(ts[cut])
    return part


def _column(values: Any) -> Any:
    if isinstance(values, np.ndarray) and values.dtype.kind == "u" and values.itemsize == 8:
        return values.tolist()  # encode_array would wrap values >= 2**63 into negatives
    return encode_array(values)


def _in_batch(exc: PSoupError, start: int, stop: int | None, total: int | None) -> PSoupError:
    """`exc` with the rows of the failed batch named, when an insert took several."""
    if stop is None or (start == 0 and stop == total):
        return exc
    stored = f"rows 0..{start - 1} were stored" if start else "nothing was stored"
    message = f"{exc} (in rows {start}..{stop - 1} of an insert of {total}; {stored})"
    if isinstance(exc, ProtocolError):
        return ProtocolError(exc.code, message)
    if isinstance(exc, DiskFull):
        return DiskFull(message, exc.path)
    return type(exc)(message)


def _name(name: str) -> str:
    """`name` for a statement, refused unless it is one name (so nothing else is sent
    as SQL)."""
    from psoup.query.tokens import is_identifier
    if not is_identifier(name):
        raise QueryError(f"{name!r} is not a stream name (letters, digits, _)")
    return name
