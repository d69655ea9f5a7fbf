"""The checker: syntax tree + stream schemas -> the engine's model (third stage).

Resolves stream and column names (aliases, `stream.col`, `*`), checks every comparison's
types (docs/language.md: numbers with numbers, TEXT with TEXT, BOOL with TRUE/FALSE), turns
windows into `model.Window` (PSoup Sect. 3.2's BEGIN-END clause, or the per-stream CQL
windows of the STREAM paper Sect. 2), splits WHERE into each FROM item's local factors
and the join factors between items (PSoup Sect. 3.2.2), and hands them to `normalize`.
Aggregates and GROUP BY are checked here too (docs/semantics.md, "Aggregates").
"""

from __future__ import annotations

import re
import typing
from collections import Counter
from collections.abc import Mapping, Sequence

from psoup.errors import QueryError
from psoup.query.model import (
    AGGREGATES,
    IMPLICIT_COLUMNS,
    PROBE_OPTION,
    PROBE_PLACES,
    Catalog,
    ColumnFactor,
    ColumnType,
    CompareOp,
    JoinFactor,
    Query,
    Sample,
    SelectItem,
    Source,
    SourceFormat,
    SourceKind,
    StreamSchema,
    StreamSource,
    TimeExpr,
    Window,
    WindowType,
)
from psoup.query.normalize import (
    FLIPPED,
    IN,
    AttrFactor,
    compare_op,
    integer_offset,
    is_contradiction,
    normalize_factors,
    normalize_joins,
)
from psoup.query.syntax import (
    BeginEnd,
    Between,
    CatalogStatement,
    ColumnDef,
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
    SelectAggregate,
    SelectColumn,
    SelectEntry,
    Shifted,
    SourceClause,
    Star,
    Statement,
    StreamWindow,
    TimeSpec,
)
from psoup.query.timeparse import ROW, UNIT_SECONDS, TimeUnit, timestamp_seconds
from psoup.query.tokens import Pos

_INT, _FLOAT, _TEXT, _BOOL = ColumnType.INT, ColumnType.FLOAT, ColumnType.TEXT, ColumnType.BOOL

#: Accepted type names (upper case) -> the model's type.
TYPE_NAMES = {
    "INT": _INT, "INTEGER": _INT, "BIGINT": _INT,
    "FLOAT": _FLOAT, "DOUBLE": _FLOAT, "REAL": _FLOAT,
    "TEXT": _TEXT, "VARCHAR": _TEXT, "STRING": _TEXT,
    "BOOL": _BOOL, "BOOLEAN": _BOOL,
}  # fmt: skip



def parse_type(name: str) -> ColumnType:
    """The model type (a `ColumnType`) of a type name, in any case.

    Args:
        name: INT, INTEGER, BIGINT, FLOAT, DOUBLE, REAL, TEXT, VARCHAR, STRING, BOOL or
            BOOLEAN.

    Returns:
        One of model.TYPES.

    Raises:
        QueryError: an unknown type name; the message lists the known ones.

    Example:
        >>> parse_type("Integer").value, parse_type("double").value, parse_type("BOOL").value
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
    assert not isinstance(amount.value, str), "the parser reads a RETAIN amount as a number"
    if amount.value <= 0:
        raise QueryError(f"RETAIN needs a positive duration, found {amount.text}", *amount.pos)
    return _seconds(amount, retain.unit), None


def check(
    statement: Statement, schemas: Mapping[str, StreamSchema], sql: str
) -> StreamSchema | Query | Catalog:
    """Check a parsed statement against the existing streams.

    Args:
        statement: the syntax tree from `parser.parse`.
        schemas: the existing streams by name.
        sql: the statement's text, kept in `Query.sql`.

    Returns:
        The new stream's schema for CREATE STREAM, the normalized query for SELECT, a
        `Catalog` for SHOW, DESCRIBE and DROP STREAM.

    Raises:
        QueryError: an existing or unknown stream, an unknown column, a type mismatch,
            a bad window, or a feature that is not supported yet.

    Example:
        >>> from psoup.query.parser import parse
        >>> schemas = {"R": StreamSchema("R", (("a", "int"),))}
        >>> q = check(parse("SELECT * FROM R WHERE a < 3"), schemas, "...")
        >>> q.sources[0].predicates[0].hi, q.columns
        (2, ['a'])
        >>> j = check(parse("SELECT * FROM R r1, R r2 WHERE r2.a > r1.a + 1"), schemas, "...")
        >>> j.joins, j.columns  # doctest: +NORMALIZE_WHITESPACE
        ((JoinFactor(left=0, left_column='a', op=<CompareOp.LT: '<'>, right=1,
                     right_column='a', offset=0, left_offset=1),), ['r1.a', 'r2.a'])
    """
    if isinstance(statement, CreateStream):
        return _check_create(statement, schemas)
    if isinstance(statement, CatalogStatement):
        return _check_catalog(statement, schemas)
    return _check_select(statement, schemas, sql)


#: The longest stream or column name, in characters (a stream's name is a directory name
#: in the data directory and its archive, and must fit every filesystem's limit).
MAX_NAME = 64


def _check_name(kind: str, name: str, pos: Pos) -> None:
    if len(name) > MAX_NAME:
        raise QueryError(f"{kind} name '{name[:20]}...' is {len(name)} characters long; "
                         f"names have at most {MAX_NAME}", *pos)


def _check_create(stmt: CreateStream, schemas: Mapping[str, StreamSchema]) -> StreamSchema:
    _check_name("stream", stmt.name, stmt.name_pos)
    if stmt.name in schemas:
        raise QueryError(f"stream '{stmt.name}' already exists", *stmt.name_pos)
    columns: list[tuple[str, ColumnType]] = []
    for col in stmt.columns:
        _check_name("column", col.name, col.pos)
        if col.name in IMPLICIT_COLUMNS:
            raise QueryError(
                f"column name '{col.name}' is reserved: every stream has ts and tupleID",
                *col.pos,
            )
        if any(col.name == name for name, _ in columns):
            raise QueryError(f"duplicate column '{col.name}'", *col.pos)
        columns.append((col.name, _type_at(col.type_name, col.type_pos)))
    seconds, rows = (None, None) if stmt.retain is None else check_retain(stmt.retain)
    source = None if stmt.source is None else _check_source(stmt.source, stmt.columns)
    return StreamSchema(stmt.name, tuple(columns), seconds, rows, source)


#: The WITH option psoup reads itself, not Spark's reader: the interval between a
#: source's micro-batches, as Spark's processing-time trigger takes it.
TRIGGER_OPTION = "trigger"
_TRIGGER = re.compile(r"\s*[0-9]+(\.[0-9]+)?\s*(millisecond|second|minute|hour)s?\s*",
                      re.IGNORECASE)

#: The columns a FROM RATE stream may declare: Spark's rate source gives `value` (and
#: `timestamp`, which becomes ts).
RATE_COLUMNS = frozenset({"value"})


def _check_source(clause: SourceClause, columns: Sequence[ColumnDef]) -> StreamSource:
    """The checked FROM clause: a known kind and format, a folder for FILES, columns a
    rate source gives, each option once. Whether the folder exists, and whether the
    engine keeps a data directory, the engine checks (a log replays without them)."""
    kind = SourceKind(clause.kind.lower())
    fmt = _source_format(clause, kind)
    path = None
    if clause.path is not None:
        path = str(clause.path.value)
        if not path.strip():
            raise QueryError("FROM FILES needs a folder, not an empty string",
                             *clause.path.pos)
    if kind == SourceKind.RATE:
        for col in columns:
            if col.name not in RATE_COLUMNS:
                raise QueryError(f"a FROM RATE stream has only the column value (INT), "
                                 f"not '{col.name}'", *col.pos)
    _check_options(clause.options)
    return StreamSource(kind, path, fmt, tuple((k, v) for k, v, _ in clause.options))


def _source_format(clause: SourceClause, kind: SourceKind) -> SourceFormat | None:
    """FORMAT: required by FILES, JSON or none for KAFKA, none for RATE."""
    if clause.format is None:
        if kind == SourceKind.FILES:
            raise QueryError("FROM FILES needs a FORMAT (CSV, JSON or PARQUET)", *clause.pos)
        return None
    assert clause.format_pos is not None, "a FORMAT has its position"
    names = ", ".join(f.upper() for f in SourceFormat)
    try:
        fmt = SourceFormat(clause.format.lower())
    except ValueError:
        raise QueryError(f"unknown format '{clause.format}' (formats: {names})",
                         *clause.format_pos) from None
    if kind == SourceKind.RATE or (kind == SourceKind.KAFKA and fmt != SourceFormat.JSON):
        why = " (its values are read as JSON)" if kind == SourceKind.KAFKA else ""
        raise QueryError(f"FROM {kind.upper()} takes no FORMAT {fmt.upper()}{why}",
                         *clause.format_pos)
    return fmt


def _check_options(options: Sequence[tuple[str, str, Pos]]) -> None:
    """Each WITH option once (keys ignoring case), and psoup's own (trigger, probe)
    readable."""
    seen: set[str] = set()
    for key, value, pos in options:
        if key.lower() in seen:
            raise QueryError(f"option '{key}' is given twice", *pos)
        seen.add(key.lower())
        if key.lower() == TRIGGER_OPTION and not _TRIGGER.fullmatch(value):
            raise QueryError(f"option trigger takes an interval such as '2 seconds' or "
                             f"'500 milliseconds', not '{value}'", *pos)
        if key.lower() == PROBE_OPTION and value.lower() not in PROBE_PLACES:
            raise QueryError(f"option probe takes 'engine' or 'executors', not '{value}'",
                             *pos)


def _check_catalog(stmt: CatalogStatement, schemas: Mapping[str, StreamSchema]) -> Catalog:
    if stmt.name is not None and stmt.name not in schemas:
        assert stmt.name_pos is not None, "a named stream has its position"
        raise QueryError(f"unknown stream '{stmt.name}' ({_stream_listing(schemas)})",
                         *stmt.name_pos)
    return Catalog(stmt.action, stmt.name, stmt.cascade)


def _stream_listing(schemas: Mapping[str, StreamSchema]) -> str:
    known = ", ".join(sorted(schemas))
    return f"streams: {known}" if known else "no streams exist yet"


def _check_select(stmt: Select, schemas: Mapping[str, StreamSchema], sql: str) -> Query:
    scope = _Scope(stmt.sources, schemas)
    windows = _windows(stmt, scope)
    select = _select_list(stmt.items, scope)
    group_by = _group_by(stmt.group_by, scope)
    if group_by or any(item.agg for item in select):
        _check_grouping(stmt.items, select, group_by)
    local, joins, never = _factors(stmt.where, scope)
    sources = []
    samples = [_sample(item, len(stmt.sources)) for item in stmt.sources]
    for schema, name, window, factors, sample in zip(scope.schemas, scope.names, windows,
                                                     local, samples, strict=True):
        predicates, column_factors = normalize_factors(factors)
        sources.append(Source(schema.name, name, window, predicates, column_factors,
                              sample))
    contradiction = never or any(is_contradiction(s.predicates) for s in sources)
    return Query(
        sql, tuple(sources), select, stmt.distinct, contradiction, normalize_joins(joins),
        group_by,
    )


def _sample(item: FromItem, items: int) -> Sample | None:
    """The item's TABLESAMPLE, checked: a percentage in (0, 100], on a one-stream query
    (the archive is read for selection queries only); 100 percent is no sample."""
    clause = item.sample
    if clause is None:
        return None
    if items > 1:
        raise QueryError("TABLESAMPLE applies to a query over one stream (the archive is "
                         "evaluated for selection queries only, not joins)", *clause.pos)
    percent = clause.percent.value
    assert isinstance(percent, (int, float)), "the parser reads a number"
    if not 0 < percent <= 100:
        raise QueryError(f"a TABLESAMPLE percentage is in (0, 100], not {clause.percent.text}",
                         *clause.percent.pos)
    return None if percent == 100 else Sample(clause.method, percent / 100)


class _Scope:
    """The FROM list: each item's stream and name, and how the query may name their columns.

    An item's name is its alias, or its stream's name when it has none; names are unique.
    A qualifier names the item of that name, else the one item of that stream; a bare
    column names the one item whose stream has it (ts and tupleID are in every stream).
    """

    def __init__(self, items: Sequence[FromItem], schemas: Mapping[str, StreamSchema]):
        self.schemas: list[StreamSchema] = []
        self.names: list[str] = []
        for item in items:
            schema = schemas.get(item.stream)
            if schema is None:
                raise QueryError(f"unknown stream '{item.stream}' "
                                 f"({_stream_listing(schemas)})", *item.pos)
            name = item.alias or item.stream
            if name in self.names:
                if item.alias is None:
                    initial = item.stream[0].lower()
                    raise QueryError(
                        f"duplicate name '{name}' in FROM: give each item its own alias "
                        f"(FROM {item.stream} {initial}1, {item.stream} {initial}2)",
                        *item.pos,
                    )
                assert item.alias_pos is not None, "an alias always has its position"
                raise QueryError(f"duplicate alias '{name}' in FROM", *item.alias_pos)
            self.schemas.append(schema)
            self.names.append(name)
        self._all_schemas = schemas

    @property
    def joined(self) -> bool:
        """True for a join (more than one item in FROM)."""
        return len(self.names) > 1

    def source_of(self, qualifier: str, display: str, pos: Pos) -> int:
        """The index of the FROM item `qualifier` names (in `display`, at `pos`)."""
        if qualifier in self.names:
            return self.names.index(qualifier)
        same = [i for i, schema in enumerate(self.schemas) if schema.name == qualifier]
        if len(same) == 1:
            return same[0]
        if same:
            raise QueryError(
                f"stream '{qualifier}' appears more than once in FROM (as "
                f"{', '.join(self.names[i] for i in same)}): qualify '{display}' with one "
                "of its aliases",
                *pos,
            )
        listing = f"(FROM: {self._listing()})"
        if qualifier in self._all_schemas:
            raise QueryError(f"stream '{qualifier}' in '{display}' is not in FROM {listing}", *pos)
        raise QueryError(f"unknown stream or alias '{qualifier}' in '{display}' {listing}", *pos)

    def resolve(self, ref: ColumnRef, within: int | None = None) -> tuple[int, ColumnType]:
        """The FROM item whose column `ref` names, and the column's type.

        Args:
            ref: a column reference; the column may be declared, ts or tupleID.
            within: when given, `ref` must name a column of this item (a window's
                PARTITION BY partitions its own stream).
        """
        if ref.qualifier is not None:
            index = self.source_of(ref.qualifier, ref.display, ref.pos)
            if within is not None and index != within:
                raise QueryError(
                    f"'{ref.display}' is not a column of '{self.names[within]}': a window "
                    "partitions its own stream",
                    *ref.pos,
                )
        elif within is not None or not self.joined:
            index = 0 if within is None else within
        else:
            index = self._owner(ref)
        schema = self.schemas[index]
        try:
            return index, schema.type_of(ref.name)
        except KeyError:
            raise QueryError(
                f"unknown column '{ref.name}' in stream '{schema.name}' "
                f"(columns: {', '.join(schema.names)})",
                *ref.name_pos,
            ) from None

    def _owner(self, ref: ColumnRef) -> int:
        """The one item that has the bare column `ref`."""
        owners = [
            i for i, schema in enumerate(self.schemas)
            if ref.name in schema.names or ref.name in IMPLICIT_COLUMNS
        ]  # fmt: skip
        if len(owners) > 1:
            raise QueryError(
                f"ambiguous column '{ref.name}' (in {', '.join(self.names[i] for i in owners)})"
                ": qualify it",
                *ref.pos,
            )
        if not owners:
            streams = {schema.name: schema for schema in self.schemas}.values()
            columns = "; ".join(f"{s.name}: {', '.join(s.names)}" for s in streams)
            raise QueryError(f"unknown column '{ref.name}' in FROM ({columns})", *ref.name_pos)
        return owners[0]

    def _listing(self) -> str:
        return ", ".join(
            name if name == schema.name else f"{name} ({schema.name})"
            for name, schema in zip(self.names, self.schemas, strict=True)
        )


# windows


def _windows(stmt: Select, scope: _Scope) -> list[Window]:
    """One window per FROM item: BEGIN/END's for all, or each item's own [...]."""
    owned = any(item.window is not None for item in stmt.sources)
    if owned and stmt.begin_end is not None:
        raise QueryError(
            "BEGIN/END cannot be used when a stream in FROM has its own window [...]",
            *stmt.begin_end.pos,
        )
    if stmt.begin_end is not None:
        return [_begin_end(stmt.begin_end)] * len(stmt.sources)
    return [
        Window() if item.window is None else _stream_window(item.window, scope, index)
        for index, item in enumerate(stmt.sources)
    ]


def _stream_window(window: StreamWindow, scope: _Scope, index: int) -> Window:
    if isinstance(window, NowWindow):
        return Window(WindowType.RANGE, TimeExpr(True, 0.0), TimeExpr(True, 0.0))
    if isinstance(window, RangeWindow):
        if window.amount is None:
            return Window()
        if window.unit == ROW:
            raise QueryError(
                "RANGE takes a duration; use [ROWS n] for the last n tuples", *window.pos
            )
        seconds = _seconds(window.amount, window.unit)
        return Window(WindowType.RANGE, TimeExpr(True, 0.0 - seconds), TimeExpr(True, 0.0))
    rows = _row_count(window.count, "ROWS")
    if not window.partition_by:
        return Window(WindowType.ROWS, rows=rows)
    columns: list[str] = []
    for ref in window.partition_by:
        scope.resolve(ref, within=index)
        if ref.name in columns:
            raise QueryError(f"column '{ref.name}' appears twice in PARTITION BY", *ref.name_pos)
        columns.append(ref.name)
    return Window(WindowType.PARTITION, rows=rows, partition_by=tuple(columns))


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
        assert begin.amount is not None, "NOW - n ROWS has its n"
        return Window(WindowType.ROWS, rows=_row_count(begin.amount, "ROWS"))
    lo, hi = _time_expr(begin), _time_expr(end)
    if lo.relative == hi.relative and lo.value > hi.value:
        raise QueryError(
            f"BEGIN {begin.text} is after END {end.text}: the window is always empty",
            *clause.pos,
        )
    return Window(WindowType.RANGE, lo, hi)


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


def _seconds(amount: Literal, unit: TimeUnit) -> float:
    return float(amount.value * UNIT_SECONDS[unit])


def _row_count(amount: Literal, what: str) -> int:
    if not isinstance(amount.value, int) or amount.value <= 0:
        raise QueryError(
            f"{what} needs a positive whole number of rows, found {amount.text}", *amount.pos
        )
    return amount.value


# SELECT list


def _select_list(entries: Sequence[SelectEntry], scope: _Scope) -> tuple[SelectItem, ...]:
    """The output columns. In a join, `*` and `r.*` name theirs "r.column"; a plain item is
    named by its column, or "r.column" when another output has that name too. An aggregate
    is named "function(column)" ("function(r.column)" in a join), COUNT(*) "count(*)"."""
    # source, column, fixed name, pos, aggregate
    chosen: list[tuple[int, str, str | None, Pos, str | None]] = []
    for entry in entries:
        if isinstance(entry, SelectAggregate):
            chosen.append((*_aggregate(entry, scope), entry.pos, entry.function))
            continue
        if isinstance(entry, Star):
            if entry.qualifier is None:
                indexes: Sequence[int] = range(len(scope.names))
            else:
                indexes = [scope.source_of(entry.qualifier, f"{entry.qualifier}.*", entry.pos)]
            for index in indexes:
                prefix = f"{scope.names[index]}." if scope.joined else ""
                chosen.extend(
                    (index, column, prefix + column, entry.pos, None)
                    for column in scope.schemas[index].names
                )
        else:
            index, _ = scope.resolve(entry.column)
            chosen.append((index, entry.column.name, entry.alias, entry.pos, None))
    joined = scope.joined
    taken = Counter(column if name is None else name for _, column, name, _, _ in chosen) \
        if joined else None
    items: list[SelectItem] = []
    names: set[str] = set()
    for index, column, name, pos, agg in chosen:
        if name is None:
            clash = taken is not None and taken[column] > 1
            name = f"{scope.names[index]}.{column}" if clash else column
        if name in names:
            raise QueryError(f"duplicate output column '{name}' (rename one with AS)", *pos)
        names.add(name)
        items.append(SelectItem(index, column, name, agg))
    return tuple(items)


def _aggregate(entry: SelectAggregate, scope: _Scope) -> tuple[int, str, str]:
    """An aggregate's FROM item, column and output name; SUM, AVG, MIN and MAX take
    numbers only."""
    ref = entry.argument
    if ref is None:
        return 0, "*", entry.alias or "count(*)"
    index, ctype = scope.resolve(ref)
    if AGGREGATES[entry.function].numbers_only and _kind(ctype) != "number":
        raise QueryError(
            f"{entry.function.upper()} over {ctype.upper()} column '{ref.display}' is not "
            "supported (INT or FLOAT columns only)",
            *ref.pos,
        )
    argument = f"{scope.names[index]}.{ref.name}" if scope.joined else ref.name
    return index, ref.name, entry.alias or f"{entry.function}({argument})"


# GROUP BY


def _group_by(refs: Sequence[ColumnRef], scope: _Scope) -> tuple[tuple[int, str], ...]:
    """The GROUP BY columns as (FROM item, column), in written order without repeats."""
    columns: list[tuple[int, str]] = []
    for ref in refs:
        column = (scope.resolve(ref)[0], ref.name)
        if column not in columns:
            columns.append(column)
    return tuple(columns)


def _check_grouping(
    entries: Sequence[SelectEntry],
    select: Sequence[SelectItem],
    group_by: Sequence[tuple[int, str]],
) -> None:
    """In an aggregated query, `*` is rejected and every plain column must be grouped."""
    for entry in entries:
        if isinstance(entry, Star):
            star = "*" if entry.qualifier is None else f"{entry.qualifier}.*"
            raise QueryError(
                f"SELECT {star} cannot be used with aggregates or GROUP BY: list the GROUP BY "
                "columns instead",
                *entry.pos,
            )
    for entry, item in zip(entries, select, strict=True):  # no `*`: one item per entry
        if isinstance(entry, SelectColumn) and (item.source, item.column) not in group_by:
            raise QueryError(
                f"column '{entry.column.display}' must appear in GROUP BY or be inside an "
                "aggregate",
                *entry.pos,
            )


# WHERE

_Local = AttrFactor | ColumnFactor


def _factors(
    factors: Sequence[Factor], scope: _Scope
) -> tuple[list[list[_Local]], list[JoinFactor], bool]:
    """Each FROM item's local factors, the join factors between items (as written), and
    whether some factor can never hold (`a = b + 0.5` between INT columns)."""
    local: list[list[_Local]] = [[] for _ in scope.names]
    joins: list[JoinFactor] = []
    never = False
    for factor in factors:
        if isinstance(factor, Between):
            index, ctype = _constant_factor(scope, factor.column, [factor.low, factor.high])
            name = factor.column.name
            local[index].append(AttrFactor(name, ctype, CompareOp.GE, factor.low.value))
            local[index].append(AttrFactor(name, ctype, CompareOp.LE, factor.high.value))
        elif isinstance(factor, InList):
            index, ctype = _constant_factor(scope, factor.column, factor.values)
            values = tuple(v.value for v in factor.values)
            local[index].append(AttrFactor(factor.column.name, ctype, IN, values))
        else:
            checked = _comparison(factor, scope)
            if isinstance(checked, bool):
                never = never or not checked
            elif isinstance(checked, JoinFactor):
                joins.append(checked)
            else:
                local[checked[0]].append(checked[1])
    return local, joins, never


def _comparison(
    factor: Comparison, scope: _Scope
) -> tuple[int, _Local] | JoinFactor | bool:
    """A local factor with its FROM item's index, a join factor between two items, or
    True / False for a comparison of INT columns that always / never holds."""
    left, right = factor.left, factor.right
    if isinstance(left, Literal) and isinstance(right, Literal):
        raise QueryError(
            f"a factor must involve a column, but {left.text} {factor.op} {right.text} "
            "compares two constants",
            *factor.pos,
        )
    op = compare_op(factor.op)
    if isinstance(left, Literal):
        left, op, right = right, FLIPPED[op], left
    assert isinstance(left, ColumnRef)  # the parser puts arithmetic on the right only
    if isinstance(right, Literal):
        index, ctype = _constant_factor(scope, left, [right])
        return index, AttrFactor(left.name, ctype, op, right.value)
    ref = right.column if isinstance(right, Shifted) else right
    (left_index, left_type), (right_index, right_type) = scope.resolve(left), scope.resolve(ref)
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
        assert isinstance(amount, (int, float)), "a shift is by a number (the parser reads one)"
        offset = amount if right.sign == "+" else -amount
        if left_type == right_type == _INT:
            exact = integer_offset(op, offset)
            if isinstance(exact, bool):
                return exact
            op, offset = exact
    if left_index == right_index:
        return left_index, ColumnFactor(left.name, op, ref.name, offset)
    return JoinFactor(left_index, left.name, op, right_index, ref.name, offset)


def _constant_factor(
    scope: _Scope, ref: ColumnRef, constants: Sequence[Literal]
) -> tuple[int, ColumnType]:
    """Check `ref op c` for each constant c; return the column's FROM item and type."""
    index, ctype = scope.resolve(ref)
    for constant in constants:
        if _kind(ctype) != _literal_kind(constant):
            raise QueryError(
                f"cannot compare {ctype.upper()} column '{ref.display}' with "
                f"{_describe(constant)}",
                *constant.pos,
            )
    return index, ctype


#: What a value compares with: a number (INT and FLOAT), a string or a boolean.
_Kind = typing.Literal["number", "text", "bool"]

_KINDS: dict[ColumnType, _Kind] = {_INT: "number", _FLOAT: "number", _TEXT: "text",
                                   _BOOL: "bool"}


def _kind(ctype: ColumnType) -> _Kind:
    """What a column compares with, as `_literal_kind` names a constant's."""
    return _KINDS[ctype]


def _literal_kind(constant: Literal) -> _Kind:
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


def _type_at(name: str, pos: Pos | None) -> ColumnType:
    ctype = TYPE_NAMES.get(name.upper()) if isinstance(name, str) else None
    if ctype is None:
        raise QueryError(
            f"unknown type {name!r} (known types: {', '.join(TYPE_NAMES)})",
            *(pos or (None, None)),
        )
    return ctype
