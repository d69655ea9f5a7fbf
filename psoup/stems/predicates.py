"""Evaluating a query's factors over a column batch (PSoup Sect. 3.2, Fig. 2c).

These are the vectorized kernels behind every path that tests tuples against one query
at a time: a new query probing the Data SteM, NoMat execution at invocation, and the
predicateList of the Query SteM (multi-attribute factors). The shared predicate index
(`predicate_index.py`) evaluates many queries at once and must agree with these.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from psoup.query.model import (
    INT64_MAX,
    INT64_MIN,
    AttrPredicate,
    ColumnFactor,
    CompareOp,
    Source,
)

_EQ, _NE, _LT, _LE = CompareOp.EQ, CompareOp.NE, CompareOp.LT, CompareOp.LE
_GT, _GE = CompareOp.GT, CompareOp.GE

#: Each comparison as a function of two numpy arrays (or an array and a scalar).
COMPARE: dict[CompareOp, Callable[[Any, Any], Any]] = {
    _EQ: operator.eq,
    _NE: operator.ne,
    _LT: operator.lt,
    _LE: operator.le,
    _GT: operator.gt,
    _GE: operator.ge,
}


def attr_mask(pred: AttrPredicate, values: np.ndarray) -> np.ndarray:
    """Which of `values` satisfy `pred`: O(n) for intervals, O(n log k) for a k-value set.

    Example:
        >>> from psoup.query.model import ColumnType
        >>> p = AttrPredicate("a", ColumnType.INT, lo=2, hi=4)
        >>> attr_mask(p, np.array([1, 2, 4, 5])).tolist()
        [False, True, True, False]
    """
    if pred.empty:
        return np.zeros(len(values), dtype=bool)
    if pred.eq is not None:
        if not pred.eq:
            return np.zeros(len(values), dtype=bool)
        return np.isin(values, _as_array(pred.eq, values.dtype))
    mask = None
    if pred.lo is not None:
        mask = (values > pred.lo) if pred.lo_open else (values >= pred.lo)
    if pred.hi is not None:
        mask = _and(mask, (values < pred.hi) if pred.hi_open else (values <= pred.hi))
    if pred.ne:
        mask = _and(mask, ~np.isin(values, _as_array(pred.ne, values.dtype)))
    return np.ones(len(values), dtype=bool) if mask is None else mask


def _and(mask: np.ndarray | None, more: np.ndarray) -> np.ndarray:
    """mask & more, in place in `mask` (a fresh array of ours), or `more` for no mask."""
    return more if mask is None else np.logical_and(mask, more, out=mask)


def factor_mask(factor: ColumnFactor, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Which rows satisfy the multi-attribute factor `left op right + offset`.

    Example:
        >>> f = ColumnFactor("a", CompareOp.LT, "b", 3)
        >>> factor_mask(f, np.array([1, 9]), np.array([0, 5])).tolist()
        [True, False]
    """
    return compare(factor.op, left, right, factor.offset)


#: Per operator, whether `left op right + offset` holds when the exact right-hand side
#: lies above (True key) or below (False key) the int64 range.
HOLDS_BEYOND = {_EQ: (False, False), _NE: (True, True), _LT: (True, False),
                _LE: (True, False), _GT: (False, True), _GE: (False, True)}

#: Integers up to this magnitude convert to a double exactly.
_EXACT_IN_DOUBLE = 2**53


def shifted(values: np.ndarray, offset: int | float) -> tuple[np.ndarray, np.ndarray | None,
                                                                np.ndarray | None]:
    """`values + offset`, and for int64 values with an int offset (of any size) the rows
    whose exact sum lies above / below the int64 range (there the array holds a wrapped
    value); the other rows hold the exact sum.

    Example:
        >>> big = np.array([2**63 - 1, 5])
        >>> shifted(big, 1)[1].tolist()
        [True, False]
        >>> shifted(np.array([-2**63]), 2**64 - 1)[0].tolist()
        [9223372036854775807]
    """
    if not offset:
        return values, None, None
    if values.dtype.kind == "i" and isinstance(offset, (int, np.integer)):
        offset = int(offset)
        with np.errstate(over="ignore"):
            # modulo 2**64 the wrapped sum is the exact one wherever that fits int64
            out = (values.view(np.uint64) + np.uint64(offset % 2**64)).view(np.int64)
        if offset > 0:
            return out, values > INT64_MAX - offset, None
        return out, None, values < INT64_MIN - offset
    return values + offset, None, None


def as_double(values: np.ndarray, offset: int | float = 0) -> np.ndarray:
    """`values + offset` as doubles, the way a comparison with a FLOAT sees it: a FLOAT
    column plus the offset in double arithmetic; an INT column plus the offset exactly,
    then rounded once to the nearest double (so `a + 0.5` is not `float(a) + 0.5` when
    `a` is beyond 2**53).

    Example:
        >>> as_double(np.array([2**53 + 1]), 0.5).tolist() == [float(2**53 + 2)]
        True
        >>> as_double(np.array([1.5]), 1).tolist()
        [2.5]
    """
    if values.dtype.kind != "i":
        return values.astype(np.float64) + float(offset) if offset else \
            values.astype(np.float64, copy=False)
    if not offset:
        return values.astype(np.float64)
    if isinstance(offset, float) and offset.is_integer():
        offset = int(offset)
    if isinstance(offset, (int, np.integer)):
        exact, above, below = shifted(values, int(offset))
        out = exact.astype(np.float64)
        beyond = [m for m in (above, below) if m is not None and m.any()]
        for mask in beyond:         # the exact sum left int64: Python ints round it once
            out[mask] = [float(v + int(offset)) for v in values[mask].tolist()]
        return out
    if not math.isfinite(offset):
        return np.full(len(values), offset)
    out = values.astype(np.float64) + offset     # one rounding while values are exact
    big = (values > _EXACT_IN_DOUBLE) | (values < -_EXACT_IN_DOUBLE)
    if big.any():
        c = Fraction(offset)
        out[big] = [float(v + c) for v in values[big].tolist()]
    return out


def compare(op: CompareOp, left: np.ndarray, right: np.ndarray, offset: int | float = 0,
            left_offset: int | float = 0) -> np.ndarray:
    """`left + left_offset op right + offset` per row, as written (docs/semantics.md,
    "Values and comparisons"):

    * INT with INT is exact, whatever the sizes: the offsets are folded into one integer
      and the sum never wraps around int64 (the language turns a fractional offset
      between two INT columns into an integer one first);
    * when a FLOAT is involved, both sides are doubles (`as_double`): a FLOAT side plus
      its offset in double arithmetic, an INT side plus its offset exactly and then
      rounded once;
    * TEXT and BOOL compare as they are (no offsets).

    Example:
        >>> compare(CompareOp.LT, np.array([0]), np.array([2**63 - 1]), 1).tolist()
        [True]
        >>> compare(CompareOp.GT, np.array([2.575]), np.array([1.575]), 1).tolist()
        [False]
    """
    kinds = left.dtype.kind + right.dtype.kind
    if kinds == "ii":
        rhs, above, below = shifted(right, int(offset) - int(left_offset))
        out = np.asarray(COMPARE[op](left, rhs), dtype=bool)
        if above is not None and above.any():
            out[above] = HOLDS_BEYOND[op][0]
        if below is not None and below.any():
            out[below] = HOLDS_BEYOND[op][1]
        return out
    if "f" in kinds:
        left, right = as_double(left, left_offset), as_double(right, offset)
    return np.asarray(COMPARE[op](left, right), dtype=bool)


def source_mask(source: Source, columns: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """Which of n rows (given as `columns`) satisfy every factor of `source`.

    The factors are applied in the order given; callers that know selectivities put the
    most selective first (PSoup Sect. 5.2, NoMat) and pass only the rows still alive.
    """
    mask = None
    for pred in source.predicates:
        mask = _and(mask, attr_mask(pred, columns[pred.column]))
    for factor in source.column_factors:
        mask = _and(mask, factor_mask(factor, columns[factor.left], columns[factor.right]))
    return np.ones(n, dtype=bool) if mask is None else mask


def _as_array(values: frozenset[Any], dtype: np.dtype[Any]) -> np.ndarray:
    return np.array(sorted(values), dtype=dtype)
