"""Answers on the wire: a Result or Changes encoded as an `invoke` reply, framed,
unframed and decoded is the same answer, holding columns (docs/protocol.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from numpy.typing import NDArray

from psoup.results.result import Changes, Result
from psoup.server.protocol import decode_answer, encode_answer, pack_frame, unpack_payload
from tests.answer_strategies import answer_columns, numeric_columns, python_columns


def _across(answer: Result | Changes) -> Result | Changes:
    """`answer` after a trip over the wire."""
    return decode_answer(unpack_payload(pack_frame(encode_answer(answer))[4:]))


def _exact(rows: Iterable[Sequence[object]]) -> list[tuple[tuple[type, str], ...]]:
    """Rows as (type, repr) of each value: tells 1 from 1.0 and True, -0.0 from 0.0, and
    sees NaN equal to NaN."""
    return [tuple((type(v), repr(v)) for v in row) for row in rows]


def _columned(columns: list[NDArray[Any]], cursor: str | None = None) -> Result:
    n = len(columns[0])
    return Result([f"c{i}" for i in range(len(columns))], None, np.arange(n, dtype=float),
                  np.arange(n) + 100, cursor, values=columns)


@given(answer_columns())
def test_a_columned_answer_arrives_with_the_same_rows_and_column_types(
        columns: list[NDArray[Any]]) -> None:
    sent = _columned(columns, cursor="c9")
    got = _across(sent)
    assert isinstance(got, Result) and got.columns == sent.columns and got.cursor == "c9"
    assert _exact(got.rows) == _exact(sent.rows)
    assert got.ts.tolist() == sent.ts.tolist() and got.tuple_ids.tolist() == sent.tuple_ids.tolist()
    assert [v.dtype for v in got.to_numpy().values()] == [c.dtype for c in columns]


@given(numeric_columns())
def test_numeric_columns_travel_as_raw_bytes_not_rows(columns: list[NDArray[Any]]) -> None:
    wire = encode_answer(_columned(columns))
    assert "rows" not in wire
    assert [v["data"] for v in wire["values"]] == [c.astype(c.dtype.newbyteorder("<")).tobytes()
                                                   for c in columns]


@given(python_columns())
def test_an_aggregated_answer_keeps_its_python_values_and_group_keys(
        columns: list[list[Any]]) -> None:
    rows = list(zip(*columns, strict=True))
    keys = [(i, "g") for i in range(len(rows))]
    sent = Result(["a", "b", "c"][:len(columns)], rows, np.full(len(rows), 3.0),
                  np.full(len(rows), -1), "c1", keys=keys)
    got = _across(sent)
    assert isinstance(got, Result)
    assert _exact(got.rows) == _exact(rows) and got.keys == keys
    assert [v.dtype for v in got.to_numpy().values()] == \
        [v.dtype for v in sent.to_numpy().values()]


@given(python_columns())
def test_a_column_of_one_number_type_arrives_as_that_array(columns: list[list[Any]]) -> None:
    got = _across(Result(["a", "b", "c"][:len(columns)], list(zip(*columns, strict=True)),
                         np.zeros(len(columns[0])), np.zeros(len(columns[0]), np.int64)))
    assert isinstance(got, Result)
    for column, values in zip(columns, got.values or [], strict=False):
        kinds = set(map(type, column))
        if kinds == {float}:
            assert values.dtype == np.float64
        elif kinds == {bool}:
            assert values.dtype == np.bool_
        elif len(kinds) != 1 or kinds == {int} and max(column) >= 2**63:
            assert values.dtype == object


@given(answer_columns(), st.integers(1, 3))
def test_changes_arrive_as_changes_with_a_tupleid_per_join_item(
        columns: list[NDArray[Any]], width: int) -> None:
    n = len(columns[0])
    ids = np.arange(n * width).reshape(n, width)
    inserted = Result(["x"] * len(columns), None, np.ones(n), ids, values=columns)
    deleted = Result(["x"] * len(columns), [], np.empty(0), np.empty((0, width), np.int64))
    got = _across(Changes(inserted.columns, inserted, deleted, "c2"))
    assert isinstance(got, Changes) and got.cursor == "c2"
    assert _exact(got.inserted.rows) == _exact(inserted.rows) and len(got.deleted) == 0
    assert got.inserted.tuple_ids.tolist() == ids.tolist()
    assert got.deleted.tuple_ids.shape == (0, width)
