"""The psoup wire protocol (docs/protocol.md): length-prefixed msgpack frames, and the
translation between engine values (Result, Changes, errors) and msgpack values.

Shared by the server and `psoup.client`, so that both sides agree on one encoding. A
frame is a 4-byte big-endian payload length followed by the msgpack payload; numeric
columns travel as raw little-endian bytes (`psoup.codec`), so an answer of a million rows
costs one memcpy per column, not a million msgpack objects.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np
from numpy.typing import NDArray

from psoup.codec import decode_array, encode_array
from psoup.errors import (
    Busy,
    CursorExpired,
    DiskFull,
    HistoryPending,
    LimitError,
    PSoupError,
    QueryError,
    SchemaError,
    SequenceError,
    UnknownHandle,
)
from psoup.results.result import Changes, Result
from psoup.strenum import StrEnum

#: The frame header: the payload length, unsigned 32-bit big-endian.
HEADER = struct.Struct(">I")

#: The version of the message encodings, exchanged in `hello`; both sides must speak the
#: same one. 2: answers travel as encoded columns (1 sent them as lists of rows).
PROTOCOL = 2

#: Engine errors by wire code; any other code is a plain PSoupError carrying that code.
ERRORS: dict[str, type[PSoupError]] = {
    cls.code: cls for cls in (QueryError, SchemaError, UnknownHandle, CursorExpired, LimitError,
                               SequenceError, HistoryPending, DiskFull)
}


class ErrorCode(StrEnum):
    """The wire codes of the errors the protocol itself answers with (docs/protocol.md,
    "Errors"); an engine error's code is its class's `code` (psoup.errors). A member
    equals, packs and prints as its string, which is what travels.

    Example:
        >>> ErrorCode.BAD_ARGS == "bad_args", f"{ErrorCode.BAD_ARGS}"
        (True, 'bad_args')
    """

    BAD_FRAME = "bad_frame"              # these four close the connection
    FRAME_TOO_LARGE = "frame_too_large"
    AUTH = "auth"
    PROTOCOL = "protocol"
    UNKNOWN_OP = "unknown_op"
    BAD_ARGS = "bad_args"
    LIMIT = "limit"
    VALUE_RANGE = "value_range"
    SKIPPED = "skipped"
    BUSY = "busy"
    INTERNAL = "internal"


class AnswerKind(StrEnum):
    """The `kind` of an invocation's answer on the wire: a whole answer (a Result) or
    the changes since a cursor (Changes)."""

    ANSWER = "answer"
    CHANGES = "changes"


class ProtocolError(PSoupError):
    """A request the protocol rejects before the engine sees it (bad frame, unknown op,
    bad arguments, a limit, authentication), or an error reply with a code that names no
    engine error.

    Attributes:
        code: the wire code, e.g. "bad_args", "limit", "auth".

    Example:
        >>> e = ProtocolError(ErrorCode.LIMIT, "batch of 5 rows exceeds the limit of 4")
        >>> e.code, str(e)
        ('limit', 'batch of 5 rows exceeds the limit of 4')
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = str(code)       # an ErrorCode as its plain string, as the wire has it


def _default(value: Any) -> Any:
    # numpy scalars and arrays can reach the packer through stats() or a client's rows.
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, int):          # msgpack's integers stop at 64 bits
        raise ProtocolError(ErrorCode.VALUE_RANGE,
                            f"the integer {value} does not fit the protocol's "
                            "64-bit integers (a SUM over INT beyond 2**64?); invoke the "
                            "query embedded, or sum a FLOAT column")
    raise TypeError(f"cannot send a value of type {type(value).__name__}")


def pack_frame(message: Any) -> bytes:
    """One message as a frame: header + msgpack payload.

    Raises:
        TypeError: a value msgpack cannot represent.

    Example:
        >>> frame = pack_frame({"id": 1, "op": "ping", "args": {}})
        >>> HEADER.unpack(frame[:4])[0] == len(frame) - 4
        True
    """
    payload: bytes = msgpack.packb(message, use_bin_type=True, default=_default)
    return HEADER.pack(len(payload)) + payload


def unpack_payload(payload: bytes) -> Any:
    """A frame's payload as a Python value.

    Raises:
        ProtocolError: "bad_frame" when the bytes are not exactly one msgpack value.

    Example:
        >>> unpack_payload(pack_frame([1, "x"])[4:])
        [1, 'x']
    """
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(ErrorCode.BAD_FRAME, f"undecodable msgpack payload of {len(payload)} "
                                                 f"bytes ({type(exc).__name__}: {exc})") from None


def request(payload: bytes) -> tuple[Any, str, Mapping[str, Any]]:
    """A request payload as (id, op, args); `args` defaults to an empty map.

    Raises:
        ProtocolError: "bad_frame" when it is not a map with an id and an op.

    Example:
        >>> request(pack_frame({"id": 7, "op": "ping"})[4:])
        (7, 'ping', {})
    """
    message = unpack_payload(payload)
    if not isinstance(message, Mapping):
        raise ProtocolError(ErrorCode.BAD_FRAME, f"a request must be a map, not "
                                                 f"{type(message).__name__}")
    missing = [key for key in ("id", "op") if key not in message]
    if missing:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"a request needs an id and an op (missing: "
                                                 f"{', '.join(missing)})")
    return message["id"], message["op"], message.get("args") or {}


def ok_reply(request_id: Any, result: Any) -> dict[str, Any]:
    return {"id": request_id, "ok": True, "result": result}


def error_reply(request_id: Any, code: str, message: str, **extra: Any) -> dict[str, Any]:
    """An error reply; `extra` adds fields to its error map (a busy reply's
    `retry_after`)."""
    return {"id": request_id, "ok": False,
            "error": {"code": str(code), "message": message, **extra}}


def error_fields(exc: PSoupError) -> dict[str, Any]:
    """The fields an engine error adds to its reply's error map: a disk_full error's
    `path` (the client's DiskFull has it too).

    Example:
        >>> error_fields(DiskFull("the disk is full: ...", "/d/wal")), error_fields(Busy("x"))
        ({'path': '/d/wal'}, {})
    """
    return {"path": exc.path} if isinstance(exc, DiskFull) and exc.path else {}


def error_of(error: Any) -> PSoupError:
    """The exception a client raises for an error reply's `error` map.

    Example:
        >>> type(error_of({"code": "schema", "message": "row 0: bad"})).__name__
        'SchemaError'
        >>> error_of({"code": "limit", "message": "too many"}).code
        'limit'
    """
    if not isinstance(error, Mapping):
        return ProtocolError(ErrorCode.INTERNAL, f"malformed error reply: {error!r}")
    code, message = str(error.get("code", "error")), str(error.get("message", ""))
    if code == Busy.code:
        after = error.get("retry_after")
        return Busy(message, float(after) if isinstance(after, (int, float)) and
                    0 <= after <= 60 else 1.0)
    if code == DiskFull.code:
        return DiskFull(message, str(error.get("path", "")))
    cls = ERRORS.get(code)
    return cls(message) if cls is not None else ProtocolError(code, message)


# ---------------------------------------------------------------------- answers

#: The Python types that travel as raw arrays when a whole column of rows holds one of them.
_RAW_OF = {int: np.dtype("<i8"), float: np.dtype("<f8"), bool: np.dtype("|b1")}
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _encode_values(column: Any) -> Any:
    """One output column as an encoded array. A numpy column is sent as is (raw bytes, or
    a list for TEXT); a column of Python values (an aggregated answer's) as raw bytes
    when every value has one type that an array holds exactly (ints within int64, floats,
    bools), else as a list, so ints, floats and None come back as they left."""
    if isinstance(column, np.ndarray):
        return encode_array(column)
    kinds = set(map(type, column))
    dtype = _RAW_OF.get(kinds.pop()) if len(kinds) == 1 else None
    if dtype is None or (dtype.kind == "i" and not
                         _INT64[0] <= min(column) <= max(column) <= _INT64[1]):
        return list(column)
    return encode_array(np.array(column, dtype=dtype))


def _rows_part(result: Result) -> dict[str, Any]:
    tuple_ids = np.asarray(result.tuple_ids, np.int64)
    values: list[Any] | None = result.values
    part: dict[str, Any] = {}
    if values is None:
        rows = result.rows
        values = [[row[i] for row in rows] for i in range(len(result.columns))]
        part["rows"] = True
    part |= {"values": [_encode_values(v) for v in values],
            "ts": encode_array(np.asarray(result.ts, np.float64)),
            "tuple_ids": encode_array(tuple_ids.ravel())}
    if tuple_ids.ndim == 2:                  # a join: one tupleID per FROM item, row-major
        part["tuple_ids_per_row"] = tuple_ids.shape[1]
    if result.keys is not None:
        part["keys"] = result.keys
    return part


def encode_answer(answer: Result | Changes) -> dict[str, Any]:
    """An invocation's Result or Changes as the `invoke` reply's result: each output
    column an encoded array (`psoup.codec`), so numbers cross as raw bytes.

    Example:
        >>> r = Result(["a"], [(1,)], np.array([5.0]), np.array([3]), cursor="c")
        >>> wire = encode_answer(r)
        >>> wire["kind"], wire["values"][0]["dtype"], wire["cursor"]
        ('answer', '<i8', 'c')
    """
    if isinstance(answer, Changes):
        return {"kind": AnswerKind.CHANGES.value, "columns": answer.columns,
                "inserted": _rows_part(answer.inserted), "deleted": _rows_part(answer.deleted),
                "cursor": answer.cursor}
    wire = {"kind": AnswerKind.ANSWER.value, "columns": answer.columns, **_rows_part(answer),
            "cursor": answer.cursor}
    if not answer.exact:                # a TABLESAMPLE answer: its rates and errors
        wire["fidelity"] = [list(f) for f in answer.fidelity]
        wire["error"] = {name: encode_array(np.asarray(e, np.float64))
                         for name, e in answer.error.items()}
    return wire


def _result_of(columns: list[str], part: Mapping[str, Any], cursor: str | None) -> Result:
    ts = np.array(decode_array(part["ts"]), dtype=np.float64)
    tuple_ids = np.array(decode_array(part["tuple_ids"]), dtype=np.int64)
    width = part.get("tuple_ids_per_row")
    if width:
        tuple_ids = tuple_ids.reshape(-1, int(width))
    keys = part.get("keys")
    keys = None if keys is None else [tuple(key) for key in keys]
    values = [decode_array(v) for v in part["values"]]
    if part.get("rows"):            # Python values (an aggregated answer's): its rows
        as_lists = [v.tolist() if isinstance(v, np.ndarray) else v for v in values]
        return Result(columns, list(zip(*as_lists, strict=True)) if as_lists else [], ts, tuple_ids,
                      cursor, keys=keys)
    return Result(columns, None, ts, tuple_ids, cursor, keys=keys,
                  values=[v if isinstance(v, np.ndarray) else _objects(v) for v in values])


def _objects(values: list[Any]) -> NDArray[np.object_]:
    """A list (a TEXT column) as the object array the engine holds."""
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def decode_answer(wire: Mapping[str, Any]) -> Result | Changes:
    """The inverse of `encode_answer`: the same classes the engine returns, holding the
    columns (rows are built from them when first used).

    Example:
        >>> r = Result(["a"], [(1,)], np.array([5.0]), np.array([3]), cursor="c")
        >>> back = decode_answer(unpack_payload(pack_frame(encode_answer(r))[4:]))
        >>> back.rows, back.ts.tolist(), back.tuple_ids.tolist(), back.cursor
        ([(1,)], [5.0], [3], 'c')
    """
    columns = list(wire["columns"])
    if wire["kind"] == AnswerKind.CHANGES:
        return Changes(columns, _result_of(columns, wire["inserted"], None),
                       _result_of(columns, wire["deleted"], None), wire["cursor"])
    result = _result_of(columns, wire, wire["cursor"])
    if "fidelity" in wire:
        result.fidelity = tuple(tuple(map(float, f)) for f in wire["fidelity"])
        result.error = {str(name): np.asarray(decode_array(e), np.float64)
                        for name, e in (wire.get("error") or {}).items()}
    return result
