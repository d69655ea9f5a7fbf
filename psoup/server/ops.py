"""The operations of the psoup protocol, in one table both sides read (docs/protocol.md).

Each `Op` says what the server and the client must agree on:

* `write`: the server applies it on its one writer thread and commits the log before
  replying (group commit; a registration scans the retained rows on a registration
  thread first, and the writer only ends it); reads run on the event loop when the
  engine is idle, else together on a read thread;
* `idempotent`: a client may send it again when the connection broke before the reply
  (reads, and cancelling a history job); a non-idempotent write whose reply was lost
  has an unknown outcome;
* `parse`: the arguments checked on the event loop, cheap (types, limits, zero-copy
  column decoding), returned as what `run` takes; a bad one is a `bad_args` reply;
* `run`: the call on an `EngineAPI` (the engine), where `write` says; its value is the
  reply's result; invoke's is the engine's Result or Changes, which the server encodes,
  in one frame or, when it is large, in pieces (docs/protocol.md, "Large answers").

A new operation is one `OpName` and one `Op` here, the method it calls on `Engine` and
`Client`, and its section in docs/protocol.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from psoup.api import EngineAPI
from psoup.codec import decode_array, decode_columns
from psoup.server.protocol import PIECE_BYTES, ErrorCode, ProtocolError, encode_answer
from psoup.strenum import StrEnum


@dataclass(frozen=True)
class Limits:
    """What one request or connection may cost the server; beyond it, an error reply.

    Attributes:
        max_frame_bytes: the largest frame payload; a larger announced length gets a
            "frame_too_large" reply and the connection is closed without reading it.
        max_batch_rows: the most rows one insert may carry ("limit").
        max_query_chars: the longest SQL text ("limit").
        max_factors: the most AND-ed factors in a WHERE clause ("limit"); each factor is
            a row of the predicate index, so this bounds what one query costs every
            later batch. The server's engine compiles with it.
        read_timeout: seconds a started frame may take to arrive in full once a
            connection is authenticated; otherwise the connection is closed.
        max_queries: standing queries the server's engine holds at once (None: no
            limit); one more register gets a "limit" reply.
        max_stream_bytes, max_results_bytes: the engine's memory limits (None: none;
            see psoup.Engine): a batch or a registration beyond one gets a "limit" reply.
        max_connections: authenticated connections; one more hello gets a "limit" reply
            and is closed.
        hello_frame_bytes: the largest frame before a connection's hello succeeded (a
            larger one gets "frame_too_large" unread): an unauthenticated peer can make
            the server buffer no more than this.
        hello_timeout: seconds a new connection has to complete its hello; otherwise it
            is closed.
        max_unauthenticated: connections that have not said hello yet, counted apart
            from max_connections (so they never take an authenticated client's place);
            one more closes the oldest of them, so silent sockets cannot keep a client
            out. Large enough for a burst of clients connecting at once (100 pollers
            starting together outran 64: the server accepts them before it reads their
            hellos); each holds at most hello_frame_bytes, 4 MiB in all.
        max_group_writes: the most writes applied between two commits.
        max_in_flight: requests one connection may have sent and not yet had answered
            (pipelining); the server stops reading that connection beyond it.
        max_queued_bytes: bytes of inserts received and not yet applied, across all
            connections: the ingest queue. An insert beyond it gets a "busy" reply with
            `retry_after` seconds (nothing applied, nothing dropped: the client sends
            it again), and so does each insert its connection sent after it with
            "chain"; an insert into an empty queue is always taken. Memory then stays
            bounded when producers send faster than the engine applies.
        piece_bytes: an answer estimated larger than this on the wire goes out as a
            sequence of frames of about this size each, to a client that said it takes
            them (hello's `pieces`); each is encoded off the event loop and the engine
            lock just before it is sent, so other clients' replies go out in between.
    """

    max_frame_bytes: int = 64 << 20
    max_batch_rows: int = 1_000_000
    max_query_chars: int = 64 << 10
    max_factors: int = 256
    read_timeout: float = 30.0
    max_queries: int | None = None
    max_stream_bytes: int | None = None
    max_results_bytes: int | None = None
    max_connections: int = 1024
    hello_frame_bytes: int = 4096
    hello_timeout: float = 5.0
    max_unauthenticated: int = 1024
    max_group_writes: int = 256
    max_in_flight: int = 16
    max_queued_bytes: int = 256 << 20
    piece_bytes: int = PIECE_BYTES


class OpName(StrEnum):
    """The operations' names, as requests carry them in `op`: `hello` (a connection's
    first request, handled by the server itself) and one per entry of `OPS`. A member
    equals, packs and prints as its string.

    Example:
        >>> OpName.INVOKE == "invoke", f"{OpName.INVOKE}"
        (True, 'invoke')
    """

    HELLO = "hello"
    PING = "ping"
    CREATE_STREAM = "create_stream"
    EXECUTE = "execute"
    INSERT = "insert"
    LAST_SEQ = "last_seq"
    REGISTER = "register"
    INVOKE = "invoke"
    UNREGISTER = "unregister"
    QUERIES = "queries"
    STATS = "stats"
    HISTORY = "history"
    HISTORY_STATUS = "history_status"
    HISTORY_CANCEL = "history_cancel"


@dataclass(frozen=True)
class Op:
    """One protocol operation (see the module docstring)."""

    name: OpName
    write: bool
    idempotent: bool
    parse: Callable[[Mapping[str, Any], Limits], dict[str, Any]]
    run: Callable[[EngineAPI, dict[str, Any]], Any]


def arg(args: Mapping[str, Any], name: str, types: type | tuple[type, ...], what: str,
        required: bool = True) -> Any:
    """Argument `name` of `args`, of one of `types` (bool is not a number here).

    Raises:
        ProtocolError: "bad_args", naming the argument and what it must be.

    Example:
        >>> arg({"n": 3}, "n", int, "a count")
        3
    """
    value = args.get(name)
    if value is None:
        if required:
            raise ProtocolError(ErrorCode.BAD_ARGS, f"missing argument '{name}' ({what})")
        return None
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise ProtocolError(ErrorCode.BAD_ARGS, f"argument '{name}' must be {what}, not "
                                                f"{type(value).__name__}")
    return value


def _sql(args: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    sql = arg(args, "sql", str, "a SQL statement")
    if len(sql) > limits.max_query_chars:
        raise ProtocolError(ErrorCode.LIMIT, f"a statement of {len(sql)} characters exceeds the "
                                             f"limit of {limits.max_query_chars}")
    return {"sql": sql}


def _handle(args: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    return {"handle": arg(args, "handle", str, "a handle")}


def _nothing(args: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    return {}


def _create_stream(args: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    name = arg(args, "name", str, "a stream name")
    columns = arg(args, "columns", (list, Mapping),
                  "a list of [name, type] pairs or a map of name -> type")
    pairs = list(columns.items()) if isinstance(columns, Mapping) else columns
    if not all(isinstance(p, (list, tuple)) and len(p) == 2 and
               all(isinstance(x, str) for x in p) for p in pairs):
        raise ProtocolError(ErrorCode.BAD_ARGS, "argument 'columns' must hold [name, type] pairs "
                                                "of strings")
    retain = arg(args, "retain", str, 'a retention such as "1 hour"', required=False)
    return {"name": name, "columns": [tuple(p) for p in pairs], "retain": retain}


def _insert(args: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    stream = arg(args, "stream", str, "a stream name")
    if (args.get("rows") is None) == (args.get("columns") is None):
        raise ProtocolError(ErrorCode.BAD_ARGS, "insert takes exactly one of 'rows' (a list of "
                                                "rows) and 'columns' (a map of encoded columns)")
    try:
        if args.get("rows") is not None:
            rows: Any = arg(args, "rows", list, "a list of rows")
            n = len(rows)
        else:
            rows = decode_columns(args["columns"])
            n = max((len(values) for values in rows.values()), default=0)
        ts = args.get("ts")
        if isinstance(ts, (list, Mapping)):
            ts = decode_array(ts)
        elif ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
            raise ValueError(f"ts must be null, a number, a list or an encoded float64 "
                             f"array, not {type(ts).__name__}")
    except ValueError as exc:
        raise ProtocolError(ErrorCode.BAD_ARGS, str(exc)) from None
    if n > limits.max_batch_rows:
        raise ProtocolError(ErrorCode.LIMIT, f"a batch of {n} rows exceeds the limit of "
                                             f"{limits.max_batch_rows}; split it")
    producer = arg(args, "producer", str, "a producer id", required=False)
    seq = arg(args, "seq", int, "the batch's sequence number", required=False)
    if (producer is None) != (seq is None):
        raise ProtocolError(ErrorCode.BAD_ARGS, "insert takes both 'producer' and 'seq' (an "
                                                "idempotency key) or neither")
    return {"stream": stream, "rows": rows, "ts": ts, "producer": producer, "seq": seq}


def _inserted(engine: EngineAPI, a: dict[str, Any]) -> dict[str, Any]:
    ids = engine.insert(a["stream"], a["rows"], a["ts"], producer=a["producer"], seq=a["seq"])
    return {"first": int(ids[0]) if len(ids) else None, "n": len(ids)}


def _invoke(args: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    return {"handle": arg(args, "handle", str, "a handle"),
            "now": arg(args, "now", (int, float), "a number of seconds", required=False),
            "since": arg(args, "since", str, "a cursor", required=False)}


def _history(args: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    handles = arg(args, "handles", list, "a list of handles", required=False)
    if handles is not None and not all(isinstance(h, str) for h in handles):
        raise ProtocolError(ErrorCode.BAD_ARGS, "argument 'handles' must be a list of handles")
    if "master" in args:
        raise ProtocolError(ErrorCode.BAD_ARGS,
                            "argument 'master' is not accepted: the Spark master "
                            "is the server's configuration (psoup serve "
                            "--spark-master)")
    return {"handles": handles}


def _job(args: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    return {"job": arg(args, "job", str, "a history job id", required=False)}


def _job_required(args: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    return {"job": arg(args, "job", str, "a history job id")}


def _executed(engine: EngineAPI, a: dict[str, Any]) -> Any:
    """A statement's value: a handle, null, or (SHOW, DESCRIBE) a table as an answer."""
    value = engine.execute(a["sql"])
    return value if value is None or isinstance(value, str) else encode_answer(value)


def plain(value: Any) -> Any:
    """`value` with only msgpack types: numpy values become Python ones, and anything
    else a stats dict might grow (paths, sets) becomes its str.

    Example:
        >>> plain({"n": np.int64(3), "s": {1}})
        {'n': 3, 's': [1]}
    """
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, (np.generic, np.ndarray)):
        return plain(value.tolist())
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    return str(value)


#: Every operation but `hello` (the first request of a connection, see docs/protocol.md).
OPS: dict[str, Op] = {op.name.value: op for op in (
    Op(OpName.PING, False, True, _nothing, lambda e, a: "pong"),
    Op(OpName.CREATE_STREAM, True, False, _create_stream,
       lambda e, a: e.create_stream(a["name"], a["columns"], a["retain"])),
    Op(OpName.EXECUTE, True, False, _sql, _executed),
    Op(OpName.INSERT, True, False, _insert, _inserted),
    Op(OpName.LAST_SEQ, False, True,
       lambda args, limits: {"producer": arg(args, "producer", str, "a producer id")},
       lambda e, a: e.last_seq(a["producer"])),
    Op(OpName.REGISTER, True, False, _sql, lambda e, a: e.register(a["sql"])),
    Op(OpName.INVOKE, False, True, _invoke,
       lambda e, a: e.invoke(a["handle"], now=a["now"], since=a["since"])),
    Op(OpName.UNREGISTER, True, False, _handle, lambda e, a: e.unregister(a["handle"])),
    Op(OpName.QUERIES, False, True, _nothing, lambda e, a: e.queries()),
    Op(OpName.STATS, False, True, _nothing, lambda e, a: plain(e.stats())),
    # history starts a job and answers at once: Spark runs on the job's thread, holding
    # neither the writer thread nor the engine's lock (psoup.spark.jobs)
    Op(OpName.HISTORY, True, False, _history, lambda e, a: {"job": e.history(a["handles"])}),
    Op(OpName.HISTORY_STATUS, False, True, _job, lambda e, a: plain(e.history_status(a["job"]))),
    Op(OpName.HISTORY_CANCEL, False, True, _job_required,
       lambda e, a: plain(e.history_cancel(a["job"]))),
)}
