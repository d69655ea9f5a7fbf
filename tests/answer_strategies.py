"""Hypothesis strategies for answers as the engine holds them, shared by the tests of
`Result` (DISTINCT and `since` on columns) and of the wire protocol's answer encoding.

`numeric_columns` draws what a selection projects from the Data SteMs (int64, float64
and bool arrays, with the values that compare oddly: NaN, -0.0, the ends of int64);
`answer_columns` adds TEXT (object arrays with None); `python_columns` draws what an
aggregated answer holds instead, columns of Python values (ints beyond int64, floats and
None in one column).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import hypothesis.strategies as st
import numpy as np
from numpy.typing import NDArray

#: Few distinct values per type, so that rows repeat.
_INT64 = st.sampled_from([0, 1, -1, 7, 2**53 + 1, 2**63 - 1, -2**63])
_FLOAT64 = st.sampled_from([0.0, -0.0, 0.5, -2.5, 1e300, float("inf"), float("nan")])
_TEXT = st.sampled_from(["", "a", "é", "zz"]) | st.none()
_KINDS = {"int": (_INT64, np.int64), "float": (_FLOAT64, np.float64),
          "bool": (st.booleans(), np.bool_), "text": (_TEXT, object)}


def _column(draw: st.DrawFn, kind: str, n: int) -> NDArray[Any]:
    values, dtype = _KINDS[kind]
    drawn = draw(st.lists(values, min_size=n, max_size=n))
    column: NDArray[Any] = np.empty(n, dtype=dtype)
    column[:] = drawn
    return column


@st.composite
def numeric_columns(draw: st.DrawFn, kinds: Sequence[str] = ("int", "float", "bool"),
                    max_rows: int = 12) -> list[NDArray[Any]]:
    """1-3 aligned numpy columns of one length (0 to `max_rows`)."""
    n = draw(st.integers(0, max_rows))
    chosen = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=3))
    return [_column(draw, kind, n) for kind in chosen]


@st.composite
def two_answers(draw: st.DrawFn,
                max_rows: int = 8) -> tuple[list[NDArray[Any]], list[NDArray[Any]]]:
    """Two answers' numeric columns of the same types (one query invoked twice)."""
    old = draw(numeric_columns(max_rows=max_rows))
    n = draw(st.integers(0, max_rows))
    kind = {np.dtype(dtype): name for name, (_, dtype) in _KINDS.items()}
    return old, [_column(draw, kind[c.dtype], n) for c in old]


def answer_columns(max_rows: int = 12) -> st.SearchStrategy[list[NDArray[Any]]]:
    """Columns as a selection's answer holds them, TEXT included."""
    return numeric_columns(kinds=("int", "float", "bool", "text"), max_rows=max_rows)


#: One aggregate value: what SUM, COUNT, AVG, MIN and MAX give (a SUM over INT may pass
#: int64 on the wire's unsigned side), or a group key.
_PYTHON_VALUES = (st.integers(-2**63, 2**64 - 1) | st.sampled_from([0.0, -0.0, 1.5])
                  | st.floats(allow_nan=False) | st.booleans() | st.none() | _TEXT)


@st.composite
def python_columns(draw: st.DrawFn, max_rows: int = 8) -> list[list[Any]]:
    """1-3 columns of Python values, some of one type throughout, some mixed."""
    n = draw(st.integers(0, max_rows))
    columns: list[list[Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        one_type = draw(st.sampled_from([st.integers(-2**63, 2**63 - 1), st.floats(),
                                         st.booleans(), _PYTHON_VALUES]))
        columns.append(draw(st.lists(one_type, min_size=n, max_size=n)))
    return columns
