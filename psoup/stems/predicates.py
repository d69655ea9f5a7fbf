"""Evaluating a query's factors over a column batch (PSoup Sect. 3.2, Fig. 2c).

These are the vectorized kernels behind every path that tests tuples against one query
at a time: a new query probing the Data SteM, NoMat execution at invocation, and the
predicateList of the Query SteM (multi-attribute factors). The shared predicate index
(`predicate_index.py`) evaluates many queries at once and must agree with these.
"""

from __future__ import annotations

import operator
from typing import Callable, Mapping

import numpy as np

from psoup.query.model import AttrPredicate, ColumnFactor, Source

COMPARE: dict[str, Callable] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def attr_mask(pred: AttrPredicate, values: np.ndarray) -> np.ndarray:
    """Which of `values` satisfy `pred`: O(n) for intervals, O(n log k) for a k-value set.

    Example:
        >>> p = AttrPredicate("a", "int", lo=2, hi=4)
        >>> attr_mask(p, np.array([1, 2, 4, 5])).tolist()
        [False, True, True, False]
    """
    if pred.empty:
        return np.zeros(len(values), dtype=bool)
    if pred.eq is not None:
        if not pred.eq:
            return np.zeros(len(values), dtype=bool)
        return np.isin(values, _as_array(pred.eq, values.dtype))
    mask = np.ones(len(values), dtype=bool)
    if pred.lo is not None:
        mask &= (values > pred.lo) if pred.lo_open else (values >= pred.lo)
    if pred.hi is not None:
        mask &= (values < pred.hi) if pred.hi_open else (values <= pred.hi)
    if pred.ne:
        mask &= ~np.isin(values, _as_array(pred.ne, values.dtype))
    return mask


def factor_mask(factor: ColumnFactor, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Which rows satisfy the multi-attribute factor `left op right + offset`.

    Example:
        >>> f = ColumnFactor("a", "<", "b", 3)
        >>> factor_mask(f, np.array([1, 9]), np.array([0, 5])).tolist()
        [True, False]
    """
    return compare_shifted(factor.op, left, right, factor.offset)


#: Per operator, whether `left op right + offset` holds when the exact right-hand side
#: lies above (True key) or below (False key) the int64 range.
HOLDS_BEYOND = {"=": (False, False), "!=": (True, True), "<": (True, False),
           "<=": (True, False), ">": (False, True), ">=": (False, True)}


def shifted(values: np.ndarray, offset: int | float) -> tuple[np.ndarray, np.ndarray | None,
                                                                np.ndarray | None]:
    """`values + offset`, and for int64 values with an int offset the rows whose exact
    sum lies above / below the int64 range (there the array holds a wrapped value).

    Example:
        >>> big = np.array([2**63 - 1, 5])
        >>> shifted(big, 1)[1].tolist()
        [True, False]
    """
    if not offset:
        return values, None, None
    if values.dtype.kind == "i" and isinstance(offset, (int, np.integer)):
        limits = np.iinfo(np.int64)
        with np.errstate(over="ignore"):
            out = values + np.int64(offset)
        if offset > 0:
            return out, values > limits.max - offset, None
        return out, None, values < limits.min - offset
    return values + offset, None, None


def compare_shifted(op: str, left: np.ndarray, right: np.ndarray,
                    offset: int | float) -> np.ndarray:
    """`left op right + offset` per row, exact for int64 even where the sum leaves the
    int64 range (it never wraps around).

    Example:
        >>> compare_shifted("<", np.array([0]), np.array([2**63 - 1]), 1).tolist()
        [True]
    """
    rhs, above, below = shifted(right, offset)
    out = np.asarray(COMPARE[op](left, rhs), dtype=bool)
    if above is not None and above.any():
        out[above] = HOLDS_BEYOND[op][0]
    if below is not None and below.any():
        out[below] = HOLDS_BEYOND[op][1]
    return out


def source_mask(source: Source, columns: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """Which of n rows (given as `columns`) satisfy every factor of `source`.

    The factors are applied in the order given; callers that know selectivities put the
    most selective first (PSoup Sect. 5.2, NoMat) and pass only the rows still alive.
    """
    mask = np.ones(n, dtype=bool)
    for pred in source.predicates:
        mask &= attr_mask(pred, columns[pred.column])
    for factor in source.column_factors:
        mask &= factor_mask(factor, columns[factor.left], columns[factor.right])
    return mask


def _as_array(values: frozenset, dtype: np.dtype) -> np.ndarray:
    return np.array(sorted(values), dtype=dtype if dtype != object else object)
