"""Normalization: checked factors -> per-source AttrPredicates and oriented join factors.

PSoup Sect. 4.2.2 indexes each query's single-attribute factors on an attribute as one
set of accepted values, and keeps the multi-attribute factors of one stream in a
predicateList (Sect. 3.2). This module folds every `column op constant` factor of a
column into that one set, an `AttrPredicate`, in a canonical form:

* bounds are intersected (the tighter bound wins; at an equal value the open one);
* `=` and IN become an `eq` set (sets are intersected); the set is then filtered by the
  bounds and the `!=` values, and the bounds and `!=` values are dropped;
* otherwise `!=` values outside the bounds are dropped, and bounds that admit nothing
  give `AttrPredicate(column, ctype, empty=True)` with no other fields set;
* INT columns (tupleID too) are compared in the integers: `a > 2.5` is `a >= 3`, every
  strict bound becomes a closed one (`a < 5` is `a <= 4`), `a = 2.5` contributes an empty
  `eq` set, `a != 2.5` always holds, and constants outside the 64-bit range are dropped
  (so every constant of an INT predicate fits an int64);
* FLOAT columns (ts too) take int constants as `float(c)`, which rounds integers beyond
  2**53 to the nearest float (the comparison is then with that float);
* BOOL columns (FALSE < TRUE, as in SQL) always come out as an `eq` subset of
  {False, True};
* a column whose factors restrict nothing (`a != 2.5` on an INT column) gets no predicate.

An empty `eq` set and `empty=True` are the two forms of a contradiction on a column; the
query then matches nothing (`is_contradiction`).

The join factors between FROM items (PSoup Sect. 3.2.2) are oriented so that the earlier
item is on the left (`normalize_joins`): `S.b > R.a + 2`, R first in FROM, is `R.a + 2 < S.b`
(the comparison as written, mirrored).

A factor between two INT columns with a fractional offset is one between integers
(`integer_offset`): `a < b + 0.5` is `a <= b`, `a = b + 0.5` never holds and `a != b + 0.5`
always does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence, Set
from dataclasses import dataclass, replace
from typing import Any, Literal

from psoup.query.model import (
    INT64_MAX,
    INT64_MIN,
    AttrPredicate,
    ColumnFactor,
    ColumnType,
    CompareOp,
    JoinFactor,
    Value,
)

_BOOLS = frozenset({False, True})

_EQ, _NE, _LT, _LE = CompareOp.EQ, CompareOp.NE, CompareOp.LT, CompareOp.LE
_GT, _GE = CompareOp.GT, CompareOp.GE
_INT, _FLOAT, _BOOL = ColumnType.INT, ColumnType.FLOAT, ColumnType.BOOL

#: The operator that keeps a comparison true when its two sides swap (`a < b` is `b > a`).
FLIPPED = {_EQ: _EQ, _NE: _NE, _LT: _GT, _LE: _GE, _GT: _LT, _GE: _LE}

#: An `AttrFactor`'s operator for an IN list.
IN: Literal["in"] = "in"


_SYMBOLS = {**{op.value: op for op in CompareOp}, "<>": _NE}


def compare_op(symbol: str) -> CompareOp:
    """The comparison a symbol as written names (`<>` is `!=`); a member is itself.

    Example:
        >>> compare_op("<>") is CompareOp.NE, compare_op(">=") is CompareOp.GE
        (True, True)
    """
    return _SYMBOLS[symbol]


@dataclass(slots=True)
class AttrFactor:
    """A checked single-attribute factor `column op value`, the column on the left.

    Attributes:
        column: the column's name.
        ctype: the column's type; `value`'s type agrees with it (a number for INT and
            FLOAT, str for TEXT, bool for BOOL).
        op: the comparison, or IN ("in") when `value` is the tuple of an IN list.
        value: the constant, or the constants of an IN list.
    """

    column: str
    ctype: ColumnType
    op: CompareOp | Literal["in"]
    value: Value | tuple[Value, ...]


def normalize_factors(
    factors: Sequence[AttrFactor | ColumnFactor],
) -> tuple[tuple[AttrPredicate, ...], tuple[ColumnFactor, ...]]:
    """Fold the factors of one source into its predicates and its column factors.

    Runs in O(f + v log v) for f factors with v constants.

    Args:
        factors: the source's checked factors, in WHERE order.

    Returns:
        The AttrPredicates, one per column that has a restricting single-attribute
        factor, sorted by column; and the ColumnFactors in WHERE order, with `<>` written
        as `!=` and exact repeats removed.

    Example:
        >>> INT = ColumnType.INT
        >>> preds, cfs = normalize_factors([
        ...     AttrFactor("a", INT, CompareOp.GT, 2.5), AttrFactor("a", INT, CompareOp.LT, 9),
        ...     ColumnFactor("a", compare_op("<>"), "b")])
        >>> preds, cfs  # doctest: +NORMALIZE_WHITESPACE
        ((AttrPredicate(column='a', ctype=<ColumnType.INT: 'int'>, lo=3, lo_open=False, hi=8,
                        hi_open=False, eq=None, ne=frozenset(), empty=False),),
         (ColumnFactor(left='a', op=<CompareOp.NE: '!='>, right='b', offset=0),))
    """
    by_column: dict[str, list[AttrFactor]] = {}
    column_factors: list[ColumnFactor] = []
    for factor in factors:
        if isinstance(factor, AttrFactor):
            by_column.setdefault(factor.column, []).append(factor)
        else:
            factor = replace(factor, op=compare_op(factor.op))
            if factor not in column_factors:
                column_factors.append(factor)
    folded = (fold_column(by_column[column]) for column in sorted(by_column))
    return tuple(p for p in folded if p is not None), tuple(column_factors)


def normalize_joins(factors: Sequence[JoinFactor]) -> tuple[JoinFactor, ...]:
    """Orient the join factors of a query so that `left < right`.

    A factor whose left source comes later in FROM swaps its sides: the operator flips
    and each offset stays with its column (`s.b > r.a + 2` is `r.a + 2 < s.b`). Runs in
    O(f^2) for f factors (f is the handful a WHERE clause holds).

    Args:
        factors: the query's checked join factors as written, in WHERE order; in each,
            `left != right`.

    Returns:
        The factors in WHERE order, each with `left < right`, `<>` written as `!=`, and
        exact repeats (after orientation) removed.

    Example:
        >>> normalize_joins([JoinFactor(1, "b", CompareOp.GT, 0, "a", 2),
        ...                  JoinFactor(0, "a", CompareOp.NE, 1, "b")])
        ... # doctest: +NORMALIZE_WHITESPACE
        (JoinFactor(left=0, left_column='a', op=<CompareOp.LT: '<'>, right=1,
                    right_column='b', offset=0, left_offset=2),
         JoinFactor(left=0, left_column='a', op=<CompareOp.NE: '!='>, right=1,
                    right_column='b', offset=0, left_offset=0))
    """
    oriented: list[JoinFactor] = []
    for factor in factors:
        op = compare_op(factor.op)
        if factor.left > factor.right:
            # mirrored, each offset staying with its column: moving an offset across
            # (b > a + c as a < b - c) would round differently in floating point
            factor = JoinFactor(factor.right, factor.right_column, FLIPPED[op], factor.left,
                                factor.left_column, factor.left_offset, factor.offset)
        else:
            factor = replace(factor, op=op)
        if factor not in oriented:
            oriented.append(factor)
    return tuple(oriented)


def fold_column(factors: Sequence[AttrFactor]) -> AttrPredicate | None:
    """Fold the single-attribute factors of one column into one AttrPredicate.

    Args:
        factors: at least one factor, all on the same column.

    Returns:
        The canonical predicate (see the module docstring), or None when the factors
        accept every value of the column's type.

    Example:
        >>> p = fold_column([AttrFactor("a", ColumnType.INT, IN, (1, 2.0, 2.5)),
        ...                  AttrFactor("a", ColumnType.INT, CompareOp.NE, 1)])
        >>> p.eq, p.lo, p.hi, p.ne, p.empty
        (frozenset({2}), None, None, frozenset(), False)
    """
    column, ctype = factors[0].column, factors[0].ctype
    lo: Any = None  # Any: the bounds are of the column's type, compared with each other
    hi: Any = None
    lo_open = hi_open = False
    # eq: the admitted values (a frozenset once a BOOL column's two-value domain is used)
    eq: Set[Any] | None = None
    ne: set[Any] = set()
    for factor in factors:
        op = factor.op          # a member, or its symbol: equal to it (but <>)
        if op == "<>":
            op = _NE
        if op in (IN, _EQ):
            members = _members(ctype, factor)
            eq = members if eq is None else eq & members
        elif op == _NE:
            member = _member(ctype, factor.value)
            if member is not None:
                ne.add(member)
        else:
            value, is_open = _bound(ctype, op, factor.value)
            if op in (_GT, _GE):
                if lo is None or value > lo or (value == lo and is_open):
                    lo, lo_open = value, is_open
            elif hi is None or value < hi or (value == hi and is_open):
                hi, hi_open = value, is_open
    return _predicate(column, ctype, lo, lo_open, hi, hi_open, eq, ne)


def _members(ctype: ColumnType, factor: AttrFactor) -> set[Value]:
    """The values of the column's type that an = or IN factor admits."""
    values: tuple[Any, ...]
    if factor.op == IN:
        assert isinstance(factor.value, tuple), "an IN factor holds its list's tuple"
        values = factor.value
    else:
        values = (factor.value,)
    return {m for m in (_member(ctype, v) for v in values) if m is not None}


def _predicate(column: str, ctype: ColumnType, lo: Any, lo_open: bool, hi: Any,
               hi_open: bool, eq: Set[Any] | None, ne: set[Any]) -> AttrPredicate | None:
    """The canonical predicate of the folded bounds, admitted and excluded values (the
    module docstring), or None when it admits every value."""

    def admits(v: Value) -> bool:
        above = lo is None or v > lo or (v == lo and not lo_open)
        below = hi is None or v < hi or (v == hi and not hi_open)
        return above and below

    if ctype == _BOOL:  # a two-value domain: always written as the set of admitted values
        eq = _BOOLS if eq is None else eq
    if eq is not None:
        allowed = frozenset(v for v in eq if admits(v) and v not in ne)
        if ctype == _BOOL and allowed == _BOOLS:  # ({0, 1} == _BOOLS too, hence the type)
            return None
        return AttrPredicate(column, ctype, eq=allowed)
    ne = {v for v in ne if admits(v)}
    if _admits_nothing(ctype, lo, lo_open, hi, hi_open, ne):
        return AttrPredicate(column, ctype, empty=True)
    if ctype == _INT:
        lo = None if lo is not None and lo <= INT64_MIN else lo
        hi = None if hi is not None and hi >= INT64_MAX else hi
    if lo is None and hi is None and not ne:
        return None
    return AttrPredicate(column, ctype, lo, lo_open, hi, hi_open, ne=frozenset(ne))


def integer_offset(op: CompareOp, offset: int | float) -> tuple[CompareOp, int] | bool:
    """`x op y + offset` between INT values x and y, as a comparison with an integer
    offset, or True / False when it holds for every / no pair of integers.

    x - y is an integer d, so `d < 2.5` is `d <= 2`, `d > 2.5` is `d > 2`, `d = 2.5` never
    holds and `d != 2.5` always does; an infinite offset decides every pair.

    Example:
        >>> [integer_offset(compare_op(op), c) for op, c in
        ...  [("<", 0.5), (">=", -0.5), ("=", 0.5), ("<", 2.0), ("!=", 1.5)]]
        ... # doctest: +NORMALIZE_WHITESPACE
        [(<CompareOp.LE: '<='>, 0), (<CompareOp.GT: '>'>, -1), False,
         (<CompareOp.LT: '<'>, 2), True]
    """
    op = compare_op(op)
    if isinstance(offset, int):
        return op, offset
    if math.isinf(offset):
        return {_EQ: False, _NE: True, _LT: offset > 0, _LE: offset > 0, _GT: offset < 0,
                _GE: offset < 0}[op]
    if offset.is_integer():
        return op, int(offset)
    if op in (_EQ, _NE):
        return op == _NE
    floor = math.floor(offset)
    return (_LE, floor) if op in (_LT, _LE) else (_GT, floor)


def is_contradiction(predicates: Sequence[AttrPredicate]) -> bool:
    """True when some predicate accepts no value (`empty`, or an empty `eq` set).

    Example:
        >>> is_contradiction([AttrPredicate("a", "int", eq=frozenset())])
        True
    """
    return any(p.empty or (p.eq is not None and not p.eq) for p in predicates)


def _member(ctype: ColumnType, value: Any) -> Value | None:
    """`value` as a value of the column's type, or None when no value of it equals `value`."""
    if ctype == _INT:
        if isinstance(value, float):
            if not value.is_integer():
                return None
            value = int(value)
        return value if INT64_MIN <= value <= INT64_MAX else None
    if ctype == _FLOAT:
        return float(value)
    member: Value = value   # TEXT and BOOL: the checker matched the constant's type
    return member


def _bound(ctype: ColumnType, op: CompareOp, value: Any) -> tuple[Value, bool]:
    """The bound (value, open) that `column op value` puts on the column (op: < <= > >=)."""
    if ctype == _INT:
        # The integers above 2.5 are those >= 3: every INT bound comes out closed.
        if op == _GT:
            return math.floor(value) + 1, False
        if op == _GE:
            return math.ceil(value), False
        if op == _LT:
            return math.ceil(value) - 1, False
        return math.floor(value), False
    if ctype == _FLOAT:
        value = float(value)
    return value, op in (_LT, _GT)


def _admits_nothing(ctype: ColumnType, lo: Any, lo_open: bool, hi: Any, hi_open: bool,
                    ne: set[Any]) -> bool:
    """Whether no value lies within the bounds and outside `ne` (exact for INT; for the
    other types, lo > hi or a single value that is excluded)."""
    if ctype == _INT:
        first = INT64_MIN if lo is None else lo
        last = INT64_MAX if hi is None else hi
        return first > last or (
            last - first < len(ne) and all(v in ne for v in range(first, last + 1))
        )
    if lo is None or hi is None:
        return False
    if lo == hi:
        return lo_open or hi_open or lo in ne
    return bool(lo > hi)
