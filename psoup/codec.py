"""Columns as msgpack values: the one encoding shared by the wire protocol and the
write-ahead log.

A numeric or boolean numpy array travels as ``{"dtype": "<i8" | "<f8" | "|b1",
"data": raw little-endian bytes}``, so a batch of a million values is one memcpy on each
side instead of a million msgpack objects. Text columns travel as lists of str. A plain
list is also accepted on decode, for clients that send Python values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

#: The array types that travel as raw bytes (int64, float64, bool).
RAW_DTYPES = {"<i8": np.dtype("<i8"), "<f8": np.dtype("<f8"), "|b1": np.dtype("|b1")}


def encode_array(values: Any) -> Any:
    """A numpy array (or sequence) as a msgpack-ready value.

    Example:
        >>> encode_array(np.array([1, 2]))["dtype"]
        '<i8'
        >>> encode_array(np.array(["x"], dtype=object))
        ['x']
    """
    if isinstance(values, np.ndarray):
        dtype: np.dtype[Any]
        if values.dtype.kind in "iub":
            dtype = np.dtype("|b1") if values.dtype.kind == "b" else np.dtype("<i8")
        elif values.dtype.kind == "f":
            dtype = np.dtype("<f8")
        else:
            return values.tolist()
        return {"dtype": dtype.str, "data": np.ascontiguousarray(values, dtype=dtype).tobytes()}
    return list(values)


def decode_array(value: Any) -> Any:
    """The inverse of `encode_array`: a numpy array for raw bytes, a list otherwise.

    Raises:
        ValueError: an unknown dtype, or bytes that are not a whole number of items.

    Example:
        >>> decode_array(encode_array(np.array([1.5, 2.0]))).tolist()
        [1.5, 2.0]
    """
    if isinstance(value, Mapping):
        name = value.get("dtype")
        dtype = RAW_DTYPES.get(name) if name is not None else None
        data = value.get("data")
        if dtype is None or not isinstance(data, (bytes, bytearray)):
            raise ValueError(f"bad column encoding: dtype {value.get('dtype')!r} "
                             f"(expected one of {', '.join(RAW_DTYPES)}) with bytes data")
        if len(data) % dtype.itemsize:
            raise ValueError(f"column data of {len(data)} bytes is not a whole number of "
                             f"{dtype.itemsize}-byte {dtype.str} values")
        return np.frombuffer(data, dtype=dtype)
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(f"a column must be a list or an encoded array, not {type(value).__name__}")


def encode_columns(columns: Mapping[str, Any]) -> dict[str, Any]:
    """{name: array} -> {name: msgpack-ready value}."""
    return {name: encode_array(values) for name, values in columns.items()}


def decode_columns(columns: Any) -> dict[str, Any]:
    """The inverse of `encode_columns`; raises ValueError on a malformed mapping."""
    if not isinstance(columns, Mapping):
        raise ValueError(f"columns must be a map of name -> values, not {type(columns).__name__}")
    return {str(name): decode_array(values) for name, values in columns.items()}
