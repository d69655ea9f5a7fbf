"""The checker: syntax tree + stream schemas -> the engine's model (third stage).

Resolves stream and column names (aliases, `stream.col`, `*`), checks every comparison's
types (LANGUAGE.md: numbers with numbers, TEXT with TEXT, BOOL with TRUE/FALSE), turns
windows into `model.Window` (PSoup Sect. 3.2's BEGIN-END clause, or the per-stream CQL
windows of the STREAM paper Sect. 2), and hands the factors to `normalize`. Features of
the language that come in later issues (joins) are rejected with "not supported yet".
"""

from __future__ import annotations

from typing import Mapping, Sequence, Union

from psoup.errors import QueryError
from psoup.query.model import (
    IMPLICIT_COLUMNS,
    ColumnFactor,
    Query,
    SelectItem,
    Source,
    StreamSchema,
    TimeExpr,
    Window,
)
from psoup.query.normalize import AttrFactor, is_contradiction, normalize_factors
from psoup.query.syntax import (
    BeginEnd,
    Between,
    ColumnRef,
    Comparison,
    CreateStream,
    Factor,
    FromItem,
    InList,
    Literal,
    NowTime,
    NowWindow,
    RangeWindow,
    Retain,
    Select,
    SelectEntry,
    Shifted,
    Star,
    Statement,
    StreamWindow,
    TimeSpec,
)
from psoup.query.timeparse import ROW, UNIT_SECONDS, timestamp_seconds
from psoup.query.tokens import Pos

#: Accepted type names (upper case) -> the model's type.
TYPE_NAMES = {
    "INT": "int", "INTEGER": "int", "BIGINT": "int",
    "FLOAT": "float", "DOUBLE": "float", "REAL": "float",
    "TEXT": "text", "VARCHAR": "text", "STRING": "text",
    "BOOL": "bool", "BOOLEAN": "bool",
}  # fmt: skip

_FLIPPED = {"=": "=", "!=": "!=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def parse_type(name: str) -> str:
    """The model type ("int", "float", "text" or "bool") of a type name, in any case.

    Args:
        name: INT, INTEGER, BIGINT, FLOAT, DOUBLE, REAL, TEXT, VARCHAR, STRING, BOOL or
            BOOLEAN.

    Returns:
        One of model.TYPES.

    Raises:
        QueryError: an unknown type name; the message lists the known ones.

    Example:
        >>> parse_type("Integer"), parse_type("double"), parse_type("BOOL")
        ('int', 'float', 'bool')
    """
    return _type_at(name, None)


def check_retain(retain: Retain) -> tuple[float | None, int | None]:
    """(retain_seconds, retain_rows) of a RETAIN clause; exactly one of them is set.

    Args:
        retain: the parsed `n unit`.

    Returns:
        (seconds, None) for a time unit, (None, rows) for ROWS.

    Raises:
        QueryError: a zero duration, or a row count that is not a positive integer.
    """
    amount = retain.amount
    if retain.unit == ROW:
        return None, _row_count(amount, "RETAIN ... ROWS")
    if amount.value <= 0:
        raise QueryError(f"RETAIN needs a positive duration, found {amount.text}", *amount.pos)
    return _seconds(amount, retain.unit), None


def check(
    statement: Statement, schemas: Mapping[str, StreamSchema], sql: str
) -> Union[StreamSchema, Query]:
    """Check a parsed statement against the existing streams.

    Args:
        statement: the syntax tree from `parser.parse`.
        schemas: the existing streams by name.
        sql: the statement's text, kept in `Query.sql`.

    Returns:
        The new stream's schema for CREATE STREAM, the normalized query for SELECT.

    Raises:
        QueryError: an existing or unknown stream, an unknown column, a type mismatch,
            a bad window, or a feature that is not supported yet.

    Example:
        >>> from psoup.query.parser import parse
        >>> schemas = {"R": StreamSchema("R", (("a", "int"),))}
        >>> q = check(parse("SELECT * FROM R WHERE a < 3"), schemas, "...")
        >>> q.sources[0].predicates[0].hi, q.columns
        (2, ['a'])
    """
    if isinstance(statement, CreateStream):
        return _check_create(statement, schemas)
    return _check_select(statement, schemas, sql)


def _check_create(stmt: CreateStream, schemas: Mapping[str, StreamSchema]) -> StreamSchema:
    if stmt.name in schemas:
        raise QueryError(f"stream '{stmt.name}' already exists", *stmt.name_pos)
    columns: list[tuple[str, str]] = []
    for col in stmt.columns:
        if col.name in IMPLICIT_COLUMNS:
            raise QueryError(
                f"column name '{col.name}' is reserved: every stream has ts and tupleID",
                *col.pos,
            )
        if any(col.name == name for name, _ in columns):
            raise QueryError(f"duplicate column '{col.name}'", *col.pos)
        columns.append((col.name, _type_at(col.type_name, col.type_pos)))
    seconds, rows = (None, None) if stmt.retain is None else check_retain(stmt.retain)
    return StreamSchema(stmt.name, tuple(columns), seconds, rows)


def _check_select(stmt: Select, schemas: Mapping[str, StreamSchema], sql: str) -> Query:
    if len(stmt.sources) > 1:
        raise QueryError(
            "joins (more than one stream in FROM) are not supported yet", *stmt.sources[1].pos
        )
    scope = _Scope(stmt.sources[0], schemas)
    window = _window(stmt, scope)
    select = _select_list(stmt.items, scope)
    predicates, column_factors = normalize_factors(_factors(stmt.where, scope))
    source = Source(scope.schema.name, scope.alias, window, predicates, column_factors)
    return Query(sql, (source,), select, stmt.distinct, is_contradiction(predicates))


class _Scope:
    """The stream of the FROM item, and how the query may name it and its columns."""

    def __init__(self, item: FromItem, schemas: Mapping[str, StreamSchema]):
        schema = schemas.get(item.stream)
        if schema is None:
            known = ", ".join(sorted(schemas))
            listing = f"streams: {known}" if known else "no streams exist yet"
            raise QueryError(f"unknown stream '{item.stream}' ({listing})", *item.pos)
        self.schema = schema
        self.alias = item.alias or item.stream
        self.item = item
        self._schemas = schemas

    def check_qualifier(self, qualifier: str | None, display: str, pos: Pos) -> None:
        """Reject a qualifier that names neither the FROM item's alias nor its stream."""
        if qualifier is None or qualifier in (self.alias, self.schema.name):
            return
        if qualifier in self._schemas:
            raise QueryError(
                f"stream '{qualifier}' in '{display}' is not in FROM "
                "(joins are not supported yet)",
                *pos,
            )
        named = self.alias
        if self.alias != self.schema.name:
            named += f" ({self.schema.name})"
        raise QueryError(
            f"unknown stream or alias '{qualifier}' in '{display}' (FROM: {named})", *pos
        )

    def resolve(self, ref: ColumnRef) -> str:
        """The type of the column `ref` names (declared, ts or tupleID)."""
        self.check_qualifier(ref.qualifier, ref.display, ref.pos)
        try:
            return self.schema.type_of(ref.name)
        except KeyError:
            raise QueryError(
                f"unknown column '{ref.name}' in stream '{self.schema.name}' "
                f"(columns: {', '.join(self.schema.names)})",
                *ref.name_pos,
            ) from None


# windows


def _window(stmt: Select, scope: _Scope) -> Window:
    own = scope.item.window
    if own is not None and stmt.begin_end is not None:
        raise QueryError(
            "BEGIN/END cannot be used when a stream in FROM has its own window [...]",
            *stmt.begin_end.pos,
        )
    if own is not None:
        return _stream_window(own, scope)
    if stmt.begin_end is not None:
        return _begin_end(stmt.begin_end)
    return Window()


def _stream_window(window: StreamWindow, scope: _Scope) -> Window:
    if isinstance(window, NowWindow):
        return Window("range", TimeExpr(True, 0.0), TimeExpr(True, 0.0))
    if isinstance(window, RangeWindow):
        if window.amount is None:
            return Window()
        if window.unit == ROW:
            raise QueryError(
                "RANGE takes a duration; use [ROWS n] for the last n tuples", *window.pos
            )
        seconds = _seconds(window.amount, window.unit)
        return Window("range", TimeExpr(True, 0.0 - seconds), TimeExpr(True, 0.0))
    rows = _row_count(window.count, "ROWS")
    if not window.partition_by:
        return Window("rows", rows=rows)
    columns: list[str] = []
    for ref in window.partition_by:
        scope.resolve(ref)
        if ref.name in columns:
            raise QueryError(f"column '{ref.name}' appears twice in PARTITION BY", *ref.name_pos)
        columns.append(ref.name)
    return Window("partition", rows=rows, partition_by=tuple(columns))


def _begin_end(clause: BeginEnd) -> Window:
    begin, end = clause.begin, clause.end
    if isinstance(end, NowTime) and end.unit == ROW:
        raise QueryError("ROWS belongs in BEGIN: BEGIN (NOW - n ROWS) END NOW", *end.pos)
    if isinstance(begin, NowTime) and begin.unit == ROW:
        if begin.sign != "-":
            raise QueryError("a ROWS window is written BEGIN (NOW - n ROWS) END NOW", *begin.pos)
        if not (isinstance(end, NowTime) and end.sign is None):
            raise QueryError(
                f"with BEGIN {begin.text}, END must be NOW, found {end.text}", *end.pos
            )
        return Window("rows", rows=_row_count(begin.amount, "ROWS"))  # type: ignore[arg-type]
    lo, hi = _time_expr(begin), _time_expr(end)
    if lo.relative == hi.relative and lo.value > hi.value:
        raise QueryError(
            f"BEGIN {begin.text} is after END {end.text}: the window is always empty",
            *clause.pos,
        )
    return Window("range", lo, hi)


def _time_expr(spec: TimeSpec) -> TimeExpr:
    if isinstance(spec, NowTime):
        if spec.amount is None:
            return TimeExpr(True, 0.0)
        seconds = _seconds(spec.amount, spec.unit)
        return TimeExpr(True, seconds if spec.sign == "+" else 0.0 - seconds)
    value = spec.value.value
    if isinstance(value, str):
        try:
            return TimeExpr(False, timestamp_seconds(value))
        except ValueError:
            raise QueryError(
                f"invalid timestamp {spec.value.text}: expected ISO-8601 such as "
                "'2026-11-22 08:00:00' or '2026-11-22T08:00:00+01:00'",
                *spec.pos,
            ) from None
    return TimeExpr(False, float(value))


def _seconds(amount: Literal, unit: str) -> float:
    return float(amount.value * UNIT_SECONDS[unit])  # type: ignore[operator]


def _row_count(amount: Literal, what: str) -> int:
    if not isinstance(amount.value, int) or amount.value <= 0:
        raise QueryError(
            f"{what} needs a positive whole number of rows, found {amount.text}", *amount.pos
        )
    return amount.value


# SELECT list


def _select_list(entries: Sequence[SelectEntry], scope: _Scope) -> tuple[SelectItem, ...]:
    items: list[SelectItem] = []
    for entry in entries:
        if isinstance(entry, Star):
            display = "*" if entry.qualifier is None else f"{entry.qualifier}.*"
            scope.check_qualifier(entry.qualifier, display, entry.pos)
            new = [(column, column) for column in scope.schema.names]
        else:
            scope.resolve(entry.column)
            new = [(entry.column.name, entry.alias or entry.column.name)]
        for column, name in new:
            if any(item.name == name for item in items):
                raise QueryError(
                    f"duplicate output column '{name}' (rename one with AS)", *entry.pos
                )
            items.append(SelectItem(0, column, name))
    return tuple(items)


# WHERE


def _factors(factors: Sequence[Factor], scope: _Scope) -> list[Union[AttrFactor, ColumnFactor]]:
    out: list[Union[AttrFactor, ColumnFactor]] = []
    for factor in factors:
        if isinstance(factor, Between):
            ctype = _constant_factor(scope, factor.column, [factor.low, factor.high])
            name = factor.column.name
            out.append(AttrFactor(name, ctype, ">=", factor.low.value))
            out.append(AttrFactor(name, ctype, "<=", factor.high.value))
        elif isinstance(factor, InList):
            ctype = _constant_factor(scope, factor.column, factor.values)
            values = tuple(v.value for v in factor.values)
            out.append(AttrFactor(factor.column.name, ctype, "in", values))
        else:
            out.append(_comparison(factor, scope))
    return out


def _comparison(factor: Comparison, scope: _Scope) -> Union[AttrFactor, ColumnFactor]:
    left, op, right = factor.left, factor.op, factor.right
    if isinstance(left, Literal) and isinstance(right, Literal):
        raise QueryError(
            f"a factor must involve a column, but {left.text} {op} {right.text} compares "
            "two constants",
            *factor.pos,
        )
    if isinstance(left, Literal):
        left, op, right = right, _FLIPPED[op], left
    assert isinstance(left, ColumnRef)  # the parser puts arithmetic on the right only
    if isinstance(right, Literal):
        ctype = _constant_factor(scope, left, [right])
        return AttrFactor(left.name, ctype, op, right.value)
    ref = right.column if isinstance(right, Shifted) else right
    left_type, right_type = scope.resolve(left), scope.resolve(ref)
    if _kind(left_type) != _kind(right_type):
        raise QueryError(
            f"cannot compare {left_type.upper()} column '{left.display}' with "
            f"{right_type.upper()} column '{ref.display}'",
            *ref.pos,
        )
    offset: int | float = 0
    if isinstance(right, Shifted):
        if _kind(right_type) != "number":
            raise QueryError(
                f"cannot add a number to {right_type.upper()} column '{ref.display}'",
                *right.pos,
            )
        amount = right.amount.value
        offset = amount if right.sign == "+" else -amount  # type: ignore[assignment,operator]
    return ColumnFactor(left.name, op, ref.name, offset)


def _constant_factor(scope: _Scope, ref: ColumnRef, constants: Sequence[Literal]) -> str:
    """Check `ref op c` for each constant c and return the column's type."""
    ctype = scope.resolve(ref)
    for constant in constants:
        if _kind(ctype) != _literal_kind(constant):
            raise QueryError(
                f"cannot compare {ctype.upper()} column '{ref.display}' with "
                f"{_describe(constant)}",
                *constant.pos,
            )
    return ctype


def _kind(ctype: str) -> str:
    return "number" if ctype in ("int", "float") else ctype


def _literal_kind(constant: Literal) -> str:
    if isinstance(constant.value, bool):
        return "bool"
    return "text" if isinstance(constant.value, str) else "number"


def _describe(constant: Literal) -> str:
    kind = _literal_kind(constant)
    if kind == "number":
        return f"number {constant.text}"
    if kind == "text":
        return f"string {constant.text}"
    return constant.text.upper()


def _type_at(name: str, pos: Pos | None) -> str:
    ctype = TYPE_NAMES.get(name.upper()) if isinstance(name, str) else None
    if ctype is None:
        raise QueryError(
            f"unknown type {name!r} (known types: {', '.join(TYPE_NAMES)})",
            *(pos or (None, None)),
        )
    return ctype
