"""The psoup wire protocol (docs/protocol.md): length-prefixed msgpack frames, and the
translation between engine values (Result, Changes, errors) and msgpack values.

Shared by the server and `psoup.client`, so that both sides agree on one encoding. A
frame is a 4-byte big-endian payload length followed by the msgpack payload; numeric
columns travel as raw little-endian bytes (`psoup.codec`), so an answer of a million rows
costs one memcpy per column, not a million msgpack objects.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from functools import partial
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


def _rows_part(result: Result, rows: slice | None = None) -> dict[str, Any]:
    """The encoded rows of `result`, or of its rows `rows` only (a piece)."""
    cut = slice(None) if rows is None else rows
    tuple_ids = np.asarray(result.tuple_ids, np.int64)
    values: list[Any] | None = result.values
    part: dict[str, Any] = {}
    if values is None:
        kept = result.rows if rows is None else result.rows[cut]
        values = [[row[i] for row in kept] for i in range(len(result.columns))]
        part["rows"] = True
    elif rows is not None:
        values = [v[cut] for v in values]
    part |= {"values": [_encode_values(v) for v in values],
            "ts": encode_array(np.asarray(result.ts, np.float64)[cut]),
            "tuple_ids": encode_array(tuple_ids[cut].ravel())}
    if tuple_ids.ndim == 2:                  # a join: one tupleID per FROM item, row-major
        part["tuple_ids_per_row"] = tuple_ids.shape[1]
    if result.keys is not None:
        part["keys"] = result.keys if rows is None else result.keys[cut]
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
    return _encoded(answer, None, None)


def _encoded(answer: Result | Changes, rows: slice | None,
             deleted: slice | None) -> dict[str, Any]:
    """`answer` encoded whole (`rows` and `deleted` None), or one piece of it: its rows
    `rows` (of a Changes, the inserted rows `rows` and the deleted rows `deleted`)."""
    if isinstance(answer, Changes):
        changes: dict[str, Any] = {"kind": AnswerKind.CHANGES.value, "columns": answer.columns,
                                   "inserted": _rows_part(answer.inserted, rows),
                                   "deleted": _rows_part(answer.deleted, deleted),
                                   "cursor": answer.cursor}
        if answer.fresh_to is not None:
            changes["fresh_to"] = answer.fresh_to
        return changes
    wire = {"kind": AnswerKind.ANSWER.value, "columns": answer.columns,
            **_rows_part(answer, rows), "cursor": answer.cursor}
    if answer.fresh_to is not None:     # an answer over a stream fed by a source
        wire["fresh_to"] = answer.fresh_to
    if not answer.exact:                # a TABLESAMPLE answer: its rates and errors
        cut = slice(None) if rows is None else rows
        wire["fidelity"] = [list(f) for f in answer.fidelity]
        wire["error"] = {name: encode_array(np.asarray(e, np.float64)[cut])
                         for name, e in answer.error.items()}
    return wire


# ---------------------------------------------------------------------- answers in pieces

#: The default bound of one reply frame's answer, in bytes: an answer estimated larger
#: goes out as a sequence of pieces of about this size each (to a client that accepts
#: them; docs/protocol.md, "Large answers"). Measured on the 2-core EPYC of bench/results
#: with a 2M-row answer of 3 numeric columns (76 MiB) and a 200K-row one with a TEXT
#: column (7 MiB): a 1 MiB piece takes 0.14 ms (numeric) to 0.7 ms (text) to encode and
#: pack, so another client's reply waits about that between two pieces, and all the
#: pieces together cost 0.1-0.45x one frame of the whole answer (whose fresh 76 MiB
#: buffer alone took 290 ms); 16 MiB pieces take 12-14 ms each, and 64 KiB pieces
#: make 1,222 frames (and as many thread hops) of one answer.
PIECE_BYTES = 1 << 20

#: Bytes a value of each numpy kind takes on the wire (raw arrays; a bool is one byte).
_ITEM_BYTES = {"b": 1, "i": 8, "u": 8, "f": 8}
#: Values sampled to estimate the wire size of a column of Python values (TEXT): few,
#: since every invocation's reply is estimated (16 cost ~1 us).
_SAMPLE = 16


def _column_bytes(column: Any) -> float:
    """The estimated wire bytes of one value of `column` (a numpy array or a list): a
    text value's length in characters (its UTF-8 bytes for ASCII) from a sample."""
    if isinstance(column, np.ndarray) and column.dtype.kind in _ITEM_BYTES:
        return _ITEM_BYTES[column.dtype.kind]
    sample = column[::max(1, len(column) // _SAMPLE)][:_SAMPLE]
    if not len(sample):
        return 0.0
    return 2 + sum(len(v) if type(v) is str else 8 for v in sample) / len(sample)


def _row_bytes(result: Result) -> float:
    """The estimated wire bytes of one row of `result`: its values, ts, tupleIDs, group
    key and error estimates. O(columns), and a sample of each text column."""
    tuple_ids = np.asarray(result.tuple_ids)
    width = 8 + 8 * (tuple_ids.shape[1] if tuple_ids.ndim == 2 else 1) + 8 * len(result.error)
    if result.keys is not None:
        width += 2 + 9 * (len(result.keys[0]) if result.keys else 0)
    if result.values is not None:
        return width + sum(_column_bytes(v) for v in result.values)
    rows = result.rows
    return width + sum(_column_bytes([row[i] for row in rows[::max(1, len(rows) // _SAMPLE)]])
                       for i in range(len(result.columns)))


def answer_bytes(answer: Result | Changes) -> float:
    """The estimated size of `answer` on the wire, in bytes (not counting the column
    names and the cursor). O(columns), not O(rows).

    Example:
        >>> answer_bytes(Result(["a"], None, np.zeros(10), np.arange(10),
        ...                     values=[np.arange(10)]))
        240.0
    """
    if isinstance(answer, Changes):
        return answer_bytes(answer.inserted) + answer_bytes(answer.deleted)
    return float(len(answer) * _row_bytes(answer))


def _spans(result: Result, piece_bytes: int) -> list[slice]:
    """`result`'s rows cut into runs of about `piece_bytes` each (none when empty)."""
    n = len(result)
    per = max(1, int(piece_bytes // max(_row_bytes(result), 1.0))) if n else 1
    return [slice(a, min(a + per, n)) for a in range(0, n, per)]


def answer_pieces(answer: Result | Changes,
                  piece_bytes: int = PIECE_BYTES) -> list[Callable[[], dict[str, Any]]]:
    """`answer` as pieces of about `piece_bytes` each on the wire: one function per
    piece, in order, each returning that piece encoded as an `invoke` result (the rows
    of an answer, or the inserted then the deleted rows of changes, a run at a time).
    Encoding happens when a function is called, so a server encodes a piece, sends it,
    and only then encodes the next. `join_answers` of the pieces is `encode_answer` of
    the whole. At least one piece, even for an empty answer.

    Example:
        >>> r = Result(["a"], None, np.zeros(5), np.arange(5), values=[np.arange(5)])
        >>> pieces = answer_pieces(r, piece_bytes=48)
        >>> [len(decode_array(p()["ts"])) for p in pieces]
        [2, 2, 1]
    """
    none = slice(0, 0)
    if isinstance(answer, Changes):
        runs = ([(rows, none) for rows in _spans(answer.inserted, piece_bytes)]
                + [(none, rows) for rows in _spans(answer.deleted, piece_bytes)])
    else:
        runs = [(rows, None) for rows in _spans(answer, piece_bytes)]
    if len(runs) <= 1:
        return [partial(encode_answer, answer)]
    return [partial(_encoded, answer, rows, deleted) for rows, deleted in runs]


def _joined_column(parts: list[Any]) -> Any:
    """Encoded columns (pieces of one column) as one: raw bytes joined when every part
    is a raw array of one dtype, else a list of the values."""
    first = parts[0]
    if all(isinstance(p, Mapping) for p in parts) and all(
            p.get("dtype") == first.get("dtype") and isinstance(p.get("data"), bytes)
            for p in parts):
        return {"dtype": first["dtype"], "data": b"".join(p["data"] for p in parts)}
    joined: list[Any] = []
    for part in parts:
        values = decode_array(part)
        joined += values.tolist() if isinstance(values, np.ndarray) else values
    return joined


def _joined_rows(parts: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The rows parts (`values`, `ts`, `tuple_ids`, `keys`) of pieces as one."""
    width = len(parts[0]["values"])
    if any(len(p["values"]) != width for p in parts):
        raise ValueError("pieces with different numbers of columns")
    joined: dict[str, Any] = {k: parts[0][k] for k in ("rows", "tuple_ids_per_row")
                              if k in parts[0]}
    joined["values"] = [_joined_column([p["values"][i] for p in parts]) for i in range(width)]
    for key in ("ts", "tuple_ids"):
        joined[key] = _joined_column([p[key] for p in parts])
    if "keys" in parts[0]:
        joined["keys"] = [key for p in parts for key in p["keys"]]
    return joined


def join_answers(pieces: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The `invoke` results of a reply sent in pieces as the one result they are parts
    of (what `encode_answer` gives for the whole answer, up to how an aggregated
    answer's columns are encoded); `decode_answer` takes it.

    Raises:
        ProtocolError: "bad_frame" when the pieces do not fit together (another kind,
            other columns, another cursor, missing fields).

    Example:
        >>> r = Result(["a"], None, np.zeros(5), np.arange(5), values=[np.arange(5)])
        >>> wire = join_answers([p() for p in answer_pieces(r, piece_bytes=48)])
        >>> decode_answer(wire).rows
        [(0,), (1,), (2,), (3,), (4,)]
    """
    try:
        first = pieces[0]
        same = ("kind", "columns", "cursor")
        if any(any(p.get(k) != first.get(k) for k in (*same, "fresh_to")) for p in pieces):
            raise ValueError("pieces of different answers")
        joined = {k: first[k] for k in same}
        if "fresh_to" in first:
            joined["fresh_to"] = first["fresh_to"]
        if first["kind"] == AnswerKind.CHANGES:
            for part in ("inserted", "deleted"):
                joined[part] = _joined_rows([p[part] for p in pieces])
            return joined
        joined |= _joined_rows(pieces)
        if "fidelity" in first:
            joined["fidelity"] = first["fidelity"]
            joined["error"] = {name: _joined_column([p["error"][name] for p in pieces])
                               for name in first.get("error") or {}}
        return joined
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"an answer in pieces that do not fit "
                                                 f"together ({type(exc).__name__}: {exc})"
                            ) from None


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
    fresh_to = wire.get("fresh_to")
    if fresh_to is not None:
        fresh_to = float(fresh_to)
    if wire["kind"] == AnswerKind.CHANGES:
        return Changes(columns, _result_of(columns, wire["inserted"], None),
                       _result_of(columns, wire["deleted"], None), wire["cursor"], fresh_to)
    result = _result_of(columns, wire, wire["cursor"])
    result.fresh_to = fresh_to
    if "fidelity" in wire:
        result.fidelity = tuple(tuple(map(float, f)) for f in wire["fidelity"])
        result.error = {str(name): np.asarray(decode_array(e), np.float64)
                        for name, e in (wire.get("error") or {}).items()}
    return result
